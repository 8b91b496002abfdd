/*
 * Argument checking of the NCCL API entry points.
 *
 * Every bad call must return ncclInvalidArgument before anything reaches
 * the network: after one rank has made a long list of bad calls, both ranks
 * run valid collectives and must get the right answers (a stray send would
 * put the byte streams out of step). Each check runs in a forked child so a
 * crash or a hang is reported as a failure instead of ending the test run.
 */
#define _GNU_SOURCE
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/helpers/harness.h"

#define TIMEOUT_S 60.0

/* Counts a failure when a call does not return `want`. */
#define EXPECT_RC(fails, want, call)                                         \
  do {                                                                       \
    ncclResult_t r_ = (call);                                                \
    if (r_ != (want)) {                                                      \
      fprintf(stderr, "%s:%d: %s returned %s (%d), expected %s\n", __FILE__, \
              __LINE__, #call, ncclGetErrorString(r_), (int)r_,              \
              ncclGetErrorString(want));                                     \
      (fails)++;                                                             \
    }                                                                        \
  } while (0)

#define EXPECT_INVALID(fails, call) EXPECT_RC(fails, ncclInvalidArgument, call)

/* ------------------------------------------------------------------------ */
/* No communicator needed                                                   */
/* ------------------------------------------------------------------------ */

static void test_error_strings(void)
{
  for (int r = 0; r < (int)ncclNumResults; r++) {
    const char *s = ncclGetErrorString((ncclResult_t)r);
    CU_ASSERT_PTR_NOT_NULL(s);
    if (s != NULL) CU_ASSERT(strlen(s) > 0);
  }
  /* distinct codes get distinct texts */
  for (int a = 0; a < (int)ncclNumResults; a++)
    for (int b = a + 1; b < (int)ncclNumResults; b++) {
      const char *sa = ncclGetErrorString((ncclResult_t)a);
      const char *sb = ncclGetErrorString((ncclResult_t)b);
      if (sa != NULL && sb != NULL) CU_ASSERT(strcmp(sa, sb) != 0);
    }
  /* out of range values still give a string, never NULL */
  CU_ASSERT_PTR_NOT_NULL(ncclGetErrorString(ncclNumResults));
  CU_ASSERT_PTR_NOT_NULL(ncclGetErrorString((ncclResult_t)1000));
}

static void test_last_error_null(void)
{
  CU_ASSERT_PTR_NOT_NULL(ncclGetLastError(NULL));
}

static int null_pointer_body(int rank, int nranks, const ncclUniqueId *id,
                             void *arg)
{
  (void)rank; (void)nranks; (void)id; (void)arg;
  int fails = 0;
  EXPECT_INVALID(fails, ncclGetVersion(NULL));
  EXPECT_INVALID(fails, ncclGetUniqueId(NULL));
  return fails;
}

static void test_null_out_pointers(void)
{
  harness_opts o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = TIMEOUT_S;
  CU_ASSERT_EQUAL(harness_run_opts(1, null_pointer_body, NULL, &o), 0);
}

/* Every collective with a NULL communicator. */
static int null_comm_body(int rank, int nranks, const ncclUniqueId *id,
                          void *arg)
{
  (void)rank; (void)nranks; (void)id; (void)arg;
  int fails = 0;
  float a[8] = {0}, b[8] = {0};
  ncclComm_t c = NULL;
  int n;
  EXPECT_INVALID(fails, ncclAllReduce(a, b, 1, ncclFloat32, ncclSum, c, NULL));
  EXPECT_INVALID(fails, ncclBroadcast(a, b, 1, ncclFloat32, 0, c, NULL));
  EXPECT_INVALID(fails, ncclBcast(a, 1, ncclFloat32, 0, c, NULL));
  EXPECT_INVALID(fails, ncclReduce(a, b, 1, ncclFloat32, ncclSum, 0, c, NULL));
  EXPECT_INVALID(fails, ncclAllGather(a, b, 1, ncclFloat32, c, NULL));
  EXPECT_INVALID(fails, ncclReduceScatter(a, b, 1, ncclFloat32, ncclSum, c, NULL));
  EXPECT_INVALID(fails, ncclAlltoAll(a, b, 1, ncclFloat32, c, NULL));
  EXPECT_INVALID(fails, ncclGather(a, b, 1, ncclFloat32, 0, c, NULL));
  EXPECT_INVALID(fails, ncclScatter(a, b, 1, ncclFloat32, 0, c, NULL));
  EXPECT_INVALID(fails, ncclSend(a, 1, ncclFloat32, 0, c, NULL));
  EXPECT_INVALID(fails, ncclRecv(b, 1, ncclFloat32, 0, c, NULL));
  EXPECT_INVALID(fails, ncclCommCount(c, &n));
  EXPECT_INVALID(fails, ncclCommUserRank(c, &n));
  if (strlen(ncclGetLastError(NULL)) == 0) {
    fprintf(stderr, "ncclGetLastError(NULL) is empty after a NULL-comm call\n");
    fails++;
  }
  return fails;
}

