/* Helper of tests/run_nccl_env.sh: one rank of a job written for NVIDIA's
 * NCCL, bootstrapped the way NCCL_COMM_ID jobs are: every rank calls
 * ncclGetUniqueId itself (the id comes from the environment, nothing is
 * passed between ranks), then ncclCommInitRank and an all-reduce of host
 * floats, checked.  Built against the toolkit's nccl.h and NVIDIA's
 * libnccl where configure found them (the drop-in path: run with
 * LD_PRELOAD=libgeoccl.so), else against GeoCCL's; it uses nothing but
 * nccl.h.
 *
 *   nccl_env_rank RANK NRANKS
 *
 * Exit 0 when the result is right; on an error, prints the call, its
 * result and ncclGetLastError's text, and exits 2 (id), 3 (init) or 4
 * (all-reduce), 5 for a wrong result. */
#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>

#define COUNT 4099

int main(int argc, char **argv)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclResult_t r;
    static float buf[COUNT];

    if (argc != 3) {
        fprintf(stderr, "usage: nccl_env_rank RANK NRANKS\n");
        return 1;
    }
    int rank = atoi(argv[1]), nranks = atoi(argv[2]);
    if ((r = ncclGetUniqueId(&id)) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclGetUniqueId: %s: %s\n", rank, ncclGetErrorString(r),
                ncclGetLastError(NULL));
        return 2;
    }
    if ((r = ncclCommInitRank(&comm, nranks, id, rank)) != ncclSuccess) {
        fprintf(stderr, "rank %d: ncclCommInitRank: %s: %s\n", rank, ncclGetErrorString(r),
                ncclGetLastError(NULL));
        return 3;
    }
    for (int i = 0; i < COUNT; i++)
        buf[i] = (float)(rank + i % 97);
    /* Host buffers and no stream: GeoCCL's; NVIDIA's library would refuse. */
    if ((r = ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, (cudaStream_t)0)) !=
        ncclSuccess) {
        fprintf(stderr, "rank %d: ncclAllReduce: %s: %s\n", rank, ncclGetErrorString(r),
                ncclGetLastError(comm));
        ncclCommDestroy(comm);
        return 4;
    }
    int wrong = 0;
    for (int i = 0; i < COUNT; i++)
        if (buf[i] != (float)(nranks * (nranks - 1) / 2 + nranks * (i % 97)))
            wrong++;
    ncclCommDestroy(comm);
    if (wrong) {
        fprintf(stderr, "rank %d: %d of %d elements wrong\n", rank, wrong, COUNT);
        return 5;
    }
    printf("rank %d: all-reduce of %d floats over %d ranks correct\n", rank, COUNT, nranks);
    return 0;
}
