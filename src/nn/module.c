/* module.c - modules: an ordered list of named parameters and children, a forward function, and
 * forward and backward hooks (the backward ones through the tape's span hooks); the parameter list
 * and zero_grad a training loop uses. A lookup of a missing parameter says what the module has,
 * and a forward that fails after one says so too. Tied parameters: one variable held by several
 * entries (a process-wide table of holders), replaced for all of them at once, listed once,
 * destroyed with its last holder. Public API only.
 */
#include <stdatomic.h>
#include <stdint.h>
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

/* ---------------------------------------------------------------------------------------------
 * holders: which modules hold each parameter, process-wide (a short spin lock guards the table,
 * so that models built on different threads do not meet in it). A variable held by more than one
 * entry (in one module or in several, in one tree or in several) is tied. Each parameter entry
 * of every live module is counted here, so a replacement finds every holder, iteration knows
 * which parameters to list once, and a parameter is destroyed with its last holder. */

typedef struct dt__holder {
  dt_var_t var;
  int n, cap;
  dt_module_t* mods; /* one per entry holding var: a module holding it under two names twice */
  struct dt__holder* next;
} dt__holder_t;

static struct {
  dt__holder_t** b; /* buckets, nb a power of two */
  size_t nb, n;
} dt__held;
static atomic_flag dt__held_flag = ATOMIC_FLAG_INIT;

static void dt__held_lock(void) {
  while (atomic_flag_test_and_set_explicit(&dt__held_flag, memory_order_acquire)) {
  }
}
static void dt__held_unlock(void) { atomic_flag_clear_explicit(&dt__held_flag, memory_order_release); }

static size_t dt__held_hash(dt_var_t v, size_t nb) {
  uint64_t x = (uint64_t)(uintptr_t)v;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x & (nb - 1);
}

/* The record of v, or NULL (lock held). */
static dt__holder_t* dt__held_find(dt_var_t v) {
  if (dt__held.nb == 0) return NULL;
  for (dt__holder_t* h = dt__held.b[dt__held_hash(v, dt__held.nb)]; h; h = h->next)
    if (h->var == v) return h;
  return NULL;
}

/* The record of v, made (empty) when there is none; NULL when out of memory (lock held). */
static dt__holder_t* dt__held_get(dt_var_t v) {
  dt__holder_t* h = dt__held_find(v);
  if (h) return h;
  if (dt__held.n + 1 > dt__held.nb) { /* load factor 1: double the buckets */
    size_t nb = dt__held.nb ? 2 * dt__held.nb : 64;
    dt__holder_t** b = calloc(nb, sizeof *b);
    if (b == NULL) return NULL;
    for (size_t i = 0; i < dt__held.nb; i++)
      for (dt__holder_t *x = dt__held.b[i], *nx; x; x = nx) {
        nx = x->next;
        size_t k = dt__held_hash(x->var, nb);
        x->next = b[k];
        b[k] = x;
      }
    free(dt__held.b);
    dt__held.b = b;
    dt__held.nb = nb;
  }
  h = calloc(1, sizeof *h);
  if (h == NULL) return NULL;
  h->var = v;
  size_t k = dt__held_hash(v, dt__held.nb);
  h->next = dt__held.b[k];
  dt__held.b[k] = h;
  dt__held.n++;
  return h;
}

/* Room for `extra` more holders in h (lock held). */
static int dt__held_reserve(dt__holder_t* h, int extra) {
  if (h->n + extra <= h->cap) return 1;
  int cap = h->cap ? h->cap : 2;
  while (cap < h->n + extra) cap *= 2;
  dt_module_t* mods = realloc(h->mods, sizeof *mods * (size_t)cap);
  if (mods == NULL) return 0;
  h->mods = mods;
  h->cap = cap;
  return 1;
}

static void dt__held_remove(dt__holder_t* h) { /* lock held */
  for (dt__holder_t** pp = &dt__held.b[dt__held_hash(h->var, dt__held.nb)]; *pp; pp = &(*pp)->next)
    if (*pp == h) {
      *pp = h->next;
      break;
    }
  dt__held.n--;
  free(h->mods);
  free(h);
}

/* Records one more entry of m holding v. */
static dt_status_t dt__hold(dt_var_t v, dt_module_t m) {
  dt__held_lock();
  dt__holder_t* h = dt__held_get(v);
  int ok = h != NULL && dt__held_reserve(h, 1);
  if (ok) h->mods[h->n++] = m;
  else if (h != NULL && h->n == 0) dt__held_remove(h);
  dt__held_unlock();
  return ok ? DT_SUCCESS : DT_FAIL(DT_ERR_OUT_OF_MEMORY, "module '%s': the holder table", m->name);
}

/* Forgets one entry of m holding v; returns how many holders v has left. */
static int dt__unhold(dt_var_t v, dt_module_t m) {
  dt__held_lock();
  dt__holder_t* h = dt__held_find(v);
  int left = 0;
  if (h != NULL) {
    for (int i = 0; i < h->n; i++)
      if (h->mods[i] == m) {
        memmove(&h->mods[i], &h->mods[i + 1], sizeof *h->mods * (size_t)(h->n - i - 1));
        h->n--;
        break;
      }
    left = h->n;
    if (left == 0) dt__held_remove(h);
  }
  dt__held_unlock();
  return left;
}

