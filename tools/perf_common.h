/*
 * perf_common.h: the measuring loop shared by geoccl-perf and
 * mpi-allreduce-perf.
 *
 * Both tools print the same table (the layout of NVIDIA's nccl-tests: one
 * line per size, out-of-place then in-place, each with time, algorithm and
 * bus bandwidth and the number of wrong elements), so the two can be
 * compared line by line. Everything that differs between them (how the
 * processes meet, which library runs the collective) sits behind
 * perfBackend; everything else (options, sizes, test data, checking,
 * timing, printing) is here, written once.
 *
 * Nothing here depends on GeoCCL or MPI: the datatypes and operations are
 * our own enums, numbered as in nccl.h so that GeoCCL's backend converts
 * them with a cast (geoccl_perf.c checks that at compile time).
 */
#ifndef GEOCCL_PERF_COMMON_H_
#define GEOCCL_PERF_COMMON_H_

#include <stddef.h>
#include <stdio.h>

/* Same values as ncclDataType_t. */
typedef enum {
    PERF_INT8 = 0,
    PERF_UINT8 = 1,
    PERF_INT32 = 2,
    PERF_UINT32 = 3,
    PERF_INT64 = 4,
    PERF_UINT64 = 5,
    PERF_HALF = 6,
    PERF_FLOAT = 7,
    PERF_DOUBLE = 8,
    PERF_BFLOAT16 = 9,
    PERF_FP8E4M3 = 10,
    PERF_FP8E5M2 = 11,
    PERF_NTYPES
} perfType;

/* Same values as ncclRedOp_t. */
typedef enum { PERF_SUM = 0, PERF_PROD = 1, PERF_MAX = 2, PERF_MIN = 3, PERF_AVG = 4, PERF_NOPS } perfOp;

typedef enum {
    PERF_ALLREDUCE,
    PERF_BROADCAST,
    PERF_ALLGATHER,
    PERF_REDUCESCATTER,
    PERF_NCOLLS
} perfColl;

/* Test data (--data). */
typedef enum {
    /* small integers whose every partial result is exact in the datatype:
     * results are checked bit for bit; compresses far better than any
     * gradient (a 4 KiB tile repeated) */
    PERF_DATA_PATTERN,
    /* gradient-like: N(0, 1) with full binary32/binary64 mantissas, a
     * different reproducible stream per rank, repeating only every 2^20
     * elements; other datatypes get normal values quantized so that their
     * sums stay exact (see perf_common.c) */
    PERF_DATA_GAUSS,
} perfDataKind;

/* Command line, as nccl-tests spells it where nccl-tests has the option. */
typedef struct {
    perfColl coll;     /* -C; default allreduce */
    perfType type;     /* -d; default float */
    perfOp op;         /* -o; default sum */
    int root;          /* -r; default 0 (broadcast only) */
    size_t minBytes;   /* -b; default 8 */
    size_t maxBytes;   /* -e; default 32M */
    size_t stepBytes;  /* -i; when nonzero, sizes grow by this, not by stepFactor */
    size_t stepFactor; /* -f; default 2 */
    int iters;         /* -n; default 20 */
    int warmup;        /* -w; default 5 */
    int check;         /* -c; default 1 */
    int timeout;       /* -T seconds per size, 0 = none; default 0 */
    int gapMs;         /* -G idle milliseconds before each timed iteration; default 0 */
    int nprocs;        /* -N; 0 when not given */
    perfDataKind data; /* --data; default PERF_DATA_PATTERN */
    int checkExact;    /* --check-exact: no codec error allowed (see perfCodecBound) */
} perfOptions;

/*
 * How far one round trip through a lossy codec may move a value v (the
 * codec's documented bound, compress/codec.h):
 *   |v - decode(encode(v))| <= rel |v| + block W + abs + max(0, |v| - sat)
 * where W is the largest |value| of the codec's block that holds v; the
 * check takes every value within blockSize - 1 elements of v, since it does
 * not know where blocks start. sat = 0: the codec does not saturate.
 */
typedef struct {
    char name[48];    /* for the table: "int8", "auto:int8,fp16" */
    double rel, block, abs, sat;
    size_t blockSize; /* 1 when block is 0 */
} perfCodecBound;

