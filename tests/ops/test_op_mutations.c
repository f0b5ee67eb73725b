/* test_op_mutations.c - every op's valid call, mutated into unusual or bad input.
 *
 * For each op of the table, the valid call of op_specs.h is mutated DT_MUT_ITERS times (default
 * 40; a fixed seed, DT_MUT_SEED to change it) by one to three of: a dim of an input set to 0, 1,
 * one less, one more or twice; a dim dropped or added; an input's dtype changed (f32, bf16, i32,
 * i64); an input sharded on one of its dims, replicated or partial (sum, max) on one mesh dim
 * (a 1-d mesh, or 2 x world/2 at 4 ranks and more); an integer argument set to an extreme
 * (negative, 0, 2^20, INT64_MIN/MAX); a scalar argument set to NaN,
 * an infinity, a negative or a huge value; an input dropped, added (a second handle to the first
 * input), replaced by another input (aliasing) or by NULL; extra or negative argument counts.
 * Every rank makes the same mutations. What must hold, for every call:
 *   - no crash, nothing the sanitizers see, no hang (ctest's timeout);
 *   - every rank returns the same status (a rank that failed alone would leave the others in the
 *     next collective);
 *   - a failure has a message that starts with the entry point called and names no internal
 *     function ("dt__");
 *   - a success gives outputs whose shape and local values can be read; an op with a backward
 *     rule is then recorded on a tape the same way and, when its first output is a float,
 *     differentiated (backward from its sum), every stage's status agreed and explained;
 *   - nothing leaks: run three times, with its inputs and outputs destroyed each time, the call
 *     holds no more memory after the third run than after the second (dt_memory_stats; ASan's leak
 *     check at exit sees the rest);
 *   - the library still works: the op's valid call gives the same status after its mutations as
 *     before (success, except for the rows that need a world size of 1, 2 or 4).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dt_test.h"

#include "op_specs.h"

static int g_world, g_mesh_ndim; /* a 1-d mesh, 2 x (world / 2) at 4 ranks or more */
static uint64_t g_rng;

static uint64_t rnd(void) { /* xorshift64*: the same sequence on every rank */
  g_rng ^= g_rng >> 12;
  g_rng ^= g_rng << 25;
  g_rng ^= g_rng >> 27;
  return g_rng * 2685821657736338717ull;
}
static int rndn(int n) { return n > 0 ? (int)(rnd() % (uint64_t)n) : 0; }

typedef struct {
  spec_t sp;
  dt_placement_t pl[DT_OP_MAX_INPUTS][DT_MAX_MESH_DIMS];
  int n_in;       /* may differ from sp.n_in */
  int alias[DT_OP_MAX_INPUTS]; /* >= 0: this input is a second handle to input alias[t] */
  int null_in;    /* >= 0: this input is NULL */
  int ni, nf;
  int64_t iv[DT_OP_MAX_IARGS];
  double fv[DT_OP_MAX_FARGS];
  char what[256]; /* the mutations, for a failure's message */
} call_t;

static void note(call_t* c, const char* fmt, long long a, long long b) {
  size_t len = strlen(c->what);
  snprintf(c->what + len, sizeof c->what - len, fmt, a, b);
}

static int64_t numel_of(const in_t* s) {
  int64_t shape[4];
  static int64_t buf[SPEC_MAX_NUMEL];
  return spec_data(s, 0, g_world, shape, buf);
}

