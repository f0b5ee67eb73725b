/* test_tape_warn.c - a tape that is never reset says so once (np 1 and 2).
 *
 * The thresholds come from DTENSOR_TAPE_WARN_NODES and DTENSOR_TAPE_WARN_MB, read when a tape is
 * created (include/dtensor/autograd.h). stderr is captured into a file around each case and the
 * "[dtensor tape] warning" lines counted:
 *  - nodes threshold 50, 200 recorded ops without a reset: exactly one warning on rank 0 (none
 *    on the other ranks), naming the variable, its value and dt_tape_reset; a second tape warns
 *    once on its own; recording more after dt_tape_reset on the warned tape adds nothing;
 *  - the same 200 ops with a reset every 20: no warning;
 *  - a threshold of 0 (off), or a value that is not a non-negative integer (the default, a million
 *    nodes): no warning;
 *  - bytes threshold 1 MiB, nodes off: ops with 256 KiB outputs warn once, after the fifth
 *    (dt_tape_stats then reports more than 1 MiB held), naming DTENSOR_TAPE_WARN_MB; values
 *    dropped by dt_tape_drop count no more, so 4 MiB recorded but only the latest output kept
 *    stays silent, and recomputing them (dt_tape_restore) counts them again: one warning.
 */
#define _POSIX_C_SOURCE 200809L /* setenv, mkstemp, dup2 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_test.h"

static int g_rank;
static dt_mesh_t g_mesh;

/* stderr into a temporary file while a case runs; the file's text afterwards. */
static int g_saved_fd = -1;
static char g_path[64];

static void capture_begin(void) {
  fflush(stderr);
  snprintf(g_path, sizeof g_path, "/tmp/dt_tape_warn_%d_XXXXXX", (int)getpid());
  int fd = mkstemp(g_path);
  DT_ASSERT_TRUE(fd >= 0, "mkstemp %s", g_path);
  g_saved_fd = dup(2);
  DT_ASSERT_TRUE(g_saved_fd >= 0 && dup2(fd, 2) >= 0, "redirecting stderr");
  close(fd);
}

/* Ends the capture; returns the number of growth warnings seen and copies the text to log. */
static int capture_end(char* log, size_t cap) {
  fflush(stderr);
  dup2(g_saved_fd, 2);
  close(g_saved_fd);
  g_saved_fd = -1;
  FILE* f = fopen(g_path, "r");
  DT_ASSERT_TRUE(f != NULL, "reading %s", g_path);
  size_t n = fread(log, 1, cap - 1, f);
  log[n] = '\0';
  fclose(f);
  unlink(g_path);
  int count = 0;
  for (const char* p = log; (p = strstr(p, "[dtensor tape] warning")) != NULL; p++) count++;
  return count;
}

/* A leaf x (n elements) and `ops` recorded scale ops on it, the tape reset every `reset_every`
 * ops (0: never). */
