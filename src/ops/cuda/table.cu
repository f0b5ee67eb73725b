/* table.cu - the CUDA kernel set: every kernel file of src/ops/cuda fills its ops' entries.
 *
 * Compiled twice like every file here: by nvcc for the "cuda" backend (dt__cuda_kernels_fill) and
 * with DT_SIMT_EMULATE for "cuda-emu" (dt__cudaemu_kernels_fill). dispatch.c calls it once per
 * kernel set. Which built-in ops have a CUDA kernel is checked by the conformance test
 * (tests/backend/test_conformance.c), which fails for an op with a host kernel and none here.
 */
#include "ops/cuda/cuda_ops.h"

DT_CU_FILL(elementwise);
DT_CU_FILL(reduce);
DT_CU_FILL(index);
DT_CU_FILL(matmul);
DT_CU_FILL(attention);

extern "C" void DT_CUDA_NAME(kernels_fill)(dt_device_kernel_t* t) {
  DT_CUDA_NAME(fill_elementwise)(t);
  DT_CUDA_NAME(fill_reduce)(t);
  DT_CUDA_NAME(fill_index)(t);
  DT_CUDA_NAME(fill_matmul)(t);
  DT_CUDA_NAME(fill_attention)(t);
}
