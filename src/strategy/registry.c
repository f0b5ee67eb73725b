/* registry.c - op ids from names, host-registered ops, argument schemas and op introspection.
 *
 * Built-in ops are the rows of the op table (op_list.h). Host programs add ops with
 * dt_op_register; their ids follow the built-ins. Registering a built-in's name installs an
 * override that every caller sees (the id stays, rules and kernel change). Names are resolved
 * once, at the public boundary, through an open-addressing index (one string hash and usually one
 * strcmp on the dispatch hot path).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>

#include "strategy/strategy.h"

typedef struct dt_host_op {
  dt_op_info_t info;
  char name[DT_OP_NAME_MAX];
} dt_host_op_t;

static struct {
  dt_host_op_t host[DT_OP_HOST_MAX];
  int n_host;
  dt_host_op_t* override[DT_OP_COUNT]; /* host replacement of a built-in, or NULL */
  short index[4 * (DT_OP_COUNT + DT_OP_HOST_MAX)]; /* id + 1; 0 = empty */
  int indexed;                                     /* the built-ins are in the index */
  dt_op_arg_t schema[DT_OP_COUNT][DT_OP_MAX_IARGS + DT_OP_MAX_FARGS];
  int schema_n[DT_OP_COUNT];
  int schema_ready;
} dt__reg;

#define DT__INDEX_CAP ((int)(sizeof dt__reg.index / sizeof dt__reg.index[0]))

static const char* dt__name_of(int id) {
  return id < DT_OP_COUNT ? dt__op_table[id].name : dt__reg.host[id - DT_OP_COUNT].name;
}

static void dt__index_add(int id) {
  size_t j = dt__hash_str(0, dt__name_of(id)) % (size_t)DT__INDEX_CAP;
  while (dt__reg.index[j]) j = (j + 1) % (size_t)DT__INDEX_CAP;
  dt__reg.index[j] = (short)(id + 1);
}

static void dt__index_builtins(void) {
  if (dt__reg.indexed) return;
  dt__reg.indexed = 1;
  for (int id = 0; id < DT_OP_COUNT; id++) dt__index_add(id);
}

int dt__op_find(const char* name) {
  if (name == NULL) return -1;
  dt__index_builtins();
  for (size_t j = dt__hash_str(0, name) % (size_t)DT__INDEX_CAP; dt__reg.index[j];
       j = (j + 1) % (size_t)DT__INDEX_CAP)
    if (strcmp(dt__name_of(dt__reg.index[j] - 1), name) == 0) return dt__reg.index[j] - 1;
  return -1;
}

/* ---------------------------------------------------------------------------------------------
 * unknown names: what the user probably meant */

