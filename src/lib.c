/* lib.c - dt_init and dt_finalize: the one place that starts and stops every layer, bottom up
 * (and top down on the way out). It sits above all internal layers.
 *
 * Public functions name themselves with DT_ENTRY_RETURN (their bodies are static dt__*_impl
 * functions), so that every message recorded below one starts with its name (dtensor/status.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strategy/strategy.h"

/* redistribute: the calibrated cost model ($DTENSOR_COST_MODEL or the per-user file). A missing
 * file is fine; a broken one is reported (rank 0, or any simulated rank: each is alone in its
 * process) but fails nothing, and the caller's last-error text stays what it was. */
static void dt__cost_model_autoload_reported(int simulated) {
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", dt_last_error());
  if (dt__cost_model_autoload(simulated) != DT_SUCCESS) {
    const char* why = dt_last_error(); /* "dt_init: ...": the log line needs no entry */
    if (strncmp(why, "dt_init: ", 9) == 0) why += 9;
    if (strncmp(why, "dt_init_simulated: ", 19) == 0) why += 19;
    if (simulated || dt__world_rank() == 0)
      dt__log("cost", "ignoring calibrated cost model: %s", why);
    dt__error_restore(saved);
  }
}

static int dt__profile_env; /* $DTENSOR_PROFILE turned the op profile on at dt_init */

/* An environment switch: set, not empty and not "0". */
static int dt__env_on(const char* name) {
  const char* v = getenv(name);
  return v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
}

static dt_status_t dt__init_impl(int* argc, char*** argv) {
  if (dt__ctx_initialized())
    return DT_FAIL(DT_ERR_INVALID_USAGE, "the library is already initialized (called twice: "
                   "call dt_finalize before calling it again)");
  if ((argc == NULL) != (argv == NULL))
    return DT_FAIL(DT_ERR_INVALID_ARG, "argc is %s but argv is %s: pass both or neither",
                   argc ? "set" : "NULL", argv ? "set" : "NULL");
  /* backend: a CPU OpenBLAS does not know. First, while the process has the fewest threads
   * (MPI starts its own): the switch sets and restores OPENBLAS_CORETYPE around OpenBLAS's
   * re-selection, and setenv is not safe beside another thread's getenv. */
  const char* blas = dt__cpu_blas_select();
  int we_init_mpi = 0;
  DT_CHECK(dt__comm_mpi_init(argc, argv, &we_init_mpi)); /* comm */
  dt_status_t st = dt__ctx_init();                        /* mesh: the world */
  if (st != DT_SUCCESS) {
    dt__comm_mpi_finalize(we_init_mpi);
    return st;
  }
  dt__comm_mpi_set_owned(we_init_mpi);
  dt_memory_reset_peak(); /* backend: a new world's peaks (an estimate may have run before) */
  dt__cost_model_autoload_reported(0);
  const int loud = !dt__env_on("DTENSOR_QUIET");
  if (blas != NULL && dt__world_rank() == 0 && loud)
    dt__log("blas", "%s (DTENSOR_QUIET=1 hides this)", blas);
  if (!dt__comm_mpi_serialized() && dt__world_rank() == 0 && loud)
    dt__log("mpi", "MPI was started below MPI_THREAD_SERIALIZED: call the library only from the "
            "thread that started MPI (DTENSOR_QUIET=1 hides this)");
  dt__profile_env = dt__env_on("DTENSOR_PROFILE"); /* core: the op profile, reported at finalize */
  if (dt__profile_env) dt_profile_set(1);
  return DT_SUCCESS;
}

dt_status_t dt_init(int* argc, char*** argv) {
  DT_ENTRY_RETURN(dt__init_impl(argc, argv));
}

static dt_status_t dt__init_simulated_impl(int world_size, int rank) {
  if (dt__ctx_initialized())
    return DT_FAIL(DT_ERR_INVALID_USAGE, "the library is already initialized (call dt_finalize "
                   "before calling it again)");
  if (world_size < 1 || world_size > (1 << 24))
    return DT_FAIL(DT_ERR_INVALID_ARG, "world_size=%d (valid: 1 to 2^24)", world_size);
  if (rank < 0 || rank >= world_size)
    return DT_FAIL(DT_ERR_INVALID_ARG, "rank=%d (valid: 0 to %d)", rank, world_size - 1);
  DT_CHECK(dt__ctx_init_simulated(world_size, rank)); /* mesh: a world without MPI */
  dt__backend_meta_target(DT_KERNELS_HOST); /* backend: host kernels until dt_sim_set_device */
  dt_memory_reset_peak();
  dt__cost_model_autoload_reported(1); /* as dt_init loads it: the same plans */
  return DT_SUCCESS;
}

dt_status_t dt_init_simulated(int world_size, int rank) {
  DT_ENTRY_RETURN(dt__init_simulated_impl(world_size, rank));
}

static dt_status_t dt__finalize_impl(void) {
  if (dt__profile_env && dt__ctx_initialized() && dt__world_rank() == 0) { /* $DTENSOR_PROFILE */
    fprintf(stderr, "[dtensor profile] rank 0 (DTENSOR_PROFILE=1; dt_profile_report for "
            "another rank or another time):\n");
    dt_profile_report(stderr, 30);
    dt__profile_env = 0;
  }
  dt__prop_cache_release(); /* strategy */
  dt__work_finalize_all();  /* redistribute: works in flight complete first */
  dt__plan_cache_release(); /* redistribute */
  dt__backend_release_all(); /* backend: pooled blocks, workspace (live tensors keep theirs) */
  if (dt__ctx_initialized()) {
    dt__ctx_finalize(); /* mesh: workspace, communicators of live meshes */
    DT_CHECK(dt__comm_mpi_finalize_owned()); /* comm: MPI, if dt_init started it (not when
                                              * simulated: nothing started it) */
  }
  dt__handle_release_all(); /* core: memory of destroyed objects held back */
  return DT_SUCCESS;
}

dt_status_t dt_finalize(void) {
  DT_ENTRY_RETURN(dt__finalize_impl());
}
