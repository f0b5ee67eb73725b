/* test_nccl_timeout.c - deadlines on the NCCL plane (GPUs only; skipped, exit 77, elsewhere).
 *
 * With DTENSOR_TIMEOUT_S=1 and the communicator's test hook DTENSOR_NCCL_STALL_MS=4000 (the comm
 * stream spins 4 s before each operation: one rank stands for a peer that stopped inside a
 * collective, which np 1 cannot otherwise show, and NCCL refuses two ranks on one GPU), a blocking
 * all-reduce on an NCCL communicator must: call the host's handler once with the library's line
 * ("DT_ERR_TIMEOUT: all_reduce ..."), return DT_ERR_TIMEOUT (the handler returns
 * DT_TIMEOUT_RETURN) within the deadline plus a margin, and leave the communicator aborted, so
 * that the next call fails at once with DT_ERR_NCCL instead of waiting; then the same through a
 * non-blocking all-reduce and its wait on a second communicator. The process then leaves
 * with _exit (after a timeout no collective or dt_finalize may follow).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "comm/comm.h"
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

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  dt_backend_t b = dt__backend_default();
  if (b->kernel_set != DT_KERNELS_CUDA || getenv("DTENSOR_NCCL_STALL_MS") == NULL) {
    printf("SKIP: needs DTENSOR_BACKEND=cuda and DTENSOR_NCCL_STALL_MS (a GPU)\n");
    DT_ASSERT_OK(dt_finalize());
    return 77;
  }
  handler_state_t h = {0, {0}};
  DT_ASSERT_OK(dt_set_timeout(1.0));
  DT_ASSERT_OK(dt_set_timeout_handler(on_timeout, &h));
  dt_comm_t nw;
  DT_ASSERT_OK(dt__comm_nccl_world(b, dt__comm_world(), &nw));
  float* d = (float*)b->iface->alloc(b, 1024 * sizeof(float));
  DT_ASSERT_TRUE(d != NULL, "device alloc");
  DT_ASSERT_OK(b->iface->memset(b, d, 0, 1024 * sizeof(float)));
  double t0 = now_s();
  dt_status_t st = nw.iface->all_reduce(&nw, d, d, 1024, DT_F32, DT_REDUCE_SUM, NULL);
  double took = now_s() - t0;
  DT_ASSERT_TRUE(st == DT_ERR_TIMEOUT, "all_reduce returned %s (%s), expected DT_ERR_TIMEOUT",
                 dt_status_name(st), dt_last_error());
  DT_ASSERT_TRUE(took >= 0.9 && took < 3.5, "the timeout took %.2f s (deadline 1 s)", took);
  DT_ASSERT_TRUE(h.calls == 1, "the handler was called %d times", h.calls);
  DT_ASSERT_TRUE(strstr(h.msg, "DT_ERR_TIMEOUT: all_reduce") != NULL &&
                     strstr(dt_last_error(), "all_reduce") != NULL,
                 "handler message '%s', last error '%s'", h.msg, dt_last_error());
  t0 = now_s();
  st = nw.iface->broadcast(&nw, d, 16, DT_F32, 0, NULL);
  DT_ASSERT_TRUE(st == DT_ERR_NCCL && strstr(dt_last_error(), "aborted") != NULL &&
                     now_s() - t0 < 0.5,
                 "after the timeout: %s (%s)", dt_status_name(st), dt_last_error());
  /* the same through a posted request and its wait (np 1: a second NCCL world is still safe) */
  dt_comm_t nw2;
  DT_ASSERT_OK(dt__comm_nccl_world(b, dt__comm_world(), &nw2));
  dt_comm_req_t rq;
  memset(&rq, 0, sizeof rq);
  DT_ASSERT_OK(nw2.iface->all_reduce(&nw2, d, d, 1024, DT_F32, DT_REDUCE_SUM, &rq));
  t0 = now_s();
  st = nw2.iface->wait(&nw2, &rq);
  double took2 = now_s() - t0;
  DT_ASSERT_TRUE(st == DT_ERR_TIMEOUT && took2 >= 0.9 && took2 < 3.5 && h.calls == 2,
                 "wait on a posted all_reduce: %s after %.2f s, handler calls %d (%s)",
                 dt_status_name(st), took2, h.calls, dt_last_error());
  printf("test_nccl_timeout: DT_ERR_TIMEOUT after %.2f s (blocking) and %.2f s (wait), then "
         "DT_ERR_NCCL at once: ok\n", took, took2);
  fflush(stdout);
  _exit(0);
}
