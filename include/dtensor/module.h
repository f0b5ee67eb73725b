/* dtensor/module.h - modules: named parameters, child modules, a forward function, and hooks.
 *
 * A module owns its parameters (leaf variables) and its children, in the order they were added
 * (parameters and children interleave). A parameter's qualified name joins the names on the path
 * from the module where iteration starts with '.' ("layers.3.attn.wq"); empty names add nothing,
 * so a module whose one parameter is unnamed gives that parameter its own path ("norm"), and an
 * unnamed child module groups parameters without changing their names.
 *
 * dt_module_forward runs a module's forward function between its hooks:
 *   pre-forward hooks (may replace the inputs) -> forward (records on the tape) -> post-forward
 *   hooks (may replace the outputs);
 * and when the module has backward hooks and the forward recorded nodes, it registers them on the
 * tape around those nodes (dt_tape_add_span_hooks): during dt_tape_backward a pre-backward hook
 * runs when the pass reaches the last node recorded inside that forward, a post-backward hook
 * after the pass has left its first node (when every gradient of the module's parameters from
 * that forward has arrived). Nested modules: pre hooks outer first, post hooks inner first. This
 * is what wrappers need: gather a block's sharded parameters before its forward and free them
 * after (with dt_tape_drop), gather again before its backward, reduce its gradients after.
 *
 * Hooks are called in the order they were added; a hook's failure is the forward's or the
 * backward's status. When the forward itself fails after the pre hooks ran, the post hooks still
 * run, with n 0 and vars NULL, so that what a pre hook put in place (a wrapper's gathered
 * parameters) is put back; the forward's failure is returned. A module must outlive every tape
 * that recorded it (reset the tape first): a backward pass that reaches a destroyed module's
 * hooks fails with DT_ERR_INVALID_USAGE (told apart by the handle registry, so while the
 * module's memory is held back: DT_HANDLE_QUARANTINE later destroys, dtensor/handle.h).
 *
 * Tied parameters (GPT-2's and Llama 3.2's output projection is the token embedding): one
 * variable held under several names, in one module or in several, added with dt_module_add_param
 * more than once or tied afterwards with dt_module_tie. It is one parameter: listed once, under
 * its first name in iteration order, by dt_module_for_each_param, dt_module_num_params,
 * dt_module_param_at and dt_module_params (so the optimizer, clipping and a checkpoint see it
 * once); every use in a forward records the same leaf, so its gradient is the sum of the uses'
 * gradients; dt_module_set_param and dt_module_swap_param under any of its names replace it for
 * every holder (it stays tied, no module keeps a destroyed variable); ownership is shared and the
 * variable is destroyed with its last holder. dt_module_for_each_param_name and
 * dt_module_param_names list every name (a checkpoint records them all; loading through any of
 * them reaches the one variable), dt_module_param_holders counts the holders. The wrappers of
 * dtensor/parallel.h handle ties (TP re-places a tied parameter for every holder, FSDP groups it
 * at the lowest module that holds every use, DDP reduces its gradient once): tie before
 * wrapping.
 */
#ifndef DTENSOR_MODULE_H
#define DTENSOR_MODULE_H

#include "dtensor/autograd.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_module* dt_module_t;

/* Computes outputs from inputs, recording on `tape`. With grad mode off nothing is recorded, but
 * the tape still owns the outputs (dt_tape_reset frees them), so it is never NULL. Parameters
 * come from dt_module_get / dt_module_param, children run through dt_module_forward. */
typedef dt_status_t (*dt_module_forward_fn)(dt_module_t m, dt_tape_t tape, int n_in,
                                            const dt_var_t* in, int n_out, dt_var_t* out);

#define DT_MODULE_NAME_MAX 64
#define DT_MODULE_HOOKS_MAX 8 /* per kind and module */

/* A module named `name` ("" allowed) with `forward` (NULL: a container that is not run itself)
 * and a context pointer the forward reads through dt_module_ctx (not owned). */
DT_API dt_status_t dt_module_create(const char* name, dt_module_forward_fn forward, void* ctx,
                                    dt_module_t* out);
/* Destroys the module, its children and the parameters it owns (a tied one only when no module
 * outside it holds it too: the last holder destroys it). */
DT_API dt_status_t dt_module_destroy(dt_module_t m);
/* Borrowed: the module's own name, and its context. */
DT_API const char* dt_module_name(dt_module_t m);
DT_API void* dt_module_ctx(dt_module_t m);
/* Replaces m's forward function (not its context: the new one reads the same dt_module_ctx)
 * and returns the old one in *old (may be NULL): a wrapper taking over a module's computation
 * calls or restores the old one (tensor parallelism's asynchronous linears do). forward NULL
 * makes m a container that is not run itself (as dt_module_create with NULL).
 * DT_ERR_INVALID_ARG for a module that is not live. */
