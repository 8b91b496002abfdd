/*
 * Peer failure during a collective.
 *
 * Four ranks all-reduce 64 MiB in a loop with GEOCCL_TIMEOUT=5 (15 under
 * the sanitizer builds, GEOCCL_TEST_TIME_SCALE > 1: a thread-sanitized
 * 64 MiB call beside other builds went 5 s without progress before the
 * death). In the
 * second iteration, 50 ms after it has started the call, rank 2 is taken
 * out in one of three ways:
 *   - SIGKILL: the kernel closes its sockets;
 *   - _exit(0): the process ends normally, in the middle of the call;
 *   - SIGSTOP: the process stops answering but its sockets stay open, so
 *     only a deadline can notice.
 * Every survivor must get an error (not ncclSuccess) within
 * GEOCCL_TIMEOUT + 5 s of the death, ncclGetLastError(comm) must say which
 * rank is involved, and ncclCommAbort must then return. The time each
 * survivor took is printed.
 *
 * The ranks share this machine and its network namespace, so by default
 * (GEOCCL_SHM=1) they are connected over the same-host fast path (AF_UNIX
 * sockets); each test checks that every rank reached all its peers that
 * way, and the SIGKILL case runs once more with GEOCCL_SHM=0 (TCP only,
 * every rank must report no fast-path peer).
 *
 * Two more cases split the ranks into two regions ('a a b b', GEOCCL_ALGO=
 * hier): the victim's region partner then waits on it inside the region's
 * single-copy phases and their signals, which go through the pair's
 * shared-memory mailbox (comm/transport/transport.h), not through a socket.
 *
 * Two more run 8-byte all-reduces in a loop with GEOCCL_HOST_COLL=2: the
 * ranks share the host segment (comm/intra/hostseg.h) and the survivors
 * wait for the victim there, on a futex, with no socket in the path.
 */
#define _GNU_SOURCE
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "geoccl.h"
#include "tests/helpers/harness.h"

#define NRANKS 4
#define VICTIM 2
/* GEOCCL_TIMEOUT given to the library, and the time allowed on top of it */
#define LIB_TIMEOUT_S (harness_time_scale() > 1 ? 15 : 5)
#define GRACE_S 5.0
#define COUNT ((size_t)16 << 20) /* floats: 64 MiB */
#define MAX_ITERS 8

enum death { DIE_SIGKILL, DIE_EXIT, DIE_SIGSTOP };

static const char *const death_names[] = {"SIGKILL", "_exit(0)", "SIGSTOP"};

/* Written by the children, read by the parent. */
struct shared {
  double death_time;           /* CLOCK_MONOTONIC when the victim went */
  double took[NRANKS];         /* survivor: from the death to the error */
  int iter[NRANKS];            /* iteration in which the error came */
  int result[NRANKS];          /* the ncclResult_t */
  int via_async[NRANKS];       /* 1 if seen through ncclCommGetAsyncError */
  int abort_result[NRANKS];
  char error[NRANKS][512];     /* ncclGetLastError(comm) */
  int local_peers[NRANKS];     /* geocclCommGetLocalPeers after init */
};

struct death_arg {
  enum death how;
  int shm;                     /* GEOCCL_SHM for the ranks */
  struct shared *sh;
  int regions;                 /* 1: regions a a b b, hierarchical all-reduce */
  int small;                   /* 1: 8-byte all-reduces in the host segment */
};

static void *executioner(void *p)
{
  struct death_arg *a = p;
  struct timespec ts = {0, 50 * 1000 * 1000};
  nanosleep(&ts, NULL);
  a->sh->death_time = harness_now();
  __sync_synchronize();
  switch (a->how) {
  case DIE_SIGKILL: raise(SIGKILL); break;
  case DIE_EXIT: _exit(0);
  case DIE_SIGSTOP: raise(SIGSTOP); break;
  }
  return NULL;
}

