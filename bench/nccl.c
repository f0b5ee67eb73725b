/* nccl.c - redistributions of device tensors over the NCCL plane against the raw NCCL calls that
 * move the same bytes (issue 23; nccl-tests conventions). GPU only: one rank per GPU.
 *
 *   mpirun -np N build/bench/bench_nccl [-b 1M] [-e 1G] [-f 4] [-n ITERS] [-r ROUNDS]
 *
 * On a 1-D mesh of all ranks on the cuda backend, for each full-tensor size S (f32, shape
 * (S / (1024 N) rows ... , 256 N columns), sizes b, b f, ... up to e):
 *   S0->R   all-gather       raw: ncclAllGather (S / N in, S out)
 *   P->S0   reduce-scatter   raw: ncclReduceScatter (S in, S / N out)
 *   P->R    all-reduce       raw: ncclAllReduce (S)
 *   S0->S1  all-to-all       raw: grouped ncclSend / ncclRecv (S / N^2 to each peer)
 * "ours" is dt_tensor_redistribute_into (the allocation-free path) followed by
 * dt_backend_synchronize; "raw" is the NCCL call on a communicator this program makes itself
 * (ncclCommInitRank, the id broadcast over MPI) on its own stream, followed by
 * cudaStreamSynchronize, with preallocated device buffers. NCCL is loaded like the library loads
 * it ($DTENSOR_NCCL, else libnccl.so.2). A measurement is ITERS calls after a barrier, averaged,
 * max over ranks; ROUNDS measurements of each alternate (ours first on even rounds) and the
 * median and the spread (min..max) are printed. Columns: us (ours, raw), busbw GB/s (algbw
 * S / t times (N-1)/N, all-reduce 2 (N-1)/N), ratio = raw / ours time (1.0: as fast as raw NCCL).
 * At np 1 nothing moves: the difference is the per-call overhead in microseconds. Then the
 * overlap of an asynchronous all-gather (FSDP's prefetch) with a matrix product on the compute
 * stream (see the code). The last line:
 *   nccl_vs_raw=<worst ratio over rows of at least 1 MiB> overhead_us=<median ours - raw at the
 *   smallest size> overlap_fraction=<x> plane=<auto|mpi (staged)>
 */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <nccl.h>
#include <string.h>

#include "bench.h"

static struct {
  ncclResult_t (*get_id)(ncclUniqueId*);
  ncclResult_t (*init)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*destroy)(ncclComm_t);
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*reduce_scatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                 ncclComm_t, cudaStream_t);
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                             cudaStream_t);
  ncclResult_t (*send)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*group_start)(void);
  ncclResult_t (*group_end)(void);
} N;

static void load_nccl(void) {
  const char* name = getenv("DTENSOR_NCCL");
  void* h = dlopen(name && name[0] ? name : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    fprintf(stderr, "bench_nccl: cannot load NCCL: %s\n", dlerror());
    exit(1);
  }
#define SYM(f, s)                                              \
  if ((*(void**)&N.f = dlsym(h, s)) == NULL) {                 \
    fprintf(stderr, "bench_nccl: the loaded NCCL has no %s\n", s); \
    exit(1);                                                   \
  }
  SYM(get_id, "ncclGetUniqueId") SYM(init, "ncclCommInitRank") SYM(destroy, "ncclCommDestroy")
  SYM(all_gather, "ncclAllGather") SYM(reduce_scatter, "ncclReduceScatter")
  SYM(all_reduce, "ncclAllReduce") SYM(send, "ncclSend") SYM(recv, "ncclRecv")
  SYM(group_start, "ncclGroupStart") SYM(group_end, "ncclGroupEnd")
#undef SYM
}

