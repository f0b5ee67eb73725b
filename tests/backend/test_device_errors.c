/* test_device_errors.c - a device backend's bad input and failures (np 2; on cuda-emu, and on cuda
 * where a GPU is usable: $DT_DEVICE_BACKEND names it, default cuda-emu; exit 77 when it cannot be
 * opened here).
 *
 * - A device tensor and a cpu tensor in one op: DT_ERR_INVALID_ARG naming both devices and
 *   backends; nothing is computed, both tensors stay usable.
 * - Asking for "cuda" where no GPU or driver is usable (or in a build without CUDA) is a clear
 *   error at that call (DT_ERR_CUDA or DT_ERR_UNSUPPORTED with a message), "cuda:abc" and
 *   "cuda:-1" are DT_ERR_INVALID_ARG, and the CPU paths are unaffected afterwards.
 * - Out of device memory (the allocator capped with $DTENSOR_CUDA_MAX_MB before the backend is
 *   opened): a tensor that does not fit is DT_ERR_OUT_OF_MEMORY on every rank (every rank asks
 *   for the same size), an op whose output does not fit likewise, with nothing lost: the tensors
 *   made before keep their values, smaller work goes on, and every byte comes back (the
 *   backend's live bytes return to where they started).
 * - Device tensors round-trip through the local-transfer API and redistribute (host-staged) to
 *   the same values as on the cpu backend.
 */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"

static int g_rank, g_world;

static void test_mixed_devices(dt_mesh_t dev, dt_mesh_t cpu) {
  dt_placement_t r[1] = {dt_replicate()};
  const int64_t shape[2] = {4, 6};
  dt_tensor_t a, b, c = NULL;
  DT_ASSERT_OK(dt_tensor_arange(dev, DT_F32, 2, shape, r, 0.0, 1.0, &a));
  DT_ASSERT_OK(dt_tensor_ones(cpu, DT_F32, 2, shape, r, &b));
  dt_tensor_t in[2] = {a, b};
  dt_status_t st = dt_op_run("add", 2, in, 0, NULL, 0, NULL, &c);
  DT_ASSERT_STATUS(st, DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(c == NULL, "a refused op returned a tensor");
  const char* msg = dt_last_error();
  DT_ASSERT_TRUE(strstr(msg, "cuda") && strstr(msg, "host") && strstr(msg, "cpu"),
                 "the message names both devices and backends: %s", msg);
  /* on one mesh whose backend changed between the two tensors */
  dt_backend_t be, cpu_be;
  DT_ASSERT_OK(dt_mesh_backend(dev, &be));
  DT_ASSERT_OK(dt_mesh_backend(cpu, &cpu_be));
  dt_tensor_t h;
  DT_ASSERT_OK(dt_mesh_set_backend(dev, cpu_be));
  DT_ASSERT_OK(dt_tensor_ones(dev, DT_F32, 2, shape, r, &h));
  DT_ASSERT_OK(dt_mesh_set_backend(dev, be));
  in[1] = h;
  DT_ASSERT_STATUS(dt_op_run("mul", 2, in, 0, NULL, 0, NULL, &c), DT_ERR_INVALID_ARG);
  msg = dt_last_error();
  DT_ASSERT_TRUE(strstr(msg, "cuda") && strstr(msg, "host") && strstr(msg, "cpu"),
                 "the message names both devices and backends: %s", msg);
  DT_ASSERT_OK(dt_tensor_destroy(h));
  /* both stay usable */
  float got[24];
  DT_ASSERT_OK(dt_tensor_gather_full(a, got, sizeof got));
  for (int i = 0; i < 24; i++) DT_ASSERT_EQ(got[i], i);
  DT_ASSERT_OK(dt_tensor_gather_full(b, got, sizeof got));
  DT_ASSERT_EQ(got[23], 1);
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
}

static void test_no_gpu_names(void) {
  dt_backend_t b = NULL;
  DT_ASSERT_STATUS(dt_backend_get("cuda:abc", &b), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_backend_get("cuda:-1", &b), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_backend_get("tpu", &b), DT_ERR_UNSUPPORTED);
  dt_status_t st = dt_backend_get("cuda", &b);
  if (st != DT_SUCCESS) { /* no GPU here: a clear error, nothing else changes */
    DT_ASSERT_TRUE(st == DT_ERR_CUDA || st == DT_ERR_UNSUPPORTED, "cuda: %s",
                   dt_status_name(st));
    DT_ASSERT_TRUE(b == NULL && strlen(dt_last_error()) > 20, "cuda: '%s'", dt_last_error());
    if (g_rank == 0) printf("dt_backend_get(\"cuda\") here: %s: %s\n", dt_status_name(st), dt_last_error());
  }
}

/* The cap makes allocations above it fail; every rank asks for the same sizes. */
static void test_out_of_memory(dt_mesh_t dev, dt_backend_t be) {
  dt_placement_t r[1] = {dt_replicate()};
  int64_t live0 = 0, live1 = 0;
  DT_ASSERT_OK(dt_backend_memory(be, &live0, NULL));
  const int64_t small[1] = {1024};
  dt_tensor_t keep, big = NULL;
  DT_ASSERT_OK(dt_tensor_arange(dev, DT_F32, 1, small, r, 0.0, 1.0, &keep));
  const int64_t huge[1] = {(int64_t)64 << 20}; /* 256 MiB: above the 32 MiB cap */
  DT_ASSERT_STATUS(dt_tensor_empty(dev, DT_F32, 1, huge, r, &big), DT_ERR_OUT_OF_MEMORY);
  DT_ASSERT_TRUE(big == NULL, "a failed factory returned a tensor");
  /* an op whose output does not fit: (1024 x 1) x (1 x 16384) f32 = 64 MiB */
  const int64_t col[2] = {1024, 1}, row[2] = {1, 16384};
  dt_tensor_t x, y, z = NULL;
  DT_ASSERT_OK(dt_tensor_ones(dev, DT_F32, 2, col, r, &x));
  DT_ASSERT_OK(dt_tensor_ones(dev, DT_F32, 2, row, r, &y));
  DT_ASSERT_STATUS(dt_mm(x, y, &z), DT_ERR_OUT_OF_MEMORY);
  DT_ASSERT_TRUE(z == NULL, "a failed op returned a tensor");
  /* nothing lost: the earlier tensor keeps its values, smaller work goes on */
  float v[1024];
  DT_ASSERT_OK(dt_tensor_gather_full(keep, v, sizeof v));
  for (int i = 0; i < 1024; i++) DT_ASSERT_EQ(v[i], i);
  const int64_t row2[2] = {1, 16};
  dt_tensor_t y2, z2;
  DT_ASSERT_OK(dt_tensor_ones(dev, DT_F32, 2, row2, r, &y2));
  DT_ASSERT_OK(dt_mm(x, y2, &z2));
  float w[16];
  DT_ASSERT_OK(dt_tensor_read_local(z2, 0, 16, w));
  DT_ASSERT_EQ(w[15], 1);
  DT_ASSERT_OK(dt_tensor_destroy(keep));
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(y));
  DT_ASSERT_OK(dt_tensor_destroy(y2));
  DT_ASSERT_OK(dt_tensor_destroy(z2));
  DT_ASSERT_OK(dt_backend_memory(be, &live1, NULL));
  DT_ASSERT_TRUE(live1 <= live0, "device bytes live before %lld, after %lld", (long long)live0,
                 (long long)live1);
}

