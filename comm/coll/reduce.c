#include "config.h"
#include "comm/coll/reduce.h"

#include <math.h>
#include <string.h>

size_t geoTypeSize(ncclDataType_t dt)
{
    switch (dt) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

int geoTypeIsFloat(ncclDataType_t dt)
{
    return dt == ncclFloat16 || dt == ncclBfloat16 || dt == ncclFloat32 || dt == ncclFloat64 ||
           dt == ncclFloat8e4m3 || dt == ncclFloat8e5m2;
}

const char *geoTypeName(ncclDataType_t dt)
{
    static const char *names[] = {"int8",   "uint8",  "int32",  "uint32", "int64",    "uint64",
                                  "half",   "float",  "double", "bf16",   "f8e4m3", "f8e5m2"};
    return (dt >= 0 && dt < ncclNumTypes) ? names[dt] : "?";
}

const char *geoOpName(ncclRedOp_t op)
{
    static const char *names[] = {"sum", "prod", "max", "min", "avg"};
    return (op >= 0 && op < ncclNumOps) ? names[op] : "premulsum";
}

/* ---- narrow floating types ---------------------------------------- */

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float geoBf16ToFloat(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t geoFloatToBf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* A binary floating format with ebits exponent and mbits mantissa bits. */
typedef struct {
    int ebits, mbits, bias;
    int ieee_inf;          /* all-ones exponent is inf/NaN (half, e5m2) */
    uint32_t max_code;     /* largest finite magnitude code */
    uint32_t nan_code;
} geoMiniFmt;

#ifndef __FLT16_MAX__
static const geoMiniFmt fmt_half = {5, 10, 15, 1, 0x7bff, 0x7e00};
#endif
static const geoMiniFmt fmt_e4m3 = {4, 3, 7, 0, 0x7e, 0x7f};
static const geoMiniFmt fmt_e5m2 = {5, 2, 15, 1, 0x7b, 0x7e};

static float mini_to_float(const geoMiniFmt *f, uint32_t v)
{
    int sign = (v >> (f->ebits + f->mbits)) & 1;
    uint32_t e = (v >> f->mbits) & ((1u << f->ebits) - 1);
    uint32_t m = v & ((1u << f->mbits) - 1);
    float r;
    if (f->ieee_inf && e == (1u << f->ebits) - 1)
        r = m ? NAN : INFINITY;
    else if (!f->ieee_inf && e == (1u << f->ebits) - 1 && m == (1u << f->mbits) - 1)
        r = NAN;
    else if (e == 0)
        r = ldexpf((float)m, 1 - f->bias - f->mbits);
    else
        r = ldexpf((float)(m | (1u << f->mbits)), (int)e - f->bias - f->mbits);
    return sign ? -r : r;
}

static uint32_t float_to_mini(const geoMiniFmt *f, float x, int saturate)
{
    uint32_t sign = signbit(x) ? 1u << (f->ebits + f->mbits) : 0;
    float a = fabsf(x);
    int e;
    if (isnan(x))
        return f->nan_code;
    if (isinf(a) && !saturate)
        return sign | (((1u << f->ebits) - 1) << f->mbits);
    if (a == 0.0f)
        return sign;
    frexpf(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    int emin = 1 - f->bias;
    int qexp = (e < emin ? emin : e) - f->mbits;
    float q = nearbyintf(ldexpf(a, -qexp)); /* round to nearest even */
    if (q >= (float)(2u << f->mbits)) {       /* rounded up into the next binade */
        q = ldexpf(q, -1);
        qexp++;
    }
    uint32_t code;
    if (q < (float)(1u << f->mbits))
        code = (uint32_t)q; /* subnormal (qexp == emin - mbits) */
    else
        code = ((uint32_t)(qexp + f->mbits + f->bias) << f->mbits) |
               ((uint32_t)q - (1u << f->mbits));
    if (code > f->max_code) {
        if (saturate || !f->ieee_inf)
            code = f->max_code;
        else
            code = ((1u << f->ebits) - 1) << f->mbits;
    }
    return sign | code;
}

float geoHalfToFloat(uint16_t h)
{
#ifdef __FLT16_MAX__
    _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
#else
    return mini_to_float(&fmt_half, h);
#endif
}

uint16_t geoFloatToHalf(float f)
{
#ifdef __FLT16_MAX__
    _Float16 v = (_Float16)f;
    uint16_t h;
    memcpy(&h, &v, 2);
    return h;
#else
    return (uint16_t)float_to_mini(&fmt_half, f, 0);
#endif
}

static float e4m3_table[256], e5m2_table[256];
static int fp8_tables_ready;

static void fp8_tables(void)
{
    if (__atomic_load_n(&fp8_tables_ready, __ATOMIC_ACQUIRE))
        return;
    for (int i = 0; i < 256; i++) {
        e4m3_table[i] = mini_to_float(&fmt_e4m3, (uint32_t)i);
        e5m2_table[i] = mini_to_float(&fmt_e5m2, (uint32_t)i);
    }
    __atomic_store_n(&fp8_tables_ready, 1, __ATOMIC_RELEASE);
}

float geoFp8e4m3ToFloat(uint8_t v) { fp8_tables(); return e4m3_table[v]; }
float geoFp8e5m2ToFloat(uint8_t v) { fp8_tables(); return e5m2_table[v]; }
uint8_t geoFloatToFp8e4m3(float f) { return (uint8_t)float_to_mini(&fmt_e4m3, f, 1); }
uint8_t geoFloatToFp8e5m2(float f) { return (uint8_t)float_to_mini(&fmt_e5m2, f, 1); }

/* ---- reductions ---------------------------------------------------- */

#define OP_SUM(x, y) ((x) + (y))
#define OP_PROD(x, y) ((x) * (y))
#define OP_MAX(x, y) ((x) > (y) ? (x) : (y))
#define OP_MIN(x, y) ((x) < (y) ? (x) : (y))

/* Sums and products four 16-byte vectors at a time (GCC/Clang vector
 * extensions; plain SSE2 on x86-64, NEON on arm64).  At -O2 GCC 12 leaves the
 * scalar loops below scalar (one addss per element).  Where the operands come
 * from memory, as in a ring step on a large buffer, the loop waits on its
 * loads either way (the 2 x 4 benchmark spent the same share of the machine
 * in it); on data in cache it does a quarter of the instructions.  Each
 * vector is loaded before its result is stored, so dst may be a or b (the
 * in-place calls); lane i is the same IEEE operation as the scalar loop's,
 * so the bits are the same.  Loads and stores go through memcpy: no
 * alignment is assumed. */
#define VEC_BYTES 16
#define DEFINE_VEC_LOOP(NAME, T, OPER)                                                 \
    static size_t NAME(T *d, const T *a, const T *b, size_t n)                         \
    {                                                                                  \
        typedef T V __attribute__((vector_size(VEC_BYTES)));                           \
        enum { L = VEC_BYTES / sizeof(T), U = 4 * L };                                 \
        size_t i = 0;                                                                  \
        for (; i + U <= n; i += U) {                                                   \
            V x[4], y[4];                                                              \
            memcpy(x, a + i, sizeof(x));                                               \
            memcpy(y, b + i, sizeof(y));                                               \
            for (int j = 0; j < 4; j++)                                                \
                x[j] = x[j] OPER y[j];                                                 \
            memcpy(d + i, x, sizeof(x));                                               \
        }                                                                              \
        return i;                                                                      \
    }

#define DEFINE_NATIVE(NAME, T)                                                         \
    DEFINE_VEC_LOOP(NAME##_vsum, T, +)                                                 \
    DEFINE_VEC_LOOP(NAME##_vprod, T, *)                                                \
    static void NAME(T *d, const T *a, const T *b, size_t n, ncclRedOp_t op)           \
    {                                                                                  \
        size_t i = 0;                                                                  \
        switch (op) {                                                                  \
        case ncclProd:                                                                 \
            for (i = NAME##_vprod(d, a, b, n); i < n; i++) d[i] = (T)OP_PROD(a[i], b[i]); \
            break;                                                                     \
        case ncclMax: for (; i < n; i++) d[i] = OP_MAX(a[i], b[i]); break;              \
        case ncclMin: for (; i < n; i++) d[i] = OP_MIN(a[i], b[i]); break;              \
        default:                                                                       \
            for (i = NAME##_vsum(d, a, b, n); i < n; i++) d[i] = (T)OP_SUM(a[i], b[i]); \
            break;                                                                     \
        }                                                                              \
    }

/* Integer sums wrap like NCCL's (two's complement), done in unsigned. */
#define DEFINE_INT(NAME, T, U)                                                         \
    DEFINE_VEC_LOOP(NAME##_vsum, U, +)                                                 \
    static void NAME(T *d, const T *a, const T *b, size_t n, ncclRedOp_t op)           \
    {                                                                                  \
        size_t i = 0;                                                                  \
        switch (op) {                                                                  \
        case ncclProd:                                                                 \
            for (; i < n; i++) d[i] = (T)((U)a[i] * (U)b[i]);                          \
            break;                                                                     \
        case ncclMax: for (; i < n; i++) d[i] = OP_MAX(a[i], b[i]); break;              \
        case ncclMin: for (; i < n; i++) d[i] = OP_MIN(a[i], b[i]); break;              \
        default:                                                                       \
            i = NAME##_vsum((U *)d, (const U *)a, (const U *)b, n);                    \
            for (; i < n; i++) d[i] = (T)((U)a[i] + (U)b[i]);                          \
            break;                                                                     \
        }                                                                              \
    }

DEFINE_INT(red_i8, int8_t, uint8_t)
DEFINE_INT(red_u8, uint8_t, uint8_t)
DEFINE_INT(red_i32, int32_t, uint32_t)
DEFINE_INT(red_u32, uint32_t, uint32_t)
DEFINE_INT(red_i64, int64_t, uint64_t)
DEFINE_INT(red_u64, uint64_t, uint64_t)
DEFINE_NATIVE(red_f32, float)
DEFINE_NATIVE(red_f64, double)

static inline float combine(float x, float y, ncclRedOp_t op)
{
    switch (op) {
    case ncclProd: return x * y;
    case ncclMax: return OP_MAX(x, y);
    case ncclMin: return OP_MIN(x, y);
    default: return x + y;
    }
}

#define DEFINE_NARROW(NAME, T, TOF, FROMF)                                             \
    static void NAME(T *d, const T *a, const T *b, size_t n, ncclRedOp_t op)           \
    {                                                                                  \
        for (size_t i = 0; i < n; i++)                                                 \
            d[i] = FROMF(combine(TOF(a[i]), TOF(b[i]), op));                           \
    }

DEFINE_NARROW(red_f16, uint16_t, geoHalfToFloat, geoFloatToHalf)
DEFINE_NARROW(red_bf16, uint16_t, geoBf16ToFloat, geoFloatToBf16)
DEFINE_NARROW(red_e4m3, uint8_t, geoFp8e4m3ToFloat, geoFloatToFp8e4m3)
DEFINE_NARROW(red_e5m2, uint8_t, geoFp8e5m2ToFloat, geoFloatToFp8e5m2)

void geoReduce(void *dst, const void *a, const void *b, size_t n, ncclDataType_t dt,
               ncclRedOp_t op)
{
    if (op >= ncclNumOps || op == ncclAvg)
        op = ncclSum;
    switch (dt) {
    case ncclInt8: red_i8(dst, a, b, n, op); break;
    case ncclUint8: red_u8(dst, a, b, n, op); break;
    case ncclInt32: red_i32(dst, a, b, n, op); break;
    case ncclUint32: red_u32(dst, a, b, n, op); break;
    case ncclInt64: red_i64(dst, a, b, n, op); break;
    case ncclUint64: red_u64(dst, a, b, n, op); break;
    case ncclFloat16: red_f16(dst, a, b, n, op); break;
    case ncclFloat32: red_f32(dst, a, b, n, op); break;
    case ncclFloat64: red_f64(dst, a, b, n, op); break;
    case ncclBfloat16: red_bf16(dst, a, b, n, op); break;
    case ncclFloat8e4m3: red_e4m3(dst, a, b, n, op); break;
    case ncclFloat8e5m2: red_e5m2(dst, a, b, n, op); break;
    default: break;
    }
}

#define SCALE_LOOP(T, CONV_IN, CONV_OUT)                                               \
    do {                                                                               \
        T *d = dst;                                                                    \
        const T *s = src;                                                              \
        for (size_t i = 0; i < n; i++)                                                 \
            d[i] = CONV_OUT(CONV_IN(s[i]) * scalar);                                   \
    } while (0)

#define ID(x) (x)

#define SCALE_NARROW(T, TOF, FROMF)                                                    \
    do {                                                                               \
        float sc = (float)scalar;                                                      \
        T *d = dst;                                                                    \
        const T *s = src;                                                              \
        for (size_t i = 0; i < n; i++)                                                 \
            d[i] = FROMF(TOF(s[i]) * sc);                                              \
    } while (0)

void geoScale(void *dst, const void *src, size_t n, ncclDataType_t dt, double scalar)
{
    switch (dt) {
    case ncclFloat32: SCALE_NARROW(float, ID, ID); break;
    case ncclFloat64: SCALE_LOOP(double, ID, ID); break;
    case ncclFloat16: SCALE_NARROW(uint16_t, geoHalfToFloat, geoFloatToHalf); break;
    case ncclBfloat16: SCALE_NARROW(uint16_t, geoBf16ToFloat, geoFloatToBf16); break;
    case ncclFloat8e4m3: SCALE_NARROW(uint8_t, geoFp8e4m3ToFloat, geoFloatToFp8e4m3); break;
    case ncclFloat8e5m2: SCALE_NARROW(uint8_t, geoFp8e5m2ToFloat, geoFloatToFp8e5m2); break;
    case ncclInt8: SCALE_LOOP(int8_t, ID, (int8_t)); break;
    case ncclUint8: SCALE_LOOP(uint8_t, ID, (uint8_t)); break;
    case ncclInt32: SCALE_LOOP(int32_t, ID, (int32_t)); break;
    case ncclUint32: SCALE_LOOP(uint32_t, ID, (uint32_t)); break;
    case ncclInt64: SCALE_LOOP(int64_t, ID, (int64_t)); break;
    case ncclUint64: SCALE_LOOP(uint64_t, ID, (uint64_t)); break;
    default: break;
    }
}

#define DIV_LOOP(T)                                                                    \
    do {                                                                               \
        T *b = buf;                                                                    \
        for (size_t i = 0; i < n; i++)                                                 \
            b[i] = (T)(b[i] / (T)divisor);                                             \
    } while (0)

void geoDivide(void *buf, size_t n, ncclDataType_t dt, int divisor)
{
    switch (dt) {
    case ncclInt8: DIV_LOOP(int8_t); break;
    case ncclUint8: DIV_LOOP(uint8_t); break;
    case ncclInt32: DIV_LOOP(int32_t); break;
    case ncclUint32: DIV_LOOP(uint32_t); break;
    case ncclInt64: DIV_LOOP(int64_t); break;
    case ncclUint64: DIV_LOOP(uint64_t); break;
    case ncclFloat32: DIV_LOOP(float); break;
    case ncclFloat64: DIV_LOOP(double); break;
    default: {
        /* narrow floats: through float */
        size_t es = geoTypeSize(dt);
        for (size_t i = 0; i < n; i++) {
            if (es == 2) {
                uint16_t *b = buf;
                b[i] = dt == ncclFloat16 ? geoFloatToHalf(geoHalfToFloat(b[i]) / (float)divisor)
                                         : geoFloatToBf16(geoBf16ToFloat(b[i]) / (float)divisor);
            } else {
                uint8_t *b = buf;
                b[i] = dt == ncclFloat8e4m3
                           ? geoFloatToFp8e4m3(geoFp8e4m3ToFloat(b[i]) / (float)divisor)
                           : geoFloatToFp8e5m2(geoFp8e5m2ToFloat(b[i]) / (float)divisor);
            }
        }
        break;
    }
    }
}
