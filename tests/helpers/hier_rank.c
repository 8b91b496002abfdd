/*
 * One rank of the hierarchical all-reduce tests over the emulated WAN
 * (tests/wan/test_hier_wan.sh starts one of these per rank, each inside its
 * region's namespace).
 *
 *   RANK=r NRANKS=n GEOCCL_COMM_ID=host:port [EXPECT_REGIONS=k] \
 *     hier_rank matrix
 *   ... hier_rank loop SECONDS BYTES [all]
 *
 * The region comes from GEOCCL_REGION (geoccl-wan exec sets it); with more
 * than one region ncclAllReduce runs hierarchically (comm/coll/coll_hier.c).
 *
 * matrix: every data type x every op x in-place/out-of-place x counts
 *   {1, 2, 7, 4099}, then 262147 elements for float sum and int8 max, then a
 *   pre-multiplied float sum. Each result must equal the reference of
 *   tests/helpers/harness.c (within rounding where the harness calls it approximate),
 *   be bit-identical on every rank (harness_same_on_all_ranks), leave the
 *   send buffer alone and write nothing past the end of the output. Then
 *   geocclCommGetStats must show hierarchical calls and WAN bytes, and
 *   geocclCommGetRegion k regions when EXPECT_REGIONS=k is set. Prints one
 *   summary line; exits 0 when everything held, 1 otherwise.
 *
 * loop: all-reduces BYTES of floats (sum, out-of-place, result checked)
 *   until SECONDS have passed; with "all" after BYTES, each all-reduce is
 *   followed by a broadcast (root turning round the ranks), an all-gather,
 *   a reduce-scatter (int32 sum) and a send/recv ring of about BYTES each,
 *   every result exact (integers) and checked (other_ops). Every rank must issue the same number of
 *   calls, so the decision to stop travels in the data: element 0 of each
 *   rank's input is 1 once its own clock says stop, and all stop after the
 *   call whose element 0 sums to more than 0. Exits 0 after the last call;
 *   on a failed call prints
 *     rank R: error after X.XX s: <ncclGetErrorString> / <ncclGetLastError>
 *   (X counted from the start of the failing call), calls ncclCommAbort
 *   and exits 2. A wrong result or a failed init exits 1. The summary
 *   line ends "reconnects N, resent B" (geocclCommGetReconnects, every
 *   peer).
 *
 * calls N BYTES: N all-reduces of BYTES of floats (sum, out-of-place, every
 *   result checked exactly and the same on every rank); rank 0 prints per call
 *     rank 0: call I: T s, replans K, shares a/b/c, ended E
 *   (T: from the last rank's entry into the call to the last rank's return,
 *   on the host's monotonic clock, which the ranks share: they run on one
 *   host; geocclCommGetReplan; E: rank 0's wall clock
 *   when it returned, seconds since the epoch) and a last line "rank R: calls ok: ...".  With
 *   HIER_RANK_PAUSE_AT=i,j,... and HIER_RANK_PAUSE_DIR=D, rank 0 stops after
 *   call i, creates D/at-i and waits (up to 300 s) for D/go-i, so that a
 *   script can change the links before call i+1; the others wait in call
 *   i+1.  What the WAN changing under a job (tests/wan/test_replan.sh)
 *   drives.
 *
 * split: ncclCommSplit of the whole communicator (one color); the child
 *   must have the parent's regions without probing again (geocclTopology:
 *   inherited, probe time under 50 ms; the parent's link figures when the
 *   parent had them) and all-reduce 1 MiB right. Prints
 *     rank R: split: parent R1 regions (probe P s), child R2 regions ...
 *   exits 0 when all held.
 *
 * Ranks print "rank R: ..." lines; the script collects them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <geoccl.h>

#include "tests/helpers/harness.h"

#define GUARD 64 /* bytes checked past the end of outputs */

static int g_rank = -1, g_nranks = 0;

/* ------------------------------------------------------------------------ */
/* Setup                                                                    */
/* ------------------------------------------------------------------------ */

static int env_int(const char *name, int lo, int hi, int *out)
{
  const char *s = getenv(name);
  char *end;
  if (s == NULL || *s == '\0') {
    fprintf(stderr, "hier_rank: %s is not set\n", name);
    return -1;
  }
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "hier_rank: %s=%s: want an integer in %d..%d\n", name, s,
            lo, hi);
    return -1;
  }
  *out = (int)v;
  return 0;
}