#define NC(call)                                                          \
  do {                                                                    \
    ncclResult_t r_ = (call);                                             \
    if (r_ != ncclSuccess) {                                              \
      fprintf(stderr, "bench_nccl: %s failed (%d)\n", #call, (int)r_);    \
      exit(1);                                                            \
    }                                                                     \
  } while (0)
#define CU(call)                                                                      \
  do {                                                                                \
    cudaError_t e_ = (call);                                                          \
    if (e_ != cudaSuccess) {                                                          \
      fprintf(stderr, "bench_nccl: %s: %s\n", #call, cudaGetErrorString(e_));         \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static long long parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  if (*end == 'K' || *end == 'k') v *= 1024;
  else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
  else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
  return (long long)v;
}

enum { C_S0_R, C_P_S0, C_P_R, C_S0_S1, C_COUNT };
static const char* k_names[C_COUNT] = {"S0->R", "P->S0", "P->R", "S0->S1"};

typedef struct {
  int c, n, me;
  size_t numel; /* of the full tensor */
  ncclComm_t comm;
  cudaStream_t s;
  float *a, *b; /* raw buffers: numel elements each */
  dt_tensor_t x, y;
  dt_backend_t be;
} run_t;

static void one_raw(run_t* r) {
  size_t per = r->numel / (size_t)r->n;
  switch (r->c) {
    case C_S0_R: NC(N.all_gather(r->a, r->b, per, ncclFloat32, r->comm, r->s)); break;
    case C_P_S0: NC(N.reduce_scatter(r->a, r->b, per, ncclFloat32, ncclSum, r->comm, r->s)); break;
    case C_P_R: NC(N.all_reduce(r->a, r->b, r->numel, ncclFloat32, ncclSum, r->comm, r->s)); break;
    default: {
      size_t blk = per / (size_t)r->n;
      NC(N.group_start());
      for (int q = 0; q < r->n; q++) {
        NC(N.send(r->a + (size_t)q * blk, blk, ncclFloat32, q, r->comm, r->s));
        NC(N.recv(r->b + (size_t)q * blk, blk, ncclFloat32, q, r->comm, r->s));
      }
      NC(N.group_end());
    }
  }
  CU(cudaStreamSynchronize(r->s));
}

/* ITERS calls after a barrier: the mean in us, max over ranks */
static double measure(run_t* r, int ours, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = now_us();
  for (int i = 0; i < iters; i++) {
    if (ours) {
      CHECK(dt_tensor_redistribute_into(r->x, r->y));
      CHECK(dt_backend_synchronize(r->be));
    } else {
      one_raw(r);
    }
  }
  double t = (now_us() - t0) / iters, tmax = 0;
  MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return tmax;
}

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  long long minb = 1 << 20, maxb = 1LL << 30;
  int factor = 4, iters = 20, rounds = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) minb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-r")) rounds = atoi(argv[i + 1]);
  }
  if (factor < 2 || iters < 1 || rounds < 1 || rounds > 64) {
    fprintf(stderr, "bench_nccl: bad -f, -n or -r\n");
    return 2;
  }
  CHECK(dt_init(&argc, &argv));
  int n = 0, me = 0;
  CHECK(dt_world_size(&n));
  CHECK(dt_world_rank(&me));
  dt_backend_t be;
  CHECK(dt_backend_get("cuda", &be));
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &n, NULL, NULL, &mesh));
  CHECK(dt_mesh_set_backend(mesh, be));
  load_nccl();
  ncclUniqueId id;
  if (me == 0) NC(N.get_id(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  run_t r;
  memset(&r, 0, sizeof r);
  r.n = n;
  r.me = me;
  r.be = be;
  NC(N.init(&r.comm, n, id, me));
  CU(cudaStreamCreateWithFlags(&r.s, cudaStreamNonBlocking));
  const char* plane = getenv("DTENSOR_DATA_COMM");
  if (me == 0)
    printf("bench_nccl: %d ranks, %d iterations x %d rounds, DTENSOR_DATA_COMM=%s\n"
           "%-7s %10s %10s %10s %10s %8s %8s %7s %15s\n", n, iters, rounds, plane ? plane : "auto",
           "case", "bytes", "ours_us", "raw_us", "spread", "ours_bw", "raw_bw", "ratio", "ours-raw us");
  double worst = INFINITY, overhead = NAN;
  for (long long bytes = minb; bytes <= maxb; bytes *= factor) {
    int64_t cols = 256 * (int64_t)n, rows = bytes / 4 / cols;
    rows -= rows % (n * n);
    if (rows < n * n) rows = n * n;
    int64_t shape[2] = {rows, cols};
    r.numel = (size_t)(rows * cols);
    CU(cudaMalloc((void**)&r.a, r.numel * 4));
    CU(cudaMalloc((void**)&r.b, r.numel * 4));
    CU(cudaMemset(r.a, 0, r.numel * 4));
    for (int c = 0; c < C_COUNT; c++) {
      r.c = c;
      dt_placement_t src = (c == C_P_R || c == C_P_S0) ? dt_partial(DT_REDUCE_SUM) : dt_shard(0);
      dt_placement_t dst = c == C_P_S0 ? dt_shard(0) : c == C_S0_S1 ? dt_shard(1) : dt_replicate();
      CHECK(dt_tensor_zeros(mesh, DT_F32, 2, shape, &src, &r.x));
      CHECK(dt_tensor_empty(mesh, DT_F32, 2, shape, &dst, &r.y));
      (void)measure(&r, 1, 2); /* warm-up: plans, communicators, NCCL's connections */
      (void)measure(&r, 0, 2);
      double ours[64], raw[64];
      for (int k = 0; k < rounds; k++) {
        int first = k & 1;
        double t1 = measure(&r, !first, iters), t2 = measure(&r, first, iters);
        ours[k] = first ? t2 : t1;
        raw[k] = first ? t1 : t2;
      }
      double omin = ours[0], omax = ours[0];
      for (int k = 1; k < rounds; k++) {
        omin = ours[k] < omin ? ours[k] : omin;
        omax = ours[k] > omax ? ours[k] : omax;
      }
      qsort(ours, (size_t)rounds, sizeof *ours, cmp_d);
      qsort(raw, (size_t)rounds, sizeof *raw, cmp_d);
      double to = ours[rounds / 2], tr = raw[rounds / 2];
      double f = n > 1 ? (double)(n - 1) / n : 0.0;
      if (c == C_P_R) f *= 2;
      double algbytes = (double)r.numel * 4 / (c == C_S0_S1 ? n : 1);
      double obw = algbytes / (to * 1e3) * f, rbw = algbytes / (tr * 1e3) * f;
      double ratio = tr / to;
      if (bytes >= (1 << 20) && ratio < worst) worst = ratio;
      if (bytes == minb && c == C_S0_R) overhead = to - tr;
      if (me == 0)
        printf("%-7s %10lld %10.1f %10.1f %4.1f-%-5.1f %8.2f %8.2f %7.3f %15.1f\n", k_names[c],
               (long long)(r.numel * 4), to, tr, omin, omax, obw, rbw, ratio, to - tr);
      CHECK(dt_tensor_destroy(r.x));
      CHECK(dt_tensor_destroy(r.y));
    }
    CU(cudaFree(r.a));
    CU(cudaFree(r.b));
  }
  /* overlap: an all-gather started asynchronously (FSDP's prefetch) while a matrix product runs
   * on the compute stream. comm = the all-gather alone (start, wait), comp = the product alone,
   * both = start, product, wait; overlapped fraction = (comm + comp - both) / min(comm, comp):
   * 1 when the shorter one hides entirely behind the other, 0 when they run one after the other.
   * Medians of ROUNDS, each ITERS calls averaged, max over ranks. */
  double frac = NAN;
  {
    int64_t ag_shape[2] = {(int64_t)n * 1024, 4096}; /* 16 MiB f32 per rank after the gather */
    int64_t mm_n = 2048, mm_shape[2] = {mm_n, mm_n};
    dt_placement_t s0 = dt_shard(0), rep = dt_replicate();
    dt_tensor_t ag, a, bm;
    CHECK(dt_tensor_zeros(mesh, DT_F32, 2, ag_shape, &s0, &ag));
    CHECK(dt_tensor_zeros(mesh, DT_F32, 2, mm_shape, &rep, &a));
    CHECK(dt_tensor_zeros(mesh, DT_F32, 2, mm_shape, &rep, &bm));
    double tc[64], tp[64], tb[64];
    for (int k = -1; k < rounds; k++) { /* k = -1: warm-up */
      for (int mode = 0; mode < 3; mode++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now_us();
        for (int i = 0; i < iters; i++) {
          dt_tensor_t g = NULL, c = NULL;
          dt_work_t w = NULL;
          if (mode != 1) CHECK(dt_tensor_redistribute_async(ag, &rep, &g, &w));
          if (mode != 0) CHECK(dt_mm(a, bm, &c));
          if (mode != 1) CHECK(dt_work_wait(w));
          CHECK(dt_backend_synchronize(be));
          if (w) CHECK(dt_work_destroy(w));
          if (g) CHECK(dt_tensor_destroy(g));
          if (c) CHECK(dt_tensor_destroy(c));
        }
        double t = (now_us() - t0) / iters, tmax = 0;
        MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (k >= 0) (mode == 0 ? tc : mode == 1 ? tp : tb)[k] = tmax;
      }
    }
    qsort(tc, (size_t)rounds, sizeof *tc, cmp_d);
    qsort(tp, (size_t)rounds, sizeof *tp, cmp_d);
    qsort(tb, (size_t)rounds, sizeof *tb, cmp_d);
    double c = tc[rounds / 2], p = tp[rounds / 2], b = tb[rounds / 2];
    frac = (c + p - b) / (c < p ? c : p);
    if (me == 0)
      printf("overlap: all-gather alone %.1f us, mm 2048^3 alone %.1f us, together %.1f us: "
             "overlapped fraction %.2f\n", c, p, b, frac);
    CHECK(dt_tensor_destroy(ag));
    CHECK(dt_tensor_destroy(a));
    CHECK(dt_tensor_destroy(bm));
  }
  if (me == 0)
    printf("nccl_vs_raw=%.3f overhead_us=%.1f overlap_fraction=%.2f plane=%s\n", worst, overhead,
           frac, plane && !strcmp(plane, "mpi") ? "mpi" : "auto");
  NC(N.destroy(r.comm));
  CU(cudaStreamDestroy(r.s));
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}
