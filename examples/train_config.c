/* train_config.c - the trainer's options: defaults, checked key=value setting, the JSON config
 * file and --help (see train_config.h). No MPI, no dtensor: the fuzz harness links this file
 * alone. */
#include "train_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int fail(char* err, size_t cap, const char* fmt, ...) {
  if (err != NULL && cap > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
  }
  return 0;
}

void train_opts_defaults(train_opts_t* o, const char* default_plan) {
  memset(o, 0, sizeof *o);
  strcpy(o->model, "dense");
  strcpy(o->data, "markov");
  strcpy(o->parallel, "none");
  strcpy(o->device, "cpu");
  snprintf(o->plan, sizeof o->plan, "%s", default_plan ? default_plan : "");
  o->steps = 1000;
  o->np = 1;
  o->batch = 32;
  o->seq = 32;
  o->dim = 64;
  o->layers = 2;
  o->heads = 4;
  o->experts = 4;
  o->top_k = 2;
  o->vocab = 16;
  o->order = 2;
  o->warmup = 20;
  o->lr = 1e-2;
  o->clip = 1.0;
  o->seed = 1234;
  o->reshard_after_forward = 1;
  o->prefetch = 1;
  o->bucket_mb = 25.0;
  o->gpus_per_node = 8;
  o->micro_batches = 1;
  o->routing_imbalance = 1.0;
}

/* ---------------------------------------------------------------------------------------------
 * The documented options, in --help order. A key missing here is refused by train_opts_set, so
 * every option the trainer takes is listed by --help (tests/tools/test_train_help.c checks the
 * converse: every key here is one train_opts_set knows). */

typedef struct {
  const char* key;   /* JSON key; the flag is --key with '-' for '_' */
  const char* group; /* heading the option is listed under (a new heading starts a group) */
  const char* arg;   /* value name; NULL for a switch (no value; true/false in JSON) */
  const char* help;
  const char* dflt;  /* the default in words, or NULL: the value train_opts_defaults sets */
} opt_doc_t;

