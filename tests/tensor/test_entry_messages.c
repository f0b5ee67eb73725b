#define _POSIX_C_SOURCE 200809L
/* test_entry_messages.c - a failure anywhere below a public function of the tensor, mesh,
 * redistribution, cost-model, tape, backend, handle and init layers reads "PUBLIC: TEXT", the way
 * the op layer's do (tests/ops/test_op_messages.c): PUBLIC is the function the program called,
 * never an internal one (dt__*) and never repeated, even when the failure is recorded inside a
 * helper (a handle check, an argument check, a layout check); TEXT names the offending argument.
 *
 * The cases, by file: before dt_init (dt_world_rank, dt_mesh_create), dt_init twice (lib.c); a
 * mesh ndim of 0, a mesh dim out of range, an unknown dim name, a bad dtype for the host
 * all-reduce, a made-up backend, a second dt_mesh_destroy (mesh.c); a destroyed mesh given to the
 * counters (context.c); a second dt_tensor_destroy, a Shard dim out of range, a bad dtype, a NULL
 * out-pointer, a NaN fill value, rand on integers, a redistribution to an illegal target, a local
 * shape against the chunk rule through dt_tensor_from_local, too small a buffer for the gather
 * (tensor.c); a range past the shard, a destroyed tensor, a negative range count, a NULL box
 * (local_io.c); an illegal plan target, a bad dtype, a destroyed plan, a zero-size buffer
 * (plan.c); a destroyed work waited on and destroyed again (work.c); a negative latency, a
 * collective out of range, a mesh dim out of range, broken JSON (cost.c); a destroyed tape,
 * tensor and variable, an unknown op through the tape, a hook on a non-leaf, dropping a leaf
 * (tape.c); an unknown backend name, a made-up and a NULL backend handle (storage.c); a handle of
 * the wrong kind and a second unregister (handle.c); a bad item in a placement list, too many
 * items, a Shard dim out of range, too small a buffer, a zero-part chunk, a bad placement code
 * (placement.c); an unknown dtype name (util.c), a negative timeout (deadline.c), an op index out
 * of range (registry.c); a bad Linear size and module name, a negative Sequential count, an
 * unknown activation (layers.c); bad Markov-corpus arguments, too long a batch, a second destroy
 * (data.c); a Linear shape mismatch, a NULL weight, float ids for the embedding (modules.c); a
 * module that FSDP never wrapped (fsdp.c). np 1 and 2; every rank checks its own. */
#include <math.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"
#include "dtensor/handle.h"

static int g_cases;

/* The failure just returned: status `want`; the message starts with "entry: ", does not repeat
 * "entry:" and names no internal function; it contains n1 (the argument) and n2 when given. */
static void expect(dt_status_t st, dt_status_t want, const char* entry, const char* n1,
                   const char* n2, int line) {
  const char* m = dt_last_error();
  size_t n = strlen(entry);
  char again[80];
  snprintf(again, sizeof again, "%s:", entry);
  DT_ASSERT_TRUE(st == want, "line %d: status %s, expected %s: %s", line, dt_status_name(st),
                 dt_status_name(want), m);
  DT_ASSERT_TRUE(strncmp(m, entry, n) == 0 && strncmp(m + n, ": ", 2) == 0,
                 "line %d: message does not start with '%s: ': %s", line, entry, m);
  DT_ASSERT_TRUE(strstr(m + n + 2, again) == NULL, "line %d: entry repeated: %s", line, m);
  DT_ASSERT_TRUE(strstr(m, "dt__") == NULL, "line %d: message names an internal function: %s",
                 line, m);
  DT_ASSERT_TRUE(n1 == NULL || strstr(m, n1) != NULL, "line %d: message lacks '%s': %s", line, n1,
                 m);
  DT_ASSERT_TRUE(n2 == NULL || strstr(m, n2) != NULL, "line %d: message lacks '%s': %s", line, n2,
                 m);
  if (getenv("DT_TEST_VERBOSE") && dt_test_rank() == 0) printf("%s\n", m);
  g_cases++;
}
#define EXPECT(call, want, entry, n1, n2)            \
  do {                                               \
    dt_clear_error();                                \
    dt_status_t ex_st_ = (call);                     \
    expect(ex_st_, (want), (entry), (n1), (n2), __LINE__); \
  } while (0)