/* Which options a tool accepts beyond the common -b -e -f -i -n -w -c -d -o
 * -T -h. */
enum { PERF_OPT_COLL = 1, PERF_OPT_ROOT = 2, PERF_OPT_NPROCS = 4 };

/* Parses argv into *o (defaults first). On a bad or unknown option prints
 * the cause and the usage to stderr and returns 2; returns 1 after printing
 * the usage to stdout for -h; 0 when the options are usable. Checks only
 * what needs no rank count (the root is checked by perfRun). */
int perfParseArgs(int argc, char **argv, const char *tool, unsigned accepted, perfOptions *o);

const char *perfTypeName(perfType t);
size_t perfTypeSize(perfType t);
const char *perfOpName(perfOp op);
const char *perfCollName(perfColl c);

/* One call of the measured collective, with the arguments of the NCCL
 * function of that name: count is the NCCL count (all-gather: elements sent
 * by each rank; reduce-scatter: elements received by each rank). For
 * in-place calls sendbuff and recvbuff already point where NCCL's in-place
 * rules put them. */
typedef struct {
    perfColl coll;
    perfType type;
    perfOp op;
    int root;
    const void *sendbuff;
    void *recvbuff;
    size_t count;
    int inplace; /* for messages */
} perfCall;

/*
 * What a tool supplies. Every member is called by every rank in the same
 * order (they are collectives). Each returns 0 on success; on failure it
 * has already printed the cause (with its rank) to stderr and returns
 * nonzero, and perfRun returns at once: the caller then ends the job, since
 * the other ranks are left waiting in a collective.
 */
typedef struct {
    /* The tool's name, for the header and for messages. */
    const char *name;
    /* Runs *call once and returns when its result is in recvbuff. */
    int (*coll)(void *ctx, const perfCall *call);
    /* Returns on every rank only once all ranks have called it. */
    int (*barrier)(void *ctx);
    /* v[0..n) over all ranks, in place: the maximum when max is 1, else the
     * sum (used for the times and the error counts). */
    int (*reduceDoubles)(void *ctx, double *v, int n, int max);
    /* all[r*bytes .. (r+1)*bytes) receives rank r's mine, on every rank. */
    int (*gatherBytes)(void *ctx, const void *mine, void *all, size_t bytes);
    /* Rank 0 only, once: header lines (starting with "# ") naming the
     * library, its version and the settings that shape its performance.
     * May be NULL. */
    void (*describe)(void *ctx, FILE *out);
    /* Payload bytes this rank has sent to other regions so far (GeoCCL's
     * statistics), for the "wan(B)" column; NULL prints no such column. */
    double (*wanBytes)(void *ctx);
    /* This rank's region (0-based, the same numbering on every rank) and
     * the number of regions; called once, before any collective. NULL:
     * one region. */
    int (*region)(void *ctx, int *region, int *nregions);
    /* Called right before the call whose result is checked, every rank
     * (may be NULL): e.g. forgets error-feedback residuals, so that this
     * call's error is one round trip's. Returns 0, or nonzero after a
     * message. */
    int (*checkBegin)(void *ctx);
    /* Right after that call: 1 when its result went through a lossy codec
     * (*bound says how far it may be off), 0 when it is exact, -1 after a
     * message. May be NULL (always exact). */
    int (*checkCodec)(void *ctx, const perfCall *call, perfCodecBound *bound);
} perfBackend;

/*
 * Runs the whole benchmark on this rank and, on rank 0, prints the table to
 * stdout. launch says in words how the ranks were started (header line).
 * Returns 0 when every result was right, 1 when some element was wrong or
 * written out of bounds (the table says where), 2 for options that do not
 * fit the rank count, 3 when a backend call or an allocation failed (the
 * job should then be ended: other ranks may be blocked). With o->timeout
 * set, a size that takes longer ends the process with status 4 after a
 * message naming the rank, the size and the placement.
 */
int perfRun(const perfBackend *be, void *ctx, const perfOptions *o, int rank, int nranks,
            const char *launch);

/* Monotonic time in seconds, for timing only. */
double perfNow(void);

#endif