/* The id only encodes GEOCCL_COMM_ID; rank 0 listens there. */
static ncclComm_t init_comm(void)
{
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  ncclResult_t r;
  if (getenv("GEOCCL_COMM_ID") == NULL) {
    fprintf(stderr, "rank %d: GEOCCL_COMM_ID=host:port is not set\n", g_rank);
    return NULL;
  }
  if ((r = ncclGetUniqueId(&id)) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclGetUniqueId: %s: %s\n", g_rank,
            ncclGetErrorString(r), ncclGetLastError(NULL));
    return NULL;
  }
  if ((r = ncclCommInitRank(&comm, g_nranks, id, g_rank)) != ncclSuccess) {
    fprintf(stderr, "rank %d: ncclCommInitRank (%d ranks, region '%s', "
                    "GEOCCL_COMM_ID=%s): %s: %s\n", g_rank, g_nranks,
            getenv("GEOCCL_REGION") ? getenv("GEOCCL_REGION") : "",
            getenv("GEOCCL_COMM_ID"), ncclGetErrorString(r),
            ncclGetLastError(NULL));
    return NULL;
  }
  return comm;
}

/* ------------------------------------------------------------------------ */
/* Matrix                                                                   */
/* ------------------------------------------------------------------------ */

/* Buffers with GUARD pattern bytes past the end. */
static void *galloc(size_t bytes)
{
  unsigned char *p = malloc(bytes + GUARD);
  if (p != NULL) harness_fill_bytes(p + bytes, GUARD, 0x5eed, (uint32_t)bytes);
  return p;
}

static int guard_ok(const void *p, size_t bytes)
{
  unsigned char g[GUARD];
  harness_fill_bytes(g, GUARD, 0x5eed, (uint32_t)bytes);
  return memcmp((const unsigned char *)p + bytes, g, GUARD) == 0;
}

struct tally {
  int cases, failed;
  unsigned long long allreduces; /* issued, all non-empty */
  int call_failed;               /* a call failed: ranks are out of step */
};

/* Reports a case's first problem; `call` says the ranks can no longer
 * continue in step. */
static void case_fail(struct tally *t, const char *name, const char *why,
                      int call)
{
  fprintf(stderr, "rank %d: FAIL %s: %s\n", g_rank, name, why);
  t->failed++;
  if (call) t->call_failed = 1;
}

/* Checks one finished all-reduce: reference, send buffer, guards and the
 * bits on every other rank (a collective, so every rank reaches it). */
static void check_case(struct tally *t, ncclComm_t comm, const char *name,
                       ncclDataType_t type, ncclRedOp_t op, size_t count,
                       const void *recv, const void *send, const void *orig,
                       const void *exp, int inplace)
{
  size_t nb = count * harness_type_size(type);
  char m[256];
  const char *why = NULL;
  if (harness_check(recv, exp, type, op, g_nranks, count, m, sizeof(m)))
    why = m;
  else if (!inplace && memcmp(send, orig, nb) != 0)
    why = "sendbuff was modified";
  else if (!guard_ok(recv, nb) || !guard_ok(send, nb))
    why = "wrote past the end of a buffer";
  int s = harness_same_on_all_ranks(comm, recv, nb);
  if (s < 0) {
    snprintf(m, sizeof(m), "hash all-gather failed: %s", ncclGetLastError(comm));
    case_fail(t, name, m, 1);
    return;
  }
  if (why == NULL && s > 0) why = "result is not bit-identical on every rank";
  if (why != NULL) case_fail(t, name, why, 0);
}

