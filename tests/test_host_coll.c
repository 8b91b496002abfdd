/*
 * Collectives of many ranks on one host: the host segment
 * (comm/intra/hostseg.h, docs/small-collectives.md).
 *
 * 64 forked ranks (GEOCCL_HOST_COLL as the environment says, 1 by default:
 * each call goes where the cost model puts it) run, at counts 1, 7, 1000
 * and 65537 (256 KiB of float: pieces larger than a slot at 64 ranks; the
 * gathers at 4099, to keep 64 ranks' buffers small) and 2^18 + 3 for
 * all-reduce:
 *   all-reduce over every host data type with sum, and float with prod,
 *   max, min and avg, in and out of place; broadcast from ranks 0 and 63;
 *   reduce to rank 5; all-gather; reduce-scatter (sum and avg); and a ring
 *   of sends and receives.
 * Inputs are small integers, so every result is exact in every type and
 * is compared element by element with a reference computed here: what
 * every rank holds is therefore also bit-identical on every rank.
 * Then: a run with 4 ranks and GEOCCL_HOST_COLL=2 (the segment at every
 * size, 8 B to 4 MiB), and one where a rank has GEOCCL_HOST_COLL=0 (the
 * ranks must agree not to use the segment and still get right results).
 */
#define _GNU_SOURCE
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "geoccl.h"
#include "tests/helpers/harness.h"

#define NR 64
#define TIMEOUT_S 240.0

static const size_t counts[] = {1, 7, 1000, 65537};
#define NCOUNTS (sizeof(counts) / sizeof(counts[0]))

/* Rank r's input element i, small enough that the sum over 64 ranks is
 * exact in every type (bf16: integers up to 256; int8 up to 127). */
static double value(ncclDataType_t t, ncclRedOp_t op, int r, size_t i)
{
  if (op == ncclProd) return ((size_t)r + i) % 32 == 0 ? 2.0 : 1.0;
  if (op == ncclMax || op == ncclMin) return (double)(((size_t)r * 37 + i * 11) % 1000);
  switch (t) {
  case ncclInt8: return (double)(((size_t)r + i) % 2);
  case ncclUint8: case ncclBfloat16: return (double)(((size_t)r + i) % 4);
  default: return (double)(((size_t)r * 7 + i) % 13);
  }
}

static void store(ncclDataType_t t, void *buf, size_t i, double v)
{
  switch (t) {
  case ncclFloat32: ((float *)buf)[i] = (float)v; break;
  case ncclFloat64: ((double *)buf)[i] = v; break;
  case ncclFloat16: ((uint16_t *)buf)[i] = harness_double_to_half(v, NULL); break;
  case ncclBfloat16: ((uint16_t *)buf)[i] = harness_double_to_bf16(v, NULL); break;
  case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
  case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
  case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
  case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
  case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
  default: break;
  }
}

/* The reduction of element i over n ranks. */
static double expected(ncclDataType_t t, ncclRedOp_t op, int n, size_t i)
{
  double acc = value(t, op, 0, i);
  for (int r = 1; r < n; r++) {
    double v = value(t, op, r, i);
    switch (op) {
    case ncclProd: acc *= v; break;
    case ncclMax: acc = v > acc ? v : acc; break;
    case ncclMin: acc = v < acc ? v : acc; break;
    default: acc += v; break;
    }
  }
  if (op == ncclAvg) acc = harness_type_is_float(t) ? acc / n : floor(acc / n);
  return acc;
}

static int check(const char *what, ncclDataType_t t, ncclRedOp_t op, const void *got,
                 size_t count, int n, size_t first, int rank)
{
  for (size_t i = 0; i < count; i++) {
    double want = expected(t, op, n, first + i), have = harness_load_double(t, got, i);
    if (have != want) {
      fprintf(stderr, "[rank %d] %s %s %s count %zu: element %zu is %g, want %g\n", rank, what,
              harness_type_name(t), harness_op_name(op), count, i, have, want);
      return 1;
    }
  }
  return 0;
}

