/* fsdp.c - tokens/s of data-parallel training of bench_train's Llama-style model: one rank with
 * no wrapper, DDP (dt_data_parallel) or FSDP (dt_fully_shard on every block, then on the root).
 * One configuration per run; bench/fsdp.sh runs the sizes and modes alternately with PyTorch's
 * DistributedDataParallel (bench/fsdp_torch.py) and prints the table.
 *
 *   mpirun -np 2 build/bench/bench_fsdp --parallel none|alone|ddp|fsdp [--steps N] [--dim D]
 *       [--layers L] [--heads H] [--vocab V] [--ffn F] [--batch B] [--seq S]
 *
 * The batch is B x S tokens per rank (the global batch B np x S, Shard(0) on the batch dim of a
 * 1-D mesh of all ranks); one step = forward, backward, gradient clipping (max norm 1), AdamW,
 * zeroing the gradients. DDP: parameters created replicated (plan "*=R"), the root module wrapped
 * with the default bucket size. FSDP: dt_fsdp_config_default(1) (reshard after forward, prefetch,
 * f32) on every block but the last, whose gathered parameters are kept for the backward
 * (reshard_after_forward 0), as are the root's (torchtitan's wrapping; FSDP2 never reshards the
 * root). alone: every rank trains its own copy on a mesh of itself (no communication at all), the
 * throughput np independent single-rank runs reach on this machine together, which bounds what
 * any data-parallel run can reach (shared cores, cache and memory bandwidth).
 * Step time is the slowest rank's, each step starting after a barrier; step 0 is a warmup.
 * Last line:
 *   result parallel=<p> np=<n> params=<count> step_ms=<best> median_ms=<median> tokens_per_s=<x>
 *          peak_mib=<m>
 * with tokens_per_s = global tokens per step / best step time and peak_mib the largest per-rank
 * peak of the library's memory accounting (dt_memory_stats) over the steps after the warmup.
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"

static long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void usage(const char* prog) {
  fprintf(stderr,
          "usage: %s --parallel none|alone|ddp|fsdp [--steps N] [--dim D] [--layers L] [--heads H] "
          "[--vocab V] [--ffn F] [--batch B (per rank)] [--seq S]\n",
          prog);
}

int main(int argc, char** argv) {
  const char* parallel = NULL;
  int steps = 6, dim = 256, layers = 10, heads = 8, vocab = 4096, ffn = 688, B = 8, S = 128;
  CHECK(dt_init(&argc, &argv));
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v == NULL) {
      usage(argv[0]);
      return 2;
    }
    i++;
    if (!strcmp(a, "--parallel")) parallel = v;
    else if (!strcmp(a, "--steps")) steps = atoi(v);
    else if (!strcmp(a, "--dim")) dim = atoi(v);
    else if (!strcmp(a, "--layers")) layers = atoi(v);
    else if (!strcmp(a, "--heads")) heads = atoi(v);
    else if (!strcmp(a, "--vocab")) vocab = atoi(v);
    else if (!strcmp(a, "--ffn")) ffn = atoi(v);
    else if (!strcmp(a, "--batch")) B = atoi(v);
    else if (!strcmp(a, "--seq")) S = atoi(v);
    else {
      usage(argv[0]);
      return 2;
    }
  }
  if (parallel == NULL ||
      (strcmp(parallel, "none") && strcmp(parallel, "alone") && strcmp(parallel, "ddp") &&
       strcmp(parallel, "fsdp")) ||
      steps < 2) {
    usage(argv[0]);
    return 2;
  }
  openblas_set_num_threads(1);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);

  const int alone = !strcmp(parallel, "alone"), one = 1;
  dt_mesh_t mesh; /* alone: a mesh of this rank only */
  CHECK(dt_mesh_create(1, alone ? &one : &world, NULL, alone ? &rank : NULL, &mesh));
  dt_llama_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.dim = dim;
  cfg.n_layers = layers;
  cfg.n_heads = heads;
  cfg.vocab = vocab;
  cfg.ffn_dim = ffn;
  cfg.seq_len = S;
  cfg.seed = 1;
  dt_llama_t m;
  int is_ddp = !strcmp(parallel, "ddp"), is_fsdp = !strcmp(parallel, "fsdp");
  CHECK(dt_llama_create(mesh, &cfg, is_ddp ? "*=R" : NULL, &m));
  dt_module_t root;
  CHECK(dt_llama_module(m, &root));
  if (is_ddp) {
    dt_ddp_config_t dc = {.mesh_dim = 0, .bucket_nbytes = 0}; /* 25 MiB buckets */
    CHECK(dt_data_parallel(root, mesh, &dc));
  } else if (is_fsdp) {
    /* torchtitan's wrapping: every block resharded after its forward but the last one, whose
     * backward comes right after the root's (it would be gathered again at once), and the root
     * kept gathered (its backward starts as soon as its forward ends: FSDP2 does not reshard
     * the root either) */
    dt_fsdp_config_t fc = dt_fsdp_config_default(1), keep = fc;
    keep.reshard_after_forward = 0;
    for (int l = 0; l < layers; l++) {
      char path[32];
      dt_module_t block;
      snprintf(path, sizeof path, "layers.%d", l);
      CHECK(dt_module_find(root, path, &block));
      CHECK(dt_fully_shard(block, mesh, l == layers - 1 ? &keep : &fc));
    }
    CHECK(dt_fully_shard(root, mesh, &keep));
  }
  dt_var_t* p;
  int np;
  int64_t nparam;
  CHECK(dt_llama_params(m, &p, NULL, &np, &nparam));
  dt_adamw_config_t ac = {1e-3, 0.9, 0.95, 1e-8, 0.1, 0};
  dt_adamw_t opt;
  CHECK(dt_adamw_create(&ac, np, p, &opt));
  dt_tape_t tape;
  CHECK(dt_tape_create(&tape));
  dt_corpus_t corpus;
  CHECK(dt_corpus_markov(256, 1, 1 << 16, 3, &corpus));

  const int GB = alone ? B : B * world; /* global batch (alone: this rank's model's) */
  int64_t* tok = malloc(sizeof(int64_t) * (size_t)GB * S);
  int64_t* tgt = malloc(sizeof(int64_t) * (size_t)GB * S);
  double* times = malloc(sizeof(double) * (size_t)steps);
  if (tok == NULL || tgt == NULL || times == NULL) {
    fprintf(stderr, "bench_fsdp: out of memory\n");
    return 1;
  }
  dt_placement_t bpl = world > 1 && !alone ? dt_shard(0) : dt_replicate();
  const int64_t shape[2] = {GB, S};
  if (rank == 0)
    printf("# bench_fsdp: %s, np %d, %lld parameters (dim %d, %d layers, %d heads, vocab %d, "
           "ffn %d), batch %dx%d per rank, 1 OpenBLAS thread per rank\n",
           parallel, world, (long long)nparam, dim, layers, heads, vocab, ffn, B, S);
  for (int step = 0; step < steps; step++) {
    CHECK(dt_corpus_batch(corpus, 5, step, GB, S, tok, tgt));
    for (int i = 0; i < GB * S; i++) tok[i] = (tok[i] * 16 + step) % vocab;
    for (int i = 0; i < GB * S; i++) tgt[i] = (tgt[i] * 16 + step) % vocab;
    dt_tensor_t tt, gt;
    CHECK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &bpl, tok, &tt));
    CHECK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &bpl, tgt, &gt));
    MPI_Barrier(MPI_COMM_WORLD);
    long f0 = minor_faults();
    double t0 = now_us();
    dt_var_t loss;
    CHECK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
    double t1 = now_us();
    CHECK(dt_tape_backward(tape, loss));
    double t2 = now_us();
    float lv;
    CHECK(dt_tensor_gather_full(dt_var_value(loss), &lv, sizeof lv));
    CHECK(dt_tape_reset(tape));
    CHECK(dt_clip_grad_norm(np, p, 1.0, NULL));
    CHECK(dt_adamw_step(opt, 1e-3));
    for (int i = 0; i < np; i++) CHECK(dt_var_zero_grad(p[i]));
    double t3 = now_us();
    long faults = minor_faults() - f0;
    /* the step, then this rank's forward, backward and update (clip, AdamW, zeroing) */
    double mine[4] = {(t3 - t0) * 1e-3, (t1 - t0) * 1e-3, (t2 - t1) * 1e-3, (t3 - t2) * 1e-3},
           slow[4];
    MPI_Allreduce(mine, slow, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    times[step] = slow[0];
    if (rank == 0) {
      printf("step %d loss %.4f time %.1f ms (slowest rank's forward %.1f, backward %.1f, "
             "update %.1f; rank 0: %ld page faults)\n",
             step, lv, slow[0], slow[1], slow[2], slow[3], faults);
      fflush(stdout);
    }
    dt_tensor_destroy(tt);
    dt_tensor_destroy(gt);
    if (step == 0) CHECK(dt_memory_reset_peak()); /* peaks of the steady steps */
  }
  qsort(times + 1, (size_t)(steps - 1), sizeof(double), cmp_double); /* step 0: warmup */
  double best = times[1], median = times[1 + (steps - 1) / 2];
  dt_memory_stats_t ms;
  CHECK(dt_memory_stats(&ms));
  double peak_mib = (double)ms.total_peak / (1 << 20), peak_max;
  MPI_Allreduce(&peak_mib, &peak_max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    printf("result parallel=%s np=%d params=%lld step_ms=%.1f median_ms=%.1f tokens_per_s=%.1f "
           "peak_mib=%.1f\n",
           parallel, world, (long long)nparam, best, median,
           (double)B * world * S / (best * 1e-3),
           peak_max);
  free(tok);
  free(tgt);
  free(times);
  dt_tape_destroy(tape);
  dt_adamw_destroy(opt);
  dt_llama_destroy(m);
  dt_corpus_destroy(corpus);
  dt_mesh_destroy(mesh);
  dt_finalize();
  return 0;
}