/* PyTorch names (and common spellings) without an op of that name here, and what to use. */
static const struct {
  const char* torch;
  const char* ops; /* the op(s) to suggest, in quotes in the message */
  const char* how;
} dt__torch_names[] = {
    {"matmul", "mm", "PyTorch's matmul is mm here, bmm for batched (B, M, K) operands"},
    {"dot", "mm", "a dot product is mm of (1, K) and (K, 1)"},
    {"mv", "mm", "a matrix-vector product is mm with a (K, 1) operand"},
    {"einsum", "mm", "mm, bmm, mm_t and linear cover the matmul einsums"},
    {"max", "amax", "amax reduces over dims, maximum is elementwise"},
    {"min", "amin", "amin reduces over dims, minimum is elementwise"},
    {"scaled_dot_product_attention", "sdpa", "PyTorch's scaled_dot_product_attention is sdpa"},
    {"attention", "sdpa", "scaled dot-product attention is sdpa"},
    {"concat", "cat", "concatenation is cat"},
    {"concatenate", "cat", "concatenation is cat"},
    {"stack", "cat", "stack is unsqueeze then cat"},
    {"split", "narrow", "dt_split and dt_chunks split through narrow"},
    {"chunk", "narrow", "dt_chunks splits through narrow"},
    {"select", "narrow", "select is narrow of length 1 then squeeze"},
    {"index_select", "embedding", "rows of a table by index are embedding"},
    {"swapaxes", "transpose", "PyTorch's swapaxes is transpose"},
    {"swapdims", "transpose", "PyTorch's swapdims is transpose"},
    {"multiply", "mul", "PyTorch's multiply is mul"},
    {"subtract", "sub", "PyTorch's subtract is sub"},
    {"divide", "div", "PyTorch's divide is div"},
    {"true_divide", "div", "PyTorch's true_divide is div"},
    {"negative", "neg", "PyTorch's negative is neg"},
    {"square", "pow", "square is pow with exponent=2"},
    {"swish", "silu", "swish is silu"},
    {"rope", "rotary", "rotary position embedding is rotary"},
    {"apply_rotary_emb", "rotary", "rotary position embedding is rotary"},
    {"to", "cast", "a dtype conversion is cast"},
    {"type", "cast", "a dtype conversion is cast"},
    {"nll_loss", "cross_entropy", "cross_entropy takes the logits (log_softmax and nll_loss)"},
    {"adam", "adamw", "adamw with weight_decay=0 is Adam"},
    {"scatter", "scatter_add", "scatter_add accumulates at the indices"},
    {"index_put", "index_add", "index_add adds rows at indices"},
    {"all_to_all", "all_to_all_single", "PyTorch's all_to_all_single is all_to_all_single"},
    {"norm", "sumsq", "sumsq then sqrt gives the 2-norm"},
    {"mul_", "scale_", "scale_ multiplies in place by a scalar"},
};

/* Levenshtein distance of a and b (ASCII case ignored), capped at cap + 1. */
static int dt__edit_distance(const char* a, const char* b, int cap) {
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la - lb > cap || lb - la > cap) return cap + 1;
  if (lb >= DT_OP_NAME_MAX) return cap + 1;
  int row[DT_OP_NAME_MAX + 1];
  for (int j = 0; j <= lb; j++) row[j] = j;
  for (int i = 1; i <= la; i++) {
    int diag = row[0], best = row[0] = i;
    for (int j = 1; j <= lb; j++) {
      int up = row[j];
      int same = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]);
      int v = diag + !same;
      if (up + 1 < v) v = up + 1;
      if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
      row[j] = v;
      diag = up;
      if (v < best) best = v;
    }
    if (best > cap) return cap + 1;
  }
  return row[lb];
}

/* Writes "unknown op 'NAME': did you mean 'X' or 'Y'? (...)" into buf. */
static void dt__unknown_op_text(const char* name, char* buf, size_t cap) {
  size_t used = 0;
#define DT__PUT(...)                                                           \
  do {                                                                         \
    int w_ = snprintf(buf + used, cap - used, __VA_ARGS__);                    \
    if (w_ > 0) used = (size_t)w_ < cap - used ? used + (size_t)w_ : cap - 1; \
  } while (0)
  buf[0] = '\0';
  DT__PUT("unknown op '%.64s'", name);
  const char* how = NULL;
  for (size_t k = 0; k < sizeof dt__torch_names / sizeof dt__torch_names[0]; k++)
    if (strcmp(dt__torch_names[k].torch, name) == 0) {
      DT__PUT(": did you mean '%s'? %s", dt__torch_names[k].ops, dt__torch_names[k].how);
      how = dt__torch_names[k].how;
    }
  if (how == NULL) {
    /* the closest names: edit distance at most 1 + len / 4 (2 for most names), or the name
     * given is the start of the op's (rms for rms_norm); the three closest, table order on ties */
    int len = (int)strlen(name), lim = 1 + len / 4, n = DT_OP_COUNT + dt__reg.n_host, nb = 0;
    int dist[DT_OP_COUNT + DT_OP_HOST_MAX], best[3];
    for (int id = 0; id < n; id++) {
      const char* cand = dt__name_of(id);
      dist[id] = dt__edit_distance(name, cand, lim);
      if (dist[id] > lim && len >= 3 && strncmp(cand, name, (size_t)len) == 0) dist[id] = lim;
      if (id >= DT_OP_COUNT && dt__op_find(cand) != id) dist[id] = lim + 1; /* an override */
    }
    for (int d = 0; d <= lim && nb < 3; d++)
      for (int id = 0; id < n && nb < 3; id++)
        if (dist[id] == d) best[nb++] = id;
    for (int k = 0; k < nb; k++)
      DT__PUT("%s'%s'%s", k == 0 ? ": did you mean " : k + 1 == nb ? " or " : ", ",
              dt__name_of(best[k]), k + 1 == nb ? "?" : "");
  }
  DT__PUT(" (dtensor-explain ops lists every op)");
#undef DT__PUT
}