DT_API dt_status_t dt_module_set_forward(dt_module_t m, dt_module_forward_fn forward,
                                         dt_module_forward_fn* old);

/* Adds a parameter (ownership passes to the module; "" allowed once). Names are unique among a
 * module's parameters and children. A variable some module holds already (this one under another
 * name, or another one) is tied: the holders share it (see above); nothing is checked, as it is
 * one variable. The variable is a leaf (dt_var_leaf; DT_ERR_INVALID_ARG for an op's result or a
 * tape constant, which dt_tape_reset frees). On failure the caller keeps the variable. */
DT_API dt_status_t dt_module_add_param(dt_module_t m, const char* name, dt_var_t param);
/* Adds a child (ownership passes to the parent). */
DT_API dt_status_t dt_module_add_child(dt_module_t m, dt_module_t child);
/* The parameter at qualified `name` relative to m ("attn.wq", "" for m's unnamed one).
 * DT_ERR_INVALID_ARG when there is none, the message naming the module, the name and the
 * parameters it has: "module 'fc1' has no parameter 'wieght' (it has: weight, bias)". */
DT_API dt_status_t dt_module_param(dt_module_t m, const char* name, dt_var_t* out);
/* The same for forward functions (dt_nn_linear(tape, x, dt_module_get(m, "weight"), ...)): the
 * parameter, or NULL when there is none, with the message above as the last error
 * (dt_last_error). When a forward fails after such a miss, dt_module_forward's error starts with
 * it: "module 'fc1': the forward failed after dt_module_get("wieght"): module 'fc1' has no
 * parameter 'wieght' (it has: weight, bias); the failure: ...". */
DT_API dt_var_t dt_module_get(dt_module_t m, const char* name);
/* Replaces the parameter at qualified `name` (ownership of `param` passes; the old one is
 * destroyed): a wrapper swaps a replicated parameter for a sharded one. A tied parameter is
 * replaced for every module that holds it, under whichever name (a checkpoint loads through
 * either); DT_ERR_INVALID_ARG (naming what the module has) when there is no such parameter. */
DT_API dt_status_t dt_module_set_param(dt_module_t m, const char* name, dt_var_t param);
/* Swaps the parameter at qualified `name` for `param` without destroying either: the module takes
 * ownership of `param` and hands the previous parameter back to the caller in *old (a wrapper
 * shows a module's forward gathered parameters and puts the sharded ones back after it). Every
 * holder of a tied parameter takes `param`, so *old is then held by no module. */
DT_API dt_status_t dt_module_swap_param(dt_module_t m, const char* name, dt_var_t param,
                                        dt_var_t* old);
/* The module at qualified `path` below m ("layers.3"; "" is m). */
DT_API dt_status_t dt_module_find(dt_module_t m, const char* path, dt_module_t* out);
/* Direct children, in order. */
DT_API dt_status_t dt_module_num_children(dt_module_t m, int* n);
DT_API dt_status_t dt_module_child(dt_module_t m, int i, dt_module_t* out);

/* Every parameter below m (its own and its children's, recursively, in order) with its
 * qualified name relative to m; a tied parameter once, under its first name. `visit` returns
 * nonzero to stop. A qualified name longer than 1023 characters (a parameter's, or a module's
 * path on the way to one: modules nested that deep) stops the walk with DT_ERR_INVALID_ARG, here
 * and in every listing built on it (num_params,
 * param_at, params, param_names, zero_grad, the wrappers). */
typedef int (*dt_module_visit_fn)(const char* name, dt_var_t param, void* ctx);
DT_API dt_status_t dt_module_for_each_param(dt_module_t m, dt_module_visit_fn visit, void* ctx);
/* The same once per name: a tied parameter under each of the names it has below m. */
DT_API dt_status_t dt_module_for_each_param_name(dt_module_t m, dt_module_visit_fn visit,
                                                 void* ctx);
/* Number of parameters below m (a tied one counted once), and the i-th of them (the for_each
 * order) with its qualified name written to name[cap]. */
DT_API dt_status_t dt_module_num_params(dt_module_t m, int* n);
DT_API dt_status_t dt_module_param_at(dt_module_t m, int i, char* name, size_t cap,
                                      dt_var_t* out);

