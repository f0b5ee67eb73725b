/* train.c - trains a Llama-style model (dense or MoE) on a sharded mesh with dtensor.
 *
 *   mpirun -np 4 build/examples/train [--config FILE.json] [--mesh 4|2x2] [--model dense|moe]
 *       [--steps N] [--batch B] [--seq S] [--dim D] [--layers L] [--heads H] [--kv-heads G]
 *       [--experts E] [--top-k K] [--capacity-factor X] [--vocab V] [--order K]
 *       [--data markov|PATH] [--lr X] [--warmup N] [--clip X] [--seed N] [--plan "pattern=placements;..."]
 *       [--metrics FILE.jsonl] [--plot FILE.png] [--bf16-moments] [--checkpoint]
 *       [--parallel none|ddp|fsdp|hsdp] [--reshard-after-forward N] [--param-dtype f32|bf16]
 *       [--prefetch 0|1] [--bucket-mb X] [--dp N] [--tp N] [--ep N] [--sp] [--loss-parallel]
 *       [--async-tp] [--device cpu|cuda|cuda-emu] [--tie-embeddings]
 *       [--checkpoint-dir DIR] [--checkpoint-every N] [--keep-last K] [--async-checkpoint]
 *       [--resume] [--resume-from DIR[/NAME]] [--micro-batches K] [--ffn-dim F]
 *       [--estimate-only --np N [--estimate-rank R] [--machine h100|h200|FILE.json]
 *        [--gpus-per-node G] [--routing-imbalance X]]
 *   build/examples/train --help     (every flag, grouped, with its default; the JSON keys)
 *
 * --checkpoint-dir saves distributed checkpoints (dtensor/checkpoint.h) every --checkpoint-every
 * steps and after the last one: parameters, AdamW state and the step, loadable onto any mesh and
 * parallel config; --resume continues from the newest one there (e.g. saved by FSDP on 4 ranks,
 * resumed with --tp 2 on 2). A line per save gives its size, time and the stall. --steps 0 saves
 * the initial weights (a seed checkpoint: build on one rank, load onto any layout).
 * --resume-from DIR/NAME (or DIR, whose `latest` names one) starts from that checkpoint instead
 * (saving to --checkpoint-dir, if any); with no step left to train it saves what it loaded, i.e.
 * converts a checkpoint to this layout. A checkpoint of parameters only (dtensor-ckpt import of
 * another tool's safetensors) is a seed: AdamW starts fresh and training at step 0.
 *
 * --device puts every tensor on that backend (include/dtensor/backend.h): cpu (default), cuda
 * (this rank's GPU: the local rank modulo the GPU count, or $DTENSOR_CUDA_DEVICE; several ranks
 * may share one GPU, communication is staged through host memory) or cuda-emu (the CUDA kernels
 * on the SIMT emulator: for tests, slow). On a cuda device --param-dtype defaults to bf16: FSDP
 * keeps f32 sharded parameters and AdamW state (the optimizer's math in f32) and gathers and
 * computes in bf16 (GEMMs on tensor cores with f32 accumulation); the loss is f32. MFU is then
 * against the bf16 GEMM rate the device reaches at startup (dt_mm of 8192^2 bf16 matrices on
 * every rank at once: the device's rate when several ranks share it).
 *
 * --parallel picks how the ranks share the work (default none):
 *   none  tensor parallelism by --plan (below) on the mesh; tokens replicated;
 *   ddp   data parallelism (dt_data_parallel): replicated parameters, gradients all-reduced in
 *         buckets of --bucket-mb MiB (default 25);
 *   fsdp  fully sharded data parallelism (dt_fully_shard): one group per block, then the root;
 *         --reshard-after-forward 1 (default, ZeRO-3), 0 (ZeRO-2) or k > 1 (keep a 1/k slice;
 *         k must divide the rank count) for every block but the last (the last block and the
 *         root keep their gathered parameters until the backward, as in torchtitan), --param-dtype f32|bf16 (gather and compute; gradients
 *         are reduced in f32, the model's output, the loss, is cast to f32), --prefetch 0|1
 *         (default 1, forward and backward);
 *   hsdp  fsdp sharded over mesh dim 1 and replicated over dim 0: needs --mesh RxS (e.g. 2x2).
 * ddp and fsdp run on a 1-D mesh over all ranks (a --mesh of more than one dim is refused). For
 * all three the model is built with every parameter replicated ("*=R") and then wrapped (fsdp,
 * hsdp and the parallel config below build it as layouts, dt_llama_config_t.defer_init, and fill
 * each rank's shards after wrapping: no rank holds the whole model), so a
 * --plan (other than the default) is refused; the tokens and targets are Shard(0) on the batch dim over every
 * mesh dim (--batch must be at least the rank count; an uneven batch follows the chunk rule).
 * The optimizer and gradient clipping work on the parameters the wrapper leaves (sharded ones
 * for fsdp/hsdp).
 *
 * The parallel config --dp D --tp T --ep E (and the JSON keys dp, tp, ep, cp, sp, loss_parallel), in
 * place of --parallel, --mesh and --plan: D x T x E must be the world size. The mesh is (tp, dp)
 * of T x D E ranks, a tp group on adjacent ranks; the model is built replicated, then tensor
 * parallel over tp (dt_tp_plan_llama: Megatron-LM; --sp keeps the residual stream sequence
 * sharded, --loss-parallel feeds class-sharded logits to the loss), then FSDP over dp (as
 * --parallel fsdp: --reshard-after-forward, --param-dtype, --prefetch apply). Tokens are
 * sharded over dp, replicated over tp. --tp must divide the heads, kv heads, vocabulary, MLP
 * width (and --seq with --sp). --ep E (--model moe, a multiple of E experts) splits each layer's
 * stacked experts Shard(0) over E ranks (expert parallelism: tokens go to their experts' ranks
 * by a ragged all-to-all), the dense parameters still FSDP over all D E data ranks. With --dp 1
 * the ep ranks are the dp dim itself; with D > 1 the experts live on a second view of the world,
 * the expert mesh (ep, tp, efsdp) = (E, T, D) (torchtitan's, fsdp x tp = efsdp x ep x tp),
 * where position (e, t, f) is the dense mesh's (t, f E + e): the experts are Shard(0) on ep and
 * FSDP-sharded over tp x efsdp (one group per layer's experts, inside the block's group). A MoE
 * layer takes its tokens sequence-sharded over tp (each tp rank routes and dispatches or
 * computes its own), so tp is a data dim for the experts: under EP they shard over it with
 * efsdp; without --ep they are whole on every rank, and with FSDP form a group of their own
 * over (tp, dp[, cp]) flattened.
 * --cp C (context parallelism, dt_llama_set_context_parallel) adds a cp dim: the mesh is
 * (tp, dp, cp), rank (d C + c) T + t; each sequence is permuted on the host to the load-balanced
 * order (2 C chunks, rank c holds c and 2 C - 1 - c; --seq a multiple of 2 C) and sharded over
 * cp, attention runs as ring attention, FSDP shards the parameters over dp and cp together
 * (shard_span 2; with --ep and D > 1 the expert mesh is (ep, tp, efsdp, cp), the experts
 * sharded over tp, efsdp and cp); --sp splits each cp rank's tokens over tp (--seq / C a multiple
 * of T). The traffic lines add one for collectives merged over flattened dims.
 *
 * --tie-embeddings ties the output projection to the token embedding (GPT-2, Llama 3.2 1B/3B):
 * one (V, D) parameter held by the modules tok_emb and output (dt_llama_config_t.tie_embeddings),
 * counted once in the parameter count, stepped once by AdamW, its gradient the sum of the lookup's
 * and the projection's. It has one placement: by the plan's tok_emb entry, so with the default
 * plan both are Shard(0) (vocabulary-parallel: Partial lookups, class-sharded logits) instead of
 * the untied embedding's Shard(1); under --tp both styles (embedding rowwise, colwise) shard the
 * vocabulary too; FSDP groups it with the root (the lowest module holding both uses), DDP
 * reduces its gradient once. A --plan that places output and tok_emb differently is refused.
 *
 * --micro-batches K runs each step's batch as K sequential passes of B/K sequences (gradient
 * accumulation): each pass's loss scaled by 1/K, FSDP/HSDP and DDP reduce after the last pass only
 * (dt_fsdp_set_requires_gradient_sync, dt_ddp_set_requires_gradient_sync), so the step is the
 * same in less activation memory; every data rank needs a sequence per pass.
 *
 * --estimate-only simulates instead (dt_init_simulated, no MPI): --steps (at most 2) on a world
 * of --np ranks as rank --estimate-rank; prints that rank's peak memory per category, the
 * traffic and the simulated step time (estimate_step ...); --machine prices the time
 * (tools/dtensor-estimate runs this per layout).
 *
 * --checkpoint turns on selective activation checkpointing (matmul outputs saved, pointwise ops and
 * views recomputed); the first step reports the activation memory it saved.
 * Flags override the JSON config (same keys without the dashes, '-' as '_'). Each step prints
 * step, loss, learning rate, tokens/s, achieved GFLOP/s and MFU against the peak GEMM rate measured
 * on this machine at startup (OpenBLAS, one thread per rank); metrics go to a JSONL file and, with
 * gnuplot installed, the loss curve (with its 10-step mean and the corpus entropy floor) to a PNG
 * (--plot, independent of --metrics). At the end one line per mesh dim gives the last step's
 * collectives on it (rank 0's counters: calls and bytes per collective), one line per rank its peak memory by
 * category (dt_memory_stats: parameters, gradients, optimizer, activations, communication, other,
 * and the peak total), then the last line is
 *   final_loss=<mean of the last 10 losses> entropy_floor=<corpus floor> tokens_per_s=<mean>
 * tokens_per_s is the mean over the steps after this run's first two (warm-up: the plan and
 * propagation caches fill); when no step is left after them (--steps 1 or 2, or a resume that
 * runs one or two steps) it is the mean over the steps that ran, and a "# tokens_per_s" line
 * before it says so. It is 0 only when no step ran.
 * The default plan is Megatron-style tensor parallelism: column-parallel wq/wk/wv/w1/w3 and the
 * output projection (Shard(0) of (out, in) weights), row-parallel wo/w2 (Shard(1)), the
 * embedding sharded on its hidden dim, norms replicated; the MoE's stacked experts the same way
 * on their hidden dim F (w1/w3 (E, F, D) Shard(1), w2 (E, D, F) Shard(2)), the router replicated.
 * A plan that puts the experts Shard(0) on one mesh dim (and Replicate on the others), e.g.
 * "*.experts.*=S(0);..." on a 1-D mesh, runs them expert-parallel over that dim (dt_nn_moe); the
 * first step says which ("# moe: ...") and how many routing choices --capacity-factor (0, the
 * default: dropless; c: each expert keeps ceil(c tokens top_k / E), see dt_nn_moe) dropped.
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <time.h>

#include "dtensor/check.h"
#include "dtensor/dtensor.h"
#include "dtensor/nn.h"
#include "train_config.h"

#define DEFAULT_PLAN                                                                      \
  "*.experts.w1=S(1);*.experts.w3=S(1);*.experts.w2=S(2);"                              \
  "*.wq=S(0);*.wk=S(0);*.wv=S(0);*.w1=S(0);*.w3=S(0);*.wo=S(1);*.w2=S(1);output=S(0);" \
  "tok_emb=S(1);*.router=R"
/* --tie-embeddings: one (V, D) table for the embedding and the output projection, one placement:
 * the vocabulary sharded for both (Megatron's vocabulary-parallel embedding with the column-
 * parallel output it ties; PyTorch's tensor-parallel Transformer test does the same) */
