/* main.cpp - a C++ program outside the tree that uses an installed dtensor (shared library), run
 * under mpirun: a Shard(0) tensor of 0..n-1 is gathered on every rank and checked, and MPI is
 * called directly (the package's MPI usage requirement reaches a C++-only project). Exit 0 when
 * every rank saw the right values. */
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "dtensor/dtensor.h"

#define CHECK(call)                                                                 \
  do {                                                                              \
    dt_status_t st_ = (call);                                                       \
    if (st_ != DT_SUCCESS) {                                                        \
      std::fprintf(stderr, "%s: %s: %s\n", #call, dt_status_name(st_), dt_last_error()); \
      return 1;                                                                     \
    }                                                                               \
  } while (0)

static int run() {
  int world = 0, rank = 0, mpi_rank = -1;
  CHECK(dt_world_size(&world));
  CHECK(dt_world_rank(&rank));
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  if (mpi_rank != rank) return 1;
  dt_mesh_t mesh = nullptr;
  CHECK(dt_mesh_create(1, &world, nullptr, nullptr, &mesh));
  const int64_t n = 6 * world;
  dt_placement_t s0[1] = {dt_shard(0)};
  dt_tensor_t t = nullptr;
  CHECK(dt_tensor_arange(mesh, DT_F32, 1, &n, s0, 0.0, 1.0, &t));
  std::vector<float> full(static_cast<size_t>(n), -1.0f);
  CHECK(dt_tensor_gather_full(t, full.data(), full.size() * sizeof(float)));
  int bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= full[static_cast<size_t>(i)] != static_cast<float>(i);
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  CHECK(dt_tensor_destroy(t));
  CHECK(dt_mesh_destroy(mesh));
  if (rank == 0) std::printf("dtensor %s from C++ on %d ranks: %s\n", dt_version(), world,
                             bad ? "WRONG" : "ok");
  return bad;
}

int main(int argc, char** argv) {
  CHECK(dt_init(&argc, &argv));
  int rc = run();
  CHECK(dt_finalize());
  return rc;
}
