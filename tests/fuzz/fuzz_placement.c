/* fuzz_placement.c - libFuzzer harness for the placement text parser (dt_placement_parse,
 * dt_placements_parse, dt_dtype_parse): never crashes, every failure has a message and a zeroed
 * output, and whatever parses prints back to text that parses to the same placements. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char* text = dt_fuzz_cstr(data, size);
  dt_placement_t p, q;
  dt_status_t st = dt_placement_parse(text, &p);
  dt_fuzz_check_error(st, "dt_placement_parse");
  if (st != DT_SUCCESS) {
    DT_FUZZ_ASSERT(p.kind == 0 && p.dim == 0 && p.op == 0);
  } else {
    char buf[32];
    DT_FUZZ_ASSERT(dt_placement_format(p, buf, sizeof buf) == DT_SUCCESS);
    DT_FUZZ_ASSERT(dt_placement_parse(buf, &q) == DT_SUCCESS && dt_placement_equal(p, q));
    int64_t code = dt_placement_encode(p);
    DT_FUZZ_ASSERT(dt_placement_decode(code, &q) == DT_SUCCESS && dt_placement_equal(p, q));
    for (int nd = 0; nd <= DT_MAX_DIMS + 1; nd++) {
      q = p;
      dt_fuzz_check_error(dt_placement_normalize(&q, nd), "dt_placement_normalize");
    }
  }
  /* lists, with every capacity up to one past the mesh limit */
  for (int cap = 0; cap <= DT_MAX_MESH_DIMS + 1; cap++) {
    dt_placement_t pl[DT_MAX_MESH_DIMS + 1], back[DT_MAX_MESH_DIMS + 1];
    int n = -1, m = -1;
    st = dt_placements_parse(text, pl, cap, &n);
    dt_fuzz_check_error(st, "dt_placements_parse");
    if (st != DT_SUCCESS) {
      DT_FUZZ_ASSERT(n == 0);
      continue;
    }
    DT_FUZZ_ASSERT(n >= 1 && n <= cap);
    char buf[256];
    DT_FUZZ_ASSERT(dt_placements_format(pl, n, ",", buf, sizeof buf) == DT_SUCCESS);
    DT_FUZZ_ASSERT(dt_placements_parse(buf, back, cap, &m) == DT_SUCCESS && m == n);
    for (int i = 0; i < n; i++) DT_FUZZ_ASSERT(dt_placement_equal(pl[i], back[i]));
  }
  dt_dtype_t dt;
  dt_fuzz_check_error(dt_dtype_parse(text, &dt), "dt_dtype_parse");
  free(text);
  return 0;
}
