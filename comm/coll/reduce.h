/* Element-wise reductions on host memory for every NCCL data type.  Loops
 * are written per type so the compiler vectorises them; 16- and 8-bit
 * floating types are widened to float, combined, and rounded back to
 * nearest-even (fp8 saturating to the largest finite value, as CUDA's
 * __nv_fp8 conversions do by default). */
#ifndef GEOCCL_REDUCE_H_
#define GEOCCL_REDUCE_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* Bytes per element; 0 for an invalid type. */
size_t geoTypeSize(ncclDataType_t dt);
int geoTypeIsFloat(ncclDataType_t dt);
const char *geoTypeName(ncclDataType_t dt);
const char *geoOpName(ncclRedOp_t op);

/* dst[i] = a[i] (op) b[i] for op in Sum, Prod, Max, Min (Avg and PreMulSum
 * reduce as Sum).  dst may alias a or b. */
void geoReduce(void *dst, const void *a, const void *b, size_t n, ncclDataType_t dt,
               ncclRedOp_t op);
/* dst[i] = src[i] * scalar (scalar given as double; integer types round
 * toward zero).  dst may alias src. */
void geoScale(void *dst, const void *src, size_t n, ncclDataType_t dt, double scalar);
/* buf[i] /= divisor (Avg's last step; integers truncate toward zero). */
void geoDivide(void *buf, size_t n, ncclDataType_t dt, int divisor);

float geoHalfToFloat(uint16_t h);
uint16_t geoFloatToHalf(float f);
float geoBf16ToFloat(uint16_t h);
uint16_t geoFloatToBf16(float f);
float geoFp8e4m3ToFloat(uint8_t v);
uint8_t geoFloatToFp8e4m3(float f);
float geoFp8e5m2ToFloat(uint8_t v);
uint8_t geoFloatToFp8e5m2(float f);

#endif
