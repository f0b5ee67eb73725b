/* dtensor-calibrate - measures this machine's MPI collectives and fits the planner's cost model.
 *
 *   mpirun -np 4 dtensor-calibrate [-o FILE] [-e MAX_BYTES] [--force] [--nccl | --compute-only]
 *   dtensor-calibrate --help
 *
 * For all-gather, all-reduce, reduce-scatter, all-to-all, broadcast and scatter it times sizes
 * from 4 KiB to MAX_BYTES (default 16 MiB; nccl-tests byte convention) on groups of 2 ranks and,
 * when the world is larger, on the whole world. Per group size a least-squares line
 * t = a + factor(n) * B / bw gives the latency a and bandwidth bw; a is split into
 * base_us + hops(n) * hop_us from the two group sizes (with one size, hop_us = 0). The
 * library's all-to-all algorithms of reduce-scatter and all-reduce ("reduce_scatter_a2a",
 * "all_reduce_a2a") are fit the same way from dt_tensor_redistribute_into P -> S(0) and P -> R
 * with that algorithm forced, on a mesh dim of 2 ranks (mesh (world/2, 2), even worlds) and on
 * the whole world. The compute model of simulated step times (dt_compute_model_set) is measured
 * with every rank running at once, the slowest rank's figures kept, on the default backend (with
 * DTENSOR_BACKEND=cuda the GPU's: each timing ends with dt_backend_synchronize): the GEMM rate of
 * mm at 512^3 in f32 and bf16; attention's rate from sdpa and its gradient at sequence 1024,
 * head dim 64; the fixed cost of an op and the memory bandwidth fitted to four small training
 * steps (a dense Llama on a mesh of each rank alone, from dim 32 to dim 256: counted by a
 * simulation of the same steps, timed for real, their time beyond the FLOPs fitted as ops x
 * op_us + bytes / mem_gbps; see fit_steps), which an isolated add would underprice (page faults,
 * libm, the tape); and, with 2+ ranks on the host, comm_overlap: the part of an asynchronous
 * all-gather that small ops run meanwhile hide. Prints the fit; writes it only to the FILE of
 * -o (dt_init loads $DTENSOR_COST_MODEL, else ~/.cache/dtensor/cost_model.json: pass that path
 * to make the fit every program's default). $DTENSOR_CALIBRATE_STEP_US (tests) gives the four
 * step times instead of the measured ones.
 *
 * A fit measured in bad conditions misleads every plan made with it (an oversubscribed run once
 * priced a 4 MB transfer at 14 ms instead of 242 us), so before writing it checks, and refuses
 * (exit 3, nothing written) unless --force: more ranks on a node than usable cores (the union of
 * the node's ranks' CPU affinity masks; $DTENSOR_CALIBRATE_CPUS overrides the count, for tests),
 * a node whose 1-minute load average already exceeded its cores, a latency above
 * kMaxLatencyUs at the largest group, a bandwidth below kMinBwFraction of rank 0's memcpy
 * bandwidth (same buffer size), or a time that did not grow with the size. Without -o the
 * warnings are printed and nothing is written. Exit 0 on success, 1 on errors, 2 on bad flags,
 * 3 when the fit was refused.
 *
 * --nccl measures the NCCL plane instead (one GPU per rank): all-gather, all-reduce,
 * reduce-scatter and all-to-all are timed as the library's redistributions S(0) -> R, P -> R,
 * P -> S(0) and S(0) -> S(1) of device tensors on a mesh of the cuda backend (the default
 * backend when it is a device one: DTENSOR_BACKEND=cuda-emu makes a dry run on the emulator),
 * native algorithms forced, fit the same way, and written as the model's "nccl" object; the rest
 * of the model (the one dt_init loaded) is kept as it was, and the compute model is not
 * measured. Refused (exit 3) when the meshes' device data does not go over NCCL
 * (dt_mesh_data_plane: ranks sharing a GPU, no NCCL).
 *
 * --compute-only measures the compute model alone (one rank is enough: a machine with one GPU,
 * DTENSOR_BACKEND=cuda) and keeps the collectives of the model dt_init loaded.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT, getloadavg */
#include <errno.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dtensor/dtensor.h"

/* What is timed: a raw MPI collective, or the library's all-to-all form of a reduction. */
typedef struct {
  dt_collective_t c;
  dt_coll_algo_t algo;
} entry_t;
static const entry_t kEntries[] = {
    {DT_COLL_ALL_GATHER, DT_ALGO_NATIVE},     {DT_COLL_ALL_REDUCE, DT_ALGO_NATIVE},
    {DT_COLL_REDUCE_SCATTER, DT_ALGO_NATIVE}, {DT_COLL_ALL_TO_ALL, DT_ALGO_NATIVE},
    {DT_COLL_BROADCAST, DT_ALGO_NATIVE},      {DT_COLL_SCATTER, DT_ALGO_NATIVE},
    {DT_COLL_REDUCE_SCATTER, DT_ALGO_A2A},    {DT_COLL_ALL_REDUCE, DT_ALGO_A2A},
    {DT_COLL_SEND_RECV, DT_ALGO_NATIVE},
};
#define NENTRIES 9

/* A plausible fit: latency (base + hops at the largest group measured) at most this, */
static const double kMaxLatencyUs = 1000.0;
/* and bandwidth at least this fraction of rank 0's memcpy bandwidth. */
static const double kMinBwFraction = 0.01;

/* One timed call: raw (comm, buffers) or through the library (x -> y). */
typedef struct {
  dt_collective_t c;
  MPI_Comm comm;
  int n;
  long bytes;
  float *a, *b;
  dt_tensor_t x, y; /* library: P -> S(0) or P -> R on the measured mesh dim */
} job_t;

static double hops_of(dt_collective_t c, int n) {
  if (c == DT_COLL_SEND_RECV) return 1.0;
  return c == DT_COLL_ALL_REDUCE ? 2.0 * (n - 1) : (double)(n - 1);
}
static double factor_of(dt_collective_t c, int n) {
  if (c == DT_COLL_BROADCAST || c == DT_COLL_SEND_RECV) return 1.0;
  return c == DT_COLL_ALL_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

/* One call of the job (nccl-tests byte convention). */
static int run_once(const job_t* j) {
  if (j->x != NULL) return dt_tensor_redistribute_into(j->x, j->y) == DT_SUCCESS ? 0 : 1;
  int per = (int)(j->bytes / 4 / j->n), all = (int)(j->bytes / 4);
  float *a = j->a, *b = j->b;
  switch (j->c) {
    case DT_COLL_ALL_GATHER: return MPI_Allgather(a, per, MPI_FLOAT, b, per, MPI_FLOAT, j->comm);
    case DT_COLL_ALL_REDUCE: return MPI_Allreduce(a, b, all, MPI_FLOAT, MPI_SUM, j->comm);
    case DT_COLL_REDUCE_SCATTER:
      return MPI_Reduce_scatter_block(a, b, per, MPI_FLOAT, MPI_SUM, j->comm);
    case DT_COLL_ALL_TO_ALL: return MPI_Alltoall(a, per, MPI_FLOAT, b, per, MPI_FLOAT, j->comm);
    case DT_COLL_BROADCAST: return MPI_Bcast(a, all, MPI_FLOAT, 0, j->comm);
    case DT_COLL_SCATTER: return MPI_Scatter(a, per, MPI_FLOAT, b, per, MPI_FLOAT, 0, j->comm);
    case DT_COLL_SEND_RECV: { /* one ring step: `bytes` to the successor, as many from the
                               * predecessor */
      int me, n = j->n;
      MPI_Comm_rank(j->comm, &me);
      return MPI_Sendrecv(a, all, MPI_FLOAT, (me + 1) % n, 7, b, all, MPI_FLOAT, (me + n - 1) % n,
                          7, j->comm, MPI_STATUS_IGNORE);
    }
    default: return MPI_ERR_ARG;
  }
}

/* Median-of-rounds time in microseconds (max over the ranks of MPI_COMM_WORLD for library jobs,
 * of the job's communicator for raw ones); -1 when a call failed. */
static double time_us(const job_t* j, MPI_Comm comm) {
  int iters = j->bytes <= (64 << 10) ? 200 : j->bytes <= (1 << 20) ? 40 : 8, bad = 0;
  double t[5];
  for (int w = 0; w < 3; w++) bad |= run_once(j);
  for (int r = 0; r < 5; r++) {
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    for (int k = 0; k < iters; k++) bad |= run_once(j);
    double dt = (MPI_Wtime() - t0) / iters * 1e6;
    MPI_Allreduce(&dt, &t[r], 1, MPI_DOUBLE, MPI_MAX, comm);
  }
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm);
  if (bad) return -1.0;
  for (int i = 0; i < 5; i++) /* sort 5 */
    for (int j2 = i + 1; j2 < 5; j2++)
      if (t[j2] < t[i]) {
        double x = t[i];
        t[i] = t[j2];
        t[j2] = x;
      }
  return t[2];
}