#define DEFAULT_PLAN_TIED                                                                 \
  "*.experts.w1=S(1);*.experts.w3=S(1);*.experts.w2=S(2);"                              \
  "*.wq=S(0);*.wk=S(0);*.wv=S(0);*.w1=S(0);*.w3=S(0);*.wo=S(1);*.w2=S(1);output=S(0);" \
  "tok_emb=S(0);*.router=R"

/* --machine h100|h200 (--estimate-only): figures for the step time of a GPU run. Assumed, not
 * measured here: compute from this project's H200 measurement (bench_gpu: bf16 GEMM 798 TFLOP/s
 * at 8192^3, f32 with TF32 401 at 4096^3; H100 SXM has the same SMs), less at training shapes,
 * and the HBM bandwidth at ~80% of the data sheet's (3.35 TB/s H100 SXM, 4.8 H200); NVLink 4
 * collectives at ~350 GB/s bus bandwidth and 8 x 400 Gb/s InfiniBand at ~45 GB/s per GPU, the
 * figures nccl-tests reach on DGX H100 nodes. A dim whose group spans nodes (--gpus-per-node)
 * is priced by "inter_node". Attention at this project's kernels' measured rate: 25.8 TFLOP/s
 * (sdpa and its gradient under DTENSOR_SDPA_PATH=auto, bf16, B 8, S 1024, 14 heads of 64, causal,
 * on an H200 on 2026-11-29: 52.7 GFLOP in 0.455 + 1.588 ms; 36.5 at 16 heads of 128), far below
 * the GEMM rate. Replace them with a calibrated file for real planning. */
#define MACHINE_LINKS(bw_in, base_in, hop_in)                                                   \
  "\"all_gather\":{\"base_us\":" base_in ",\"hop_us\":" hop_in ",\"bw_gbps\":" bw_in "},"         \
  "\"reduce_scatter\":{\"base_us\":" base_in ",\"hop_us\":" hop_in ",\"bw_gbps\":" bw_in "},"     \
  "\"all_reduce\":{\"base_us\":" base_in ",\"hop_us\":" hop_in ",\"bw_gbps\":" bw_in "},"         \
  "\"all_to_all\":{\"base_us\":" base_in ",\"hop_us\":" hop_in ",\"bw_gbps\":" bw_in "},"         \
  "\"broadcast\":{\"base_us\":" base_in ",\"hop_us\":" hop_in ",\"bw_gbps\":" bw_in "},"          \
  "\"scatter\":{\"base_us\":" base_in ",\"hop_us\":" hop_in ",\"bw_gbps\":" bw_in "},"            \
  "\"reduce_scatter_a2a\":{\"base_us\":100,\"hop_us\":" hop_in ",\"bw_gbps\":" bw_in "},"         \
  "\"all_reduce_a2a\":{\"base_us\":100,\"hop_us\":" hop_in ",\"bw_gbps\":" bw_in "}"
#define MACHINE_GPU(mem_gbps)                                                                   \
  "{\"compute\":{\"gemm_gflops\":350000,\"gemm_bf16_gflops\":700000,\"mem_gbps\":" mem_gbps      \
  ",\"op_us\":8,\"attn_gflops\":25800}," MACHINE_LINKS("350", "8", "0.5")                      \
  ",\"local\":{\"base_us\":0,\"hop_us\":0,\"bw_gbps\":" mem_gbps "},\"inter_node\":{"           \
  MACHINE_LINKS("45", "15", "3") "}}"
static const struct {
  const char *name, *json;
} kMachines[] = {{"h100", MACHINE_GPU("2700")}, {"h200", MACHINE_GPU("3800")}};

static int g_rank;
static int g_sim;  /* --estimate-only: a simulated world (dt_init_simulated), no MPI */
static int g_lead; /* the rank that prints: rank 0, or the simulated rank */

static void barrier(void) {
  if (!g_sim) MPI_Barrier(MPI_COMM_WORLD);
}

/* A mistake in how options combine: rank 0 says why, every rank leaves with status 2. */
static int usage_error(const char* fmt, ...) {
  if (g_lead) {
    va_list ap;
    va_start(ap, fmt);
    fputs("train: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n", stderr);
    va_end(ap);
  }
  dt_finalize();
  return 2;
}

/* " / --micro-batches M (= N sequences a pass)" after a --batch in a message, "" for one pass. */
static const char* mb_note(int batch, int micro) {
  static char note[96];
  if (micro <= 1) return "";
  snprintf(note, sizeof note, " / --micro-batches %d (= %d sequences a pass)", micro,
           batch / micro);
  return note;
}

/* --freeze: every parameter whose name matches one of the comma-separated patterns (fnmatch: *,
 * ?, [...]; "tok_emb", "layers.0.*", "*norm") stops training: no gradient, no optimizer step.
 * Returns the count frozen and their elements, or -1 with the pattern that matched nothing in
 * err (a typo would otherwise train everything). Before wrapping, so that every wrapper sees the
 * parameter frozen (DDP leaves it out of its buckets). */
static int freeze_params(dt_llama_t model, const char* spec, int64_t* numel, char* err,
                         size_t cap) {
  dt_var_t* ps;
  const char* const* names;
  int n;
  if (dt_llama_params(model, &ps, &names, &n, NULL) != DT_SUCCESS) {
    snprintf(err, cap, "%s", dt_last_error());
    return -1;
  }
  int frozen = 0;
  *numel = 0;
  char pats[256];
  snprintf(pats, sizeof pats, "%s", spec);
  for (char *save = NULL, *pat = strtok_r(pats, ",", &save); pat;
       pat = strtok_r(NULL, ",", &save)) {
    int hits = 0;
    for (int i = 0; i < n; i++) {
      if (fnmatch(pat, names[i], 0) != 0) continue;
      hits++;
      int rg = 0, nd = 0;
      int64_t shape[DT_MAX_DIMS], k = 1;
      if (dt_var_requires_grad(ps[i], &rg) != DT_SUCCESS || !rg) continue; /* matched before */
      if (dt_var_set_requires_grad(ps[i], 0) != DT_SUCCESS ||
          dt_tensor_ndim(dt_var_value(ps[i]), &nd) != DT_SUCCESS ||
          dt_tensor_shape(dt_var_value(ps[i]), shape) != DT_SUCCESS) {
        snprintf(err, cap, "%s", dt_last_error());
        return -1;
      }
      for (int d = 0; d < nd; d++) k *= shape[d];
      frozen++;
      *numel += k;
    }
    if (hits == 0) {
      snprintf(err, cap, "--freeze pattern '%.64s' matches no parameter (names such as %s, %s, "
               "%s)", pat, n > 0 ? names[0] : "", n > 1 ? names[1] : "",
               n > 0 ? names[n - 1] : "");
      return -1;
    }
  }
  return frozen;
}

/* A failed library call ends the run: the library's message first, the call after it; exit
 * status 2 where the library refused a value (the flags asked for something it cannot do: a
 * usage error, as usage_error's), else 1. */
