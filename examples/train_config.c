/* train_config.c - the trainer's options: defaults, checked key=value setting and the JSON config
 * file (see train_config.h). No MPI, no dtensor: the fuzz harness links this file alone. */
#include "train_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
}

/* A whole decimal integer in [lo, hi] (no trailing characters, no overflow). */
static int parse_ll(const char* val, long long lo, long long hi, long long* out) {
  char* end;
  errno = 0;
  long long v = strtoll(val, &end, 10);
  if (end == val || *end != '\0' || errno == ERANGE || v < lo || v > hi) return 0;
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

int train_opts_set(train_opts_t* o, const char* key, const char* val, char* err, size_t cap) {
  static const struct {
    const char* key;
    size_t off;
    int lo, hi;
  } ints[] = {
#define INT_OPT(name, lo, hi) {#name, offsetof(train_opts_t, name), lo, hi}
      INT_OPT(steps, 0, 1 << 30),   INT_OPT(batch, 1, 1 << 20),     INT_OPT(seq, 1, 1 << 20),
      INT_OPT(dim, 1, 1 << 20),     INT_OPT(layers, 1, 1 << 16),    INT_OPT(heads, 1, 1 << 16),
      INT_OPT(kv_heads, 0, 1 << 16), INT_OPT(experts, 1, 1 << 16),  INT_OPT(top_k, 1, 1 << 16),
      INT_OPT(vocab, 2, 1 << 20),   INT_OPT(order, 1, 64),          INT_OPT(warmup, 0, 1 << 30),
      INT_OPT(bf16_moments, 0, 1),  INT_OPT(checkpoint, 0, 1),     INT_OPT(prefetch, 0, 1),
      INT_OPT(reshard_after_forward, 0, 1 << 20), INT_OPT(dp, 1, 1 << 16),
      INT_OPT(tp, 1, 1 << 16),      INT_OPT(ep, 1, 1 << 16),        INT_OPT(sp, 0, 1),
      INT_OPT(loss_parallel, 0, 1),
#undef INT_OPT
  };
  static const struct {
    const char* key;
    size_t off, size;
  } strs[] = {
#define STR_OPT(name) {#name, offsetof(train_opts_t, name), sizeof(((train_opts_t*)0)->name)}
      STR_OPT(mesh),    STR_OPT(model), STR_OPT(data),     STR_OPT(plan),
      STR_OPT(metrics), STR_OPT(plot),  STR_OPT(parallel), STR_OPT(param_dtype),
      STR_OPT(device),
#undef STR_OPT
  };
  if (key == NULL || val == NULL) return fail(err, cap, "missing key or value");
  for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
    if (strcmp(key, ints[k].key) != 0) continue;
    long long v;
    if (!parse_ll(val, ints[k].lo, ints[k].hi, &v))
      return fail(err, cap, "%s must be an integer in [%d, %d], got '%.64s'", key, ints[k].lo,
                  ints[k].hi, val);
    *(int*)((char*)o + ints[k].off) = (int)v;
    return 1;
  }
  for (size_t k = 0; k < sizeof strs / sizeof strs[0]; k++) {
    if (strcmp(key, strs[k].key) != 0) continue;
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
    if (n >= strs[k].size)
      return fail(err, cap, "%s is longer than %zu characters", key, strs[k].size - 1);
    if (!strcmp(key, "mesh")) {
      int shape[4], nd;
      if (n > 0 && !train_mesh_parse(val, shape, &nd))
        return fail(err, cap, "mesh '%s' is not N or AxB[xC[xD]] (positive sizes)", val);
    } else if (!strcmp(key, "model")) {
      if (strcmp(val, "dense") != 0 && strcmp(val, "moe") != 0)
        return fail(err, cap, "model must be dense or moe, got '%.64s'", val);
    } else if (!strcmp(key, "data")) {
      if (n == 0) return fail(err, cap, "data must be markov or a file path");
    } else if (!strcmp(key, "metrics") || !strcmp(key, "plot")) {
      if (strpbrk(val, "'\"`$\\") != NULL)
        return fail(err, cap, "%s path '%.64s' must not contain quotes, '$' or '\\'", key, val);
    }
    memcpy((char*)o + strs[k].off, val, n + 1);
    return 1;
  }
  if (!strcmp(key, "lr") || !strcmp(key, "clip")) {
    char* end;
    double v = strtod(val, &end);
    if (end == val || *end != '\0' || !isfinite(v) || v < 0.0 || v > 1e6)
      return fail(err, cap, "%s must be a number in [0, 1e6], got '%.64s'", key, val);
    if (key[0] == 'l') o->lr = v;
    else o->clip = v;
    return 1;
  }
  if (!strcmp(key, "bucket_mb")) {
    char* end;
    double v = strtod(val, &end);
    if (end == val || *end != '\0' || !isfinite(v) || !(v > 0.0) || v > 1e6)
      return fail(err, cap, "bucket_mb must be a number in (0, 1e6] (MiB), got '%.64s'", val);
    o->bucket_mb = v;
    return 1;
  }
  if (!strcmp(key, "capacity_factor")) {
    char* end;
    double v = strtod(val, &end);
    if (end == val || *end != '\0' || !isfinite(v) || v < 0.0 || v > 1e3)
      return fail(err, cap, "capacity_factor must be a number in [0, 1e3] (0: dropless), got "
                  "'%.64s'", val);
    o->capacity_factor = v;
    return 1;
  }
  if (!strcmp(key, "seed")) {
    long long v;
    if (!parse_ll(val, LLONG_MIN, LLONG_MAX, &v))
      return fail(err, cap, "seed must be an integer, got '%.64s'", val);
    o->seed = v;
    return 1;
  }
  return fail(err, cap, "unknown config key '%.64s'", key);
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
