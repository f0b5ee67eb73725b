#define _POSIX_C_SOURCE 200809L
/* test_op_messages.c - error messages a user meets in the first hour say what they called, what
 * was wrong and what would be valid, and never name the library's internal functions.
 *
 * Each case below is a common bad input; its message must start with the public function called
 * ("dt_op_run: ", "dt_sdpa: ", ...), contain the pieces listed (the argument, the bad value, the
 * valid choice) and no "dt__", while dt_last_error_location() still says where it was recorded.
 * The cases: an unknown op with a PyTorch name (matmul -> mm, max -> amax), typos (sofmax,
 * layer_nrom), a destroyed input, a missing required argument, a dim out of range, a NULL
 * argument array, a mismatched shape through a typed entry point (dt_mm, dt_sdpa), k out of range
 * (dt_topk), too small an output array (dt_split), a two-output op through dt_op_run, a NULL op
 * name, a misspelled argument name (dt_op_args_parse), keepdim out of range, f32 targets for
 * dt_cross_entropy, a second dt_tensor_destroy (no "dt__" even without a scope), and a bad
 * placement seen by dt_op_select (the quoted inner message keeps one entry). Then DTENSOR_DEBUG appends the
 * location, a host function's own DT_FAIL keeps its name, and DT_ENTRY_RETURN names a wrapper. */
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/check.h"

static int g_cases;

/* The message of the failure just returned: starts with `entry`, contains every needle, no
 * internal names; the location is set. */
static void expect(dt_status_t st, dt_status_t want, const char* entry, const char* n1,
                   const char* n2) {
  const char* m = dt_last_error();
  DT_ASSERT_TRUE(st == want, "status %s, expected %s: %s", dt_status_name(st), dt_status_name(want),
                 m);
  DT_ASSERT_TRUE(strncmp(m, entry, strlen(entry)) == 0 && strncmp(m + strlen(entry), ": ", 2) == 0,
                 "message does not start with '%s: ': %s", entry, m);
  DT_ASSERT_TRUE(strstr(m, "dt__") == NULL, "message names an internal function: %s", m);
  DT_ASSERT_TRUE(n1 == NULL || strstr(m, n1) != NULL, "message lacks '%s': %s", n1, m);
  DT_ASSERT_TRUE(n2 == NULL || strstr(m, n2) != NULL, "message lacks '%s': %s", n2, m);
  const char* loc = dt_last_error_location();
  DT_ASSERT_TRUE(loc[0] != '\0' && strstr(loc, ".c:") != NULL, "no location for: %s", m);
  if (getenv("DT_TEST_VERBOSE")) printf("%s\n    [%s]\n", m, loc);
  g_cases++;
}

static dt_tensor_t make(dt_mesh_t mesh, int ndim, const int64_t* shape) {
  dt_placement_t pl[1] = {dt_replicate()};
  float data[256] = {0};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_F32, ndim, shape, pl, data, &t));
  return t;
}

static dt_status_t host_helper(void) { return DT_FAIL(DT_ERR_INVALID_ARG, "n=%d is too big", 9); }

