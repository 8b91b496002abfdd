/*
 * Connections opened where needed (docs/transport.md, "Which connections
 * are opened when").
 *
 * With GEOCCL_CONNECT=lazy a rank opens at init only the connections its
 * plans use (ring neighbours here: one region on one host) and any other
 * on first use.  The checks:
 *   - init holds few descriptors: the count in /proc/self/fd grows by at
 *     most what two neighbours' streams, the listener and the wake-up
 *     descriptor take, where GEOCCL_CONNECT=all takes one per stream of
 *     every peer;
 *   - a first send/recv between ranks that are not neighbours, either rank
 *     the lower, is right; so is an all-to-all of every pair after it;
 *   - a first use with a peer that died after init is an error within
 *     GEOCCL_TIMEOUT + 5 s, never a hang: the higher rank dials and is
 *     refused, the lower one waits for a dial that never comes;
 *   - after init a stranger's hello for a slot not connected yet (claiming
 *     the rank that will dial it, without the secret) gets no ack, and the
 *     real first use of that pair works.
 *
 * With --bench N it is the init benchmark instead (tests/perf/bench_init.sh):
 * N ranks forked on this host, each times its ncclCommInitRank and counts
 * its descriptors after it, one all-reduce is checked, and one line says
 * the slowest init, the job's init (first fork to last rank ready) and the
 * descriptors per rank.  --bench N alltoall adds a checked all-to-all of
 * every pair (the first use of most) and the descriptors after it.
 */
#define _GNU_SOURCE
#include "config.h"
#include "comm/core/comm.h"
#include "comm/transport/net_tcp_internal.h"

#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "geoccl.h"
#include "tests/helpers/harness.h"

#define LIB_TIMEOUT_S 5
#define COUNT 8192 /* 32 KiB: above GEOCCL_DIRECT_MAX, a ring (neighbours only) */
#define MAX_RANKS 1024

typedef struct {
  int nranks;
  int victim;                   /* death test: the rank that exits; -1 none */
  double t_start;
  double init_s[MAX_RANKS];
  double ready_at[MAX_RANKS];   /* harness_now() when init returned */
  int fds_before[MAX_RANKS], fds_init[MAX_RANKS], fds_after[MAX_RANKS];
  int bad[MAX_RANKS];           /* wrong results */
  double err_s[MAX_RANKS];      /* death test: seconds until the error; -1 none */
  volatile int ready, phase;    /* stranger test: rank 0's address is in addr0; the
                                 * stranger has tried */
  geoSockAddr addr0;
  int taken;                    /* the stranger's hello: 1 acknowledged, 0 closed, -1 none */
} shared_t;

static int count_fds(void)
{
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  if (d == NULL) return -1;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own */
}

