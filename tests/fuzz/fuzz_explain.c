/* fuzz_explain.c - libFuzzer harness for dtensor-explain's command line (tools/dtensor-explain.c,
 * compiled here without its main): the input, split on NUL bytes, is argv[1..]. Its output and
 * its messages go to /dev/null. A --cost-model value names a file in a private directory holding
 * one valid and one invalid model (anything else names a missing file), so no input reads
 * arbitrary paths; the cost model is reset after every run. Crashes, leaks, sanitizer reports and
 * an exit status other than 0 or 2 are findings. */
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"

int dt_explain_main(int argc, char** argv);

static char g_dir[64];
static FILE* g_null; /* the tool's stderr; sanitizer reports still reach fd 2 */

int LLVMFuzzerInitialize(int* argc, char*** argv);
int LLVMFuzzerInitialize(int* argc, char*** argv) {
  (void)argc;
  (void)argv;
  if (freopen("/dev/null", "w", stdout) == NULL) abort();
  g_null = fopen("/dev/null", "w");
  if (g_null == NULL) abort();
  snprintf(g_dir, sizeof g_dir, "/tmp/dt_fuzz_explain_%d", (int)getpid());
  mkdir(g_dir, 0700);
  const char* files[2][2] = {
      {"good.json", "{\"all_gather\": {\"base_us\": 3, \"hop_us\": 1, \"bw_gbps\": 5}}"},
      {"bad.json", "{\"all_gather\": {\"base_us\": 3, \"hop_us\": 1, \"bw_gbps\": 5}} x"}};
  for (int k = 0; k < 2; k++) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", g_dir, files[k][0]);
    FILE* f = fopen(path, "w");
    if (f == NULL) abort();
    fputs(files[k][1], f);
    fclose(f);
  }
  return 0;
}

#define MAX_ARGS 48

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char* buf = dt_fuzz_cstr(data, size);
  char* argv[MAX_ARGS + 2];
  char paths[MAX_ARGS + 2][160];
  int argc = 0;
  argv[argc++] = "dtensor-explain";
  for (size_t i = 0; i <= size && argc <= MAX_ARGS;) {
    argv[argc++] = buf + i;
    i += strlen(buf + i) + 1;
  }
  if (size == 0) argc = 1; /* empty input: no arguments */
  argv[argc] = NULL;
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], "--cost-model") == 0) {
      const char* v = argv[i + 1];
      int known = !strcmp(v, "good.json") || !strcmp(v, "bad.json");
      snprintf(paths[i], sizeof paths[i], "%s/%s", g_dir, known ? v : "missing.json");
      i++;
      argv[i] = paths[i];
    }
  FILE* err = stderr;
  stderr = g_null;
  int rc = dt_explain_main(argc, argv);
  stderr = err;
  fflush(stdout);
  dt_cost_model_reset();
  dt_trace_set(NULL, NULL);
  if (rc != 0 && rc != 2) {
    fprintf(stderr, "dtensor-explain returned %d\n", rc);
    abort();
  }
  free(buf);
  return 0;
}
