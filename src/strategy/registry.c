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

dt_status_t dt__op_resolve(const char* name, int* id) {
  if (name == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "op name is NULL");
  *id = dt__op_find(name);
  if (*id < 0) return DT_FAIL(DT_ERR_UNSUPPORTED, "no sharding strategy for %s", name);
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

dt_status_t dt_op_register(const char* name, int n_inputs, dt_op_rules_fn rules,
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

dt_status_t dt_op_register_kernel(const char* name, dt_device_t device, dt_op_kernel_fn kernel) {
  DT_ARG_NOT_NULL(name);
  if (device < 0 || device >= DT_DEVICE_COUNT)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op %s: device %d out of range [0, %d)", name, (int)device,
                   (int)DT_DEVICE_COUNT);
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

dt_status_t dt_op_lookup(const char* name, int* found) {
  DT_ARG_NOT_NULL(found);
  *found = 0;
  DT_ARG_NOT_NULL(name);
  *found = dt__op_find(name) >= 0;
  return DT_SUCCESS;
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

double dt__op_farg(int id, const dt_op_call_t* call, int k) {
  if (k < call->n_fargs) return call->fargs[k];
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
    return DT_FAIL(DT_ERR_INVALID_ARG,
                   "%s takes iargs [%s] and fargs [%s]; got %d integer and %d scalar arguments",
                   dt__op_table[id].name, it, ft, n_iargs, n_fargs);
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

dt_status_t dt_op_count(int* n) {
  DT_ARG_NOT_NULL(n);
  dt__index_builtins();
  int c = 0;
  for (int h = 0; h < dt__reg.n_host; h++) c += dt__op_find(dt__reg.host[h].name) == DT_OP_COUNT + h;
  *n = DT_OP_COUNT + c;
  return DT_SUCCESS;
}

dt_status_t dt_op_name_at(int index, const char** name) {
  DT_ARG_NOT_NULL(name);
  *name = NULL;
  int n;
  DT_CHECK(dt_op_count(&n));
  if (index < 0 || index >= n)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op index %d out of range [0, %d)", index, n);
  *name = dt__name_of(dt__op_at(index));
  return DT_SUCCESS;
}

dt_status_t dt_op_describe(const char* name, dt_op_desc_t* out) {
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

dt_status_t dt_op_arg_describe(const char* name, int k, dt_op_arg_desc_t* out) {
  DT_ARG_NOT_NULL(out);
  memset(out, 0, sizeof *out);
  int id, n;
  const dt_op_arg_t* a;
  DT_CHECK(dt__op_resolve(name, &id));
  DT_CHECK(dt__op_schema(id, &a, &n));
  if (k < 0 || k >= n)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s has %d arguments; %d is out of range", name, n, k);
  out->name = a[k].name;
  out->kind = a[k].kind;
  out->required = a[k].required;
  out->has_default = a[k].has_default;
  out->default_value = a[k].def;
  return DT_SUCCESS;
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

dt_status_t dt_op_args_parse(const char* name, int n, const char* const* assignments,
                             int* n_iargs, int64_t* iargs, int* n_fargs, double* fargs) {
  DT_ARG_NOT_NULL(n_iargs);
  DT_ARG_NOT_NULL(n_fargs);
  *n_iargs = *n_fargs = 0;
  DT_ARG_NOT_NULL(iargs);
  DT_ARG_NOT_NULL(fargs);
  if (n < 0 || (n > 0 && assignments == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%d assignments (NULL array?)", n);
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
    if (s == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "assignment %d is NULL", i);
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
        } else if (!dt__parse_i64(v, v + strlen(v), &ival[k]) || !dt__dtype_valid((int)ival[k])) {
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
          if (nlist == DT_OP_MAX_IARGS || !dt__parse_i64(p, e, &list[nlist]))
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
