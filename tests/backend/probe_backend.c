/* probe_backend.c - exits 0 when backend argv[1] can be opened here, 77 when this build or
 * machine has none (not built, no GPU, no driver: ctest's "skipped"), 1 on any other failure.
 * tests/with_backend.sh runs it before a test that needs the backend. */
#include <stdio.h>

#include "dtensor/dtensor.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: probe_backend NAME\n");
    return 1;
  }
  if (dt_init(NULL, NULL) != DT_SUCCESS) {
    fprintf(stderr, "probe_backend: dt_init: %s\n", dt_last_error());
    return 1;
  }
  dt_backend_t b;
  dt_status_t st = dt_backend_get(argv[1], &b);
  int rc = st == DT_SUCCESS ? 0 : (st == DT_ERR_CUDA || st == DT_ERR_UNSUPPORTED) ? 77 : 1;
  if (rc != 0) printf("backend %s: %s\n", argv[1], dt_last_error());
  dt_finalize();
  return rc;
}
