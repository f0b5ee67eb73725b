/* fuzz_train_config.c - libFuzzer harness for the trainer's JSON config (examples/train_config.c):
 * any input is applied to the defaults; it never crashes or leaks, a refusal comes with a message,
 * and whatever is accepted leaves every option within its documented range. */
#include <math.h>

#include "fuzz_common.h"
#include "train_config.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  train_opts_t o;
  train_opts_defaults(&o, "*=R");
  char err[512] = "";
  int ok = train_opts_load_json(&o, (const char*)data, size, err, sizeof err);
  if (!ok) {
    DT_FUZZ_ASSERT(err[0] != '\0');
    return 0;
  }
  DT_FUZZ_ASSERT(memchr(o.mesh, '\0', sizeof o.mesh) && memchr(o.model, '\0', sizeof o.model));
  DT_FUZZ_ASSERT(memchr(o.data, '\0', sizeof o.data) && memchr(o.plan, '\0', sizeof o.plan));
  DT_FUZZ_ASSERT(memchr(o.metrics, '\0', sizeof o.metrics) && memchr(o.plot, '\0', sizeof o.plot));
  DT_FUZZ_ASSERT(!strcmp(o.model, "dense") || !strcmp(o.model, "moe"));
  DT_FUZZ_ASSERT(!strcmp(o.parallel, "none") || !strcmp(o.parallel, "ddp") ||
                 !strcmp(o.parallel, "fsdp") || !strcmp(o.parallel, "hsdp"));
  /* "" until set: the trainer picks f32 on the cpu, bf16 on a cuda device */
  DT_FUZZ_ASSERT(!o.param_dtype[0] || !strcmp(o.param_dtype, "f32") ||
                 !strcmp(o.param_dtype, "bf16"));
  DT_FUZZ_ASSERT(!strcmp(o.device, "cpu") || !strcmp(o.device, "cuda") ||
                 !strcmp(o.device, "cuda-emu"));
  DT_FUZZ_ASSERT(o.reshard_after_forward >= 0 && (o.prefetch == 0 || o.prefetch == 1));
  DT_FUZZ_ASSERT(isfinite(o.bucket_mb) && o.bucket_mb > 0.0 && o.bucket_mb <= 1e6);
  DT_FUZZ_ASSERT(o.steps >= 0 && o.batch >= 1 && o.seq >= 1 && o.dim >= 1 && o.layers >= 1);
  DT_FUZZ_ASSERT(o.heads >= 1 && o.kv_heads >= 0 && o.experts >= 1 && o.top_k >= 1);
  DT_FUZZ_ASSERT(o.vocab >= 2 && o.order >= 1 && o.warmup >= 0);
  DT_FUZZ_ASSERT((o.bf16_moments == 0 || o.bf16_moments == 1) &&
                 (o.checkpoint == 0 || o.checkpoint == 1));
  DT_FUZZ_ASSERT(isfinite(o.lr) && o.lr >= 0.0 && isfinite(o.clip) && o.clip >= 0.0);
  DT_FUZZ_ASSERT(strpbrk(o.plot, "'\"`$\\") == NULL && strpbrk(o.metrics, "'\"`$\\") == NULL);
  if (o.mesh[0]) {
    int shape[4], nd;
    DT_FUZZ_ASSERT(train_mesh_parse(o.mesh, shape, &nd) && nd >= 1 && nd <= 4);
  }
  return 0;
}
