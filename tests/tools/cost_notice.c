/* cost_notice.c - dt_init and dt_finalize, nothing else: tests/tools/tools_cli.sh runs it to see
 * the line rank 0 prints when dt_init loads a calibrated cost model. Exit 0 on success. */
#include <stdio.h>

#include "dtensor/dtensor.h"

int main(int argc, char** argv) {
  if (dt_init(&argc, &argv) != DT_SUCCESS) {
    fprintf(stderr, "cost_notice: %s\n", dt_last_error());
    return 1;
  }
  return dt_finalize() == DT_SUCCESS ? 0 : 1;
}