/* Every parameter below m (the for_each order) as an array owned by m: valid until the next
 * dt_module_params on m or m's destruction (the caller does not free it). It lists the
 * parameters m holds now: take it after wrapping (dt_fully_shard and dt_parallelize_module
 * replace parameters), e.g. for dt_adamw_create and dt_clip_grad_norm. */
DT_API dt_status_t dt_module_params(dt_module_t m, dt_var_t** params, int* n);
/* Clears the gradient of every parameter below m (dt_var_zero_grad each; PyTorch's
 * zero_grad(set_to_none=True)): call it after the optimizer step. */
DT_API dt_status_t dt_module_zero_grad(dt_module_t m);

/* The names below m under which `param` is held, in the for_each_param_name order: their number
 * in *n (0 when m does not hold it, 1 for an untied parameter, 2 or more for a tied one) and the
 * k-th (0: the name iteration lists it under) written to name[cap] (name may be NULL).
 * DT_ERR_INVALID_ARG for k outside [0, *n) (k 0 is accepted when *n is 0). */
DT_API dt_status_t dt_module_param_names(dt_module_t m, dt_var_t param, int k, char* name,
                                         size_t cap, int* n);
/* How many module entries hold `param`, in every live module (1: an untied parameter; more: a
 * tied one; 0: no module holds it). A wrapper of m compares it with dt_module_param_names(m) to
 * find ties that leave m. */
DT_API dt_status_t dt_module_param_holders(dt_var_t param, int* n);
/* Ties the parameter at qualified `name` below m to the one at `target`: every holder of `name`'s
 * variable holds `target`'s from now on (its value: the one that stays), and `name`'s variable is
 * destroyed; tied already is a no-op. The two must agree on shape, dtype, mesh, placements and
 * requires_grad: DT_ERR_INVALID_ARG otherwise, and for a missing name, the message naming both
 * parameters and their module paths; DT_ERR_INVALID_USAGE when either is inside a module that
 * FSDP or DDP wraps already (tie before wrapping). Nothing changes on an error. */
DT_API dt_status_t dt_module_tie(dt_module_t m, const char* name, const char* target);

/* The parent module (NULL for a root). */
DT_API dt_module_t dt_module_parent(dt_module_t m);

/* State a wrapper keeps on a module: `data` under `key` (unique per module, shorter than
 * DT_MODULE_NAME_MAX), passed to free_fn (may be NULL) when the module is destroyed, before its
 * parameters and children are. At most DT_MODULE_HOOKS_MAX attachments per module. */
typedef void (*dt_module_free_fn)(dt_module_t m, void* data);
DT_API dt_status_t dt_module_attach(dt_module_t m, const char* key, void* data,
                                    dt_module_free_fn free_fn);
/* The data attached under `key`, NULL when there is none. */
DT_API void* dt_module_attachment(dt_module_t m, const char* key);
/* Removes the attachment under `key` without calling its free function. */
DT_API dt_status_t dt_module_detach(dt_module_t m, const char* key);

/* Hooks. Forward hooks see (and may replace) the inputs (pre) or outputs (post) in vars[n]. */
typedef dt_status_t (*dt_module_forward_hook_fn)(dt_module_t m, dt_tape_t tape, int n,
                                                 dt_var_t* vars, void* ctx);
typedef dt_status_t (*dt_module_backward_hook_fn)(dt_module_t m, dt_tape_t tape, void* ctx);
DT_API dt_status_t dt_module_add_forward_pre_hook(dt_module_t m, dt_module_forward_hook_fn fn,
                                                  void* ctx);
DT_API dt_status_t dt_module_add_forward_post_hook(dt_module_t m, dt_module_forward_hook_fn fn,
                                                   void* ctx);
DT_API dt_status_t dt_module_add_backward_pre_hook(dt_module_t m, dt_module_backward_hook_fn fn,
                                                   void* ctx);
DT_API dt_status_t dt_module_add_backward_post_hook(dt_module_t m, dt_module_backward_hook_fn fn,
                                                    void* ctx);

/* Removes every hook of m (of any kind) added with context `ctx`: a wrapper undoing itself. */
DT_API dt_status_t dt_module_remove_hooks(dt_module_t m, void* ctx);

/* Runs m's forward between its hooks (see above). Outputs are tape-owned variables (or whatever
 * the forward returns); `out` may be the `in` array. At most 16 inputs and 16 outputs. */
DT_API dt_status_t dt_module_forward(dt_module_t m, dt_tape_t tape, int n_in, const dt_var_t* in,
                                     int n_out, dt_var_t* out);

#ifdef __cplusplus
}
#endif
#endif /* DTENSOR_MODULE_H */
