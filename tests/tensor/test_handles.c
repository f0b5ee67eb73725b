/* test_handles.c - handles cannot be used after they are destroyed (dtensor/handle.h).
 *
 * One case per handle type and misuse: a second destroy is DT_ERR_INVALID_USAGE and changes
 * nothing (the plan cache, a mesh held by tensors, a recorded leaf keep working), a destroyed
 * handle passed to any call is DT_ERR_INVALID_USAGE, a made-up pointer or a handle of another
 * kind DT_ERR_INVALID_ARG, and destroying a tensor that a variable owns (its value, its gradient,
 * an optimizer's state) is refused. Each case ran into a crash, a double free or wrong data before
 * the registry; under ASan and valgrind it must now be clean.
 */
#include <string.h>

#include "dt_test.h"
#include "dtensor/nn.h"

#define N 8

static dt_placement_t pl_of(const char* s) {
  dt_placement_t p;
  DT_ASSERT_OK(dt_placement_parse(s, &p));
  return p;
}

/* A 1-D f32 tensor 0..N-1 with placement s. */
static dt_tensor_t arange(dt_mesh_t m, const char* s) {
  dt_placement_t p = pl_of(s);
  int64_t shape[1] = {N};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_arange(m, DT_F32, 1, shape, &p, 0.0, 1.0, &t));
  return t;
}

static void expect_arange(dt_tensor_t t) {
  float full[N];
  DT_ASSERT_OK(dt_tensor_gather_full(t, full, sizeof full));
  for (int i = 0; i < N; i++) DT_ASSERT_EQ((long long)full[i], i);
}

#define EXPECT_MSG(call, want, text)                                                        \
  do {                                                                                      \
    DT_ASSERT_STATUS(call, want);                                                           \
    DT_ASSERT_TRUE(strstr(dt_last_error(), text) != NULL, "message '%s' lacks '%s'",        \
                   dt_last_error(), text);                                                  \
  } while (0)

/* The issue's first example: a second dt_plan_destroy used to free the plan the cache held, so
 * the next S(0)->R returned wrong data and then crashed. */
static void plans(dt_mesh_t m) {
  int64_t shape[1] = {N};
  dt_placement_t s0 = pl_of("S(0)"), r = pl_of("R");
  dt_plan_t p, q;
  DT_ASSERT_OK(dt_plan_create(m, DT_F32, 1, shape, &s0, &r, &p));
  DT_ASSERT_OK(dt_plan_create(m, DT_F32, 1, shape, &s0, &r, &q)); /* the same cached plan */
  DT_ASSERT_OK(dt_plan_destroy(p));
  DT_ASSERT_OK(dt_plan_destroy(q)); /* two references, two destroys */
  EXPECT_MSG(dt_plan_destroy(p), DT_ERR_INVALID_USAGE, "destroyed");
  int n;
  EXPECT_MSG(dt_plan_num_steps(p, &n), DT_ERR_INVALID_USAGE, "not a live plan");
  for (int k = 0; k < 3; k++) { /* the cached plan is intact */
    dt_tensor_t t = arange(m, "S(0)"), out;
    DT_ASSERT_OK(dt_tensor_redistribute(t, &r, &out));
    expect_arange(out);
    DT_ASSERT_OK(dt_tensor_destroy(out));
    DT_ASSERT_OK(dt_tensor_destroy(t));
  }
  dt_plan_t g;
  DT_ASSERT_OK(dt_plan_create_greedy(m, DT_F32, 1, shape, &s0, &r, &g));
  DT_ASSERT_OK(dt_plan_destroy(g));
  DT_ASSERT_STATUS(dt_plan_destroy(g), DT_ERR_INVALID_USAGE);
}