/* One mutation of c; 0 when it did not apply (the caller draws another). */
static int mutate(call_t* c) {
  const int kind = rndn(10);
  const int t = rndn(c->sp.n_in);
  in_t* s = &c->sp.in[t];
  switch (kind) {
    case 0: { /* a dim's size */
      if (s->ndim == 0) return 0;
      const int d = rndn(s->ndim);
      const int64_t old = s->shape[d], choice[5] = {0, 1, old - 1, old + 1, old * 2};
      const int64_t v = choice[rndn(5)];
      s->shape[d] = v < 0 ? 0 : v;
      if (numel_of(s) < 0) {
        s->shape[d] = old;
        return 0;
      }
      note(c, " in%lld.shape[%lld] changed;", t, d);
      return 1;
    }
    case 1: /* a dim dropped or added */
      if (rndn(2) && s->ndim > 0) {
        s->ndim--;
        note(c, " in%lld lost a dim (ndim %lld);", t, s->ndim);
      } else {
        if (s->ndim >= 4) return 0;
        s->shape[s->ndim++] = 1 + rndn(2);
        if (numel_of(s) < 0) {
          s->ndim--;
          return 0;
        }
        note(c, " in%lld gained a dim (ndim %lld);", t, s->ndim);
      }
      return 1;
    case 2: { /* the dtype */
      static const dt_dtype_t dts[4] = {DT_F32, DT_BF16, DT_I32, DT_I64};
      s->dtype = dts[rndn(4)];
      note(c, " in%lld dtype %lld;", t, (long long)s->dtype);
      return 1;
    }
    case 3: { /* the placement on one mesh dim */
      const int k = rndn(4), md = rndn(g_mesh_ndim);
      dt_placement_t* p = &c->pl[t][md];
      if (k == 0 && s->ndim > 0) *p = dt_shard(rndn(s->ndim));
      else if (k == 1) *p = dt_partial(DT_REDUCE_SUM);
      else if (k == 2) *p = dt_partial(DT_REDUCE_MAX);
      else *p = dt_replicate();
      note(c, " in%lld placement kind %lld", t, k);
      note(c, " on mesh dim %lld;", md, 0);
      return 1;
    }
    case 4: { /* an integer argument */
      if (c->ni <= 0) return 0;
      static const int64_t vals[11] = {-2, -1, 0, 1, 2, 3, 7, 1000, INT64_MAX, INT64_MIN,
                                       1 << 20}; /* not 2^31: a 32 GiB output, refused by ASan */
      const int k = rndn(c->ni), v = rndn(11);
      c->iv[k] = vals[v];
      note(c, " iarg %lld = %lld;", k, (long long)vals[v]);
      return 1;
    }
    case 5: { /* a scalar argument */
      if (c->nf <= 0) return 0;
      const double vals[7] = {NAN, INFINITY, -INFINITY, -1.0, 0.0, 1e300, 0.5};
      const int k = rndn(c->nf), v = rndn(7);
      c->fv[k] = vals[v];
      note(c, " farg %lld = choice %lld;", k, v);
      return 1;
    }
    case 6: /* an input fewer or more */
      if (rndn(2) && c->n_in > 0) {
        c->n_in--;
        note(c, " %lld inputs;", c->n_in, 0);
      } else {
        if (c->n_in >= DT_OP_MAX_INPUTS || c->n_in != c->sp.n_in) return 0;
        c->alias[c->n_in++] = 0;
        note(c, " %lld inputs (the last one input 0 again);", c->n_in, 0);
      }
      return 1;
    case 7: { /* aliasing: an input is another's handle */
      if (c->sp.n_in < 2) return 0;
      const int a = rndn(c->sp.n_in), b = rndn(c->sp.n_in);
      if (a == b) return 0;
      c->alias[a] = b;
      note(c, " in%lld is in%lld;", a, b);
      return 1;
    }
    case 8: /* a NULL input */
      c->null_in = t;
      note(c, " in%lld NULL;", t, 0);
      return 1;
    default: /* the argument counts */
      if (rndn(2)) {
        const int add = 1 + rndn(DT_OP_MAX_IARGS), from = c->ni < 0 ? 0 : c->ni;
        for (int k = from; k < DT_OP_MAX_IARGS; k++) c->iv[k] = (int64_t)rndn(5) - 1;
        c->ni = from + add > DT_OP_MAX_IARGS ? DT_OP_MAX_IARGS : from + add;
        note(c, " n_iargs %lld;", c->ni, 0);
      } else if (rndn(2)) {
        c->ni = -1;
        note(c, " n_iargs -1;", 0, 0);
      } else {
        c->nf = -1;
        note(c, " n_fargs -1;", 0, 0);
      }
      return 1;
  }
}

/* The call's required arguments (op_specs.h), parsed. */
static void base_call(const spec_t* sp, call_t* c) {
  memset(c, 0, sizeof *c);
  c->sp = *sp;
  c->n_in = sp->n_in;
  c->null_in = -1;
  for (int t = 0; t < DT_OP_MAX_INPUTS; t++) {
    c->alias[t] = -1;
    for (int i = 0; i < DT_MAX_MESH_DIMS; i++) c->pl[t][i] = dt_replicate();
  }
  const char* as[4];
  int n = 0;
  for (int k = 0; k < 4 && sp->req[k]; k++) as[n++] = sp->req[k];
  DT_ASSERT_OK(dt_op_args_parse(sp->op, n, as, &c->ni, c->iv, &c->nf, c->fv));
}

static int64_t live_bytes(void) {
  dt_memory_stats_t m;
  DT_ASSERT_OK(dt_memory_stats(&m));
  return m.total_current;
}

static dt_mesh_t g_mesh;
static int g_rank;