dt_status_t dt__op_resolve(const char* name, int* id) {
  *id = -1;
  if (name == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "name is NULL (expected an op name such as \"mm\")");
  *id = dt__op_find(name);
  if (*id < 0) {
    char text[512];
    dt__unknown_op_text(name, text, sizeof text);
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s", text);
  }
  return DT_SUCCESS;
}

const dt_op_info_t* dt__op_info(int id) {
  if (id < 0) return NULL;
  if (id < DT_OP_COUNT) return dt__reg.override[id] ? &dt__reg.override[id]->info : &dt__op_table[id];
  if (id - DT_OP_COUNT < dt__reg.n_host) return &dt__reg.host[id - DT_OP_COUNT].info;
  return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * host registration */

static dt_status_t dt__op_register(const char* name, int n_inputs, dt_op_rules_fn rules,
                                   dt_op_kernel_fn kernel) {
  DT_ARG_NOT_NULL(name);
  DT_ARG_NOT_NULL(rules);
  size_t len = strlen(name);
  if (len == 0 || len >= DT_OP_NAME_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op name '%s' must have 1 to %d characters", name,
                   DT_OP_NAME_MAX - 1);
  if (n_inputs < 0 || n_inputs > DT_OP_MAX_INPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "n_inputs %d out of range [0 (variadic), %d]", n_inputs,
                   DT_OP_MAX_INPUTS);
  int id = dt__op_find(name);
  dt_host_op_t* h = NULL;
  if (id >= DT_OP_COUNT) {
    h = &dt__reg.host[id - DT_OP_COUNT];
  } else if (id >= 0 && dt__reg.override[id] != NULL) {
    h = dt__reg.override[id];
  } else {
    if (dt__reg.n_host == DT_OP_HOST_MAX)
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "at most %d host ops (overrides included)",
                     DT_OP_HOST_MAX);
    h = &dt__reg.host[dt__reg.n_host++];
    memset(h, 0, sizeof *h);
    snprintf(h->name, sizeof h->name, "%s", name);
    if (id >= 0) {
      /* an override keeps the built-in's backward rule and dtype handling */
      h->info = dt__op_table[id];
      dt__reg.override[id] = h;
    } else {
      dt__index_add(DT_OP_COUNT + dt__reg.n_host - 1);
    }
  }
  h->info.name = h->name;
  h->info.n_in = n_inputs == 0 ? DT_OP_MAX_INPUTS : n_inputs;
  h->info.flags &= ~(unsigned)(DT_OPF_VARIADIC | DT_OPF_WRITES_ALL); /* host kernels get zeroed outputs */
  if (n_inputs == 0) h->info.flags |= DT_OPF_VARIADIC;
  h->info.n_out = 0; /* any (the rules say) */
  h->info.rules = rules;
  h->info.check = NULL;
  memset(h->info.kernel, 0, sizeof h->info.kernel);
  h->info.kernel[DT_DEVICE_HOST] = kernel;
  h->info.composite = NULL;
  return DT_SUCCESS;
}

