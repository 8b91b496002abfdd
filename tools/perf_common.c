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
#include <math.h>
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
               "  -c, --check 0|1          verify every result element (default 1): bit for\n"
               "                           bit, or within the bound of float rounding (gauss\n"
               "                           data) plus the lossy codec's error when one was used\n");
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
    fprintf(f, "      --data KIND          pattern (default): small integers, every result exact,\n"
               "                           checked bit for bit; gauss: normally distributed,\n"
               "                           a stream per rank (gradient-like; what lossless\n"
               "                           compression meets in training)\n"
               "      --check-exact        allow no codec error: with a lossy GEOCCL_COMPRESS the\n"
               "                           results are checked as if it were off\n");
    fprintf(f, "  -h, --help               this text\n");
}

/* Long options without a letter. */
enum { OPT_DATA = 256, OPT_CHECK_EXACT };

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
        {"data", required_argument, NULL, OPT_DATA},
        {"check-exact", no_argument, NULL, OPT_CHECK_EXACT},
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
        case OPT_DATA:
            if (strcmp(optarg, "pattern") == 0)
                o->data = PERF_DATA_PATTERN;
            else if (strcmp(optarg, "gauss") == 0)
                o->data = PERF_DATA_GAUSS;
            else {
                fprintf(stderr, "%s: --data %s: not pattern or gauss\n", tool, optarg);
                bad = 1;
            }
            break;
        case OPT_CHECK_EXACT: o->checkExact = 1; break;
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
    if (!bad && o->data == PERF_DATA_GAUSS && o->type != PERF_FLOAT && o->type != PERF_DOUBLE &&
        (o->op == PERF_PROD || o->op == PERF_AVG) &&
        (o->coll == PERF_ALLREDUCE || o->coll == PERF_REDUCESCATTER)) {
        fprintf(stderr, "%s: --data gauss with -o %s needs -d float or double\n", tool,
                perfOpName(o->op));
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
    int nranks, rank;
    int allInputs;          /* input holds every rank's tile, else this rank's only */
    int tolerant;           /* float/double reduction of gauss data: no bitwise reference */
    unsigned char *input;   /* tiles of 2*period elements */
    unsigned char *result;  /* the reduction over ranks, 2*period elements */
    /* Float and double reductions that may round (gauss data) or that a
     * lossy codec may change (float sum/avg all-reduce): per element of
     * the period, in binary64.  NULL when unused. */
    double *ref;            /* the reduction (the sum, for avg) */
    double *mag;            /* sum of |x| over the ranks (sum, avg); |ref| (prod) */
    double *regmag;         /* nregions x period: sum of |x| over each region */
    double *rbound;         /* rounding-only bound per element */
    double *cbound;         /* bound with the codec in cboundFor */
    perfCodecBound cboundFor;
    int nregions;
    int *regionSize;        /* nregions */
    const int *regionOf;    /* nranks */
    int op;
} perfData;

/* Bits of v (0 or a normal number that the format represents exactly) in a
 * small IEEE-like format of width bits with mbits mantissa bits and the
 * given exponent bias, read from float's fields: no rounding is needed. */