/* The same status on every rank, or the test fails naming the case. */
static void agreed(dt_status_t st, const call_t* c, const char* stage) {
  int mine[2] = {(int)st, -(int)st}, all[2];
  MPI_Allreduce(mine, all, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  DT_ASSERT_TRUE(all[0] == -all[1], "%s (%s):%s ranks disagree: %s here (%s)", c->sp.op, stage,
                 c->what, dt_status_name(st), st ? dt_last_error() : "");
}

/* A failure's message: starts with the entry point, names nothing internal. */
static void check_message(dt_status_t st, const char* entry, const call_t* c) {
  if (st == DT_SUCCESS) return;
  const char* m = dt_last_error();
  DT_ASSERT_TRUE(m != NULL && strncmp(m, entry, strlen(entry)) == 0,
                 "%s:%s the message does not start with '%s': %s", c->sp.op, c->what, entry,
                 m ? m : "(null)");
  DT_ASSERT_TRUE(strstr(m, "dt__") == NULL, "%s:%s the message names an internal function: %s",
                 c->sp.op, c->what, m);
}

/* Reads every output's shape and local values (under ASan: they are real memory). */
static void check_output(dt_tensor_t o, const call_t* c) {
  int nd;
  int64_t shape[DT_MAX_DIMS], n;
  DT_ASSERT_OK(dt_tensor_ndim(o, &nd));
  DT_ASSERT_TRUE(nd >= 0 && nd <= DT_MAX_DIMS, "%s:%s output ndim %d", c->sp.op, c->what, nd);
  DT_ASSERT_OK(dt_tensor_shape(o, shape));
  DT_ASSERT_OK(dt_tensor_local_numel(o, &n));
  DT_ASSERT_TRUE(n >= 0, "%s:%s output local numel %lld", c->sp.op, c->what, (long long)n);
  if (n == 0) return;
  void* buf = malloc((size_t)n * 8);
  DT_ASSERT_TRUE(buf != NULL, "out of memory");
  DT_ASSERT_OK(dt_tensor_read_local(o, 0, n, buf));
  free(buf);
}

static void run_autograd(const call_t* c, const dt_op_desc_t* d);

/* Runs call c once, every check of the top of the file but the leak's. Returns its status. */
static dt_status_t run_once(const call_t* c) {
  dt_op_desc_t d;
  DT_ASSERT_OK(dt_op_describe(c->sp.op, &d));
  dt_tensor_t own[DT_OP_MAX_INPUTS] = {NULL}, in[DT_OP_MAX_INPUTS] = {NULL};
  dt_tensor_t outs[DT_OP_MAX_OUTPUTS] = {NULL};
  /* the inputs (a layout the constructor refuses ends the case, with a message) */
  dt_status_t st = DT_SUCCESS;
  for (int t = 0; t < c->sp.n_in && st == DT_SUCCESS; t++) {
    st = spec_input(g_mesh, &c->sp.in[t], t, g_world, c->pl[t], &own[t]);
    check_message(st, "dt_tensor_from_full", c);
  }
  agreed(st, c, "inputs");
  if (st == DT_SUCCESS) {
    for (int t = 0; t < c->n_in; t++)
      in[t] = c->null_in == t ? NULL : own[c->alias[t] >= 0 ? c->alias[t] : t];
    st = dt_op_run_multi(c->sp.op, c->n_in, in, c->ni, c->iv, c->nf, c->fv, d.n_outputs, outs);
    check_message(st, "dt_op_run", c);
    agreed(st, c, "call");
    for (int o = 0; o < d.n_outputs; o++) {
      if (st == DT_SUCCESS) {
        DT_ASSERT_TRUE(outs[o] != NULL, "%s:%s succeeded without output %d", c->sp.op, c->what,
                       o);
        check_output(outs[o], c);
      } else {
        DT_ASSERT_TRUE(outs[o] == NULL, "%s:%s failed but set output %d", c->sp.op, c->what, o);
      }
      DT_ASSERT_OK(dt_tensor_destroy(outs[o]));
    }
  }
  for (int t = 0; t < c->sp.n_in; t++) DT_ASSERT_OK(dt_tensor_destroy(own[t]));
  if (st == DT_SUCCESS && d.has_backward) run_autograd(c, &d);
  return st;
}

static int g_backwards; /* backward passes that succeeded */

static int is_float(dt_dtype_t d) { return d == DT_F32 || d == DT_BF16 || d == DT_F16; }

/* The same call recorded on a tape (float inputs are leaves that require a gradient), then, when
 * it records and its first output is a float, backward from that output's sum: statuses agreed
 * at each stage, failures with a message, the tape and leaves destroyed. */
static void run_autograd(const call_t* c, const dt_op_desc_t* d) {
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t leaf[DT_OP_MAX_INPUTS] = {NULL}, in[DT_OP_MAX_INPUTS] = {NULL};
  dt_var_t outs[DT_OP_MAX_OUTPUTS] = {NULL};
  dt_status_t st = DT_SUCCESS;
  for (int t = 0; t < c->sp.n_in && st == DT_SUCCESS; t++) {
    dt_tensor_t x = NULL;
    st = spec_input(g_mesh, &c->sp.in[t], t, g_world, c->pl[t], &x);
    if (st == DT_SUCCESS) st = dt_var_leaf(x, is_float(c->sp.in[t].dtype), &leaf[t]);
  }
  agreed(st, c, "autograd inputs");
  if (st == DT_SUCCESS) {
    for (int t = 0; t < c->n_in; t++)
      in[t] = c->null_in == t ? NULL : leaf[c->alias[t] >= 0 ? c->alias[t] : t];
    st = dt_ag_op(tape, c->sp.op, c->n_in, in, c->ni, c->iv, c->nf, c->fv, d->n_outputs, outs);
    check_message(st, "dt_ag_op", c);
    agreed(st, c, "dt_ag_op");
  }
  dt_tensor_t y = st == DT_SUCCESS && d->n_outputs > 0 ? dt_var_value(outs[0]) : NULL;
  dt_dtype_t yd = DT_F32;
  if (y != NULL) DT_ASSERT_OK(dt_tensor_dtype(y, &yd));
  int64_t rg = 0;
  for (int t = 0; t < c->sp.n_in; t++) rg += leaf[t] != NULL && is_float(c->sp.in[t].dtype);
  if (y != NULL && is_float(yd) && rg > 0) {
    dt_var_t loss;
    st = dt_ag_op(tape, "sum", 1, &outs[0], 0, NULL, 0, NULL, 1, &loss);
    agreed(st, c, "sum");
    if (st == DT_SUCCESS) {
      st = dt_tape_backward(tape, loss);
      check_message(st, "dt_tape_backward", c);
      agreed(st, c, "dt_tape_backward");
      g_backwards += st == DT_SUCCESS;
    }
  }
  DT_ASSERT_OK(dt_tape_destroy(tape));
  for (int t = 0; t < c->sp.n_in; t++) DT_ASSERT_OK(dt_var_destroy(leaf[t]));
}

/* Runs call c three times: the same status each time, and the third run holds no more memory
 * at its end than the second (a redistribution's workspace, kept for reuse, may grow in the
 * first two: by measure, 48 then 96 bytes for one index_add). */
static dt_status_t run_call(const call_t* c) {
  const dt_status_t st = run_once(c);
  int64_t held[2];
  for (int r = 0; r < 2; r++) {
    const dt_status_t again = run_once(c);
    held[r] = live_bytes();
    DT_ASSERT_TRUE(again == st, "%s:%s %s, then %s when run again", c->sp.op, c->what,
                   dt_status_name(st), dt_status_name(again));
  }
  DT_ASSERT_TRUE(held[1] == held[0], "%s:%s %lld more bytes held after a third run (%s), with "
                 "everything destroyed", c->sp.op, c->what, (long long)(held[1] - held[0]),
                 dt_status_name(st));
  return st;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_size(&g_world));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  const int two_d[2] = {2, g_world / 2};
  g_mesh_ndim = g_world >= 4 && g_world % 2 == 0 ? 2 : 1;
  DT_ASSERT_OK(dt_mesh_create(g_mesh_ndim, g_mesh_ndim == 2 ? two_d : &g_world, NULL, NULL,
                              &g_mesh));
  const char* e = getenv("DT_MUT_ITERS");
  const int iters = e ? atoi(e) : 40;
  e = getenv("DT_MUT_SEED");
  const uint64_t seed = e ? strtoull(e, NULL, 10) : 20261128ull;
  int n, ops = 0, calls = 0, ok = 0;
  DT_ASSERT_OK(dt_op_count(&n));
  for (int i = 0; i < n; i++) {
    const spec_t* sp = spec_at(i);
    if (sp == NULL) continue; /* a host op */
    const char* name = sp->op;
    call_t c; /* the valid call (some rows do not fit every world size: then it fails alike) */
    base_call(sp, &c);
    const dt_status_t valid = run_call(&c);
    g_rng = seed * 0x9E3779B97F4A7C15ull + (uint64_t)i + 1;
    for (int k = 0; k < iters; k++) {
      base_call(sp, &c);
      const int muts = 1 + rndn(3);
      for (int m = 0; m < muts;)
        if (mutate(&c)) m++;
      ok += run_call(&c) == DT_SUCCESS;
      calls++;
    }
    base_call(sp, &c); /* the valid call still does what it did */
    const dt_status_t after = run_call(&c);
    DT_ASSERT_TRUE(after == valid, "%s: the valid call gave %s, and %s after its mutations: %s",
                   name, dt_status_name(valid), dt_status_name(after), dt_last_error());
    ops++;
  }
  DT_ASSERT_TRUE(g_backwards > 0, "no mutated call was differentiated");
  if (g_rank == 0)
    printf("test_op_mutations np=%d: %d ops, %d mutated calls (%d succeeded, %d refused), %d "
           "backward passes\n", g_world, ops, calls, ok, calls - ok, g_backwards);
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}
