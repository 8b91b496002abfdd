/* Host reductions and the narrow floating-point conversions. */
#include "config.h"
#include "comm/coll/reduce.h"

#include <CUnit/Basic.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static void test_type_sizes(void)
{
    static const size_t expect[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    for (int t = 0; t < ncclNumTypes; t++)
        CU_ASSERT_EQUAL(geoTypeSize((ncclDataType_t)t), expect[t]);
    CU_ASSERT_EQUAL(geoTypeSize(ncclNumTypes), 0);
    CU_ASSERT_EQUAL(geoTypeSize((ncclDataType_t)-1), 0);
}

static void test_half_roundtrip_and_rounding(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = geoHalfToFloat((uint16_t)h);
        if (isnan(f))
            continue;
        if (geoFloatToHalf(f) != h)
            bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* Ties go to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10. */
    CU_ASSERT_EQUAL(geoFloatToHalf(1.0f + ldexpf(1, -11)), 0x3c00);
    CU_ASSERT_EQUAL(geoFloatToHalf(1.0f + 3 * ldexpf(1, -11)), 0x3c02);
    CU_ASSERT_EQUAL(geoFloatToHalf(65504.0f), 0x7bff);
    CU_ASSERT_EQUAL(geoFloatToHalf(1e6f), 0x7c00); /* overflow to inf */
}

static void test_bf16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = geoBf16ToFloat((uint16_t)h);
        if (!isnan(f) && geoFloatToBf16(f) != h)
            bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(geoFloatToBf16(1.0f + ldexpf(1, -8)), 0x3f80); /* tie to even */
    CU_ASSERT_EQUAL(geoFloatToBf16(1.0f + 3 * ldexpf(1, -8)), 0x3f82);
    CU_ASSERT_TRUE(isnan(geoBf16ToFloat(geoFloatToBf16(NAN))));
}