/* Library job on the last dim of `mesh` (the others Replicate), `bytes` in nccl-tests' convention:
 * a Partial tensor reduced to S(0) (reduce-scatter) or R (all-reduce), an S(0) tensor gathered
 * to R (all-gather) or moved to S(1) (all-to-all: each rank sends `bytes`). */
static int lib_job(job_t* j, dt_mesh_t mesh, int mdims) {
  int64_t numel = j->bytes / 4 * (j->c == DT_COLL_ALL_TO_ALL ? j->n : 1);
  int64_t shape[2] = {numel / 64, 64};
  dt_placement_t src[2] = {dt_replicate(), dt_replicate()}, dst[2] = {dt_replicate(),
                                                                       dt_replicate()};
  int reduce = j->c == DT_COLL_ALL_REDUCE || j->c == DT_COLL_REDUCE_SCATTER;
  src[mdims - 1] = reduce ? dt_partial(DT_REDUCE_SUM) : dt_shard(0);
  if (j->c == DT_COLL_REDUCE_SCATTER) dst[mdims - 1] = dt_shard(0);
  if (j->c == DT_COLL_ALL_TO_ALL) dst[mdims - 1] = dt_shard(1);
  if (dt_tensor_zeros(mesh, DT_F32, 2, shape, src, &j->x) != DT_SUCCESS) return 1;
  if (dt_tensor_empty(mesh, DT_F32, 2, shape, dst, &j->y) != DT_SUCCESS) return 1;
  return 0;
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: mpirun -np N dtensor-calibrate [-o FILE] [-e MAX_BYTES] [--force]\n"
          "                                      [--nccl | --compute-only]\n"
          "Times this machine's MPI collectives (and the library's all-to-all reductions) from\n"
          "4 KiB to MAX_BYTES on groups of 2 ranks and of all N (N >= 2; 4+ fits the per-hop\n"
          "latency), fits the planner's cost model and prints it.\n"
          "  -o FILE        write the fit to FILE (JSON). Nothing is written without -o. dt_init\n"
          "                 loads $DTENSOR_COST_MODEL, else ~/.cache/dtensor/cost_model.json:\n"
          "                 -o ~/.cache/dtensor/cost_model.json makes it every program's default\n"
          "  -e MAX_BYTES   largest message timed (default 16777216; at least 65536)\n"
          "  --force        write even a fit that looks implausible (see below)\n"
          "  --nccl         measure the NCCL plane (one GPU per rank): the library's S(0)->R,\n"
          "                 P->R, P->S(0), S(0)->S(1) of device tensors, written as the model's\n"
          "                 \"nccl\" object (the rest kept as loaded; no compute model)\n"
          "  --compute-only measure only the compute model (GEMM and attention rates; op cost\n"
          "                 and bandwidth fitted to four small training steps; with N >= 2 on\n"
          "                 the host, the overlap of collectives and kernels) on the default\n"
          "                 backend (DTENSOR_BACKEND=cuda: the GPU's); N >= 1; the collectives\n"
          "                 kept as loaded\n"
          "  -h, --help     this text\n"
          "A fit is refused (exit 3, nothing written) when a node ran more ranks than usable\n"
          "cores, a node's load average already exceeded its cores, a latency exceeds %.0f us,\n"
          "a bandwidth is below %.0f%% of memcpy's, or a time did not grow with the size. Run\n"
          "on an idle machine with at most one rank per core. $DTENSOR_CALIBRATE_CPUS overrides\n"
          "the usable cores per node (tests).\n"
          "Exit status: 0 ok, 1 error, 2 bad flags, 3 refused.\n",
          kMaxLatencyUs, kMinBwFraction * 100.0);
}

/* Whether this process prints what all ranks would (before dt_init: the launcher's rank). */
static int first_rank_env(void) {
  const char* r = getenv("OMPI_COMM_WORLD_RANK");
  if (r == NULL) r = getenv("PMI_RANK");
  return r == NULL || strcmp(r, "0") == 0;
}

/* mkdir -p of FILE's parent directory; errors show up when the file is written. */
static void make_parent_dirs(const char* file) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", file);
  char* slash = strrchr(dir, '/');
  if (slash == NULL || slash == dir) return;
  *slash = '\0';
  for (char* p = dir + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(dir, 0755);
      *p = '/';
    }
  mkdir(dir, 0755);
}

/* Whether `file` can be written, without creating anything: it exists and is not a directory or
 * a FIFO (a device such as /dev/null will do) and is writable; or its nearest existing ancestor
 * is a writable directory (make_parent_dirs makes the rest at the save). errno says why not. */
static int writable(const char* file) {
  struct stat sb;
  if (stat(file, &sb) == 0) {
    if (S_ISDIR(sb.st_mode) || S_ISFIFO(sb.st_mode)) {
      errno = S_ISDIR(sb.st_mode) ? EISDIR : EINVAL;
      return 0;
    }
    return access(file, W_OK) == 0;
  }
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", file);
  for (;;) { /* up the path to the first directory level that exists */
    char* slash = strrchr(dir, '/');
    if (slash == NULL) snprintf(dir, sizeof dir, ".");
    else *(slash == dir ? slash + 1 : slash) = '\0';
    if (stat(dir, &sb) == 0) break;
    if (slash == NULL || slash == dir) return 0;
  }
  if (!S_ISDIR(sb.st_mode)) {
    errno = ENOTDIR;
    return 0;
  }
  return access(dir, W_OK | X_OK) == 0;
}

/* The run's conditions, agreed over the world: the most ranks per usable core on any node and
 * the highest 1-minute load average per core before the run (-1 when unknown). */
typedef struct {
  double ranks_per_core, load_per_core;
  int ranks, cores; /* on the node with the most ranks per core */
} conditions_t;