/* How many entries, in every live module, hold v. */
static int dt__holders(dt_var_t v) {
  dt__held_lock();
  dt__holder_t* h = dt__held_find(v);
  int n = h ? h->n : 0;
  dt__held_unlock();
  return n;
}

/* Every entry holding `old` holds `nw` instead (old is then held by nothing; nw keeps any holders
 * it had). A new parameter held by nothing yet (the wrappers' commits and FSDP's swaps) takes
 * over old's record: no allocation, so it cannot fail. Out of memory otherwise: nothing
 * changes. */
static dt_status_t dt__rehold(dt_var_t old, dt_var_t nw) {
  if (old == nw) return DT_SUCCESS;
  dt__held_lock();
  dt__holder_t* ho = dt__held_find(old);
  if (ho == NULL) { /* not held (cannot happen for an entry's parameter) */
    dt__held_unlock();
    return DT_SUCCESS;
  }
  if (dt__held_find(nw) == NULL) { /* the record moves to nw's bucket */
    for (dt__holder_t** pp = &dt__held.b[dt__held_hash(old, dt__held.nb)]; *pp; pp = &(*pp)->next)
      if (*pp == ho) {
        *pp = ho->next;
        break;
      }
    ho->var = nw;
    size_t k = dt__held_hash(nw, dt__held.nb);
    ho->next = dt__held.b[k];
    dt__held.b[k] = ho;
    for (int i = 0; i < ho->n; i++) {
      dt_module_t m = ho->mods[i];
      for (int j = 0; j < m->n; j++)
        if (m->entries[j].param == old) m->entries[j].param = nw;
    }
    dt__held_unlock();
    return DT_SUCCESS;
  }
  dt__holder_t* hn = dt__held_get(nw);
  ho = dt__held_find(old); /* the table may have grown (records stay where they are) */
  if (hn == NULL || !dt__held_reserve(hn, ho->n)) {
    if (hn != NULL && hn->n == 0) dt__held_remove(hn);
    dt__held_unlock();
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "replacing a parameter: the holder table");
  }
  for (int i = 0; i < ho->n; i++) {
    dt_module_t m = ho->mods[i];
    for (int k = 0; k < m->n; k++)
      if (m->entries[k].param == old) m->entries[k].param = nw;
    hn->mods[hn->n++] = m;
  }
  dt__held_remove(ho);
  dt__held_unlock();
  return DT_SUCCESS;
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

static dt_status_t dt__module_create(const char* name, dt_module_forward_fn forward, void* ctx,
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

dt_status_t dt_module_create(const char* name, dt_module_forward_fn forward, void* ctx,
                             dt_module_t* out) {
  DT_ENTRY_RETURN(dt__module_create(name, forward, ctx, out));
}

/* Frees m and what it owns (parameters a caller destroyed already are skipped). */
static void dt__module_free(dt_module_t m) {
  for (int i = m->n_att - 1; i >= 0; i--) /* wrappers first: they may put parameters back */
    if (m->att[i].free_fn) m->att[i].free_fn(m, m->att[i].data);
  m->n_att = 0;
  for (int i = 0; i < m->n; i++) { /* a tied parameter goes with its last holder */
    if (m->entries[i].param && dt__unhold(m->entries[i].param, m) == 0)
      dt_var_destroy(m->entries[i].param);
    if (m->entries[i].child) dt__module_free(m->entries[i].child);
  }
  free(m->entries);
  free(m->plist);
  dt_handle_unregister(m, &dt__module_kind, "module");
  dt_handle_free(m);
}

static dt_status_t dt__module_destroy(dt_module_t m) {
  if (m == NULL) return DT_SUCCESS;
  DT_CHECK(dt__module_check(m));
  if (m->parent != NULL)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "module '%s' is a child of '%s': destroying the root "
                   "destroys it", m->name, m->parent->name);
  dt__module_free(m);
  return DT_SUCCESS;
}

dt_status_t dt_module_destroy(dt_module_t m) { DT_ENTRY_RETURN(dt__module_destroy(m)); }

const char* dt_module_name(dt_module_t m) {
  return dt__module_check(m) == DT_SUCCESS ? m->name : NULL;
}
void* dt_module_ctx(dt_module_t m) { return dt__module_check(m) == DT_SUCCESS ? m->ctx : NULL; }

static dt_status_t dt__module_set_forward(dt_module_t m, dt_module_forward_fn forward,
                                          dt_module_forward_fn* old) {
  DT_CHECK(dt__module_check(m));
  if (old) *old = m->forward;
  m->forward = forward;
  return DT_SUCCESS;
}

dt_status_t dt_module_set_forward(dt_module_t m, dt_module_forward_fn forward,
                                  dt_module_forward_fn* old) {
  DT_ENTRY_RETURN(dt__module_set_forward(m, forward, old));
}

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

