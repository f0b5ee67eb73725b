/* mlp.c - your own model: a 2-layer MLP (Linear-ReLU-Linear) trained on a synthetic
 * classification task, split over the ranks three ways by one flag; the model code does not change.
 *
 *   mpirun -np 4 build/examples/mlp --parallel fsdp      # parameters sharded, batch split
 *   mpirun -np 4 build/examples/mlp --parallel tp        # fc1 colwise, fc2 rowwise (Megatron)
 *   mpirun -np 4 build/examples/mlp --parallel fsdp_tp   # both, on a (tp, dp) mesh
 *   options: --steps N (30), --tp K (fsdp_tp: the tp size, default 2 when it divides the ranks);
 *   --help prints them
 *
 * Each step draws a fresh batch: x (64, 16) of unit variance, its class (of 4) the index of the
 * largest of x's dot products with 4 fixed directions. Prints "step N loss X" per step and ends
 * with "final_loss=X first_loss=Y parallel=P ranks=N". Every layout on every rank count gives the same
 * losses (tests/nn/mlp_parity.sh: to 1e-5); the README's "Your own model" walks through it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtensor/dtensor.h"

#define CHECK(call)                                                                         \
  do {                                                                                      \
    dt_status_t st_ = (call);                                                               \
    if (st_ != DT_SUCCESS) {                                                                \
      fprintf(stderr, "%s failed: %s: %s\n", #call, dt_status_name(st_), dt_last_error());   \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

enum { IN = 16, HIDDEN = 64, CLASSES = 4, BATCH = 64 };

/* ---- the data: the same on every rank (x on the host, then placed) -------------------------- */
static float noise(uint64_t i) { /* per index, uniform in [-sqrt(3), sqrt(3)): variance 1 */
  i = (i + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  i = (i ^ (i >> 31)) * 0x94d049bb133111ebull;
  return (float)((double)((i ^ (i >> 29)) >> 11) / 9007199254740992.0 * 3.4641 - 1.7320);
}
static void batch(int step, float* x, int64_t* y) {
  for (int b = 0; b < BATCH; b++) {
    float best = -1e30f;
    for (int k = 0; k < IN; k++) x[b * IN + k] = noise((uint64_t)(step * BATCH + b) * IN + k);
    for (int c = 0; c < CLASSES; c++) {
      float dot = 0;
      for (int k = 0; k < IN; k++) dot += x[b * IN + k] * noise(1000003ull * (c + 1) + k);
      if (dot > best) best = dot, y[b] = c;
    }
  }
}

/* ---- the model, and the layouts -------------------------------------------------------------- */
static dt_module_t mlp_create(dt_mesh_t mesh) {
  dt_module_t layers[3], mlp; /* nn.Sequential(Linear(16, 64), ReLU(), Linear(64, 4)) */
  CHECK(dt_linear_create(mesh, "fc1", IN, HIDDEN, 1, /*seed=*/0, &layers[0]));
  CHECK(dt_activation_create("act", "relu", &layers[1]));
  CHECK(dt_linear_create(mesh, "fc2", HIDDEN, CLASSES, 1, /*seed=*/0, &layers[2]));
  CHECK(dt_sequential_create("mlp", 3, layers, &mlp));
  return mlp;
}

/* tp on mesh dim 0, FSDP over the last dim (the batch is split over it as well) */
static void parallelize(dt_module_t mlp, dt_mesh_t mesh, int ndim, const char* how) {
  if (strcmp(how, "fsdp") != 0) {
    dt_tp_plan_entry_t plan[2] = {{"fc1", dt_tp_colwise()}, {"fc2", dt_tp_rowwise()}};
    CHECK(dt_parallelize_module(mlp, mesh, /*tp_dim=*/0, 2, plan));
  }
  if (strcmp(how, "tp") != 0) {
    dt_fsdp_config_t fc = dt_fsdp_config_for(ndim - 1, -1); /* shard over the data dim */
    CHECK(dt_fully_shard(mlp, mesh, &fc));
  }
}

/* ---- training ------------------------------------------------------------------------------- */
static float train_step(dt_module_t mlp, dt_adamw_t opt, dt_tape_t tape, dt_mesh_t mesh,
                        const dt_placement_t* data_pl, int step) {
  float xs[BATCH * IN], l;
  int64_t ys[BATCH];
  batch(step, xs, ys);
  dt_tensor_t xt, yt;
  dt_var_t x, y, logits, loss;
  CHECK(dt_tensor_from_full(mesh, DT_F32, 2, (int64_t[]){BATCH, IN}, data_pl, xs, &xt));
  CHECK(dt_tensor_from_full(mesh, DT_I64, 1, (int64_t[]){BATCH}, data_pl, ys, &yt));
  CHECK(dt_tape_constant(tape, xt, &x)); /* inputs live on the tape until its reset */
  CHECK(dt_tape_constant(tape, yt, &y));
  CHECK(dt_module_forward(mlp, tape, 1, &x, 1, &logits));
  CHECK(dt_nn_cross_entropy(tape, logits, y, DT_LOSS_MEAN, &loss));
  CHECK(dt_tape_backward(tape, loss));
  CHECK(dt_tensor_gather_full(dt_var_value(loss), &l, sizeof l));
  CHECK(dt_tape_reset(tape));
  CHECK(dt_adamw_step(opt, DT_ADAMW_LR_CONFIG));
  CHECK(dt_module_zero_grad(mlp));
  return l;
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; i++) { /* --help: the usage, without mpirun or dt_init */
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: mpirun -np N mlp [--parallel fsdp|tp|fsdp_tp] [--steps N] [--tp K]\n"
             "  --parallel   fsdp: parameters sharded, batch split; tp: fc1 colwise, fc2 rowwise;\n"
             "               fsdp_tp: both, on a (tp, dp) mesh (default: fsdp)\n"
             "  --steps N    training steps (default: 30)\n"
             "  --tp K       fsdp_tp: the tp size, dividing the ranks (default: 2 when it divides "
             "them, else 1)\n");
      return 0;
    }
  }
  CHECK(dt_init(&argc, &argv));
  const char* how = "fsdp";
  int steps = 30, rank, world, tp = 0, bad = argc % 2 == 0; /* flags come in pairs */
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--parallel") == 0) how = argv[i + 1];
    else if (strcmp(argv[i], "--steps") == 0) steps = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--tp") == 0) tp = atoi(argv[i + 1]);
    else bad = 1;
  }
  CHECK(dt_world_rank(&rank));
  CHECK(dt_world_size(&world));
  if (tp == 0) tp = world % 2 == 0 ? 2 : 1;
  int both = strcmp(how, "fsdp_tp") == 0;
  if (bad || (!both && strcmp(how, "fsdp") != 0 && strcmp(how, "tp") != 0) || steps < 1 ||
      tp < 1 || world % tp != 0) {
    if (rank == 0) {
      const char* why = bad ? "an unknown flag, or one without its value"
                        : (!both && strcmp(how, "fsdp") != 0 && strcmp(how, "tp") != 0)
                            ? "--parallel is fsdp, tp or fsdp_tp"
                        : steps < 1 ? "--steps must be 1 or more"
                                    : "--tp must divide the number of ranks";
      fprintf(stderr, "mlp: %s\nusage: mlp [--parallel fsdp|tp|fsdp_tp] [--steps N] [--tp K "
              "dividing the %d ranks]\n", why, world);
    }
    dt_finalize();
    return 2;
  }
  /* the mesh: (dp) for fsdp, (tp) for tp, (tp, dp) for both; the batch split over dp */
  int shape[2] = {both ? tp : world, world / tp}, ndim = both ? 2 : 1;
  const char* names[2] = {strcmp(how, "fsdp") == 0 ? "dp" : "tp", "dp"};
  dt_mesh_t mesh;
  CHECK(dt_mesh_create(ndim, shape, names, NULL, &mesh));
  dt_placement_t data_pl[2] = {dt_replicate(), dt_shard(0)};
  if (strcmp(how, "fsdp") == 0) data_pl[0] = dt_shard(0);

  dt_module_t mlp = mlp_create(mesh);
  parallelize(mlp, mesh, ndim, how);
  dt_var_t* params;
  int n;
  CHECK(dt_module_params(mlp, &params, &n)); /* after wrapping: the sharded parameters */
  dt_adamw_config_t ac = dt_adamw_config_default();
  ac.lr = 1e-2;
  dt_adamw_t opt;
  CHECK(dt_adamw_create(&ac, n, params, &opt));
  dt_tape_t tape;
  CHECK(dt_tape_create(&tape));
  int64_t total = 0, held = 0; /* the parameters' elements, and those this rank holds */
  for (int i = 0; i < n; i++) {
    dt_tensor_t t = dt_var_value(params[i]);
    int nd;
    int64_t s[2], local;
    CHECK(dt_tensor_ndim(t, &nd));
    CHECK(dt_tensor_shape(t, s));
    CHECK(dt_tensor_local_numel(t, &local));
    total += nd == 2 ? s[0] * s[1] : s[0];
    held += local;
  }
  char mesh_s[32];
  if (both) snprintf(mesh_s, sizeof mesh_s, "(tp %d, dp %d)", shape[0], shape[1]);
  else snprintf(mesh_s, sizeof mesh_s, "(%s %d)", names[0], world);
  if (rank == 0)
    printf("# mlp: %s on %d ranks, mesh %s: %lld parameters, %lld held by rank 0\n", how, world,
           mesh_s, (long long)total, (long long)held);
  float loss = 0, first = 0;
  for (int step = 0; step < steps; step++) {
    loss = train_step(mlp, opt, tape, mesh, data_pl, step);
    if (step == 0) first = loss;
    if (rank == 0) printf("step %d loss %.9g\n", step, loss);
  }
  if (rank == 0) printf("final_loss=%.6f first_loss=%.6f parallel=%s ranks=%d\n", loss, first, how,
                        world);
  CHECK(dt_tape_destroy(tape));
  CHECK(dt_adamw_destroy(opt));
  CHECK(dt_module_destroy(mlp));
  CHECK(dt_mesh_destroy(mesh));
  CHECK(dt_finalize());
  return 0;
}