/* dt_mesh_destroy twice while a tensor holds the mesh used to free it under the tensor. */
static void meshes(void) {
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &m));
  dt_tensor_t t = arange(m, "S(0)");
  DT_ASSERT_OK(dt_mesh_destroy(m));
  EXPECT_MSG(dt_mesh_destroy(m), DT_ERR_INVALID_USAGE, "already destroyed");
  expect_arange(t); /* the tensor's mesh lives on */
  dt_mesh_t held;
  DT_ASSERT_OK(dt_tensor_mesh(t, &held));
  int nd;
  DT_ASSERT_OK(dt_mesh_ndim(held, &nd)); /* borrowed through the tensor: usable */
  DT_ASSERT_EQ(nd, 1);
  DT_ASSERT_OK(dt_tensor_destroy(t)); /* the last reference: the mesh goes */
  EXPECT_MSG(dt_mesh_ndim(m, &nd), DT_ERR_INVALID_USAGE, "not a live mesh");
  DT_ASSERT_STATUS(dt_mesh_destroy(m), DT_ERR_INVALID_USAGE);
}

static void tensors(dt_mesh_t m) {
  dt_tensor_t t = arange(m, "S(0)");
  DT_ASSERT_OK(dt_tensor_destroy(t));
  EXPECT_MSG(dt_tensor_destroy(t), DT_ERR_INVALID_USAGE, "not a live tensor");
  int nd;
  DT_ASSERT_STATUS(dt_tensor_ndim(t, &nd), DT_ERR_INVALID_USAGE);
  dt_placement_t r = pl_of("R");
  dt_tensor_t out = NULL;
  DT_ASSERT_STATUS(dt_tensor_redistribute(t, &r, &out), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(out == NULL, "no output from a dead input");
  /* made-up pointers and handles of another kind */
  static char junk[256];
  EXPECT_MSG(dt_tensor_ndim((dt_tensor_t)(void*)junk, &nd), DT_ERR_INVALID_ARG, "not a live tensor");
  EXPECT_MSG(dt_tensor_ndim((dt_tensor_t)(void*)m, &nd), DT_ERR_INVALID_ARG, "is a mesh");
  DT_ASSERT_STATUS(dt_mesh_ndim((dt_mesh_t)(void*)junk, &nd), DT_ERR_INVALID_ARG);
}

static void works(dt_mesh_t m) {
  dt_tensor_t t = arange(m, "S(0)"), out;
  dt_placement_t r = pl_of("R");
  dt_work_t w;
  DT_ASSERT_OK(dt_tensor_redistribute_async(t, &r, &out, &w));
  DT_ASSERT_OK(dt_work_wait(w));
  DT_ASSERT_OK(dt_work_destroy(w));
  EXPECT_MSG(dt_work_destroy(w), DT_ERR_INVALID_USAGE, "not a live work");
  DT_ASSERT_STATUS(dt_work_wait(w), DT_ERR_INVALID_USAGE);
  int done;
  DT_ASSERT_STATUS(dt_work_test(w, &done), DT_ERR_INVALID_USAGE);
  expect_arange(out);
  /* a newer work is not confused with the destroyed one */
  dt_work_t w2;
  dt_tensor_t out2;
  DT_ASSERT_OK(dt_tensor_redistribute_async(t, &r, &out2, &w2));
  DT_ASSERT_TRUE(w2 != w, "a destroyed work handle was handed out again at once");
  DT_ASSERT_STATUS(dt_work_wait(w), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_work_wait(w2));
  DT_ASSERT_OK(dt_work_destroy(w2));
  expect_arange(out2);
  dt_tensor_destroy(out2);
  dt_tensor_destroy(out);
  dt_tensor_destroy(t);
}

/* Tapes, variables and the tensors they own. */
static void autograd(dt_mesh_t m) {
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  DT_ASSERT_OK(dt_tape_destroy(tape));
  EXPECT_MSG(dt_tape_destroy(tape), DT_ERR_INVALID_USAGE, "not a live tape");
  DT_ASSERT_STATUS(dt_tape_reset(tape), DT_ERR_INVALID_USAGE);

  /* a leaf destroyed after the tape recorded it: the backward pass still runs */
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t w, x, y, loss;
  DT_ASSERT_OK(dt_var_leaf(arange(m, "S(0)"), 1, &w));
  DT_ASSERT_OK(dt_var_leaf(arange(m, "R"), 0, &x));
  DT_ASSERT_OK(dt_ag_op(tape, "mul", 2, (dt_var_t[]){w, x}, 0, NULL, 0, NULL, 1, &y));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 1, (int64_t[]){0}, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_var_destroy(w));
  EXPECT_MSG(dt_var_destroy(w), DT_ERR_INVALID_USAGE, "destroyed");
  DT_ASSERT_TRUE(dt_var_grad(w) == NULL, "a destroyed leaf has no reachable gradient");
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  DT_ASSERT_OK(dt_tape_reset(tape)); /* frees the destroyed leaf (leak checkers see it) */

  /* a variable's tensors belong to it */
  dt_var_t v;
  dt_tensor_t val = arange(m, "S(0)");
  DT_ASSERT_OK(dt_var_leaf(val, 1, &v));
  EXPECT_MSG(dt_tensor_destroy(val), DT_ERR_INVALID_USAGE, "belongs to a variable");
  dt_var_t v2;
  DT_ASSERT_STATUS(dt_var_leaf(val, 1, &v2), DT_ERR_INVALID_USAGE); /* one owner only */
  DT_ASSERT_OK(dt_var_set_value(v, dt_var_value(v)));               /* a no-op, no dangling */
  expect_arange(dt_var_value(v));
  /* a value of another shape, dtype or placement is refused (it overflowed AdamW before) */
  int64_t small[1] = {N / 2};
  dt_placement_t s0 = pl_of("S(0)"), r = pl_of("R");
  dt_tensor_t bad;
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 1, small, &s0, &bad));
  EXPECT_MSG(dt_var_set_value(v, bad), DT_ERR_INVALID_ARG, "same");
  dt_tensor_destroy(bad);
  int64_t full[1] = {N};
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 1, full, &r, &bad));
  DT_ASSERT_STATUS(dt_var_set_value(v, bad), DT_ERR_INVALID_ARG);
  dt_tensor_destroy(bad);
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_BF16, 1, full, &s0, &bad));
  DT_ASSERT_STATUS(dt_var_set_value(v, bad), DT_ERR_INVALID_ARG);
  dt_tensor_destroy(bad);
  expect_arange(dt_var_value(v));

  /* optimizer state tensors are lent, not given */
  dt_adamw_config_t cfg = {.lr = 0.1, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8};
  dt_adamw_t opt;
  DT_ASSERT_OK(dt_adamw_create(&cfg, 1, &v, &opt));
  dt_tensor_t ea;
  DT_ASSERT_OK(dt_adamw_state(opt, 0, &ea, NULL, NULL));
  DT_ASSERT_STATUS(dt_tensor_destroy(ea), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_adamw_step(opt, 0.1));
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  EXPECT_MSG(dt_adamw_destroy(opt), DT_ERR_INVALID_USAGE, "not a live optimizer");
  DT_ASSERT_STATUS(dt_adamw_step(opt, 0.1), DT_ERR_INVALID_USAGE);
  /* an optimizer over a destroyed parameter refuses to step */
  DT_ASSERT_OK(dt_adamw_create(&cfg, 1, &v, &opt));
  DT_ASSERT_OK(dt_var_destroy(v));
  DT_ASSERT_STATUS(dt_adamw_step(opt, 0.1), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_adamw_destroy(opt));
  DT_ASSERT_OK(dt_tape_destroy(tape));
}