static conditions_t measure_conditions(void) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int local = 1, lrank = 0;
  MPI_Comm_size(node, &local);
  MPI_Comm_rank(node, &lrank);
  /* usable cores: the union of the node's ranks' affinity masks (a bound rank sees its core) */
  cpu_set_t mine, all;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) CPU_SET(0, &mine);
  MPI_Allreduce(&mine, &all, (int)sizeof mine, MPI_BYTE, MPI_BOR, node);
  int cores = CPU_COUNT(&all);
  const char* env = getenv("DTENSOR_CALIBRATE_CPUS");
  if (env != NULL && *env != '\0') {
    char* end = NULL;
    errno = 0;
    long v = env[0] >= '0' && env[0] <= '9' ? strtol(env, &end, 10) : 0;
    if (end != NULL && *end == '\0' && errno == 0 && v >= 1 && v <= (1l << 20)) cores = (int)v;
    else if (first_rank_env())
      fprintf(stderr, "dtensor-calibrate: ignoring DTENSOR_CALIBRATE_CPUS=%.64s: expected a core "
              "count, 1 to 2^20\n", env);
  }
  if (cores < 1) cores = 1;
  double load = -1.0;
  if (lrank == 0 && getloadavg(&load, 1) == 1) load /= cores;
  else load = -1.0;
  struct {
    double v;
    int rank;
  } in = {(double)local / cores, 0}, out;
  MPI_Comm_rank(MPI_COMM_WORLD, &in.rank);
  MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  conditions_t c = {out.v, 0.0, local, cores};
  int counts[2] = {local, cores};
  MPI_Bcast(counts, 2, MPI_INT, out.rank, MPI_COMM_WORLD);
  c.ranks = counts[0];
  c.cores = counts[1];
  MPI_Allreduce(&load, &c.load_per_core, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  MPI_Comm_free(&node);
  return c;
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* The median of n timings (sorted in place). */
static double median(double* t, int n) {
  for (int i = 1; i < n; i++) /* insertion sort: a few values */
    for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
      const double v = t[j];
      t[j] = t[j - 1];
      t[j - 1] = v;
    }
  return t[n / 2];
}

/* memcpy bandwidth in GB/s of `bytes` between a and b: best of 5 after a warm-up. */
static double memcpy_gbps(void* dst, const void* src, long bytes) {
  double best = 0.0;
  memcpy(dst, src, (size_t)bytes);
  for (int r = 0; r < 5; r++) {
    double t0 = MPI_Wtime();
    memcpy(dst, src, (size_t)bytes);
    double dt = MPI_Wtime() - t0;
    if (dt > 0 && bytes / dt / 1e9 > best) best = bytes / dt / 1e9;
  }
  return best;
}

/* The time (us) of one run of op `name` on n_in inputs (n_out outputs) on backend `be`: the
 * median over `reps` timings of `inner` runs back to back, every rank at once (as in a training
 * step: ranks sharing cores see the rate they will get, and the runs are long enough that the
 * ranks overlap), each timing ended by dt_backend_synchronize (a device backend runs its kernels
 * after the calls return); -1 on a failure. */
static double op_us(dt_backend_t be, const char* name, int n_in, const dt_tensor_t* in,
                    int n_out, int reps, int inner) {
  double t[64];
  if (reps > 64) reps = 64;
  for (int r = -1; r < reps; r++) { /* a warm-up timing */
    if (dt_backend_synchronize(be) != DT_SUCCESS) return -1.0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < inner; i++) {
      dt_tensor_t y[4] = {NULL, NULL, NULL, NULL};
      if (dt_op_run_multi(name, n_in, in, 0, NULL, 0, NULL, n_out, y) != DT_SUCCESS) return -1.0;
      for (int o = 0; o < n_out; o++) dt_tensor_destroy(y[o]);
    }
    if (dt_backend_synchronize(be) != DT_SUCCESS) return -1.0;
    double dt = (MPI_Wtime() - t0) * 1e6 / inner;
    if (r >= 0) t[r] = dt;
  }
  return median(t, reps);
}

/* The attention measured for attn_gflops: q, k, v and the output's gradient (1, 2, 1024, 64),
 * without a mask (the query-key pairs are then S x T exactly). */
#define ATTN_H 2
#define ATTN_S 1024
#define ATTN_D 64

/* The compute model (dt_compute_params_t): the fixed cost of an op (an add of one element),
 * memory bandwidth (an add of 1 Mi floats: 12 MiB read and written), the GEMM rate of mm at
 * 512^3 in f32 and bf16, and attention's rate (sdpa and sdpa_grad at the shape above, FLOPs
 * counted as dtensor/redistribute.h says), all ranks running at once; the slowest rank's
 * figures. 0 on success. */
static int measure_compute(dt_mesh_t mesh, dt_compute_params_t* out) {
  dt_placement_t rep[1] = {dt_replicate()};
  const int64_t one[1] = {1}, big[1] = {1 << 20}, sq[2] = {512, 512};
  const int64_t at[4] = {1, ATTN_H, ATTN_S, ATTN_D};
  dt_tensor_t t[12] = {NULL};
  int bad = 0;
  for (int i = 0; i < 12 && !bad; i++) {
    const int nd = i < 4 ? 1 : i < 8 ? 2 : 4;
    const int64_t* shape = i < 2 ? one : i < 4 ? big : i < 8 ? sq : at;
    const dt_dtype_t dt = i == 6 || i == 7 ? DT_BF16 : DT_F32;
    bad = dt_tensor_rand(mesh, dt, nd, shape, rep, (uint64_t)i + 1, &t[i]) != DT_SUCCESS;
  }
  double m[6] = {-1, -1, -1, -1, -1, -1};
  dt_backend_t be = NULL;
  bad |= dt_mesh_backend(mesh, &be) != DT_SUCCESS;
  if (!bad) {
    m[0] = op_us(be, "add", 2, &t[0], 1, 9, 2000);
    m[1] = op_us(be, "add", 2, &t[2], 1, 9, 40);
    m[2] = op_us(be, "mm", 2, &t[4], 1, 7, 10);
    m[3] = op_us(be, "mm", 2, &t[6], 1, 7, 10);
    m[4] = op_us(be, "sdpa", 3, &t[8], 1, 5, 2);
    m[5] = op_us(be, "sdpa_grad", 4, &t[8], 3, 5, 1);
  }
  for (int i = 0; i < 12; i++) dt_tensor_destroy(t[i]);
  for (int i = 0; i < 6; i++) bad |= m[i] < 0;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad) return 1;
  MPI_Allreduce(MPI_IN_PLACE, m, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  out->op_us = m[0];
  const double flops = 2.0 * 512.0 * 512.0 * 512.0, nbytes = 3.0 * 4.0 * (double)(1 << 20);
  /* forward 2 (D + E) a pair, backward 2 (3 D + 2 E), E = D */
  const double pairs = (double)ATTN_H * ATTN_S * ATTN_S, attn = pairs * 2.0 * 7.0 * ATTN_D;
  double rest[4];
  for (int i = 0; i < 4; i++) { /* the time beyond the fixed cost (at least a tenth of it) */
    const double us = i < 3 ? m[i + 1] : m[4] + m[5], fixed = i < 3 ? m[0] : 2.0 * m[0];
    rest[i] = us - fixed;
    if (rest[i] < 0.1 * us) rest[i] = 0.1 * us;
  }
  out->mem_gbps = nbytes / (rest[0] * 1e3);
  out->gemm_gflops = flops / (rest[1] * 1e3);
  out->gemm_bf16_gflops = flops / (rest[2] * 1e3);
  out->attn_gflops = attn / (rest[3] * 1e3);
  return 0;
}