static const ncclDataType_t types[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                       ncclInt8, ncclUint8, ncclInt32, ncclUint32,
                                       ncclInt64, ncclUint64};
#define NTYPES (sizeof(types) / sizeof(types[0]))

static int allreduce_case(ncclComm_t comm, int rank, int n, ncclDataType_t t, ncclRedOp_t op,
                          size_t count, int inplace)
{
  size_t es = harness_type_size(t);
  char *in = malloc(count * es), *out = malloc(count * es);
  int bad = 0;
  if (in == NULL || out == NULL) return 1;
  for (size_t i = 0; i < count; i++) store(t, in, i, value(t, op, rank, i));
  ncclResult_t r = ncclAllReduce(in, inplace ? in : out, count, t, op, comm, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclAllReduce: %s\n", rank, ncclGetLastError(comm));
    bad = 1;
  } else {
    bad = check(inplace ? "allreduce in place" : "allreduce", t, op, inplace ? in : out, count,
                n, 0, rank);
  }
  free(in);
  free(out);
  return bad;
}

static int rooted_and_gathers(ncclComm_t comm, int rank, int n, size_t count, size_t gcount)
{
  const ncclDataType_t t = ncclFloat32;
  float *in = malloc(count * n * sizeof(float)), *out = malloc(count * n * sizeof(float));
  int bad = 0;
  if (in == NULL || out == NULL) return 1;
  /* Broadcast from the first and the last rank. */
  for (int k = 0; k < 2 && !bad; k++) {
    int root = k ? n - 1 : 0;
    for (size_t i = 0; i < count; i++)
      out[i] = rank == root ? (float)((i * 3 + (size_t)root) % 1001) : -1.0f;
    if (ncclBroadcast(out, out, count, t, root, comm, NULL) != ncclSuccess) bad = 1;
    for (size_t i = 0; i < count && !bad; i++)
      if (out[i] != (float)((i * 3 + (size_t)root) % 1001)) {
        fprintf(stderr, "[rank %d] broadcast from %d count %zu: element %zu is %g\n", rank, root,
                count, i, out[i]);
        bad = 1;
      }
  }
  /* Reduce to rank 5. */
  for (size_t i = 0; i < count; i++) in[i] = (float)value(t, ncclSum, rank, i);
  memset(out, 0, count * sizeof(float));
  if (!bad && ncclReduce(in, out, count, t, ncclSum, 5 % n, comm, NULL) != ncclSuccess) bad = 1;
  if (!bad && rank == 5 % n) bad = check("reduce", t, ncclSum, out, count, n, 0, rank);
  /* All-gather: block j holds rank j's values. */
  count = gcount;
  for (size_t i = 0; i < count; i++) in[i] = (float)((size_t)rank * 1000 + i % 1000);
  if (!bad && ncclAllGather(in, out, count, t, comm, NULL) != ncclSuccess) bad = 1;
  for (int j = 0; j < n && !bad; j++)
    for (size_t i = 0; i < count && !bad; i++)
      if (out[(size_t)j * count + i] != (float)((size_t)j * 1000 + i % 1000)) {
        fprintf(stderr, "[rank %d] allgather count %zu: block %d element %zu is %g\n", rank,
                count, j, i, out[(size_t)j * count + i]);
        bad = 1;
      }
  /* Reduce-scatter, sum and avg: my block is elements [rank count, ..). */
  for (int k = 0; k < 2 && !bad; k++) {
    ncclRedOp_t op = k ? ncclAvg : ncclSum;
    for (size_t i = 0; i < count * n; i++) in[i] = (float)value(t, op, rank, i);
    if (ncclReduceScatter(in, out, count, t, op, comm, NULL) != ncclSuccess) bad = 1;
    if (!bad) bad = check("reducescatter", t, op, out, count, n, (size_t)rank * count, rank);
  }
  /* A ring of sends and receives. */
  int to = (rank + 1) % n, from = (rank + n - 1) % n;
  for (size_t i = 0; i < count; i++) in[i] = (float)(rank * 3 + (int)(i % 7));
  ncclGroupStart();
  ncclSend(in, count, t, to, comm, NULL);
  ncclRecv(out, count, t, from, comm, NULL);
  if (!bad && ncclGroupEnd() != ncclSuccess) bad = 1;
  for (size_t i = 0; i < count && !bad; i++)
    if (out[i] != (float)(from * 3 + (int)(i % 7))) {
      fprintf(stderr, "[rank %d] recv from %d count %zu: element %zu is %g\n", rank, from,
              count, i, out[i]);
      bad = 1;
    }
  if (bad && ncclGetLastError(comm)[0])
    fprintf(stderr, "[rank %d] %s\n", rank, ncclGetLastError(comm));
  free(in);
  free(out);
  return bad;
}

