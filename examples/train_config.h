/* train_config.h - the trainer's options (examples/train.c): defaults, one key=value at a time
 * (a command-line flag or a JSON config key), the JSON config file, each value checked, and the
 * --help text. Kept apart from train.c so that the libFuzzer harness
 * tests/fuzz/fuzz_train_config.c can call it. */
#ifndef DT_EXAMPLES_TRAIN_CONFIG_H
#define DT_EXAMPLES_TRAIN_CONFIG_H

#include <stddef.h>
#include <stdio.h>

typedef struct train_opts {
  char mesh[32], model[16], data[256], plan[1024], metrics[256], plot[256];
  char checkpoint_dir[256]; /* distributed checkpoints go here ("": none) */
  char resume_from[256];    /* a checkpoint (DIR/NAME) to start from, any layout ("": none) */
  char parallel[8];    /* none (tensor parallel by plan), ddp, fsdp or hsdp */
  char param_dtype[8]; /* FSDP/HSDP all-gather and compute dtype: f32 or bf16 ("" until set: f32
                        * on the cpu, bf16 on a cuda device) */
  char device[16];     /* where tensors live: cpu (default), cuda, cuda-emu */
  char freeze[256];    /* comma-separated name patterns of parameters not trained ("": none) */
  int steps, batch, seq, dim, layers, heads, kv_heads, experts, top_k, vocab, order, warmup;
  int ffn_dim; /* MLP width (0: the model's default rule) */
  int micro_batches; /* the batch in this many sequential passes, gradients accumulated */
  int bf16_moments, checkpoint;
  int tie_embeddings; /* the output projection is the token embedding (one (V, D) table) */
  int reshard_after_forward; /* FSDP/HSDP: 1 (ZeRO-3), 0 (ZeRO-2) or k > 1 (a slice over k) */
  int prefetch;              /* FSDP/HSDP: prefetch the next group, forward and backward */
  double lr, clip;
  double bucket_mb; /* DDP: gradient bytes per all-reduce bucket, in MiB (> 0) */
  int dp, tp, ep;   /* parallel config: FSDP, tensor and expert parallel degrees (0: unset) */
  int cp;           /* parallel config: context-parallel degree (0: unset) */
  int sp;           /* tensor parallel: sequence parallelism */
  int loss_parallel; /* tensor parallel: class-sharded logits into the loss */
  int async_tp;      /* sequence parallel: asynchronous TP (dt_tp_plan_llama's DT_TP_SP_ASYNC) */
  int profile;       /* the op profile of the steps after the first (dt_profile_*), rank 0's table */
  double capacity_factor; /* MoE: 0 dropless (the default); c > 0 caps each expert's slots */
  int checkpoint_every; /* save every N steps (0: only at the end when checkpoint_dir is set) */
  int keep_last;        /* keep the newest K checkpoints (0: all) */
  int async_checkpoint; /* save in the background: training stalls only for the host copy */
  int resume;           /* start from checkpoint_dir's latest checkpoint when there is one */
  int estimate_only;    /* simulate instead of training (dt_init_simulated): memory and traffic */
  int np;               /* with estimate_only: the simulated world size */
  int estimate_rank;    /* with estimate_only: the rank simulated */
  char machine[256];    /* with estimate_only: the compute and cost model ("": the loaded one;
                         * h100, h200: built-in figures; else a cost model JSON file) */
  int gpus_per_node;    /* with estimate_only and machine: ranks per node (inter-node dims) */
  double routing_imbalance; /* with estimate_only: MoE rows to this rank's experts, x balanced */
  long long seed;
} train_opts_t;

/* The defaults; `default_plan` is copied into o->plan. */
void train_opts_defaults(train_opts_t* o, const char* default_plan);
/* Sets one option (key as in the JSON config: "kv_heads", "lr", ...). Returns 1, or 0 with a
 * message in err: unknown key, a value that is not a number of the key's type, out of its range,
 * too long for its buffer, not one of a key's names (model, parallel, param_dtype, device), or (metrics,
 * plot) a path with quotes or '$' (they reach a shell). Checks one key at a time: how options
 * combine (parallel against mesh and plan) is train.c's to check. */
int train_opts_set(train_opts_t* o, const char* key, const char* val, char* err, size_t cap);
/* Applies a JSON config: exactly one object (white space may follow), each key once, each value a
 * string, number or boolean (true / false: 1 / 0 for the 0/1 switches and
 * reshard_after_forward, an error for every other key). On failure returns 0 with a message in err; o may be
 * half-updated. */
int train_opts_load_json(train_opts_t* o, const char* text, size_t len, char* err, size_t cap);
/* The same from a file of at most 1 MiB. */
int train_opts_load_file(train_opts_t* o, const char* path, char* err, size_t cap);
/* "4" or "2x2" (1 to 4 positive dims, each at most 1<<20) into shape; 1 on success. */
int train_mesh_parse(const char* s, int* shape, int* nd);
/* The documented options in --help order: the i-th key (as in the JSON config), NULL past the
 * end; *is_switch (may be NULL) is 1 for a flag that takes no value (true/false in JSON). Every
 * key train_opts_set accepts is one of them. */
const char* train_opts_key(int i, int* is_switch);
/* 1 when key names a switch (--checkpoint, --sp, ...), else 0. */
int train_opts_is_switch(const char* key);
/* 1 when key names a documented option (a flag without its "--", a JSON key), else 0. */
int train_opts_known(const char* key);
/* The documented key nearest to an unknown one (a typo: at most one edit for keys under 5
 * characters, two otherwise; or the one key it is a prefix of, 3 characters or more), NULL when
 * none is near. */
const char* train_opts_suggest(const char* key);
/* The trainer (examples/train.c) as a function: its command line, its exit status. Under
 * --estimate-only it needs no MPI, so tools/dtensor-estimate runs it once per layout. */
int train_main(int argc, char** argv);
/* Prints the usage: every flag grouped, with its value and default, the JSON config keys and
 * the default plan (the one train.c passes to train_opts_defaults). */
void train_opts_help(FILE* f, const char* default_plan);

#endif
