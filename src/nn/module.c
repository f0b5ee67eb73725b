/* module.c - modules: an ordered list of named parameters and children, a forward function, and
 * forward and backward hooks (the backward ones through the tape's span hooks); the parameter list
 * and zero_grad a training loop uses. A lookup of a missing parameter says what the module has,
 * and a forward that fails after one says so too. Public API only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/check.h"
#include "dtensor/handle.h"
#include "dtensor/module.h"

#define DT_MODULE_IO_MAX 16       /* inputs and outputs of one forward */

typedef struct {
  char name[DT_MODULE_NAME_MAX];
  dt_var_t param;      /* a parameter entry, or */
  dt_module_t child;   /* a child entry */
} dt__entry_t;

typedef struct {
  void* fn;
  void* ctx;
} dt__hook_t;

enum { DT__FPRE, DT__FPOST, DT__BPRE, DT__BPOST, DT__HOOK_KINDS };

typedef struct {
  char key[DT_MODULE_NAME_MAX];
  void* data;
  dt_module_free_fn free_fn;
} dt__attachment_t;

struct dt_module {
  char name[DT_MODULE_NAME_MAX];
  dt_module_forward_fn forward;
  void* ctx;
  dt__entry_t* entries;
  int n, cap;
  dt_module_t parent;
  dt__hook_t hooks[DT__HOOK_KINDS][DT_MODULE_HOOKS_MAX];
  int n_hooks[DT__HOOK_KINDS];
  dt__attachment_t att[DT_MODULE_HOOKS_MAX];
  int n_att;
  dt_var_t* plist; /* dt_module_params' array (owned) */
};

static const dt_handle_kind_t dt__module_kind = {"module"};

static dt_status_t dt__module_check(dt_module_t m) {
  return dt_handle_check(m, &dt__module_kind, "module");
}

/* A name component: shorter than DT_MODULE_NAME_MAX, no '.' (the path separator). */
static dt_status_t dt__name_check(const char* name, const char* what) {
  if (name == NULL) return DT_FAIL(DT_ERR_INVALID_ARG, "%s name is NULL", what);
  if (strlen(name) >= DT_MODULE_NAME_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s name '%s' is longer than %d characters", what, name,
                   DT_MODULE_NAME_MAX - 1);
  if (strchr(name, '.'))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s name '%s' contains '.' (the path separator)", what,
                   name);
  return DT_SUCCESS;
}

dt_status_t dt_module_create(const char* name, dt_module_forward_fn forward, void* ctx,
                             dt_module_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__name_check(name, "module"));
  dt_module_t m = calloc(1, sizeof *m);
  if (m == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "allocating a module");
  dt_status_t st = dt_handle_register(m, &dt__module_kind);
  if (st != DT_SUCCESS) {
    free(m);
    return st;
  }
  strcpy(m->name, name);
  m->forward = forward;
  m->ctx = ctx;
  *out = m;
  return DT_SUCCESS;
}

/* Frees m and what it owns (parameters a caller destroyed already are skipped). */
static void dt__module_free(dt_module_t m) {
  for (int i = m->n_att - 1; i >= 0; i--) /* wrappers first: they may put parameters back */
    if (m->att[i].free_fn) m->att[i].free_fn(m, m->att[i].data);
  m->n_att = 0;
  for (int i = 0; i < m->n; i++) {
    if (m->entries[i].param) dt_var_destroy(m->entries[i].param);
    if (m->entries[i].child) dt__module_free(m->entries[i].child);
  }
  free(m->entries);
  free(m->plist);
  dt_handle_unregister(m, &dt__module_kind, "module");
  dt_handle_free(m);
}

dt_status_t dt_module_destroy(dt_module_t m) {
  if (m == NULL) return DT_SUCCESS;
  DT_CHECK(dt__module_check(m));
  if (m->parent != NULL)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "module '%s' is a child of '%s': destroying the root "
                   "destroys it", m->name, m->parent->name);
  dt__module_free(m);
  return DT_SUCCESS;
}