dt_status_t dt_op_register(const char* name, int n_inputs, dt_op_rules_fn rules,
                           dt_op_kernel_fn kernel) {
  DT_ENTRY_RETURN(dt__op_register(name, n_inputs, rules, kernel));
}

static dt_status_t dt__op_register_kernel(const char* name, dt_device_t device,
                                          dt_op_kernel_fn kernel) {
  DT_ARG_NOT_NULL(name);
  if (device < 0 || device >= DT_DEVICE_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op %s: device=%d out of range [0, %d)", name, (int)device,
                   (int)DT_DEVICE_COUNT);
  if (device == DT_DEVICE_META)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op %s: the meta device runs no kernels (its ops only "
                   "count: register the host kernel)", name);
  int id = dt__op_find(name);
  dt_host_op_t* h = NULL;
  if (id >= DT_OP_COUNT) h = &dt__reg.host[id - DT_OP_COUNT];
  else if (id >= 0) h = dt__reg.override[id];
  if (h == NULL)
    return DT_FAIL(id >= 0 ? DT_ERR_INVALID_USAGE : DT_ERR_INVALID_ARG,
                   "op %s: %s; register it with dt_op_register first", name,
                   id >= 0 ? "a built-in op's device kernels belong to the library"
                           : "no such op");
  h->info.kernel[device] = kernel;
  return DT_SUCCESS;
}

dt_status_t dt_op_register_kernel(const char* name, dt_device_t device, dt_op_kernel_fn kernel) {
  DT_ENTRY_RETURN(dt__op_register_kernel(name, device, kernel));
}

static dt_status_t dt__op_lookup(const char* name, int* found) {
  DT_ARG_NOT_NULL(found);
  *found = 0;
  DT_ARG_NOT_NULL(name);
  *found = dt__op_find(name) >= 0;
  return DT_SUCCESS;
}

dt_status_t dt_op_lookup(const char* name, int* found) {
  DT_ENTRY_RETURN(dt__op_lookup(name, found));
}

/* ---------------------------------------------------------------------------------------------
 * argument schemas: "name[:kind][=default|?], ..." */

static dt_status_t dt__parse_spec(const char* op, const char* spec, dt_op_arg_t* out, int* n) {
  *n = 0;
  const char* p = spec;
  while (*p) {
    while (*p == ' ' || *p == ',') p++;
    if (!*p) break;
    if (*n >= DT_OP_MAX_IARGS + DT_OP_MAX_FARGS)
      return DT_FAIL(DT_ERR_INTERNAL, "%s: argument schema too long", op);
    dt_op_arg_t* a = &out[(*n)++];
    memset(a, 0, sizeof *a);
    size_t k = 0;
    while (*p && (isalnum((unsigned char)*p) || *p == '_') && k + 1 < sizeof a->name)
      a->name[k++] = *p++;
    a->kind = DT_ARG_INT;
    if (*p == ':') {
      char c = p[1];
      a->kind = c == 'f' ? DT_ARG_FLOAT : c == 'l' ? DT_ARG_INT_LIST : c == 'd' ? DT_ARG_DTYPE
                : c == 'p' ? DT_ARG_PLACEMENTS : DT_ARG_INT;
      p += 2;
    }
    int list = a->kind == DT_ARG_INT_LIST || a->kind == DT_ARG_PLACEMENTS;
    if (*p == '=') {
      char* end;
      a->def = strtod(p + 1, &end);
      a->has_default = 1;
      p = end;
    } else if (*p == '?') {
      p++;
    } else {
      a->required = !list; /* a list may be empty (a 0-dim reshape, "all dims") */
    }
    if (k == 0 || (*p && *p != ','))
      return DT_FAIL(DT_ERR_INTERNAL, "%s: bad argument schema '%s'", op, spec);
  }
  return DT_SUCCESS;
}