static int matrix_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  int bad = 0;
  for (size_t c = 0; c < NCOUNTS && !bad; c++) {
    for (size_t k = 0; k < NTYPES && !bad; k++)
      bad += allreduce_case(comm, rank, nranks, types[k], ncclSum, counts[c], (int)(k & 1));
    const ncclRedOp_t ops[] = {ncclProd, ncclMax, ncclMin, ncclAvg};
    for (int o = 0; o < 4 && !bad; o++)
      bad += allreduce_case(comm, rank, nranks, ncclFloat32, ops[o], counts[c], o & 1);
    size_t gathers = counts[c] < 4099 ? counts[c] : 4099;
    if (!bad) bad += rooted_and_gathers(comm, rank, nranks, counts[c], gathers);
  }
  if (!bad)
    bad += allreduce_case(comm, rank, nranks, ncclFloat32, ncclSum, ((size_t)1 << 18) + 3, 0);
  return bad;
}

static void test_64_ranks(void)
{
  CU_ASSERT_EQUAL(harness_run(NR, matrix_body, NULL, TIMEOUT_S * harness_time_scale()), 0);
}

/* GEOCCL_HOST_COLL=2: every size on the segment, 4 ranks, 8 B to 4 MiB. */
static int every_size_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  int bad = 0;
  for (size_t count = 2; count <= ((size_t)1 << 20) && !bad; count *= 8) {
    bad += allreduce_case(comm, rank, nranks, ncclFloat32, ncclSum, count, 0);
    if (!bad) bad += rooted_and_gathers(comm, rank, nranks, count, count);
  }
  return bad;
}

static void test_every_size(void)
{
  setenv("GEOCCL_HOST_COLL", "2", 1);
  ncclResetDebugInit();
  CU_ASSERT_EQUAL(harness_run(4, every_size_body, NULL, 120.0 * harness_time_scale()), 0);
  unsetenv("GEOCCL_HOST_COLL");
  ncclResetDebugInit();
}

/* One rank says GEOCCL_HOST_COLL=0: nobody uses the segment, all right. */
static int one_off_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  (void)arg;
  ncclComm_t comm;
  if (rank == 2) setenv("GEOCCL_HOST_COLL", "0", 1);
  ncclResetDebugInit();
  if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess) return 1;
  int bad = allreduce_case(comm, rank, nranks, ncclFloat32, ncclSum, 1000, 0);
  if (!bad) bad += rooted_and_gathers(comm, rank, nranks, 7, 7);
  ncclCommDestroy(comm);
  return bad;
}

static void test_one_rank_off(void)
{
  CU_ASSERT_EQUAL(harness_run_noinit(4, one_off_body, NULL, 120.0 * harness_time_scale()), 0);
}

int main(void)
{
  harness_setup_env();
  if (CU_initialize_registry() != CUE_SUCCESS) return 1;
  CU_pSuite s = CU_add_suite("host_coll", NULL, NULL);
  CU_add_test(s, "64 ranks, every collective, checked", test_64_ranks);
  CU_add_test(s, "GEOCCL_HOST_COLL=2, 8 B to 4 MiB", test_every_size);
  CU_add_test(s, "one rank with GEOCCL_HOST_COLL=0", test_one_rank_off);
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned fails = CU_get_number_of_failures() + CU_get_number_of_tests_failed();
  CU_cleanup_registry();
  return fails ? 1 : 0;
}