static const opt_doc_t kDocs[] = {
    {"steps", "run", "N", "training steps", NULL},
    {"seed", "run", "N", "seed of the initial weights and of the batches", NULL},
    {"device", "run", "cpu|cuda|cuda-emu",
     "where tensors live: cuda is this rank's GPU; cuda-emu runs the CUDA kernels on the SIMT "
     "emulator (tests, slow)", NULL},
    {"model", "model", "dense|moe", "Llama-style decoder, dense or a routed mixture of experts",
     NULL},
    {"dim", "model", "D", "hidden size", NULL},
    {"layers", "model", "L", "decoder blocks", NULL},
    {"heads", "model", "H", "attention heads", NULL},
    {"kv_heads", "model", "G", "key/value heads (grouped-query attention)", "as --heads"},
    {"ffn_dim", "model", "F", "MLP hidden width (Llama 3 8B: 14336)",
     "8/3 dim rounded up to a multiple of 8"},
    {"experts", "model", "E", "moe: experts per layer", NULL},
    {"top_k", "model", "K", "moe: experts per token", NULL},
    {"capacity_factor", "model", "X",
     "moe: 0 is dropless; c > 0 keeps ceil(c tokens top_k / E) per expert", NULL},
    {"tie_embeddings", "model", NULL,
     "tie the output projection to the token embedding (one (V, D) table, as GPT-2 and Llama "
     "3.2 1B/3B): counted, stepped and sharded once, its gradient the sum of both uses'",
     "off"},
    {"data", "data", "markov|PATH",
     "an order-K Markov corpus over V symbols (exact entropy floor) or a file's bytes", NULL},
    {"vocab", "data", "V", "markov: symbols", NULL},
    {"order", "data", "K", "markov: order of the chain", NULL},
    {"batch", "data", "B", "sequences per step, all ranks together", NULL},
    {"micro_batches", "data", "K",
     "run each step's batch as K passes of B/K sequences, gradients accumulated (the data "
     "wrappers reduce after the last pass only): the same step in less activation memory", NULL},
    {"seq", "data", "S", "tokens per sequence", NULL},
    {"lr", "optimizer (AdamW)", "X",
     "peak learning rate: linear warmup, then cosine decay to lr/10", NULL},
    {"warmup", "optimizer (AdamW)", "N", "warmup steps", NULL},
    {"clip", "optimizer (AdamW)", "X", "gradient norm clipping threshold", NULL},
    {"bf16_moments", "optimizer (AdamW)", NULL, "keep the AdamW moments in bf16", "off"},
    {"freeze", "optimizer (AdamW)", "\"PATTERN,..\"",
     "parameters not trained (fine-tuning): names matching a pattern (* ? [..], e.g. "
     "\"tok_emb,layers.0.*\") get no gradient and no step; a pattern matching none is an error",
     "none"},
    {"mesh", "parallelism", "N|AxB[xC]", "the device mesh", "1-D over all ranks"},
    {"plan", "parallelism", "\"PATTERN=PLACEMENTS;..\"",
     "tensor-parallel placements by parameter name (--parallel none)", "Megatron-style, below"},
    {"parallel", "parallelism", "none|ddp|fsdp|hsdp",
     "none: tensor parallel by --plan; ddp, fsdp: 1-D mesh; hsdp: --mesh RxS", NULL},
    {"reshard_after_forward", "parallelism", "N",
     "fsdp/hsdp: 1 is ZeRO-3, 0 ZeRO-2, k > 1 keeps a 1/k slice", NULL},
    {"param_dtype", "parallelism", "f32|bf16", "fsdp/hsdp: all-gather and compute dtype",
     "f32, bf16 on cuda"},
    {"prefetch", "parallelism", "0|1", "fsdp/hsdp: prefetch the next group", NULL},
    {"bucket_mb", "parallelism", "X", "ddp: MiB of gradients per all-reduce bucket", NULL},
    {"dp", "parallelism", "N",
     "parallel config: FSDP degree; D x T x E x C (--cp) = ranks, in place of --parallel, "
     "--mesh, --plan",
     "unset"},
    {"tp", "parallelism", "N", "parallel config: tensor-parallel degree", "unset"},
    {"ep", "parallelism", "N", "parallel config: expert-parallel degree (--model moe)", "unset"},
    {"cp", "parallelism", "N",
     "parallel config: context-parallel degree (the sequence sharded, ring attention)", "unset"},
    {"sp", "parallelism", NULL, "with --tp: sequence parallelism", "off"},
    {"loss_parallel", "parallelism", NULL, "with --tp: class-sharded logits into the loss", "off"},
    {"async_tp", "parallelism", NULL,
     "with --sp: asynchronous TP (each block's all-gather and reduce-scatter overlap its "
     "linears' GEMMs)", "off"},
    {"checkpoint", "memory", NULL, "selective activation checkpointing", "off"},
    {"checkpoint_dir", "checkpoints", "DIR",
     "save distributed checkpoints to DIR/step_NNNNNNNN (loadable on any layout)", "none"},
    {"checkpoint_every", "checkpoints", "N", "save every N steps (and after the last step)",
     "0: after the last step only"},
    {"keep_last", "checkpoints", "K", "keep the newest K checkpoints", "0: all"},
    {"async_checkpoint", "checkpoints", NULL,
     "copy and write checkpoints in the background (the next optimizer step waits for the "
     "copy)", "off"},
    {"resume", "checkpoints", NULL,
     "continue from the latest checkpoint in --checkpoint-dir (any mesh and parallel config)",
     "off"},
    {"resume_from", "checkpoints", "DIR/NAME|DIR",
     "start from this checkpoint, or the one DIR/latest names (any layout; with "
     "--checkpoint-dir, saves go there); one of parameters only (dtensor-ckpt import) starts "
     "at step 0 with fresh AdamW state; when no step is left to train, saves what it loaded: a "
     "checkpoint converted to this layout",
     "none"},
    {"estimate_only", "estimate", NULL,
     "estimate instead of training: --steps (at most 2) on a simulated world of --np ranks as "
     "rank --estimate-rank, without MPI or tensor memory; prints that rank's peak memory per "
     "category and the traffic of a step, as a run on the cpu backend takes them", "off"},
    {"np", "estimate", "N", "with --estimate-only: the world size", NULL},
    {"estimate_rank", "estimate", "R", "with --estimate-only: the rank to estimate", NULL},
    {"machine", "estimate", "h100|h200|FILE.json",
     "with --estimate-only: the compute and communication figures of the step time: built-in "
     "GPU figures, or a cost model file (dtensor-calibrate -o; an \"inter_node\" object prices "
     "mesh dims that cross nodes)", "the loaded cost model"},
    {"routing_imbalance", "estimate", "X",
     "with --estimate-only and --ep: the rows this rank's experts receive, as a multiple (>= 1) "
     "of balanced routing (the simulated router sees no values)", NULL},
    {"gpus_per_node", "estimate", "N",
     "with --machine: ranks per node; a mesh dim whose group spans nodes is priced as "
     "inter-node", NULL},
    {"metrics", "output", "FILE.jsonl", "one JSON line of metrics per step", "none"},
    {"profile", "output", NULL,
     "time every op, backward rule and communication wait of the steps after the first; rank "
     "0 prints the table at the end (on a GPU each op waits for its kernels: slower)", "off"},
    {"plot", "output", "FILE.png", "the loss curve (needs gnuplot)", "none"},
};
#define NDOCS (sizeof kDocs / sizeof kDocs[0])