static void run_case(struct tally *t, ncclComm_t comm, ncclDataType_t type,
                     ncclRedOp_t op, int inplace, size_t count, uint32_t seed)
{
  size_t nb = count * harness_type_size(type);
  char name[160];
  unsigned char *send = galloc(nb), *recv = inplace ? send : galloc(nb);
  unsigned char *orig = malloc(nb), *exp = malloc(nb);
  snprintf(name, sizeof(name), "allreduce %s %s %s count=%zu",
           harness_type_name(type), harness_op_name(op),
           inplace ? "in-place" : "out-of-place", count);
  t->cases++;
  if (send == NULL || recv == NULL || orig == NULL || exp == NULL) {
    case_fail(t, name, "out of memory", 1);
    goto out;
  }
  harness_fill_input(send, type, op, g_nranks, g_rank, 0, count, seed);
  memcpy(orig, send, nb);
  if (!inplace) harness_fill_bytes(recv, nb, seed, 0xdead);
  harness_fill_expected(exp, type, op, g_nranks, 0, count, seed);
  ncclResult_t r = ncclAllReduce(send, recv, count, type, op, comm, NULL);
  if (r != ncclSuccess) {
    char m[512];
    snprintf(m, sizeof(m), "ncclAllReduce: %s: %s", ncclGetErrorString(r),
             ncclGetLastError(comm));
    case_fail(t, name, m, 1);
    goto out;
  }
  t->allreduces++;
  check_case(t, comm, name, type, op, count, recv, send, orig, exp, inplace);
out:
  if (!inplace) free(recv);
  free(send);
  free(orig);
  free(exp);
}

/* Powers of two times small integers: every product and sum is exact. */
static float premul_scalar(int rank) { return rank % 3 == 0 ? 0.5f : rank % 3 == 1 ? 2.0f : 4.0f; }
static float premul_input(int rank, size_t i)
{
  return (float)((int)((i * 5 + (size_t)rank * 11) % 41) - 20);
}

static void run_premul(struct tally *t, ncclComm_t comm, int inplace,
                       size_t count)
{
  size_t nb = count * sizeof(float);
  char name[160];
  float scalar = premul_scalar(g_rank);
  ncclRedOp_t op;
  float *send = galloc(nb), *recv = inplace ? send : galloc(nb);
  float *orig = malloc(nb), *exp = malloc(nb);
  snprintf(name, sizeof(name), "allreduce float premulsum %s count=%zu",
           inplace ? "in-place" : "out-of-place", count);
  t->cases++;
  if (send == NULL || recv == NULL || orig == NULL || exp == NULL) {
    case_fail(t, name, "out of memory", 1);
    goto out;
  }
  for (size_t i = 0; i < count; i++) {
    float sum = 0;
    for (int q = 0; q < g_nranks; q++) sum += premul_scalar(q) * premul_input(q, i);
    send[i] = orig[i] = premul_input(g_rank, i);
    exp[i] = sum;
  }
  if (!inplace) harness_fill_bytes(recv, nb, 77, 0xdead);
  ncclResult_t r = ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32,
                                            ncclScalarHostImmediate, comm);
  if (r != ncclSuccess) {
    char m[512];
    snprintf(m, sizeof(m), "ncclRedOpCreatePreMulSum: %s: %s",
             ncclGetErrorString(r), ncclGetLastError(comm));
    case_fail(t, name, m, 1);
    goto out;
  }
  r = ncclAllReduce(send, recv, count, ncclFloat32, op, comm, NULL);
  if (r != ncclSuccess) {
    char m[512];
    snprintf(m, sizeof(m), "ncclAllReduce: %s: %s", ncclGetErrorString(r),
             ncclGetLastError(comm));
    case_fail(t, name, m, 1);
    ncclRedOpDestroy(op, comm);
    goto out;
  }
  t->allreduces++;
  /* exact sums: compared as a plain float sum, byte for byte */
  check_case(t, comm, name, ncclFloat32, ncclSum, count, recv, send, orig,
             exp, inplace);
  if ((r = ncclRedOpDestroy(op, comm)) != ncclSuccess) {
    char m[256];
    snprintf(m, sizeof(m), "ncclRedOpDestroy: %s", ncclGetErrorString(r));
    case_fail(t, name, m, 0);
  }
out:
  if (!inplace) free(recv);
  free(send);
  free(orig);
  free(exp);
}

/* The region map as the communicator sees it; label gets a copy of the
 * region's name (the library's string lives only as long as comm). */
static int check_region(ncclComm_t comm, int *nregions, int *region,
                        char *label_out, size_t label_len)
{
  const char *name = NULL;
  int k = -1, g = -1, lr = -1, sz = -1, want_k = 0;
  const char *label = getenv("GEOCCL_REGION");
  ncclResult_t r = geocclCommGetRegion(comm, &k, &g, &lr, &sz, &name);
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: FAIL geocclCommGetRegion: %s: %s\n", g_rank,
            ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  *nregions = k;
  *region = g;
  snprintf(label_out, label_len, "%s", name != NULL ? name : "(null)");
  if (getenv("EXPECT_REGIONS") != NULL &&
      env_int("EXPECT_REGIONS", 1, 64, &want_k) == 0 && k != want_k) {
    fprintf(stderr, "rank %d: FAIL geocclCommGetRegion says %d regions, "
                    "expected %d\n", g_rank, k, want_k);
    return 1;
  }
  if (label != NULL && (name == NULL || strcmp(name, label) != 0)) {
    fprintf(stderr, "rank %d: FAIL geocclCommGetRegion names the region '%s', "
                    "GEOCCL_REGION is '%s'\n", g_rank, label_out, label);
    return 1;
  }
  return 0;
}