/* A module's parameter is a live leaf: a tape's variable (an op's result, a tape constant) dies
 * with dt_tape_reset, and the module would list a dead handle. */
static dt_status_t dt__param_check(dt_var_t param, const char* what, const char* name) {
  int leaf = 0;
  if (dt_var_is_leaf(param, &leaf) != DT_SUCCESS || dt_var_value(param) == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s '%s' is not a live variable", what, name);
  if (!leaf)
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s '%s' is not a leaf (dt_var_leaf): an op's result "
                   "or a tape constant is freed by dt_tape_reset", what, name);
  return DT_SUCCESS;
}

static dt_status_t dt__add_param(dt_module_t m, const char* name, dt_var_t param) {
  DT_CHECK(dt__module_check(m));
  DT_CHECK(dt__name_check(name, "parameter"));
  DT_ARG_NOT_NULL(param);
  DT_CHECK(dt__param_check(param, "parameter", name));
  DT_CHECK(dt__hold(param, m));
  dt_status_t st = dt__add(m, name, param, NULL);
  if (st != DT_SUCCESS) dt__unhold(param, m); /* the caller keeps it (or its other holders do) */
  return st;
}

dt_status_t dt_module_add_param(dt_module_t m, const char* name, dt_var_t param) {
  DT_ENTRY_RETURN(dt__add_param(m, name, param));
}