/* Values through the device: from_full, a staged redistribution, back to the host. */
static void test_round_trip(dt_mesh_t dev) {
  dt_placement_t s0[1] = {dt_shard(0)}, s1[1] = {dt_shard(1)}, r[1] = {dt_replicate()};
  const int64_t shape[2] = {7, 5};
  float full[35], got[35];
  for (int i = 0; i < 35; i++) full[i] = (float)(i * 3 % 11) - 4.0f;
  dt_tensor_t a, b, c;
  DT_ASSERT_OK(dt_tensor_from_full(dev, DT_F32, 2, shape, s0, full, &a));
  DT_ASSERT_OK(dt_tensor_redistribute(a, s1, &b));
  DT_ASSERT_OK(dt_tensor_redistribute(b, r, &c));
  DT_ASSERT_OK(dt_tensor_read_local(c, 0, 35, got));
  DT_ASSERT_TRUE(memcmp(full, got, sizeof got) == 0, "S(0) -> S(1) -> R changed the values");
  /* the local pointer is the device's (synchronized): its backend says so */
  void* p;
  dt_backend_t be;
  DT_ASSERT_OK(dt_tensor_to_local_backend(c, &p, NULL, &be));
  dt_device_t devk;
  DT_ASSERT_OK(dt_backend_device(be, &devk));
  DT_ASSERT_EQ(devk, DT_DEVICE_CUDA);
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  DT_ASSERT_OK(dt_tensor_destroy(c));
}

int main(int argc, char** argv) {
  const char* name = getenv("DT_DEVICE_BACKEND");
  if (name == NULL || !*name) name = "cuda-emu";
  setenv("DTENSOR_CUDA_MAX_MB", "32", 1); /* read when the backend opens */
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  dt_backend_t be, cpu;
  dt_status_t st = dt_backend_get(name, &be);
  if (st == DT_ERR_CUDA || st == DT_ERR_UNSUPPORTED) {
    if (g_rank == 0) printf("test_device_errors: skipped: %s\n", dt_last_error());
    DT_ASSERT_OK(dt_finalize());
    return 77;
  }
  DT_ASSERT_OK(st);
  DT_ASSERT_OK(dt_backend_get("cpu", &cpu));
  int shape[1] = {g_world};
  dt_mesh_t dev, host;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &dev));
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &host));
  DT_ASSERT_OK(dt_mesh_set_backend(dev, be));
  DT_ASSERT_OK(dt_mesh_set_backend(host, cpu));
  test_mixed_devices(dev, host);
  test_no_gpu_names();
  test_out_of_memory(dev, be);
  test_round_trip(dev);
  /* the cpu paths are unaffected by all of the above */
  dt_placement_t s0[1] = {dt_shard(0)}, r[1] = {dt_replicate()};
  const int64_t n[1] = {9};
  dt_tensor_t a, b;
  DT_ASSERT_OK(dt_tensor_arange(host, DT_F32, 1, n, s0, 1.0, 1.0, &a));
  DT_ASSERT_OK(dt_tensor_redistribute(a, r, &b));
  float v[9];
  DT_ASSERT_OK(dt_tensor_gather_full(b, v, sizeof v));
  DT_ASSERT_EQ(v[8], 9);
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  DT_ASSERT_OK(dt_mesh_destroy(dev));
  DT_ASSERT_OK(dt_mesh_destroy(host));
  DT_ASSERT_OK(dt_finalize());
  if (g_rank == 0) printf("test_device_errors: passed on %d ranks (%s)\n", g_world, name);
  return 0;
}