dt_status_t dt__op_schema(int id, const dt_op_arg_t** args, int* n) {
  *args = NULL;
  *n = 0;
  if (id < 0 || id >= DT_OP_COUNT) return DT_SUCCESS; /* host ops: no schema */
  if (!dt__reg.schema_ready) {
    for (int i = 0; i < DT_OP_COUNT; i++)
      DT_CHECK(dt__parse_spec(dt__op_table[i].name, dt__op_table[i].args, dt__reg.schema[i],
                              &dt__reg.schema_n[i]));
    dt__reg.schema_ready = 1;
  }
  *args = dt__reg.schema[id];
  *n = dt__reg.schema_n[id];
  return DT_SUCCESS;
}

int64_t dt__op_iarg_n(int id, int n_iargs, const int64_t* iargs, int k) {
  if (k >= 0 && k < n_iargs) return iargs[k];
  const dt_op_arg_t* a;
  int n;
  if (k < 0 || dt__op_schema(id, &a, &n) != DT_SUCCESS) return DT_OP_IARG_NONE;
  for (int j = 0, i = 0; j < n; j++) {
    if (a[j].kind == DT_ARG_FLOAT) continue;
    if (a[j].kind == DT_ARG_INT_LIST || a[j].kind == DT_ARG_PLACEMENTS) break; /* no default */
    if (i++ == k) return a[j].has_default ? (int64_t)a[j].def : DT_OP_IARG_NONE;
  }
  return DT_OP_IARG_NONE;
}

int64_t dt__op_iarg(int id, const dt_op_call_t* call, int k) {
  return dt__op_iarg_n(id, call->n_iargs, call->iargs, k);
}

double dt__op_farg(int id, const dt_op_call_t* call, int k) {
  return dt__op_farg_n(id, call->n_fargs, call->fargs, k);
}

double dt__op_farg_n(int id, int n_fargs, const double* fargs, int k) {
  if (k >= 0 && k < n_fargs && fargs != NULL) return fargs[k];
  const dt_op_arg_t* a;
  int n;
  if (dt__op_schema(id, &a, &n) != DT_SUCCESS) return NAN;
  for (int j = 0, f = 0; j < n; j++)
    if (a[j].kind == DT_ARG_FLOAT && f++ == k) return a[j].has_default ? a[j].def : NAN;
  return NAN;
}

/* Writes "[keepdim=0, dim...]"-style text of the integer or scalar part of a schema. */
static void dt__schema_text(const dt_op_arg_t* a, int n, int floats, char* buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (int k = 0; k < n; k++) {
    if ((a[k].kind == DT_ARG_FLOAT) != floats) continue;
    int w = snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", a[k].name);
    if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
    if (a[k].kind == DT_ARG_INT_LIST || a[k].kind == DT_ARG_PLACEMENTS)
      w = snprintf(buf + used, cap - used, "...");
    else if (a[k].has_default)
      w = snprintf(buf + used, cap - used, "=%g", a[k].def);
    else if (!a[k].required)
      w = snprintf(buf + used, cap - used, "?");
    else
      w = 0;
    if (w > 0 && (size_t)w < cap - used) used += (size_t)w;
  }
}