static int allreduce_ok(ncclComm_t comm, int rank, int nranks)
{
  float *in = malloc(COUNT * sizeof(float)), *out = malloc(COUNT * sizeof(float));
  int bad = in == NULL || out == NULL;
  for (int i = 0; !bad && i < COUNT; i++) in[i] = (float)(rank + 1 + i % 7);
  if (!bad && ncclAllReduce(in, out, COUNT, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess) {
    fprintf(stderr, "rank %d: all-reduce failed: %s\n", rank, ncclGetLastError(comm));
    bad = 1;
  }
  for (int i = 0; !bad && i < COUNT; i++) {
    float want = (float)nranks * (nranks + 1) / 2 + (float)nranks * (i % 7);
    if (out[i] != want) {
      fprintf(stderr, "rank %d: all-reduce element %d is %g, not %g\n", rank, i, out[i], want);
      bad = 1;
    }
  }
  free(in);
  free(out);
  return bad;
}

/* Send COUNT ints to `to` and receive COUNT from `from` (either may be -1)
 * in one group; 0 when what came is from's pattern. */
static ncclResult_t exchange(ncclComm_t comm, int rank, int to, int from, int *bad)
{
  int *s = malloc(COUNT * sizeof(int)), *r = malloc(COUNT * sizeof(int));
  ncclResult_t res = ncclSystemError;
  if (s == NULL || r == NULL) goto out;
  for (int i = 0; i < COUNT; i++) s[i] = rank * 100000 + i;
  ncclGroupStart();
  res = ncclSuccess;
  if (to >= 0) res = ncclSend(s, COUNT, ncclInt32, to, comm, NULL);
  if (res == ncclSuccess && from >= 0) res = ncclRecv(r, COUNT, ncclInt32, from, comm, NULL);
  ncclResult_t g = ncclGroupEnd();
  if (res == ncclSuccess) res = g;
  for (int i = 0; res == ncclSuccess && from >= 0 && i < COUNT; i++)
    if (r[i] != from * 100000 + i) {
      fprintf(stderr, "rank %d: element %d from rank %d is %d\n", rank, i, from, r[i]);
      *bad = 1;
      break;
    }
out:
  free(s);
  free(r);
  return res;
}

/* All pairs: every rank sends a block to every other (the first use of
 * most pairs). */
static int alltoall_ok(ncclComm_t comm, int rank, int n)
{
  int *s = malloc((size_t)n * 64 * sizeof(int)), *r = malloc((size_t)n * 64 * sizeof(int));
  int bad = s == NULL || r == NULL;
  for (int i = 0; !bad && i < n * 64; i++) s[i] = rank * 100000 + i;
  ncclGroupStart();
  for (int k = 1; !bad && k < n; k++) {
    int p = (rank + k) % n, q = (rank + n - k) % n;
    bad |= ncclSend(s + p * 64, 64, ncclInt32, p, comm, NULL) != ncclSuccess;
    bad |= ncclRecv(r + q * 64, 64, ncclInt32, q, comm, NULL) != ncclSuccess;
  }
  bad |= ncclGroupEnd() != ncclSuccess;
  if (bad) fprintf(stderr, "rank %d: all-to-all failed: %s\n", rank, ncclGetLastError(comm));
  for (int q = 0; !bad && q < n; q++)
    for (int i = 0; q != rank && i < 64; i++)
      if (r[q * 64 + i] != q * 100000 + rank * 64 + i) {
        fprintf(stderr, "rank %d: all-to-all element %d from %d wrong\n", rank, i, q);
        bad = 1;
        break;
      }
  free(s);
  free(r);
  return bad;
}

static int init_rank(shared_t *sh, int rank, int nranks, const ncclUniqueId *id,
                     ncclComm_t *comm)
{
  sh->fds_before[rank] = count_fds();
  double t = harness_now();
  ncclResult_t res = ncclCommInitRank(comm, nranks, *id, rank);
  sh->ready_at[rank] = harness_now();
  sh->init_s[rank] = sh->ready_at[rank] - t;
  if (res != ncclSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  sh->fds_init[rank] = count_fds();
  return 0;
}

/* The lazy test: init, a first send/recv off the ring, all-to-all. */
static int lazy_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  shared_t *sh = arg;
  ncclComm_t comm;
  int bad = 0;
  if (init_rank(sh, rank, nranks, id, &comm)) return 1;
  bad |= allreduce_ok(comm, rank, nranks);
  /* 0 <-> n/2 both ways; 1 sends to n/2 + 1, which only receives. */
  int half = nranks / 2;
  ncclResult_t r = ncclSuccess;
  if (rank == 0 || rank == half) r = exchange(comm, rank, rank ? 0 : half, rank ? 0 : half, &bad);
  else if (rank == 1) r = exchange(comm, rank, half + 1, -1, &bad);
  else if (rank == half + 1) r = exchange(comm, rank, -1, 1, &bad);
  if (r != ncclSuccess) {
    fprintf(stderr, "rank %d: first-use send/recv failed: %s\n", rank, ncclGetLastError(comm));
    bad = 1;
  }
  bad |= allreduce_ok(comm, rank, nranks);
  bad |= alltoall_ok(comm, rank, nranks);
  sh->fds_after[rank] = count_fds();
  sh->bad[rank] = bad;
  if (ncclCommDestroy(comm) != ncclSuccess) bad = 1;
  return bad;
}

static shared_t *new_shared(int nranks)
{
  shared_t *sh = harness_shared_alloc(sizeof(*sh));
  if (sh != NULL) {
    sh->nranks = nranks;
    sh->victim = -1;
  }
  return sh;
}

/* Descriptors init may take at n ranks: 2 streams to each ring neighbour
 * and to each partner of the host segment's binomial tree (log2 n), the
 * listener, wake-up, segment and a few of the library's own. */
static int init_bound(int n)
{
  int lg = 0;
  while ((1 << lg) < n) lg++;
  return 2 * (2 + lg) + 6;
}

static void test_lazy(void)
{
  const int n = 16;
  setenv("GEOCCL_CONNECT", "lazy", 1);
  shared_t *sh = new_shared(n);
  CU_ASSERT_FATAL(sh != NULL);
  CU_ASSERT_EQUAL(harness_run_noinit(n, lazy_body, sh, 120), 0);
  /* Two neighbours' streams (GEOCCL_NSTREAMS=2), the listener, the wake-up
   * descriptor, and a few of the library's own (logger, root); the host
   * segment's set-up (comm/intra/hostseg_setup.c) adds its binomial tree's
   * partners, log2(n) of them at most (4 here, 5 at 32 ranks), and the
   * segment's own descriptor: see init_bound().  All of them held at once
   * would be 2 * 15 connections. */
  for (int r = 0; r < n; r++) {
    int grew = sh->fds_init[r] - sh->fds_before[r];
    if (grew > init_bound(n))
      fprintf(stderr, "rank %d: init took %d descriptors (bound %d)\n", r, grew, init_bound(n));
    CU_ASSERT(grew <= init_bound(n));
    CU_ASSERT(sh->fds_after[r] - sh->fds_before[r] >= 2 * (n - 1));
    CU_ASSERT_EQUAL(sh->bad[r], 0);
  }
  unsetenv("GEOCCL_CONNECT");
  harness_shared_free(sh, sizeof(*sh));
}

/* The default: up to 16 ranks every pair at init, beyond only the plans'. */
static void test_auto(void)
{
  const int n = 32;
  shared_t *sh = new_shared(n);
  CU_ASSERT_FATAL(sh != NULL);
  CU_ASSERT_EQUAL(harness_run_noinit(n, lazy_body, sh, 240), 0);
  for (int r = 0; r < n; r++) {
    int grew = sh->fds_init[r] - sh->fds_before[r];
    if (grew > init_bound(n))
      fprintf(stderr, "rank %d: init took %d descriptors (bound %d)\n", r, grew, init_bound(n));
    CU_ASSERT(grew <= init_bound(n));
    CU_ASSERT_EQUAL(sh->bad[r], 0);
  }
  harness_shared_free(sh, sizeof(*sh));
}

/* The victim leaves after init; rank lo < victim and hi > victim, neither
 * its neighbour, then ask it for a message. */
static int death_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  shared_t *sh = arg;
  ncclComm_t comm;
  int bad = 0;
  sh->err_s[rank] = -1;
  if (init_rank(sh, rank, nranks, id, &comm)) return 1;
  bad |= allreduce_ok(comm, rank, nranks);
  if (rank == sh->victim) _exit(0);
  int lo = sh->victim - 3, hi = sh->victim + 3;
  if (rank == lo || rank == hi) {
    usleep(200 * 1000); /* let it go */
    double t = harness_now();
    ncclResult_t r = exchange(comm, rank, sh->victim, sh->victim, &bad);
    if (r == ncclSuccess) {
      fprintf(stderr, "rank %d: a send/recv with the dead rank %d succeeded\n", rank,
              sh->victim);
      bad = 1;
    } else {
      sh->err_s[rank] = harness_now() - t;
      const char *text = ncclGetLastError(comm);
      char want[16];
      snprintf(want, sizeof(want), "rank %d", sh->victim);
      if (strstr(text, want) == NULL) {
        fprintf(stderr, "rank %d: the error does not name rank %d: %s\n", rank, sh->victim,
                text);
        bad = 1;
      }
    }
  }
  ncclCommAbort(comm);
  return bad;
}