static dt_status_t dt__module_add_child(dt_module_t m, dt_module_t child) {
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

dt_status_t dt_module_add_child(dt_module_t m, dt_module_t child) {
  DT_ENTRY_RETURN(dt__module_add_child(m, child));
}

/* The entry holding the parameter at `path` below m (unnamed children are looked through), and
 * in *owner (may be NULL) the module whose entry it is. */
static dt__entry_t* dt__find_param_in(dt_module_t m, const char* path, dt_module_t* owner) {
  for (int i = 0; i < m->n; i++) {
    dt__entry_t* e = &m->entries[i];
    size_t len = strlen(e->name);
    if (e->param) {
      if (strcmp(e->name, path) == 0) {
        if (owner) *owner = m;
        return e;
      }
      continue;
    }
    if (len == 0) { /* unnamed child: its parameters keep the path */
      dt__entry_t* r = dt__find_param_in(e->child, path, owner);
      if (r) return r;
    } else if (strncmp(path, e->name, len) == 0 && (path[len] == '.' || path[len] == '\0')) {
      dt__entry_t* r = dt__find_param_in(e->child, path[len] ? path + len + 1 : "", owner);
      if (r) return r;
    }
  }
  return NULL;
}

static dt__entry_t* dt__find_param(dt_module_t m, const char* path) {
  return dt__find_param_in(m, path, NULL);
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
static _Thread_local char dt__miss_msg[1024];
static _Thread_local unsigned long dt__misses;
static _Thread_local int dt__miss_open;

static dt_status_t dt__module_param(dt_module_t m, const char* name, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(name);
  dt__entry_t* e = dt__find_param(m, name);
  if (e == NULL) return dt__no_param(__func__, m, name);
  *out = e->param;
  return DT_SUCCESS;
}

dt_status_t dt_module_param(dt_module_t m, const char* name, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__module_param(m, name, out));
}

dt_var_t dt_module_get(dt_module_t m, const char* name) {
  dt_status_t st = dt__module_check(m);
  if (st == DT_SUCCESS && name == NULL) st = DT_FAIL(DT_ERR_INVALID_ARG, "name is NULL");
  dt__entry_t* e = st == DT_SUCCESS ? dt__find_param(m, name) : NULL;
  if (e != NULL) return e->param;
  if (st == DT_SUCCESS) {
    char names[320];
    dt__param_names(m, names, sizeof names);
    /* named after this call, not the entry open around it (the forward calling it) */
    snprintf(dt__miss_msg, sizeof dt__miss_msg, "dt_module_get(\"%s\"): module '%s' has no "
             "parameter '%s' (it has: %s)", name, m->name, name, names);
    dt__no_param(__func__, m, name);
  } else {
    snprintf(dt__miss_msg, sizeof dt__miss_msg, "dt_module_get: %s", dt_last_error());
  }
  dt__misses++;
  dt__miss_open = 1;
  return NULL;
}

static dt_status_t dt__swap_param(dt_module_t m, const char* name, dt_var_t param,
                                  dt_var_t* old) {
  DT_ARG_NOT_NULL(old);
  *old = NULL;
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(name);
  DT_ARG_NOT_NULL(param);
  DT_CHECK(dt__param_check(param, "the new parameter", name));
  dt__entry_t* e = dt__find_param(m, name);
  if (e == NULL) return dt__no_param(__func__, m, name);
  dt_var_t prev = e->param;
  DT_CHECK(dt__rehold(prev, param)); /* every holder of a tied parameter: it stays tied */
  *old = prev;
  return DT_SUCCESS;
}

dt_status_t dt_module_swap_param(dt_module_t m, const char* name, dt_var_t param,
                                 dt_var_t* old) {
  DT_ENTRY_RETURN(dt__swap_param(m, name, param, old));
}

static dt_status_t dt__set_param(dt_module_t m, const char* name, dt_var_t param) {
  dt_var_t old;
  DT_CHECK(dt__swap_param(m, name, param, &old));
  if (old != param) dt_var_destroy(old); /* held by nothing now */
  return DT_SUCCESS;
}

dt_status_t dt_module_set_param(dt_module_t m, const char* name, dt_var_t param) {
  DT_ENTRY_RETURN(dt__set_param(m, name, param));
}

dt_module_t dt_module_parent(dt_module_t m) {
  return dt__module_check(m) == DT_SUCCESS ? m->parent : NULL;
}

static dt__attachment_t* dt__find_att(dt_module_t m, const char* key) {
  for (int i = 0; i < m->n_att; i++)
    if (strcmp(m->att[i].key, key) == 0) return &m->att[i];
  return NULL;
}

static dt_status_t dt__module_attach(dt_module_t m, const char* key, void* data,
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

dt_status_t dt_module_attach(dt_module_t m, const char* key, void* data,
                             dt_module_free_fn free_fn) {
  DT_ENTRY_RETURN(dt__module_attach(m, key, data, free_fn));
}

void* dt_module_attachment(dt_module_t m, const char* key) {
  if (dt__module_check(m) != DT_SUCCESS || key == NULL) return NULL;
  dt__attachment_t* a = dt__find_att(m, key);
  return a ? a->data : NULL;
}

static dt_status_t dt__module_detach(dt_module_t m, const char* key) {
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(key);
  dt__attachment_t* a = dt__find_att(m, key);
  if (a == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has no attachment '%s'", m->name, key);
  *a = m->att[--m->n_att];
  return DT_SUCCESS;
}

dt_status_t dt_module_detach(dt_module_t m, const char* key) {
  DT_ENTRY_RETURN(dt__module_detach(m, key));
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

static dt_status_t dt__module_find(dt_module_t m, const char* path, dt_module_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(path);
  *out = dt__find_module(m, path);
  if (*out == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has no module at '%s'", m->name, path);
  return DT_SUCCESS;
}

dt_status_t dt_module_find(dt_module_t m, const char* path, dt_module_t* out) {
  DT_ENTRY_RETURN(dt__module_find(m, path, out));
}

static dt_status_t dt__module_num_children(dt_module_t m, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  DT_CHECK(dt__module_check(m));
  for (int i = 0; i < m->n; i++) *n += m->entries[i].child != NULL;
  return DT_SUCCESS;
}

dt_status_t dt_module_num_children(dt_module_t m, int* n) {
  DT_ENTRY_RETURN(dt__module_num_children(m, n));
}

static dt_status_t dt__module_child(dt_module_t m, int i, dt_module_t* out) {
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

dt_status_t dt_module_child(dt_module_t m, int i, dt_module_t* out) {
  DT_ENTRY_RETURN(dt__module_child(m, i, out));
}

/* The tied parameters a walk has listed already (it lists each once, under its first name). */
typedef struct {
  dt_var_t* v;
  int n, cap;
  int oom;
} dt__seen_t;

/* Whether the walk lists p: always without `seen` (every name), else on its first name only. */
static int dt__first_sight(dt__seen_t* seen, dt_var_t p) {
  if (seen == NULL || dt__holders(p) < 2) return 1; /* an untied parameter has one name */
  for (int i = 0; i < seen->n; i++)
    if (seen->v[i] == p) return 0;
  if (seen->n == seen->cap) {
    int cap = seen->cap ? 2 * seen->cap : 8;
    dt_var_t* v = realloc(seen->v, sizeof *v * (size_t)cap);
    if (v == NULL) {
      seen->oom = 1;
      return 0;
    }
    seen->v = v;
    seen->cap = cap;
  }
  seen->v[seen->n++] = p;
  return 1;
}

/* Depth-first over the parameters with their qualified names (prefix holds the path so far);
 * with `seen`, a tied parameter is visited once (its first name), without it once per name. A
 * path longer than the buffer (a tree nested deeper than DT__PATH_MAX allows) stops the walk
 * with *too_long set when too_long is given (two parameters would share a truncated name),
 * and is truncated otherwise (names for messages). */
static int dt__walk(dt_module_t m, char* prefix, size_t len, size_t cap, dt__seen_t* seen,
                    int* too_long, dt_module_visit_fn visit, void* ctx) {
  for (int i = 0; i < m->n; i++) {
    dt__entry_t* e = &m->entries[i];
    size_t add = 0;
    if (e->name[0]) {
      int w = snprintf(prefix + len, cap - len, "%s%s", len ? "." : "", e->name);
      add = w > 0 ? (size_t)w : 0;
      if (len + add >= cap) {
        if (too_long != NULL) {
          *too_long = 1;
          prefix[len] = '\0';
          return 1;
        }
        add = cap - 1 - len; /* truncated */
      }
    }
    int stop = 0;
    if (e->param) {
      if (dt__first_sight(seen, e->param)) stop = visit(prefix, e->param, ctx);
      else if (seen->oom) stop = 1;
    } else {
      stop = dt__walk(e->child, prefix, len + add, cap, seen, too_long, visit, ctx);
    }
    prefix[len] = '\0';
    if (stop) return stop;
  }
  return 0;
}

#define DT__PATH_MAX 1024

/* The walk from m: unique parameters (unique 1) or every name. */
static dt_status_t dt__visit(dt_module_t m, int unique, dt_module_visit_fn visit, void* ctx) {
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(visit);
  char prefix[DT__PATH_MAX] = "";
  dt__seen_t seen = {NULL, 0, 0, 0};
  int too_long = 0;
  dt__walk(m, prefix, 0, sizeof prefix, unique ? &seen : NULL, &too_long, visit, ctx);
  free(seen.v);
  if (seen.oom)
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "module '%s': the list of tied parameters", m->name);
  if (too_long)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s': a parameter's qualified name is longer "
                   "than %d characters (modules nested too deep: names cut short would collide)",
                   m->name, DT__PATH_MAX - 1);
  return DT_SUCCESS;
}

dt_status_t dt_module_for_each_param(dt_module_t m, dt_module_visit_fn visit, void* ctx) {
  DT_ENTRY_RETURN(dt__visit(m, 1, visit, ctx));
}

dt_status_t dt_module_for_each_param_name(dt_module_t m, dt_module_visit_fn visit, void* ctx) {
  DT_ENTRY_RETURN(dt__visit(m, 0, visit, ctx));
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

static dt_status_t dt__num_params(dt_module_t m, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  dt__at_t a = {0, 0, NULL, 0, NULL};
  DT_CHECK(dt__visit(m, 1, dt__count, &a));
  *n = a.seen;
  return DT_SUCCESS;
}

dt_status_t dt_module_num_params(dt_module_t m, int* n) { DT_ENTRY_RETURN(dt__num_params(m, n)); }

static dt_status_t dt__param_at(dt_module_t m, int i, char* name, size_t cap, dt_var_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  dt__at_t a = {i, 0, name, cap, NULL};
  DT_CHECK(dt__visit(m, 1, dt__pick, &a));
  if (a.found == NULL)
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' has %d parameters, not %d", m->name, a.seen,
                   i + 1);
  *out = a.found;
  return DT_SUCCESS;
}

dt_status_t dt_module_param_at(dt_module_t m, int i, char* name, size_t cap, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__param_at(m, i, name, cap, out));
}

/* ---------------------------------------------------------------------------------------------
 * tied parameters: names, holders, dt_module_tie */

typedef struct {
  dt_var_t param;
  int want, n;
  char* name;
  size_t cap;
} dt__alias_t;

static int dt__alias(const char* name, dt_var_t p, void* ctx) {
  dt__alias_t* a = ctx;
  if (p != a->param) return 0;
  if (a->n++ == a->want && a->name && a->cap) snprintf(a->name, a->cap, "%s", name);
  return 0;
}

static dt_status_t dt__param_names_of(dt_module_t m, dt_var_t param, int k, char* name,
                                      size_t cap, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  if (name && cap) name[0] = '\0';
  DT_ARG_NOT_NULL(param);
  dt__alias_t a = {param, k, 0, name, cap};
  DT_CHECK(dt__visit(m, 0, dt__alias, &a));
  *n = a.n;
  if (k < 0 || (k >= a.n && a.n > 0) || (a.n == 0 && k != 0))
    return DT_FAIL(DT_ERR_INVALID_ARG, "module '%s' holds the parameter under %d names, not %d",
                   m->name, a.n, k + 1);
  return DT_SUCCESS;
}

dt_status_t dt_module_param_names(dt_module_t m, dt_var_t param, int k, char* name, size_t cap,
                                  int* n) {
  DT_ENTRY_RETURN(dt__param_names_of(m, param, k, name, cap, n));
}

static dt_status_t dt__param_holders(dt_var_t param, int* n) {
  DT_ARG_NOT_NULL(n);
  *n = 0;
  DT_ARG_NOT_NULL(param);
  int rg;
  DT_CHECK(dt_var_requires_grad(param, &rg)); /* a live variable */
  *n = dt__holders(param);
  return DT_SUCCESS;
}

dt_status_t dt_module_param_holders(dt_var_t param, int* n) {
  DT_ENTRY_RETURN(dt__param_holders(param, n));
}

/* The module's path from its tree's root, for messages: "layers.0.wq", "(the root)". */
static void dt__module_path(dt_module_t m, char* buf, size_t cap) {
  const char* names[64];
  int n = 0;
  for (dt_module_t x = m; x && x->parent && n < 64; x = x->parent)
    if (x->name[0]) names[n++] = x->name;
  size_t w = 0;
  buf[0] = '\0';
  if (n == 0) {
    snprintf(buf, cap, "%s", m->parent == NULL && m->name[0] ? m->name : "(the root)");
    return;
  }
  for (int i = n - 1; i >= 0 && w < cap; i--)
    w += (size_t)snprintf(buf + w, cap - w, "%s%s", names[i], i ? "." : "");
}

/* The wrapper ("fsdp" or "ddp") on m or a module above it, or NULL: those keep the parameters
 * they wrapped (sharded views, gradient hooks), which a tie would change behind their back. */
static const char* dt__wrapped_above(dt_module_t m) {
  static const char* const keys[2] = {"fsdp", "ddp"};
  for (dt_module_t x = m; x; x = x->parent)
    for (int k = 0; k < 2; k++)
      if (dt__find_att(x, keys[k])) return keys[k];
  return NULL;
}

static dt_status_t dt__tie(dt_module_t m, const char* name, const char* target) {
  DT_CHECK(dt__module_check(m));
  DT_ARG_NOT_NULL(name);
  DT_ARG_NOT_NULL(target);
  dt_module_t om = NULL, tm = NULL;
  dt__entry_t* e = dt__find_param_in(m, name, &om);
  if (e == NULL) return dt__no_param(__func__, m, name);
  dt__entry_t* t = dt__find_param_in(m, target, &tm);
  if (t == NULL) return dt__no_param(__func__, m, target);
  dt_var_t v = e->param, tv = t->param;
  if (v == tv) return DT_SUCCESS; /* tied already */
  char op[DT__PATH_MAX], tp[DT__PATH_MAX];
  dt__module_path(om, op, sizeof op);
  dt__module_path(tm, tp, sizeof tp);
  const char* w = dt__wrapped_above(om);
  if (w == NULL) w = dt__wrapped_above(tm);
  if (w != NULL)
    return DT_FAIL(DT_ERR_INVALID_USAGE, "cannot tie '%s' (module '%s') to '%s' (module '%s'): "
                   "one of them is wrapped by %s already; tie before wrapping (FSDP and DDP "
                   "keep the parameters they wrapped)", name, op, target, tp,
                   !strcmp(w, "fsdp") ? "FSDP" : "DDP");
  /* one variable has one layout: both must agree on it */
  dt_tensor_t a = dt_var_value(v), b = dt_var_value(tv);
  dt_mesh_t ma, mb;
  dt_dtype_t da, db;
  int na, nb, mnd, rga, rgb;
  int64_t sa[DT_MAX_DIMS], sb[DT_MAX_DIMS];
  dt_placement_t pa[DT_MAX_MESH_DIMS], pb[DT_MAX_MESH_DIMS];
  DT_CHECK(dt_tensor_mesh(a, &ma));
  DT_CHECK(dt_tensor_mesh(b, &mb));
  DT_CHECK(dt_tensor_dtype(a, &da));
  DT_CHECK(dt_tensor_dtype(b, &db));
  DT_CHECK(dt_tensor_ndim(a, &na));
  DT_CHECK(dt_tensor_ndim(b, &nb));
  DT_CHECK(dt_tensor_shape(a, sa));
  DT_CHECK(dt_tensor_shape(b, sb));
  DT_CHECK(dt_var_requires_grad(v, &rga));
  DT_CHECK(dt_var_requires_grad(tv, &rgb));
  char ta[160], tb[160];
  int same_shape = na == nb;
  for (int d = 0; same_shape && d < na; d++) same_shape = sa[d] == sb[d];
  if (!same_shape || da != db) {
    int wa = snprintf(ta, sizeof ta, "(");
    for (int d = 0; d < na && wa < (int)sizeof ta; d++)
      wa += snprintf(ta + wa, sizeof ta - (size_t)wa, "%s%lld", d ? ", " : "", (long long)sa[d]);
    int wb = snprintf(tb, sizeof tb, "(");
    for (int d = 0; d < nb && wb < (int)sizeof tb; d++)
      wb += snprintf(tb + wb, sizeof tb - (size_t)wb, "%s%lld", d ? ", " : "", (long long)sb[d]);
    return DT_FAIL(DT_ERR_INVALID_ARG, "cannot tie '%s' (module '%s'), %s) %s, to '%s' (module "
                   "'%s'), %s) %s: a tied parameter has one shape and dtype", name, op, ta,
                   dt_dtype_name(da), target, tp, tb, dt_dtype_name(db));
  }
  if (ma != mb)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cannot tie '%s' (module '%s') to '%s' (module '%s'): "
                   "they live on different meshes; a tied parameter has one mesh", name, op,
                   target, tp);
  DT_CHECK(dt_mesh_ndim(ma, &mnd));
  DT_CHECK(dt_tensor_placements(a, pa));
  DT_CHECK(dt_tensor_placements(b, pb));
  int same_pl = 1;
  for (int d = 0; d < mnd; d++) same_pl &= dt_placement_equal(pa[d], pb[d]);
  if (!same_pl) {
    dt_placements_format(pa, mnd, ",", ta, sizeof ta);
    dt_placements_format(pb, mnd, ",", tb, sizeof tb);
    return DT_FAIL(DT_ERR_INVALID_ARG, "cannot tie '%s' (module '%s'), placed %s, to '%s' "
                   "(module '%s'), placed %s: a tied parameter has one placement (place both "
                   "alike first)", name, op, ta, target, tp, tb);
  }
  if (rga != rgb)
    return DT_FAIL(DT_ERR_INVALID_ARG, "cannot tie '%s' (module '%s') to '%s' (module '%s'): "
                   "one requires a gradient and the other does not", name, op, target, tp);
  DT_CHECK(dt__rehold(v, tv)); /* every holder of v, and of anything tied to it already */
  dt_var_destroy(v);
  return DT_SUCCESS;
}

dt_status_t dt_module_tie(dt_module_t m, const char* name, const char* target) {
  DT_ENTRY_RETURN(dt__tie(m, name, target));
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

/* Every name below m (a tied parameter under each of its names). */
static void dt__param_names(dt_module_t m, char* buf, size_t cap) {
  dt__names_t a = {buf, cap, 0, 0, 0};
  buf[0] = '\0';
  char prefix[DT__PATH_MAX] = "";
  dt__walk(m, prefix, 0, sizeof prefix, NULL, NULL, dt__name_add, &a);
  if (a.n == 0) snprintf(buf, cap, "no parameters");
  else if (a.shown < a.n)
    snprintf(buf + a.len, cap - a.len, ", ... (%d in all)", a.n);
}

typedef struct {
  dt_var_t* list;
  int n, cap;
} dt__collect_t;

static int dt__collect(const char* name, dt_var_t p, void* ctx) {
  (void)name;
  dt__collect_t* c = ctx;
  if (c->n == c->cap) return 1; /* counted beforehand: cannot happen */
  c->list[c->n++] = p;
  return 0;
}

static dt_status_t dt__params(dt_module_t m, dt_var_t** params, int* n) {
  DT_ARG_NOT_NULL(params);
  DT_ARG_NOT_NULL(n);
  *params = NULL;
  *n = 0;
  int count;
  DT_CHECK(dt__num_params(m, &count));
  dt_var_t* list = malloc(sizeof(dt_var_t) * (size_t)(count ? count : 1));
  if (list == NULL) return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "module '%s': %d parameters", m->name,
                                   count);
  dt__collect_t c = {list, 0, count};
  dt_status_t st = dt__visit(m, 1, dt__collect, &c);
  if (st != DT_SUCCESS) {
    free(list);
    return st;
  }
  free(m->plist);
  m->plist = list;
  *params = list;
  *n = c.n;
  return DT_SUCCESS;
}

dt_status_t dt_module_params(dt_module_t m, dt_var_t** params, int* n) {
  DT_ENTRY_RETURN(dt__params(m, params, n));
}

static int dt__zero(const char* name, dt_var_t p, void* ctx) {
  (void)name;
  dt_status_t* st = ctx;
  *st = dt_var_zero_grad(p);
  return *st != DT_SUCCESS;
}

static dt_status_t dt__module_zero_grad(dt_module_t m) {
  dt_status_t st = DT_SUCCESS;
  DT_CHECK(dt_module_for_each_param(m, dt__zero, &st));
  if (st != DT_SUCCESS) return DT_FAIL(st, "module '%s': %s", m->name, dt_last_error());
  return DT_SUCCESS;
}

dt_status_t dt_module_zero_grad(dt_module_t m) { DT_ENTRY_RETURN(dt__module_zero_grad(m)); }

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

static dt_status_t dt__module_add_forward_pre_hook(dt_module_t m, dt_module_forward_hook_fn fn,
                                                   void* ctx) {
  return dt__add_hook(m, DT__FPRE, (void*)fn, ctx);
}

dt_status_t dt_module_add_forward_pre_hook(dt_module_t m, dt_module_forward_hook_fn fn, void* ctx) {
  DT_ENTRY_RETURN(dt__module_add_forward_pre_hook(m, fn, ctx));
}
static dt_status_t dt__module_add_forward_post_hook(dt_module_t m, dt_module_forward_hook_fn fn,
                                                    void* ctx) {
  return dt__add_hook(m, DT__FPOST, (void*)fn, ctx);
}

dt_status_t dt_module_add_forward_post_hook(dt_module_t m, dt_module_forward_hook_fn fn,
                                            void* ctx) {
  DT_ENTRY_RETURN(dt__module_add_forward_post_hook(m, fn, ctx));
}
static dt_status_t dt__module_add_backward_pre_hook(dt_module_t m, dt_module_backward_hook_fn fn,
                                                    void* ctx) {
  return dt__add_hook(m, DT__BPRE, (void*)fn, ctx);
}

dt_status_t dt_module_add_backward_pre_hook(dt_module_t m, dt_module_backward_hook_fn fn,
                                            void* ctx) {
  DT_ENTRY_RETURN(dt__module_add_backward_pre_hook(m, fn, ctx));
}
static dt_status_t dt__module_add_backward_post_hook(dt_module_t m, dt_module_backward_hook_fn fn,
                                                     void* ctx) {
  return dt__add_hook(m, DT__BPOST, (void*)fn, ctx);
}

dt_status_t dt_module_add_backward_post_hook(dt_module_t m, dt_module_backward_hook_fn fn,
                                             void* ctx) {
  DT_ENTRY_RETURN(dt__module_add_backward_post_hook(m, fn, ctx));
}

static dt_status_t dt__module_remove_hooks(dt_module_t m, void* ctx) {
  DT_CHECK(dt__module_check(m));
  for (int k = 0; k < DT__HOOK_KINDS; k++) {
    int w = 0;
    for (int i = 0; i < m->n_hooks[k]; i++)
      if (m->hooks[k][i].ctx != ctx) m->hooks[k][w++] = m->hooks[k][i];
    m->n_hooks[k] = w;
  }
  return DT_SUCCESS;
}

dt_status_t dt_module_remove_hooks(dt_module_t m, void* ctx) {
  DT_ENTRY_RETURN(dt__module_remove_hooks(m, ctx));
}

static dt_status_t dt__backward_hooks(dt_module_t m, dt_tape_t tape, int kind) {
  for (int i = 0; i < m->n_hooks[kind]; i++) {
    dt_module_backward_hook_fn fn = (dt_module_backward_hook_fn)m->hooks[kind][i].fn;
    DT_CHECK(fn(m, tape, m->hooks[kind][i].ctx));
  }
  return DT_SUCCESS;
}
/* A module destroyed between its forward and the backward pass (against the rule above) is
 * refused by the registry, which never reads it: its hooks' contexts (a wrapper's state) are
 * gone. */
static dt_status_t dt__span_module(void* ctx) {
  if (dt_handle_is_live(ctx, &dt__module_kind)) return DT_SUCCESS;
  return DT_FAIL(DT_ERR_INVALID_USAGE, "a module recorded on this tape was destroyed before the "
                 "backward pass reached it (a module must outlive the tapes that recorded it: "
                 "reset the tape first)");
}
static dt_status_t dt__span_pre(dt_tape_t tape, void* ctx) {
  DT_CHECK(dt__span_module(ctx));
  return dt__backward_hooks((dt_module_t)ctx, tape, DT__BPRE);
}
static dt_status_t dt__span_post(dt_tape_t tape, void* ctx) {
  DT_CHECK(dt__span_module(ctx));
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

/* A message without the "dt_entry: " that its public entry point put in front. */
static const char* dt__no_entry(const char* msg) {
  if (strncmp(msg, "dt_", 3) != 0) return msg;
  size_t k = strspn(msg, "abcdefghijklmnopqrstuvwxyz0123456789_");
  return strncmp(msg + k, ": ", 2) == 0 ? msg + k + 2 : msg;
}

static dt_status_t dt__module_forward(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
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
  dt_status_t st = tape ? dt_tape_stats(tape, &first, NULL) : DT_SUCCESS;
  unsigned long misses = dt__misses;
  if (st == DT_SUCCESS) st = m->forward(m, tape, n_in, args, n_out, out);
  if (dt__misses != misses && dt__miss_open) { /* a lookup during this forward found nothing */
    dt__miss_open = 0; /* reported now (once, not again by the enclosing forwards), or survived */
    if (st != DT_SUCCESS) /* most likely on the NULL: say both, the lookup first */
      st = DT_FAIL(st, "module '%s': the forward failed after %s; the failure: %s", m->name,
                   dt__miss_msg, dt_last_error());
  }
  if (st == DT_SUCCESS && tape && (m->n_hooks[DT__BPRE] || m->n_hooks[DT__BPOST])) {
    st = dt_tape_stats(tape, &end, NULL);
    if (st == DT_SUCCESS && end > first)
      st = dt_tape_add_span_hooks(tape, first, end, m->n_hooks[DT__BPRE] ? dt__span_pre : NULL,
                                  m->n_hooks[DT__BPOST] ? dt__span_post : NULL, m);
  }
  if (st == DT_SUCCESS) return dt__forward_hooks(m, tape, DT__FPOST, n_out, out);
  /* failed after the pre hooks: the post hooks still run, with no outputs, so that what a pre
   * hook put in place (a wrapper's gathered parameters) is put back; the failure's message
   * stands */
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", dt_last_error());
  for (int o = 0; o < n_out; o++) out[o] = NULL;
  dt_status_t pst = dt__forward_hooks(m, tape, DT__FPOST, 0, NULL);
  if (pst == DT_SUCCESS && strcmp(dt_last_error(), msg) == 0) return st; /* message untouched */
  /* re-recorded under the same entry: quote the texts without their "entry: " prefix */
  char hook[1024];
  snprintf(hook, sizeof hook, "%s", dt_last_error());
  if (pst != DT_SUCCESS)
    return DT_FAIL(st, "%s; then a post hook failed too: %s", dt__no_entry(msg),
                   dt__no_entry(hook));
  return DT_FAIL(st, "%s", dt__no_entry(msg));
}

dt_status_t dt_module_forward(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                              int n_out, dt_var_t* out) {
  DT_ENTRY_RETURN(dt__module_forward(m, tape, n_in, in, n_out, out));
}
