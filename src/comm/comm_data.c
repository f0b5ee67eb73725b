/* comm_data.c - which implementation carries a backend's tensor data: the NCCL communicator of a
 * CUDA backend (real or emulated) where the build has one, else MPI (host memory; a device
 * backend stages through it). The NCCL code itself is src/comm/comm_nccl.cu, compiled once per
 * CUDA build under its own prefix; this file picks the one that matches the backend.
 */
#include <mpi.h>

#include "comm/comm.h"

dt_status_t dt__comm_nccl_world(dt_backend_t b, const dt_comm_t* ctrl, dt_comm_t* out) {
  memset(out, 0, sizeof *out);
  DT_CHECK(dt__backend_check(b));
#ifdef DTENSOR_HAVE_CUDA
  if (b->kernel_set == DT_KERNELS_CUDA) return dt__cuda_nccl_world(b, ctrl, out);
#endif
#ifdef DTENSOR_HAVE_SIMT_EMU
  if (b->kernel_set == DT_KERNELS_CUDA_EMU) return dt__cudaemu_nccl_world(b, ctrl, out);
#endif
  (void)ctrl;
  return DT_FAIL(DT_ERR_UNSUPPORTED, "backend %s has no NCCL communicator in this build (NCCL "
                 "carries the memory of the cuda backend, and of cuda-emu over MPI)", b->name);
}

int dt__comm_is_nccl(const dt_comm_t* c) {
  if (c == NULL || c->iface == NULL) return 0;
#ifdef DTENSOR_HAVE_CUDA
  if (dt__cuda_nccl_is(c)) return 1;
#endif
#ifdef DTENSOR_HAVE_SIMT_EMU
  if (dt__cudaemu_nccl_is(c)) return 1;
#endif
  return 0;
}

dt_status_t dt__comm_nccl_version(int* version) {
  *version = 0;
#ifdef DTENSOR_HAVE_CUDA
  return dt__cuda_nccl_version(version);
#else
  return DT_FAIL(DT_ERR_UNSUPPORTED, "this build has no cuda backend (no NCCL)");
#endif
}

void dt__comm_abort_job(int code) { MPI_Abort(MPI_COMM_WORLD, code); }