static dt_status_t my_entry(dt_tensor_t x, dt_tensor_t* out) {
  DT_ENTRY_RETURN(dt_op_run("matmul", 1, &x, 0, NULL, 0, NULL, out));
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  const int64_t s46[2] = {4, 6}, s35[2] = {3, 5}, s4[1] = {4};
  dt_tensor_t a = make(mesh, 2, s46), b = make(mesh, 2, s35), v = make(mesh, 1, s4), r = NULL;
  dt_tensor_t in[2] = {a, b};

  /* unknown ops: PyTorch names map, typos get the closest names */
  expect(dt_op_run("matmul", 2, in, 0, NULL, 0, NULL, &r), DT_ERR_UNSUPPORTED, "dt_op_run",
         "unknown op 'matmul'", "'mm'");
  DT_ASSERT_TRUE(strncmp(dt_last_error_location(), "dt__op_resolve (src/strategy/registry.c:",
                         40) == 0, "location: %s", dt_last_error_location());
  expect(dt_op_run("max", 1, &a, 0, NULL, 0, NULL, &r), DT_ERR_UNSUPPORTED, "dt_op_run", "'amax'",
         "maximum");
  expect(dt_op_run("sofmax", 1, &a, 0, NULL, 0, NULL, &r), DT_ERR_UNSUPPORTED, "dt_op_run",
         "did you mean 'softmax'", NULL);
  dt_op_desc_t d;
  expect(dt_op_describe("layer_nrom", &d), DT_ERR_UNSUPPORTED, "dt_op_describe", "'layer_norm'",
         NULL);
  expect(dt_op_run(NULL, 1, &a, 0, NULL, 0, NULL, &r), DT_ERR_INVALID_ARG, "dt_op_run",
         "name is NULL", NULL);
  /* a destroyed input */
  dt_tensor_t dead = make(mesh, 2, s35);
  DT_ASSERT_OK(dt_tensor_destroy(dead));
  dt_tensor_t in2[2] = {a, dead};
  expect(dt_op_run("mm", 2, in2, 0, NULL, 0, NULL, &r), DT_ERR_INVALID_USAGE, "dt_op_run",
         "inputs[1]", "destroyed");
  /* arguments: missing, out of range, NULL arrays, misspelled */
  expect(dt_op_run("softmax", 1, &a, 0, NULL, 0, NULL, &r), DT_ERR_INVALID_ARG, "dt_op_run",
         "softmax takes iargs [dim]", "n_iargs=0, expected 1");
  const int64_t bad_dim[2] = {0, 5};
  expect(dt_op_run("sum", 1, &a, 2, bad_dim, 0, NULL, &r), DT_ERR_INVALID_ARG, "dt_op_run",
         "dim=5", "valid: -2 to 1");
  const int64_t keep2[1] = {2};
  expect(dt_op_run("mean", 1, &a, 1, keep2, 0, NULL, &r), DT_ERR_INVALID_ARG, "dt_op_run",
         "keepdim=2", "expected 0 or 1");
  expect(dt_op_run("add", 2, (dt_tensor_t[2]){a, a}, 2, NULL, 0, NULL, &r), DT_ERR_INVALID_ARG,
         "dt_op_run", "iargs is NULL", "n_iargs=2");
  int ni, nf;
  int64_t iv[DT_OP_MAX_IARGS];
  double fv[DT_OP_MAX_FARGS];
  const char* axis[1] = {"axis=1"};
  expect(dt_op_args_parse("sum", 1, axis, &ni, iv, &nf, fv), DT_ERR_INVALID_ARG,
         "dt_op_args_parse", "'axis'", "keepdim, dim");
  /* typed entry points name themselves */
  expect(dt_mm(a, b, &r), DT_ERR_INVALID_ARG, "dt_mm", "mm", NULL);
  expect(dt_sdpa(a, a, a, 0, 0.0, &r), DT_ERR_INVALID_ARG, "dt_sdpa", "4-dim", NULL);
  dt_tensor_t tv, ti;
  expect(dt_topk(a, 9, 1, &tv, &ti), DT_ERR_INVALID_ARG, "dt_topk", "k=9", "[0, 6]");
  dt_tensor_t parts[2];
  int np;
  expect(dt_split(a, 1, 1, parts, 2, &np), DT_ERR_INVALID_ARG, "dt_split", "cap=2", NULL);
  const int64_t kd[2] = {2, 1};
  expect(dt_op_run("topk", 1, &a, 2, kd, 0, NULL, &r), DT_ERR_INVALID_ARG, "dt_op_run",
         "n_outputs=1, expected 2", "dt_op_run_multi");
  expect(dt_mm(v, v, &r), DT_ERR_INVALID_ARG, "dt_mm", NULL, NULL);
  /* a composite names itself; a destroyed tensor given to an entry point that opens no scope of
   * its own still names no internal function */
  dt_tensor_t tf = make(mesh, 1, s4);
  expect(dt_cross_entropy(a, tf, DT_LOSS_MEAN, &r), DT_ERR_INVALID_ARG, "dt_cross_entropy",
         "f32 targets", NULL);
  DT_ASSERT_OK(dt_tensor_destroy(tf));
  DT_ASSERT_STATUS(dt_tensor_destroy(dead), DT_ERR_INVALID_USAGE);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "dt__") == NULL && strstr(dt_last_error(), "destroyed"),
                 "%s", dt_last_error());
  /* a message quoting an inner one keeps a single entry */
  int shape1[1] = {2};
  dt_mesh_t am;
  DT_ASSERT_OK(dt_mesh_create_abstract(1, shape1, NULL, &am));
  dt_op_call_t c;
  memset(&c, 0, sizeof c);
  c.op = "relu";
  c.n_inputs = 1;
  c.in[0].dtype = DT_F32;
  c.in[0].ndim = 2;
  c.in[0].shape[0] = 4;
  c.in[0].shape[1] = 4;
  dt_placement_t pl[1][DT_MAX_MESH_DIMS] = {{dt_shard(5)}};
  dt_op_choice_t ch;
  expect(dt_op_select(am, &c, (const dt_placement_t(*)[DT_MAX_MESH_DIMS])pl, &ch),
         DT_ERR_INVALID_ARG, "dt_op_select", "input 0", NULL);
  const char* m = dt_last_error();
  DT_ASSERT_TRUE(strstr(m + 1, "dt_op_select") == NULL, "entry repeated: %s", m);
  DT_ASSERT_OK(dt_mesh_destroy(am));
  DT_ASSERT_TRUE(r == NULL, "a failed call returned a tensor");

  /* DTENSOR_DEBUG appends the location */
  setenv("DTENSOR_DEBUG", "errors", 1);
  DT_ASSERT_STATUS(dt_op_run("matmul", 2, in, 0, NULL, 0, NULL, &r), DT_ERR_UNSUPPORTED);
  DT_ASSERT_TRUE(strstr(dt_last_error(), " (at dt__op_resolve, src/strategy/registry.c:") != NULL,
                 "no location in debug mode: %s", dt_last_error());
  unsetenv("DTENSOR_DEBUG");
  /* without an open scope a host function keeps its own name; a wrapper can name itself */
  DT_ASSERT_STATUS(host_helper(), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strcmp(dt_last_error(), "host_helper: n=9 is too big") == 0, "%s",
                 dt_last_error());
  expect(my_entry(a, &r), DT_ERR_UNSUPPORTED, "my_entry", "'mm'", NULL);
  dt_clear_error();
  DT_ASSERT_TRUE(dt_last_error()[0] == '\0' && dt_last_error_location()[0] == '\0', "not cleared");

  if (dt_test_rank() == 0) printf("test_op_messages: %d messages checked\n", g_cases);
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  DT_ASSERT_OK(dt_tensor_destroy(v));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}
