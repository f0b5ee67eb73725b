/* test_collective_errors.c - a bad argument that only one rank can see must still fail the
 * collective call on every rank instead of leaving the others blocked in a collective (np 2, 4).
 *
 * dt_tensor_distribute reads `full` on src_rank only and documents that other ranks may pass NULL,
 * so a NULL `full` on the source rank is an error that only the source can detect. Every rank
 * must return an error (the source DT_ERR_INVALID_ARG, the others DT_ERR_INVALID_ARG or
 * DT_ERR_REMOTE), with no tensor, and the mesh must stay usable. A watchdog turns a hang into a
 * prompt failure. dt_tensor_from_local with an inferred global shape is checked the same way.
 *
 * Then errors that depend on one rank's own data or buffer (stages 9..): a too-small output
 * buffer passed to dt_tensor_gather_full on one rank only, an embedding index and a
 * cross-entropy target out of range in the shard of one rank of a batch-sharded input. Every rank
 * must return the same status (the failing rank its own message, the others one naming it), and
 * the next collective must work on every rank.
 */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "dt_test.h"

static volatile sig_atomic_t g_stage;

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] =
      "test_collective_errors: watchdog fired: a rank is blocked in a collective after another "
      "rank returned an error (stage ";
  ssize_t w = write(2, msg, sizeof msg - 1);
  char d[3] = {(char)('0' + g_stage % 10), ')', '\n'};
  w = write(2, d, 3);
  (void)w;
  _exit(3);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank, world;
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_world_size(&world));
  signal(SIGALRM, on_alarm);
  alarm(20);

  int shape1[1] = {world};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, shape1, NULL, NULL, &m));
  int64_t shape[2] = {world + 3, 2};
  int64_t n = shape[0] * shape[1];
  float* full = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) full[i] = (float)(i + 1);
  const dt_placement_t pls[3][1] = {{dt_shard(0)}, {dt_replicate()}, {dt_shard(1)}};

  /* stage 1..: NULL full on the source rank (every source, several placements) */
  for (int src = 0; src < world; src++)
    for (int k = 0; k < 3; k++) {
      g_stage = 1 + k;
      dt_tensor_t t = (dt_tensor_t)(void*)full; /* non-NULL junk: must be cleared */
      dt_clear_error();
      dt_status_t st = dt_tensor_distribute(m, DT_F32, 2, shape, pls[k], NULL, src, &t);
      if (rank == src)
        DT_ASSERT_STATUS(st, DT_ERR_INVALID_ARG);
      else
        DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG || st == DT_ERR_REMOTE,
                       "non-source rank got %s for a NULL full on rank %d", dt_status_name(st),
                       src);
      DT_ASSERT_TRUE(t == NULL, "out not cleared");
      DT_ASSERT_TRUE(strlen(dt_last_error()) > 0, "no message");
    }

  /* the mesh is still usable: a real distribute and full */
  g_stage = 7;
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_distribute(m, DT_F32, 2, shape, pls[0], rank == 0 ? full : NULL, 0, &t));
  float* back = malloc(sizeof(float) * (size_t)n);
  DT_ASSERT_OK(dt_tensor_gather_full(t, back, sizeof(float) * (size_t)n));
  for (int64_t i = 0; i < n; i++) DT_ASSERT_TRUE(back[i] == full[i], "element %lld", (long long)i);
  DT_ASSERT_OK(dt_tensor_destroy(t));

  /* stage 8: from_local with an inferred shape: uneven shards fail on every rank, then an even
   * one works (the inference is a collective; ranks must stay in step) */
  g_stage = 8;
  int me = rank;
  int64_t c = (shape[0] + world - 1) / world, s = c * me, e = s + c < shape[0] ? s + c : shape[0];
  int64_t lshape[2] = {e > s ? e - s : 0, 2};
  t = (dt_tensor_t)(void*)full;
  DT_ASSERT_STATUS(dt_tensor_from_local(m, DT_F32, 2, NULL, pls[0], full, lshape, &t),
                   DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(t == NULL, "out not cleared");
  int64_t even[2] = {2, 2};
  DT_ASSERT_OK(dt_tensor_from_local(m, DT_F32, 2, NULL, pls[0], full, even, &t));
  DT_ASSERT_OK(dt_tensor_destroy(t));

  /* stage 9: one rank's buffer is too small for dt_tensor_gather_full */
  for (int bad = 0; bad < world; bad++) {
    g_stage = 9;
    DT_ASSERT_OK(dt_tensor_distribute(m, DT_F32, 2, shape, pls[0], rank == 0 ? full : NULL, 0, &t));
    size_t cap = sizeof(float) * (size_t)n - (rank == bad ? sizeof(float) : 0);
    dt_clear_error();
    DT_ASSERT_STATUS(dt_tensor_gather_full(t, back, cap), DT_ERR_INVALID_ARG);
    if (rank != bad)
      DT_ASSERT_TRUE(strstr(dt_last_error(), "on rank") != NULL, "message '%s' names no rank",
                     dt_last_error());
    memset(back, 0, sizeof(float) * (size_t)n);
    DT_ASSERT_OK(dt_tensor_gather_full(t, back, sizeof(float) * (size_t)n));
    for (int64_t i = 0; i < n; i++) DT_ASSERT_TRUE(back[i] == full[i], "element %lld", (long long)i);
    DT_ASSERT_OK(dt_tensor_destroy(t));
  }

  /* stages 10, 11: an index out of range in the last rank's shard of a batch-sharded input */
  {
    const int64_t V = 5, D = 3, B = 2 * world;
    int64_t wshape[2] = {V, D}, bshape[1] = {B}, lshape2[2] = {B, V};
    dt_placement_t rep[1] = {dt_replicate()}, s0[1] = {dt_shard(0)};
    dt_tensor_t w, ids, logits, out = NULL;
    DT_ASSERT_OK(dt_tensor_arange(m, DT_F32, 2, wshape, rep, 0.0, 1.0, &w));
    int64_t* idv = malloc(sizeof(int64_t) * (size_t)B);
    for (int64_t i = 0; i < B; i++) idv[i] = i % V;
    idv[B - 1] = V + 7; /* held by the last rank only */
    DT_ASSERT_OK(dt_tensor_from_full(m, DT_I64, 1, bshape, s0, idv, &ids));
    DT_ASSERT_OK(dt_tensor_arange(m, DT_F32, 2, lshape2, s0, 0.0, 0.25, &logits));
    g_stage = 10;
    dt_tensor_t in[2] = {w, ids};
    dt_clear_error();
    DT_ASSERT_STATUS(dt_op_run("embedding", 2, in, 0, NULL, 0, NULL, &out), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(out == NULL, "no output after a failure");
    DT_ASSERT_TRUE(strstr(dt_last_error(), rank == world - 1 ? "out of range" : "on rank") != NULL,
                   "message '%s'", dt_last_error());
    g_stage = 11;
    dt_clear_error();
    DT_ASSERT_STATUS(dt_cross_entropy(logits, ids, DT_LOSS_MEAN, &out), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(out == NULL, "no loss after a failure");
    /* class-sharded logits (loss parallel) with replicated targets, one out of range */
    g_stage = 13;
    dt_placement_t s1[1] = {dt_shard(1)};
    dt_tensor_t lc, tr;
    DT_ASSERT_OK(dt_tensor_arange(m, DT_F32, 2, lshape2, s1, 0.0, 0.25, &lc));
    idv[0] = -2;
    DT_ASSERT_OK(dt_tensor_from_full(m, DT_I64, 1, bshape, rep, idv, &tr));
    dt_clear_error();
    DT_ASSERT_STATUS(dt_cross_entropy(lc, tr, DT_LOSS_MEAN, &out), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(out == NULL, "no loss after a failure");
    dt_tensor_destroy(tr);
    dt_tensor_destroy(lc);
    idv[0] = 0;
    /* the ranks are in step: the next collective works everywhere */
    g_stage = 12;
    idv[B - 1] = 1;
    dt_tensor_t good;
    DT_ASSERT_OK(dt_tensor_from_full(m, DT_I64, 1, bshape, s0, idv, &good));
    DT_ASSERT_OK(dt_cross_entropy(logits, good, DT_LOSS_MEAN, &out));
    float loss;
    DT_ASSERT_OK(dt_tensor_gather_full(out, &loss, sizeof loss));
    DT_ASSERT_TRUE(loss > 0.0f, "loss %g", (double)loss);
    dt_tensor_destroy(out);
    dt_tensor_destroy(good);
    dt_tensor_destroy(logits);
    dt_tensor_destroy(ids);
    dt_tensor_destroy(w);
    free(idv);
  }

  alarm(0);
  free(full);
  free(back);
  DT_ASSERT_OK(dt_mesh_destroy(m));
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("test_collective_errors: passed on %d ranks\n", world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}