static void test_death(void)
{
  const int n = 16;
  setenv("GEOCCL_CONNECT", "lazy", 1);
  shared_t *sh = new_shared(n);
  CU_ASSERT_FATAL(sh != NULL);
  sh->victim = 8;
  harness_opts o = {.timeout_s = 120, .make_id = 1, .expect_die = 1u << sh->victim};
  CU_ASSERT_EQUAL(harness_run_opts(n, death_body, sh, &o), 0);
  for (int r = sh->victim - 3; r <= sh->victim + 3; r += 6) {
    printf("\n  rank %d (%s the dead rank) got its error after %.2f s", r,
           r < sh->victim ? "below" : "above", sh->err_s[r]);
    CU_ASSERT(sh->err_s[r] >= 0 && sh->err_s[r] <= LIB_TIMEOUT_S + 5);
  }
  unsetenv("GEOCCL_CONNECT");
  harness_shared_free(sh, sizeof(*sh));
}

/* A stranger's hello to rank 0, claiming rank `as` on stream 0, with
 * proofs it cannot make (it lacks the secret).  1 if rank 0 acknowledged
 * it, 0 if it closed it, -1 if there was no handshake. */
static int stranger_hello(const geoSockAddr *addr, int as)
{
  uint8_t challenge[GEO_CHALLENGE_BYTES];
  const char *why;
  tcpHello m;
  tcpAccept ack;
  int fd, taken = -1;
  if (geoSocketConnect(addr, geoNow() + 10, &fd) != ncclSuccess) return -1;
  if (geoSocketRecvAll(fd, challenge, sizeof(challenge), geoNow() + 10, &why) == ncclSuccess) {
    memset(&m, 0, sizeof(m));
    m.magic = GEO_HELLO_MAGIC;
    m.rank = as;
    m.to = 0;
    m.cipher = GEO_CIPHER_CHACHA20POLY1305;
    geoRandomBytes(m.nonce, sizeof(m.nonce));
    geoRandomBytes(m.proof, sizeof(m.proof));
    geoRandomBytes(m.claim, sizeof(m.claim));
    geoRandomBytes(m.cproof, sizeof(m.cproof));
    if (geoSocketSendAll(fd, &m, sizeof(m), geoNow() + 10, &why) == ncclSuccess)
      taken = geoSocketRecvAll(fd, &ack, sizeof(ack), geoNow() + 10, &why) == ncclSuccess;
  }
  close(fd);
  return taken;
}

