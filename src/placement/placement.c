/* placement.c - placement parsing, printing, normalization and the torch.chunk rule. Pure. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>

#include "internal/common.h"

int dt_placement_equal(dt_placement_t a, dt_placement_t b) {
  if (a.kind != b.kind) return 0;
  if (a.kind == DT_SHARD) return a.dim == b.dim;
  if (a.kind == DT_PARTIAL) return a.op == b.op;
  return 1;
}

/* Parses an optional sign and decimal digits from s[*i]; at most 4 digits (dims are < 8). */
static int dt__parse_int(const char* s, size_t* i, int* out) {
  size_t j = *i;
  int neg = 0, v = 0, nd = 0;
  if (s[j] == '-') {
    neg = 1;
    j++;
  } else if (s[j] == '+') {
    j++;
  }
  while (isdigit((unsigned char)s[j])) {
    if (++nd > 4) return 0;
    v = v * 10 + (s[j] - '0');
    j++;
  }
  if (nd == 0) return 0;
  *out = neg ? -v : v;
  *i = j;
  return 1;
}

static int dt__parse_op(const char* s, size_t len, int* op) {
  static const char* const names[DT_REDUCE_COUNT] = {"sum", "avg", "max", "min"};
  for (int k = 0; k < DT_REDUCE_COUNT; k++)
    if (strlen(names[k]) == len && strncmp(s, names[k], len) == 0) {
      *op = k;
      return 1;
    }
  return 0;
}

static dt_status_t dt__placement_parse(const char* text, dt_placement_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  DT_ARG_NOT_NULL(text);
  /* Trim spaces into a small local copy. */
  char s[64];
  size_t b = 0, e = strlen(text);
  while (b < e && isspace((unsigned char)text[b])) b++;
  while (e > b && isspace((unsigned char)text[e - 1])) e--;
  if (e - b == 0 || e - b >= sizeof s)
    return DT_FAIL(DT_ERR_INVALID_ARG, "text '%s' is not a placement (valid: S(d), Sd, R, P or "
                   "P(op), at most %zu characters)", text, sizeof s - 1);
  memcpy(s, text + b, e - b);
  s[e - b] = '\0';
  size_t n = e - b, i;
  dt_placement_t p = {0, 0, 0};
  if (strcmp(s, "R") == 0 || strcmp(s, "Replicate") == 0 || strcmp(s, "Replicate()") == 0) {
    p.kind = DT_REPLICATE;
  } else if (strcmp(s, "P") == 0 || strcmp(s, "Partial") == 0 || strcmp(s, "Partial()") == 0) {
    p.kind = DT_PARTIAL;
    p.op = DT_REDUCE_SUM;
  } else if (s[0] == 'P') {
    i = strncmp(s, "Partial(", 8) == 0 ? 8 : (s[1] == '(' ? 2 : 0);
    if (i == 0 || s[n - 1] != ')' || !dt__parse_op(s + i, n - 1 - i, &p.op))
      return DT_FAIL(DT_ERR_INVALID_ARG,
                     "text '%s' is not a placement (Partial takes sum, avg, max or min: P(sum))",
                     text);
    p.kind = DT_PARTIAL;
  } else if (s[0] == 'S') {
    p.kind = DT_SHARD;
    i = strncmp(s, "Shard(", 6) == 0 ? 6 : 1;
    int paren = (i == 6) || s[1] == '(';
    if (i == 1 && paren) i = 2;
    if (!dt__parse_int(s, &i, &p.dim))
      return DT_FAIL(DT_ERR_INVALID_ARG,
                     "text '%s' is not a placement (Shard needs a dim: S(0) or S0)", text);
    if (paren ? !(s[i] == ')' && s[i + 1] == '\0') : s[i] != '\0')
      return DT_FAIL(DT_ERR_INVALID_ARG, "text '%s' is not a placement (valid: S(d) or Sd)",
                     text);
    if (p.dim < -DT_MAX_DIMS || p.dim >= DT_MAX_DIMS)
      return DT_FAIL(DT_ERR_INVALID_ARG, "text '%s': Shard dim %d out of range (valid: %d to %d)",
                     text, p.dim, -DT_MAX_DIMS, DT_MAX_DIMS - 1);
  } else {
    return DT_FAIL(DT_ERR_INVALID_ARG, "text '%s' is not a placement (valid: S(d), Sd, R, P or "
                   "P(op))", text);
  }
  *out = p;
  return DT_SUCCESS;
}

dt_status_t dt_placement_parse(const char* text, dt_placement_t* out) {
  DT_ENTRY_RETURN(dt__placement_parse(text, out));
}