static const opt_doc_t* find_doc(const char* key) {
  for (size_t i = 0; i < NDOCS; i++)
    if (!strcmp(kDocs[i].key, key)) return &kDocs[i];
  return NULL;
}

const char* train_opts_key(int i, int* is_switch) {
  if (i < 0 || (size_t)i >= NDOCS) return NULL;
  if (is_switch != NULL) *is_switch = kDocs[i].arg == NULL;
  return kDocs[i].key;
}

int train_opts_known(const char* key) { return key != NULL && find_doc(key) != NULL; }

/* Edit distance (insertions, deletions, substitutions, adjacent swaps) between a and b, capped:
 * anything above `cap` is cap + 1. Keys are short (under 32 characters). */
static int key_distance(const char* a, const char* b, int cap) {
  size_t na = strlen(a), nb = strlen(b);
  if (na > 31 || nb > 31) return cap + 1;
  int d[32][32];
  for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= na; i++)
    for (size_t j = 1; j <= nb; j++) {
      int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
          d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[na][nb] > cap ? cap + 1 : d[na][nb];
}

const char* train_opts_suggest(const char* key) {
  if (key == NULL || key[0] == '\0') return NULL;
  const char* best = NULL;
  int cap = strlen(key) < 5 ? 1 : 2, best_d = cap + 1;
  for (size_t i = 0; i < NDOCS; i++) {
    int dist = key_distance(key, kDocs[i].key, cap);
    if (dist < best_d) best_d = dist, best = kDocs[i].key;
  }
  if (best == NULL) /* a prefix of one key only ("--reshard" for reshard_after_forward) */
    for (size_t i = 0; i < NDOCS; i++)
      if (strlen(key) >= 3 && !strncmp(kDocs[i].key, key, strlen(key))) {
        if (best != NULL) return NULL;
        best = kDocs[i].key;
      }
  return best;
}

/* "unknown config key 'K'" and, when one key is close, " (did you mean 'KEY'?)". */
static int fail_unknown(const char* key, char* err, size_t cap) {
  const char* near = train_opts_suggest(key);
  if (near != NULL)
    return fail(err, cap, "unknown config key '%.64s' (did you mean '%s'?)", key, near);
  return fail(err, cap, "unknown config key '%.64s'", key);
}

int train_opts_is_switch(const char* key) {
  const opt_doc_t* d = key != NULL ? find_doc(key) : NULL;
  return d != NULL && d->arg == NULL;
}

/* A whole decimal integer in [lo, hi]: an optional '-' and digits, nothing else (no spaces,
 * no '+', no trailing characters, no overflow). */
