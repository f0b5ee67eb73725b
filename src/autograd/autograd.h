/* autograd.h - internal interface of the autograd layer: variables, tape nodes, backward rules. */
#ifndef DT_AUTOGRAD_AUTOGRAD_H
#define DT_AUTOGRAD_AUTOGRAD_H

#include <stdio.h>

#include "dtensor/autograd.h"
#include "ops/ops.h"

struct dt__node;
struct dt_var {
  uint32_t magic;
  dt_tensor_t value;
  dt_tensor_t grad;
  int requires_grad;
  int leaf; /* user-owned; otherwise freed by dt_tape_reset */
  struct dt__node* creator; /* the recorded node that produced it (NULL: leaf or constant) */
  int dropped;              /* value freed by checkpointing; recomputed on demand */
  dt_placement_t value_pl[DT_MAX_MESH_DIMS]; /* placements of the value (for recomputation) */
};

/* One recorded op application. */
typedef struct dt__node {
  char op[DT_OP_NAME_MAX];
  int n_in, n_out;
  dt_var_t in[DT_OP_MAX_INPUTS];
  dt_var_t out[DT_OP_MAX_OUTPUTS];
  int n_iargs, n_fargs;
  int64_t iargs[DT_OP_MAX_IARGS];
  double fargs[DT_OP_MAX_FARGS];
  dt_placement_t src_pl[DT_MAX_MESH_DIMS]; /* redistribute: the source placements */
  dt_tensor_t saved; /* a forward by-product the rule reuses (cross_entropy: the row logsumexp) */
} dt__node_t;

/* Whether `op` has a backward rule. */
int dt__grad_has_rule(const char* op);
/* Computes the input gradients gin[] (new tensors, NULL where none) from the output gradients
 * gout[] (NULL where none). A rule may take over gout[o] (it then sets gout[o] to NULL). */
dt_status_t dt__grad_apply(const dt__node_t* n, dt_tensor_t* gout, dt_tensor_t* gin);

#endif