static void test_null_comm(void)
{
  harness_opts o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = TIMEOUT_S;
  CU_ASSERT_EQUAL(harness_run_opts(1, null_comm_body, NULL, &o), 0);
}

/* ------------------------------------------------------------------------ */
/* Communicator creation                                                    */
/* ------------------------------------------------------------------------ */

/* Bad init calls against a live root; afterwards a valid one-rank init on
 * the same id must still work, so the bad calls did not take a slot. */
static int init_args_body(int rank, int nranks, const ncclUniqueId *id,
                          void *arg)
{
  (void)rank; (void)nranks; (void)arg;
  int fails = 0;
  ncclComm_t c = NULL;
  EXPECT_INVALID(fails, ncclCommInitRank(&c, 1, *id, 1));
  EXPECT_INVALID(fails, ncclCommInitRank(&c, 2, *id, 2));
  EXPECT_INVALID(fails, ncclCommInitRank(&c, 2, *id, 5));
  EXPECT_INVALID(fails, ncclCommInitRank(&c, 1, *id, -1));
  EXPECT_INVALID(fails, ncclCommInitRank(&c, 0, *id, 0));
  EXPECT_INVALID(fails, ncclCommInitRank(&c, -3, *id, 0));
  EXPECT_INVALID(fails, ncclCommInitRank(NULL, 1, *id, 0));

  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  EXPECT_INVALID(fails, ncclCommInitRankConfig(&c, 1, *id, 0, &cfg));
  ncclConfig_t cfg2 = NCCL_CONFIG_INITIALIZER;
  cfg2.magic = 0xdeadbeef;
  EXPECT_INVALID(fails, ncclCommInitRankConfig(&c, 1, *id, 0, &cfg2));
  ncclConfig_t cfg3 = NCCL_CONFIG_INITIALIZER;
  cfg3.size = 8;
  EXPECT_INVALID(fails, ncclCommInitRankConfig(&c, 1, *id, 0, &cfg3));
  ncclConfig_t cfg4 = NCCL_CONFIG_INITIALIZER;
  cfg4.size = 0;
  EXPECT_INVALID(fails, ncclCommInitRankConfig(&c, 1, *id, 0, &cfg4));
  ncclConfig_t cfg5 = NCCL_CONFIG_INITIALIZER;
  EXPECT_INVALID(fails, ncclCommInitRankConfig(&c, 1, *id, 3, &cfg5));

  /* the valid call on the same id */
  ncclConfig_t good = NCCL_CONFIG_INITIALIZER;
  ncclResult_t r = ncclCommInitRankConfig(&c, 1, *id, 0, &good);
  if (r != ncclSuccess) {
    fprintf(stderr, "valid one-rank ncclCommInitRankConfig after bad calls: "
                    "%s: %s\n", ncclGetErrorString(r), ncclGetLastError(NULL));
    return fails + 1;
  }
  float x = 3.0f;
  r = ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, c, NULL);
  if (r != ncclSuccess || x != 3.0f) {
    fprintf(stderr, "one-rank all-reduce: %s, value %g\n",
            ncclGetErrorString(r), (double)x);
    fails++;
  }
  if (ncclCommDestroy(c) != ncclSuccess) fails++;
  return fails;
}

static void test_init_args(void)
{
  CU_ASSERT_EQUAL(harness_run_noinit(1, init_args_body, NULL, TIMEOUT_S), 0);
}

/* ------------------------------------------------------------------------ */
/* Bad collective arguments on a live communicator                          */
/* ------------------------------------------------------------------------ */