#define CHECK(call)                                                                         \
  do {                                                                                      \
    dt_status_t st_ = (call);                                                               \
    if (st_ != DT_SUCCESS) {                                                                \
      fprintf(stderr, "train: %s: %s (in %s)\n", dt_status_name(st_), dt_last_error(), #call); \
      if (g_sim) exit(st_ == DT_ERR_INVALID_ARG ? 2 : 1);                                   \
      MPI_Abort(MPI_COMM_WORLD, st_ == DT_ERR_INVALID_ARG ? 2 : 1);                         \
    }                                                                                       \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Peak GEMM rate of a device backend (GFLOP/s) reached by this rank: the best of a few n^3
 * bf16 products of replicated tensors (each rank multiplies its own copies, all at once). */
static double measure_peak_device(dt_mesh_t mesh, int n) {
  dt_placement_t rep[DT_MAX_MESH_DIMS];
  for (int i = 0; i < DT_MAX_MESH_DIMS; i++) rep[i] = dt_replicate();
  const int64_t shape[2] = {n, n};
  dt_tensor_t a, b, c;
  dt_backend_t be;
  CHECK(dt_mesh_backend(mesh, &be));
  CHECK(dt_tensor_randn(mesh, DT_BF16, 2, shape, rep, 1, &a));
  CHECK(dt_tensor_randn(mesh, DT_BF16, 2, shape, rep, 2, &b));
  CHECK(dt_mm(a, b, &c)); /* warm-up: heuristics, allocator */
  CHECK(dt_tensor_destroy(c));
  CHECK(dt_backend_synchronize(be));
  double best = 0.0;
  for (int r = 0; r < 5; r++) {
    barrier();
    double t0 = now_s();
    CHECK(dt_mm(a, b, &c));
    CHECK(dt_backend_synchronize(be));
    double dt = now_s() - t0;
    CHECK(dt_tensor_destroy(c));
    double g = 2.0 * n * n * (double)n / dt / 1e9;
    if (g > best) best = g;
  }
  CHECK(dt_tensor_destroy(a));
  CHECK(dt_tensor_destroy(b));
  return best;
}

/* Peak single-thread SGEMM rate on this machine (GFLOP/s), best of a few 256^3 products. */
static double measure_peak(void) {
  const int n = 256;
  float* a = malloc(sizeof(float) * n * n);
  float* b = malloc(sizeof(float) * n * n);
  float* c = malloc(sizeof(float) * n * n);
  for (int i = 0; i < n * n; i++) a[i] = b[i] = (float)(i % 7) * 0.1f;
  double best = 0.0;
  for (int r = 0; r < 10; r++) {
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double dt = now_s() - t0;
    double g = 2.0 * n * n * n / dt / 1e9;
    if (g > best) best = g;
  }
  free(a);
  free(b);
  free(c);
  return best;
}

/* --machine: loads the figures (a preset or a file) into the cost and compute models and keeps
 * its "inter_node" entries for price_dims. 0 on success, else a message in err. */
static cJSON* g_inter; /* the machine's inter_node object (NULL: every dim priced alike) */

/* The inter_node key of collective c (not "local") with algorithm a (1: the all-to-all form of
 * all_reduce and reduce_scatter) into key; 0 where (c, a) has none. */
static int inter_node_key(int c, int a, char* key, size_t cap) {
  if (c < 1 || c >= DT_COLL_COUNT || (a == 1 && c != DT_COLL_ALL_REDUCE &&
                                      c != DT_COLL_REDUCE_SCATTER))
    return 0;
  snprintf(key, cap, "%s%s", dt_collective_name((dt_collective_t)c), a ? "_a2a" : "");
  return 1;
}
static int load_machine(const char* machine, char* err, size_t cap) {
  const char* text = NULL;
  char* file = NULL;
  for (size_t i = 0; i < sizeof kMachines / sizeof kMachines[0]; i++)
    if (!strcmp(machine, kMachines[i].name)) text = kMachines[i].json;
  if (text == NULL) {
    struct stat sb; /* a FIFO would block the open */
    FILE* f = stat(machine, &sb) == 0 && S_ISREG(sb.st_mode) ? fopen(machine, "rb") : NULL;
    long len = -1;
    if (f != NULL && fseek(f, 0, SEEK_END) == 0) len = ftell(f);
    if (f == NULL || len < 0 || len > (1 << 20) || fseek(f, 0, SEEK_SET) != 0) {
      snprintf(err, cap, "--machine %s: not h100 or h200, and not a readable file of at most "
               "1 MiB", machine);
      if (f) fclose(f);
      return 1;
    }
    file = malloc((size_t)len + 1);
    size_t got = file ? fread(file, 1, (size_t)len, f) : 0;
    fclose(f);
    if (file == NULL) return snprintf(err, cap, "no memory"), 1;
    file[got] = '\0';
    text = file;
  }
  int rc = 0;
  if (dt_cost_model_load_string(text, strlen(text)) != DT_SUCCESS) {
    snprintf(err, cap, "--machine %s: %s", machine, dt_last_error());
    rc = 1;
  } else {
    cJSON* root = cJSON_Parse(text);
    cJSON* in = cJSON_DetachItemFromObjectCaseSensitive(root, "inter_node");
    cJSON_Delete(root);
    if (in != NULL && !cJSON_IsObject(in)) {
      snprintf(err, cap, "--machine %s: \"inter_node\" must be an object", machine);
      rc = 1;
    } else if (in != NULL) { /* every entry checked now, whether a dim spans nodes or not */
      char* it = cJSON_PrintUnformatted(in); /* the library's checks first, then price_dim's keys */
      if (it == NULL || dt_cost_model_check_string(it, strlen(it)) != DT_SUCCESS) {
        const char* why = it == NULL ? "no memory" : dt_last_error();
        const char* at = strstr(why, "cost model text: "); /* the library's prefix, renamed */
        snprintf(err, cap, "--machine %s: \"inter_node\": %s", machine,
                 at ? at + strlen("cost model text: ") : why);
        rc = 1;
      }
      free(it);
      for (cJSON* e = in->child; e != NULL && rc == 0; e = e->next) {
        int priced = 0;
        for (int c = 1; c < DT_COLL_COUNT && !priced; c++)
          for (int a = 0; a < 2 && !priced; a++) {
            char key[64];
            priced = inter_node_key(c, a, key, sizeof key) && e->string && !strcmp(key, e->string);
          }
        if (!priced) {
          snprintf(err, cap, "--machine %s: \"inter_node\": \"%s\" is not a collective priced "
                   "across nodes", machine, e->string ? e->string : "");
          rc = 1;
        }
      }
    }
    if (rc == 0) g_inter = in;
    else cJSON_Delete(in);
  }
  free(file);
  return rc;
}

/* Whether a group of `size` world ranks `stride` apart crosses a node boundary (nodes of
 * `per_node` consecutive ranks): the groups start at the ranks whose digit for that stride is 0
 * (the trainer's meshes number world ranks in mixed radix), and one crosses where its first and
 * last rank lie on different nodes (a group {2, 3} does at 3 ranks a node, though 1 apart). */
static int spans_nodes(int world, int stride, int size, int per_node) {
  for (int r = 0; r < world; r++)
    if ((r / stride) % size == 0 && r / per_node != (r + stride * (size - 1)) / per_node) return 1;
  return 0;
}

/* Mesh dim d of `mesh`, whose group is `size` world ranks `stride` apart: priced by the
 * --machine's inter_node figures when a group spans nodes of `per_node` ranks (a figure out of
 * range is refused with dt_mesh_set_cost_model's message). */
static dt_status_t price_dim(dt_mesh_t mesh, int d, int stride, int size, int per_node) {
  int world = 0;
  if (g_inter == NULL || size <= 1 || dt_world_size(&world) != DT_SUCCESS ||
      !spans_nodes(world, stride, size, per_node))
    return DT_SUCCESS;
  for (int c = 1; c < DT_COLL_COUNT; c++)
    for (int a = 0; a < 2; a++) {
      char key[64];
      cJSON* e = inter_node_key(c, a, key, sizeof key)
                     ? cJSON_GetObjectItemCaseSensitive(g_inter, key) : NULL;
      if (e == NULL) continue;
      dt_cost_params_t q = {cJSON_GetObjectItemCaseSensitive(e, "base_us")->valuedouble,
                            cJSON_GetObjectItemCaseSensitive(e, "hop_us")->valuedouble,
                            cJSON_GetObjectItemCaseSensitive(e, "bw_gbps")->valuedouble};
      dt_status_t st = dt_mesh_set_cost_model(mesh, d, (dt_collective_t)c, (dt_coll_algo_t)a, &q);
      if (st != DT_SUCCESS) return st;
    }
  return DT_SUCCESS;
}

/* Expert parallelism for the parallel config: each layer's stacked experts (E, ...) become
 * Shard(0) over the data dim (1) of the (tp, dp) mesh (emesh NULL: --dp 1, the ep ranks are all
 * the data ranks; FSDP leaves the experts as they are), or over the ep dim (0) of the expert
 * mesh (ep, tp, efsdp), another view of the same ranks (FSDP then shards them over tp x efsdp).
 * dt_nn_moe dispatches tokens to their experts' ranks with a ragged all-to-all. */
static dt_status_t shard_experts(dt_module_t root, int layers, dt_mesh_t emesh) {
  static const char* const w[3] = {"w1", "w3", "w2"};
  /* Shard(0) on dp of the (tp, dp) mesh, or on ep of the expert mesh (ep, tp, efsdp) */
  const dt_placement_t dense_pl[4] = {dt_replicate(), dt_shard(0), dt_replicate(),
                                      dt_replicate()};
  const dt_placement_t pl[4] = {dt_shard(0), dt_replicate(), dt_replicate(), dt_replicate()};
  for (int l = 0; l < layers; l++)
    for (int k = 0; k < 3; k++) {
      char name[64];
      snprintf(name, sizeof name, "layers.%d.experts.%s", l, w[k]);
      dt_var_t v, nv;
      dt_tensor_t t;
      int rg = 1; /* a frozen expert (--freeze) stays frozen on its new layout */
      dt_status_t st = dt_module_param(root, name, &v);
      if (st == DT_SUCCESS) st = dt_var_requires_grad(v, &rg);
      if (st == DT_SUCCESS && emesh == NULL) {
        st = dt_tensor_redistribute(dt_var_value(v), dense_pl, &t);
      } else if (st == DT_SUCCESS) { /* replicated on the dense mesh: this rank's copy is whole */
        int64_t shape[3], n = 0;
        size_t item = 0;
        dt_dtype_t dt;
        void* data = NULL;
        st = dt_tensor_shape(dt_var_value(v), shape);
        if (st == DT_SUCCESS) st = dt_tensor_dtype(dt_var_value(v), &dt);
        if (st == DT_SUCCESS) st = dt_dtype_itemsize(dt, &item);
        if (st == DT_SUCCESS) st = dt_tensor_local_numel(dt_var_value(v), &n);
        int meta = 0;
        if (st == DT_SUCCESS) st = dt_tensor_is_meta(dt_var_value(v), &meta);
        if (st == DT_SUCCESS && (g_sim || meta)) { /* simulated, or deferred init: no values to
                                                    * carry over (the layout on the expert mesh) */
          st = meta ? dt_tensor_meta(emesh, dt, 3, shape, pl, &t)
                    : dt_tensor_empty(emesh, dt, 3, shape, pl, &t);
          if (st != DT_SUCCESS) return st;
          goto have;
        }
        if (st == DT_SUCCESS && (data = malloc(item * (size_t)(n ? n : 1))) == NULL)
          st = DT_ERR_OUT_OF_MEMORY;
        /* through host memory: the values may live on a device */
        if (st == DT_SUCCESS) st = dt_tensor_read_local(dt_var_value(v), 0, n, data);
        if (st == DT_SUCCESS) st = dt_tensor_from_full(emesh, dt, 3, shape, pl, data, &t);
        free(data);
      }
      if (st != DT_SUCCESS) return st;
    have:
      st = dt_var_leaf(t, rg, &nv);
      if (st != DT_SUCCESS) {
        dt_tensor_destroy(t);
        return st;
      }
      st = dt_module_set_param(root, name, nv);
      if (st != DT_SUCCESS) {
        dt_var_destroy(nv);
        return st;
      }
    }
  return DT_SUCCESS;
}

/* torchtitan's wrapping: every block but the last reshards after its forward as configured; the
 * last block (its backward comes right after the root's: it would be gathered again at once) and
 * the root (its backward starts as soon as its forward ends; FSDP2 never reshards the root) keep
 * their gathered parameters. */
static dt_fsdp_config_t keep_gathered(dt_fsdp_config_t fc) {
  fc.reshard_after_forward = 0;
  return fc;
}

/* FSDP for the parallel config: over the dp dim (1) of the (tp, dp) mesh, one group per block
 * and the root, the loss in f32. With context parallelism ((tp, dp, cp) mesh) over dp and cp
 * together (shard_span 2, torchtitan's dp_shard_cp): the parameters are sharded over every rank
 * that sees other tokens, and their gradients, partial sums over dp and cp, are reduce-scattered
 * over both by one collective per group. */
static dt_status_t shard_blocks(dt_module_t root, int layers, dt_mesh_t mesh, dt_mesh_t emesh,
                                const train_opts_t* o) {
  dt_fsdp_config_t fc = dt_fsdp_config_for(1, -1); /* over dp (mesh dim 1) and cp (2) */
  fc.shard_span = o->cp > 1 ? 2 : 1;
  fc.reshard_after_forward = o->reshard_after_forward;
  fc.param_dtype = !strcmp(o->param_dtype, "bf16") ? DT_BF16 : DT_F32;
  fc.prefetch_forward = fc.prefetch_backward = o->prefetch;
  /* the experts under EP: over (tp, efsdp[, cp]) (dims 1.. of the expert mesh) flattened: each
   * tp rank dispatches its own tokens, so tp is a data dim for the experts (their gradients,
   * partial over tp as over efsdp, reduce-scattered in one collective; with fewer experts per ep
   * rank than those ranks FSDP splits their F) */
  dt_fsdp_config_t efc = fc;
  efc.shard_dim = o->tp > 1 ? 1 : 2;
  efc.shard_span = fc.shard_span + (o->tp > 1);
  /* MoE under TP without expert parallelism: the experts are whole on every tp rank, each rank
   * computing them on its own tokens, so tp is a data dim for them: a group of their own over
   * (tp, dp[, cp]) flattened holds 1/(T D CP) of their parameters, gradients and optimizer state
   * per rank, and reduce-scatters their gradients (partial over tp as over dp) in one collective.
   * Where the E experts split evenly over those ranks, or are fewer (FSDP then splits their F);
   * an uneven split of E would pad every rank's segment to the largest share */
  const int ranks = o->tp * (o->dp > 1 ? o->dp : 1) * (o->cp > 1 ? o->cp : 1);
  const int tp_experts = emesh == NULL && !strcmp(o->model, "moe") && o->tp > 1 &&
                         o->ep <= 1 && (o->experts % ranks == 0 || o->experts < ranks);
  dt_fsdp_config_t tfc = fc;
  tfc.shard_dim = 0;
  tfc.shard_span = fc.shard_span + 1;
  for (int l = 0; l < layers; l++) {
    char path[48];
    dt_module_t blk;
    dt_status_t st = DT_SUCCESS;
    if (emesh != NULL || tp_experts) {
      snprintf(path, sizeof path, "layers.%d.experts", l);
      st = dt_module_find(root, path, &blk);
      dt_fsdp_config_t ec = emesh != NULL ? efc : tfc;
      if (l == layers - 1) ec = keep_gathered(ec);
      if (st == DT_SUCCESS) st = dt_fully_shard(blk, emesh != NULL ? emesh : mesh, &ec);
    }
    snprintf(path, sizeof path, "layers.%d", l);
    if (st == DT_SUCCESS) st = dt_module_find(root, path, &blk);
    if (st == DT_SUCCESS) {
      dt_fsdp_config_t bc = l == layers - 1 ? keep_gathered(fc) : fc;
      st = dt_fully_shard(blk, mesh, &bc);
    }
    if (st != DT_SUCCESS) return st;
  }
  fc.output_dtype = DT_F32;
  dt_fsdp_config_t rc = keep_gathered(fc);
  return dt_fully_shard(root, mesh, &rc);
}

/* Copies s into a gnuplot double-quoted string without the characters that would end or escape
 * it. */
static void gp_text(char* dst, size_t cap, const char* s) {
  size_t n = 0;
  for (; *s && n + 1 < cap; s++) dst[n++] = (*s == '"' || *s == '\\' || *s == '\n') ? '_' : *s;
  dst[n] = '\0';
}

/* Whether this process can write `path` (--metrics, --plot): a directory cannot be, another
 * existing file that is not a regular one (a device, a FIFO) is left to the user; a regular file
 * or a new one is opened for appending (its bytes kept) and a new one removed again. errno says
 * why not. */
static int can_write(const char* path) {
  struct stat sb;
  const int existed = stat(path, &sb) == 0;
  if (existed && S_ISDIR(sb.st_mode)) {
    errno = EISDIR;
    return 0;
  }
  if (existed && !S_ISREG(sb.st_mode)) return 1;
  FILE* f = fopen(path, "a");
  if (f == NULL) return 0;
  fclose(f);
  if (!existed) remove(path);
  return 1;
}

/* Whether this process can create files under directory `dir` (--checkpoint-dir; the save
 * creates it when missing): a file is made and removed in it, or in its nearest existing
 * ancestor when it does not exist yet. errno says why not. */
static int can_write_dir(const char* dir) {
  char at[4096];
  if (snprintf(at, sizeof at, "%s", dir) >= (int)sizeof at) {
    errno = ENAMETOOLONG;
    return 0;
  }
  struct stat sb;
  while (stat(at, &sb) != 0) { /* up to the nearest existing ancestor */
    char* slash = strrchr(at, '/');
    if (slash == NULL) snprintf(at, sizeof at, ".");
    else if (slash == at) at[1] = '\0';
    else *slash = '\0';
  }
  if (!S_ISDIR(sb.st_mode)) {
    errno = ENOTDIR;
    return 0;
  }
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/.train_write_probe_XXXXXX", at);
  int fd = mkstemp(probe);
  if (fd < 0) return 0;
  close(fd);
  remove(probe);
  return 1;
}

/* Draws the loss curve to o->plot with gnuplot: the loss of every step, its mean over the last 10
 * steps and, when the corpus has one, its entropy floor. The path has no quotes, '$' or '\'
 * (train_opts_set refuses them), so it is safe inside a single-quoted gnuplot string. */
static void plot_losses(const train_opts_t* o, const char* title, const char* subtitle,
                        const float* loss, int n, double floor_nats) {
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    printf("# gnuplot not installed: no plot\n");
    return;
  }
  if (n == 0) {
    printf("# no steps: no plot\n");
    return;
  }
  FILE* gp = popen("gnuplot >/dev/null", "w"); /* a failed `set output` draws to stdout */
  if (gp == NULL) {
    fprintf(stderr, "train: cannot start gnuplot\n");
    return;
  }
  char t[256], st[256];
  gp_text(t, sizeof t, title);
  gp_text(st, sizeof st, subtitle);
  fprintf(gp,
          "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
          "  set terminal pngcairo size 1000,600 noenhanced font 'sans,11'\n"
          "} else {\n"
          "  set terminal png size 1000,600 noenhanced\n"
          "}\n"
          "set output '%s'\n"
          "set title \"%s\\n%s\"\n"
          "set xlabel 'step (optimizer updates)'\n"
          "set ylabel 'training loss (nats per token)'\n"
          "set grid xtics ytics lc rgb '#dddddd'\n"
          "set key top right box opaque\n"
          "set border 3\n"
          "set tics nomirror\n",
          o->plot, t, st);
  /* the y range: every loss and the floor, with room above the curve for the key */
  double lo = loss[0], hi = loss[0];
  for (int i = 1; i < n; i++) {
    if (loss[i] < lo) lo = loss[i];
    if (loss[i] > hi) hi = loss[i];
  }
  if (!isnan(floor_nats) && floor_nats < lo) lo = floor_nats;
  double span = hi - lo > 1e-6 ? hi - lo : 0.1;
  fprintf(gp, "set yrange [%.9g:%.9g]\n", lo - 0.05 * span, hi + 0.3 * span);
  if (n < 30) fprintf(gp, "set xrange [-0.5:%g]\nset xtics 0, %d\n", n - 0.5, n <= 15 ? 1 : 5);
  else fprintf(gp, "set xrange [0:%d]\n", n - 1);
  fprintf(gp, "$loss << EOD\n");
  double sum = 0.0;
  for (int i = 0; i < n; i++) {
    sum += loss[i];
    if (i >= 10) sum -= loss[i - 10];
    fprintf(gp, "%d %.9g %.9g\n", i, loss[i], sum / (i < 10 ? i + 1 : 10));
  }
  fprintf(gp, "EOD\n");
  const char* pt = n < 30 ? "linespoints pt 7 ps 0.6" : "lines";
  fprintf(gp,
          "plot $loss using 1:2 with %s lw 1 lc rgb '#8fb3de' title 'loss per step', \\\n"
          "     $loss using 1:3 with lines lw 2.5 lc rgb '#1f4e8c' title 'mean of the last 10 "
          "steps'",
          pt);
  if (!isnan(floor_nats))
    fprintf(gp,
            ", \\\n     %.9g with lines dt 2 lw 2 lc rgb '#c0392b' "
            "title sprintf('corpus entropy floor %%.4f nats', %.9g)",
            floor_nats, floor_nats);
  fprintf(gp, "\n");
  if (pclose(gp) != 0) fprintf(stderr, "train: gnuplot failed\n");
  else printf("# loss curve: %s\n", o->plot);
}

/* One line per save: its size, how long it took, and how long training stalled for it. */
static void report_checkpoint(dt_checkpoint_t ck, int finished) {
  dt_checkpoint_stats_t st;
  if (dt_checkpoint_stats(ck, &st) != DT_SUCCESS || g_rank != 0 || !st.name[0]) return;
  if (!finished && st.pending)
    printf("# checkpoint %s: %.2f MiB of tensors, training stalled %.3f s (writing in the "
           "background)\n", st.name, st.nbytes / 1048576.0, st.stall_s);
  else if (!st.pending)
    printf("# checkpoint %s saved: %.2f MiB in files, %.3f s, training stalled %.3f s\n",
           st.name, st.file_nbytes / 1048576.0, st.total_s, st.stall_s);
  fflush(stdout);
}

/* Saves after `next` steps (the previous save, when asynchronous, is published first). */
static dt_status_t save_checkpoint(dt_checkpoint_t ck, const train_opts_t* o, int next) {
  dt_checkpoint_stats_t prev;
  DT_CHECK(dt_checkpoint_stats(ck, &prev));
  if (prev.pending) {
    DT_CHECK(dt_checkpoint_wait(ck));
    report_checkpoint(ck, 1);
  }
  DT_CHECK(dt_checkpoint_set_i64(ck, "next_step", next));
  DT_CHECK(dt_checkpoint_set_i64(ck, "seed", o->seed));
  DT_CHECK(dt_checkpoint_set_i64(ck, "data_position", next)); /* batches are drawn by step */
  DT_CHECK(dt_checkpoint_set_i64(ck, "schedule_total_steps", o->steps));
  DT_CHECK(dt_checkpoint_set_i64(ck, "schedule_warmup", o->warmup));
  DT_CHECK(dt_checkpoint_set_f64(ck, "lr", o->lr));
  dt_checkpoint_save_opts_t so = dt_checkpoint_save_opts_default();
  so.step = next;
  so.keep_last = o->keep_last;
  /* async: the copy to staging runs on the writer thread during the next forward and backward
   * passes; the optimizer step waits for it (dt_checkpoint_wait_staged) */
  so.async = o->async_checkpoint ? DT_CHECKPOINT_ASYNC_DEFER_COPY : DT_CHECKPOINT_SYNC;
  DT_CHECK(dt_checkpoint_save(ck, o->checkpoint_dir, NULL, &so));
  report_checkpoint(ck, 0);
  return DT_SUCCESS;
}

int train_main(int argc, char** argv) {
  /* --help needs no MPI; under mpirun only the first rank prints it */
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      const char* r = getenv("OMPI_COMM_WORLD_RANK");
      if (r == NULL) r = getenv("PMI_RANK");
      if (r == NULL || !strcmp(r, "0")) train_opts_help(stdout, DEFAULT_PLAN);
      return 0;
    }
  /* options first (rank 0 of the launch reports mistakes), then the library: MPI, or a simulated
   * world for --estimate-only */
  {
    const char* r = getenv("OMPI_COMM_WORLD_RANK");
    if (r == NULL) r = getenv("PMI_RANK");
    g_lead = r == NULL || !strcmp(r, "0");
  }
  train_opts_t o;
  train_opts_defaults(&o, DEFAULT_PLAN);
  char err[1200];
  for (int i = 1; i < argc; i++) { /* the config file first: flags override its keys */
    if (!strcmp(argv[i], "--config") && i + 1 >= argc) {
      if (g_lead)
        fprintf(stderr, "train: bad argument '--config': a value must follow it (train --help "
                "lists the flags)\n");
      dt_finalize();
      return 2;
    }
    const char* path = !strncmp(argv[i], "--config=", 9) ? argv[i] + 9
                       : !strcmp(argv[i], "--config") && i + 1 < argc ? argv[++i]
                                                                      : NULL;
    if (path != NULL && !train_opts_load_file(&o, path, err, sizeof err)) {
      if (g_lead) fprintf(stderr, "train: cannot use config %s: %s\n", path, err);
      dt_finalize();
      return 2;
    }
  }
  for (int i = 1; i < argc; i++) {
    snprintf(err, sizeof err, "unknown flag");
    if (!strncmp(argv[i], "--", 2)) { /* --key value, --key=value, --switch */
      char key[64];
      const char* eq = strchr(argv[i] + 2, '=');
      int klen = eq ? (int)(eq - argv[i] - 2) : (int)strlen(argv[i] + 2);
      snprintf(key, sizeof key, "%.*s", klen, argv[i] + 2);
      for (char* p = key; *p; p++)
        if (*p == '-') *p = '_';
      if (!strcmp(key, "config")) {
        if (eq == NULL) i++;
        continue;
      }
      if (!train_opts_known(key)) { /* a typo: name the flag as typed, and the nearest one */
        const char* near = train_opts_suggest(key);
        char flag[64] = "";
        for (size_t k = 0; near != NULL && near[k] != '\0' && k + 1 < sizeof flag; k++)
          flag[k] = near[k] == '_' ? '-' : near[k], flag[k + 1] = '\0';
        if (near != NULL) snprintf(err, sizeof err, "unknown flag (did you mean --%s?)", flag);
      } else if (eq != NULL) {
        if (train_opts_set(&o, key, eq + 1, err, sizeof err)) continue;
      } else if (train_opts_is_switch(key) && train_opts_set(&o, key, "1", err, sizeof err)) {
        continue;
      } else if (i + 1 >= argc) {
        snprintf(err, sizeof err, "a value must follow it");
      } else if (train_opts_set(&o, key, argv[i + 1], err, sizeof err)) {
        i++;
        continue;
      }
    }
    if (g_lead)
      fprintf(stderr, "train: bad argument '%s': %s (train --help lists the flags)\n", argv[i],
              err);
    dt_finalize();
    return 2;
  }
  if (o.resume && !o.checkpoint_dir[0]) { /* else nothing would be resumed, and nothing said */
    if (g_lead) fprintf(stderr, "train: --resume continues from the newest checkpoint in "
                        "--checkpoint-dir DIR: give it (or --resume-from DIR/NAME alone)\n");
    dt_finalize();
    return 2;
  }
  g_sim = o.estimate_only;
  if (g_sim) {
    if (o.steps < 1) {
      if (g_lead) fprintf(stderr, "train: --estimate-only estimates a step: --steps 0 has none\n");
      return 2;
    }
    if (o.estimate_rank >= o.np) {
      if (g_lead) fprintf(stderr, "train: --estimate-rank %d: the world has --np %d ranks\n",
                          o.estimate_rank, o.np);
      return 2;
    }
    if (o.checkpoint_dir[0] || o.resume_from[0] || o.metrics[0] || o.plot[0]) {
      if (g_lead) fprintf(stderr, "train: --estimate-only writes nothing: drop --checkpoint-dir, "
                          "--resume-from, --metrics and --plot\n");
      return 2;
    }
    if (o.steps > 2) o.steps = 2; /* the peak: the first step allocates the optimizer state */
    CHECK(dt_init_simulated(o.np, o.estimate_rank));
    CHECK(dt_sim_set_routing_imbalance(o.routing_imbalance));
    /* --device: the simulated kernels are that device's (dtype handling, scratch); a build
     * without them (no CUDA toolkit) estimates with the host kernels' figures and says so */
    if (strcmp(o.device, "cpu") != 0) {
      const dt_status_t ds = dt_sim_set_device(o.device);
      if (ds == DT_ERR_UNSUPPORTED) {
        if (g_lead) fprintf(stderr, "train: --device %s: %s; the estimate counts the host "
                            "kernels' scratch and bf16 copies instead\n", o.device, dt_last_error());
      } else if (ds != DT_SUCCESS) {
        if (g_lead) fprintf(stderr, "train: --device %s: %s\n", o.device, dt_last_error());
        dt_finalize();
        return 2;
      }
    }
    if (o.machine[0] && load_machine(o.machine, err, sizeof err) != 0) {
      if (g_lead) fprintf(stderr, "train: %s\n", err);
      dt_finalize();
      return 2;
    }
  } else if (o.machine[0] || o.routing_imbalance != 1.0) {
    if (g_lead) fprintf(stderr, "train: --machine and --routing-imbalance go with --estimate-only "
                        "(a real run measures its machine and routes its tokens)\n");
    return 2;
  } else if (o.np != 1 || o.estimate_rank != 0) {
    if (g_lead) fprintf(stderr, "train: --np %d and --estimate-rank %d go with --estimate-only (a "
                        "real run's world is mpirun's -np)\n", o.np, o.estimate_rank);
    return 2;
  } else {
    CHECK(dt_init(&argc, &argv));
  }
  int world;
  CHECK(dt_world_rank(&g_rank));
  CHECK(dt_world_size(&world));
  g_lead = g_sim || g_rank == 0;
  /* the device: every mesh takes its backend */
  const int on_device = strcmp(o.device, "cpu") != 0;
  if (!o.param_dtype[0]) strcpy(o.param_dtype, strncmp(o.device, "cuda", 4) ? "f32" : "bf16");
  if (on_device && !g_sim) { /* a simulated run's tensors are meta whatever the device */
    dt_backend_t be;
    if (dt_backend_get(o.device, &be) != DT_SUCCESS) {
      if (g_lead) fprintf(stderr, "train: --device %s: %s\n", o.device, dt_last_error());
      dt_finalize();
      return 2;
    }
    CHECK(dt_backend_set_default(be));
  }
  /* mesh (checked by train_opts_set) */
  int mshape[4] = {world}, mnd = 1;
  if (o.mesh[0] && !train_mesh_parse(o.mesh, mshape, &mnd)) {
    if (g_lead) fprintf(stderr, "train: bad mesh '%s'\n", o.mesh);
    dt_finalize();
    return 2;
  }
  /* the parallel config (--dp, --tp, --ep): a (tp, dp) mesh */
  if (o.batch % o.micro_batches != 0)
    return usage_error("--micro-batches %d must divide --batch %d", o.micro_batches, o.batch);
  const int pconf = o.dp > 0 || o.tp > 0 || o.ep > 0 || o.cp > 0;
  const int D = o.dp > 0 ? o.dp : 1, T = o.tp > 0 ? o.tp : 1, E = o.ep > 0 ? o.ep : 1,
            CP = o.cp > 0 ? o.cp : 1;
  if (pconf) {
    if (strcmp(o.parallel, "none") != 0 || o.mesh[0] || strcmp(o.plan, DEFAULT_PLAN) != 0) {
      char what[96] = ""; /* the flags given */
      if (strcmp(o.parallel, "none") != 0)
        snprintf(what, sizeof what, " --parallel %.40s", o.parallel);
      if (o.mesh[0]) snprintf(what + strlen(what), sizeof what - strlen(what), " --mesh");
      if (strcmp(o.plan, DEFAULT_PLAN) != 0)
        snprintf(what + strlen(what), sizeof what - strlen(what), " --plan");
      return usage_error("--dp/--tp/--ep/--cp build their own mesh and plan: drop%s", what);
    }
    if ((long long)D * T * E * CP != world) {
      char hint[64] = ""; /* --dp is not inferred: say which one fills the world */
      long long rest = (long long)T * E * CP;
      if (o.dp <= 0 && world % rest == 0)
        snprintf(hint, sizeof hint, " (--dp %lld fills it)", world / rest);
      return usage_error("--dp %d x --tp %d x --ep %d x --cp %d = %lld ranks, the world has %d%s",
                         D, T, E, CP, (long long)D * T * E * CP, world, hint);
    }
    if (CP > 1 && o.seq % (2 * CP) != 0)
      return usage_error("--cp %d splits each sequence into %d chunks (2 per rank, load-balanced "
                         "for causal attention): --seq %d is not a multiple of %d", CP, 2 * CP,
                         o.seq, 2 * CP);
    if (CP > 1 && (o.batch / o.micro_batches) % (D * E) != 0)
      return usage_error("--cp: the batch of %d%s must split evenly over the %d data ranks",
                         o.batch / o.micro_batches, o.micro_batches > 1 ? " per micro-batch" : "",
                         D * E);
    if (T == 1 && (o.sp || o.loss_parallel))
      return usage_error("--sp and --loss-parallel go with --tp (2 or more): with --tp 1 nothing "
                         "would be sharded");
    if (E > 1 && (strcmp(o.model, "moe") != 0 || o.experts % E != 0))
      return usage_error("--ep %d needs --model moe with a multiple of %d experts (got %s, %d)",
                         E, E, o.model, o.experts);
    int kv = o.kv_heads > 0 ? o.kv_heads : o.heads;
    if (T > 1 && (o.heads % T || kv % T || (o.sp && (o.seq / CP) % T)))
      return usage_error("--tp %d must divide the heads (%d), the kv heads (%d)%s", T, o.heads,
                         kv, !o.sp ? "" : CP > 1 ? " and --seq / --cp (sequence parallel)"
                                                 : " and --seq (sequence parallel)");
    if (D * E > 1 && o.batch / o.micro_batches < D * E)
      return usage_error("the batch is sharded over %d data ranks: --batch %d%s is smaller",
                         D * E, o.micro_batches > 1 ? o.batch : o.batch / o.micro_batches,
                         mb_note(o.batch, o.micro_batches));
  } else if (o.sp || o.loss_parallel) {
    return usage_error("--sp and --loss-parallel go with --tp");
  }
  if (o.async_tp && !o.sp) return usage_error("--async-tp goes with --sp (and --tp)");
  if (pconf) {
    mnd = CP > 1 ? 3 : 2;
    mshape[0] = T;
    mshape[1] = D * E;
    mshape[2] = CP;
  }
  /* data-parallel modes: how --parallel combines with --mesh, --plan and --batch */
  const int ddp = !strcmp(o.parallel, "ddp"), fsdp = !strcmp(o.parallel, "fsdp"),
            hsdp = !strcmp(o.parallel, "hsdp"), data_par = ddp || fsdp || hsdp || pconf;
  if ((ddp || fsdp) && mnd != 1)
    return usage_error("--parallel %s runs on a 1-D mesh over all ranks, got --mesh %s (drop "
                       "--mesh, or use --parallel hsdp for a 2-D mesh)",
                       o.parallel, o.mesh);
  if (hsdp && mnd != 2)
    return usage_error("--parallel hsdp needs a 2-D mesh --mesh RxS (R replicas of S shards, "
                       "e.g. --mesh 2x2), got %s",
                       o.mesh[0] ? o.mesh : "a 1-D mesh");
  if (data_par && strcmp(o.plan, DEFAULT_PLAN) != 0)
    return usage_error("--plan applies to --parallel none only: %s builds every parameter "
                       "replicated (*=R) and wraps the model",
                       o.parallel);
  if ((ddp || fsdp || hsdp) && o.batch / o.micro_batches < world) /* pconf checked its own */
    return usage_error("--parallel %s shards the batch over the %d ranks: --batch %d%s is smaller",
                       o.parallel, world, o.batch, mb_note(o.batch, o.micro_batches));
  if ((fsdp || hsdp) && o.reshard_after_forward > 1 &&
      mshape[mnd - 1] % o.reshard_after_forward != 0)
    return usage_error("--reshard-after-forward %d must divide the shard dim's %d ranks",
                       o.reshard_after_forward, mshape[mnd - 1]);
  dt_mesh_t mesh;
  if (pconf) { /* mesh coordinates (t, d, c) on world rank (d CP + c) T + t: a tp group is
                * adjacent ranks, then the cp ring, then the data ranks */
    int* ranks = malloc(sizeof(int) * (size_t)world);
    if (ranks == NULL) return usage_error("no memory for the mesh");
    for (int t = 0; t < T; t++)
      for (int d = 0; d < D * E; d++)
        for (int c = 0; c < CP; c++) ranks[(t * D * E + d) * CP + c] = (d * CP + c) * T + t;
    const char* names[3] = {"tp", "dp", "cp"};
    CHECK(dt_mesh_create(mnd, mshape, names, ranks, &mesh));
    free(ranks);
    CHECK(price_dim(mesh, 0, 1, T, o.gpus_per_node));
    CHECK(price_dim(mesh, 1, T * CP, D * E, o.gpus_per_node));
    if (CP > 1) CHECK(price_dim(mesh, 2, T, CP, o.gpus_per_node));
  } else {
    CHECK(dt_mesh_create(mnd, mshape, NULL, NULL, &mesh));
    for (int d = 0, stride = world; d < mnd; d++) { /* row-major: the last dim adjacent */
      stride /= mshape[d];
      CHECK(price_dim(mesh, d, stride, mshape[d], o.gpus_per_node));
    }
  }
  /* data */
  dt_corpus_t corpus = NULL; /* none when simulated: the tokens are zeros, --vocab any size */
  if (g_sim) {
    if (strcmp(o.data, "markov") != 0) o.vocab = 256; /* a file's bytes */
  } else if (!strcmp(o.data, "markov")) {
    CHECK(dt_corpus_markov(o.vocab, o.order, 1 << 20, 7, &corpus));
  } else {
    CHECK(dt_corpus_file(o.data, &corpus));
  }
  dt_llama_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.dim = o.dim;
  cfg.n_layers = o.layers;
  cfg.n_heads = o.heads;
  cfg.n_kv_heads = o.kv_heads;
  cfg.ffn_dim = o.ffn_dim;
  cfg.vocab = corpus ? dt_corpus_vocab(corpus) : o.vocab;
  cfg.seq_len = o.seq;
  cfg.n_experts = !strcmp(o.model, "moe") ? o.experts : 0;
  cfg.capacity_factor = o.capacity_factor;
  cfg.top_k = o.top_k;
  cfg.seed = (uint64_t)o.seed;
  cfg.tie_embeddings = o.tie_embeddings;
  dt_llama_config_defaults(&cfg);
  if (dt_llama_config_check(&cfg) != DT_SUCCESS) /* the same on every rank: a usage error */
    return usage_error("%s (the model's flags: --dim, --heads, --kv-heads, --layers, --vocab, "
                       "--seq, --experts, --top-k)", dt_last_error());
  /* FSDP / HSDP and the parallel configs (TP, FSDP, EP) place every parameter after building:
   * build them as layouts only and fill each rank's shards after wrapping
   * (dt_llama_init_weights), so no rank holds the whole model */
  const int sharded = fsdp || hsdp || pconf;
  cfg.defer_init = sharded;
  const char* nn_plan =
      o.tie_embeddings && !strcmp(o.plan, DEFAULT_PLAN) ? DEFAULT_PLAN_TIED : o.plan;
  dt_llama_t model;
  CHECK(dt_llama_create(mesh, &cfg, data_par ? "*=R" : nn_plan, &model));
  /* wrap for data parallelism: FSDP/HSDP one group per block, then the root (the embedding, the
   * final norm and the output projection); DDP the whole model */
  dt_module_t root;
  CHECK(dt_llama_module(model, &root));
  int64_t frozen_numel = 0;
  int n_frozen = 0;
  if (o.freeze[0]) {
    char ferr[512];
    n_frozen = freeze_params(model, o.freeze, &frozen_numel, ferr, sizeof ferr);
    if (n_frozen < 0) return usage_error("%s", ferr);
  }
  char par_desc[160], mesh_desc[128];
  if (pconf && CP > 1) snprintf(mesh_desc, sizeof mesh_desc, "(tp, dp, cp) %dx%dx%d", T, D * E, CP);
  else if (pconf) snprintf(mesh_desc, sizeof mesh_desc, "(tp, dp) %dx%d", T, D * E);
  else snprintf(mesh_desc, sizeof mesh_desc, "%s", o.mesh[0] ? o.mesh : "1-D");
  if (pconf && T > 1) {
    if (cfg.vocab % T || cfg.ffn_dim % T)
      return usage_error("--tp %d must divide the vocabulary (%d) and the MLP width (%d)", T,
                         cfg.vocab, cfg.ffn_dim);
    dt_tp_plan_entry_t plan[16];
    int n;
    CHECK(dt_tp_plan_llama(&cfg, o.sp ? (o.async_tp ? DT_TP_SP_ASYNC : 1) : 0, o.loss_parallel,
                           plan, 16, &n));
    CHECK(dt_parallelize_module(root, mesh, 0, n, plan));
  }
  if (pconf) {
    char cpd[48] = "";
    if (CP > 1) snprintf(cpd, sizeof cpd, " x cp %d (ring attention)", CP);
    snprintf(par_desc, sizeof par_desc, "dp %d x tp %d x ep %d%s%s%s", D, T, E, cpd,
             o.sp ? (o.async_tp ? ", sequence parallel (async TP)" : ", sequence parallel") : "",
             o.loss_parallel ? ", loss parallel" : "");
    if (CP > 1) CHECK(dt_llama_set_context_parallel(model, 2));
  }
  dt_mesh_t emesh = NULL;
  if (pconf && E > 1 && D > 1) { /* the expert mesh (ep, tp, efsdp[, cp]) = (E, T, D[, CP]):
                                  * position (e, t, f, c) is the dense mesh's (t, f E + e, c);
                                  * the experts' data dims tp, efsdp, cp adjacent (one FSDP span) */
    int* ranks = malloc(sizeof(int) * (size_t)world);
    if (ranks == NULL) return usage_error("no memory for the expert mesh");
    for (int e = 0; e < E; e++)
      for (int t = 0; t < T; t++)
        for (int f = 0; f < D; f++)
          for (int c = 0; c < CP; c++)
            ranks[((e * T + t) * D + f) * CP + c] = ((f * E + e) * CP + c) * T + t;
    const int eshape[4] = {E, T, D, CP};
    const char* names[4] = {"ep", "tp", "efsdp", "cp"};
    dt_status_t st = dt_mesh_create(CP > 1 ? 4 : 3, eshape, names, ranks, &emesh);
    free(ranks);
    CHECK(st);
    CHECK(price_dim(emesh, 0, T * CP, E, o.gpus_per_node));
    CHECK(price_dim(emesh, 1, 1, T, o.gpus_per_node));
    CHECK(price_dim(emesh, 2, T * CP * E, D, o.gpus_per_node));
    if (CP > 1) CHECK(price_dim(emesh, 3, T, CP, o.gpus_per_node));
    size_t l = strlen(mesh_desc);
    if (CP > 1)
      snprintf(mesh_desc + l, sizeof mesh_desc - l, ", experts (ep, tp, efsdp, cp) %dx%dx%dx%d", E,
               T, D, CP);
    else
      snprintf(mesh_desc + l, sizeof mesh_desc - l, ", experts (ep, tp, efsdp) %dx%dx%d", E, T, D);
  }
  if (pconf && E > 1) /* expert parallelism: the stacked experts Shard(0) over the ep ranks */
    CHECK(shard_experts(root, o.layers, emesh));
  if (pconf) {
    if (D * E * CP > 1) CHECK(shard_blocks(root, o.layers, mesh, emesh, &o));
  } else if (fsdp || hsdp) {
    dt_fsdp_config_t fc = dt_fsdp_config_default(mnd);
    fc.reshard_after_forward = o.reshard_after_forward;
    fc.param_dtype = !strcmp(o.param_dtype, "bf16") ? DT_BF16 : DT_F32;
    fc.reduce_dtype = DT_F32;
    fc.prefetch_forward = fc.prefetch_backward = o.prefetch;
    /* blocks hand their param_dtype activations to the next block as they are (a cast to f32
     * between blocks would meet the root's bf16 norm weight); the root's outputs (the loss) are
     * f32 */
    fc.output_dtype = DT_FSDP_KEEP_DTYPE;
    for (int l = 0; l < o.layers; l++) {
      char path[32];
      dt_module_t blk;
      snprintf(path, sizeof path, "layers.%d", l);
      CHECK(dt_module_find(root, path, &blk));
      dt_fsdp_config_t bc = l == o.layers - 1 ? keep_gathered(fc) : fc;
      CHECK(dt_fully_shard(blk, mesh, &bc));
    }
    fc.output_dtype = DT_F32;
    dt_fsdp_config_t rc = keep_gathered(fc);
    CHECK(dt_fully_shard(root, mesh, &rc));
    snprintf(par_desc, sizeof par_desc,
             "%s (%d groups, reshard_after_forward %d, param_dtype %s, prefetch %d)", o.parallel,
             o.layers + 1, o.reshard_after_forward, o.param_dtype, o.prefetch);
  } else if (ddp) {
    double nb = o.bucket_mb * 1048576.0;
    dt_ddp_config_t dc = {0, nb < 1.0 ? 1 : (int64_t)nb};
    CHECK(dt_data_parallel(root, mesh, &dc));
    int nbuckets = 0;
    CHECK(dt_ddp_num_buckets(root, &nbuckets));
    snprintf(par_desc, sizeof par_desc, "ddp (%d bucket%s of about %g MiB)", nbuckets,
             nbuckets == 1 ? "" : "s", o.bucket_mb);
  } else {
    snprintf(par_desc, sizeof par_desc, "none (tensor parallel by the plan)");
  }
  if (sharded) CHECK(dt_llama_init_weights(model)); /* each rank its shards, in place */
  /* after wrapping: FSDP has replaced the parameters by sharded ones */
  dt_var_t* params;
  int np;
  int64_t nparam;
  CHECK(dt_llama_params(model, &params, NULL, &np, &nparam));
  dt_adamw_config_t ac = {o.lr, 0.9, 0.95, 1e-8, 0.1, o.bf16_moments};
  dt_adamw_t opt;
  /* the optimizer over the trained parameters only (--freeze: no moments for the frozen ones,
   * as PyTorch's fine-tuning scripts filter on requires_grad) */
  dt_var_t* trainable = malloc(sizeof(dt_var_t) * (size_t)(np > 0 ? np : 1));
  int n_train = 0;
  if (trainable == NULL) return usage_error("no memory for %d parameter handles", np);
  for (int i = 0; i < np; i++) {
    int rg = 0;
    CHECK(dt_var_requires_grad(params[i], &rg));
    if (rg) trainable[n_train++] = params[i];
  }
  if (n_train == 0) {
    free(trainable);
    return usage_error("--freeze %s leaves no parameter to train", o.freeze);
  }
  /* --metrics, --plot and --checkpoint-dir: a path rank 0 cannot write is a usage error now,
   * on every rank (not a run that ends without them, or whose checkpoints fail at the end) */
  FILE* metrics = NULL;
  int out_ok[3] = {1, 1, 1}, out_errno = 0;
  if (g_lead && o.metrics[0] && (!can_write(o.metrics) || !(metrics = fopen(o.metrics, "w"))))
    out_ok[0] = 0, out_errno = errno;
  if (g_lead && out_ok[0] && o.plot[0] && !can_write(o.plot)) out_ok[1] = 0, out_errno = errno;
  if (g_lead && out_ok[0] && out_ok[1] && !g_sim && o.checkpoint_dir[0] &&
      !can_write_dir(o.checkpoint_dir))
    out_ok[2] = 0, out_errno = errno;
  if (!g_sim) MPI_Bcast(out_ok, 3, MPI_INT, 0, MPI_COMM_WORLD);
  if (!out_ok[0] || !out_ok[1] || !out_ok[2]) {
    free(trainable);
    const char* flag = !out_ok[0] ? "metrics" : !out_ok[1] ? "plot" : "checkpoint-dir";
    const char* path = !out_ok[0] ? o.metrics : !out_ok[1] ? o.plot : o.checkpoint_dir;
    return usage_error("--%s %s: cannot write there: %s", flag, path, strerror(out_errno));
  }
  CHECK(dt_adamw_create(&ac, n_train, trainable, &opt));
  /* distributed checkpoints: the parameters as the wrapped model holds them (FSDP shards, TP
   * shards, experts), the AdamW state, and where the run is (loaded onto any layout) */
  dt_checkpoint_t ck = NULL;
  int start = 0, loaded_here = 0; /* resumed from --checkpoint-dir itself */
  if (o.checkpoint_dir[0] || o.resume_from[0]) {
    CHECK(dt_checkpoint_create(&ck));
    CHECK(dt_checkpoint_add_module(ck, NULL, root));
    CHECK(dt_checkpoint_add_adamw(ck, "optim", opt, root));
    char latest[DT_CHECKPOINT_NAME_MAX] = "", from[256];
    snprintf(from, sizeof from, "%s", o.checkpoint_dir);
    int found = o.resume && dt_checkpoint_latest(o.checkpoint_dir, latest, sizeof latest) == 0;
    if (o.resume_from[0]) {
      char idx[1200];
      struct stat sb;
      snprintf(idx, sizeof idx, "%s/index.json", o.resume_from);
      if (stat(idx, &sb) != 0 && dt_checkpoint_latest(o.resume_from, latest, sizeof latest) == 0) {
        /* a directory whose `latest` names a checkpoint, as dtensor-ckpt takes it */
        snprintf(from, sizeof from, "%s", o.resume_from);
      } else { /* DIR/NAME: split at the last '/' */
        dt_clear_error();
        char* slash = strrchr(o.resume_from, '/');
        snprintf(from, sizeof from, "%.*s", slash ? (int)(slash - o.resume_from) : 1,
                 slash ? o.resume_from : ".");
        snprintf(latest, sizeof latest, "%s", slash ? slash + 1 : o.resume_from);
      }
      found = 1;
    }
    /* what rank 0 found is what every rank loads: ranks reading `latest` themselves could name
     * different checkpoints (a save published between their reads) or leave some out of the
     * collective load */
    if (!g_sim) {
      MPI_Bcast(&found, 1, MPI_INT, 0, MPI_COMM_WORLD);
      MPI_Bcast(from, (int)sizeof from, MPI_CHAR, 0, MPI_COMM_WORLD);
      MPI_Bcast(latest, (int)sizeof latest, MPI_CHAR, 0, MPI_COMM_WORLD);
    }
    if (found) {
      loaded_here = !o.resume_from[0];
      double t0 = now_s();
      dt_status_t lst = dt_checkpoint_load(ck, from, latest);
      int seed_only = 0; /* parameters without AdamW state or run position (dtensor-ckpt import) */
      char why[1024] = "";
      if (lst != DT_SUCCESS && strstr(dt_last_error(), "has no tensor 'optim.") != NULL) {
        /* every rank read the same index: either a checkpoint of parameters only, which starts
         * a run (fresh AdamW moments, step 0), or one whose run trained fewer parameters */
        snprintf(why, sizeof why, "%s", dt_last_error());
        dt_checkpoint_t pk = NULL;
        int64_t ignored;
        CHECK(dt_checkpoint_create(&pk));
        CHECK(dt_checkpoint_add_module(pk, NULL, root));
        CHECK(dt_checkpoint_load(pk, from, latest)); /* (a shape mismatch says so here) */
        if (dt_checkpoint_get_i64(pk, "next_step", &ignored) != DT_SUCCESS) {
          seed_only = 1;
          lst = DT_SUCCESS;
          dt_clear_error();
        }
        CHECK(dt_checkpoint_destroy(pk));
        if (!seed_only) {
          /* the optimizer state of a parameter that this run trains and the saved one did not */
          free(trainable);
          return usage_error("%s: %s (the checkpoint holds AdamW state for the parameters its "
                             "run trained: resume with the --freeze it was saved with%s%s)",
                             dt_status_name(lst), why, o.freeze[0] ? ", not " : "", o.freeze);
        }
      }
      CHECK(lst);
      if (seed_only) {
        if (g_lead)
          printf("# started from the parameters of %s/%s (no AdamW state or step in it: a seed, "
                 "trained from step 0 with fresh moments) (%.2f s)\n", from, latest,
                 now_s() - t0);
      } else {
        int64_t next = 0, seed = 0;
        CHECK(dt_checkpoint_get_i64(ck, "next_step", &next));
        CHECK(dt_checkpoint_get_i64(ck, "seed", &seed));
        if (seed != o.seed && g_lead)
          fprintf(stderr, "train: warning: the checkpoint was trained with --seed %lld, this run "
                  "draws its batches with %lld\n", (long long)seed, o.seed);
        int64_t total = 0;
        CHECK(dt_checkpoint_get_i64(ck, "schedule_total_steps", &total));
        if (total != o.steps && g_lead)
          fprintf(stderr, "train: warning: the checkpoint's run had --steps %lld: the "
                  "learning-rate schedule now follows --steps %d\n", (long long)total, o.steps);
        if (next < 0 || next > INT_MAX) { /* (a damaged index: the loop and --plot index by it) */
          fprintf(stderr, "train: %s: the checkpoint's next_step is %lld, not a step (0 to %d)\n",
                  dt_status_name(DT_ERR_CORRUPT), (long long)next, INT_MAX);
          MPI_Abort(MPI_COMM_WORLD, 1); /* every rank read the same index */
        }
        start = (int)next;
        if (g_lead)
          printf("# resumed from %s/%s at step %d (%.2f s)\n", from, latest, start, now_s() - t0);
      }
    } else if (o.resume && g_lead) {
      dt_clear_error();
      printf("# --resume: no checkpoint in %s yet, starting at step 0\n", o.checkpoint_dir);
    }
  }
  /* nothing to train: a seed checkpoint (--steps 0), or the loaded one saved on this layout */
  if (ck && o.checkpoint_dir[0] && start >= o.steps && !loaded_here)
    CHECK(save_checkpoint(ck, &o, start));
  dt_tape_t tape;
  CHECK(dt_tape_create(&tape));
  if (o.checkpoint) CHECK(dt_tape_set_checkpoint(tape, dt_ckpt_policy_default, NULL));
  double peak = 0.0, peak_total = 0.0; /* simulated: the compute model's rate, nothing measured */
  dt_compute_params_t model_rate;
  if (g_sim && dt_compute_model_get(&model_rate) == DT_SUCCESS) {
    peak = on_device ? model_rate.gemm_bf16_gflops : model_rate.gemm_gflops;
    peak_total = peak * o.np;
  }
  if (!g_sim) {
    peak = on_device ? measure_peak_device(mesh, strcmp(o.device, "cuda") ? 128 : 8192)
                     : measure_peak();
    MPI_Allreduce(&peak, &peak_total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    /* the peaks reported at the end are training's, not the probe's (three 8192^2 bf16 matrices
     * on a GPU: 384 MiB of "other" otherwise) */
    CHECK(dt_memory_reset_peak());
  }
  double flops_tok = 3.0 * dt_llama_flops_per_token(&cfg);
  if (g_lead) {
    printf("# dtensor train: %s model, %lld parameters%s, mesh %s over %d ranks, parallel %s, "
           "batch %dx%d, vocab %d, %d steps\n# plan: %s\n"
           "# device %s; peak %s %.1f GFLOP/s per rank (%.1f total)\n",
           o.model, (long long)nparam, o.tie_embeddings ? " (output tied to tok_emb)" : "",
           mesh_desc, world, par_desc, o.batch, o.seq, cfg.vocab, o.steps,
           data_par ? "*=R (every parameter replicated, then wrapped)" : nn_plan, o.device,
           on_device ? "bf16 GEMM" : "sgemm", peak, peak_total);
    if (corpus && !isnan(dt_corpus_entropy_floor(corpus)))
      printf("# corpus: order-%d Markov chain over %d symbols, entropy floor %.4f nats\n", o.order,
             o.vocab, dt_corpus_entropy_floor(corpus));
    if (n_frozen > 0)
      printf("# frozen (--freeze %s): %d parameters, %lld of %lld elements\n", o.freeze, n_frozen,
             (long long)frozen_numel, (long long)nparam);
  }
  int64_t bs = (int64_t)o.batch * o.seq;
  const int fits = (uint64_t)bs <= SIZE_MAX / sizeof(int64_t);
  int64_t* tok = fits ? malloc(sizeof(int64_t) * (size_t)bs) : NULL;
  int64_t* tgt = fits ? malloc(sizeof(int64_t) * (size_t)bs) : NULL;
  int64_t* cp_row = malloc(sizeof(int64_t) * (size_t)(2 * o.seq)); /* --cp: one row reordered */
  if (tok == NULL || tgt == NULL || cp_row == NULL) {
    fprintf(stderr, "train: no memory for the token ids of a batch (--batch %d x --seq %d, %.3g "
            "bytes)\n", o.batch, o.seq, 2.0 * sizeof(int64_t) * (double)bs);
    if (g_sim) exit(1);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  dt_placement_t rep[4] = {dt_replicate(), dt_replicate(), dt_replicate(), dt_replicate()};
  dt_placement_t tok_pl[4]; /* data parallel: the batch dim sharded over every mesh dim */
  for (int d = 0; d < 4; d++) tok_pl[d] = data_par ? dt_shard(0) : dt_replicate();
  if (pconf) tok_pl[0] = dt_replicate(); /* tokens replicated over tp, sharded over dp */
  if (pconf && CP > 1) tok_pl[2] = dt_shard(1); /* and the sequence over cp */
  float* hist = NULL; /* the loss of every step, for the plot */
  if (g_lead && o.plot[0] && o.steps > 0) {
    hist = malloc(sizeof(float) * (size_t)o.steps);
    if (hist == NULL) fprintf(stderr, "train: no memory for the loss history: no plot\n");
  }
  const int64_t mshape_b[2] = {o.batch / o.micro_batches, o.seq}; /* one micro-batch */
  double last[10] = {0}, tps_sum = 0.0, tps_all = 0.0;
  int nlast = 0, ntps = 0, nall = 0;
  for (int step = start; step < o.steps; step++) {
    barrier();
    if (step == o.steps - 1) CHECK(dt_counters_reset(NULL)); /* the last step's traffic */
    if (o.profile && (step == start + 1 || o.steps - start == 1)) /* past the first step's caches */
      CHECK(dt_profile_set(1));
    if (g_sim && step == o.steps - 1) CHECK(dt_sim_time_reset()); /* and its simulated time */
    double t0 = now_s();
    if (corpus) CHECK(dt_corpus_batch(corpus, (uint64_t)o.seed, step, o.batch, o.seq, tok, tgt));
    else memset(tok, 0, sizeof(int64_t) * (size_t)bs), memset(tgt, 0, sizeof(int64_t) * (size_t)bs);
    if (pconf && CP > 1) { /* each sequence in the load-balanced order of the cp ranks */
      for (int b = 0; b < o.batch; b++) {
        int64_t *tr = tok + (int64_t)b * o.seq, *gr = tgt + (int64_t)b * o.seq;
        for (int i = 0; i < o.seq; i++) {
          cp_row[i] = tr[dt_cp_position(i, o.seq, CP)];
          cp_row[o.seq + i] = gr[dt_cp_position(i, o.seq, CP)];
        }
        memcpy(tr, cp_row, sizeof(int64_t) * (size_t)o.seq);
        memcpy(gr, cp_row + o.seq, sizeof(int64_t) * (size_t)o.seq);
      }
    }
    /* K micro-batches of B/K sequences: each loss scaled by 1/K (the mean over the batch), the
     * gradients accumulated, the data wrappers' reductions only after the last pass */
    float lv = 0.0f;
    double aux = 0.0;
    int64_t held = 0, saved = 0, recomputed = 0;
    const int K = o.micro_batches;
    for (int mb = 0; mb < K; mb++) {
      const int sync = mb == K - 1;
      if (K > 1 && (fsdp || hsdp || (pconf && D * E * CP > 1)))
        CHECK(dt_fsdp_set_requires_gradient_sync(root, sync));
      if (K > 1 && ddp) CHECK(dt_ddp_set_requires_gradient_sync(root, sync));
      const int64_t off = (int64_t)mb * (bs / K);
      dt_tensor_t tt, gt;
      CHECK(dt_tensor_from_full(mesh, DT_I64, 2, mshape_b, tok_pl, tok + off, &tt));
      CHECK(dt_tensor_from_full(mesh, DT_I64, 2, mshape_b, tok_pl, tgt + off, &gt));
      dt_var_t loss;
      double mb_aux = 0.0;
      CHECK(dt_llama_forward(model, tape, tt, gt, &loss, &mb_aux));
      float mv;
      dt_tensor_t lr_t;
      CHECK(dt_tensor_redistribute(dt_var_value(loss), rep, &lr_t));
      CHECK(dt_tensor_gather_full(lr_t, &mv, sizeof mv));
      dt_tensor_destroy(lr_t);
      lv += mv / (float)K;
      aux += mb_aux / K;
      if (K > 1) {
        const double inv = 1.0 / K;
        CHECK(dt_ag_op(tape, "mul_scalar", 1, &loss, 0, NULL, 1, &inv, 1, &loss));
      }
      int64_t h = 0, s = 0, r = 0;
      CHECK(dt_tape_stats(tape, NULL, &h));
      CHECK(dt_tape_backward(tape, loss));
      CHECK(dt_tape_checkpoint_stats(tape, &s, &r));
      if (mb == 0) held = h, saved = s, recomputed = r;
      if (mb < K - 1) CHECK(dt_tape_reset(tape));
      dt_tensor_destroy(tt);
      dt_tensor_destroy(gt);
    }
    if (step == 0 && g_lead)
      printf("# activations held by the tape after the forward pass: %.1f KiB on rank 0; "
             "checkpointing freed %.1f KiB and recomputed %lld ops in the backward pass\n",
             held / 1024.0, saved / 1024.0, (long long)recomputed);
    if (step == 0 && cfg.n_experts) { /* how the MoE layers ran */
      dt_moe_stats_t ms;
      CHECK(dt_llama_moe_stats(model, &ms));
      if (g_lead) {
        if (ms.expert_parallel_dim >= 0)
          printf("# moe: expert parallel over mesh dim %d (experts Shard(0) there)",
                 ms.expert_parallel_dim);
        else if (ms.local_routing)
          printf("# moe: each rank routes its own tokens (experts whole on every rank)");
        else
          printf("# moe: global routing");
        printf("; %lld routing choices, %lld dropped\n", (long long)ms.assignments,
               (long long)ms.dropped);
      }
    }
    CHECK(dt_tape_reset(tape));
    double gnorm;
    CHECK(dt_clip_grad_norm(np, params, o.clip, &gnorm));
    double lr = dt_lr_schedule(step, o.warmup, o.steps, o.lr, o.lr * 0.1);
    if (ck) CHECK(dt_checkpoint_wait_staged(ck)); /* the last save's copy, before the update */
    CHECK(dt_adamw_step(opt, lr));
    for (int i = 0; i < np; i++) CHECK(dt_var_zero_grad(params[i]));
    barrier();
    double dt = now_s() - t0, tps = (double)bs / dt, gf = flops_tok * (double)bs / dt / 1e9;
    if (step >= start + 2) { /* this run's first steps fill the plan and propagation caches */
      tps_sum += tps;
      ntps++;
    }
    tps_all += tps; /* the mean reported when no step is left after those */
    nall++;
    last[nlast++ % 10] = lv;
    if (hist != NULL) hist[step] = lv;
    if (g_lead && !g_sim) {
      printf("step %4d loss %.4f%s lr %.2e gnorm %.3f tokens/s %.0f GFLOP/s %.2f MFU %.1f%%\n",
             step, lv, cfg.n_experts ? "" : "", lr, gnorm, tps, gf, 100.0 * gf / peak_total);
      if (cfg.n_experts) printf("     aux %.5f\n", aux);
      if (metrics)
        fprintf(metrics,
                "{\"step\":%d,\"loss\":%.9g,\"aux\":%.9g,\"lr\":%.6g,\"grad_norm\":%.6f,"
                "\"tokens_per_s\":%.1f,\"gflops\":%.3f,\"mfu\":%.5f}\n",
                step, lv, aux, lr, gnorm, tps, gf, gf / peak_total);
      fflush(stdout);
    }
    if (ck && o.checkpoint_dir[0] &&
        ((o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0) || step == o.steps - 1))
      CHECK(save_checkpoint(ck, &o, step + 1));
  }
  if (ck) { /* the last save, when asynchronous, is published before the program ends */
    dt_checkpoint_stats_t cs;
    CHECK(dt_checkpoint_stats(ck, &cs));
    CHECK(dt_checkpoint_wait(ck));
    if (cs.pending) report_checkpoint(ck, 1);
    dt_checkpoint_destroy(ck);
  }
  if (o.profile && dt_profile_enabled()) { /* rank 0's op profile of the steps after the first */
    if (g_lead) CHECK(dt_profile_report(stdout, 40));
    CHECK(dt_profile_set(0));
  }
  for (int mi = 0; g_lead && o.steps > 0 && mi < 2; mi++) { /* collectives of the last
                                                                 * step, per mesh dim (rank 0) */
    dt_mesh_t cm = mi == 0 ? mesh : emesh;
    if (cm == NULL) continue;
    dt_counters_t c;
    int cnd;
    CHECK(dt_counters_get(cm, &c));
    CHECK(dt_mesh_ndim(cm, &cnd));
    for (int d = 0; d < cnd; d++) {
      const char* dn = "";
      CHECK(dt_mesh_dim_name(cm, d, &dn));
      printf("traffic last step, %smesh dim %d%s%s:", mi ? "expert " : "", d, dn[0] ? " " : "",
             dn);
      int any = 0;
      for (int k = 0; k < DT_COLL_COUNT; k++)
        if (c.dim_calls[d][k]) {
          printf(" %s %llu calls %llu bytes;", dt_collective_name((dt_collective_t)k),
                 (unsigned long long)c.dim_calls[d][k], (unsigned long long)c.dim_nbytes[d][k]);
          any = 1;
        }
      printf("%s\n", any ? "" : " none");
    }
    int flat = 0; /* steps merged over flattened dims (FSDP over dp x cp) */
    for (int k = 0; k < DT_COLL_COUNT; k++) flat |= c.flat_calls[k] != 0;
    if (flat) {
      printf("traffic last step, %smesh flattened dims:", mi ? "expert " : "");
      for (int k = 0; k < DT_COLL_COUNT; k++)
        if (c.flat_calls[k])
          printf(" %s %llu calls %llu bytes;", dt_collective_name((dt_collective_t)k),
                 (unsigned long long)c.flat_calls[k], (unsigned long long)c.flat_nbytes[k]);
      printf("\n");
    }
  }
  if (g_sim && o.steps > 0) { /* the last step's simulated time (dt_sim_time_get) */
    dt_sim_time_t t;
    CHECK(dt_sim_time_get(&t));
    double s = t.elapsed_us * 1e-6;
    printf("estimate_step rank %d: time_ms=%.3f compute_ms=%.3f comm_ms=%.3f exposed_comm_ms=%.3f "
           "gemm_gflop=%.3f ops=%llu tokens_per_s=%.0f\n",
           g_rank, t.elapsed_us * 1e-3, t.compute_us * 1e-3, t.comm_us * 1e-3,
           t.exposed_comm_us * 1e-3, t.flops * 1e-9, (unsigned long long)t.ops,
           s > 0 ? (double)o.batch * o.seq / s : 0.0);
  }
  double final = 0.0;
  int nf = nlast < 10 ? nlast : 10;
  for (int i = 0; i < nf; i++) final += last[i] / nf;
  if (metrics) fclose(metrics);
  if (g_lead && o.plot[0] && (hist != NULL || o.steps == 0)) {
    char title[256], subtitle[320];
    snprintf(title, sizeof title,
             "dtensor train: %s Llama, %d layer%s, dim %d, %d rank%s (mesh %s), parallel %s",
             o.model, o.layers, o.layers == 1 ? "" : "s", o.dim, world, world == 1 ? "" : "s",
             o.mesh[0] ? o.mesh : "1-D", o.parallel);
    if (!strcmp(o.data, "markov"))
      snprintf(subtitle, sizeof subtitle,
               "order-%d Markov corpus over %d symbols, batch %d x %d tokens, lr %g", o.order,
               o.vocab, o.batch, o.seq, o.lr);
    else
      snprintf(subtitle, sizeof subtitle, "bytes of %.200s, batch %d x %d tokens, lr %g",
               strrchr(o.data, '/') ? strrchr(o.data, '/') + 1 : o.data, o.batch, o.seq, o.lr);
    fflush(stdout);
    plot_losses(&o, title, subtitle, hist, o.steps, dt_corpus_entropy_floor(corpus));
    fflush(stdout);
  }
  free(hist);
  /* per-rank peak memory by category (dt_memory_stats), gathered on rank 0 */
  {
    dt_memory_stats_t ms;
    dt_memory_stats(&ms);
    int64_t mine[DT_MEM_COUNT + 1], *all = NULL;
    memcpy(mine, ms.peak, sizeof ms.peak);
    mine[DT_MEM_COUNT] = ms.total_peak;
    int nranks = 1, q0 = g_sim ? g_rank : 0; /* simulated: the one rank estimated */
    if (g_sim) {
      all = malloc(sizeof mine);
      if (all) memcpy(all, mine, sizeof mine);
    } else {
      MPI_Comm_size(MPI_COMM_WORLD, &nranks);
      if (g_lead) all = malloc(sizeof mine * (size_t)nranks);
      MPI_Gather(mine, DT_MEM_COUNT + 1, MPI_INT64_T, all, DT_MEM_COUNT + 1, MPI_INT64_T, 0,
                 MPI_COMM_WORLD);
    }
    for (int q = 0; g_lead && all != NULL && q < nranks; q++) {
      const int64_t* v = all + q * (DT_MEM_COUNT + 1);
      printf("peak_memory rank %d:", q0 + q);
      for (int c = 0; c < DT_MEM_COUNT; c++)
        printf(" %s=%.2fMiB", dt_mem_category_name((dt_mem_category_t)c), (double)v[c] / 1048576.0);
      printf(" total=%.2fMiB\n", (double)v[DT_MEM_COUNT] / 1048576.0);
      printf("peak_memory_bytes rank %d:", q0 + q); /* the same, exact (for tools and tests) */
      for (int c = 0; c < DT_MEM_COUNT; c++)
        printf(" %s=%lld", dt_mem_category_name((dt_mem_category_t)c), (long long)v[c]);
      printf(" total=%lld\n", (long long)v[DT_MEM_COUNT]);
    }
    free(all);
  }
  if (g_lead && ntps == 0 && nall > 0) /* --steps 1 or 2: report what ran, never 0 */
    printf("# tokens_per_s: the mean of all %d step%s run, warm-up included (the first 2 are "
           "left out when more run)\n", nall, nall > 1 ? "s" : "");
  if (g_lead)
    printf("final_loss=%.4f entropy_floor=%.4f tokens_per_s=%.0f\n", final,
           corpus ? dt_corpus_entropy_floor(corpus) : NAN,
           ntps ? tps_sum / ntps : nall ? tps_all / nall : 0.0);
  free(tok);
  free(tgt);
  free(cp_row);
  dt_tape_destroy(tape);
  dt_adamw_destroy(opt);
  free(trainable);
  dt_llama_destroy(model);
  if (corpus) dt_corpus_destroy(corpus);
  dt_mesh_destroy(emesh);
  dt_mesh_destroy(mesh);
  dt_finalize();
  cJSON_Delete(g_inter);
  g_inter = NULL;
  return 0;
}

#ifndef TRAIN_NO_MAIN /* tools/dtensor-estimate.c has its own main and runs train_main */
int main(int argc, char** argv) { return train_main(argc, argv); }
#endif