static int death_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  struct death_arg *a = arg;
  struct shared *sh = a->sh;
  ncclComm_t comm = NULL;
  setenv("GEOCCL_SHM", a->shm ? "1" : "0", 1);
  if (a->regions) {
    setenv("GEOCCL_REGION", rank < NRANKS / 2 ? "a" : "b", 1);
    setenv("GEOCCL_ALGO", "hier", 1);
  }
  if (a->small) setenv("GEOCCL_HOST_COLL", "2", 1);
  /* Small calls: as many as fit until the death (the victim's 50 ms). */
  const size_t count = a->small ? 2 : COUNT;
  const int max_iters = a->small ? 1 << 30 : MAX_ITERS;
  const double t_start = harness_now();
  ncclResetDebugInit(); /* the parent may have read the parameters already */
  ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommInitRank: %s: %s\n", rank,
            ncclGetErrorString(r), ncclGetLastError(NULL));
    return 1;
  }
  sh->local_peers[rank] = -1;
  if (geocclCommGetLocalPeers(comm, &sh->local_peers[rank]) != ncclSuccess)
    fprintf(stderr, "[rank %d] geocclCommGetLocalPeers failed\n", rank);
  float *send = malloc(count * sizeof(float));
  float *recv = malloc(count * sizeof(float));
  if (send == NULL || recv == NULL) return 1;
  for (size_t i = 0; i < count; i++) send[i] = (float)((i + (size_t)rank) & 1023);

  int fails = 0, got_error = 0;
  for (int it = 0; it < max_iters && !got_error && harness_now() - t_start < 60; it++) {
    if (rank == VICTIM && it == 1) {
      pthread_t th;
      pthread_create(&th, NULL, executioner, a);
      pthread_detach(th);
    }
    r = ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, NULL);
    ncclResult_t async = ncclSuccess;
    if (r == ncclSuccess) ncclCommGetAsyncError(comm, &async);
    if (r != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
      double now = harness_now();
      got_error = 1;
      sh->iter[rank] = it;
      sh->result[rank] = r != ncclSuccess ? (int)r : (int)async;
      sh->via_async[rank] = r == ncclSuccess;
      sh->took[rank] = sh->death_time > 0 ? now - sh->death_time : -1;
      snprintf(sh->error[rank], sizeof(sh->error[rank]), "%s",
               ncclGetLastError(comm));
    }
  }
  if (rank == VICTIM) {
    /* the executioner should have ended this process already */
    fprintf(stderr, "[rank %d] victim survived %d iterations\n", rank, MAX_ITERS);
    return 1;
  }
  if (!got_error) {
    fprintf(stderr, "[rank %d] no error in %d iterations after rank %d went\n",
            rank, MAX_ITERS, VICTIM);
    fails++;
  } else {
    if (sh->result[rank] == ncclInProgress) {
      fprintf(stderr, "[rank %d] blocking call gave ncclInProgress\n", rank);
      fails++;
    }
    if (sh->took[rank] < 0) {
      fprintf(stderr, "[rank %d] error before rank %d went: %s: %s\n", rank,
              VICTIM, ncclGetErrorString((ncclResult_t)sh->result[rank]),
              sh->error[rank]);
      fails++;
    } else if (sh->took[rank] > LIB_TIMEOUT_S + GRACE_S) {
      fprintf(stderr, "[rank %d] error came %.2f s after the death, limit "
                      "%.0f s\n", rank, sh->took[rank], (double)(LIB_TIMEOUT_S + GRACE_S));
      fails++;
    }
    if (strlen(sh->error[rank]) == 0) {
      fprintf(stderr, "[rank %d] ncclGetLastError(comm) is empty\n", rank);
      fails++;
    } else if (strcasestr(sh->error[rank], "rank") == NULL) {
      fprintf(stderr, "[rank %d] ncclGetLastError(comm) names no rank: %s\n",
              rank, sh->error[rank]);
      fails++;
    }
  }
  r = ncclCommAbort(comm);
  sh->abort_result[rank] = (int)r;
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommAbort: %s\n", rank, ncclGetErrorString(r));
    fails++;
  }
  free(send);
  free(recv);
  return fails;
}