#define OVERLAP_REPS 15
/* comm_overlap (dt_compute_params_t): how much of an asynchronous all-gather over the world (8 MiB
 * from each rank, S(0) -> R) a run of small ops hides (adds of 64 Ki floats, as many as last about
 * as long as the all-gather), as the wrappers' prefetches and bucketed reductions run beside a
 * step's kernels: (t_comm + t_ops - t_both) / min(t_comm, t_ops), each time the median of
 * OVERLAP_REPS timings, the slowest rank's (in m[0..2], microseconds); clamped to [0, 1]. -1 on a
 * failure (dt_last_error). */
static double measure_overlap(dt_mesh_t mesh, int world, double* m) {
  const int64_t gshape[2] = {(int64_t)world * 512, 4096}, ashape[1] = {1 << 16};
  dt_placement_t s0 = dt_shard(0), r = dt_replicate();
  dt_tensor_t x = NULL, a = NULL;
  int bad = dt_tensor_rand(mesh, DT_F32, 2, gshape, &s0, 1, &x) != DT_SUCCESS ||
            dt_tensor_rand(mesh, DT_F32, 1, ashape, &r, 2, &a) != DT_SUCCESS;
  double tc[OVERLAP_REPS], tk[OVERLAP_REPS], tb[OVERLAP_REPS];
  m[0] = m[1] = m[2] = 0.0;
  long k = 64; /* adds per run: first a guess, then as many as the all-gather lasts */
  for (int phase = 0; phase < 2; phase++) {
    for (int i = 0; i < OVERLAP_REPS; i++) {
      for (int what = 0; what < 3; what++) { /* all-gather alone, adds alone, both */
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (bad) break;
        dt_tensor_t y = NULL;
        dt_work_t w = NULL;
        const double t0 = now_us();
        if (what == 0) bad = dt_tensor_redistribute(x, &r, &y) != DT_SUCCESS;
        if (what == 2) bad = dt_tensor_redistribute_async(x, &r, &y, &w) != DT_SUCCESS;
        for (long j = 0; j < (what ? k : 0) && !bad; j++) {
          dt_tensor_t c = NULL;
          bad = dt_add(a, a, &c) != DT_SUCCESS;
          dt_tensor_destroy(c);
        }
        if (w != NULL && dt_work_wait(w) != DT_SUCCESS) bad = 1;
        const double dt = now_us() - t0;
        dt_work_destroy(w);
        dt_tensor_destroy(y);
        (what == 0 ? tc : what == 1 ? tk : tb)[i] = dt;
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD); /* the last run's */
    if (bad) break;
    m[0] = median(tc, OVERLAP_REPS), m[1] = median(tk, OVERLAP_REPS), m[2] = median(tb, OVERLAP_REPS);
    MPI_Allreduce(MPI_IN_PLACE, m, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (phase == 0) { /* the number of adds that lasts as long as the all-gather */
      const double per = m[1] / (double)k;
      k = per > 0 ? (long)(m[0] / per) + 1 : 1;
      if (k > 100000) k = 100000;
    }
  }
  dt_tensor_destroy(x);
  dt_tensor_destroy(a);
  if (bad) return -1.0;
  const double lo = m[0] < m[1] ? m[0] : m[1];
  double f = lo > 0 ? (m[0] + m[1] - m[2]) / lo : 0.0;
  return f < 0.0 ? 0.0 : f > 1.0 ? 1.0 : f;
}

/* ---- op cost and bandwidth fitted to training steps ----------------------------------------
 * An isolated add (measure_compute) misses most of what a training step's kernels pay besides
 * their arithmetic: page faults on fresh activation buffers, libm in rotary and the loss, strided
 * copies, the tape's work around each op. So op_us and mem_gbps are fitted to whole steps of a
 * small dense Llama (vocabulary 256) on a mesh of this rank alone: forward with its loss, the
 * loss read back, backward, gradient clipping and AdamW, as examples/train runs a step, at four
 * sizes from one where the fixed cost per op dominates to one where the bytes do. A simulation of
 * each step (dt_init_simulated, run before dt_init) counts its kernels, their bytes and their
 * FLOPs; the measured time less the FLOPs at the measured GEMM and attention rates is fitted as
 * ops * op_us + bytes / mem_gbps (least squares in relative error, both terms non-negative). */
typedef struct {
  int dim, layers, heads, seq, batch;
} step_shape_t;
static const step_shape_t kSteps[] = {
    {32, 1, 2, 16, 1}, {64, 2, 4, 32, 2}, {128, 2, 4, 64, 4}, {256, 2, 8, 128, 8}};
#define NSHAPES 4
#define STEP_WARM 2  /* steps before the timed ones (plan and propagation caches fill) */
#define STEP_TIMED 5 /* the median of these is the step's time */
#define STEP_SPAN_US 50000.0 /* each timing at least this long */

/* What the simulation of a step counted. */
typedef struct {
  double ops, nbytes, gemm_flops, attn_flops;
} step_count_t;

/* One training step of the model (forward with its loss, the loss read back, backward, clipping,
 * AdamW, gradients cleared), ended by dt_backend_synchronize. 0 on success. */
typedef struct {
  dt_llama_t model;
  dt_adamw_t opt;
  dt_tape_t tape;
  dt_tensor_t tok, tgt;
  dt_backend_t be;
  dt_var_t* params;
  int np;
} stepper_t;

static int step_once(const stepper_t* m) {
  dt_var_t loss = NULL;
  float lv = 0.0f;
  double norm = 0.0;
  int bad = dt_llama_forward(m->model, m->tape, m->tok, m->tgt, &loss, NULL) != DT_SUCCESS ||
            dt_tensor_gather_full(dt_var_value(loss), &lv, sizeof lv) != DT_SUCCESS ||
            dt_tape_backward(m->tape, loss) != DT_SUCCESS || dt_tape_reset(m->tape) != DT_SUCCESS ||
            dt_clip_grad_norm(m->np, m->params, 1.0, &norm) != DT_SUCCESS ||
            dt_adamw_step(m->opt, 1e-4) != DT_SUCCESS;
  for (int p = 0; p < m->np && !bad; p++) bad = dt_var_zero_grad(m->params[p]) != DT_SUCCESS;
  return bad || dt_backend_synchronize(m->be) != DT_SUCCESS;
}

/* The time (us) of one step, every rank running `reps` steps back to back, once every rank has
 * come this far without a failure (*bad, agreed: no rank waits for one that gave up). */
static double step_us(const stepper_t* m, int reps, int* bad) {
  MPI_Allreduce(MPI_IN_PLACE, bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (*bad) return -1.0;
  const double t0 = now_us();
  for (int i = 0; i < reps; i++)
    if (step_once(m) != 0) return -1.0;
  return (now_us() - t0) / reps;
}

/* Trains shape s on `mesh` (one rank) after STEP_WARM steps. Real run (sim NULL): *us gets the
 * median of STEP_TIMED timings of a step, each over enough steps back to back (the same number
 * on every rank) to last STEP_SPAN_US: the ranks then run at once, as in training, also where a
 * step is short. Simulated (sim not NULL): *sim gets the clock of one step. 0 on success. */
static int train_steps(dt_mesh_t mesh, const step_shape_t* s, double* us, dt_sim_time_t* sim) {
  dt_llama_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.dim = s->dim;
  cfg.n_layers = s->layers;
  cfg.n_heads = s->heads;
  cfg.vocab = 256;
  cfg.seq_len = s->seq;
  cfg.seed = 1;
  dt_llama_config_defaults(&cfg);
  const int64_t shape[2] = {s->batch, s->seq}, n = (int64_t)s->batch * s->seq;
  dt_placement_t rep[1] = {dt_replicate()};
  stepper_t m = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0};
  int64_t numel = 0;
  int64_t* ids = malloc(sizeof(int64_t) * (size_t)(2 * n));
  int bad = ids == NULL;
  for (int64_t i = 0; !bad && i < 2 * n; i++) ids[i] = (i * 7919 + 13) % 256; /* any tokens */
  const dt_adamw_config_t ac = dt_adamw_config_default();
  bad = bad || dt_mesh_backend(mesh, &m.be) != DT_SUCCESS ||
        dt_llama_create(mesh, &cfg, NULL, &m.model) != DT_SUCCESS ||
        dt_llama_params(m.model, &m.params, NULL, &m.np, &numel) != DT_SUCCESS ||
        dt_adamw_create(&ac, m.np, m.params, &m.opt) != DT_SUCCESS ||
        dt_tape_create(&m.tape) != DT_SUCCESS ||
        dt_tensor_from_full(mesh, DT_I64, 2, shape, rep, ids, &m.tok) != DT_SUCCESS ||
        dt_tensor_from_full(mesh, DT_I64, 2, shape, rep, ids + n, &m.tgt) != DT_SUCCESS;
  for (int i = 0; i < STEP_WARM && !bad; i++) bad = step_once(&m) != 0;
  if (sim != NULL) {
    bad = bad || dt_sim_time_reset() != DT_SUCCESS || step_once(&m) != 0 ||
          dt_sim_time_get(sim) != DT_SUCCESS;
  } else {
    double one = step_us(&m, 1, &bad), t[STEP_TIMED];
    bad = bad || !(one > 0.0);
    MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); /* agreed reps */
    const int reps = bad ? 1 : one >= STEP_SPAN_US ? 1
                           : (int)(STEP_SPAN_US / one) + 1 > 1000 ? 1000
                                                                   : (int)(STEP_SPAN_US / one) + 1;
    for (int i = 0; i < STEP_TIMED; i++) { /* every rank every time: step_us agrees first */
      t[i] = step_us(&m, reps, &bad);
      bad = bad || t[i] < 0.0;
    }
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD); /* the same return */
    *us = bad ? 0.0 : median(t, STEP_TIMED);
  }
  dt_tensor_destroy(m.tok);
  dt_tensor_destroy(m.tgt);
  dt_tape_destroy(m.tape);
  dt_adamw_destroy(m.opt);
  dt_llama_destroy(m.model);
  free(ids);
  return bad;
}