static dt_status_t dt__placements_parse(const char* text, dt_placement_t* out, int cap, int* n) {
  DT_ARG_NOT_NULL(text);
  DT_ARG_NOT_NULL(out);
  DT_ARG_NOT_NULL(n);
  *n = 0;
  if (cap <= 0) return DT_FAIL(DT_ERR_INVALID_ARG, "cap=%d (valid: 1 or more)", cap);
  const char* s = text;
  int count = 0;
  for (;;) {
    const char* comma = strchr(s, ',');
    size_t len = comma ? (size_t)(comma - s) : strlen(s);
    char item[64];
    if (len >= sizeof item)
      return DT_FAIL(DT_ERR_INVALID_ARG, "text '%s': item %d is %zu characters (valid: under %zu)",
                     text, count, len, sizeof item);
    if (count >= cap)
      return DT_FAIL(DT_ERR_INVALID_ARG, "text '%s' has more than %d items (valid: at most cap=%d)",
                     text, cap, cap);
    memcpy(item, s, len);
    item[len] = '\0';
    dt_status_t st = dt_placement_parse(item, &out[count]);
    if (st != DT_SUCCESS) {
      *n = 0;
      return DT_FAIL(st, "text '%s': item %d: %s", text, count, dt_last_error());
    }
    count++;
    if (!comma) break;
    s = comma + 1;
  }
  *n = count;
  return DT_SUCCESS;
}

dt_status_t dt_placements_parse(const char* text, dt_placement_t* out, int cap, int* n) {
  DT_ENTRY_RETURN(dt__placements_parse(text, out, cap, n));
}

static dt_status_t dt__placement_format(dt_placement_t p, char* buf, size_t cap) {
  DT_ARG_NOT_NULL(buf);
  if (cap == 0) return DT_FAIL(DT_ERR_INVALID_ARG, "cap=0 (valid: room for the text and its NUL)");
  int w;
  switch (p.kind) {
    case DT_REPLICATE: w = snprintf(buf, cap, "R"); break;
    case DT_SHARD: w = snprintf(buf, cap, "S(%d)", p.dim); break;
    case DT_PARTIAL:
      if (p.op < 0 || p.op >= DT_REDUCE_COUNT)
        return DT_FAIL(DT_ERR_INVALID_ARG, "p: Partial reduce op %d out of range (valid: 0 to %d)",
                       p.op, DT_REDUCE_COUNT - 1);
      w = snprintf(buf, cap, "P(%s)", dt_reduce_op_name((dt_reduce_op_t)p.op));
      break;
    default:
      buf[0] = '\0';
      return DT_FAIL(DT_ERR_INVALID_ARG, "p: placement kind %d out of range (valid: 0 to %d)",
                     p.kind, DT_PLACEMENT_KIND_COUNT - 1);
  }
  if (w < 0 || (size_t)w >= cap)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cap=%zu too small for '%s' (valid: %d or more)", cap, buf,
                   w + 1);
  return DT_SUCCESS;
}

dt_status_t dt_placement_format(dt_placement_t p, char* buf, size_t cap) {
  DT_ENTRY_RETURN(dt__placement_format(p, buf, cap));
}

static dt_status_t dt__placements_format(const dt_placement_t* p, int n, const char* sep, char* buf,
                                         size_t cap) {
  DT_ARG_NOT_NULL(p);
  DT_ARG_NOT_NULL(buf);
  if (cap == 0) return DT_FAIL(DT_ERR_INVALID_ARG, "cap=0 (valid: room for the text and its NUL)");
  if (n < 0 || n > DT_MAX_MESH_DIMS * 4)
    return DT_FAIL(DT_ERR_INVALID_ARG, "n=%d out of range (valid: 0 to %d)", n,
                   DT_MAX_MESH_DIMS * 4);
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    char one[32];
    dt_status_t st = dt_placement_format(p[i], one, sizeof one);
    if (st != DT_SUCCESS) return DT_FAIL(st, "p[%d]: %s", i, dt_last_error());
    int w = snprintf(buf + used, cap - used, "%s%s", (i && sep) ? sep : "", one);
    if (w < 0 || (size_t)w >= cap - used)
      return DT_FAIL(DT_ERR_INVALID_ARG, "cap=%zu too small for %d placements (valid: %zu or more "
                     "by item %d)", cap, n, used + (size_t)(w < 0 ? 0 : w) + 1, i);
    used += (size_t)w;
  }
  return DT_SUCCESS;
}

dt_status_t dt_placements_format(const dt_placement_t* p, int n, const char* sep, char* buf,
                                 size_t cap) {
  DT_ENTRY_RETURN(dt__placements_format(p, n, sep, buf, cap));
}

