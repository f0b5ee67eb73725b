/* test_data_plane.c - which communicators carry a mesh's data (dt_mesh_data_plane), and the cost
 * model's "nccl" parameters for meshes on the NCCL plane. Adapts to the run's backend and
 * $DTENSOR_DATA_COMM:
 *   cpu / guarded      DT_PLANE_MPI before and after a redistribution; the "nccl" parameters
 *                      never price its steps;
 *   cuda-emu (cuda)    DT_PLANE_UNDECIDED until the first redistribution, then DT_PLANE_NCCL
 *                      (DT_PLANE_MPI_STAGED under DTENSOR_DATA_COMM=mpi, or on real GPUs when
 *                      two ranks share one); once on NCCL, an
 *                      all-gather on the mesh is priced exactly by the "nccl" line (no staging
 *                      copies), dt_mesh_get_cost_model returns it, a per-dim model overrides it;
 *                      staged, the global line plus the backend's two staging copies.
 * Everywhere: a model file saved and loaded again keeps the "nccl" object; malformed "nccl"
 * objects are refused and change nothing; dt_cost_model_reset drops them; bad arguments.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dt_test.h"

static void expect_cost(dt_mesh_t m, double want, const char* what) {
  double got = -1;
  DT_ASSERT_OK(dt_mesh_cost_estimate(m, 1, DT_COLL_ALL_GATHER, 1 << 20, &got));
  DT_ASSERT_TRUE(fabs(got - want) <= 1e-9 * want, "%s: all-gather of 1 MiB priced %.6f us, "
                 "expected %.6f", what, got, want);
}

/* argv[1] "mixed": launched with DTENSOR_DATA_COMM=mpi on some ranks only (an MPMD launch):
 * the first device collective fails on every rank with DT_ERR_INVALID_ARG naming the variable,
 * instead of ranks taking different paths into it. */
static int mixed(void) {
  int n = 0;
  DT_ASSERT_OK(dt_world_size(&n));
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  int64_t shape[1] = {4 * (int64_t)n};
  dt_placement_t s0 = dt_shard(0), rep = dt_replicate();
  dt_tensor_t x, y = NULL;
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 1, shape, &s0, &x));
  dt_status_t st = dt_tensor_redistribute(x, &rep, &y);
  DT_ASSERT_TRUE(st == DT_ERR_INVALID_ARG && strstr(dt_last_error(), "DTENSOR_DATA_COMM") != NULL,
                 "mixed DTENSOR_DATA_COMM: %s (%s)", dt_status_name(st), dt_last_error());
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_mesh_destroy(m));
  DT_ASSERT_OK(dt_finalize());
  return 0;
}