static void run_death_in(enum death how, int shm, int regions, int small)
{
  struct shared *sh = harness_shared_alloc(sizeof(*sh));
  CU_ASSERT_FATAL(sh != NULL);
  struct death_arg a = {how, shm, sh, regions, small};
  harness_status st[NRANKS];
  harness_opts o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = 90.0;
  o.make_id = 1;
  o.expect_die = 1u << VICTIM;
  o.status = st;
  int rc = harness_run_opts(NRANKS, death_body, &a, &o);

  printf("\n  rank %d %s (GEOCCL_SHM=%d%s%s):", VICTIM, death_names[how], shm,
         regions ? ", regions a a b b" : "", small ? ", 8 B in the host segment" : "");
  for (int r = 0; r < NRANKS; r++) {
    if (r == VICTIM) continue;
    if (sh->took[r] != 0 || sh->result[r] != 0)
      printf("\n    rank %d: %s%s after %.2f s (iteration %d), abort %s: %s", r,
             ncclGetErrorString((ncclResult_t)sh->result[r]),
             sh->via_async[r] ? " (async)" : "", sh->took[r], sh->iter[r],
             ncclGetErrorString((ncclResult_t)sh->abort_result[r]),
             sh->error[r]);
    else
      printf("\n    rank %d: no error recorded", r);
  }
  printf("\n");
  fflush(stdout);

  CU_ASSERT_EQUAL(rc, 0);
  CU_ASSERT(sh->death_time > 0);
  /* the pairs were on the path this test means to exercise */
  for (int r = 0; r < NRANKS; r++) {
    if (sh->local_peers[r] != (shm ? NRANKS - 1 : 0))
      printf("  rank %d: %d same-host fast-path peers, expected %d\n", r,
             sh->local_peers[r], shm ? NRANKS - 1 : 0);
    CU_ASSERT_EQUAL(sh->local_peers[r], shm ? NRANKS - 1 : 0);
  }
  /* the victim went the way it was meant to */
  if (how == DIE_EXIT) {
    CU_ASSERT(st[VICTIM].done && st[VICTIM].exit_code == 0);
  } else {
    CU_ASSERT_EQUAL(st[VICTIM].signal, SIGKILL);
  }
  harness_shared_free(sh, sizeof(*sh));
}

static void run_death(enum death how, int shm) { run_death_in(how, shm, 0, 0); }
static void test_sigkill(void) { run_death(DIE_SIGKILL, 1); }
static void test_exit(void) { run_death(DIE_EXIT, 1); }
static void test_sigstop(void) { run_death(DIE_SIGSTOP, 1); }
static void test_sigkill_tcp(void) { run_death(DIE_SIGKILL, 0); }
static void test_sigkill_regions(void) { run_death_in(DIE_SIGKILL, 1, 1, 0); }
static void test_sigstop_regions(void) { run_death_in(DIE_SIGSTOP, 1, 1, 0); }
static void test_sigkill_segment(void) { run_death_in(DIE_SIGKILL, 1, 0, 1); }
static void test_sigstop_segment(void) { run_death_in(DIE_SIGSTOP, 1, 0, 1); }

int main(void)
{
  /* before any library call: parameters are read once per process */
  char t[16];
  snprintf(t, sizeof(t), "%d", LIB_TIMEOUT_S);
  setenv("GEOCCL_TIMEOUT", t, 1);
  harness_setup_env();

  if (CU_initialize_registry() != CUE_SUCCESS) return CU_get_error();
  CU_pSuite s = CU_add_suite("peer_death", NULL, NULL);
  if (s == NULL) {
    CU_cleanup_registry();
    return CU_get_error();
  }
  CU_add_test(s, "rank 2 SIGKILLed during all-reduce", test_sigkill);
  CU_add_test(s, "rank 2 calls _exit(0) during all-reduce", test_exit);
  CU_add_test(s, "rank 2 SIGSTOPped during all-reduce", test_sigstop);
  CU_add_test(s, "regions a a b b: rank 2 SIGKILLed during a hierarchical all-reduce",
              test_sigkill_regions);
  CU_add_test(s, "regions a a b b: rank 2 SIGSTOPped during a hierarchical all-reduce",
              test_sigstop_regions);
  CU_add_test(s, "rank 2 SIGKILLed during all-reduce, TCP only (GEOCCL_SHM=0)",
              test_sigkill_tcp);
  CU_add_test(s, "rank 2 SIGKILLed during 8-byte all-reduces in the host segment",
              test_sigkill_segment);
  CU_add_test(s, "rank 2 SIGSTOPped during 8-byte all-reduces in the host segment",
              test_sigstop_segment);
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failures = CU_get_number_of_failures();
  CU_cleanup_registry();
  return failures != 0;
}
