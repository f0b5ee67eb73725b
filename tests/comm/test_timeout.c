/* test_timeout.c - a rank that stops must not leave the others blocked forever: with
 * DTENSOR_TIMEOUT_S set short, the last rank skips a redistribution and sleeps while the others
 * run it, and every other rank must give up at the deadline with a message naming the collective,
 * the mesh dim and the plan step. Run by tests/comm/timeout.sh (which starts mpirun, times it
 * and checks the output); the mode is argv[1]:
 *   abort   no handler: the survivors report and abort the job (MPI_Abort); nothing returns.
 *   return  a handler returning DT_TIMEOUT_RETURN: dt_tensor_redistribute returns DT_ERR_TIMEOUT
 *           on every survivor, within the deadline plus a margin, with the message.
 *   async   the same through dt_tensor_redistribute_async + dt_work_wait.
 * A survivor that has checked its result prints "test_timeout: rank R ok" and leaves with
 * _exit(0) (after a timeout the communicators are unusable: no dt_finalize).
 */
#define _POSIX_C_SOURCE 200809L
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dt_test.h"

typedef struct {
  int calls;
  char msg[640];
} handler_state_t;

static int on_timeout(const char* message, void* ctx) {
  handler_state_t* h = (handler_state_t*)ctx;
  h->calls++;
  snprintf(h->msg, sizeof h->msg, "%s", message);
  return DT_TIMEOUT_RETURN;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(cond, ...)                                                          \
  do {                                                                            \
    if (!(cond)) {                                                                \
      fprintf(stderr, "test_timeout: rank %d FAILED: %s: ", rank, #cond);         \
      fprintf(stderr, __VA_ARGS__);                                               \
      fprintf(stderr, "\n");                                                      \
      fflush(stderr);                                                             \
      _exit(1);                                                                   \
    }                                                                             \
  } while (0)

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "abort";
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int rank, world;
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_world_size(&world));
  double limit;
  DT_ASSERT_OK(dt_get_timeout(&limit));
  handler_state_t h = {0, ""};
  if (strcmp(mode, "abort") != 0) DT_ASSERT_OK(dt_set_timeout_handler(on_timeout, &h));
  int async = strcmp(mode, "async") == 0;

  int mshape[1] = {world};
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, mshape, NULL, NULL, &mesh));
  int64_t shape[2] = {2 * world, 4};
  dt_placement_t s0 = dt_shard(0), r = dt_replicate();
  dt_tensor_t x, y = NULL;
  DT_ASSERT_OK(dt_tensor_ones(mesh, DT_F32, 2, shape, &s0, &x));
  if (async) { /* every rank: the mesh's dedicated communicators now exist */
    dt_work_t w;
    DT_ASSERT_OK(dt_tensor_redistribute_async(x, &r, &y, &w));
    DT_ASSERT_OK(dt_work_wait(w));
    DT_ASSERT_OK(dt_work_destroy(w));
    DT_ASSERT_OK(dt_tensor_destroy(y));
    y = NULL;
  }

  if (rank == world - 1) { /* the straggler: never joins; killed by the abort or by mpirun */
    fprintf(stderr, "test_timeout: rank %d stops\n", rank);
    for (int i = 0; i < 60; i++) sleep(1);
    _exit(0);
  }

  double t0 = now_s();
  dt_status_t st;
  if (async) {
    dt_work_t w;
    st = dt_tensor_redistribute_async(x, &r, &y, &w);
    CHECK(st == DT_SUCCESS, "start: %s", dt_last_error());
    st = dt_work_wait(w);
  } else {
    st = dt_tensor_redistribute(x, &r, &y);
  }
  double waited = now_s() - t0;
  CHECK(strcmp(mode, "abort") != 0, "returned %s after %.2f s instead of aborting the job",
        dt_status_name(st), waited);
  CHECK(st == DT_ERR_TIMEOUT, "status %s", dt_status_name(st));
  CHECK(waited >= limit && waited < limit + 3.0, "returned after %.2f s (timeout %g s)", waited,
        limit);
  CHECK(h.calls == 1, "handler called %d times", h.calls);
  const char* want = "DT_ERR_TIMEOUT: all_gather (mesh dim 0, step 1/1 S(0)->R)";
  CHECK(strstr(h.msg, want) != NULL, "handler message \"%s\"", h.msg);
  CHECK(strstr(dt_last_error(), want) != NULL, "last error \"%s\"", dt_last_error());
  printf("test_timeout: rank %d ok: %s after %.2f s\n", rank, dt_status_name(st), waited);
  fflush(stdout);
  _exit(0);
}