/* The simulated device of the steps: the one DTENSOR_BACKEND names for the real run when it is a
 * device backend, else the host's kernels. */
static const char* step_device(void) {
  const char* b = getenv("DTENSOR_BACKEND");
  if (b != NULL && (!strcmp(b, "cuda") || !strcmp(b, "cuda-emu"))) return b;
  return "cpu";
}

/* Counts every shape's step in a simulated world of one rank (before dt_init: no MPI). The
 * compute model priced FLOPs alone there (GEMMs at 1 GFLOP/s, the rest free), so the clock gives
 * the GEMM FLOPs and the rest of the FLOPs are attention's. 0 on success; on a failure *why
 * says what failed. */
static int simulate_steps(step_count_t* cnt, char* why, size_t why_n) {
  /* without the cost model file: the steps' counts need none (their compute model is set
   * below), and every process plays rank 0 here (dt_init reads and reports the file once) */
  const char* m = getenv("DTENSOR_COST_MODEL");
  char model[4096];
  const int asis = m != NULL && strlen(m) >= sizeof model; /* too long to restore: left alone */
  snprintf(model, sizeof model, "%s", m != NULL && !asis ? m : "");
  if (!asis) setenv("DTENSOR_COST_MODEL", "none", 1);
  const dt_status_t init = dt_init_simulated(1, 0);
  if (m != NULL && !asis) setenv("DTENSOR_COST_MODEL", model, 1);
  else if (m == NULL) unsetenv("DTENSOR_COST_MODEL");
  if (init != DT_SUCCESS) {
    snprintf(why, why_n, "%s", dt_last_error());
    return 1;
  }
  dt_compute_params_t keep, unit = {1.0, 1.0, 1e9, 0.0, 1e9, 1.0};
  dt_mesh_t mesh = NULL;
  const int one = 1;
  int bad = dt_compute_model_get(&keep) != DT_SUCCESS ||
            dt_sim_set_device(step_device()) != DT_SUCCESS ||
            dt_compute_model_set(&unit) != DT_SUCCESS ||
            dt_mesh_create(1, &one, NULL, NULL, &mesh) != DT_SUCCESS;
  for (int k = 0; k < NSHAPES && !bad; k++) {
    dt_sim_time_t t;
    bad = train_steps(mesh, &kSteps[k], NULL, &t) != 0;
    if (bad) break;
    cnt[k].ops = (double)t.ops;
    cnt[k].nbytes = t.nbytes;
    cnt[k].gemm_flops = t.compute_us * 1e3; /* the bytes at 1e9 GB/s: nothing */
    cnt[k].attn_flops = t.flops > cnt[k].gemm_flops ? t.flops - cnt[k].gemm_flops : 0.0;
  }
  if (bad) snprintf(why, why_n, "%s", dt_last_error());
  dt_mesh_destroy(mesh);
  dt_compute_model_set(&keep);
  dt_finalize();
  return bad;
}

/* The non-negative least-squares fit of r ~ a x + b y over n points weighted by w. */
static void fit_nonneg2(int n, const double* x, const double* y, const double* r,
                        const double* w, double* a, double* b) {
  double sxx = 0, sxy = 0, syy = 0, sxr = 0, syr = 0;
  for (int i = 0; i < n; i++) {
    const double w2 = w[i] * w[i];
    sxx += w2 * x[i] * x[i], sxy += w2 * x[i] * y[i], syy += w2 * y[i] * y[i];
    sxr += w2 * x[i] * r[i], syr += w2 * y[i] * r[i];
  }
  const double det = sxx * syy - sxy * sxy;
  double ca[3] = {0, 0, 0}, cb[3] = {0, 0, 0}; /* both terms, x alone, y alone */
  int ok[3] = {0, 1, 1};
  if (det > 1e-12 * sxx * syy) {
    ca[0] = (sxr * syy - syr * sxy) / det, cb[0] = (syr * sxx - sxr * sxy) / det;
    ok[0] = ca[0] >= 0 && cb[0] >= 0;
  }
  ca[1] = sxx > 0 && sxr > 0 ? sxr / sxx : 0.0;
  cb[2] = syy > 0 && syr > 0 ? syr / syy : 0.0;
  double best = -1.0;
  for (int c = 0; c < 3; c++) {
    if (!ok[c]) continue;
    double e = 0;
    for (int i = 0; i < n; i++) {
      const double d = w[i] * (ca[c] * x[i] + cb[c] * y[i] - r[i]);
      e += d * d;
    }
    if (best < 0 || e < best) best = e, *a = ca[c], *b = cb[c];
  }
}

/* $DTENSOR_CALIBRATE_STEP_US (tests): NSHAPES comma-separated step times in microseconds that
 * replace the measured ones in the fit (the steps still run). 0 when unset; 1 and a message when
 * malformed; else 2 with the times in t. */
