/* registry.c - the op strategy registry: names to rule generators, built-ins and host ops. */
#include <stdio.h>

#include "strategy/strategy.h"

#define DT_OP_TABLE_MAX 256

typedef struct dt_op_entry {
  char name[DT_OP_NAME_MAX];
  int n_inputs;
  dt_op_rules_fn rules;
  dt_op_kernel_fn kernel;
  dt__op_check_fn check; /* built-ins only: drops expanded candidates a rule cannot express */
  int builtin_kernel;     /* the kernel is the library's (writes every output element) */
} dt_op_entry_t;

static dt_op_entry_t dt__op_table[DT_OP_TABLE_MAX];
static int dt__op_count = 0;
static int dt__op_builtins = 0;

static void dt__ensure_builtins(void) {
  if (!dt__op_builtins) {
    dt__op_builtins = 1; /* set first: registration below goes through dt_op_register */
    dt__ops_register_builtins();
  }
}

/* Open-addressing index over the table (names are never removed): a lookup is one string hash
 * and usually one strcmp, on the dispatch hot path. */
#define DT_OP_INDEX_CAP (4 * DT_OP_TABLE_MAX)
static short dt__op_index[DT_OP_INDEX_CAP]; /* entry + 1; 0 = empty */

static size_t dt__op_slot(const char* name) {
  return (size_t)(dt__hash_str(0, name) & (DT_OP_INDEX_CAP - 1));
}

static dt_op_entry_t* dt__op_find(const char* name) {
  for (size_t j = dt__op_slot(name); dt__op_index[j]; j = (j + 1) & (DT_OP_INDEX_CAP - 1))
    if (strcmp(dt__op_table[dt__op_index[j] - 1].name, name) == 0)
      return &dt__op_table[dt__op_index[j] - 1];
  return NULL;
}

dt_status_t dt_op_register(const char* name, int n_inputs, dt_op_rules_fn rules,
                           dt_op_kernel_fn kernel) {
  DT_ARG_NOT_NULL(name);
  DT_ARG_NOT_NULL(rules);
  dt__ensure_builtins();
  size_t len = strlen(name);
  if (len == 0 || len >= DT_OP_NAME_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "op name '%s' must have 1 to %d characters", name,
                   DT_OP_NAME_MAX - 1);
  if (n_inputs < 0 || n_inputs > DT_OP_MAX_INPUTS)
    return DT_FAIL(DT_ERR_INVALID_ARG, "n_inputs %d out of range [0 (variadic), %d]", n_inputs,
                   DT_OP_MAX_INPUTS);
  dt_op_entry_t* e = dt__op_find(name);
  if (e == NULL) {
    if (dt__op_count == DT_OP_TABLE_MAX)
      return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "op table full (%d ops)", DT_OP_TABLE_MAX);
    e = &dt__op_table[dt__op_count++];
    snprintf(e->name, sizeof e->name, "%s", name);
    size_t j = dt__op_slot(e->name);
    while (dt__op_index[j]) j = (j + 1) & (DT_OP_INDEX_CAP - 1);
    dt__op_index[j] = (short)dt__op_count;
  }
  e->n_inputs = n_inputs;
  e->rules = rules;
  e->kernel = kernel;
  e->check = NULL;
  e->builtin_kernel = 0;
  return DT_SUCCESS;
}

dt_status_t dt_op_lookup(const char* name, int* found) {
  DT_ARG_NOT_NULL(found);
  *found = 0;
  DT_ARG_NOT_NULL(name);
  dt__ensure_builtins();
  *found = dt__op_find(name) != NULL;
  return DT_SUCCESS;
}

/* Internal: the entry for a call (validated arity), for select.c. */
dt_status_t dt__op_get(const dt_op_call_t* call, dt_op_rules_fn* rules) {
  return dt__op_get_kernel(call, rules, NULL, NULL);
}

dt_status_t dt__op_get_kernel(const dt_op_call_t* call, dt_op_rules_fn* rules,
                              dt_op_kernel_fn* kernel, int* builtin) {
  dt__ensure_builtins();
  if (call->op == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "call->op is NULL");
  dt_op_entry_t* e = dt__op_find(call->op);
  if (e == NULL) return DT_FAIL(DT_ERR_UNSUPPORTED, "no sharding strategy for %s", call->op);
  if (e->n_inputs != 0 && call->n_inputs != e->n_inputs)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s takes %d tensor inputs, got %d", call->op, e->n_inputs,
                   call->n_inputs);
  *rules = e->rules;
  if (kernel) *kernel = e->kernel;
  if (builtin) *builtin = e->builtin_kernel;
  return DT_SUCCESS;
}

dt__op_check_fn dt__op_get_check(const char* name) {
  dt_op_entry_t* e = dt__op_find(name);
  return e ? e->check : NULL;
}

dt_status_t dt__op_set_check(const char* name, dt__op_check_fn check) {
  dt_op_entry_t* e = dt__op_find(name);
  if (e == NULL) return DT_FAIL(DT_ERR_INTERNAL, "no op %s to attach a check to", name);
  e->check = check;
  return DT_SUCCESS;
}

/* Built-in kernels are attached by the ops layer (which sits above this one). */
dt_status_t dt__op_set_kernel(const char* name, dt_op_kernel_fn kernel) {
  dt__ensure_builtins();
  dt_op_entry_t* e = dt__op_find(name);
  if (e == NULL) return DT_FAIL(DT_ERR_INTERNAL, "no op %s to attach a kernel to", name);
  if (e->kernel == NULL) {
    e->kernel = kernel;
    e->builtin_kernel = 1;
  }
  return DT_SUCCESS;
}

dt_status_t dt__op_rules_of(const char* name, const dt_op_call_t* call, dt_tensor_meta_t* out_meta,
                            dt_op_rule_t* rules, int cap, int* n) {
  dt_op_entry_t* e = dt__op_find(name);
  if (e == NULL) return DT_FAIL(DT_ERR_INTERNAL, "no op %s", name);
  int n_out;
  return e->rules(call, out_meta, &n_out, rules, cap, n);
}
