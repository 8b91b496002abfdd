/*
 * perf_common.c: options, test data, checking, timing and the table shared
 * by geoccl-perf and mpi-allreduce-perf (see perf_common.h).
 *
 * Test data. Every input value is a small non-negative integer (or, for
 * products, 1 or 2) chosen so that every partial result, in whatever order
 * a library combines the ranks' contributions, is exactly representable in
 * the datatype, fp8 included. A correct library therefore produces the
 * reference bit for bit, and the check compares bytes: an element is wrong
 * when it differs at all. Inputs repeat with a short period, so the
 * reference is one precomputed tile per rank (and one for the reduction)
 * and filling and checking a buffer are memcpy/memcmp over tiles.
 *
 * Buffers are filled with 0xff bytes ("poison") before each checked call:
 * that is NaN for every floating type, -1 for signed and a value no result
 * reaches for unsigned integers, so an element the library never wrote is
 * counted as wrong. The 4 KiB after the bytes a call may write are poison
 * too and are checked afterwards (the "out of bounds" count).
 */
#define _GNU_SOURCE
#include "perf_common.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PERF_GUARD 4096 /* bytes checked past the end of what a call may write */
#define PERF_POISON 0xff
#define PERF_VMAX 200   /* largest input value; keeps uint8 results below the poison */
#define PERF_TILE_BYTES 4096

static const struct {
    const char *name;
    const char *aliases;     /* other spellings -d accepts, space-separated */
    size_t size;
    unsigned long long exact; /* every integer in 0..exact is representable */
    int pow2max;              /* 2^pow2max is representable (products) */
} types[PERF_NTYPES] = {
    [PERF_INT8] = {"int8", "char", 1, 127, 6},
    /* 255 is the poison: keep results below it */
    [PERF_UINT8] = {"uint8", "", 1, 254, 7},
    [PERF_INT32] = {"int32", "int", 4, INT32_MAX, 30},
    [PERF_UINT32] = {"uint32", "", 4, UINT32_MAX - 1, 31},
    [PERF_INT64] = {"int64", "", 8, INT64_MAX, 62},
    [PERF_UINT64] = {"uint64", "", 8, UINT64_MAX - 1, 63},
    [PERF_HALF] = {"half", "float16 fp16", 2, 2048, 15},
    [PERF_FLOAT] = {"float", "float32 fp32", 4, 1ull << 24, 127},
    [PERF_DOUBLE] = {"double", "float64 fp64", 8, 1ull << 53, 1023},
    [PERF_BFLOAT16] = {"bfloat16", "bf16", 2, 256, 127},
    [PERF_FP8E4M3] = {"fp8e4m3", "fp8_e4m3 f8e4m3 e4m3", 1, 16, 8},
    [PERF_FP8E5M2] = {"fp8e5m2", "fp8_e5m2 f8e5m2 e5m2", 1, 8, 15},
};

static const char *const op_names[PERF_NOPS] = {"sum", "prod", "max", "min", "avg"};
static const char *const coll_names[PERF_NCOLLS] = {"allreduce", "broadcast", "allgather",
                                                    "reducescatter"};

const char *perfTypeName(perfType t) { return (unsigned)t < PERF_NTYPES ? types[t].name : "?"; }
size_t perfTypeSize(perfType t) { return (unsigned)t < PERF_NTYPES ? types[t].size : 0; }
const char *perfOpName(perfOp op) { return (unsigned)op < PERF_NOPS ? op_names[op] : "?"; }
const char *perfCollName(perfColl c) { return (unsigned)c < PERF_NCOLLS ? coll_names[c] : "?"; }

double perfNow(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------------------
 * Options
 */

/* "256M", "1K", "8", "4GiB": binary multiples, as nccl-tests reads them. */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    unsigned long long v;
    int shift = 0;

    if (s == NULL || *s == '-')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno != 0 || end == s)
        return -1;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end != '\0' || (shift && v > (ULLONG_MAX >> shift)) || (v << shift) > SIZE_MAX / 4)
        return -1;
    *out = (size_t)(v << shift);
    return 0;
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int word_in(const char *word, const char *list)
{
    size_t n = strlen(word);
    for (const char *p = list; *p;) {
        size_t m = strcspn(p, " ");
        if (m == n && strncasecmp(p, word, n) == 0)
            return 1;
        p += m;
        p += strspn(p, " ");
    }
    return 0;
}