static dt_status_t dt__placement_normalize(dt_placement_t* p, int tensor_ndim) {
  DT_ARG_NOT_NULL(p);
  if (tensor_ndim < 0 || tensor_ndim > DT_MAX_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "tensor_ndim=%d out of range (valid: 0 to %d)",
                   tensor_ndim, DT_MAX_DIMS);
  switch (p->kind) {
    case DT_REPLICATE:
      p->dim = 0;
      p->op = 0;
      return DT_SUCCESS;
    case DT_PARTIAL:
      if (p->op < 0 || p->op >= DT_REDUCE_COUNT)
        return DT_FAIL(DT_ERR_INVALID_ARG, "p: Partial reduce op %d out of range (valid: 0 to %d)",
                       p->op, DT_REDUCE_COUNT - 1);
      p->dim = 0;
      return DT_SUCCESS;
    case DT_SHARD: {
      int d = p->dim < 0 ? p->dim + tensor_ndim : p->dim;
      if (d < 0 || d >= tensor_ndim)
        return DT_FAIL(DT_ERR_INVALID_ARG, "p: Shard dim %d out of range for a %d-dim tensor "
                       "(valid: %d to %d)", p->dim, tensor_ndim, -tensor_ndim, tensor_ndim - 1);
      p->dim = d;
      p->op = 0;
      return DT_SUCCESS;
    }
    default:
      return DT_FAIL(DT_ERR_INVALID_ARG, "p: placement kind %d out of range (valid: 0 to %d)",
                     p->kind, DT_PLACEMENT_KIND_COUNT - 1);
  }
}

dt_status_t dt_placement_normalize(dt_placement_t* p, int tensor_ndim) {
  DT_ENTRY_RETURN(dt__placement_normalize(p, tensor_ndim));
}

int64_t dt_placement_encode(dt_placement_t p) {
  /* Only what decode gives back: a field out of range would otherwise wrap into another valid
   * placement. The field a kind does not use is dropped, as dt_placement_equal ignores it. */
  if (p.kind < 0 || p.kind >= DT_PLACEMENT_KIND_COUNT) return -1;
  if (p.kind == DT_PARTIAL && (p.op < 0 || p.op >= DT_REDUCE_COUNT)) return -1;
  if (p.kind == DT_SHARD && (p.dim < -DT_MAX_DIMS || p.dim >= DT_MAX_DIMS)) return -1;
  int64_t op = p.kind == DT_PARTIAL ? p.op : 0;
  int64_t dim = p.kind == DT_SHARD ? (int64_t)((uint32_t)p.dim & 0xffu) : 0;
  return (int64_t)p.kind | op << 4 | dim << 8;
}

static dt_status_t dt__placement_decode(int64_t code, dt_placement_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  if (code < 0 || code >= (1 << 16))
    return DT_FAIL(DT_ERR_INVALID_ARG, "code=%lld out of range (valid: 0 to %d)",
                   (long long)code, (1 << 16) - 1);
  dt_placement_t p = {(int32_t)(code & 15), (int32_t)(int8_t)((code >> 8) & 0xff),
                      (int32_t)((code >> 4) & 15)};
  if (p.kind >= DT_PLACEMENT_KIND_COUNT || (p.kind == DT_PARTIAL && p.op >= DT_REDUCE_COUNT) ||
      (p.kind != DT_SHARD && p.dim != 0) || (p.kind != DT_PARTIAL && p.op != 0) ||
      p.dim < -DT_MAX_DIMS || p.dim >= DT_MAX_DIMS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "code=%lld is not a placement (valid: what "
                   "dt_placement_encode returns)", (long long)code);
  *out = p;
  return DT_SUCCESS;
}

dt_status_t dt_placement_decode(int64_t code, dt_placement_t* out) {
  DT_ENTRY_RETURN(dt__placement_decode(code, out));
}

static dt_status_t dt__chunk(int64_t size, int nparts, int index, int64_t* offset, int64_t* len) {
  DT_ARG_NOT_NULL(offset);
  DT_ARG_NOT_NULL(len);
  if (size < 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "size=%lld is negative (valid: 0 or more)", (long long)size);
  if (nparts <= 0)
    return DT_FAIL(DT_ERR_INVALID_ARG, "nparts=%d (valid: 1 or more)", nparts);
  if (index < 0 || index >= nparts)
    return DT_FAIL(DT_ERR_INVALID_ARG, "index=%d out of range (valid: 0 to %d)", index,
                   nparts - 1);
  /* torch.chunk: chunks of ceil(size / nparts), the last ones short or empty. Written so that
   * nothing overflows for sizes up to INT64_MAX. */
  int64_t c = size / nparts + (size % nparts != 0);
  int64_t start = (c == 0 || index <= size / c) ? c * index : size;
  if (start > size) start = size;
  *offset = start;
  *len = size - start < c ? size - start : c;
  return DT_SUCCESS;
}

dt_status_t dt_chunk(int64_t size, int nparts, int index, int64_t* offset, int64_t* len) {
  DT_ENTRY_RETURN(dt__chunk(size, nparts, index, offset, len));
}