static void record(dt_tape_t tape, int64_t n, int ops, int reset_every) {
  dt_placement_t r = dt_replicate();
  dt_tensor_t t;
  dt_var_t x, y;
  DT_ASSERT_OK(dt_tensor_ones(g_mesh, DT_F32, 1, &n, &r, &t));
  DT_ASSERT_OK(dt_var_leaf(t, 1, &x));
  const double two[1] = {2.0};
  y = x;
  for (int i = 0; i < ops; i++) {
    DT_ASSERT_OK(dt_ag_op(tape, "mul_scalar", 1, &y, 0, NULL, 1, two, 1, &y));
    if (reset_every > 0 && (i + 1) % reset_every == 0) {
      DT_ASSERT_OK(dt_tape_reset(tape));
      y = x;
    }
  }
  DT_ASSERT_OK(dt_tape_reset(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
}

static void set_env(const char* nodes, const char* mb) {
  if (nodes) setenv("DTENSOR_TAPE_WARN_NODES", nodes, 1);
  else unsetenv("DTENSOR_TAPE_WARN_NODES");
  if (mb) setenv("DTENSOR_TAPE_WARN_MB", mb, 1);
  else unsetenv("DTENSOR_TAPE_WARN_MB");
}

static char g_log[1 << 16];

static void test_nodes(void) {
  set_env("50", NULL);
  dt_tape_t a, b;
  DT_ASSERT_OK(dt_tape_create(&a));
  DT_ASSERT_OK(dt_tape_create(&b));
  capture_begin();
  record(a, 4, 200, 0);
  int once = capture_end(g_log, sizeof g_log);
  DT_ASSERT_EQ(once, g_rank == 0 ? 1 : 0);
  if (g_rank == 0) {
    DT_ASSERT_TRUE(strstr(g_log, "DTENSOR_TAPE_WARN_NODES=50") && strstr(g_log, "dt_tape_reset") &&
                   strstr(g_log, "51 recorded nodes"), "the warning: %s", g_log);
    fprintf(stdout, "nodes: %s", g_log);
  }
  capture_begin();
  record(a, 4, 200, 0); /* the same tape again: said once already */
  record(b, 4, 200, 0); /* another tape: once on its own */
  DT_ASSERT_EQ(capture_end(g_log, sizeof g_log), g_rank == 0 ? 1 : 0);
  DT_ASSERT_OK(dt_tape_destroy(a));
  DT_ASSERT_OK(dt_tape_destroy(b));
  /* reset every 20 ops: never past 50 */
  DT_ASSERT_OK(dt_tape_create(&a));
  capture_begin();
  record(a, 4, 200, 20);
  DT_ASSERT_EQ(capture_end(g_log, sizeof g_log), 0);
  DT_ASSERT_OK(dt_tape_destroy(a));
  /* off, and not a count (the default: a million nodes) */
  const char* quiet[3] = {"0", "abc", "-5"};
  for (int i = 0; i < 3; i++) {
    set_env(quiet[i], "0");
    DT_ASSERT_OK(dt_tape_create(&a));
    capture_begin();
    record(a, 4, 200, 0);
    DT_ASSERT_EQ(capture_end(g_log, sizeof g_log), 0);
    DT_ASSERT_OK(dt_tape_destroy(a));
  }
}

static void test_bytes(void) {
  set_env("0", "1");
  dt_tape_t a;
  DT_ASSERT_OK(dt_tape_create(&a));
  const int64_t n = 65536; /* 256 KiB of f32 per output */
  dt_placement_t r = dt_replicate();
  dt_tensor_t t;
  dt_var_t x, y;
  DT_ASSERT_OK(dt_tensor_ones(g_mesh, DT_F32, 1, &n, &r, &t));
  DT_ASSERT_OK(dt_var_leaf(t, 1, &x));
  const double two[1] = {2.0};
  /* dropped values do not count: 16 outputs (4 MiB) recorded, one held at a time */
  capture_begin();
  y = x;
  for (int i = 0; i < 16; i++) {
    dt_var_t prev = y;
    DT_ASSERT_OK(dt_ag_op(a, "mul_scalar", 1, &y, 0, NULL, 1, two, 1, &y));
    if (prev != x) DT_ASSERT_OK(dt_tape_drop(a, prev));
  }
  DT_ASSERT_EQ(capture_end(g_log, sizeof g_log), 0);
  int64_t nodes, held;
  DT_ASSERT_OK(dt_tape_stats(a, &nodes, &held));
  DT_ASSERT_TRUE(nodes == 16 && held == 4 * n, "%lld nodes, %lld bytes held",
                 (long long)nodes, (long long)held);
  DT_ASSERT_OK(dt_tape_reset(a));
  /* kept: the fifth output takes the tape past 1 MiB */
  capture_begin();
  y = x;
  int at = -1;
  for (int i = 0; i < 8; i++) {
    DT_ASSERT_OK(dt_ag_op(a, "mul_scalar", 1, &y, 0, NULL, 1, two, 1, &y));
    fflush(stderr);
    if (at < 0 && g_rank == 0) {
      FILE* f = fopen(g_path, "r");
      DT_ASSERT_TRUE(f != NULL, "reading %s", g_path);
      size_t k = fread(g_log, 1, sizeof g_log - 1, f);
      g_log[k] = '\0';
      fclose(f);
      if (strstr(g_log, "[dtensor tape] warning")) at = i + 1;
    }
  }
  int count = capture_end(g_log, sizeof g_log);
  DT_ASSERT_EQ(count, g_rank == 0 ? 1 : 0);
  if (g_rank == 0) {
    DT_ASSERT_EQ(at, 5);
    DT_ASSERT_TRUE(strstr(g_log, "DTENSOR_TAPE_WARN_MB=1") &&
                   strstr(g_log, "5 recorded nodes and 1.2 MiB"), "the warning: %s", g_log);
    fprintf(stdout, "bytes: %s", g_log);
  }
  DT_ASSERT_OK(dt_tape_stats(a, &nodes, &held));
  DT_ASSERT_TRUE(held == 8 * 4 * n, "%lld bytes held", (long long)held);
  DT_ASSERT_OK(dt_tape_destroy(a));
  /* values brought back count again: 16 outputs recorded, 15 dropped, then recomputed (the 15th
   * restored, its inputs first: the fifth value back crosses 1 MiB) */
  DT_ASSERT_OK(dt_tape_create(&a));
  dt_var_t outs[16];
  y = x;
  for (int i = 0; i < 16; i++) {
    DT_ASSERT_OK(dt_ag_op(a, "mul_scalar", 1, &y, 0, NULL, 1, two, 1, &y));
    outs[i] = y;
    if (i > 0) DT_ASSERT_OK(dt_tape_drop(a, outs[i - 1]));
  }
  capture_begin();
  DT_ASSERT_OK(dt_tape_restore(a, outs[14]));
  count = capture_end(g_log, sizeof g_log);
  DT_ASSERT_EQ(count, g_rank == 0 ? 1 : 0);
  if (g_rank == 0)
    DT_ASSERT_TRUE(strstr(g_log, "16 recorded nodes and 1.2 MiB"), "the warning: %s", g_log);
  DT_ASSERT_OK(dt_tape_stats(a, &nodes, &held));
  DT_ASSERT_TRUE(held == 16 * 4 * n, "%lld bytes held", (long long)held);
  DT_ASSERT_OK(dt_tape_destroy(a));
  DT_ASSERT_OK(dt_var_destroy(x));
  set_env(NULL, NULL);
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &g_mesh));
  test_nodes();
  test_bytes();
  DT_ASSERT_OK(dt_mesh_destroy(g_mesh));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_tape_warn: ok\n");
  return 0;
}