static int mode_matrix(void)
{
  static const size_t counts[] = {1, 2, 7, 4099};
  static const size_t premul_counts[] = {1, 7, 4099};
  const size_t big = 262147;
  struct tally t = {0, 0, 0, 0};
  uint32_t seed = 1;
  int nregions = 0, region = -1, bad = 0;
  char label[64] = "";
  double t0 = harness_now(), big_s = 0;

  ncclComm_t comm = init_comm();
  if (comm == NULL) return 1;
  bad += check_region(comm, &nregions, &region, label, sizeof(label));
  if (geocclCommResetStats(comm) != ncclSuccess) bad++;

  for (int ty = 0; ty < (int)ncclNumTypes && !t.call_failed; ty++)
    for (int op = 0; op < (int)ncclNumOps && !t.call_failed; op++)
      for (int ip = 0; ip < 2 && !t.call_failed; ip++)
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]) && !t.call_failed; ci++)
          run_case(&t, comm, (ncclDataType_t)ty, (ncclRedOp_t)op, ip,
                   counts[ci], seed++);
  for (int ip = 0; ip < 2 && !t.call_failed; ip++) {
    double s = harness_now();
    run_case(&t, comm, ncclFloat32, ncclSum, ip, big, seed++);
    big_s += harness_now() - s;
    if (!t.call_failed) run_case(&t, comm, ncclInt8, ncclMax, ip, big, seed++);
  }
  for (int ip = 0; ip < 2 && !t.call_failed; ip++)
    for (size_t ci = 0; ci < sizeof(premul_counts) / sizeof(premul_counts[0]) && !t.call_failed; ci++)
      run_premul(&t, comm, ip, premul_counts[ci]);

  int local_peers = -1;
  if (geocclCommGetLocalPeers(comm, &local_peers) != ncclSuccess) bad++;
  geocclStats st;
  memset(&st, 0, sizeof(st));
  ncclResult_t r = geocclCommGetStats(comm, &st);
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: FAIL geocclCommGetStats: %s: %s\n", g_rank,
            ncclGetErrorString(r), ncclGetLastError(comm));
    bad++;
  } else if (!t.call_failed && (st.callsHier == 0 || st.bytesWan == 0)) {
    fprintf(stderr, "rank %d: FAIL stats after %llu all-reduces: %llu "
                    "hierarchical calls, %llu WAN bytes (both must be > 0)\n",
            g_rank, t.allreduces, st.callsHier, st.bytesWan);
    bad++;
  }
  if (t.call_failed) {
    if ((r = ncclCommAbort(comm)) != ncclSuccess)
      fprintf(stderr, "rank %d: ncclCommAbort: %s\n", g_rank, ncclGetErrorString(r));
  } else if ((r = ncclCommDestroy(comm)) != ncclSuccess) {
    fprintf(stderr, "rank %d: FAIL ncclCommDestroy: %s\n", g_rank,
            ncclGetErrorString(r));
    bad++;
  }
  int ok = t.failed == 0 && bad == 0;
  printf("rank %d: matrix %s: region %d '%s' of %d, %d cases, %d failed; "
         "%llu all-reduces, stats %llu hierarchical, %llu flat, WAN %llu B, "
         "intra %llu B; float sum x%zu %.1f ms avg; %.1f s; local peers %d\n",
         g_rank, ok ? "ok" : "FAILED", region, label, nregions,
         t.cases, t.failed + bad, t.allreduces, st.callsHier, st.callsFlat,
         st.bytesWan, st.bytesIntra, big, big_s * 1000 / 2,
         harness_now() - t0, local_peers);
  fflush(stdout);
  return ok ? 0 : 1;
}

/* ------------------------------------------------------------------------ */
/* Loop                                                                     */
/* ------------------------------------------------------------------------ */

