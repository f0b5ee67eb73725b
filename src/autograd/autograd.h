/* autograd.h - internal interface of the autograd layer: variables and tape nodes (the backward
 * rules are the op table's, src/ops/backward.c). */
#ifndef DT_AUTOGRAD_AUTOGRAD_H
#define DT_AUTOGRAD_AUTOGRAD_H

#include <stdio.h>

#include "dtensor/autograd.h"
#include "ops/ops.h"

struct dt__node;
struct dt_var {
  dt_tensor_t value;
  dt_tensor_t grad;
  int requires_grad;
  int leaf; /* user-owned; otherwise freed by dt_tape_reset */
  int tape_refs;  /* leaves: recorded node inputs that name it (tapes not yet reset) */
  int destroyed;  /* leaves: dt_var_destroy ran while tapes held it (a dead handle); freed
                     at their reset */
  struct dt__node* creator; /* the recorded node that produced it (NULL: leaf or constant) */
  int dropped;              /* value freed by checkpointing or dt_tape_drop; recomputed on demand */
  dt_grad_mode_t grad_mode; /* leaves: how arriving gradients are kept */
  dt_grad_hook_fn hook;     /* leaves: called once the pass has finished the gradient */
  void* hook_ctx;
  int64_t ready_at; /* during a backward pass: the node after which the gradient is complete */
  int touched;      /* during a backward pass: a gradient arrived */
  int64_t first_use; /* during a backward pass: the lowest node that names it (in or out) */
  int restored;      /* during a backward pass: recomputed by it (dropped again after first_use) */
};

/* Hooks around a span of recorded nodes (dt_tape_add_span_hooks). */
typedef struct dt__span {
  int64_t first, end;
  dt_tape_hook_fn pre, post;
  void* ctx;
  int state; /* during a backward pass: 0 not reached, 1 pre fired, 2 post fired */
} dt__span_t;

/* One recorded op application. */
typedef struct dt__node {
  int op; /* op id */
  int n_in, n_out;
  dt_var_t in[DT_OP_MAX_INPUTS];
  dt_var_t out[DT_OP_MAX_OUTPUTS];
  int n_iargs, n_fargs;
  int64_t iargs[DT_OP_MAX_IARGS];
  double fargs[DT_OP_MAX_FARGS];
  dt_tensor_t saved; /* a forward by-product the rule reuses (cross_entropy: the row logsumexp) */
} dt__node_t;

#endif