static void modules_and_data(dt_mesh_t m) {
  dt_module_t root, child;
  DT_ASSERT_OK(dt_module_create("root", NULL, NULL, &root));
  DT_ASSERT_OK(dt_module_create("child", NULL, NULL, &child));
  DT_ASSERT_OK(dt_module_add_child(root, child));
  EXPECT_MSG(dt_module_destroy(child), DT_ERR_INVALID_USAGE, "child of");
  DT_ASSERT_OK(dt_module_destroy(root));
  EXPECT_MSG(dt_module_destroy(root), DT_ERR_INVALID_USAGE, "not a live module");
  DT_ASSERT_STATUS(dt_module_destroy(child), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(dt_module_name(root) == NULL, "name of a destroyed module");

  dt_corpus_t c;
  DT_ASSERT_OK(dt_corpus_markov(16, 1, 1000, 7, &c));
  DT_ASSERT_EQ(dt_corpus_vocab(c), 16);
  DT_ASSERT_OK(dt_corpus_destroy(c));
  EXPECT_MSG(dt_corpus_destroy(c), DT_ERR_INVALID_USAGE, "not a live corpus");
  DT_ASSERT_EQ(dt_corpus_vocab(c), 0);

  dt_llama_config_t cfg = {.dim = 16, .n_layers = 1, .n_heads = 2, .vocab = 16, .seq_len = 8};
  dt_llama_t model;
  DT_ASSERT_OK(dt_llama_create(m, &cfg, NULL, &model));
  DT_ASSERT_OK(dt_llama_destroy(model));
  EXPECT_MSG(dt_llama_destroy(model), DT_ERR_INVALID_USAGE, "not a live model");
  dt_module_t r;
  DT_ASSERT_STATUS(dt_llama_module(model, &r), DT_ERR_INVALID_USAGE);
}

/* The registry for code built on the library. */
static const dt_handle_kind_t kWidget = {"widget"};
static const dt_handle_kind_t kGadget = {"gadget"};

static void registry(void) {
  int* obj = malloc(sizeof *obj);
  DT_ASSERT_OK(dt_handle_register(obj, &kWidget));
  DT_ASSERT_STATUS(dt_handle_register(obj, &kWidget), DT_ERR_INVALID_USAGE);
  DT_ASSERT_OK(dt_handle_check(obj, &kWidget, "w"));
  EXPECT_MSG(dt_handle_check(obj, &kGadget, "w"), DT_ERR_INVALID_ARG, "is a widget");
  DT_ASSERT_TRUE(dt_handle_is_live(obj, &kWidget), "live");
  DT_ASSERT_OK(dt_handle_unregister(obj, &kWidget, "w"));
  DT_ASSERT_TRUE(!dt_handle_is_live(obj, &kWidget), "dead after unregister");
  EXPECT_MSG(dt_handle_unregister(obj, &kWidget, "w"), DT_ERR_INVALID_USAGE, "destroyed");
  dt_handle_free(obj);
  DT_ASSERT_STATUS(dt_handle_check(NULL, &kWidget, "w"), DT_ERR_INVALID_ARG);
  /* many live handles and destroys (the table grows and erases without losing any) */
  enum { K = 20000 };
  int** many = malloc(sizeof(int*) * K);
  for (int i = 0; i < K; i++) {
    many[i] = malloc(sizeof(int));
    DT_ASSERT_OK(dt_handle_register(many[i], &kGadget));
  }
  for (int i = 0; i < K; i += 2) {
    DT_ASSERT_OK(dt_handle_unregister(many[i], &kGadget, "g"));
    dt_handle_free(many[i]);
  }
  for (int i = 1; i < K; i += 2) {
    DT_ASSERT_OK(dt_handle_check(many[i], &kGadget, "g"));
    DT_ASSERT_OK(dt_handle_unregister(many[i], &kGadget, "g"));
    dt_handle_free(many[i]);
  }
  free(many);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  int shape[1] = {world};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &m));
  plans(m);
  meshes();
  tensors(m);
  works(m);
  autograd(m);
  modules_and_data(m);
  registry();
  DT_ASSERT_OK(dt_mesh_destroy(m));
  int rank = dt_test_rank();
  DT_ASSERT_OK(dt_finalize());
  if (rank == 0) printf("test_handles: ok\n");
  return 0;
}