static int parse_type(const char *s, perfType *out)
{
    for (int t = 0; t < PERF_NTYPES; t++) {
        if (strcasecmp(s, types[t].name) == 0 || word_in(s, types[t].aliases)) {
            *out = (perfType)t;
            return 0;
        }
    }
    return -1;
}

static int parse_name(const char *s, const char *const *names, int n, int *out)
{
    for (int i = 0; i < n; i++) {
        if (strcasecmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return -1;
}

static void usage(FILE *f, const char *tool, unsigned accepted)
{
    fprintf(f, "usage: %s [options]\n", tool);
    if (accepted & PERF_OPT_COLL)
        fprintf(f, "  -C, --coll NAME          allreduce (default), broadcast, allgather, "
                   "reducescatter\n");
    fprintf(f, "  -b, --minbytes SIZE      smallest size (default 8; suffixes K, M, G)\n"
               "  -e, --maxbytes SIZE      largest size (default 32M)\n"
               "  -f, --stepfactor N       multiply the size by N each step (default 2)\n"
               "  -i, --stepbytes SIZE     add SIZE each step instead\n"
               "  -n, --iters N            timed iterations per size (default 20)\n"
               "  -w, --warmup_iters N     untimed iterations before them (default 5)\n"
               "  -c, --check 0|1          verify every result element (default 1)\n");
    if (accepted & PERF_OPT_COLL)
        fprintf(f, "  -d, --datatype TYPE      float (default), double, half, bfloat16, int8, "
                   "uint8,\n"
                   "                           int32, uint32, int64, uint64, fp8e4m3, "
                   "fp8e5m2\n"
                   "  -o, --op OP              sum (default), prod, min, max, avg\n");
    else
        fprintf(f, "  -d, --datatype TYPE      float (default), double, int8, uint8, int32, "
                   "uint32,\n"
                   "                           int64, uint64\n"
                   "  -o, --op OP              sum (default), prod, min, max\n");
    if (accepted & PERF_OPT_ROOT)
        fprintf(f, "  -r, --root R             broadcast root (default 0)\n");
    fprintf(f, "  -T, --timeout S          end the run if one size takes more than S "
               "seconds\n"
               "                           (default 0: no limit)\n");
    if (accepted & PERF_OPT_NPROCS)
        fprintf(f, "  -N, --nprocs N           fork N local ranks (default 1)\n");
    fprintf(f, "  -G, --gap MS             idle MS milliseconds before each timed iteration, as a\n"
               "                           training step's compute leaves the links idle; the\n"
               "                           time columns count the collectives only (default 0)\n");
    fprintf(f, "  -h, --help               this text\n");
}

int perfParseArgs(int argc, char **argv, const char *tool, unsigned accepted, perfOptions *o)
{
    static const struct option longopts[] = {
        {"coll", required_argument, NULL, 'C'},       {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'},   {"stepfactor", required_argument, NULL, 'f'},
        {"stepbytes", required_argument, NULL, 'i'},  {"iters", required_argument, NULL, 'n'},
        {"warmup_iters", required_argument, NULL, 'w'}, {"check", required_argument, NULL, 'c'},
        {"datatype", required_argument, NULL, 'd'},   {"op", required_argument, NULL, 'o'},
        {"root", required_argument, NULL, 'r'},       {"timeout", required_argument, NULL, 'T'},
        {"nprocs", required_argument, NULL, 'N'},     {"gap", required_argument, NULL, 'G'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    char optstring[64] = ":b:e:f:i:n:w:c:d:o:T:G:h";
    int c, v, bad = 0;

    if (accepted & PERF_OPT_COLL)
        strcat(optstring, "C:");
    if (accepted & PERF_OPT_ROOT)
        strcat(optstring, "r:");
    if (accepted & PERF_OPT_NPROCS)
        strcat(optstring, "N:");

    memset(o, 0, sizeof(*o));
    o->coll = PERF_ALLREDUCE;
    o->type = PERF_FLOAT;
    o->op = PERF_SUM;
    o->minBytes = 8;
    o->maxBytes = 32u << 20;
    o->stepFactor = 2;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;

    opterr = 0;
    optind = 1;
    while (!bad && (c = getopt_long(argc, argv, optstring, longopts, NULL)) != -1) {
        const char *what = NULL;
        switch (c) {
        case 'C':
            if (parse_name(optarg, coll_names, PERF_NCOLLS, &v) == 0)
                o->coll = (perfColl)v;
            else
                what = "collective";
            break;
        case 'b': if (parse_size(optarg, &o->minBytes)) what = "size"; break;
        case 'e': if (parse_size(optarg, &o->maxBytes)) what = "size"; break;
        case 'i': if (parse_size(optarg, &o->stepBytes)) what = "size"; break;
        case 'f':
            if (parse_int(optarg, 2, 1 << 20, &v) == 0)
                o->stepFactor = (size_t)v;
            else
                what = "step factor (an integer >= 2)";
            break;
        case 'n': if (parse_int(optarg, 1, INT_MAX, &o->iters)) what = "count (>= 1)"; break;
        case 'w': if (parse_int(optarg, 0, INT_MAX, &o->warmup)) what = "count (>= 0)"; break;
        case 'c': if (parse_int(optarg, 0, 1, &o->check)) what = "value (0 or 1)"; break;
        case 'd':
            if (parse_type(optarg, &o->type) != 0)
                what = "datatype";
            break;
        case 'o':
            if (parse_name(optarg, op_names, PERF_NOPS, &v) == 0)
                o->op = (perfOp)v;
            else
                what = "reduction";
            break;
        case 'r': if (parse_int(optarg, 0, INT_MAX, &o->root)) what = "root rank"; break;
        case 'T': if (parse_int(optarg, 0, INT_MAX, &o->timeout)) what = "timeout"; break;
        case 'G': if (parse_int(optarg, 0, 3600000, &o->gapMs)) what = "gap (0..3600000 ms)"; break;
        case 'N': if (parse_int(optarg, 1, 4096, &o->nprocs)) what = "process count (1..4096)"; break;
        case 'h':
            usage(stdout, tool, accepted);
            return 1;
        case ':':
            fprintf(stderr, "%s: option %s needs a value\n", tool, argv[optind - 1]);
            bad = 1;
            break;
        default:
            fprintf(stderr, "%s: unknown option %s\n", tool, argv[optind - 1]);
            bad = 1;
            break;
        }
        if (what) {
            fprintf(stderr, "%s: -%c %s: not a valid %s\n", tool, c, optarg, what);
            bad = 1;
        }
    }
    if (!bad && optind < argc) {
        fprintf(stderr, "%s: unexpected argument %s\n", tool, argv[optind]);
        bad = 1;
    }
    if (!bad && o->minBytes > o->maxBytes) {
        fprintf(stderr, "%s: -b %zu is larger than -e %zu\n", tool, o->minBytes, o->maxBytes);
        bad = 1;
    }
    if (!bad && o->stepBytes == 0 && o->minBytes == 0) {
        fprintf(stderr, "%s: -b 0 needs -i (a size multiplied by -f stays 0)\n", tool);
        bad = 1;
    }
    if (bad) {
        usage(stderr, tool, accepted);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Test data
 */

typedef enum {
    PAT_SPREAD, /* (j + 3r) mod p: differs across ranks and positions */
    PAT_SAME,   /* j mod p on every rank (average: the sum divides by n exactly) */
    PAT_ONEHOT, /* 1 on one rank per position, else 0 (sums of many ranks) */
    PAT_POW2,   /* 2 on m ranks per position, else 1 (products: 2^m) */
} patKind;

typedef struct {
    size_t esize;
    size_t period;          /* element i of any buffer holds tile[i % period] */
    int nranks;
    unsigned char *input;   /* nranks tiles of 2*period elements */
    unsigned char *result;  /* the reduction over ranks, 2*period elements */
} perfData;

/* Bits of v (0 or a positive normal number that the format represents
 * exactly) in a small IEEE-like format with mbits mantissa bits and the
 * given exponent bias, read from float's fields: no rounding is needed. */
static unsigned narrow_bits(double v, int mbits, int bias)
{
    float f = (float)v;
    uint32_t b;

    memcpy(&b, &f, sizeof(b));
    if (b == 0)
        return 0;
    unsigned e = (unsigned)((int)((b >> 23) & 0xff) - 127 + bias);
    return (e << mbits) | ((b & 0x7fffff) >> (23 - mbits));
}

static void encode(perfType t, double v, unsigned char *out)
{
    switch (t) {
    case PERF_INT8: { int8_t x = (int8_t)v; memcpy(out, &x, 1); break; }
    case PERF_UINT8: { uint8_t x = (uint8_t)v; memcpy(out, &x, 1); break; }
    case PERF_INT32: { int32_t x = (int32_t)v; memcpy(out, &x, 4); break; }
    case PERF_UINT32: { uint32_t x = (uint32_t)v; memcpy(out, &x, 4); break; }
    case PERF_INT64: { int64_t x = (int64_t)v; memcpy(out, &x, 8); break; }
    case PERF_UINT64: { uint64_t x = (uint64_t)v; memcpy(out, &x, 8); break; }
    case PERF_FLOAT: { float x = (float)v; memcpy(out, &x, 4); break; }
    case PERF_DOUBLE: memcpy(out, &v, 8); break;
    case PERF_HALF: { uint16_t x = (uint16_t)narrow_bits(v, 10, 15); memcpy(out, &x, 2); break; }
    case PERF_BFLOAT16: { uint16_t x = (uint16_t)narrow_bits(v, 7, 127); memcpy(out, &x, 2); break; }
    case PERF_FP8E4M3: out[0] = (unsigned char)narrow_bits(v, 3, 7); break;
    case PERF_FP8E5M2: out[0] = (unsigned char)narrow_bits(v, 2, 15); break;
    default: break;
    }
}

static double pattern_value(patKind kind, size_t p, int m, int n, int r, size_t j)
{
    switch (kind) {
    case PAT_SPREAD: return (double)((j + 3 * (size_t)r) % p);
    case PAT_SAME: return (double)(j % p);
    case PAT_ONEHOT: return (j + (size_t)r) % (size_t)n == 0 ? 1.0 : 0.0;
    case PAT_POW2: return (j + (size_t)r) % (size_t)n < (size_t)m ? 2.0 : 1.0;
    }
    return 0.0;
}

static int data_init(perfData *d, const perfOptions *o, int nranks)
{
    int reducing = o->coll == PERF_ALLREDUCE || o->coll == PERF_REDUCESCATTER;
    unsigned long long exact = types[o->type].exact;
    unsigned long long k = exact / (unsigned)nranks; /* largest value n ranks may sum */
    patKind kind = PAT_SPREAD;
    size_t p = (size_t)(exact < PERF_VMAX ? exact : PERF_VMAX) + 1;
    int m = 0;

    if (k > PERF_VMAX)
        k = PERF_VMAX;
    if (reducing && o->op == PERF_SUM) {
        if (k >= 1) {
            p = (size_t)k + 1;
        } else {
            kind = PAT_ONEHOT;
            p = (size_t)nranks;
        }
    } else if (reducing && o->op == PERF_AVG) {
        /* With more ranks than the type counts exactly (e.g. fp8) only
         * zeros remain exact. */
        kind = PAT_SAME;
        p = (size_t)k + 1;
    } else if (reducing && o->op == PERF_PROD) {
        kind = PAT_POW2;
        p = (size_t)nranks;
        m = nranks < types[o->type].pow2max ? nranks : types[o->type].pow2max;
    }

    d->esize = types[o->type].size;
    d->nranks = nranks;
    /* A tile of whole periods of at least PERF_TILE_BYTES, so that fill and
     * check move large blocks. */
    size_t rep = (PERF_TILE_BYTES / d->esize + p - 1) / p;
    d->period = p * (rep ? rep : 1);
    size_t tile = 2 * d->period * d->esize;
    d->input = malloc(tile * (size_t)nranks);
    d->result = malloc(tile);
    if (d->input == NULL || d->result == NULL) {
        free(d->input);
        free(d->result);
        return -1;
    }
    for (size_t j = 0; j < 2 * d->period; j++) {
        double acc = 0.0;
        for (int r = 0; r < nranks; r++) {
            double v = pattern_value(kind, p, m, nranks, r, j);
            encode(o->type, v, d->input + (size_t)r * tile + j * d->esize);
            if (r == 0)
                acc = v;
            else if (o->op == PERF_SUM || o->op == PERF_AVG)
                acc += v;
            else if (o->op == PERF_PROD)
                acc *= v;
            else if (o->op == PERF_MAX)
                acc = v > acc ? v : acc;
            else
                acc = v < acc ? v : acc;
        }
        if (o->op == PERF_AVG)
            acc /= nranks; /* exact: every rank holds the same value */
        encode(o->type, acc, d->result + j * d->esize);
    }
    return 0;
}

static void data_free(perfData *d)
{
    free(d->input);
    free(d->result);
}

static const unsigned char *data_input(const perfData *d, int r)
{
    return d->input + (size_t)r * 2 * d->period * d->esize;
}

/* buf[0..count) = elements first..first+count of the stream tile repeats. */
static void data_fill(const perfData *d, const unsigned char *tile, void *buf, size_t count,
                      size_t first)
{
    unsigned char *b = buf;
    const unsigned char *src = tile + (first % d->period) * d->esize;
    while (count > 0) {
        size_t n = count < d->period ? count : d->period;
        memcpy(b, src, n * d->esize);
        b += n * d->esize;
        count -= n;
    }
}

/* Number of elements of buf[0..count) that differ from the stream. */
static size_t data_check(const perfData *d, const unsigned char *tile, const void *buf,
                         size_t count, size_t first)
{
    const unsigned char *b = buf;
    const unsigned char *want = tile + (first % d->period) * d->esize;
    size_t es = d->esize, wrong = 0;
    while (count > 0) {
        size_t n = count < d->period ? count : d->period;
        if (memcmp(b, want, n * es) != 0) {
            for (size_t i = 0; i < n; i++)
                wrong += memcmp(b + i * es, want + i * es, es) != 0;
        }
        b += n * es;
        count -= n;
    }
    return wrong;
}

static size_t guard_damage(const unsigned char *p)
{
    size_t bad = 0;
    for (size_t i = 0; i < PERF_GUARD; i++)
        bad += p[i] != PERF_POISON;
    return bad;
}

/* ------------------------------------------------------------------------
 * Watchdog. A signal handler reaches only static storage: the message is
 * written before alarm() arms it and read only by the handler.
 */
static char watchdog_msg[320];

static void watchdog_fire(int sig)
{
    (void)sig;
    ssize_t w = write(STDERR_FILENO, watchdog_msg, strlen(watchdog_msg));
    (void)w;
    _exit(4);
}

static void watchdog_arm(int seconds, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void watchdog_arm(int seconds, const char *fmt, ...)
{
    va_list ap;
    if (seconds <= 0)
        return;
    alarm(0);
    va_start(ap, fmt);
    vsnprintf(watchdog_msg, sizeof(watchdog_msg), fmt, ap);
    va_end(ap);
    alarm((unsigned)seconds);
}

/* ------------------------------------------------------------------------
 * The measuring loop
 */

/* One size of the sweep. */
typedef struct {
    size_t bytes;      /* reported size: the larger of the send and receive sides */
    size_t count;      /* reported count: bytes / element size */
    size_t callCount;  /* count argument of the NCCL call */
    size_t blockCount; /* elements per rank block (all-gather, reduce-scatter) */
    size_t sendBytes;  /* out-of-place buffers */
    size_t recvBytes;
} perfSize;

typedef struct {
    const perfBackend *be;
    void *ctx;
    const perfOptions *o;
    int rank, nranks;
    perfData data;
    unsigned char *send, *recv; /* maxBytes + PERF_GUARD each */
} perfBench;

static int size_for(const perfBench *b, size_t request, perfSize *s)
{
    size_t es = b->data.esize, n = (size_t)b->nranks;

    memset(s, 0, sizeof(*s));
    switch (b->o->coll) {
    case PERF_ALLREDUCE:
    case PERF_BROADCAST:
        s->callCount = s->count = request / es;
        s->sendBytes = s->recvBytes = s->count * es;
        break;
    case PERF_ALLGATHER:
        s->blockCount = s->callCount = request / (es * n);
        s->count = s->blockCount * n;
        s->sendBytes = s->blockCount * es;
        s->recvBytes = s->count * es;
        break;
    case PERF_REDUCESCATTER:
        s->blockCount = s->callCount = request / (es * n);
        s->count = s->blockCount * n;
        s->sendBytes = s->count * es;
        s->recvBytes = s->blockCount * es;
        break;
    default:
        return -1;
    }
    s->bytes = s->count * es;
    return s->count > 0 ? 0 : -1;
}

static double bus_factor(perfColl c, int n)
{
    switch (c) {
    case PERF_ALLREDUCE: return 2.0 * (n - 1) / n;
    case PERF_ALLGATHER:
    case PERF_REDUCESCATTER: return (double)(n - 1) / n;
    default: return 1.0;
    }
}

/* Fresh inputs and poisoned outputs for one call; *call gets its arguments. */
static void prepare(perfBench *b, const perfSize *s, int inplace, perfCall *call)
{
    const perfOptions *o = b->o;
    const unsigned char *mine = data_input(&b->data, b->rank);
    size_t es = b->data.esize, block = s->blockCount * es;

    memset(call, 0, sizeof(*call));
    call->coll = o->coll;
    call->type = o->type;
    call->op = o->op;
    call->root = o->coll == PERF_BROADCAST ? o->root : 0;
    call->count = s->callCount;
    call->inplace = inplace;
    if (!inplace) {
        memset(b->recv, PERF_POISON, s->recvBytes + PERF_GUARD);
        data_fill(&b->data, mine, b->send, s->sendBytes / es, 0);
        call->sendbuff = b->send;
        call->recvbuff = b->recv;
        return;
    }
    /* In place, every collective works in recv, laid out as NCCL's
     * in-place rules say. */
    memset(b->recv, PERF_POISON, s->bytes + PERF_GUARD);
    call->sendbuff = call->recvbuff = b->recv;
    switch (o->coll) {
    case PERF_ALLREDUCE:
    case PERF_REDUCESCATTER:
        data_fill(&b->data, mine, b->recv, s->count, 0);
        if (o->coll == PERF_REDUCESCATTER)
            call->recvbuff = b->recv + (size_t)b->rank * block;
        break;
    case PERF_BROADCAST:
        if (b->rank == o->root)
            data_fill(&b->data, mine, b->recv, s->count, 0);
        break;
    case PERF_ALLGATHER:
        data_fill(&b->data, mine, b->recv + (size_t)b->rank * block, s->blockCount, 0);
        call->sendbuff = b->recv + (size_t)b->rank * block;
        break;
    default:
        break;
    }
}

/* Wrong elements after one prepared call; *oob gets the damaged guard bytes. */
static size_t verify(perfBench *b, const perfSize *s, int inplace, const perfCall *call,
                     size_t *oob)
{
    const perfData *d = &b->data;
    size_t es = d->esize, wrong = 0;

    switch (b->o->coll) {
    case PERF_ALLREDUCE:
        wrong = data_check(d, d->result, call->recvbuff, s->count, 0);
        break;
    case PERF_BROADCAST:
        wrong = data_check(d, data_input(d, b->o->root), call->recvbuff, s->count, 0);
        break;
    case PERF_ALLGATHER:
        for (int q = 0; q < b->nranks; q++)
            wrong += data_check(d, data_input(d, q), b->recv + (size_t)q * s->blockCount * es,
                                s->blockCount, 0);
        break;
    case PERF_REDUCESCATTER:
        wrong = data_check(d, d->result, call->recvbuff, s->blockCount,
                           (size_t)b->rank * s->blockCount);
        break;
    default:
        break;
    }
    /* The input of an out-of-place call is const: count a changed input
     * element as wrong too. */
    if (!inplace)
        wrong += data_check(d, data_input(d, b->rank), b->send, s->sendBytes / es, 0);
    *oob = guard_damage(b->recv + (inplace ? s->bytes : s->recvBytes));
    return wrong;
}

/* One placement of one size: average time per call on this rank, and the
 * wrong and out-of-bounds counts of one checked call. */
static int measure(perfBench *b, const perfSize *s, int inplace, double *usec, size_t *wrong,
                   size_t *oob, double *wan)
{
    const perfBackend *be = b->be;
    perfCall call;

    prepare(b, s, inplace, &call);
    for (int i = 0; i < b->o->warmup; i++)
        if (be->coll(b->ctx, &call))
            return -1;
    if (be->barrier(b->ctx))
        return -1;
    double wan0 = be->wanBytes ? be->wanBytes(b->ctx) : 0;
    double t0 = perfNow(), busy = 0;
    for (int i = 0; i < b->o->iters; i++) {
        if (b->o->gapMs > 0) {
            struct timespec ts = {b->o->gapMs / 1000, (long)(b->o->gapMs % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
                ;
            t0 = perfNow();
        }
        if (be->coll(b->ctx, &call))
            return -1;
        if (b->o->gapMs > 0)
            busy += perfNow() - t0;
    }
    *usec = (b->o->gapMs > 0 ? busy : perfNow() - t0) * 1e6 / b->o->iters;
    *wan = be->wanBytes ? (be->wanBytes(b->ctx) - wan0) / b->o->iters : 0;

    *wrong = *oob = 0;
    if (b->o->check) {
        prepare(b, s, inplace, &call);
        if (be->coll(b->ctx, &call))
            return -1;
        *wrong = verify(b, s, inplace, &call, oob);
    }
    return 0;
}

/* Appends text centred in width columns to line. */
static void add_centered(char *line, size_t cap, const char *text, int width)
{
    size_t at = strlen(line);
    int len = (int)strlen(text), left = (width - len) / 2;
    snprintf(line + at, cap - at, "%*s%s%*s", left, "", text, width - len - left, "");
}

static void print_header(perfBench *b, const char *launch, const char *ranklist, size_t hostlen)
{
    const perfOptions *o = b->o;

    printf("# %s: %s, %d rank%s, %s\n", b->be->name, perfCollName(o->coll), b->nranks,
           b->nranks == 1 ? "" : "s", launch);
    printf("# minBytes %zu maxBytes %zu step: ", o->minBytes, o->maxBytes);
    if (o->stepBytes)
        printf("%zu(bytes)", o->stepBytes);
    else
        printf("%zu(factor)", o->stepFactor);
    printf(" warmup iters: %d iters: %d validation: %d timeout: %d", o->warmup, o->iters,
           o->check, o->timeout);
    if (o->gapMs > 0)
        printf(" gap: %d ms", o->gapMs);
    printf("\n");
    if (b->be->describe)
        b->be->describe(b->ctx, stdout);
    printf("#\n# Using ranks\n");
    for (int r = 0; r < b->nranks; r++) {
        const char *e = ranklist + (size_t)r * (hostlen + 8);
        int32_t rank, pid;
        memcpy(&rank, e, 4);
        memcpy(&pid, e + 4, 4);
        printf("#  Rank %2d Pid %7d on %s\n", rank, pid, e + 8);
    }
    printf("#\n");
    char line[160];
    snprintf(line, sizeof(line), "#%49s  ", "");
    add_centered(line, sizeof(line), "out-of-place", 35);
    add_centered(line, sizeof(line), "", 2);
    add_centered(line, sizeof(line), "in-place", 35);
    for (size_t n = strlen(line); n > 0 && line[n - 1] == ' '; n--)
        line[n - 1] = '\0';
    printf("%s\n", line);
    printf("#%12s %12s %9s %6s %6s  %10s %8s %8s %6s  %10s %8s %8s %6s%s\n", "size", "count",
           "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
           "#wrong", b->be->wanBytes ? "        wan(B)" : "");
    printf("#%12s %12s %9s %6s %6s  %10s %8s %8s %6s  %10s %8s %8s%s\n", "(B)", "(elements)", "",
           "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
           b->be->wanBytes ? "         /rank" : "");
    fflush(stdout);
}

int perfRun(const perfBackend *be, void *ctx, const perfOptions *o, int rank, int nranks,
            const char *launch)
{
    perfBench b = {.be = be, .ctx = ctx, .o = o, .rank = rank, .nranks = nranks};
    const size_t hostlen = 56;
    unsigned char *ranklist = NULL;
    double bus_sum = 0.0;
    int bus_n = 0, res = 3;
    double wrong_total = 0.0, oob_total = 0.0;

    if (o->coll == PERF_BROADCAST && (o->root < 0 || o->root >= nranks)) {
        if (rank == 0)
            fprintf(stderr, "%s: -r %d: the root must be a rank in 0..%d\n", be->name, o->root,
                    nranks - 1);
        return 2;
    }
    if (o->timeout > 0)
        signal(SIGALRM, watchdog_fire);
    watchdog_arm(o->timeout, "%s: rank %d: no end after %d s while starting (rank list)\n",
                 be->name, rank, o->timeout);

    if (data_init(&b.data, o, nranks) != 0) {
        fprintf(stderr, "%s: rank %d: out of memory for the reference data\n", be->name, rank);
        return 3;
    }
    b.send = malloc(o->maxBytes + PERF_GUARD);
    b.recv = malloc(o->maxBytes + PERF_GUARD);
    ranklist = calloc((size_t)nranks, hostlen + 8);
    if (b.send == NULL || b.recv == NULL || ranklist == NULL) {
        fprintf(stderr, "%s: rank %d: cannot allocate 2 x %zu bytes of buffers\n", be->name,
                rank, o->maxBytes + PERF_GUARD);
        goto out;
    }
    /* Touch every page now, so that no timed call pays for the first touch. */
    memset(b.send, PERF_POISON, o->maxBytes + PERF_GUARD);
    memset(b.recv, PERF_POISON, o->maxBytes + PERF_GUARD);

    {
        char mine[56 + 8] = {0};
        int32_t r32 = rank, pid = (int32_t)getpid();
        memcpy(mine, &r32, 4);
        memcpy(mine + 4, &pid, 4);
        gethostname(mine + 8, hostlen - 1);
        if (be->gatherBytes(ctx, mine, ranklist, sizeof(mine)))
            goto out;
    }
    if (rank == 0)
        print_header(&b, launch, (const char *)ranklist, hostlen);

    size_t prev = 0;
    for (size_t req = o->minBytes; req <= o->maxBytes;) {
        perfSize s;
        /* Sizes too small for one element per rank, or that round to the
         * size just measured, are skipped. */
        if (size_for(&b, req, &s) == 0 && s.bytes != prev) {
            double t[2], w[4], wan[2];
            size_t wrong, oob;
            prev = s.bytes;
            for (int inplace = 0; inplace < 2; inplace++) {
                watchdog_arm(o->timeout,
                             "%s: rank %d: %s of %zu bytes (%s) did not finish within %d s\n",
                             be->name, rank, perfCollName(o->coll), s.bytes,
                             inplace ? "in-place" : "out-of-place", o->timeout);
                if (measure(&b, &s, inplace, &t[inplace], &wrong, &oob, &wan[inplace]))
                    goto out;
                w[inplace] = (double)wrong;
                w[2 + inplace] = (double)oob;
            }
            if (be->reduceDoubles(ctx, t, 2, 1) || be->reduceDoubles(ctx, w, 4, 0) ||
                (be->wanBytes && be->reduceDoubles(ctx, wan, 2, 1)))
                goto out;
            wrong_total += w[0] + w[1];
            oob_total += w[2] + w[3];
            if (rank == 0) {
                int rooted = o->coll == PERF_BROADCAST;
                int reducing = o->coll == PERF_ALLREDUCE || o->coll == PERF_REDUCESCATTER;
                printf(" %12zu %12zu %9s %6s %6d", s.bytes, s.count, perfTypeName(o->type),
                       reducing ? perfOpName(o->op) : "none", rooted ? o->root : -1);
                for (int i = 0; i < 2; i++) {
                    double algbw = (double)s.bytes / (t[i] * 1e-6) / 1e9;
                    double busbw = algbw * bus_factor(o->coll, nranks);
                    char wr[32];
                    if (o->check)
                        snprintf(wr, sizeof(wr), "%.0f", w[i] + w[2 + i]);
                    else
                        snprintf(wr, sizeof(wr), "N/A");
                    printf("  %10.2f %8.2f %8.2f %6s", t[i], algbw, busbw, wr);
                    bus_sum += busbw;
                    bus_n++;
                }
                if (be->wanBytes)
                    printf("  %12.0f", wan[0]);
                printf("\n");
                fflush(stdout);
            }
        }
        if (o->stepBytes) {
            if (req > SIZE_MAX - o->stepBytes)
                break;
            req += o->stepBytes;
        } else {
            if (req > SIZE_MAX / o->stepFactor)
                break;
            req *= o->stepFactor;
        }
    }
    alarm(0);
    if (rank == 0) {
        if (o->check) {
            printf("# Wrong values         : %.0f %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
            printf("# Out of bounds values : %.0f %s\n", oob_total, oob_total ? "FAILED" : "OK");
        } else {
            printf("# Results not checked (-c 0)\n");
        }
        printf("# Avg bus bandwidth    : %g \n#\n", bus_n ? bus_sum / bus_n : 0.0);
        fflush(stdout);
    }
    res = wrong_total + oob_total > 0 ? 1 : 0;
out:
    alarm(0);
    free(ranklist);
    free(b.send);
    free(b.recv);
    data_free(&b.data);
    return res;
}
