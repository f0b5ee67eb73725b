/* flops.c - what one op's kernel costs, for the simulated clock (dt_init_simulated,
 * dt_sim_time_get): the FLOPs of the matrix products and the bytes every kernel reads and
 * writes, priced by the compute model (dt_compute_model_get, dtensor/redistribute.h).
 *
 * FLOPs count what the host kernels compute: attention scores the (query, key) pairs of
 * dt__attn_pairs (causal: blocks of rows up to the keys their last row sees; a device's fused
 * kernels skip more, so there an upper bound), its gradient recomputes the scores; attention is
 * priced at its own rate (dt__attn_gflops). Every shape here is a local shard's: the rank's own
 * work.
 */
#include "ops/ops.h"

static double dt__numel_of(const dt_local_tensor_t* t) { return (double)dt__local_numel(t); }

double dt__op_flops(int id, const dt_op_call_t* call, const dt_local_tensor_t* in,
                    const dt_local_tensor_t* out) {
  switch (id) {
    case DT_OP_MM:    /* (m,k) x (k,n) */
    case DT_OP_MM_T:  /* (k,m)^T x (k,n) */
    case DT_OP_ADDMM: /* bias + (m,k) x (k,n): the product's inputs are 1 and 2 */
    {
      const dt_local_tensor_t* b = &in[id == DT_OP_ADDMM ? 2 : 1];
      double k = (double)b->shape[0];
      return 2.0 * dt__numel_of(&out[0]) * k;
    }
    case DT_OP_BMM: /* (B,m,k) x (B,k,n) */
      return 2.0 * dt__numel_of(&out[0]) * (double)in[1].shape[1];
    case DT_OP_LINEAR:
    case DT_OP_LINEAR_NOBIAS: /* x (..., K) w (O, K)^T */
      return 2.0 * dt__numel_of(&out[0]) * (double)in[1].shape[1];
    case DT_OP_GROUPED_MM: /* every row of x (T, K) through its expert's (K, N) */
      return 2.0 * dt__numel_of(&out[0]) * (double)in[0].shape[1];
    case DT_OP_GROUPED_MM_WGRAD: /* a (T, M)^T b (T, N) per expert: the rows once */
      return 2.0 * (double)in[0].shape[0] * (double)in[0].shape[1] * (double)in[1].shape[1];
    case DT_OP_SDPA:
    case DT_OP_SDPA_GRAD: {
      const int layout = (int)dt__op_iarg(id, call, 1);
      int64_t H, S, D, G, T, E;
      dt__attn_geom(&in[0], layout, &H, &S, &D);
      dt__attn_geom(&in[1], layout, &G, &T, &D);
      dt__attn_geom(&in[2], layout, &G, &T, &E);
      const int causal = (int)dt__op_iarg(id, call, 0);
      const double pairs = (double)in[0].shape[0] * (double)H *
                           dt__attn_pairs(causal, in[0].offset[layout ? 1 : 2], S, T);
      /* forward: scores (D) and the weighted values (E); backward: the scores again, dV (E),
       * dP (E), dQ (D), dK (D) */
      return 2.0 * pairs * (id == DT_OP_SDPA ? (double)(D + E) : (double)(3 * D + 2 * E));
    }
    default:
      return 0.0;
  }
}

double dt__attn_gflops(int bf16) {
  const dt_compute_params_t* cm = dt__compute_model();
  return cm->attn_gflops > 0.0 ? cm->attn_gflops
         : bf16                ? cm->gemm_bf16_gflops
                               : cm->gemm_gflops;
}

double dt__op_sim_us(int id, const dt_op_call_t* call, const dt_local_tensor_t* in, int n_in,
                     const dt_local_tensor_t* out, int n_out, int converts, double* flops,
                     double* nbytes) {
  const dt_compute_params_t* cm = dt__compute_model();
  double nb = 0.0, conv = 0.0;
  int bf16 = 0;
  for (int t = 0; t < n_in; t++) {
    double n = dt__numel_of(&in[t]), item = (double)dt__itemsize(in[t].dtype);
    nb += n * item;
    if (converts && (in[t].dtype == DT_BF16 || in[t].dtype == DT_F16)) conv += n * (item + 4.0);
    bf16 |= in[t].dtype == DT_BF16;
  }
  for (int o = 0; o < n_out; o++) {
    double n = dt__numel_of(&out[o]), item = (double)dt__itemsize(out[o].dtype);
    nb += n * item;
    if (converts && (out[o].dtype == DT_BF16 || out[o].dtype == DT_F16)) conv += n * (item + 4.0);
  }
  double f = dt__op_flops(id, call, in, out);
  double rate = id == DT_OP_SDPA || id == DT_OP_SDPA_GRAD ? dt__attn_gflops(bf16)
                : bf16                                   ? cm->gemm_bf16_gflops
                                                         : cm->gemm_gflops;
  /* half operands of a kernel that computes in f32: the f32 copies are read and written too
   * (the GEMM rate of bf16 operands was measured with them) */
  if (f == 0.0) nb += conv;
  double t_f = f / (rate * 1e3), t_b = nb / (cm->mem_gbps * 1e3);
  *flops = f;
  *nbytes = f > 0.0 ? 0.0 : nb;
  return cm->op_us + (t_f > t_b ? t_f : t_b);
}