dt_status_t dt__op_check_counts(int id, int n_iargs, int n_fargs) {
  const dt_op_arg_t* a;
  int n;
  DT_CHECK(dt__op_schema(id, &a, &n));
  if (id >= DT_OP_COUNT) return DT_SUCCESS; /* host ops validate their own arguments */
  int imin = 0, imax = 0, fmin = 0, fmax = 0;
  for (int k = 0; k < n; k++) {
    if (a[k].kind == DT_ARG_FLOAT) {
      fmax++;
      if (a[k].required) fmin = fmax;
    } else if (a[k].kind == DT_ARG_INT_LIST || a[k].kind == DT_ARG_PLACEMENTS) {
      imax = DT_OP_MAX_IARGS;
    } else {
      imax++;
      if (a[k].required) imin = imax;
    }
  }
  if (n_iargs < imin || n_iargs > imax || n_fargs < fmin || n_fargs > fmax) {
    char it[160], ft[160];
    dt__schema_text(a, n, 0, it, sizeof it);
    dt__schema_text(a, n, 1, ft, sizeof ft);
    /* the one count that is wrong, then what the op takes */
    const int ibad = n_iargs < imin || n_iargs > imax;
    const int got = ibad ? n_iargs : n_fargs, lo = ibad ? imin : fmin, hi = ibad ? imax : fmax;
    char want[48];
    if (lo == hi) snprintf(want, sizeof want, "%d", lo);
    else snprintf(want, sizeof want, "%d to %d", lo, hi);
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "%s takes iargs [%s] and fargs [%s]: n_%s=%d, expected %s (arguments left out "
                   "take their defaults)",
                   dt__op_table[id].name, it, ft, ibad ? "iargs" : "fargs", got, want);
  }
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * introspection */

/* Ids in listing order: built-ins, then host ops that are not overrides. */
static int dt__op_at(int index) {
  if (index < DT_OP_COUNT) return index;
  int k = DT_OP_COUNT;
  for (int h = 0; h < dt__reg.n_host; h++) {
    int id = DT_OP_COUNT + h;
    if (dt__op_find(dt__reg.host[h].name) != id) continue; /* an override of a built-in */
    if (k++ == index) return id;
  }
  return -1;
}

static dt_status_t dt__op_count(int* n) {
  DT_ARG_NOT_NULL(n);
  dt__index_builtins();
  int c = 0;
  for (int h = 0; h < dt__reg.n_host; h++) c += dt__op_find(dt__reg.host[h].name) == DT_OP_COUNT + h;
  *n = DT_OP_COUNT + c;
  return DT_SUCCESS;
}

dt_status_t dt_op_count(int* n) { DT_ENTRY_RETURN(dt__op_count(n)); }

static dt_status_t dt__op_name_at(int index, const char** name) {
  DT_ARG_NOT_NULL(name);
  *name = NULL;
  int n;
  DT_CHECK(dt_op_count(&n));
  if (index < 0 || index >= n)
    return DT_FAIL(DT_ERR_INVALID_ARG, "index=%d out of range [0, %d) (dt_op_count)", index, n);
  *name = dt__name_of(dt__op_at(index));
  return DT_SUCCESS;
}

dt_status_t dt_op_name_at(int index, const char** name) {
  DT_ENTRY_RETURN(dt__op_name_at(index, name));
}

static dt_status_t dt__op_describe(const char* name, dt_op_desc_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  int id;
  DT_CHECK(dt__op_resolve(name, &id));
  const dt_op_info_t* in = dt__op_info(id);
  const dt_op_arg_t* a;
  int n;
  DT_CHECK(dt__op_schema(id, &a, &n));
  out->name = in->name;
  out->n_inputs = in->n_in;
  out->variadic = (in->flags & DT_OPF_VARIADIC) != 0;
  out->in_place = (in->flags & DT_OPF_WRITES_MASK) >> 16;
  out->n_outputs = in->n_out;
  out->n_args = n;
  out->has_backward = in->backward != NULL;
  out->composite = in->composite != NULL;
  out->host = id >= DT_OP_COUNT || dt__reg.override[id] != NULL;
  return DT_SUCCESS;
}

dt_status_t dt_op_describe(const char* name, dt_op_desc_t* out) {
  DT_ENTRY_RETURN(dt__op_describe(name, out));
}

static dt_status_t dt__op_arg_describe(const char* name, int k, dt_op_arg_desc_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  int id, n;
  const dt_op_arg_t* a;
  DT_CHECK(dt__op_resolve(name, &id));
  DT_CHECK(dt__op_schema(id, &a, &n));
  if (k < 0 || k >= n)
    return DT_FAIL(DT_ERR_INVALID_ARG, "k=%d is out of range: %s has %d argument%s (k in [0, %d))",
                   k, name, n, n == 1 ? "" : "s", n);
  out->name = a[k].name;
  out->kind = a[k].kind;
  out->required = a[k].required;
  out->has_default = a[k].has_default;
  out->default_value = a[k].def;
  return DT_SUCCESS;
}

