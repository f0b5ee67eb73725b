/* fuzz_plan_pattern.c - libFuzzer harness for the parameter-plan matcher (dt_nn_plan_lookup):
 * input "PLAN\0NAME" (or just PLAN, matched against a fixed name). The lookup never crashes and
 * explains every failure; for a plan of one clean entry "PATTERN=S(0)", its answer equals a
 * dynamic-programming wildcard match written independently here. */
#include "fuzz_common.h"
#include "dtensor/nn.h"

/* '*' matches any run: dp over (pattern prefix, name prefix), O(np * nn). */
static int ref_glob(const char* p, size_t np, const char* s, size_t ns) {
  unsigned char* row = calloc(ns + 1, 1);
  unsigned char* nxt = calloc(ns + 1, 1);
  if (!row || !nxt) abort();
  row[0] = 1;
  for (size_t j = 1; j <= ns; j++) row[j] = 0;
  for (size_t i = 1; i <= np; i++) {
    nxt[0] = row[0] && p[i - 1] == '*';
    for (size_t j = 1; j <= ns; j++)
      nxt[j] = p[i - 1] == '*' ? (row[j] || nxt[j - 1]) : (row[j - 1] && p[i - 1] == s[j - 1]);
    memcpy(row, nxt, ns + 1);
  }
  int r = row[ns];
  free(row);
  free(nxt);
  return r;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char* in = malloc(size + 2);
  if (in == NULL) abort();
  memcpy(in, data, size);
  in[size] = in[size + 1] = '\0';
  const char* plan = in;
  size_t plen = strlen(in);
  const char* name = plen < size ? in + plen + 1 : "layers.0.attn.wq";
  dt_placement_t pl[DT_MAX_MESH_DIMS];
  for (int nd = 0; nd <= DT_MAX_MESH_DIMS + 1; nd++) {
    dt_status_t st = dt_nn_plan_lookup(plan, name, nd, pl);
    dt_fuzz_check_error(st, "dt_nn_plan_lookup");
  }
  /* the matcher against the reference: a pattern without ';', '=' or surrounding spaces */
  if (plen <= 200 && strpbrk(plan, ";=") == NULL &&
      (plen == 0 || (plan[0] != ' ' && plan[plen - 1] != ' '))) {
    char one[256];
    snprintf(one, sizeof one, "%s=S(0)", plan);
    DT_FUZZ_ASSERT(dt_nn_plan_lookup(one, name, 1, pl) == DT_SUCCESS);
    int got = pl[0].kind == DT_SHARD;
    int want = ref_glob(plan, plen, name, strlen(name));
    if (got != want) {
      fprintf(stderr, "pattern '%s' vs name '%s': lookup %d, reference %d\n", plan, name, got,
              want);
      abort();
    }
  }
  free(in);
  return 0;
}