/* Ranks 0..n-2 make the communicator; the last process is the stranger. */
static int stranger_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  shared_t *sh = arg;
  const int n = nranks - 1, as = n / 2;
  ncclComm_t comm;
  int bad = 0;
  if (rank == n) {
    for (double t0 = harness_now(); !sh->ready; usleep(1000))
      if (harness_now() - t0 > 60 * harness_time_scale()) return 1;
    sh->taken = stranger_hello(&sh->addr0, as);
    sh->phase = 1;
    return 0;
  }
  if (ncclCommInitRank(&comm, n, *id, rank) != ncclSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  if (rank == 0) {
    sh->addr0 = comm->net.ctx.peers[0].addr;
    sh->ready = 1;
  }
  for (double t0 = harness_now(); !sh->phase; usleep(1000))
    if (harness_now() - t0 > 60 * harness_time_scale()) {
      bad = 1;
      break;
    }
  if (!bad && (rank == 0 || rank == as) &&
      exchange(comm, rank, rank ? 0 : as, rank ? 0 : as, &bad) != ncclSuccess) {
    fprintf(stderr, "rank %d: first use after the stranger failed: %s\n", rank,
            ncclGetLastError(comm));
    bad = 1;
  }
  bad |= allreduce_ok(comm, rank, n);
  if (ncclCommDestroy(comm) != ncclSuccess) bad = 1;
  return bad;
}