static unsigned narrow_bits(double v, int width, int mbits, int bias)
{
    float f = fabsf((float)v);
    uint32_t b;

    memcpy(&b, &f, sizeof(b));
    if (b == 0)
        return 0; /* -0 too */
    unsigned e = (unsigned)((int)((b >> 23) & 0xff) - 127 + bias);
    unsigned sign = v < 0 ? 1u << (width - 1) : 0;
    return sign | (e << mbits) | ((b & 0x7fffff) >> (23 - mbits));
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
    case PERF_HALF: { uint16_t x = (uint16_t)narrow_bits(v, 16, 10, 15); memcpy(out, &x, 2); break; }
    case PERF_BFLOAT16: { uint16_t x = (uint16_t)narrow_bits(v, 16, 7, 127); memcpy(out, &x, 2); break; }
    case PERF_FP8E4M3: out[0] = (unsigned char)narrow_bits(v, 8, 3, 7); break;
    case PERF_FP8E5M2: out[0] = (unsigned char)narrow_bits(v, 8, 2, 15); break;
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

/* --data gauss repeats every PERF_GAUSS_PERIOD elements: 4 MiB of floats,
 * longer than any chunk the library compresses at once (a slice's part)
 * and than zstd's window at the levels GEOCCL uses, so that the repeat
 * gives lossless compression nothing to find. */
#define PERF_GAUSS_PERIOD ((size_t)1 << 20)

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Element j of rank r's stream: N(0, 1) by Box-Muller from two counter-based
 * uniforms, so any rank computes any other rank's values (the reference)
 * without communication, and every run has the same data. */
static double gauss_value(int r, size_t j)
{
    uint64_t key = mix64(0x67656F63636C0000ull ^ (uint64_t)(unsigned)r);
    uint64_t a = mix64(key + (2 * (uint64_t)j + 1) * 0x9E3779B97F4A7C15ull);
    uint64_t b = mix64(key + (2 * (uint64_t)j + 2) * 0x9E3779B97F4A7C15ull);
    double u1 = (double)((a >> 11) + 1) * 0x1p-53; /* (0, 1] */
    double u2 = (double)(b >> 11) * 0x1p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* gauss data in the datatypes that do not round (integers) or whose
 * reductions the check reads bit for bit (half, bfloat16, fp8): the normal
 * value scaled so that |value| <= lim (4 standard deviations) and rounded to
 * an integer, so that every partial sum of the ranks is exact; |value| for
 * unsigned types.  lim 0 (more ranks than the type counts exactly): the
 * value's sign on one rank per position, 0 on the others. */
static double gauss_int(perfType t, double g, unsigned long long lim, int n, int r, size_t j)
{
    int uns = t == PERF_UINT8 || t == PERF_UINT32 || t == PERF_UINT64;
    double v;
    if (lim == 0) {
        v = (j + (size_t)r) % (size_t)n == 0 ? (g < 0 ? -1.0 : 1.0) : 0.0;
    } else {
        v = nearbyint(g * (double)lim / 4.0);
        if (v > (double)lim)
            v = (double)lim;
        if (v < -(double)lim)
            v = -(double)lim;
    }
    /* + 0.0: no -0, whose sums with +0 the reference would get wrong */
    return (uns ? fabs(v) : v) + 0.0;
}

/* The value rank r holds at element j, as stored in the datatype. */
static double data_value(const perfOptions *o, patKind kind, size_t p, int m, int n,
                         unsigned long long lim, int r, size_t j)
{
    if (o->data != PERF_DATA_GAUSS)
        return pattern_value(kind, p, m, n, r, j);
    double g = gauss_value(r, j);
    if (o->type == PERF_FLOAT)
        return (double)(float)g;
    if (o->type == PERF_DOUBLE)
        return g;
    return gauss_int(o->type, g, lim, n, r, j);
}

static double gamma_n(int n, double u)
{
    return n <= 0 ? 0.0 : n * u / (1.0 - n * u);
}

/* regionOf: nranks region numbers (0..nregions-1); kept, not copied. */
static int data_init(perfData *d, const perfOptions *o, int nranks, int rank, const int *regionOf,
                     int nregions)
{
    int reducing = o->coll == PERF_ALLREDUCE || o->coll == PERF_REDUCESCATTER;
    int gauss = o->data == PERF_DATA_GAUSS;
    int fp = o->type == PERF_FLOAT || o->type == PERF_DOUBLE;
    unsigned long long exact = types[o->type].exact;
    unsigned long long k = exact / (unsigned)nranks; /* largest value n ranks may sum */
    patKind kind = PAT_SPREAD;
    size_t p = (size_t)(exact < PERF_VMAX ? exact : PERF_VMAX) + 1;
    int m = 0;

    memset(d, 0, sizeof(*d));
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
    d->rank = rank;
    d->op = o->op;
    d->regionOf = regionOf;
    d->nregions = nregions;
    if (gauss) {
        d->period = PERF_GAUSS_PERIOD;
    } else {
        /* A tile of whole periods of at least PERF_TILE_BYTES, so that
         * fill and check move large blocks. */
        size_t rep = (PERF_TILE_BYTES / d->esize + p - 1) / p;
        d->period = p * (rep ? rep : 1);
    }
    /* gauss data is large: other ranks' inputs are kept only where the
     * check reads them (broadcast, all-gather). */
    d->allInputs = !gauss || !reducing;
    d->tolerant = gauss && fp && reducing && o->op != PERF_MAX && o->op != PERF_MIN;
    /* The binary64 reference: where gauss data rounds, and for the float
     * sum/avg all-reduce that a lossy codec may change. */
    int codecable = o->type == PERF_FLOAT && o->coll == PERF_ALLREDUCE &&
                    (o->op == PERF_SUM || o->op == PERF_AVG);
    int wantRef = d->tolerant || codecable;
    size_t P = d->period, tile = 2 * P * d->esize;
    d->input = malloc(tile * (d->allInputs ? (size_t)nranks : 1));
    d->result = malloc(tile);
    d->regionSize = calloc((size_t)nregions, sizeof(int));
    int ok = d->input && d->result && d->regionSize;
    if (ok && wantRef) {
        d->ref = calloc(P, sizeof(double));
        d->mag = calloc(P, sizeof(double));
        ok = d->ref && d->mag;
        if (ok && codecable && nregions > 1)
            ok = (d->regmag = calloc(P * (size_t)nregions, sizeof(double))) != NULL;
    }
    if (!ok)
        return -1;
    for (int r = 0; r < nranks; r++)
        d->regionSize[regionOf[r]]++;
    for (size_t j = 0; j < P; j++) {
        double acc = 0.0, absacc = 0.0;
        for (int r = 0; r < nranks; r++) {
            double v = data_value(o, kind, p, m, nranks, k, r, j);
            if (d->allInputs || r == rank)
                encode(o->type, v, d->input + (d->allInputs ? (size_t)r : 0) * tile +
                                       j * d->esize);
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
            absacc += fabs(v);
            if (d->regmag)
                d->regmag[(size_t)regionOf[r] * P + j] += fabs(v);
        }
        if (d->ref) {
            d->ref[j] = acc;
            d->mag[j] = o->op == PERF_PROD ? fabs(acc) : absacc;
        }
        if (o->op == PERF_AVG)
            acc /= nranks; /* exact for pattern data: every rank holds the same value */
        encode(o->type, acc, d->result + j * d->esize);
    }
    /* The streams repeat with the period: the second copy makes any start
     * offset one contiguous run. */
    for (int r = 0; r < (d->allInputs ? nranks : 1); r++)
        memcpy(d->input + (size_t)r * tile + P * d->esize, d->input + (size_t)r * tile,
               P * d->esize);
    memcpy(d->result + P * d->esize, d->result, P * d->esize);
    if (d->tolerant) {
        /* Float rounding alone: the library's N - 1 additions (or
         * multiplications) in whatever order, each rounding by at most u
         * relative, are off by at most gamma(N-1) sum |x| (Higham, Accuracy
         * and Stability of Numerical Algorithms, 4.2; any summation tree);
         * avg's division adds one rounding (gamma(N) then); the binary64
         * reference itself may be off by gamma(N) in 2^-53.  The absolute
         * term covers results below the normal range. */
        double u = o->type == PERF_FLOAT ? 0x1p-24 : 0x1p-53;
        double tiny = o->type == PERF_FLOAT ? 0x1p-126 : 0x1p-1022;
        double div = o->op == PERF_AVG ? nranks : 1;
        double g = gamma_n(o->op == PERF_AVG ? nranks : nranks - 1, u) + gamma_n(nranks, 0x1p-53);
        if ((d->rbound = malloc(P * sizeof(double))) == NULL)
            return -1;
        for (size_t j = 0; j < P; j++)
            d->rbound[j] = g * d->mag[j] / div + tiny;
    }
    return 0;
}

static void data_free(perfData *d)
{
    free(d->input);
    free(d->result);
    free(d->ref);
    free(d->mag);
    free(d->regmag);
    free(d->rbound);
    free(d->cbound);
    free(d->regionSize);
}

static const unsigned char *data_input(const perfData *d, int r)
{
    return d->input + (d->allInputs ? (size_t)r : 0) * 2 * d->period * d->esize;
}

/* w[j] >= the largest a[i] with |i - j| < B on the periodic sequence a of
 * period P: the maximum of the three aligned blocks of Bw >= B elements
 * around j (they cover j - B + 1 .. j + B - 1), when Bw divides P; else the
 * maximum over the whole period. */
static int window_max(const double *a, size_t P, size_t B, double *w)
{
    size_t Bw = 1;
    while (Bw < B)
        Bw <<= 1;
    if (B <= 1) {
        memcpy(w, a, P * sizeof(double));
        return 0;
    }
    if (P % Bw != 0 || P / Bw < 3) {
        double mx = 0;
        for (size_t j = 0; j < P; j++)
            mx = a[j] > mx ? a[j] : mx;
        for (size_t j = 0; j < P; j++)
            w[j] = mx;
        return 0;
    }
    size_t nb = P / Bw;
    double *bm = malloc(nb * sizeof(double));
    if (bm == NULL)
        return -1;
    for (size_t b = 0; b < nb; b++) {
        double mx = 0;
        for (size_t j = b * Bw; j < (b + 1) * Bw; j++)
            mx = a[j] > mx ? a[j] : mx;
        bm[b] = mx;
    }
    for (size_t j = 0; j < P; j++) {
        size_t b = j / Bw;
        double mx = bm[b], l = bm[(b + nb - 1) % nb], r = bm[(b + 1) % nb];
        mx = l > mx ? l : mx;
        w[j] = r > mx ? r : mx;
    }
    free(bm);
    return 0;
}

/* One round trip's error bound for values of magnitude at most v, with w the
 * largest magnitude around them (perfCodecBound). */
static double trip_bound(const perfCodecBound *c, double v, double w)
{
    double e = c->rel * v + c->block * w + c->abs;
    if (c->sat > 0 && v > c->sat)
        e += v - c->sat;
    return e;
}

/*
 * The bound the check allows for a float sum/avg all-reduce whose partials
 * crossed between regions through codec c (the hierarchical algorithm,
 * comm/coll_hier.c), per element of the period, into d->cbound.
 *
 * What the library computes, per element: P_q = the float sum of region
 * q's inputs; the owner region o of the element receives decode(encode(P_q))
 * from every other region q (first trip), sums them with its own exact P_o
 * (S; for avg S / N), and sends decode(encode(S)) back (second trip), which
 * every rank, the owner too, keeps.  The tool resets the error-feedback
 * residuals before the checked call (checkBegin), so each encode sees v = P_q
 * or S itself and its error is one round trip's: rel |v| + block W + abs
 * (+ saturation), W the largest |value| within B - 1 elements.
 *
 * With A_q = sum of |x| over region q, A = sum over q, T the exact sum:
 *   |P_q| <= (1 + gamma(n_q - 1)) A_q, so the first trip's error is at most
 *     E1_q = trip((1 + gamma) A_q, (1 + gamma) W(A_q));
 *   the owner's own partial is not coded, and the owner is not known here:
 *     all regions but the one with the smallest E1_q may be coded;
 *   every rounding (the region sums, the k - 1 additions of the owner, the
 *     division for avg) is at most gamma(N + 2) of the magnitudes involved,
 *     which are at most A + sum E1_q:
 *   |S - T| <= ES = gamma(N + 2) (A + sum E1) + (sum E1 - min E1);
 *   the second trip codes values of magnitude at most V = (|T| + ES) / div
 *     (div = N for avg, else 1): E2 = trip(V, W(V));
 *   bound = ES / div + E2, plus the binary64 reference's own rounding.
 */
static int codec_bound(perfData *d, const perfCodecBound *c)
{
    if (d->cbound && memcmp(&d->cboundFor, c, sizeof(*c)) == 0)
        return 0;
    size_t P = d->period, B = c->block > 0 ? c->blockSize : 1;
    const double u = 0x1p-24;
    int N = d->nranks, K = d->regmag ? d->nregions : 1;
    double div = d->op == PERF_AVG ? N : 1;
    double *e1sum = calloc(P, sizeof(double)), *e1min = malloc(P * sizeof(double));
    double *w = malloc(P * sizeof(double)), *v = malloc(P * sizeof(double));
    double *out = d->cbound ? d->cbound : malloc(P * sizeof(double));
    int res = -1;
    if (!e1sum || !e1min || !w || !v || !out)
        goto done;
    for (size_t j = 0; j < P; j++)
        e1min[j] = INFINITY;
    for (int q = 0; q < K; q++) {
        const double *aq = d->regmag ? d->regmag + (size_t)q * P : d->mag;
        double g = 1.0 + gamma_n((d->regmag ? d->regionSize[q] : N) - 1, u);
        if (window_max(aq, P, B, w) != 0)
            goto done;
        for (size_t j = 0; j < P; j++) {
            double e = trip_bound(c, g * aq[j], g * w[j]);
            e1sum[j] += e;
            e1min[j] = e < e1min[j] ? e : e1min[j];
        }
    }
    double g = gamma_n(N + 2, u), gref = gamma_n(N, 0x1p-53);
    for (size_t j = 0; j < P; j++) {
        /* one region: nothing crosses, only the second trip's coding is
         * left (which the library skips then; the bound stays sound) */
        double es = g * (d->mag[j] + e1sum[j]) + (K > 1 ? e1sum[j] - e1min[j] : 0.0);
        e1sum[j] = es; /* keep ES */
        v[j] = (fabs(d->ref[j]) + es) / div;
    }
    if (window_max(v, P, B, w) != 0)
        goto done;
    for (size_t j = 0; j < P; j++)
        out[j] = e1sum[j] / div + trip_bound(c, v[j], w[j]) + gref * d->mag[j] / div + 0x1p-126;
    d->cbound = out;
    d->cboundFor = *c;
    out = NULL;
    res = 0;
done:
    if (out != d->cbound)
        free(out);
    free(e1sum);
    free(e1min);
    free(w);
    free(v);
    return res;
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

/* What a check within a bound saw (the worst over the elements checked). */
typedef struct {
    int used;        /* a bound was checked (else every check was bit for bit) */
    int codec;       /* the bound included a codec's error */
    char name[48];   /* the codec */
    double maxErr;   /* largest |result - reference| */
    double maxRef;   /* largest |reference| */
    double worst;    /* largest |result - reference| / bound */
    double maxBound; /* largest bound */
} perfErr;

/* Number of elements of buf[0..count) (float or double) farther from the
 * reference ref / div than bound (arrays over the period, read from element
 * first on); a NaN is always wrong. */
static size_t tol_check(const perfData *d, const void *buf, size_t count, size_t first,
                        double div, const double *bound, perfErr *e)
{
    size_t wrong = 0, P = d->period;
    for (size_t i = 0; i < count; i++) {
        size_t j = (first + i) % P;
        double y;
        if (d->esize == 4) {
            float f;
            memcpy(&f, (const char *)buf + i * 4, 4);
            y = f;
        } else {
            memcpy(&y, (const char *)buf + i * 8, 8);
        }
        double want = d->ref[j] / div, err = fabs(y - want), b = bound[j];
        if (!(err <= b)) {
            wrong++;
            if (err != err)
                err = INFINITY;
        }
        if (err > e->maxErr)
            e->maxErr = err;
        if (fabs(want) > e->maxRef)
            e->maxRef = fabs(want);
        if (b > e->maxBound)
            e->maxBound = b;
        double ratio = b > 0 ? err / b : err > 0 ? INFINITY : 0.0;
        if (ratio > e->worst)
            e->worst = ratio;
    }
    e->used = 1;
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

/* Wrong elements after one prepared call; *oob gets the damaged guard bytes.
 * codec: the lossy codec the call went through, or NULL; *e: what a check
 * within a bound saw.  Returns (size_t)-1 when memory for the bound ran out. */
static size_t verify(perfBench *b, const perfSize *s, int inplace, const perfCall *call,
                     size_t *oob, const perfCodecBound *codec, perfErr *e)
{
    perfData *d = &b->data;
    size_t es = d->esize, wrong = 0;
    double div = b->o->op == PERF_AVG ? d->nranks : 1;

    if (codec && d->ref == NULL)
        codec = NULL; /* not a float sum/avg all-reduce: the library sends it exactly */
    switch (b->o->coll) {
    case PERF_ALLREDUCE:
        if (codec) {
            if (codec_bound(d, codec) != 0)
                return (size_t)-1;
            wrong = tol_check(d, call->recvbuff, s->count, 0, div, d->cbound, e);
            e->codec = 1;
            snprintf(e->name, sizeof(e->name), "%s", codec->name);
        } else if (d->tolerant) {
            wrong = tol_check(d, call->recvbuff, s->count, 0, div, d->rbound, e);
        } else {
            wrong = data_check(d, d->result, call->recvbuff, s->count, 0);
        }
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
        if (d->tolerant)
            wrong = tol_check(d, call->recvbuff, s->blockCount, (size_t)b->rank * s->blockCount,
                              div, d->rbound, e);
        else
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
                   size_t *oob, double *wan, perfErr *e)
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
        perfCodecBound codec;
        int lossy = 0;
        prepare(b, s, inplace, &call);
        if (be->checkBegin && be->checkBegin(b->ctx))
            return -1;
        if (be->coll(b->ctx, &call))
            return -1;
        memset(&codec, 0, sizeof(codec));
        if (be->checkCodec && (lossy = be->checkCodec(b->ctx, &call, &codec)) < 0)
            return -1;
        /* --check-exact: the codec's error counts as wrong */
        *wrong = verify(b, s, inplace, &call, oob, lossy && !b->o->checkExact ? &codec : NULL, e);
        if (*wrong == (size_t)-1) {
            fprintf(stderr, "%s: rank %d: out of memory for the error bound\n", be->name,
                    b->rank);
            return -1;
        }
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
    printf(" warmup iters: %d iters: %d validation: %d%s timeout: %d data: %s", o->warmup,
           o->iters, o->check, o->checkExact ? " (exact)" : "", o->timeout,
           o->data == PERF_DATA_GAUSS ? "gauss" : "pattern");
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
    int32_t *regions = NULL;
    int *regionOf = NULL;
    int codecBound = 0;           /* a lossy codec's bound was used */
    int roundBound = 0;           /* a rounding-only bound was used */
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
    {
        /* Every rank's region, for the bound of a codec between regions. */
        int32_t mine = 0;
        int myregion = 0, nreg = 1;
        if (be->region && be->region(ctx, &myregion, &nreg))
            goto out;
        mine = myregion;
        regions = calloc((size_t)nranks, sizeof(int32_t));
        regionOf = calloc((size_t)nranks, sizeof(int));
        if (regions == NULL || regionOf == NULL) {
            fprintf(stderr, "%s: rank %d: out of memory\n", be->name, rank);
            goto out;
        }
        if (be->gatherBytes(ctx, &mine, regions, sizeof(mine)))
            goto out;
        for (int r = 0; r < nranks; r++) {
            if (regions[r] < 0 || regions[r] >= nreg) {
                fprintf(stderr, "%s: rank %d: rank %d says it is in region %d of %d\n",
                        be->name, rank, r, (int)regions[r], nreg);
                goto out;
            }
            regionOf[r] = regions[r];
        }
        if (data_init(&b.data, o, nranks, rank, regionOf, nreg) != 0) {
            fprintf(stderr, "%s: rank %d: out of memory for the reference data\n", be->name,
                    rank);
            goto out;
        }
    }
    if (rank == 0)
        print_header(&b, launch, (const char *)ranklist, hostlen);

    size_t prev = 0;
    for (size_t req = o->minBytes; req <= o->maxBytes;) {
        perfSize s;
        /* Sizes too small for one element per rank, or that round to the
         * size just measured, are skipped. */
        if (size_for(&b, req, &s) == 0 && s.bytes != prev) {
            double t[2], w[4], wan[2], ev[6];
            size_t wrong, oob;
            perfErr err;
            memset(&err, 0, sizeof(err));
            prev = s.bytes;
            for (int inplace = 0; inplace < 2; inplace++) {
                watchdog_arm(o->timeout,
                             "%s: rank %d: %s of %zu bytes (%s) did not finish within %d s\n",
                             be->name, rank, perfCollName(o->coll), s.bytes,
                             inplace ? "in-place" : "out-of-place", o->timeout);
                if (measure(&b, &s, inplace, &t[inplace], &wrong, &oob, &wan[inplace], &err))
                    goto out;
                w[inplace] = (double)wrong;
                w[2 + inplace] = (double)oob;
            }
            ev[0] = err.used;
            ev[1] = err.codec;
            ev[2] = err.maxErr;
            ev[3] = err.maxRef;
            ev[4] = err.worst;
            ev[5] = err.maxBound;
            if (be->reduceDoubles(ctx, t, 2, 1) || be->reduceDoubles(ctx, w, 4, 0) ||
                (be->wanBytes && be->reduceDoubles(ctx, wan, 2, 1)) ||
                (o->check && be->reduceDoubles(ctx, ev, 6, 1)))
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
                /* The worst of both placements over all ranks; rel is
                 * max |err| / max |result| (normwise). */
                if (o->check && ev[0] > 0) {
                    const char *what = ev[1] > 0 ? (err.codec ? err.name : "codec")
                                                 : "float rounding";
                    printf("#%12zu   %s bound: max abs err %.3g  max rel err %.3g  "
                           "bound %.3g  worst err/bound %.3f\n",
                           s.bytes, what, ev[2], ev[3] > 0 ? ev[2] / ev[3] : 0.0, ev[5], ev[4]);
                    if (ev[1] > 0)
                        codecBound = 1;
                    else
                        roundBound = 1;
                }
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
            printf("# Wrong values         : %.0f %s%s%s\n", wrong_total,
                   wrong_total ? "FAILED" : "OK",
                   codecBound ? " (results within the lossy codec's error bound count as right)"
                   : roundBound ? " (results within the float rounding bound count as right)"
                                : "",
                   o->checkExact ? " (--check-exact: no codec error allowed)" : "");
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
    free(regions);
    free(regionOf);
    free(b.send);
    free(b.recv);
    data_free(&b.data);
    return res;
}