dt_status_t dt_op_arg_describe(const char* name, int k, dt_op_arg_desc_t* out) {
  DT_ENTRY_RETURN(dt__op_arg_describe(name, k, out));
}

/* Parses one integer (base 10, optional sign). */
static int dt__parse_i64(const char* s, const char* end, int64_t* v) {
  char buf[32];
  size_t n = (size_t)(end - s);
  if (n == 0 || n >= sizeof buf) return 0;
  memcpy(buf, s, n);
  buf[n] = '\0';
  char* e;
  errno = 0;
  long long x = strtoll(buf, &e, 10);
  if (*e != '\0' || errno != 0) return 0;
  *v = x;
  return 1;
}

static dt_status_t dt__op_args_parse(const char* name, int n, const char* const* assignments,
                                     int* n_iargs, int64_t* iargs, int* n_fargs, double* fargs) {
  DT_ARG_NOT_NULL(n_iargs);
  DT_ARG_NOT_NULL(n_fargs);
  *n_iargs = *n_fargs = 0;
  DT_ARG_NOT_NULL(iargs);
  DT_ARG_NOT_NULL(fargs);
  if (n < 0 || (n > 0 && assignments == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "n=%d assignments with assignments %s (n >= 0, and an array "
                   "of n \"NAME=VALUE\" texts when n > 0)", n, assignments ? "given" : "NULL");
  int id, ns;
  const dt_op_arg_t* a;
  DT_CHECK(dt__op_resolve(name, &id));
  DT_CHECK(dt__op_schema(id, &a, &ns));
  if (id >= DT_OP_COUNT && n > 0)
    return DT_FAIL(DT_ERR_UNSUPPORTED, "%s is a host op without an argument schema", name);
  int given[DT_OP_MAX_IARGS + DT_OP_MAX_FARGS] = {0};
  int64_t ival[DT_OP_MAX_IARGS + DT_OP_MAX_FARGS];
  double fval[DT_OP_MAX_IARGS + DT_OP_MAX_FARGS];
  int64_t list[DT_OP_MAX_IARGS];
  int nlist = 0;
  for (int i = 0; i < n; i++) {
    const char* s = assignments[i];
    if (s == NULL)
      return DT_FAIL(DT_ERR_INVALID_ARG, "assignments[%d] is NULL (expected \"NAME=VALUE\")", i);
    const char* eq = strchr(s, '=');
    if (eq == NULL || eq == s)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: argument '%s' is not NAME=VALUE", name, s);
    int k = -1;
    for (int j = 0; j < ns; j++)
      if (strlen(a[j].name) == (size_t)(eq - s) && strncmp(a[j].name, s, (size_t)(eq - s)) == 0)
        k = j;
    if (k < 0) {
      char names[256];
      size_t used = 0;
      names[0] = '\0';
      for (int j = 0; j < ns; j++) {
        int w = snprintf(names + used, sizeof names - used, "%s%s", j ? ", " : "", a[j].name);
        if (w > 0 && (size_t)w < sizeof names - used) used += (size_t)w;
      }
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s has no argument '%.*s' (it takes: %s)", name,
                     (int)(eq - s), s, ns ? names : "none");
    }
    if (given[k]) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: argument '%s' given twice", name, a[k].name);
    given[k] = 1;
    const char* v = eq + 1;
    switch (a[k].kind) {
      case DT_ARG_FLOAT: {
        char* e;
        errno = 0;
        fval[k] = strtod(v, &e);
        if (e == v || *e != '\0' || errno != 0 || !isfinite(fval[k]))
          return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %s='%s' is not a finite number", name,
                         a[k].name, v);
        break;
      }
      case DT_ARG_DTYPE: {
        dt_dtype_t dt;
        if (dt_dtype_parse(v, &dt) == DT_SUCCESS) {
          ival[k] = dt;
        } else if (!dt__parse_i64(v, v + strlen(v), &ival[k]) || ival[k] < 0 ||
                   ival[k] >= DT_DTYPE_COUNT) { /* the range before any cast to int */
          return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %s='%s' is not a dtype (f32, bf16, f16, i32, "
                         "i64)", name, a[k].name, v);
        }
        break;
      }
      case DT_ARG_INT_LIST:
      case DT_ARG_PLACEMENTS: {
        if (a[k].kind == DT_ARG_PLACEMENTS) {
          dt_placement_t pl[DT_MAX_MESH_DIMS];
          int np;
          if (dt_placements_parse(v, pl, DT_MAX_MESH_DIMS, &np) != DT_SUCCESS)
            return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %s='%s' is not a placement list", name,
                           a[k].name, v);
          for (int q = 0; q < np; q++) list[nlist++] = dt_placement_encode(pl[q]);
          break;
        }
        const char* p = v;
        while (*p) {
          const char* c = strchr(p, ',');
          const char* e = c ? c : p + strlen(p);
          if (nlist == DT_OP_MAX_IARGS || !dt__parse_i64(p, e, &list[nlist]) ||
              (c != NULL && c[1] == '\0')) /* "1," leaves an empty last item */
            return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %s='%s' is not a list of at most %d integers",
                           name, a[k].name, v, DT_OP_MAX_IARGS);
          nlist++;
          p = c ? c + 1 : e;
        }
        break;
      }
      default:
        if (!dt__parse_i64(v, v + strlen(v), &ival[k]))
          return DT_FAIL(DT_ERR_INVALID_ARG, "%s: %s='%s' is not an integer", name, a[k].name, v);
        break;
    }
  }
  /* Fill each kind in schema order up to its last given argument. */
  int last_i = -1, last_f = -1;
  for (int k = 0; k < ns; k++) {
    if (!given[k] && a[k].required)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: argument '%s' is required", name, a[k].name);
    if (given[k] || a[k].required) {
      if (a[k].kind == DT_ARG_FLOAT) last_f = k;
      else last_i = k;
    }
  }
  for (int k = 0; k < ns; k++) {
    int fl = a[k].kind == DT_ARG_FLOAT;
    if (k > (fl ? last_f : last_i)) continue;
    if (!given[k] && !a[k].has_default)
      return DT_FAIL(DT_ERR_INVALID_ARG, "%s: give '%s' too (a later argument is given)", name,
                     a[k].name);
    if (fl) {
      if (*n_fargs == DT_OP_MAX_FARGS) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: too many scalars", name);
      fargs[(*n_fargs)++] = given[k] ? fval[k] : a[k].def;
    } else if (a[k].kind == DT_ARG_INT_LIST || a[k].kind == DT_ARG_PLACEMENTS) {
      if (*n_iargs + nlist > DT_OP_MAX_IARGS)
        return DT_FAIL(DT_ERR_INVALID_ARG, "%s: more than %d integers", name, DT_OP_MAX_IARGS);
      for (int q = 0; q < nlist; q++) iargs[(*n_iargs)++] = list[q];
    } else {
      if (*n_iargs == DT_OP_MAX_IARGS) return DT_FAIL(DT_ERR_INVALID_ARG, "%s: too many integers", name);
      iargs[(*n_iargs)++] = given[k] ? ival[k] : (int64_t)a[k].def;
    }
  }
  return DT_SUCCESS;
}

dt_status_t dt_op_args_parse(const char* name, int n, const char* const* assignments,
                             int* n_iargs, int64_t* iargs, int* n_fargs, double* fargs) {
  DT_ENTRY_RETURN(dt__op_args_parse(name, n, assignments, n_iargs, iargs, n_fargs, fargs));
}