int main(int argc, char** argv) {
  DT_ASSERT_OK(dt_init(&argc, &argv));
  if (argc > 1 && !strcmp(argv[1], "mixed")) return mixed();
  int n = 0, rank = 0;
  DT_ASSERT_OK(dt_world_size(&n));
  DT_ASSERT_OK(dt_world_rank(&rank));
  DT_ASSERT_OK(dt_cost_model_reset());
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, &n, NULL, NULL, &m));
  dt_backend_t b;
  DT_ASSERT_OK(dt_mesh_backend(m, &b));
  dt_device_t dev;
  DT_ASSERT_OK(dt_backend_device(b, &dev));
  const char* mode = getenv("DTENSOR_DATA_COMM");
  const int device = dev == DT_DEVICE_CUDA;
  /* staged: asked for, or (real GPUs) two ranks on one GPU, which NCCL refuses: told apart here
   * by (host, device ordinal), as launched by ctest and tools/gpu_check.sh (every rank sees every
   * GPU; the library itself compares PCI bus ids) */
  int staged = device && mode && !strcmp(mode, "mpi");
  if (device && !staged && n > 1 && !strcmp(dt_backend_name(b), "cuda")) {
    char me[300] = {0};
    int ordinal = -1;
    DT_ASSERT_OK(dt_backend_ordinal(b, &ordinal));
    gethostname(me, 255);
    snprintf(me + strlen(me), sizeof me - strlen(me), "#%d", ordinal);
    char* all = (char*)calloc((size_t)n, sizeof me);
    DT_ASSERT_TRUE(all != NULL, "calloc");
    MPI_Allgather(me, (int)sizeof me, MPI_CHAR, all, (int)sizeof me, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < n; r++)
      if (r != rank && !strcmp(all + (size_t)r * sizeof me, me)) staged = 1;
    free(all);
  }
  dt_data_plane_t pl;
  DT_ASSERT_OK(dt_mesh_data_plane(m, &pl));
  DT_ASSERT_TRUE(pl == (device ? DT_PLANE_UNDECIDED : DT_PLANE_MPI), "before: plane %d", (int)pl);
  DT_ASSERT_STATUS(dt_mesh_data_plane(m, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_mesh_data_plane(NULL, &pl), DT_ERR_INVALID_ARG);

  /* the "nccl" line: 1000 us + B (n-1)/n / 1 GB/s; the global one stays PyTorch's default */
  const char* model = "{\"nccl\":{\"all_gather\":{\"base_us\":1000,\"hop_us\":0,\"bw_gbps\":1}}}";
  DT_ASSERT_OK(dt_cost_model_load_string(model, strlen(model)));
  dt_cost_params_t glob;
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_GATHER, &glob));
  DT_ASSERT_TRUE(glob.base_us != 1000.0, "the global all-gather took the nccl line");
  const double B = 1 << 20, f = (double)(n - 1) / n;
  const double nccl_cost = n > 1 ? 1000.0 + f * B / 1e3 : 0.0;
  const double global_cost =
      n > 1 ? glob.base_us + (n - 1) * glob.hop_us + f * B / (glob.bw_gbps * 1e3) : 0.0;

  /* a redistribution that communicates decides the plane */
  int64_t shape[2] = {4 * (int64_t)n, 3};
  dt_placement_t s0 = dt_shard(0), rep = dt_replicate();
  dt_tensor_t x, y;
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 2, shape, &s0, &x));
  DT_ASSERT_OK(dt_tensor_redistribute(x, &rep, &y));
  DT_ASSERT_OK(dt_mesh_data_plane(m, &pl));
  const dt_data_plane_t want = !device || n == 1 ? (device ? DT_PLANE_UNDECIDED : DT_PLANE_MPI)
                               : staged          ? DT_PLANE_MPI_STAGED
                                                 : DT_PLANE_NCCL;
  DT_ASSERT_TRUE(pl == want, "after a redistribution: plane %d, expected %d", (int)pl, (int)want);
  if (n > 1) {
    if (pl == DT_PLANE_NCCL) {
      expect_cost(m, nccl_cost, "NCCL plane");
      dt_cost_params_t got;
      DT_ASSERT_OK(dt_mesh_get_cost_model(m, 0, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, &got));
      DT_ASSERT_TRUE(got.base_us == 1000.0 && got.bw_gbps == 1.0, "dt_mesh_get_cost_model: %g %g",
                     got.base_us, got.bw_gbps);
      /* a dim's own parameters win over the nccl line */
      dt_cost_params_t own = {5.0, 0.0, 100.0};
      DT_ASSERT_OK(dt_mesh_set_cost_model(m, 0, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, &own));
      expect_cost(m, 5.0 + f * B / 1e5, "a dim's own model");
      DT_ASSERT_OK(dt_mesh_set_cost_model(m, 0, DT_COLL_ALL_GATHER, DT_ALGO_NATIVE, NULL));
      expect_cost(m, nccl_cost, "back to the nccl line");
      /* other collectives without an nccl line: the global model, no staging */
      double ar = 0, war = 0;
      DT_ASSERT_OK(dt_mesh_cost_estimate(m, 1, DT_COLL_ALL_REDUCE, 1 << 20, &ar));
      DT_ASSERT_OK(dt_cost_estimate(DT_COLL_ALL_REDUCE, n, 1 << 20, &war));
      DT_ASSERT_TRUE(fabs(ar - war) <= 1e-9 * war, "all-reduce on NCCL %.3f, global %.3f", ar, war);
    } else if (!device) {
      expect_cost(m, global_cost, "host plane");
    } else { /* staged: the global line plus the backend's copies: dearer than the line alone */
      double got = 0;
      DT_ASSERT_OK(dt_mesh_cost_estimate(m, 1, DT_COLL_ALL_GATHER, 1 << 20, &got));
      DT_ASSERT_TRUE(got > global_cost * (1 + 1e-9), "staged: %.3f, the line alone %.3f", got,
                     global_cost);
    }
  }
  DT_ASSERT_OK(dt_tensor_destroy(y));
  DT_ASSERT_OK(dt_tensor_destroy(x));

  /* save and load keep the nccl object; malformed ones change nothing */
  char path[128];
  int pid = (int)getpid();
  MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  snprintf(path, sizeof path, "/tmp/dt_data_plane_%d_%d.json", pid, rank);
  DT_ASSERT_OK(dt_cost_model_save(path));
  FILE* fp = fopen(path, "rb");
  char text[8192] = {0};
  size_t got = fp ? fread(text, 1, sizeof text - 1, fp) : 0;
  if (fp) fclose(fp);
  DT_ASSERT_TRUE(got > 0 && strstr(text, "\"nccl\"") != NULL, "saved model lacks \"nccl\"");
  DT_ASSERT_OK(dt_cost_model_reset());
  if (pl == DT_PLANE_NCCL && n > 1) expect_cost(m, global_cost, "after reset");
  DT_ASSERT_OK(dt_cost_model_load(path));
  if (pl == DT_PLANE_NCCL && n > 1) expect_cost(m, nccl_cost, "after the round trip");
  remove(path);
  const char* bad[] = {
      "{\"nccl\":5}",
      "{\"nccl\":{\"all_gather\":{\"base_us\":-1,\"hop_us\":0,\"bw_gbps\":1}}}",
      "{\"nccl\":{\"all_reduce\":{\"base_us\":1,\"hop_us\":0}}}",
      "{\"all_gather\":{\"base_us\":2,\"hop_us\":0,\"bw_gbps\":2},\"nccl\":{\"all_gather\":7}}",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    DT_ASSERT_STATUS(dt_cost_model_load_string(bad[i], strlen(bad[i])), DT_ERR_INVALID_ARG);
    DT_ASSERT_TRUE(strstr(dt_last_error(), "nccl") != NULL, "message '%s'", dt_last_error());
    dt_cost_params_t now;
    DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_GATHER, &now));
    DT_ASSERT_TRUE(now.base_us == glob.base_us, "a refused model changed the global line");
    if (pl == DT_PLANE_NCCL && n > 1) expect_cost(m, nccl_cost, "after a refused model");
  }
  DT_ASSERT_OK(dt_cost_model_reset());
  DT_ASSERT_OK(dt_mesh_destroy(m));
  if (rank == 0) printf("test_data_plane: plane %d on %d ranks: ok\n", (int)pl, n);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}