static void test_fp8(void)
{
    int bad = 0;
    for (int v = 0; v < 256; v++) {
        float a = geoFp8e4m3ToFloat((uint8_t)v), b = geoFp8e5m2ToFloat((uint8_t)v);
        if (!isnan(a) && geoFloatToFp8e4m3(a) != v && !(a == 0 && v == 0x80))
            bad++;
        if (!isnan(b) && !isinf(b) && geoFloatToFp8e5m2(b) != v)
            bad++;
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(geoFp8e4m3ToFloat(0x7e), 448.0f);
    CU_ASSERT_EQUAL(geoFloatToFp8e4m3(1000.0f), 0x7e); /* saturates */
    CU_ASSERT_EQUAL(geoFloatToFp8e4m3(-1000.0f), 0xfe);
    CU_ASSERT_EQUAL(geoFp8e5m2ToFloat(0x7b), 57344.0f);
    CU_ASSERT_EQUAL(geoFloatToFp8e5m2(1e9f), 0x7b);
    CU_ASSERT_EQUAL(geoFp8e4m3ToFloat(0x01), ldexpf(1, -9)); /* smallest subnormal */
    CU_ASSERT_EQUAL(geoFloatToFp8e4m3(3.0f), 0x44);
    CU_ASSERT_EQUAL(geoFp8e4m3ToFloat(0x44), 3.0f);
}

static void test_reduce_ops_all_types(void)
{
    /* a = {1,2,3}, b = {3,2,1} in every type: sum 4,4,4; prod 3,4,3;
     * max 3,2,3; min 1,2,1. */
    const float a[3] = {1, 2, 3}, b[3] = {3, 2, 1};
    const float want[4][3] = {{4, 4, 4}, {3, 4, 3}, {3, 2, 3}, {1, 2, 1}};
    for (int t = 0; t < ncclNumTypes; t++) {
        for (int op = 0; op < 4; op++) {
            unsigned char ba[24], bb[24], out[24];
            size_t es = geoTypeSize((ncclDataType_t)t);
            for (int i = 0; i < 3; i++) {
                double va = a[i], vb = b[i];
                switch (t) {
                case ncclInt8: case ncclUint8: ba[i] = (uint8_t)va; bb[i] = (uint8_t)vb; break;
                case ncclInt32: case ncclUint32: { uint32_t x = (uint32_t)va, y = (uint32_t)vb;
                    memcpy(ba + 4 * i, &x, 4); memcpy(bb + 4 * i, &y, 4); break; }
                case ncclInt64: case ncclUint64: { uint64_t x = (uint64_t)va, y = (uint64_t)vb;
                    memcpy(ba + 8 * i, &x, 8); memcpy(bb + 8 * i, &y, 8); break; }
                case ncclFloat16: { uint16_t x = geoFloatToHalf((float)va), y = geoFloatToHalf((float)vb);
                    memcpy(ba + 2 * i, &x, 2); memcpy(bb + 2 * i, &y, 2); break; }
                case ncclBfloat16: { uint16_t x = geoFloatToBf16((float)va), y = geoFloatToBf16((float)vb);
                    memcpy(ba + 2 * i, &x, 2); memcpy(bb + 2 * i, &y, 2); break; }
                case ncclFloat32: { float x = (float)va, y = (float)vb;
                    memcpy(ba + 4 * i, &x, 4); memcpy(bb + 4 * i, &y, 4); break; }
                case ncclFloat64: memcpy(ba + 8 * i, &va, 8); memcpy(bb + 8 * i, &vb, 8); break;
                case ncclFloat8e4m3: ba[i] = geoFloatToFp8e4m3((float)va); bb[i] = geoFloatToFp8e4m3((float)vb); break;
                case ncclFloat8e5m2: ba[i] = geoFloatToFp8e5m2((float)va); bb[i] = geoFloatToFp8e5m2((float)vb); break;
                }
            }
            geoReduce(out, ba, bb, 3, (ncclDataType_t)t, (ncclRedOp_t)op);
            for (int i = 0; i < 3; i++) {
                double got = 0;
                const unsigned char *p = out + es * (size_t)i;
                switch (t) {
                case ncclInt8: got = (int8_t)p[0]; break;
                case ncclUint8: got = p[0]; break;
                case ncclInt32: { int32_t v; memcpy(&v, p, 4); got = v; break; }
                case ncclUint32: { uint32_t v; memcpy(&v, p, 4); got = v; break; }
                case ncclInt64: { int64_t v; memcpy(&v, p, 8); got = (double)v; break; }
                case ncclUint64: { uint64_t v; memcpy(&v, p, 8); got = (double)v; break; }
                case ncclFloat16: { uint16_t v; memcpy(&v, p, 2); got = geoHalfToFloat(v); break; }
                case ncclBfloat16: { uint16_t v; memcpy(&v, p, 2); got = geoBf16ToFloat(v); break; }
                case ncclFloat32: { float v; memcpy(&v, p, 4); got = v; break; }
                case ncclFloat64: memcpy(&got, p, 8); break;
                case ncclFloat8e4m3: got = geoFp8e4m3ToFloat(p[0]); break;
                case ncclFloat8e5m2: got = geoFp8e5m2ToFloat(p[0]); break;
                }
                if (got != want[op][i])
                    fprintf(stderr, "type %s op %s [%d]: got %g want %g\n",
                            geoTypeName((ncclDataType_t)t), geoOpName((ncclRedOp_t)op), i, got,
                            (double)want[op][i]);
                CU_ASSERT_EQUAL(got, want[op][i]);
            }
        }
    }
}

static void test_int_wrap_avg_scale(void)
{
    int8_t a[2] = {127, -128}, b[2] = {1, -1}, d[2];
    geoReduce(d, a, b, 2, ncclInt8, ncclSum);
    CU_ASSERT_EQUAL(d[0], -128); /* two's complement wrap, as on the GPU */
    CU_ASSERT_EQUAL(d[1], 127);
    int32_t s[3] = {7, -7, 8};
    geoDivide(s, 3, ncclInt32, 2);
    CU_ASSERT_EQUAL(s[0], 3); /* truncation toward zero */
    CU_ASSERT_EQUAL(s[1], -3);
    CU_ASSERT_EQUAL(s[2], 4);
    float f[2] = {3, 5};
    geoScale(f, f, 2, ncclFloat32, 0.5);
    CU_ASSERT_EQUAL(f[0], 1.5f);
    CU_ASSERT_EQUAL(f[1], 2.5f);
    double big[1000], one[1000];
    for (int i = 0; i < 1000; i++) {
        big[i] = i;
        one[i] = 1;
    }
    geoReduce(big, big, one, 1000, ncclFloat64, ncclMax);
    CU_ASSERT_EQUAL(big[0], 1);
    CU_ASSERT_EQUAL(big[999], 999);
}


/* The vector loops (sum and prod of the native types) against one scalar
 * operation per element, bit for bit: lengths around the vector block,
 * unaligned starts, and in place (dst == a, dst == b). */
#define REF_CHECK(T, EXPR)                                                             \
    do {                                                                               \
        /* off elements in: the vector loops see every alignment to their   \
         * 16 bytes, the elements keep their own (C's rule).  */          \
        T *A = (T *)(abuf + off * sizeof(T)), *B = (T *)(bbuf + off * sizeof(T));     \
        T *D = (T *)(dbuf + off * sizeof(T));                                          \
        for (size_t i = 0; i < n; i++) {                                               \
            A[i] = (T)(seed * (i + 3) % 251) / (T)7 - (T)9;                            \
            B[i] = (T)(seed * (i + 11) % 241) / (T)3 + (T)1;                           \
        }                                                                              \
        T *dst = place == 0 ? D : place == 1 ? A : B;                                  \
        T ref[300];                                                                    \
        for (size_t i = 0; i < n; i++) {                                               \
            T x = A[i], y = B[i];                                                      \
            ref[i] = EXPR;                                                             \
        }                                                                              \
        geoReduce(dst, A, B, n, dt, op);                                               \
        if (memcmp(dst, ref, n * sizeof(T)) != 0) {                                    \
            fprintf(stderr, "%s %s n %zu off %zu place %d differs\n", geoTypeName(dt),  \
                    geoOpName(op), n, off, place);                                     \
            bad++;                                                                     \
        }                                                                              \
    } while (0)

static void test_vector_loops_match_scalar(void)
{
    static _Alignas(16) unsigned char abuf[4096], bbuf[4096], dbuf[4096];
    const ncclDataType_t types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64,
                                    ncclUint64, ncclFloat32, ncclFloat64};
    const size_t lens[] = {1, 15, 16, 17, 63, 64, 65, 129, 257};
    int bad = 0, checked = 0;
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
        for (int o = 0; o < 2; o++)
            for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
                for (size_t off = 0; off < 8; off += 3)
                    for (int place = 0; place < 3; place++) {
                        ncclDataType_t dt = types[t];
                        ncclRedOp_t op = o ? ncclProd : ncclSum;
                        size_t n = lens[li], seed = 7 + li + off;
                        switch (dt) {
                        case ncclInt8: REF_CHECK(int8_t, op ? (int8_t)(uint8_t)((uint8_t)x * (uint8_t)y) : (int8_t)(uint8_t)((uint8_t)x + (uint8_t)y)); break;
                        case ncclUint8: REF_CHECK(uint8_t, op ? (uint8_t)(x * y) : (uint8_t)(x + y)); break;
                        case ncclInt32: REF_CHECK(int32_t, op ? (int32_t)((uint32_t)x * (uint32_t)y) : (int32_t)((uint32_t)x + (uint32_t)y)); break;
                        case ncclUint32: REF_CHECK(uint32_t, op ? x * y : x + y); break;
                        case ncclInt64: REF_CHECK(int64_t, op ? (int64_t)((uint64_t)x * (uint64_t)y) : (int64_t)((uint64_t)x + (uint64_t)y)); break;
                        case ncclUint64: REF_CHECK(uint64_t, op ? x * y : x + y); break;
                        case ncclFloat32: REF_CHECK(float, op ? x * y : x + y); break;
                        case ncclFloat64: REF_CHECK(double, op ? x * y : x + y); break;
                        default: break;
                        }
                        checked++;
                    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(checked == 8 * 2 * 9 * 3 * 3);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("reduce", NULL, NULL);
    CU_add_test(s, "type sizes", test_type_sizes);
    CU_add_test(s, "half round trip and rounding", test_half_roundtrip_and_rounding);
    CU_add_test(s, "bfloat16", test_bf16);
    CU_add_test(s, "fp8 e4m3 and e5m2", test_fp8);
    CU_add_test(s, "every op on every type", test_reduce_ops_all_types);
    CU_add_test(s, "integer wrap, avg, scale", test_int_wrap_avg_scale);
    CU_add_test(s, "vector sum and prod loops match the scalar ones", test_vector_loops_match_scalar);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