static int step_times_env(double* t) {
  const char* e = getenv("DTENSOR_CALIBRATE_STEP_US");
  if (e == NULL || *e == '\0') return 0;
  const char* p = e;
  for (int k = 0; k < NSHAPES; k++) {
    char* end = NULL;
    errno = 0;
    t[k] = strtod(p, &end);
    if (errno != 0 || end == p || !(t[k] > 0.0 && t[k] < 1e12) ||
        *end != (k == NSHAPES - 1 ? '\0' : ',')) {
      if (first_rank_env())
        fprintf(stderr, "dtensor-calibrate: DTENSOR_CALIBRATE_STEP_US needs %d positive step "
                "times in microseconds, comma-separated, got '%.64s'\n", NSHAPES, e);
      return 1;
    }
    p = end + 1;
  }
  return 2;
}

/* Fits op_us and mem_gbps of *cp (its rates measured) to the steps counted in cnt, run for real
 * (their times replaced by `given` when not NULL) on a mesh of this rank alone (every rank at once; the slowest rank's times). Prints the fit on
 * rank 0. A backend that is not the simulated device's, or a fit that finds no cost beyond the
 * FLOPs, keeps the isolated figures. 0 on success, 1 on a failure (dt_last_error). */
static int fit_steps(dt_mesh_t world_mesh, const step_count_t* cnt, const double* given,
                     int rank, dt_compute_params_t* cp) {
  const char* names[2] = {"w", "self"};
  int world = 1, shape[2] = {1, 1};
  dt_mesh_numel(world_mesh, &world);
  shape[0] = world;
  dt_mesh_t grid = NULL, self = NULL;
  dt_backend_t be = NULL;
  dt_device_t dev = DT_DEVICE_HOST;
  int bad = dt_mesh_create(2, shape, names, NULL, &grid) != DT_SUCCESS ||
            dt_mesh_slice(grid, 1, &names[1], &self) != DT_SUCCESS ||
            dt_mesh_backend(self, &be) != DT_SUCCESS || dt_backend_device(be, &dev) != DT_SUCCESS;
  const int sim_dev = strcmp(step_device(), "cpu") != 0;
  int other = !bad && sim_dev != (dev != DT_DEVICE_HOST); /* counted for other kernels */
  int agree[2] = {bad, other}; /* every rank trains the steps, or none does */
  MPI_Allreduce(MPI_IN_PLACE, agree, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (agree[0]) {
    dt_mesh_destroy(self);
    dt_mesh_destroy(grid);
    return 1;
  }
  if (agree[1]) {
    if (rank == 0)
      printf("# steps: not fitted (the backend %s is not the simulated %s): op_us and mem_gbps "
             "from the isolated add\n", dt_backend_name(be), step_device());
    dt_mesh_destroy(self);
    dt_mesh_destroy(grid);
    return 0;
  }
  double T[NSHAPES] = {0};
  for (int k = 0; k < NSHAPES && !bad; k++) bad = train_steps(self, &kSteps[k], &T[k], NULL) != 0;
  dt_mesh_destroy(self);
  dt_mesh_destroy(grid);
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (bad) return 1;
  MPI_Allreduce(MPI_IN_PLACE, T, NSHAPES, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (given != NULL) memcpy(T, given, sizeof T); /* $DTENSOR_CALIBRATE_STEP_US */
  const double attn_rate = cp->attn_gflops > 0 ? cp->attn_gflops : cp->gemm_gflops;
  double x[NSHAPES], y[NSHAPES], r[NSHAPES], w[NSHAPES], a = 0.0, b = 0.0;
  for (int k = 0; k < NSHAPES; k++) {
    x[k] = cnt[k].ops;
    y[k] = cnt[k].nbytes;
    r[k] = T[k] - cnt[k].gemm_flops / (cp->gemm_gflops * 1e3) -
           cnt[k].attn_flops / (attn_rate * 1e3);
    w[k] = 1.0 / T[k];
  }
  fit_nonneg2(NSHAPES, x, y, r, w, &a, &b);
  const dt_compute_params_t iso = *cp;
  if (b > 0.0) { /* bytes have a cost: the fit's bandwidth */
    cp->mem_gbps = 1e-3 / b;
    cp->op_us = a;
  } else { /* bytes look free: the isolated bandwidth, the fixed cost refitted over the rest */
    double sxx = 0, sxr = 0;
    for (int k = 0; k < NSHAPES; k++) {
      const double rr = r[k] - y[k] / (iso.mem_gbps * 1e3);
      sxx += w[k] * w[k] * x[k] * x[k], sxr += w[k] * w[k] * x[k] * rr;
    }
    cp->op_us = sxr > 0 ? sxr / sxx : iso.op_us;
  }
  if (cp->mem_gbps > 1e9) cp->mem_gbps = 1e9;
  if (cp->mem_gbps < 1e-6) cp->mem_gbps = 1e-6;
  if (cp->op_us > 1e6) cp->op_us = 1e6;
  if (rank == 0) {
    printf("# steps: op_us %.2f, mem_gbps %.2f fitted to %d training steps (the isolated add: "
           "op_us %.2f, mem_gbps %.2f)\n", cp->op_us, cp->mem_gbps, NSHAPES, iso.op_us,
           iso.mem_gbps);
    for (int k = 0; k < NSHAPES; k++) {
      const step_shape_t* s = &kSteps[k];
      const double flops_us = T[k] - r[k];
      printf("#   dim %3d, %d layers, seq %3d, batch %d: %8.2f ms measured, %8.2f fitted, "
             "%8.2f isolated (%.0f ops, %.0f bytes, %.0f FLOPs)\n", s->dim, s->layers, s->seq,
             s->batch, T[k] * 1e-3,
             (flops_us + x[k] * cp->op_us + y[k] / (cp->mem_gbps * 1e3)) * 1e-3,
             (flops_us + x[k] * iso.op_us + y[k] / (iso.mem_gbps * 1e3)) * 1e-3, x[k], y[k],
             cnt[k].gemm_flops + cnt[k].attn_flops);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  char path[1024] = "";
  long maxb = 16l << 20;
  int force = 0, nccl = 0, compute_only = 0;
  for (int i = 1; i < argc; i++) { /* before dt_init: --help and bad flags need no MPI */
    char* end = NULL;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      if (first_rank_env()) usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
      const size_t len = strlen(argv[++i]);
      if (len == 0 || len >= sizeof path || argv[i][len - 1] == '/') {
        if (first_rank_env())
          fprintf(stderr, "dtensor-calibrate: -o needs a file name of 1 to %zu characters, not "
                  "a directory ('%s')\n", sizeof path - 1, len < 64 ? argv[i] : "...");
        return 2;
      }
      snprintf(path, sizeof path, "%s", argv[i]);
    } else if (!strcmp(argv[i], "-e") && i + 1 < argc) {
      errno = 0;
      maxb = strtol(argv[++i], &end, 10);
      if (errno != 0 || end == argv[i] || *end != '\0' || maxb < 65536 || maxb > (1l << 30)) {
        if (first_rank_env())
          fprintf(stderr, "dtensor-calibrate: -e needs a byte count in [65536, 2^30], got '%s'\n",
                  argv[i]);
        return 2;
      }
    } else if (!strcmp(argv[i], "--force")) {
      force = 1;
    } else if (!strcmp(argv[i], "--nccl")) {
      nccl = 1;
    } else if (!strcmp(argv[i], "--compute-only")) {
      compute_only = 1;
    } else {
      if (first_rank_env()) {
        fprintf(stderr, "dtensor-calibrate: unknown or incomplete argument '%s'\n", argv[i]);
        usage(stderr);
      }
      return 2;
    }
  }
  if (nccl && compute_only) {
    if (first_rank_env())
      fprintf(stderr, "dtensor-calibrate: --nccl and --compute-only exclude each other\n");
    return 2;
  }
  if (path[0] && first_rank_env() && !writable(path)) { /* the writer, now, not after minutes
                                                          * of measuring (mpirun ends the rest) */
    fprintf(stderr, "dtensor-calibrate: -o %s: cannot write there: %s\n", path, strerror(errno));
    return 2;
  }
  double given[NSHAPES];
  const int have_given = step_times_env(given);
  if (have_given == 1) return 2;
  step_count_t counts[NSHAPES];
  char sim_why[512] = "";
  int counted = !nccl && simulate_steps(counts, sim_why, sizeof sim_why) == 0;
  if (dt_init(&argc, &argv) != DT_SUCCESS) {
    fprintf(stderr, "dtensor-calibrate: %s\n", dt_last_error());
    return 1;
  }
  int rank, world;
  dt_world_rank(&rank);
  dt_world_size(&world);
  if (!nccl) { /* the step fit runs on every rank or on none (it is collective) */
    int all = counted;
    MPI_Allreduce(&counted, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!counted) fprintf(stderr, "dtensor-calibrate: rank %d: the steps' simulation: %s\n", rank,
                          sim_why);
    if (!all && counted) snprintf(sim_why, sizeof sim_why, "on another rank");
    counted = all;
  }
  if (world < 2 && !compute_only) {
    if (rank == 0) fprintf(stderr, "dtensor-calibrate: run under mpirun with at least 2 ranks\n");
    dt_finalize();
    return 1;
  }
  conditions_t cond = measure_conditions();
  MPI_Comm pair;
  MPI_Comm_split(MPI_COMM_WORLD, rank < world - world % 2 ? rank / 2 : MPI_UNDEFINED, rank, &pair);
  float* a = malloc((size_t)maxb);
  float* b = malloc((size_t)maxb);
  if (a == NULL || b == NULL) {
    fprintf(stderr, "dtensor-calibrate: no memory for two %ld-byte buffers\n", maxb);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(a, 1, (size_t)maxb);
  memset(b, 1, (size_t)maxb);
  const double copy_gbps = rank == 0 ? memcpy_gbps(b, a, maxb) : 0.0;
  char why[4096] = ""; /* rank 0: the reasons the fit looks implausible, one line each */
  size_t why_len = 0;
#define WHY(...)                                                                        \
  do {                                                                                  \
    if (why_len < sizeof why) why_len += (size_t)snprintf(why + why_len, sizeof why - why_len, \
                                                          __VA_ARGS__);                 \
  } while (0)
  if (cond.ranks_per_core > 1.0)
    WHY("  oversubscribed: %d ranks on %d usable cores of one node (ranks wait for a core)\n",
        cond.ranks, cond.cores);
  if (cond.load_per_core > 1.0)
    WHY("  busy: the 1-minute load average was %.1f per core before the run\n",
        cond.load_per_core);
  int sizes_n[2] = {2, world};
  int ngroups = world > 2 ? 2 : 1;
  if (rank == 0 && !compute_only)
    printf("%-19s %5s %12s %12s %10s %10s\n", "collective", "n", "latency_us", "bw_GB/s",
           "base_us", "hop_us");
  /* meshes for the library's algorithms: a dim of 2 ranks (even worlds), and the whole world */
  dt_mesh_t pair_mesh = NULL, world_mesh = NULL;
  int pshape[2] = {world / 2, 2};
  if (world % 2 == 0 && world > 2 && dt_mesh_create(2, pshape, NULL, NULL, &pair_mesh) != DT_SUCCESS)
    pair_mesh = NULL;
  if (dt_mesh_create(1, &world, NULL, NULL, &world_mesh) != DT_SUCCESS) {
    if (rank == 0) fprintf(stderr, "dtensor-calibrate: %s\n", dt_last_error());
    dt_finalize();
    return 1;
  }
  if (nccl) { /* the meshes on a device backend: the default one, else cuda */
    dt_backend_t be = NULL;
    dt_device_t dev = DT_DEVICE_HOST;
    dt_status_t st = dt_mesh_backend(world_mesh, &be);
    if (st == DT_SUCCESS) st = dt_backend_device(be, &dev);
    if (st == DT_SUCCESS && dev != DT_DEVICE_CUDA) st = dt_backend_get("cuda", &be);
    if (st == DT_SUCCESS) st = dt_mesh_set_backend(world_mesh, be);
    if (st == DT_SUCCESS && pair_mesh) st = dt_mesh_set_backend(pair_mesh, be);
    if (st != DT_SUCCESS) {
      if (rank == 0)
        fprintf(stderr, "dtensor-calibrate: --nccl needs a CUDA backend (a GPU per rank; "
                "DTENSOR_BACKEND=cuda-emu for a dry run on the emulator): %s\n", dt_last_error());
      dt_finalize();
      return 1;
    }
  }
  if (dt_cost_model_force_algo(nccl ? DT_ALGO_NATIVE : DT_ALGO_A2A) != DT_SUCCESS) return 1;
  char nccl_json[2048] = "{\"nccl\":{";
  size_t nj = strlen(nccl_json);
  if (compute_only) goto compute; /* the collectives as loaded */
  for (int k = 0; k < NENTRIES; k++) {
    dt_collective_t c = kEntries[k].c;
    if (nccl && (kEntries[k].algo != DT_ALGO_NATIVE || c == DT_COLL_BROADCAST ||
                 c == DT_COLL_SCATTER || c == DT_COLL_SEND_RECV))
      continue; /* no redistribution times them */
    int lib = nccl || kEntries[k].algo == DT_ALGO_A2A;
    double lat[2] = {0, 0}, bw[2] = {0, 0};
    int have[2] = {0, 0}, flat[2] = {0, 0};
    for (int g = 0; g < ngroups; g++) {
      int n = sizes_n[g];
      MPI_Comm comm = g == 0 ? pair : MPI_COMM_WORLD;
      dt_mesh_t mesh = g == 0 && world > 2 ? pair_mesh : world_mesh;
      if (lib && mesh == NULL) continue; /* odd world: no mesh dim of 2 */
      /* Weighted least squares with w = 1/t^2 (relative error), so the small sizes set the
       * latency and the large ones the bandwidth. */
      double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
      for (long bytes = 4096; bytes <= maxb; bytes *= 4) {
        long B = bytes - bytes % (lib ? 256l * n * n : 4l * n * n);
        job_t j = {c, comm, n, B, a, b, NULL, NULL};
        double t = 0;
        if (lib) {
          int bad = lib_job(&j, mesh, g == 0 && world > 2 ? 2 : 1);
          MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
          t = bad ? -1.0 : time_us(&j, MPI_COMM_WORLD);
          dt_data_plane_t plane = DT_PLANE_NCCL;
          if (nccl && t >= 0 && dt_mesh_data_plane(mesh, &plane) == DT_SUCCESS &&
              plane != DT_PLANE_NCCL) {
            if (rank == 0)
              fprintf(stderr, "dtensor-calibrate: --nccl: this mesh's device data does not go "
                      "over NCCL (dt_mesh_data_plane %d: ranks share a GPU, or NCCL cannot be "
                      "loaded; see the library's log line): nothing to measure\n", (int)plane);
            dt_tensor_destroy(j.x);
            dt_tensor_destroy(j.y);
            dt_finalize();
            return 3;
          }
          dt_tensor_destroy(j.x);
          dt_tensor_destroy(j.y);
        } else if (comm != MPI_COMM_NULL) {
          t = time_us(&j, comm);
        }
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (t < 0) {
          if (rank == 0) fprintf(stderr, "dtensor-calibrate: %s failed: %s\n",
                                 dt_collective_name(c), dt_last_error());
          dt_finalize();
          return 1;
        }
        double x = factor_of(c, n) * (double)B, w = t > 0 ? 1.0 / (t * t) : 0.0;
        sw += w;
        sx += w * x;
        sy += w * t;
        sxx += w * x * x;
        sxy += w * x * t;
      }
      double slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
      double icept = (sy - slope * sx) / sw;
      lat[g] = icept > 0 ? icept : 0;
      bw[g] = slope > 0 ? 1.0 / (slope * 1e3) : 1e3;
      flat[g] = !(slope > 0);
      have[g] = 1;
    }
    if (!have[0]) { /* only the world was measured */
      lat[0] = lat[1];
      bw[0] = bw[1];
    }
    int two = have[0] && ngroups == 2 && have[1];
    dt_cost_params_t p;
    if (two) {
      double dh = hops_of(c, sizes_n[1]) - hops_of(c, 2);
      p.hop_us = dh > 0 ? (lat[1] - lat[0]) / dh : 0;
      if (p.hop_us < 0) p.hop_us = 0;
      p.base_us = lat[0] - hops_of(c, 2) * p.hop_us;
      if (p.base_us < 0) p.base_us = 0;
      p.bw_gbps = bw[1]; /* the larger group is closer to how meshes are used */
    } else {
      p.base_us = lat[0];
      p.hop_us = 0;
      p.bw_gbps = bw[0];
    }
    if (nccl) { /* collected, applied as the model's "nccl" object after the loop */
      nj += (size_t)snprintf(nccl_json + nj, sizeof nccl_json - nj,
                             "%s\"%s\":{\"base_us\":%.17g,\"hop_us\":%.17g,\"bw_gbps\":%.17g}",
                             nccl_json[nj - 1] == '{' ? "" : ",", dt_collective_name(c), p.base_us,
                             p.hop_us, p.bw_gbps);
    } else if (dt_cost_model_set_algo(c, kEntries[k].algo, &p) != DT_SUCCESS) {
      if (rank == 0) fprintf(stderr, "dtensor-calibrate: %s\n", dt_last_error());
      dt_finalize();
      return 1;
    }
    char name[40];
    snprintf(name, sizeof name, "%s%s%s", nccl ? "nccl " : "", dt_collective_name(c),
             kEntries[k].algo == DT_ALGO_A2A ? "_a2a" : "");
    if (rank == 0)
      for (int g = 0; g < ngroups; g++)
        if (have[g])
          printf("%-19s %5d %12.2f %12.3f %10.2f %10.2f\n", name, sizes_n[g], lat[g], bw[g],
                 p.base_us, p.hop_us);
    /* plausibility, at the largest group measured */
    int nbig = have[ngroups - 1] ? sizes_n[ngroups - 1] : 2;
    double lat_big = p.base_us + hops_of(c, nbig) * p.hop_us;
    if (lat_big > kMaxLatencyUs)
      WHY("  %s: latency %.0f us on %d ranks (above %.0f us)\n", name, lat_big, nbig,
          kMaxLatencyUs);
    if (flat[0] || flat[ngroups - 1])
      WHY("  %s: the time did not grow with the size (noise; try a larger -e)\n", name);
    else if (p.bw_gbps < kMinBwFraction * copy_gbps)
      WHY("  %s: %.3f GB/s, below %.0f%% of memcpy's %.1f GB/s\n", name, p.bw_gbps,
          kMinBwFraction * 100.0, copy_gbps);
  }
#undef WHY
compute:
  dt_cost_model_force_algo(DT_ALGO_COUNT);
  if (nccl) {
    if (nj + 3 > sizeof nccl_json ||
        (strcat(nccl_json, "}}"),
         dt_cost_model_load_string(nccl_json, strlen(nccl_json)) != DT_SUCCESS)) {
      if (rank == 0) fprintf(stderr, "dtensor-calibrate: the nccl fit: %s\n", dt_last_error());
      dt_finalize();
      return 1;
    }
    if (rank == 0) printf("nccl: %s\n", nccl_json);
  } else {
    dt_compute_params_t cp;
    dt_compute_model_get(&cp); /* comm_overlap kept as loaded where it is not measured */
    if (!counted && rank == 0)
      printf("# steps: not fitted (their simulation failed: %s): op_us and mem_gbps from the "
             "isolated add\n", sim_why);
    dt_backend_t be = NULL;
    dt_device_t dev = DT_DEVICE_HOST;
    if (dt_mesh_backend(world_mesh, &be) == DT_SUCCESS) dt_backend_device(be, &dev);
    const int overlap = world > 1 && dev == DT_DEVICE_HOST; /* host collectives to measure */
    double ov[3] = {0, 0, 0};
    if (measure_compute(world_mesh, &cp) != 0 ||
        (counted && fit_steps(world_mesh, counts, have_given ? given : NULL, rank, &cp) != 0) ||
        (overlap && (cp.comm_overlap = measure_overlap(world_mesh, world, ov)) < 0.0) ||
        dt_compute_model_set(&cp) != DT_SUCCESS) {
      if (rank == 0) fprintf(stderr, "dtensor-calibrate: compute model: %s\n", dt_last_error());
      dt_finalize();
      return 1;
    }
    if (rank == 0 && overlap)
      printf("# comm_overlap: an all-gather of %d MiB %.2f ms, small ops %.2f ms, both at once "
             "%.2f ms\n", 8 * world, ov[0] * 1e-3, ov[1] * 1e-3, ov[2] * 1e-3);
    if (rank == 0)
      printf("compute: op_us %.2f, mem_gbps %.2f, gemm_gflops %.1f (f32, mm 512^3), "
             "gemm_bf16_gflops %.1f, attn_gflops %.1f (sdpa and its gradient, S %d, D %d), "
             "comm_overlap %.2f (%s)\n",
             cp.op_us, cp.mem_gbps, cp.gemm_gflops, cp.gemm_bf16_gflops, cp.attn_gflops, ATTN_S,
             ATTN_D, cp.comm_overlap,
             overlap ? "an all-gather beside small ops" : world > 1 ? "kept: a device backend"
                                                                  : "kept: one rank");
  }
  if (pair_mesh) dt_mesh_destroy(pair_mesh);
  dt_mesh_destroy(world_mesh);
  int rc = 0;
  if (rank == 0) {
    const int bad = why[0] != '\0';
    if (bad)
      fprintf(stderr, "dtensor-calibrate: warning: this fit looks implausible:\n%s", why);
    if (ngroups == 1 && !compute_only)
      printf("# one group size: hop_us = 0; run with 4+ ranks to fit it\n");
    if (path[0] == '\0') {
      printf("# not written (no -o FILE). dt_init loads $DTENSOR_COST_MODEL, else "
             "~/.cache/dtensor/cost_model.json\n");
    } else if (bad && !force) {
      fprintf(stderr, "dtensor-calibrate: %s not written: rerun on an idle machine with at most "
              "one rank per core, or pass --force\n", path);
      rc = 3;
    } else {
      make_parent_dirs(path);
      if (dt_cost_model_save(path) != DT_SUCCESS) {
        fprintf(stderr, "dtensor-calibrate: %s\n", dt_last_error());
        rc = 1;
      } else {
        printf("wrote %s%s\n", path, bad ? " (--force: despite the warnings)" : "");
      }
    }
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (pair != MPI_COMM_NULL) MPI_Comm_free(&pair);
  free(a);
  free(b);
  dt_finalize();
  return rc;
}