/* The value element i of rank r's part has in call k: exact in int32. */
static int32_t op_val(int r, size_t i, unsigned long k)
{
  return (int32_t)((r + 1) * 1000 + (int)((i * 7 + k) % 997));
}

/* One round of broadcast, all-gather, reduce-scatter and a send/recv ring
 * on n = BYTES/4/nranks-element parts (buf: nranks * n int32, out as
 * large), call k.  0 when all were exact; -1 (error printed) when a call
 * failed; 1 on a wrong value. */
static int other_ops(ncclComm_t comm, int32_t *buf, int32_t *out, size_t n,
                     unsigned long k)
{
  const int R = g_nranks, me = g_rank, root = (int)(k % (unsigned long)R);
  const char *what = "broadcast";
  ncclResult_t r;
  size_t i;
  int q;

  for (i = 0; i < n; i++) buf[i] = op_val(me, i, k);
  r = ncclBroadcast(buf, out, n, ncclInt32, root, comm, NULL);
  if (r != ncclSuccess) goto failed;
  for (i = 0; i < n; i++)
    if (out[i] != op_val(root, i, k)) goto wrong;

  what = "all-gather";
  r = ncclAllGather(buf, out, n, ncclInt32, comm, NULL);
  if (r != ncclSuccess) goto failed;
  for (q = 0; q < R; q++)
    for (i = 0; i < n; i++)
      if (out[(size_t)q * n + i] != op_val(q, i, k)) goto wrong;

  what = "reduce-scatter";
  for (q = 0; q < R; q++)
    for (i = 0; i < n; i++) buf[(size_t)q * n + i] = op_val(me, (size_t)q * n + i, k);
  r = ncclReduceScatter(buf, out, n, ncclInt32, ncclSum, comm, NULL);
  if (r != ncclSuccess) goto failed;
  for (i = 0; i < n; i++) {
    int64_t want = 0;
    for (q = 0; q < R; q++) want += op_val(q, (size_t)me * n + i, k);
    if (out[i] != (int32_t)want) goto wrong;
  }

  what = "send/recv ring";
  for (i = 0; i < n; i++) buf[i] = op_val(me, i, k + 1);
  if ((r = ncclGroupStart()) != ncclSuccess) goto failed;
  ncclResult_t rs = ncclSend(buf, n, ncclInt32, (me + 1) % R, comm, NULL);
  ncclResult_t rr = ncclRecv(out, n, ncclInt32, (me + R - 1) % R, comm, NULL);
  r = ncclGroupEnd();
  if (r == ncclSuccess) r = rs != ncclSuccess ? rs : rr;
  if (r != ncclSuccess) goto failed;
  for (i = 0; i < n; i++)
    if (out[i] != op_val((me + R - 1) % R, i, k + 1)) goto wrong;
  return 0;

failed:
  printf("rank %d: error in %s of call %lu: %s / %s\n", g_rank, what, k,
         ncclGetErrorString(r), ncclGetLastError(comm));
  fflush(stdout);
  return -1;
wrong:
  printf("rank %d: FAIL wrong result in %s of call %lu\n", g_rank, what, k);
  fflush(stdout);
  return 1;
}