const char* dt_module_name(dt_module_t m) {
  return dt__module_check(m) == DT_SUCCESS ? m->name : NULL;
}
void* dt_module_ctx(dt_module_t m) { return dt__module_check(m) == DT_SUCCESS ? m->ctx : NULL; }

static dt_status_t dt__add(dt_module_t m, const char* name, dt_var_t param, dt_module_t child) {
  for (int i = 0; i < m->n; i++) /* unique names; several unnamed children are fine */
    if (strcmp(m->entries[i].name, name) == 0 && (name[0] || param || m->entries[i].param))
      return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' already has %s named '%s'", m->name,
                     m->entries[i].param ? "a parameter" : "a child", name);
  if (m->n == m->cap) {
    int cap = m->cap ? 2 * m->cap : 8;
    dt__entry_t* e = realloc(m->entries, sizeof *e * (size_t)cap);
    if (e == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "module entries");
    m->entries = e;
    m->cap = cap;
  }
  dt__entry_t* e = &m->entries[m->n++];
  memset(e, 0, sizeof *e);
  strcpy(e->name, name);
  e->param = param;
  e->child = child;
  return DT_SUCCESS;
}

dt_status_t dt_module_add_param(dt_module_t m, const char* name, dt_var_t param) {
  DT_CHECK(dt__module_check(m));
  DT_CHECK(dt__name_check(name, "parameter"));
  DT_ARG_NOT_NULL(param);
  if (dt_var_value(param) == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "parameter '%s' is not a live variable", name);
  return dt__add(m, name, param, NULL);
}

