/* train.c - tokens/s of one training step (forward, backward, clipping, AdamW) of a ~10M-parameter
 * Llama-style model, against the same model, batch and optimizer in PyTorch 1.13 on this machine
 * with the same thread count (bench/train_torch.py, run through /usr/bin/python3 when torch is
 * importable).
 *
 *   mpirun -np 1 build/bench/bench_train [--steps N] [--threads T] [--no-torch]
 *                                        [--dim D --layers L --heads H --vocab V --ffn F
 *                                         --batch B --seq S]
 *
 * One rank, replicated parameters, OpenBLAS with T threads (default 1) against torch with T threads.
 * Model (defaults): dim 256, 10 layers, 8 heads, vocab 4096, SwiGLU 688, batch 8 x 128 tokens
 * (about 10M parameters); e.g. --dim 128 --layers 4 --heads 4 --vocab 1024 --ffn 344 is about 1M.
 * The best step
 * after one warmup step is reported for both. Last line: torch_ratio=<ours / torch tokens/s>.
 */
#define _POSIX_C_SOURCE 200809L
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "dtensor/nn.h"

static double now_s(void) { return now_us() * 1e-6; }

int main(int argc, char** argv) {
  int steps = 6, threads = 1, torch = 1;
  int dim = 256, layers = 10, heads = 8, vocab = 4096, ffn = 688, B = 8, S = 128;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--dim") && i + 1 < argc) dim = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc) layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--heads") && i + 1 < argc) heads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ffn") && i + 1 < argc) ffn = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--batch") && i + 1 < argc) B = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--seq") && i + 1 < argc) S = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--no-torch")) torch = 0;
    else {
      fprintf(stderr, "usage: %s [--steps N] [--threads T] [--no-torch] [--dim D] [--layers L] "
              "[--heads H] [--vocab V] [--ffn F] [--batch B] [--seq S]\n", argv[0]);
      return 2;
    }
  }
  CHECK(dt_init(&argc, &argv));
  openblas_set_num_threads(threads);
  int one = 1;
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(1, &one, NULL, NULL, &mesh));
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
  CHECK(dt_llama_create(mesh, &cfg, NULL, &m));
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
  int64_t* tok = malloc(sizeof(int64_t) * B * S);
  int64_t* tgt = malloc(sizeof(int64_t) * B * S);
  dt_placement_t rep = dt_replicate();
  const int64_t shape[2] = {B, S};
  double best = INFINITY;
  printf("# bench_train: %lld parameters, batch %dx%d, %d OpenBLAS thread(s), 1 rank\n",
         (long long)nparam, B, S, threads);
  for (int step = 0; step < steps; step++) {
    CHECK(dt_corpus_batch(corpus, 5, step, B, S, tok, tgt));
    for (int i = 0; i < B * S; i++) tok[i] = (tok[i] * 16 + step) % cfg.vocab;
    for (int i = 0; i < B * S; i++) tgt[i] = (tgt[i] * 16 + step) % cfg.vocab;
    dt_tensor_t tt, gt;
    CHECK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &rep, tok, &tt));
    CHECK(dt_tensor_from_full(mesh, DT_I64, 2, shape, &rep, tgt, &gt));
    double t0 = now_s();
    dt_var_t loss;
    CHECK(dt_llama_forward(m, tape, tt, gt, &loss, NULL));
    CHECK(dt_tape_backward(tape, loss));
    float lv;
    CHECK(dt_tensor_gather_full(dt_var_value(loss), &lv, sizeof lv));
    CHECK(dt_tape_reset(tape));
    CHECK(dt_clip_grad_norm(np, p, 1.0, NULL));
    CHECK(dt_adamw_step(opt, 1e-3));
    for (int i = 0; i < np; i++) CHECK(dt_var_zero_grad(p[i]));
    double dt = now_s() - t0;
    if (step > 0 && dt < best) best = dt;
    printf("dtensor step %d loss %.4f time %.1f ms\n", step, lv, dt * 1e3);
    fflush(stdout);
    dt_tensor_destroy(tt);
    dt_tensor_destroy(gt);
  }
  double ours = B * S / best, theirs = NAN;
  printf("dtensor tokens_per_s=%.1f\n", ours);
  if (torch) {
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c 'import torch' 2>/dev/null && /usr/bin/python3 %s/train_torch.py "
             "--dim %d --layers %d --heads %d --vocab %d --ffn %d --batch %d --seq %d "
             "--steps %d --threads %d",
             DT_BENCH_DIR, dim, layers, heads, vocab, ffn, B, S, steps, threads);
    FILE* f = popen(cmd, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
      fputs(line, stdout);
      if (!strncmp(line, "tokens_per_s=", 13)) theirs = atof(line + 13);
    }
    if (f) pclose(f);
    if (isnan(theirs)) printf("# torch not available: no comparison\n");
  }
  dt_tape_destroy(tape);
  dt_adamw_destroy(opt);
  dt_llama_destroy(m);
  dt_corpus_destroy(corpus);
  dt_mesh_destroy(mesh);
  free(tok);
  free(tgt);
  dt_finalize();
  printf("torch_ratio=%.3f\n", ours / theirs);
  return 0;
}
