/*
 * mpi_allreduce.c: GeoCCL under an MPI launcher.
 *
 * MPI only starts the processes and hands the unique id around: rank 0
 * calls ncclGetUniqueId, MPI_Bcast gives the id to everyone, and every rank
 * calls ncclCommInitRank. The program then checks ncclAllReduce against
 * MPI_Allreduce for several sizes, and ncclAllGather and ncclBroadcast
 * against known values, prints a table on rank 0 and exits nonzero if any
 * result differs.
 *
 *   mpirun -np 4 ./mpi_allreduce
 *
 * Build: mpicc -o mpi_allreduce mpi_allreduce.c -lgeoccl
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NCCL_CHECK(call)                                                    \
  do {                                                                      \
    ncclResult_t r_ = (call);                                               \
    if (r_ != ncclSuccess) {                                                \
      fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank, #call,          \
              ncclGetErrorString(r_), ncclGetLastError(comm));              \
      MPI_Abort(MPI_COMM_WORLD, 1);                                         \
    }                                                                       \
  } while (0)

static double now(void) { return MPI_Wtime(); }

/* Integers in floats: every partial sum is exact, so NCCL's and MPI's
 * results must agree bit for bit whatever order each one adds in. */
static void fill(float *b, size_t n, int rank)
{
  for (size_t i = 0; i < n; i++)
    b[i] = (float)((long)((i * 2654435761u + (size_t)rank * 40503u) % 2001) - 1000);
}

int main(int argc, char **argv)
{
  int rank, nranks;
  ncclComm_t comm = NULL;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  /* Rank 0 makes the id (this starts the bootstrap listener in rank 0) and
   * MPI carries its bytes to the other ranks. */
  ncclUniqueId id;
  if (rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  NCCL_CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  static const size_t sizes[] = {1, 1000, 65536, 1 << 20, 4 << 20};
  int bad_total = 0;
  if (rank == 0) {
    printf("GeoCCL under MPI, %d ranks\n", nranks);
    printf("%-10s %12s %10s %12s %8s\n", "operation", "count", "bytes",
           "time (ms)", "result");
  }
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    size_t n = sizes[s];
    float *in = malloc(n * sizeof(float));
    float *got = malloc(n * sizeof(float));
    float *want = malloc(n * sizeof(float));
    fill(in, n, rank);
    MPI_Allreduce(in, want, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    NCCL_CHECK(ncclAllReduce(in, got, n, ncclFloat, ncclSum, comm, NULL));
    double dt = now() - t0;
    int bad = memcmp(got, want, n * sizeof(float)) != 0, any_bad;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      printf("%-10s %12zu %10zu %12.3f %8s\n", "allreduce", n,
             n * sizeof(float), dt * 1e3, any_bad ? "WRONG" : "ok");
    bad_total += any_bad;
    free(in);
    free(got);
    free(want);
  }

  /* all-gather: rank r contributes the block r*1000000 + i */
  {
    size_t n = 100000;
    int32_t *mine = malloc(n * sizeof(int32_t));
    int32_t *all = malloc(n * (size_t)nranks * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) mine[i] = (int32_t)((size_t)rank * 1000000 + i);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    NCCL_CHECK(ncclAllGather(mine, all, n, ncclInt32, comm, NULL));
    double dt = now() - t0;
    int bad = 0, any_bad;
    for (size_t i = 0; i < n * (size_t)nranks; i++)
      if (all[i] != (int32_t)((i / n) * 1000000 + i % n)) bad = 1;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      printf("%-10s %12zu %10zu %12.3f %8s\n", "allgather", n,
             n * sizeof(int32_t), dt * 1e3, any_bad ? "WRONG" : "ok");
    bad_total += any_bad;
    free(mine);
    free(all);
  }

  /* broadcast from the last rank, in place */
  {
    size_t n = 250000;
    int root = nranks - 1;
    double *b = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) b[i] = rank == root ? (double)i * 0.5 : -1.0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    NCCL_CHECK(ncclBroadcast(b, b, n, ncclDouble, root, comm, NULL));
    double dt = now() - t0;
    int bad = 0, any_bad;
    for (size_t i = 0; i < n; i++)
      if (b[i] != (double)i * 0.5) bad = 1;
    MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0)
      printf("%-10s %12zu %10zu %12.3f %8s\n", "broadcast", n,
             n * sizeof(double), dt * 1e3, any_bad ? "WRONG" : "ok");
    bad_total += any_bad;
    free(b);
  }

  NCCL_CHECK(ncclCommDestroy(comm));
  if (rank == 0) {
    printf("%s\n", bad_total ? "FAILED: results differ" : "all results match");
    fflush(stdout);
  }
  MPI_Finalize();
  return bad_total != 0;
}