static dt_status_t no_hook(dt_var_t v, void* ctx) {
  (void)v;
  (void)ctx;
  return DT_SUCCESS;
}

static _Alignas(64) unsigned char g_junk[256];

/* A message saved, cleared by a cleanup and recorded again under the same entry names the entry
 * once ("dt_x: text", not "dt_x: dt_x: text"). */
static dt_status_t rerecord_impl(void) {
  DT_FAIL(DT_ERR_IO, "writing f");
  char saved[256];
  snprintf(saved, sizeof saved, "%s", dt_last_error());
  dt_clear_error(); /* the cleanup's own failure, forgotten */
  return DT_FAIL(DT_ERR_IO, "%s", saved);
}
static dt_status_t dt_x_rerecord(void) { DT_ENTRY_RETURN(rerecord_impl()); }

int main(int argc, char** argv) {
  DT_ASSERT_STATUS(dt_x_rerecord(), DT_ERR_IO);
  DT_ASSERT_TRUE(strcmp(dt_last_error(), "dt_x_rerecord: writing f") == 0, "re-recorded: '%s'",
                 dt_last_error());
  /* lib.c, context.c, mesh.c before dt_init */
  int r = 0, one = 1;
  dt_mesh_t m0 = NULL;
  EXPECT(dt_world_rank(&r), DT_ERR_NOT_INITIALIZED, "dt_world_rank", "dt_init", NULL);
  EXPECT(dt_mesh_create(1, &one, NULL, NULL, &m0), DT_ERR_NOT_INITIALIZED, "dt_mesh_create",
         "dt_init", NULL);
  DT_ASSERT_OK(dt_init(&argc, &argv));
  EXPECT(dt_init(&argc, &argv), DT_ERR_INVALID_USAGE, "dt_init", "already initialized",
         "dt_finalize");
  int world;
  DT_ASSERT_OK(dt_world_size(&world));

  /* mesh.c */
  const char* names[1] = {"dp"};
  dt_mesh_t mesh, am, out_mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, names, NULL, &mesh));
  EXPECT(dt_mesh_create(0, &world, NULL, NULL, &m0), DT_ERR_INVALID_ARG, "dt_mesh_create",
         "ndim 0", "[1, 4]");
  int sz;
  EXPECT(dt_mesh_size(mesh, 5, &sz), DT_ERR_INVALID_ARG, "dt_mesh_size", "dim=5", "valid");
  const char* nope[1] = {"nope"};
  EXPECT(dt_mesh_slice(mesh, 1, nope, &out_mesh), DT_ERR_INVALID_ARG, "dt_mesh_slice",
         "names[0]", "'dp'");
  int64_t hv = 1;
  EXPECT(dt_mesh_all_reduce_host(mesh, 0, NULL, &hv, 1, DT_BF16, DT_REDUCE_SUM),
         DT_ERR_INVALID_ARG, "dt_mesh_all_reduce_host", "dtype", "f32");
  dt_backend_t junk_backend = (dt_backend_t)(void*)g_junk;
  EXPECT(dt_mesh_set_backend(mesh, junk_backend), DT_ERR_INVALID_ARG, "dt_mesh_set_backend",
         "backend", NULL);
  int two = 2;
  DT_ASSERT_OK(dt_mesh_create_abstract(1, &two, NULL, &am));
  DT_ASSERT_OK(dt_mesh_destroy(am));
  EXPECT(dt_mesh_destroy(am), DT_ERR_INVALID_USAGE, "dt_mesh_destroy", "mesh", "destroyed");

  /* context.c */
  dt_counters_t counters;
  EXPECT(dt_counters_get(am, &counters), DT_ERR_INVALID_USAGE, "dt_counters_get", "mesh",
         "destroyed");
  EXPECT(dt_counters_reset(am), DT_ERR_INVALID_USAGE, "dt_counters_reset", "mesh", "destroyed");

  /* tensor.c */
  const int64_t s46[2] = {4 * world, 6};
  float full[256] = {0};
  dt_placement_t rep[1] = {dt_replicate()}, bad_shard[1] = {dt_shard(5)}, s0[1] = {dt_shard(0)};
  dt_tensor_t a, b, t = NULL, dead;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s46, rep, full, &a));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s46, s0, full, &b));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s46, rep, full, &dead));
  DT_ASSERT_OK(dt_tensor_destroy(dead));
  EXPECT(dt_tensor_destroy(dead), DT_ERR_INVALID_USAGE, "dt_tensor_destroy", "tensor",
         "destroyed");
  EXPECT(dt_tensor_from_full(mesh, DT_F32, 2, s46, bad_shard, full, &t), DT_ERR_INVALID_ARG,
         "dt_tensor_from_full", "placement", "Shard dim 5");
  EXPECT(dt_tensor_empty(mesh, (dt_dtype_t)99, 2, s46, rep, &t), DT_ERR_INVALID_ARG,
         "dt_tensor_empty", "dtype 99", NULL);
  EXPECT(dt_tensor_zeros(mesh, DT_F32, 2, s46, rep, NULL), DT_ERR_INVALID_ARG, "dt_tensor_zeros",
         "out is NULL", NULL);
  EXPECT(dt_tensor_full_value(mesh, DT_F32, 2, s46, rep, NAN, &t), DT_ERR_INVALID_ARG,
         "dt_tensor_full_value", "value", "finite");
  EXPECT(dt_tensor_rand(mesh, DT_I32, 2, s46, rep, 1, &t), DT_ERR_INVALID_ARG, "dt_tensor_rand",
         "dtype", "float");
  dt_placement_t bad_dst[1] = {dt_shard(7)};
  EXPECT(dt_tensor_redistribute(a, bad_dst, &t), DT_ERR_INVALID_ARG, "dt_tensor_redistribute",
         "dst[0]", "Shard dim 7");
  const int64_t bad_local[2] = {3, 6};
  EXPECT(dt_tensor_from_local(mesh, DT_F32, 2, s46, s0, full, bad_local, &t), DT_ERR_INVALID_ARG,
         "dt_tensor_from_local", "local_shape", "chunk rule");
  EXPECT(dt_tensor_gather_full(a, full, 3), DT_ERR_INVALID_ARG, "dt_tensor_gather_full",
         "out_nbytes=3", NULL);
  DT_ASSERT_TRUE(t == NULL, "a failed call returned a tensor");

  /* local_io.c */
  EXPECT(dt_tensor_read_local(a, 0, 1000, full), DT_ERR_INVALID_ARG, "dt_tensor_read_local",
         "numel=1000", NULL);
  const int64_t z1[1] = {0}, n1[1] = {1};
  EXPECT(dt_tensor_fill_local(dead, 1, z1, n1, 0.0), DT_ERR_INVALID_USAGE, "dt_tensor_fill_local",
         "tensor", "destroyed");
  EXPECT(dt_tensor_copy_local(a, b, -1, z1, z1, n1), DT_ERR_INVALID_ARG, "dt_tensor_copy_local",
         "n=-1", NULL);
  const int64_t box_off[2] = {0, 0};
  EXPECT(dt_tensor_write_local_box(a, box_off, NULL, full), DT_ERR_INVALID_ARG,
         "dt_tensor_write_local_box", "box_len is NULL", NULL);

  /* plan.c */
  dt_plan_t plan, gone;
  EXPECT(dt_plan_create(mesh, DT_F32, 2, s46, rep, bad_dst, &plan), DT_ERR_INVALID_ARG,
         "dt_plan_create", "dst[0]", "Shard dim 7");
  EXPECT(dt_plan_create(mesh, (dt_dtype_t)77, 2, s46, rep, s0, &plan), DT_ERR_INVALID_ARG,
         "dt_plan_create", "dtype 77", NULL);
  DT_ASSERT_OK(dt_plan_create(mesh, DT_F32, 2, s46, s0, rep, &plan));
  char buf[8];
  EXPECT(dt_plan_format(plan, buf, 0), DT_ERR_INVALID_ARG, "dt_plan_format", "cap", NULL);
  DT_ASSERT_OK(dt_plan_create_greedy(mesh, DT_F32, 2, s46, rep, s0, &gone));
  DT_ASSERT_OK(dt_plan_destroy(gone));
  int nsteps;
  EXPECT(dt_plan_num_steps(gone, &nsteps), DT_ERR_INVALID_USAGE, "dt_plan_num_steps", "plan",
         "destroyed");
  DT_ASSERT_OK(dt_plan_destroy(plan));

  /* work.c */
  dt_work_t work;
  DT_ASSERT_OK(dt_tensor_redistribute_async(b, rep, &t, &work));
  DT_ASSERT_OK(dt_work_wait(work));
  DT_ASSERT_OK(dt_work_destroy(work));
  DT_ASSERT_OK(dt_tensor_destroy(t));
  t = NULL;
  EXPECT(dt_work_wait(work), DT_ERR_INVALID_USAGE, "dt_work_wait", "work", "destroyed");
  EXPECT(dt_work_destroy(work), DT_ERR_INVALID_USAGE, "dt_work_destroy", "work", "destroyed");

  /* cost.c */
  dt_cost_params_t cp = {-1.0, 1.0, 10.0};
  EXPECT(dt_cost_model_set(DT_COLL_ALL_GATHER, &cp), DT_ERR_INVALID_ARG, "dt_cost_model_set",
         "base_us", "-1");
  EXPECT(dt_cost_model_get((dt_collective_t)99, &cp), DT_ERR_INVALID_ARG, "dt_cost_model_get",
         "collective 99", NULL);
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_GATHER, &cp));
  EXPECT(dt_mesh_set_cost_model(mesh, 5, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, &cp),
         DT_ERR_INVALID_ARG, "dt_mesh_set_cost_model", "dim", "5");
  EXPECT(dt_cost_model_load_string("{", 1), DT_ERR_INVALID_ARG, "dt_cost_model_load_string",
         "text", "JSON");

  /* tape.c */
  dt_tape_t tape, dead_tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_tape_create(&dead_tape));
  DT_ASSERT_OK(dt_tape_destroy(dead_tape));
  EXPECT(dt_tape_destroy(dead_tape), DT_ERR_INVALID_USAGE, "dt_tape_destroy", "tape",
         "destroyed");
  dt_var_t x, y, z, dead_var;
  EXPECT(dt_var_leaf(dead, 1, &x), DT_ERR_INVALID_USAGE, "dt_var_leaf", "value", "destroyed");
  DT_ASSERT_OK(dt_var_leaf(a, 1, &x));
  DT_ASSERT_OK(dt_var_leaf(b, 0, &y));
  dt_var_t xy[2] = {x, y};
  EXPECT(dt_ag_op(tape, "matmul", 2, xy, 0, NULL, 0, NULL, 1, &z), DT_ERR_UNSUPPORTED, "dt_ag_op",
         "'matmul'", "'mm'");
  DT_ASSERT_OK(dt_ag_op(tape, "relu", 1, &x, 0, NULL, 0, NULL, 1, &z));
  EXPECT(dt_var_set_grad_hook(z, no_hook, NULL), DT_ERR_INVALID_USAGE, "dt_var_set_grad_hook",
         "v is not a leaf", NULL);
  EXPECT(dt_tape_drop(tape, x), DT_ERR_INVALID_USAGE, "dt_tape_drop", "v", "recorded op");
  dt_tensor_t c;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s46, rep, full, &c));
  DT_ASSERT_OK(dt_var_leaf(c, 0, &dead_var));
  DT_ASSERT_OK(dt_var_destroy(dead_var));
  EXPECT(dt_var_destroy(dead_var), DT_ERR_INVALID_USAGE, "dt_var_destroy", "variable",
         "destroyed");
  DT_ASSERT_OK(dt_tape_destroy(tape));

  /* storage.c */
  dt_backend_t be;
  EXPECT(dt_backend_get("gpu", &be), DT_ERR_UNSUPPORTED, "dt_backend_get", "name 'gpu'", "cpu");
  EXPECT(dt_backend_set_default(junk_backend), DT_ERR_INVALID_ARG, "dt_backend_set_default",
         "backend", NULL);
  int64_t nb, nblocks;
  EXPECT(dt_backend_memory(NULL, &nb, &nblocks), DT_ERR_INVALID_ARG, "dt_backend_memory",
         "backend is NULL", NULL);

  /* handle.c */
  static const dt_handle_kind_t widget = {"widget"}, gadget = {"gadget"};
  void* obj = malloc(16);
  DT_ASSERT_OK(dt_handle_register(obj, &widget));
  EXPECT(dt_handle_check(obj, &gadget, "w"), DT_ERR_INVALID_ARG, "dt_handle_check",
         "w is a widget", "not a gadget");
  DT_ASSERT_OK(dt_handle_unregister(obj, &widget, "w"));
  EXPECT(dt_handle_unregister(obj, &widget, "w"), DT_ERR_INVALID_USAGE, "dt_handle_unregister",
         "w is not a live widget", "destroyed");
  dt_handle_free(obj);

  /* placement.c: a failure inside a helper, or a nested public call (dt_placement_parse inside
   * dt_placements_parse), names the function called and the offending text */
  dt_placement_t pl[4];
  int npl;
  EXPECT(dt_placements_parse("S(0),Q", pl, 4, &npl), DT_ERR_INVALID_ARG, "dt_placements_parse",
         "'S(0),Q': item 1", "'Q' is not a placement");
  EXPECT(dt_placements_parse("R,R,R", pl, 2, &npl), DT_ERR_INVALID_ARG, "dt_placements_parse",
         "cap=2", "'R,R,R'");
  EXPECT(dt_placement_parse("S(9)", pl), DT_ERR_INVALID_ARG, "dt_placement_parse",
         "Shard dim 9", "valid: -8 to 7");
  EXPECT(dt_placements_format(s0, 1, ",", buf, 3), DT_ERR_INVALID_ARG, "dt_placements_format",
         "cap=3", "valid: 5 or more");
  int64_t off, len;
  EXPECT(dt_chunk(10, 0, 0, &off, &len), DT_ERR_INVALID_ARG, "dt_chunk", "nparts=0",
         "valid: 1 or more");
  EXPECT(dt_placement_decode(1 << 20, pl), DT_ERR_INVALID_ARG, "dt_placement_decode",
         "code=1048576", "valid: 0 to 65535");

  /* util.c, deadline.c, registry.c */
  dt_dtype_t dt;
  EXPECT(dt_dtype_parse("f8", &dt), DT_ERR_INVALID_ARG, "dt_dtype_parse", "'f8'", "bf16");
  EXPECT(dt_set_timeout(-1.0), DT_ERR_INVALID_ARG, "dt_set_timeout", "seconds=-1", "positive");
  const char* opname;
  EXPECT(dt_op_name_at(-1, &opname), DT_ERR_INVALID_ARG, "dt_op_name_at", "index=-1", "[0, ");

  /* layers.c: the layer constructors name themselves even when the failure is inside
   * dt_module_create or dt_op_describe */
  dt_module_t mod = NULL;
  EXPECT(dt_linear_create(mesh, "fc", 0, 4, 1, 0, &mod), DT_ERR_INVALID_ARG, "dt_linear_create",
         "in_features=0", "1 or more");
  EXPECT(dt_linear_create(mesh, "a.b", 2, 4, 1, 0, &mod), DT_ERR_INVALID_ARG, "dt_linear_create",
         "'a.b'", NULL);
  EXPECT(dt_sequential_create("seq", -1, NULL, &mod), DT_ERR_INVALID_ARG, "dt_sequential_create",
         "n=-1", "valid");
  EXPECT(dt_activation_create("act", "nope", &mod), DT_ERR_INVALID_ARG, "dt_activation_create",
         "'nope'", "relu");
  DT_ASSERT_TRUE(mod == NULL, "a failed constructor returned a module");

  /* data.c */
  dt_corpus_t corpus;
  EXPECT(dt_corpus_markov(1, 2, 100, 7, &corpus), DT_ERR_INVALID_ARG, "dt_corpus_markov",
         "vocab=1", "vocab 2 to 256");
  EXPECT(dt_corpus_markov(16, 2, 3, 7, &corpus), DT_ERR_INVALID_ARG, "dt_corpus_markov",
         "length=3", "length 4 or more");
  DT_ASSERT_OK(dt_corpus_markov(16, 1, 64, 7, &corpus));
  int64_t toks[256], tgts[256];
  EXPECT(dt_corpus_batch(corpus, 1, 0, 1, 64, toks, tgts), DT_ERR_INVALID_ARG, "dt_corpus_batch",
         "S=64", "S <= 63");
  DT_ASSERT_OK(dt_corpus_destroy(corpus));
  EXPECT(dt_corpus_destroy(corpus), DT_ERR_INVALID_USAGE, "dt_corpus_destroy", "corpus",
         "destroyed");

  /* modules.c: a shape mismatch, and a failure inside the op the nn function records (it read
   * "dt_ag_op: ..." before) */
  dt_tape_t nt;
  DT_ASSERT_OK(dt_tape_create(&nt));
  const int64_t s35[2] = {3, 5};
  dt_tensor_t wt, ids;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s35, rep, full, &wt));
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, 2, s46, rep, full, &ids));
  dt_var_t xv = x, wv, idv, yv; /* x: a's variable (above) */
  DT_ASSERT_OK(dt_var_leaf(wt, 1, &wv));
  DT_ASSERT_OK(dt_var_leaf(ids, 0, &idv));
  EXPECT(dt_nn_linear(nt, xv, wv, NULL, &yv), DT_ERR_INVALID_ARG, "dt_nn_linear", "x (..., 6)",
         "in_features 5");
  EXPECT(dt_nn_linear(nt, xv, NULL, NULL, &yv), DT_ERR_INVALID_ARG, "dt_nn_linear", "weight",
         NULL);
  dt_clear_error();
  dt_status_t est = dt_nn_embedding(nt, wv, idv, &yv);
  DT_ASSERT_TRUE(est != DT_SUCCESS, "embedding with f32 ids succeeded");
  expect(est, est, "dt_nn_embedding", "embedding", NULL, __LINE__);
  DT_ASSERT_OK(dt_var_destroy(wv));
  DT_ASSERT_OK(dt_var_destroy(idv));
  DT_ASSERT_OK(dt_tape_destroy(nt)); /* wt and ids went with their variables */

  /* fsdp.c: a module that was never wrapped */
  DT_ASSERT_OK(dt_linear_create(mesh, "fc", 6, 3, 1, 0, &mod));
  dt_fsdp_group_info_t gi;
  EXPECT(dt_fsdp_group_info(mod, &gi), DT_ERR_INVALID_ARG, "dt_fsdp_group_info", "m ('fc')",
         "not an FSDP group");
  DT_ASSERT_OK(dt_module_destroy(mod));

  if (dt_test_rank() == 0) printf("test_entry_messages: %d messages checked\n", g_cases);
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(y));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}