static int mode_loop(double seconds, size_t bytes, int all_ops)
{
  const size_t count = bytes / sizeof(float) > 2 ? bytes / sizeof(float) : 2;
  const size_t nb = count * sizeof(float);
  const uint32_t seed = 4242;
  float *send = malloc(nb), *recv = malloc(nb), *exp = malloc(nb);
  unsigned long calls = 0;
  double slowest = 0;
  int rc = 0;
  const size_t part = bytes / sizeof(int32_t) / (size_t)g_nranks > 1
                          ? bytes / sizeof(int32_t) / (size_t)g_nranks : 1;
  int32_t *obuf = malloc(part * (size_t)g_nranks * sizeof(int32_t));
  int32_t *oout = malloc(part * (size_t)g_nranks * sizeof(int32_t));
  if (send == NULL || recv == NULL || exp == NULL || obuf == NULL || oout == NULL) {
    fprintf(stderr, "rank %d: out of memory for %zu bytes\n", g_rank, nb);
    rc = 1;
    goto out;
  }
  harness_fill_input(send, ncclFloat32, ncclSum, g_nranks, g_rank, 0, count, seed);
  harness_fill_expected(exp, ncclFloat32, ncclSum, g_nranks, 0, count, seed);

  const double i0 = harness_now();
  ncclComm_t comm = init_comm();
  if (comm == NULL) {
    rc = 1;
    goto out;
  }
  /* A test that breaks something mid-call waits for this line from every
   * rank (tests/wan/test_hier_wan.sh, the cut-off). */
  printf("rank %d: in the all-reduce loop, init took %.2f s\n", g_rank, harness_now() - i0);
  fflush(stdout);
  const double t0 = harness_now();
  for (;;) {
    double start = harness_now();
    send[0] = start - t0 >= seconds ? 1.0f : 0.0f;
    ncclResult_t r = ncclAllReduce(send, recv, count, ncclFloat32, ncclSum,
                                   comm, NULL);
    double took = harness_now() - start;
    if (r != ncclSuccess) {
      printf("rank %d: error after %.2f s: %s / %s\n", g_rank, took,
             ncclGetErrorString(r), ncclGetLastError(comm));
      fflush(stdout);
      double a0 = harness_now();
      ncclResult_t ra = ncclCommAbort(comm);
      printf("rank %d: ncclCommAbort returned %s after %.2f s (%lu calls had "
             "succeeded)\n", g_rank, ncclGetErrorString(ra),
             harness_now() - a0, calls);
      fflush(stdout);
      rc = 2;
      goto out;
    }
    calls++;
    if (recv[0] < 0 || recv[0] > (float)g_nranks ||
        memcmp(recv + 1, exp + 1, nb - sizeof(float)) != 0) {
      char m[256];
      exp[0] = recv[0];
      harness_check(recv, exp, ncclFloat32, ncclSum, g_nranks, count, m, sizeof(m));
      printf("rank %d: FAIL wrong result in call %lu: %s (stop flag sum %g)\n",
             g_rank, calls, m, (double)recv[0]);
      fflush(stdout);
      ncclCommDestroy(comm);
      rc = 1;
      goto out;
    }
    if (all_ops) {
      start = harness_now();
      int o = other_ops(comm, obuf, oout, part, calls);
      if (o < 0) {
        printf("rank %d: error after %.2f s (in the other collectives)\n", g_rank,
               harness_now() - start);
        ncclCommAbort(comm);
        rc = 2;
        goto out;
      }
      if (o > 0) {
        ncclCommDestroy(comm);
        rc = 1;
        goto out;
      }
      took += harness_now() - start;
    }
    if (took > slowest) slowest = took;
    if (recv[0] > 0) break;
  }
  double el = harness_now() - t0;
  uint64_t reconnects = 0, resent = 0;
  geocclCommGetReconnects(comm, -1, &reconnects, &resent);
  printf("rank %d: loop ok: %lu all-reduces%s of %zu B in %.2f s (%.1f MB/s "
         "algbw, slowest call%s %.2f s); reconnects %llu, resent %llu\n", g_rank,
         calls, all_ops ? " (+ broadcast, all-gather, reduce-scatter, send/recv)" : "",
         nb, el, (double)nb * (double)calls / el / 1e6, all_ops ? " round" : "", slowest,
         (unsigned long long)reconnects, (unsigned long long)resent);
  fflush(stdout);
  if (ncclCommDestroy(comm) != ncclSuccess) {
    printf("rank %d: FAIL ncclCommDestroy\n", g_rank);
    rc = 1;
  }
out:
  free(send);
  free(recv);
  free(exp);
  free(obuf);
  free(oout);
  return rc;
}

static int paused_after(unsigned long call)
{
  const char *at = getenv("HIER_RANK_PAUSE_AT"), *dir = getenv("HIER_RANK_PAUSE_DIR");
  if (g_rank != 0 || at == NULL || dir == NULL) return 0;
  for (const char *p = at; *p;) {
    char *end;
    unsigned long k = strtoul(p, &end, 10);
    if (end == p) break;
    if (k == call) {
      char path[512];
      snprintf(path, sizeof(path), "%s/at-%lu", dir, call);
      FILE *f = fopen(path, "w");
      if (f) fclose(f);
      snprintf(path, sizeof(path), "%s/go-%lu", dir, call);
      for (int i = 0; i < 3000 && access(path, F_OK) != 0; i++) usleep(100000);
      return 1;
    }
    p = *end == ',' ? end + 1 : end;
  }
  return 0;
}

