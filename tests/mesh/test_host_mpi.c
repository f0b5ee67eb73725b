/* test_host_mpi.c - a host program that initializes MPI itself: dt_init must not initialize it
 * again, dt_finalize must leave it running (the host finalizes), and MPI stays usable. np 2. */
#include "dt_test.h"

int main(int argc, char** argv) {
  int provided;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  DT_ASSERT_OK(dt_init(&argc, &argv));
  int world, rank;
  DT_ASSERT_OK(dt_world_size(&world));
  DT_ASSERT_OK(dt_world_rank(&rank));
  int mr;
  MPI_Comm_rank(MPI_COMM_WORLD, &mr);
  DT_ASSERT_EQ(rank, mr);
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  int64_t ts[1] = {5};
  dt_placement_t s0[1] = {dt_shard(0)}, r[1] = {dt_replicate()};
  dt_tensor_t x, y;
  DT_ASSERT_OK(dt_tensor_arange(mesh, DT_F32, 1, ts, s0, 0.0, 1.0, &x));
  DT_ASSERT_OK(dt_tensor_redistribute(x, r, &y));
  DT_ASSERT_OK(dt_tensor_destroy(x));
  DT_ASSERT_OK(dt_tensor_destroy(y));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  DT_ASSERT_OK(dt_finalize());
  int finalized = 1, sum = 0, one = 1;
  MPI_Finalized(&finalized);
  DT_ASSERT_EQ(finalized, 0);
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD); /* the host's MPI still works */
  DT_ASSERT_EQ(sum, world);
  if (rank == 0) printf("test_host_mpi: ok\n");
  MPI_Finalize();
  return 0;
}