/* All the bad calls one rank makes. Returns the number of calls that did
 * not give ncclInvalidArgument. */
static int bad_calls(ncclComm_t comm, int rank, int nranks)
{
  int fails = 0;
  enum { N = 64 };
  static float a[N * 8], b[N * 8];
  const ncclDataType_t bad_types[] = {ncclNumTypes, (ncclDataType_t)-1,
                                      (ncclDataType_t)1000};
  const ncclRedOp_t bad_ops[] = {ncclNumOps, (ncclRedOp_t)99,
                                 (ncclRedOp_t)-1, ncclMaxRedOp};
  const int bad_roots[] = {-1, nranks, nranks + 7};
  const int bad_peers[] = {-1, nranks, 1000};
  const ncclDataType_t f = ncclFloat32;

  for (size_t i = 0; i < sizeof(bad_types) / sizeof(bad_types[0]); i++) {
    ncclDataType_t t = bad_types[i];
    EXPECT_INVALID(fails, ncclAllReduce(a, b, N, t, ncclSum, comm, NULL));
    EXPECT_INVALID(fails, ncclBroadcast(a, b, N, t, 0, comm, NULL));
    EXPECT_INVALID(fails, ncclBcast(a, N, t, 0, comm, NULL));
    EXPECT_INVALID(fails, ncclReduce(a, b, N, t, ncclSum, 0, comm, NULL));
    EXPECT_INVALID(fails, ncclAllGather(a, b, N, t, comm, NULL));
    EXPECT_INVALID(fails, ncclReduceScatter(a, b, N, t, ncclSum, comm, NULL));
    EXPECT_INVALID(fails, ncclAlltoAll(a, b, N, t, comm, NULL));
    EXPECT_INVALID(fails, ncclGather(a, b, N, t, 0, comm, NULL));
    EXPECT_INVALID(fails, ncclScatter(a, b, N, t, 0, comm, NULL));
    EXPECT_INVALID(fails, ncclSend(a, N, t, (rank + 1) % nranks, comm, NULL));
    EXPECT_INVALID(fails, ncclRecv(b, N, t, (rank + 1) % nranks, comm, NULL));
  }
  /* the text of the last error belongs to the communicator */
  if (strlen(ncclGetLastError(comm)) == 0) {
    fprintf(stderr, "ncclGetLastError(comm) is empty after a bad datatype\n");
    fails++;
  }
  for (size_t i = 0; i < sizeof(bad_ops) / sizeof(bad_ops[0]); i++) {
    ncclRedOp_t op = bad_ops[i];
    EXPECT_INVALID(fails, ncclAllReduce(a, b, N, f, op, comm, NULL));
    EXPECT_INVALID(fails, ncclReduce(a, b, N, f, op, 0, comm, NULL));
    EXPECT_INVALID(fails, ncclReduceScatter(a, b, N, f, op, comm, NULL));
  }
  for (size_t i = 0; i < sizeof(bad_roots) / sizeof(bad_roots[0]); i++) {
    int root = bad_roots[i];
    EXPECT_INVALID(fails, ncclBroadcast(a, b, N, f, root, comm, NULL));
    EXPECT_INVALID(fails, ncclBcast(a, N, f, root, comm, NULL));
    EXPECT_INVALID(fails, ncclReduce(a, b, N, f, ncclSum, root, comm, NULL));
    EXPECT_INVALID(fails, ncclGather(a, b, N, f, root, comm, NULL));
    EXPECT_INVALID(fails, ncclScatter(a, b, N, f, root, comm, NULL));
  }
  for (size_t i = 0; i < sizeof(bad_peers) / sizeof(bad_peers[0]); i++) {
    int peer = bad_peers[i];
    EXPECT_INVALID(fails, ncclSend(a, N, f, peer, comm, NULL));
    EXPECT_INVALID(fails, ncclRecv(b, N, f, peer, comm, NULL));
  }
  /* NULL buffers that the call needs on this rank (this rank is the root
   * where there is one) */
  EXPECT_INVALID(fails, ncclAllReduce(NULL, b, N, f, ncclSum, comm, NULL));
  EXPECT_INVALID(fails, ncclAllReduce(a, NULL, N, f, ncclSum, comm, NULL));
  EXPECT_INVALID(fails, ncclBroadcast(NULL, b, N, f, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclBroadcast(a, NULL, N, f, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclBcast(NULL, N, f, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclReduce(NULL, b, N, f, ncclSum, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclReduce(a, NULL, N, f, ncclSum, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclAllGather(NULL, b, N, f, comm, NULL));
  EXPECT_INVALID(fails, ncclAllGather(a, NULL, N, f, comm, NULL));
  EXPECT_INVALID(fails, ncclReduceScatter(NULL, b, N, f, ncclSum, comm, NULL));
  EXPECT_INVALID(fails, ncclReduceScatter(a, NULL, N, f, ncclSum, comm, NULL));
  EXPECT_INVALID(fails, ncclAlltoAll(NULL, b, N, f, comm, NULL));
  EXPECT_INVALID(fails, ncclAlltoAll(a, NULL, N, f, comm, NULL));
  EXPECT_INVALID(fails, ncclGather(NULL, b, N, f, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclGather(a, NULL, N, f, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclScatter(NULL, b, N, f, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclScatter(a, NULL, N, f, rank, comm, NULL));
  EXPECT_INVALID(fails, ncclSend(NULL, N, f, (rank + 1) % nranks, comm, NULL));
  EXPECT_INVALID(fails, ncclRecv(NULL, N, f, (rank + 1) % nranks, comm, NULL));
  /* queries with nowhere to write */
  EXPECT_INVALID(fails, ncclCommCount(comm, NULL));
  EXPECT_INVALID(fails, ncclCommUserRank(comm, NULL));
  /* a pre-multiplied sum needs a scalar, and is bound to its datatype;
   * once destroyed its handle is dead */
  ncclRedOp_t op;
  float two = 2.0f;
  EXPECT_INVALID(fails, ncclRedOpCreatePreMulSum(&op, NULL, f,
                                                 ncclScalarHostImmediate, comm));
  EXPECT_INVALID(fails, ncclRedOpCreatePreMulSum(NULL, &two, f,
                                                 ncclScalarHostImmediate, comm));
  EXPECT_INVALID(fails, ncclRedOpCreatePreMulSum(&op, &two, ncclNumTypes,
                                                 ncclScalarHostImmediate, comm));
  if (ncclRedOpCreatePreMulSum(&op, &two, f, ncclScalarHostImmediate, comm) ==
      ncclSuccess) {
    EXPECT_INVALID(fails, ncclAllReduce(a, b, N, ncclFloat64, op, comm, NULL));
    EXPECT_RC(fails, ncclSuccess, ncclRedOpDestroy(op, comm));
    EXPECT_INVALID(fails, ncclAllReduce(a, b, N, f, op, comm, NULL));
    EXPECT_INVALID(fails, ncclRedOpDestroy(op, comm));
  } else {
    fprintf(stderr, "ncclRedOpCreatePreMulSum(float, host) failed\n");
    fails++;
  }
  EXPECT_INVALID(fails, ncclRedOpDestroy(ncclSum, comm));
  /* group calls out of order */
  EXPECT_RC(fails, ncclInvalidUsage, ncclGroupEnd());
  return fails;
}

/* Valid collectives whose results show whether the ranks are in step. */
static int valid_calls(ncclComm_t comm, int rank, int nranks, uint32_t seed)
{
  int fails = 0;
  static const size_t counts[] = {1, 1000, 65537};
  char m[256];
  for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
    size_t n = counts[i];
    float *x = malloc(n * sizeof(float)), *e = malloc(n * sizeof(float));
    harness_fill_input(x, ncclFloat32, ncclSum, nranks, rank, 0, n, seed + (uint32_t)i);
    harness_fill_expected(e, ncclFloat32, ncclSum, nranks, 0, n, seed + (uint32_t)i);
    ncclResult_t r = ncclAllReduce(x, x, n, ncclFloat32, ncclSum, comm, NULL);
    if (r != ncclSuccess) {
      fprintf(stderr, "[rank %d] valid all-reduce count=%zu: %s: %s\n", rank,
              n, ncclGetErrorString(r), ncclGetLastError(comm));
      free(x); free(e);
      return fails + 1;
    }
    if (harness_check(x, e, ncclFloat32, ncclSum, nranks, n, m, sizeof(m))) {
      fprintf(stderr, "[rank %d] valid all-reduce count=%zu after bad calls: "
                      "%s\n", rank, n, m);
      fails++;
    }
    free(x);
    free(e);
  }
  int32_t v[5];
  for (int i = 0; i < 5; i++) v[i] = rank == nranks - 1 ? 4242 + i : -1;
  ncclResult_t r = ncclBroadcast(v, v, 5, ncclInt32, nranks - 1, comm, NULL);
  if (r != ncclSuccess || v[0] != 4242 || v[4] != 4246) {
    fprintf(stderr, "[rank %d] valid broadcast after bad calls: %s, v[0]=%d\n",
            rank, ncclGetErrorString(r), (int)v[0]);
    fails++;
  }
  return fails;
}

static int collective_args_body(int rank, int nranks, ncclComm_t comm,
                                void *arg)
{
  (void)arg;
  int fails = 0;
  for (int bad_rank = 0; bad_rank < nranks; bad_rank++) {
    if (rank == bad_rank) {
      int f = bad_calls(comm, rank, nranks);
      if (f) fprintf(stderr, "[rank %d] %d bad calls were not refused as "
                             "invalid arguments\n", rank, f);
      fails += f;
    }
    fails += valid_calls(comm, rank, nranks, 100 + (uint32_t)bad_rank * 10);
  }
  return fails;
}

static void test_collective_args(void)
{
  CU_ASSERT_EQUAL(harness_run(2, collective_args_body, NULL, TIMEOUT_S), 0);
}

/* Bad calls inside a group do not poison the valid calls around them. */
static int group_args_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  int fails = 0;
  float a[4] = {1, 2, 3, 4}, b[4];
  int peer = (rank + 1) % nranks, from = (rank + nranks - 1) % nranks;
  EXPECT_RC(fails, ncclSuccess, ncclGroupStart());
  EXPECT_INVALID(fails, ncclSend(a, 4, ncclFloat32, nranks, comm, NULL));
  EXPECT_INVALID(fails, ncclRecv(b, 4, (ncclDataType_t)-1, from, comm, NULL));
  ncclResult_t r1 = ncclSend(a, 4, ncclFloat32, peer, comm, NULL);
  ncclResult_t r2 = ncclRecv(b, 4, ncclFloat32, from, comm, NULL);
  ncclResult_t r3 = ncclGroupEnd();
  /* NCCL reports an invalid call made inside the group again at GroupEnd
   * and drops the group; a library may instead run the valid calls. Either
   * way the valid calls must not be lost or misdelivered, and the ranks must
   * stay in step. */
  if (r3 == ncclSuccess && (r1 != ncclSuccess || r2 != ncclSuccess)) {
    fprintf(stderr, "[rank %d] group ended fine but its valid send/recv "
                    "returned %s %s\n", rank, ncclGetErrorString(r1),
            ncclGetErrorString(r2));
    fails++;
  }
  if (r3 == ncclSuccess && (b[0] != 1 || b[3] != 4)) {
    fprintf(stderr, "[rank %d] grouped recv got %g %g\n", rank, (double)b[0],
            (double)b[3]);
    fails++;
  }
  fails += valid_calls(comm, rank, nranks, 700);
  return fails;
}

static void test_group_args(void)
{
  CU_ASSERT_EQUAL(harness_run(2, group_args_body, NULL, TIMEOUT_S), 0);
}

int main(void)
{
  harness_setup_env();
  if (CU_initialize_registry() != CUE_SUCCESS) return CU_get_error();
  CU_pSuite s = CU_add_suite("args", NULL, NULL);
  if (s == NULL) {
    CU_cleanup_registry();
    return CU_get_error();
  }
  CU_add_test(s, "ncclGetErrorString for every code", test_error_strings);
  CU_add_test(s, "ncclGetLastError(NULL) is not NULL", test_last_error_null);
  CU_add_test(s, "NULL output pointers", test_null_out_pointers);
  CU_add_test(s, "NULL communicator", test_null_comm);
  CU_add_test(s, "ncclCommInitRank/Config bad arguments", test_init_args);
  CU_add_test(s, "collectives: bad type/op/root/peer/buffer, nothing sent",
              test_collective_args);
  CU_add_test(s, "bad calls inside a group", test_group_args);
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failures = CU_get_number_of_failures();
  CU_cleanup_registry();
  return failures != 0;
}