static int mode_calls(unsigned long n, size_t bytes)
{
  const size_t count = bytes / sizeof(float) > 2 ? bytes / sizeof(float) : 2;
  const size_t nb = count * sizeof(float);
  float *send = malloc(nb), *recv = malloc(nb), *exp = malloc(nb);
  int rc = 0;
  double total = 0;
  if (send == NULL || recv == NULL || exp == NULL) {
    fprintf(stderr, "rank %d: out of memory for %zu bytes\n", g_rank, nb);
    rc = 1;
    goto out;
  }
  harness_fill_input(send, ncclFloat32, ncclSum, g_nranks, g_rank, 0, count, 99);
  harness_fill_expected(exp, ncclFloat32, ncclSum, g_nranks, 0, count, 99);
  ncclComm_t comm = init_comm();
  if (comm == NULL) {
    rc = 1;
    goto out;
  }
  int R = 0;
  geocclCommGetRegion(comm, &R, NULL, NULL, NULL, NULL);
  for (unsigned long c = 1; c <= n; c++) {
    memset(recv, 0, nb);
    double start = harness_now();
    ncclResult_t r = ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL);
    double took = harness_now() - start;
    total += took;
    if (r != ncclSuccess) {
      printf("rank %d: error in call %lu after %.2f s: %s / %s\n", g_rank, c, took,
             ncclGetErrorString(r), ncclGetLastError(comm));
      fflush(stdout);
      ncclCommAbort(comm);
      rc = 2;
      goto out;
    }
    char m[256];
    if (harness_check(recv, exp, ncclFloat32, ncclSum, g_nranks, count, m, sizeof(m)) ||
        harness_same_on_all_ranks(comm, recv, nb) != 0) {
      printf("rank %d: FAIL wrong result in call %lu: %s\n", g_rank, c, m);
      fflush(stdout);
      ncclCommAbort(comm);
      rc = 1;
      goto out;
    }
    /* The call's time: from the last rank's entry to the last rank's
     * return (a region whose uplink is slow finishes after the others).
     * The ranks share this host's monotonic clock.  Not each rank's own
     * time: the checks above end at different times on different ranks
     * (6 ranks checking 64 MiB each on 2 cores: tens of milliseconds
     * apart), and a rank that enters early waits for the last, which is
     * the harness's time, not the call's. */
    double span[2] = {start, start + took}, last[2] = {start, start + took};
    if (ncclAllReduce(span, last, 2, ncclFloat64, ncclMax, comm, NULL) != ncclSuccess) {
      printf("rank %d: error in the max of call %lu's times: %s\n", g_rank, c,
             ncclGetLastError(comm));
      ncclCommAbort(comm);
      rc = 2;
      goto out;
    }
    int replans = 0;
    double sh[64] = {0};
    const char *why = "";
    geocclCommGetReplan(comm, &replans, sh, &why);
    if (g_rank == 0) {
      char line[512];
      int o = 0;
      for (int q = 0; q < R && q < 64 && o < (int)sizeof(line) - 16; q++)
        o += snprintf(line + o, sizeof(line) - (size_t)o, "%s%.3f", q ? "/" : "", sh[q]);
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      printf("rank 0: call %lu: %.3f s, replans %d, shares %s, ended %.3f%s%s\n", c,
             last[1] - last[0],
             replans, line, (double)ts.tv_sec + ts.tv_nsec * 1e-9, why[0] ? ", " : "", why);
      fflush(stdout);
    }
    paused_after(c);
  }
  geocclStats st;
  memset(&st, 0, sizeof(st));
  geocclCommGetStats(comm, &st);
  printf("rank %d: calls ok: %lu all-reduces of %zu B, %.2f s in calls, %.1f MB sent to other "
         "regions\n", g_rank, n, nb, total, (double)st.bytesWan / 1e6);
  fflush(stdout);
  if (ncclCommDestroy(comm) != ncclSuccess) {
    printf("rank %d: FAIL ncclCommDestroy\n", g_rank);
    rc = 1;
  }
out:
  free(send);
  free(recv);
  free(exp);
  return rc;
}

static int usage(void)
{
  fprintf(stderr, "usage: RANK=r NRANKS=n GEOCCL_COMM_ID=host:port "
                  "[EXPECT_REGIONS=k] hier_rank matrix\n"
                  "       ... hier_rank loop SECONDS BYTES [all]\n"
                  "       ... hier_rank split\n"
                  "       ... hier_rank calls N BYTES\n");
  return 1;
}