static void test_stranger(void)
{
  const int n = 12;
  setenv("GEOCCL_CONNECT", "lazy", 1);
  shared_t *sh = new_shared(n);
  CU_ASSERT_FATAL(sh != NULL);
  sh->taken = -2;
  CU_ASSERT_EQUAL(harness_run_noinit(n + 1, stranger_body, sh, 120), 0);
  if (sh->taken != 0)
    fprintf(stderr, "the stranger's hello: %s\n",
            sh->taken > 0 ? "acknowledged" : "no handshake");
  CU_ASSERT_EQUAL(sh->taken, 0);
  unsetenv("GEOCCL_CONNECT");
  harness_shared_free(sh, sizeof(*sh));
}

/* ---- the benchmark ---- */

static int bench_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  shared_t *sh = arg;
  ncclComm_t comm;
  if (init_rank(sh, rank, nranks, id, &comm)) return 1;
  sh->bad[rank] = allreduce_ok(comm, rank, nranks);
  if (sh->victim == -2) sh->bad[rank] |= alltoall_ok(comm, rank, nranks);
  sh->fds_after[rank] = count_fds();
  return ncclCommDestroy(comm) != ncclSuccess || sh->bad[rank];
}

static int bench(int n, int a2a)
{
  if (n < 2 || n > MAX_RANKS) {
    fprintf(stderr, "--bench: 2..%d ranks\n", MAX_RANKS);
    return 2;
  }
  shared_t *sh = new_shared(n);
  if (sh == NULL) return 1;
  harness_opts o = {.timeout_s = 600, .make_id = 1};
  sh->victim = a2a ? -2 : -1; /* -2: an all-to-all after the all-reduce */
  sh->t_start = harness_now();
  int failed = harness_run_opts(n, bench_body, sh, &o);
  double slowest = 0, last = 0, mean = 0;
  int fmax = 0, fmin = 1 << 30, bad = 0, amax = 0;
  for (int r = 0; r < n; r++) {
    int f = sh->fds_init[r];
    mean += sh->init_s[r] / n;
    slowest = sh->init_s[r] > slowest ? sh->init_s[r] : slowest;
    last = sh->ready_at[r] - sh->t_start > last ? sh->ready_at[r] - sh->t_start : last;
    fmax = f > fmax ? f : fmax;
    fmin = f < fmin ? f : fmin;
    amax = sh->fds_after[r] > amax ? sh->fds_after[r] : amax;
    bad += sh->bad[r];
  }
  const char *mode = getenv("GEOCCL_CONNECT");
  printf("ranks %4d  connect %-5s  init: slowest rank %6.2f s, mean %6.2f s, job %6.2f s  "
         "descriptors per rank after init: %d..%d  all-reduce %s\n",
         n, mode ? mode : "auto", slowest, mean, last, fmin, fmax,
         failed || bad ? "FAILED" : "ok");
  if (a2a)
    printf("            after an all-to-all of every pair: up to %d descriptors per rank\n",
           amax);
  harness_shared_free(sh, sizeof(*sh));
  return failed || bad;
}

int main(int argc, char **argv)
{
  /* before any library call: parameters are read once per process */
  char t[16];
  snprintf(t, sizeof(t), "%d", LIB_TIMEOUT_S);
  harness_setup_env();
  if ((argc == 3 || argc == 4) && strcmp(argv[1], "--bench") == 0)
    return bench(atoi(argv[2]), argc == 4 && strcmp(argv[3], "alltoall") == 0);

  setenv("GEOCCL_TIMEOUT", t, 1);
  if (CU_initialize_registry() != CUE_SUCCESS) return CU_get_error();
  CU_pSuite s = CU_add_suite("lazy_connect", NULL, NULL);
  if (s == NULL) {
    CU_cleanup_registry();
    return CU_get_error();
  }
  CU_add_test(s, "16 ranks, GEOCCL_CONNECT=lazy: few descriptors, first use works",
              test_lazy);
  CU_add_test(s, "32 ranks, default: lazy beyond 16 ranks", test_auto);
  CU_add_test(s, "first use with a rank that died: an error, no hang", test_death);
  CU_add_test(s, "a stranger cannot take a slot left for first use", test_stranger);
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failures = CU_get_number_of_failures();
  CU_cleanup_registry();
  return failures != 0;
}