static int parse_ll(const char* val, long long lo, long long hi, long long* out) {
  const char* d = val[0] == '-' ? val + 1 : val;
  if (*d < '0' || *d > '9') return 0;
  char* end;
  errno = 0;
  long long v = strtoll(val, &end, 10);
  if (*end != '\0' || errno == ERANGE || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

/* A finite decimal number ("0.1", "-2", "3e-4", ".5"), nothing else: strtod would also take
 * spaces, '+', hexadecimal floats, inf and nan. */
static int parse_real(const char* val, double* out) {
  const char* d = val[0] == '-' ? val + 1 : val;
  if (!((*d >= '0' && *d <= '9') || (*d == '.' && d[1] >= '0' && d[1] <= '9'))) return 0;
  if (strpbrk(d, "xXpP") != NULL) return 0;
  char* end;
  errno = 0;
  double v = strtod(val, &end);
  if (*end != '\0' || errno == ERANGE || !isfinite(v)) return 0;
  *out = v;
  return 1;
}

int train_mesh_parse(const char* s, int* shape, int* nd) {
  *nd = 0;
  const char* p = s;
  for (;;) {
    if (*p < '0' || *p > '9' || *nd == 4) return 0;
    char* end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno == ERANGE || v < 1 || v > (1 << 20)) return 0;
    shape[(*nd)++] = (int)v;
    if (*end == '\0') return 1;
    if (*end != 'x') return 0;
    p = end + 1;
  }
}

/* The integer and string options: where they live in train_opts_t and their ranges. */
static const struct {
  const char* key;
  size_t off;
  int lo, hi;
} kInts[] = {
#define INT_OPT(name, lo, hi) {#name, offsetof(train_opts_t, name), lo, hi}
    INT_OPT(steps, 0, 1 << 30),   INT_OPT(batch, 1, 1 << 20),     INT_OPT(seq, 1, 1 << 20),
    INT_OPT(dim, 1, 1 << 20),     INT_OPT(layers, 1, 1 << 12),    INT_OPT(heads, 1, 1 << 16),
    INT_OPT(kv_heads, 0, 1 << 16), INT_OPT(ffn_dim, 0, 1 << 20), INT_OPT(experts, 1, 1 << 16),  INT_OPT(top_k, 1, 1 << 16),
    INT_OPT(vocab, 2, 1 << 20),   INT_OPT(order, 1, 64),          INT_OPT(warmup, 0, 1 << 30),
    INT_OPT(bf16_moments, 0, 1),  INT_OPT(checkpoint, 0, 1),     INT_OPT(prefetch, 0, 1),
    INT_OPT(reshard_after_forward, 0, 1 << 20), INT_OPT(dp, 1, 1 << 16),
    INT_OPT(tp, 1, 1 << 16),      INT_OPT(ep, 1, 1 << 16),        INT_OPT(sp, 0, 1),
    INT_OPT(cp, 1, 1 << 16),
    INT_OPT(loss_parallel, 0, 1), INT_OPT(async_tp, 0, 1), INT_OPT(tie_embeddings, 0, 1),
    INT_OPT(checkpoint_every, 0, 1 << 30), INT_OPT(keep_last, 0, 1 << 20),
    INT_OPT(async_checkpoint, 0, 1), INT_OPT(resume, 0, 1),
    INT_OPT(estimate_only, 0, 1), INT_OPT(np, 1, 1 << 20), INT_OPT(estimate_rank, 0, (1 << 20) - 1),
    INT_OPT(gpus_per_node, 1, 1 << 16), INT_OPT(micro_batches, 1, 1 << 20),
    INT_OPT(profile, 0, 1),
#undef INT_OPT
};
static const struct {
  const char* key;
  size_t off, size;
} kStrs[] = {
#define STR_OPT(name) {#name, offsetof(train_opts_t, name), sizeof(((train_opts_t*)0)->name)}
    STR_OPT(mesh),    STR_OPT(model), STR_OPT(data),     STR_OPT(plan),
    STR_OPT(metrics), STR_OPT(plot),  STR_OPT(parallel), STR_OPT(param_dtype),
    STR_OPT(device),  STR_OPT(checkpoint_dir), STR_OPT(resume_from), STR_OPT(machine),
    STR_OPT(freeze),
#undef STR_OPT
};
/* The real-valued options: where they live and their range ((lo, hi] when lo_open), as text. */
static const struct {
  const char* key;
  size_t off;
  double lo, hi;
  int lo_open;
  const char* range;
} kReals[] = {
    {"lr", offsetof(train_opts_t, lr), 0.0, 1e6, 0, "[0, 1e6]"},
    {"clip", offsetof(train_opts_t, clip), 0.0, 1e6, 0, "[0, 1e6]"},
    {"bucket_mb", offsetof(train_opts_t, bucket_mb), 0.0, 1e6, 1, "(0, 1e6] (MiB)"},
    {"capacity_factor", offsetof(train_opts_t, capacity_factor), 0.0, 1e3, 0,
     "[0, 1e3] (0: dropless)"},
    {"routing_imbalance", offsetof(train_opts_t, routing_imbalance), 1.0, 1e3, 0,
     "[1, 1e3] (1: balanced)"},
};

int train_opts_set(train_opts_t* o, const char* key, const char* val, char* err, size_t cap) {
  if (key == NULL || val == NULL) return fail(err, cap, "missing key or value");
  if (find_doc(key) == NULL) return fail_unknown(key, err, cap);
  for (size_t k = 0; k < sizeof kInts / sizeof kInts[0]; k++) {
    if (strcmp(key, kInts[k].key) != 0) continue;
    long long v;
    if (!parse_ll(val, kInts[k].lo, kInts[k].hi, &v))
      return fail(err, cap, "%s must be an integer in [%d, %d], got '%.64s'", key, kInts[k].lo,
                  kInts[k].hi, val);
    *(int*)((char*)o + kInts[k].off) = (int)v;
    return 1;
  }
  for (size_t k = 0; k < sizeof kStrs / sizeof kStrs[0]; k++) {
    if (strcmp(key, kStrs[k].key) != 0) continue;
    size_t n = strlen(val);
    if (!strcmp(key, "parallel")) {
      if (strcmp(val, "none") && strcmp(val, "ddp") && strcmp(val, "fsdp") && strcmp(val, "hsdp"))
        return fail(err, cap, "parallel must be none, ddp, fsdp or hsdp, got '%.64s'", val);
    } else if (!strcmp(key, "param_dtype")) {
      if (strcmp(val, "f32") != 0 && strcmp(val, "bf16") != 0)
        return fail(err, cap, "param_dtype must be f32 or bf16, got '%.64s'", val);
    } else if (!strcmp(key, "device")) {
      if (strcmp(val, "cpu") && strcmp(val, "cuda") && strcmp(val, "cuda-emu"))
        return fail(err, cap, "device must be cpu, cuda or cuda-emu, got '%.64s'", val);
    }
    if (n >= kStrs[k].size)
      return fail(err, cap, "%s is longer than %zu characters", key, kStrs[k].size - 1);
    if (!strcmp(key, "mesh")) {
      int shape[4], nd;
      if (n > 0 && !train_mesh_parse(val, shape, &nd))
        return fail(err, cap, "mesh '%s' is not N or AxB[xC[xD]] (positive sizes)", val);
    } else if (!strcmp(key, "model")) {
      if (strcmp(val, "dense") != 0 && strcmp(val, "moe") != 0)
        return fail(err, cap, "model must be dense or moe, got '%.64s'", val);
    } else if (!strcmp(key, "data")) {
      if (n == 0) return fail(err, cap, "data must be markov or a file path");
    } else if (!strcmp(key, "freeze")) {
      if (n > 0 && (val[0] == ',' || val[n - 1] == ',' || strstr(val, ",,") != NULL))
        return fail(err, cap, "freeze '%.64s' has an empty pattern (PATTERN,PATTERN,..)", val);
    } else if (!strcmp(key, "metrics") || !strcmp(key, "plot")) {
      if (strpbrk(val, "'\"`$\\") != NULL)
        return fail(err, cap, "%s path '%.64s' must not contain quotes, '$' or '\\'", key, val);
    }
    memcpy((char*)o + kStrs[k].off, val, n + 1);
    return 1;
  }
  for (size_t k = 0; k < sizeof kReals / sizeof kReals[0]; k++) {
    if (strcmp(key, kReals[k].key) != 0) continue;
    double v;
    if (!parse_real(val, &v) || !(kReals[k].lo_open ? v > kReals[k].lo : v >= kReals[k].lo) ||
        v > kReals[k].hi)
      return fail(err, cap, "%s must be a number in %s, got '%.64s'", key, kReals[k].range, val);
    *(double*)((char*)o + kReals[k].off) = v;
    return 1;
  }
  if (!strcmp(key, "seed")) {
    long long v;
    if (!parse_ll(val, LLONG_MIN, LLONG_MAX, &v))
      return fail(err, cap, "seed must be an integer, got '%.64s'", val);
    o->seed = v;
    return 1;
  }
  return fail_unknown(key, err, cap);
}

int train_opts_load_json(train_opts_t* o, const char* text, size_t len, char* err, size_t cap) {
  if (text == NULL) return fail(err, cap, "no config text");
  if (memchr(text, '\0', len) != NULL) return fail(err, cap, "config contains a NUL byte");
  const char* end = NULL;
  cJSON* j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (j == NULL || !cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return fail(err, cap, "config is not a JSON object");
  }
  size_t used = (size_t)(end - text);
  while (used < len && strchr(" \t\r\n", text[used]) != NULL) used++;
  if (used < len) {
    cJSON_Delete(j);
    return fail(err, cap, "trailing data after the JSON object at byte %zu", used);
  }
  int ok = 1;
  for (cJSON* it = j->child; it && ok; it = it->next) {
    char val[1100];
    for (cJSON* prev = j->child; prev != it; prev = prev->next)
      if (!strcmp(prev->string, it->string)) {
        ok = fail(err, cap, "config key '%.64s' appears twice", it->string);
        break;
      }
    if (!ok) break;
    if (cJSON_IsString(it)) {
      if (strlen(it->valuestring) >= sizeof val) {
        ok = fail(err, cap, "config key '%.64s': value too long", it->string);
        break;
      }
      snprintf(val, sizeof val, "%s", it->valuestring);
    } else if (cJSON_IsBool(it)) {
      /* true / false are 1 / 0 for the 0/1 switches and reshard_after_forward (FSDP2's bool:
       * true ZeRO-3, false ZeRO-2) only: "steps": true or "metrics": true is a mistake */
      int flag = !strcmp(it->string, "reshard_after_forward"), kind = 0; /* 0 integer (seed) */
      for (size_t k = 0; k < sizeof kInts / sizeof kInts[0]; k++)
        if (!strcmp(it->string, kInts[k].key)) flag |= kInts[k].lo == 0 && kInts[k].hi == 1;
      for (size_t k = 0; k < sizeof kReals / sizeof kReals[0]; k++)
        if (!strcmp(it->string, kReals[k].key)) kind = 1;
      for (size_t k = 0; k < sizeof kStrs / sizeof kStrs[0]; k++)
        if (!strcmp(it->string, kStrs[k].key)) kind = 2;
      if (!flag && find_doc(it->string) != NULL) { /* unknown: train_opts_set says so */
        ok = fail(err, cap, "config key '%.64s' takes %s, not true or false", it->string,
                  kind == 2 ? "a string" : kind == 1 ? "a number" : "an integer");
        break;
      }
      snprintf(val, sizeof val, "%d", cJSON_IsTrue(it));
    } else if (cJSON_IsNumber(it)) {
      double v = it->valuedouble;
      /* integers print without an exponent so that integer keys accept them */
      if (v == floor(v) && fabs(v) < 9e15) snprintf(val, sizeof val, "%.0f", v);
      else snprintf(val, sizeof val, "%.17g", v);
    } else {
      ok = fail(err, cap, "config key '%.64s' needs a string, number or boolean", it->string);
      break;
    }
    ok = train_opts_set(o, it->string, val, err, cap);
  }
  cJSON_Delete(j);
  return ok;
}

int train_opts_load_file(train_opts_t* o, const char* path, char* err, size_t cap) {
  struct stat sb; /* a FIFO or a device would block the open or never end */
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return fail(err, cap, "%s is not a regular file", path);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return fail(err, cap, "cannot open %s", path);
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  if (n < 0 || n > (1 << 20) || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return fail(err, cap, "%s is unreadable or larger than 1 MiB", path);
  }
  char* text = malloc((size_t)n + 1);
  if (text == NULL) {
    fclose(f);
    return fail(err, cap, "out of memory reading %s", path);
  }
  size_t got = fread(text, 1, (size_t)n, f);
  int rerr = ferror(f);
  fclose(f);
  int ok = rerr ? fail(err, cap, "cannot read %s", path)
                : train_opts_load_json(o, text, got, err, cap);
  free(text);
  return ok;
}

/* ---------------------------------------------------------------------------------------------
 * --help */

/* Writes `text` from column `col` (where the cursor is), wrapped before column 100 with
 * continuation lines indented by `indent`: words split at spaces and, when sep is not 0, after
 * each sep character too (no space is added there); '\x01' prints as an unbreakable space. */
static void print_wrapped(FILE* f, int col, int indent, const char* text, char sep) {
  const char* p = text;
  int first = 1;
  while (*p) {
    int gap = 0;
    while (*p == ' ') {
      p++;
      gap = 1;
    }
    if (*p == '\0') break;
    const char* e = p;
    while (*e && *e != ' ' && !(sep != 0 && e > p && e[-1] == sep)) e++;
    int n = (int)(e - p);
    if (first) gap = 0;
    if (!first && col + gap + n > 99) {
      fprintf(f, "\n%*s", indent, "");
      col = indent;
      gap = 0;
    }
    if (gap) fputc(' ', f);
    for (int k = 0; k < n; k++) fputc(p[k] == '\x01' ? ' ' : p[k], f);
    col += gap + n;
    p = e;
    first = 0;
  }
  fputc('\n', f);
}

/* The default of one documented option, as --help shows it. */
static void default_text(const train_opts_t* d, const opt_doc_t* doc, char* buf, size_t cap) {
  if (doc->dflt != NULL) {
    snprintf(buf, cap, "%s", doc->dflt);
    return;
  }
  for (size_t k = 0; k < sizeof kInts / sizeof kInts[0]; k++)
    if (!strcmp(doc->key, kInts[k].key)) {
      snprintf(buf, cap, "%d", *(const int*)((const char*)d + kInts[k].off));
      return;
    }
  for (size_t k = 0; k < sizeof kStrs / sizeof kStrs[0]; k++)
    if (!strcmp(doc->key, kStrs[k].key)) {
      snprintf(buf, cap, "%s", (const char*)d + kStrs[k].off);
      return;
    }
  if (!strcmp(doc->key, "lr")) snprintf(buf, cap, "%g", d->lr);
  else if (!strcmp(doc->key, "clip")) snprintf(buf, cap, "%g", d->clip);
  else if (!strcmp(doc->key, "bucket_mb")) snprintf(buf, cap, "%g", d->bucket_mb);
  else if (!strcmp(doc->key, "capacity_factor")) snprintf(buf, cap, "%g", d->capacity_factor);
  else if (!strcmp(doc->key, "routing_imbalance")) snprintf(buf, cap, "%g", d->routing_imbalance);
  else if (!strcmp(doc->key, "seed")) snprintf(buf, cap, "%lld", d->seed);
  else snprintf(buf, cap, "?");
}

void train_opts_help(FILE* f, const char* default_plan) {
  train_opts_t d;
  train_opts_defaults(&d, default_plan);
  fprintf(f,
          "usage: mpirun -np N train [--config FILE.json] [--FLAG VALUE | --FLAG=VALUE |\n"
          "       --SWITCH]..\n"
          "Trains a Llama-style model on a sharded mesh and prints one line per step (the comment\n"
          "atop examples/train.c has the details).\n\n"
          "  --config FILE.json          a JSON object of the keys below; flags override it\n"
          "  -h, --help                  this list\n");
  const char* group = "";
  for (size_t i = 0; i < NDOCS; i++) {
    const opt_doc_t* doc = &kDocs[i];
    if (strcmp(doc->group, group) != 0) {
      fprintf(f, "\n%s:\n", doc->group);
      group = doc->group;
    }
    char flag[96], dflt[64], text[512];
    int n = snprintf(flag, sizeof flag, "  --%s", doc->key);
    for (char* c = flag + 4; *c; c++)
      if (*c == '_') *c = '-';
    if (doc->arg != NULL) snprintf(flag + n, sizeof flag - (size_t)n, " %s", doc->arg);
    default_text(&d, doc, dflt, sizeof dflt);
    snprintf(text, sizeof text, "%s (default:\x01%s)", doc->help, dflt); /* \x01: no break */
    if (strlen(flag) > 28) fprintf(f, "%s\n%30s", flag, "");
    else fprintf(f, "%-30s", flag);
    print_wrapped(f, 30, 30, text, 0);
  }
  fprintf(f, "\nJSON config (--config FILE.json): one object whose keys are the flags' names "
             "without the\ndashes, '-' as '_'; values are strings, numbers or, for a switch, "
             "true/false, e.g.\n  {\"steps\": 200, \"kv_heads\": 2, \"parallel\": \"fsdp\", "
             "\"checkpoint\": true}\nkeys: ");
  char keys[1024] = "";
  for (size_t i = 0; i < NDOCS; i++) {
    size_t used = strlen(keys);
    snprintf(keys + used, sizeof keys - used, "%s%s", kDocs[i].key, i + 1 < NDOCS ? ", " : "");
  }
  print_wrapped(f, 6, 2, keys, 0);
  fprintf(f, "\nthe default --plan (parameter name pattern = placement per mesh dim):\n  ");
  print_wrapped(f, 2, 2, d.plan, ';');
}