static int mode_split(void)
{
  ncclComm_t comm = init_comm(), child = NULL;
  geocclTopology pt, ct;
  int bad = 0, pk = 0, ck = 0;
  if (comm == NULL) return 1;
  ncclResult_t r = ncclCommSplit(comm, 0, g_rank, &child, NULL);
  if (r != ncclSuccess || child == NULL) {
    fprintf(stderr, "rank %d: ncclCommSplit: %s: %s\n", g_rank, ncclGetErrorString(r),
            ncclGetLastError(comm));
    ncclCommAbort(comm);
    return 1;
  }
  geocclCommGetTopology(comm, &pt);
  geocclCommGetTopology(child, &ct);
  geocclCommGetRegion(comm, &pk, NULL, NULL, NULL, NULL);
  geocclCommGetRegion(child, &ck, NULL, NULL, NULL, NULL);
  double pe[64] = {0}, ce[64] = {0};
  if (pk <= 64 && ck <= 64) {
    geocclCommGetLinks(comm, NULL, NULL, pe, NULL);
    geocclCommGetLinks(child, NULL, NULL, ce, NULL);
  }
  printf("rank %d: split: parent %d regions (probe %.3f s, bandwidth measured %d), child %d "
         "regions (probe %.3f s, inherited %d), egress of region 0: parent %.1f, child %.1f "
         "Mbit/s\n", g_rank, pk, pt.secProbe, pt.bwMeasured, ck, ct.secProbe, ct.inherited,
         pe[0], ce[0]);
  if (ck != pk || !ct.inherited || ct.rttMeasured || ct.bwMeasured || ct.secProbe > 0.05 ||
      (pt.bwMeasured && ce[0] != pe[0])) {
    fprintf(stderr, "rank %d: FAIL the split child did not take over its parent's topology\n",
            g_rank);
    bad = 1;
  }
  size_t count = 262144;
  float *buf = malloc(count * sizeof(float)), *exp = malloc(count * sizeof(float));
  char m[256];
  harness_fill_input(buf, ncclFloat32, ncclSum, g_nranks, g_rank, 0, count, 7);
  harness_fill_expected(exp, ncclFloat32, ncclSum, g_nranks, 0, count, 7);
  r = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, child, NULL);
  if (r != ncclSuccess || harness_check(buf, exp, ncclFloat32, ncclSum, g_nranks, count, m,
                                        sizeof(m))) {
    fprintf(stderr, "rank %d: FAIL all-reduce on the split child: %s\n", g_rank,
            r != ncclSuccess ? ncclGetLastError(child) : m);
    bad = 1;
  }
  free(buf);
  free(exp);
  ncclCommDestroy(child);
  ncclCommDestroy(comm);
  return bad;
}

int main(int argc, char **argv)
{
  if (argc < 2) return usage();
  if (env_int("RANK", 0, HARNESS_MAX_RANKS - 1, &g_rank) != 0 ||
      env_int("NRANKS", 1, HARNESS_MAX_RANKS, &g_nranks) != 0)
    return usage();
  if (g_rank >= g_nranks) {
    fprintf(stderr, "hier_rank: RANK=%d is not below NRANKS=%d\n", g_rank, g_nranks);
    return 1;
  }
  if (strcmp(argv[1], "matrix") == 0 && argc == 2) return mode_matrix();
  if (strcmp(argv[1], "split") == 0 && argc == 2) return mode_split();
  if (strcmp(argv[1], "loop") == 0 && (argc == 4 || (argc == 5 && strcmp(argv[4], "all") == 0))) {
    char *e1, *e2;
    double secs = strtod(argv[2], &e1);
    unsigned long long bytes = strtoull(argv[3], &e2, 10);
    if (*e1 != '\0' || *e2 != '\0' || secs < 0 || bytes == 0) return usage();
    return mode_loop(secs, (size_t)bytes, argc == 5);
  }
  if (strcmp(argv[1], "calls") == 0 && argc == 4) {
    char *e1, *e2;
    unsigned long n = strtoul(argv[2], &e1, 10);
    unsigned long long bytes = strtoull(argv[3], &e2, 10);
    if (*e1 != '\0' || *e2 != '\0' || n == 0 || bytes == 0) return usage();
    return mode_calls(n, (size_t)bytes);
  }
  return usage();
}