dt_status_t dt_module_add_child(dt_module_t m, dt_module_t child) {
  DT_CHECK(dt__module_check(m));
  DT_CHECK(dt__module_check(child));
  if (child->parent != NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' already has a parent", child->name);
  for (dt_module_t p = m; p != NULL; p = p->parent)
    if (p == child) return DT_FAIL(DT_ERR_INVALID_ARG, "adding '%s' would make a cycle", child->name);
  DT_CHECK(dt__add(m, child->name, NULL, child));
  child->parent = m;
  return DT_SUCCESS;
}

/* The entry holding the parameter at `path` below m (unnamed children are looked through). */
static dt__entry_t* dt__find_param(dt_module_t m, const char* path) {
  for (int i = 0; i < m->n; i++) {
    dt__entry_t* e = &m->entries[i];
    size_t len = strlen(e->name);
    if (e->param) {
      if (strcmp(e->name, path) == 0) return e;
      continue;
    }
    if (len == 0) { /* unnamed child: its parameters keep the path */
      dt__entry_t* r = dt__find_param(e->child, path);
      if (r) return r;
    } else if (strncmp(path, e->name, len) == 0 && (path[len] == '.' || path[len] == '\0')) {
      dt__entry_t* r = dt__find_param(e->child, path[len] ? path + len + 1 : "");
      if (r) return r;
    }
  }
  return NULL;
}

/* Forward declaration: the qualified parameter names below m ("weight, bias"), for messages. */
static void dt__param_names(dt_module_t m, char* buf, size_t cap);

/* "module 'fc1' has no parameter 'wieght' (it has: weight, bias)" as the last error. */
static dt_status_t dt__no_param(const char* func, dt_module_t m, const char* name) {
  char names[320];
  dt__param_names(m, names, sizeof names);
  return dt_set_error(DT_ERR_INVALID_ARG, func, __FILE__, __LINE__,
                      "module '%s' has no parameter '%s' (it has: %s)", m->name, name, names);
}

/* The last dt_module_get miss on this thread: its message, the number of misses so far, and
 * whether the last one is still open. A forward that fails after a miss made during it reports
 * the miss (and closes it); a forward that succeeds after one closes it too (it recovered, e.g. a
 * probe for an optional parameter), so no later failure is blamed on it. */
static _Thread_local char dt__miss_msg[400];
static _Thread_local unsigned long dt__misses;
static _Thread_local int dt__miss_open;

dt_status_t dt_module_param(dt_module_t m, const char* name, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(name);
  dt__entry_t* e = dt__find_param(m, name);
  if (e == NULL) return dt__no_param(__func__, m, name);
  *out = e->param;
  return DT_SUCCESS;
}

dt_var_t dt_module_get(dt_module_t m, const char* name) {
  dt_status_t st = dt__module_check(m);
  if (st == DT_SUCCESS && name == NULL) st = DT_FAIL(DT_ERR_INVALID_ARG, "name is NULL");
  dt__entry_t* e = st == DT_SUCCESS ? dt__find_param(m, name) : NULL;
  if (e != NULL) return e->param;
  if (st == DT_SUCCESS) dt__no_param(__func__, m, name);
  snprintf(dt__miss_msg, sizeof dt__miss_msg, "%s", dt_last_error());
  dt__misses++;
  dt__miss_open = 1;
  return NULL;
}

dt_status_t dt_module_swap_param(dt_module_t m, const char* name, dt_var_t param,
                                 dt_var_t* old) {
  DT_ARG_NOT_NULL(old);
  *old = NULL;
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(name);
  DT_ARG_NOT_NULL(param);
  if (dt_var_value(param) == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "the new parameter '%s' is not a live variable", name);
  dt__entry_t* e = dt__find_param(m, name);
  if (e == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has no parameter '%s'", m->name, name);
  *old = e->param;
  e->param = param;
  return DT_SUCCESS;
}

dt_status_t dt_module_set_param(dt_module_t m, const char* name, dt_var_t param) {
  dt_var_t old;
  DT_CHECK(dt_module_swap_param(m, name, param, &old));
  if (old != param) dt_var_destroy(old);
  return DT_SUCCESS;
}

dt_module_t dt_module_parent(dt_module_t m) {
  return dt__module_check(m) == DT_SUCCESS ? m->parent : NULL;
}

static dt__attachment_t* dt__find_att(dt_module_t m, const char* key) {
  for (int i = 0; i < m->n_att; i++)
    if (strcmp(m->att[i].key, key) == 0) return &m->att[i];
  return NULL;
}

dt_status_t dt_module_attach(dt_module_t m, const char* key, void* data,
                             dt_module_free_fn free_fn) {
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(key);
  if (strlen(key) == 0 || strlen(key) >= DT_MODULE_NAME_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "attachment key '%s': 1 to %d characters", key,
                   DT_MODULE_NAME_MAX - 1);
  if (dt__find_att(m, key))
    return DT_FAIL(DT_ERR_INVALID_USAGE, "module '%s' already has an attachment '%s'", m->name,
                   key);
  if (m->n_att == DT_MODULE_HOOKS_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has %d attachments already", m->name,
                   DT_MODULE_HOOKS_MAX);
  dt__attachment_t* a = &m->att[m->n_att++];
  strcpy(a->key, key);
  a->data = data;
  a->free_fn = free_fn;
  return DT_SUCCESS;
}

void* dt_module_attachment(dt_module_t m, const char* key) {
  if (dt__module_check(m) != DT_SUCCESS || key == NULL) return NULL;
  dt__attachment_t* a = dt__find_att(m, key);
  return a ? a->data : NULL;
}

dt_status_t dt_module_detach(dt_module_t m, const char* key) {
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(key);
  dt__attachment_t* a = dt__find_att(m, key);
  if (a == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has no attachment '%s'", m->name, key);
  *a = m->att[--m->n_att];
  return DT_SUCCESS;
}

static dt_module_t dt__find_module(dt_module_t m, const char* path) {
  if (path[0] == '\0') return m;
  for (int i = 0; i < m->n; i++) {
    dt__entry_t* e = &m->entries[i];
    if (e->child == NULL) continue;
    size_t len = strlen(e->name);
    dt_module_t r = NULL;
    if (len == 0) r = dt__find_module(e->child, path);
    else if (strncmp(path, e->name, len) == 0 && (path[len] == '.' || path[len] == '\0'))
      r = dt__find_module(e->child, path[len] ? path + len + 1 : "");
    if (r) return r;
  }
  return NULL;
}

dt_status_t dt_module_find(dt_module_t m, const char* path, dt_module_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(path);
  *out = dt__find_module(m, path);
  if (*out == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has no module at '%s'", m->name, path);
  return DT_SUCCESS;
}

dt_status_t dt_module_num_children(dt_module_t m, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  DT_CHECK(dt__module_check(m));
  for (int i = 0; i < m->n; i++) *n += m->entries[i].child != NULL;
  return DT_SUCCESS;
}

dt_status_t dt_module_child(dt_module_t m, int i, dt_module_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__module_check(m));
  for (int k = 0, c = 0; k < m->n; k++)
    if (m->entries[k].child && c++ == i) {
      *out = m->entries[k].child;
      return DT_SUCCESS;
    }
  return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has no child %d", m->name, i);
}

/* Depth-first over the parameters with their qualified names (prefix holds the path so far). */
static int dt__walk(dt_module_t m, char* prefix, size_t len, size_t cap, dt_module_visit_fn visit,
                    void* ctx) {
  for (int i = 0; i < m->n; i++) {
    dt__entry_t* e = &m->entries[i];
    size_t add = 0;
    if (e->name[0]) {
      int w = snprintf(prefix + len, cap - len, "%s%s", len ? "." : "", e->name);
      add = w > 0 ? (size_t)w : 0;
      if (len + add >= cap) add = cap - 1 - len; /* truncated (the names were checked) */
    }
    int stop = e->param ? visit(prefix, e->param, ctx)
                        : dt__walk(e->child, prefix, len + add, cap, visit, ctx);
    prefix[len] = '\0';
    if (stop) return stop;
  }
  return 0;
}

#define DT__PATH_MAX 1024

dt_status_t dt_module_for_each_param(dt_module_t m, dt_module_visit_fn visit, void* ctx) {
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(visit);
  char prefix[DT__PATH_MAX] = "";
  dt__walk(m, prefix, 0, sizeof prefix, visit, ctx);
  return DT_SUCCESS;
}

typedef struct {
  int want, seen;
  char* name;
  size_t cap;
  dt_var_t found;
} dt__at_t;

static int dt__count(const char* name, dt_var_t p, void* ctx) {
  (void)name;
  (void)p;
  ((dt__at_t*)ctx)->seen++;
  return 0;
}

static int dt__pick(const char* name, dt_var_t p, void* ctx) {
  dt__at_t* a = ctx;
  if (a->seen++ != a->want) return 0;
  a->found = p;
  if (a->name && a->cap) snprintf(a->name, a->cap, "%s", name);
  return 1;
}

dt_status_t dt_module_num_params(dt_module_t m, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  dt__at_t a = {0, 0, NULL, 0, NULL};
  DT_CHECK(dt_module_for_each_param(m, dt__count, &a));
  *n = a.seen;
  return DT_SUCCESS;
}

dt_status_t dt_module_param_at(dt_module_t m, int i, char* name, size_t cap, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt__at_t a = {i, 0, name, cap, NULL};
  DT_CHECK(dt_module_for_each_param(m, dt__pick, &a));
  if (a.found == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has %d parameters, not %d", m->name, a.seen,
                   i + 1);
  *out = a.found;
  return DT_SUCCESS;
}

typedef struct {
  char* buf;
  size_t cap, len;
  int n, shown;
} dt__names_t;

static int dt__name_add(const char* name, dt_var_t p, void* ctx) {
  (void)p;
  dt__names_t* a = ctx;
  a->n++;
  const char* shown = name[0] ? name : "\"\""; /* an unnamed parameter */
  size_t need = strlen(shown) + (a->shown ? 2 : 0);
  if (a->shown == a->n - 1 && a->len + need + 24 < a->cap) { /* room for ", ... (N in all)" */
    a->len += (size_t)snprintf(a->buf + a->len, a->cap - a->len, "%s%s", a->shown ? ", " : "",
                               shown);
    a->shown++;
  }
  return 0;
}

static void dt__param_names(dt_module_t m, char* buf, size_t cap) {
  dt__names_t a = {buf, cap, 0, 0, 0};
  buf[0] = '\0';
  char prefix[DT__PATH_MAX] = "";
  dt__walk(m, prefix, 0, sizeof prefix, dt__name_add, &a);
  if (a.n == 0) snprintf(buf, cap, "no parameters");
  else if (a.shown < a.n)
    snprintf(buf + a.len, cap - a.len, ", ... (%d in all)", a.n);
}

typedef struct {
  dt_var_t* list;
  int n;
} dt__collect_t;

static int dt__collect(const char* name, dt_var_t p, void* ctx) {
  (void)name;
  dt__collect_t* c = ctx;
  c->list[c->n++] = p;
  return 0;
}

dt_status_t dt_module_params(dt_module_t m, dt_var_t** params, int* n) {
  DT_ARG_NOT_NULL(params);
  DT_ARG_NOT_NULL(n);
  *params = NULL;
  *n = 0;
  int count;
  DT_CHECK(dt_module_num_params(m, &count));
  dt_var_t* list = malloc(sizeof(dt_var_t) * (size_t)(count ? count : 1));
  if (list == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "module '%s': %d parameters", m->name,
                                   count);
  dt__collect_t c = {list, 0};
  DT_CHECK(dt_module_for_each_param(m, dt__collect, &c));
  free(m->plist);
  m->plist = list;
  *params = list;
  *n = c.n;
  return DT_SUCCESS;
}

static int dt__zero(const char* name, dt_var_t p, void* ctx) {
  (void)name;
  dt_status_t* st = ctx;
  *st = dt_var_zero_grad(p);
  return *st != DT_SUCCESS;
}

dt_status_t dt_module_zero_grad(dt_module_t m) {
  dt_status_t st = DT_SUCCESS;
  DT_CHECK(dt_module_for_each_param(m, dt__zero, &st));
  if (st != DT_SUCCESS) return DT_FAIL(st, "module '%s': %s", m->name, dt_last_error());
  return DT_SUCCESS;
}

/* ---------------------------------------------------------------------------------------------
 * hooks and forward */

static dt_status_t dt__add_hook(dt_module_t m, int kind, void* fn, void* ctx) {
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(fn);
  if (m->n_hooks[kind] == DT_MODULE_HOOKS_MAX)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has %d hooks of this kind already", m->name,
                   DT_MODULE_HOOKS_MAX);
  m->hooks[kind][m->n_hooks[kind]++] = (dt__hook_t){fn, ctx};
  return DT_SUCCESS;
}

dt_status_t dt_module_add_forward_pre_hook(dt_module_t m, dt_module_forward_hook_fn fn,
                                           void* ctx) {
  return dt__add_hook(m, DT__FPRE, (void*)fn, ctx);
}
dt_status_t dt_module_add_forward_post_hook(dt_module_t m, dt_module_forward_hook_fn fn,
                                            void* ctx) {
  return dt__add_hook(m, DT__FPOST, (void*)fn, ctx);
}
dt_status_t dt_module_add_backward_pre_hook(dt_module_t m, dt_module_backward_hook_fn fn,
                                            void* ctx) {
  return dt__add_hook(m, DT__BPRE, (void*)fn, ctx);
}
dt_status_t dt_module_add_backward_post_hook(dt_module_t m, dt_module_backward_hook_fn fn,
                                             void* ctx) {
  return dt__add_hook(m, DT__BPOST, (void*)fn, ctx);
}

dt_status_t dt_module_remove_hooks(dt_module_t m, void* ctx) {
  DT_CHECK(dt__module_check(m));
  for (int k = 0; k < DT__HOOK_KINDS; k++) {
    int w = 0;
    for (int i = 0; i < m->n_hooks[k]; i++)
      if (m->hooks[k][i].ctx != ctx) m->hooks[k][w++] = m->hooks[k][i];
    m->n_hooks[k] = w;
  }
  return DT_SUCCESS;
}

static dt_status_t dt__backward_hooks(dt_module_t m, dt_tape_t tape, int kind) {
  for (int i = 0; i < m->n_hooks[kind]; i++) {
    dt_module_backward_hook_fn fn = (dt_module_backward_hook_fn)m->hooks[kind][i].fn;
    DT_CHECK(fn(m, tape, m->hooks[kind][i].ctx));
  }
  return DT_SUCCESS;
}
static dt_status_t dt__span_pre(dt_tape_t tape, void* ctx) {
  return dt__backward_hooks((dt_module_t)ctx, tape, DT__BPRE);
}
static dt_status_t dt__span_post(dt_tape_t tape, void* ctx) {
  return dt__backward_hooks((dt_module_t)ctx, tape, DT__BPOST);
}

static dt_status_t dt__forward_hooks(dt_module_t m, dt_tape_t tape, int kind, int n,
                                     dt_var_t* vars) {
  for (int i = 0; i < m->n_hooks[kind]; i++) {
    dt_module_forward_hook_fn fn = (dt_module_forward_hook_fn)m->hooks[kind][i].fn;
    DT_CHECK(fn(m, tape, n, vars, m->hooks[kind][i].ctx));
  }
  return DT_SUCCESS;
}

dt_status_t dt_module_forward(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                              int n_out, dt_var_t* out) {
  DT_CHECK(dt__module_check(m));
  if (n_in < 0 || n_in > DT_MODULE_IO_MAX || n_out < 0 || n_out > DT_MODULE_IO_MAX ||
      (n_in > 0 && in == NULL) || (n_out > 0 && out == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s': %d inputs, %d outputs (0 to %d, arrays "
                   "given)", m->name, n_in, n_out, DT_MODULE_IO_MAX);
  dt_var_t args[DT_MODULE_IO_MAX]; /* first: in and out may be the same array */
  if (n_in) memcpy(args, in, sizeof(dt_var_t) * (size_t)n_in);
  for (int o = 0; o < n_out; o++) out[o] = NULL;
  if (m->forward == NULL)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "module '%s' has no forward function", m->name);
  DT_CHECK(dt__forward_hooks(m, tape, DT__FPRE, n_in, args));
  int64_t first = 0, end = 0;
  if (tape) DT_CHECK(dt_tape_stats(tape, &first, NULL));
  unsigned long misses = dt__misses;
  dt_status_t st = m->forward(m, tape, n_in, args, n_out, out);
  if (dt__misses != misses && dt__miss_open) { /* a lookup during this forward found nothing */
    dt__miss_open = 0; /* reported now (once, not again by the enclosing forwards), or survived */
    if (st != DT_SUCCESS) /* most likely on the NULL: say both, the lookup first */
      return DT_FAIL(st, "module '%s': the forward failed after %s; the failure: %s", m->name,
                     dt__miss_msg, dt_last_error());
  }
  DT_CHECK(st);
  if (tape && (m->n_hooks[DT__BPRE] || m->n_hooks[DT__BPOST])) {
    DT_CHECK(dt_tape_stats(tape, &end, NULL));
    if (end > first)
      DT_CHECK(dt_tape_add_span_hooks(tape, first, end, m->n_hooks[DT__BPRE] ? dt__span_pre : NULL,
                                      m->n_hooks[DT__BPOST] ? dt__span_post : NULL, m));
  }
  return dt__forward_hooks(m, tape, DT__FPOST, n_out, out);
}
