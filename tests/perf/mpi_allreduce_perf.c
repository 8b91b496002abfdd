/*
 * mpi_allreduce_perf.c: mpi-allreduce-perf, the same table as geoccl-perf
 * for MPI_Allreduce, so that the two can be compared line by line (same
 * sizes, same data, same checking, same timing: the average per iteration,
 * the maximum over ranks).
 *
 *   mpirun -np 4 tests/perf/mpi-allreduce-perf -b 1K -e 256M -d float -o sum
 *
 * In-place is MPI_IN_PLACE. Options as geoccl-perf, less those MPI has no
 * counterpart for: datatypes float, double and the integer types (MPI has
 * no half, bfloat16 or fp8), operations sum, prod, min, max (no average).
 * Exit status as geoccl-perf: 0 right, 1 wrong results, 2 bad options,
 * 3 an MPI call failed, 4 the -T watchdog fired.
 */
#define _GNU_SOURCE
#include "tools/perf_common.h"

#include <mpi.h>

#include <stdio.h>
#include <string.h>

#define TOOL "mpi-allreduce-perf"

typedef struct {
    int rank;
} mpiCtx;

static int mpi_failed(const mpiCtx *c, const char *call, int err)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, text, &len);
    fprintf(stderr, "%s: rank %d: %s failed: %s\n", TOOL, c->rank, call, text);
    return 1;
}

static MPI_Datatype mpi_type(perfType t)
{
    switch (t) {
    case PERF_INT8: return MPI_INT8_T;
    case PERF_UINT8: return MPI_UINT8_T;
    case PERF_INT32: return MPI_INT32_T;
    case PERF_UINT32: return MPI_UINT32_T;
    case PERF_INT64: return MPI_INT64_T;
    case PERF_UINT64: return MPI_UINT64_T;
    case PERF_FLOAT: return MPI_FLOAT;
    case PERF_DOUBLE: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
    }
}

static MPI_Op mpi_op(perfOp op)
{
    switch (op) {
    case PERF_SUM: return MPI_SUM;
    case PERF_PROD: return MPI_PROD;
    case PERF_MAX: return MPI_MAX;
    case PERF_MIN: return MPI_MIN;
    default: return MPI_OP_NULL;
    }
}

/* MPI counts are int: larger calls are refused by perfRun's caller. */
static int mpi_coll(void *ctx, const perfCall *k)
{
    mpiCtx *c = ctx;
    const void *send = k->inplace ? MPI_IN_PLACE : k->sendbuff;
    int err = MPI_Allreduce(send, k->recvbuff, (int)k->count, mpi_type(k->type), mpi_op(k->op),
                            MPI_COMM_WORLD);
    if (err == MPI_SUCCESS)
        return 0;
    char what[128];
    snprintf(what, sizeof(what), "MPI_Allreduce(count %zu, %s, %s, %s)", k->count,
             perfTypeName(k->type), perfOpName(k->op), k->inplace ? "MPI_IN_PLACE" : "out-of-place");
    return mpi_failed(c, what, err);
}

static int mpi_barrier(void *ctx)
{
    int err = MPI_Barrier(MPI_COMM_WORLD);
    return err == MPI_SUCCESS ? 0 : mpi_failed(ctx, "MPI_Barrier", err);
}

static int mpi_reduce_doubles(void *ctx, double *v, int n, int max)
{
    int err = MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, max ? MPI_MAX : MPI_SUM,
                            MPI_COMM_WORLD);
    return err == MPI_SUCCESS ? 0 : mpi_failed(ctx, "MPI_Allreduce of the times/counts", err);
}

static int mpi_gather_bytes(void *ctx, const void *mine, void *all, size_t bytes)
{
    int err = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE,
                            MPI_COMM_WORLD);
    return err == MPI_SUCCESS ? 0 : mpi_failed(ctx, "MPI_Allgather of the rank list", err);
}

static void mpi_describe(void *ctx, FILE *out)
{
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    (void)ctx;
    MPI_Get_library_version(version, &len);
    version[strcspn(version, "\n")] = '\0'; /* first line only */
    fprintf(out, "# %s\n", version);
}

static const perfBackend mpi_backend = {
    .name = TOOL,
    .coll = mpi_coll,
    .barrier = mpi_barrier,
    .reduceDoubles = mpi_reduce_doubles,
    .gatherBytes = mpi_gather_bytes,
    .describe = mpi_describe,
};

int main(int argc, char **argv)
{
    mpiCtx c;
    int nranks, res;
    perfOptions o;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    /* Errors come back as codes, so that the message says which call. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

    res = perfParseArgs(argc, argv, TOOL, 0, &o);
    if (res == 0 && mpi_type(o.type) == MPI_DATATYPE_NULL) {
        if (c.rank == 0)
            fprintf(stderr, "%s: -d %s: MPI has no such datatype\n", TOOL, perfTypeName(o.type));
        res = 2;
    }
    if (res == 0 && mpi_op(o.op) == MPI_OP_NULL) {
        if (c.rank == 0)
            fprintf(stderr, "%s: -o %s: MPI has no such reduction\n", TOOL, perfOpName(o.op));
        res = 2;
    }
    if (res == 0 && o.maxBytes / perfTypeSize(o.type) > 2147483647u) {
        if (c.rank == 0)
            fprintf(stderr, "%s: -e %zu: more elements than an MPI count (int) holds\n", TOOL,
                    o.maxBytes);
        res = 2;
    }
    if (res != 0) {
        MPI_Finalize();
        return res == 1 ? 0 : 2;
    }
    res = perfRun(&mpi_backend, &c, &o, c.rank, nranks, "started by MPI");
    if (res >= 3)
        MPI_Abort(MPI_COMM_WORLD, res);
    MPI_Finalize();
    return res;
}
