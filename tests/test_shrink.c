/*
 * ncclCommShrink (comm/api/split.c) over forked ranks on loopback.
 *
 * NCCL_SHRINK_DEFAULT on a healthy parent: 4 ranks without rank 0, without
 * the last rank, and 5 ranks without ranks 4 and 0 (listed out of order).
 * Only the survivors call it; each checks its new rank (its parent rank
 * less the excluded ranks below it) and count, all-reduces its parent rank
 * on the new communicator (the sum of the survivors' ranks), and then every
 * rank, the excluded ones included, all-reduces on the parent, which must
 * still work.
 *
 * Bad arguments (NULL newcomm, negative count, count >= nranks, NULL list,
 * ranks out of range, duplicated, the caller itself, unknown flags, a
 * config without NCCL_CONFIG_INITIALIZER) each return ncclInvalidArgument
 * with a message in ncclGetLastError(comm), and send nothing: the parent's
 * all-reduce afterwards is exact, which a stray message would break (the
 * transport matches messages in order).
 *
 * NCCL_SHRINK_ABORT: 4 ranks, rank 0 is SIGKILLed after one all-reduce; the
 * survivors see the next all-reduce fail, shrink without it (no help from
 * the dead rank or the broken parent) within GEOCCL_TIMEOUT, and all-reduce
 * on the new communicator.  Also 5 ranks excluding ranks 1 and 4 that stay
 * alive and call nothing.
 *
 * Regions: 5 ranks labelled "a a b b b" exclude ranks 1 and 4; the new
 * communicator has regions a = {0} and b = {1, 2}, which
 * geocclCommGetRegion reports, and its all-reduce runs hierarchically and
 * is exact.
 */
#define _GNU_SOURCE
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <geoccl.h>

#include "tests/helpers/harness.h"

#define LIB_TIMEOUT_S 5 /* GEOCCL_TIMEOUT given to the library */
#define COUNT 4099      /* floats per all-reduce: several TCP frames, odd */

struct shrink_case {
  int nranks;
  int count;
  int exclude[4];
  int flags;
  unsigned kill;        /* bit r: rank r is SIGKILLed after one all-reduce */
  const char *labels;   /* GEOCCL_REGION per rank, space-separated, or NULL */
  int want_nregions;    /* of the new communicator when labels are given */
  double shrink_s[HARNESS_MAX_RANKS]; /* filled in by the ranks (shared) */
  int subs_done;        /* survivors done with the new communicator */
};

static int excluded(const struct shrink_case *c, int r)
{
  for (int i = 0; i < c->count; i++)
    if (c->exclude[i] == r) return 1;
  return 0;
}

/* All-reduce of value (every element) over comm; 0 when every element
 * equals want. */
static int allreduce_check(ncclComm_t comm, float value, float want,
                           int rank, const char *what)
{
  static float buf[COUNT];
  for (int i = 0; i < COUNT; i++) buf[i] = value;
  ncclResult_t r = ncclAllReduce(buf, buf, COUNT, ncclFloat32, ncclSum, comm,
                                 NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] %s: all-reduce: %s: %s\n", rank, what,
            ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  for (int i = 0; i < COUNT; i++)
    if (buf[i] != want) {
      fprintf(stderr, "[rank %d] %s: element %d is %g, expected %g\n", rank,
              what, i, (double)buf[i], (double)want);
      return 1;
    }
  return 0;
}

/* My label in a space-separated list. */
static void label_of(const char *labels, int rank, char *out, size_t len)
{
  const char *p = labels;
  for (int r = 0; r < rank && p; r++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  size_t n = p ? strcspn(p, " ") : 0;
  if (n >= len) n = len - 1;
  memcpy(out, p ? p : "", n);
  out[n] = '\0';
}

static int shrink_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  struct shrink_case *c = arg;
  ncclComm_t comm = NULL, sub = NULL;
  int fails = 0;

  if (c->labels) {
    char l[32];
    label_of(c->labels, rank, l, sizeof(l));
    setenv("GEOCCL_REGION", l, 1);
  }
  ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommInitRank: %s: %s\n", rank,
            ncclGetErrorString(r), ncclGetLastError(NULL));
    return 1;
  }
  float all = (float)(nranks * (nranks - 1) / 2);
  if (c->kill) {
    fails += allreduce_check(comm, (float)rank, all, rank, "parent before the death");
    if (c->kill & (1u << rank)) raise(SIGKILL);
    /* the dead rank's absence must show within the timeout */
    float tmp[16] = {0};
    r = ncclAllReduce(tmp, tmp, 16, ncclFloat32, ncclSum, comm, NULL);
    if (r == ncclSuccess) {
      fprintf(stderr, "[rank %d] all-reduce with a dead rank succeeded\n", rank);
      fails++;
    }
  }
  if (excluded(c, rank)) {
    /* Excluded ranks do not call ncclCommShrink.  The parent's all-reduce
     * waits for the survivors' work on the new communicator, which may
     * take longer than GEOCCL_TIMEOUT on a loaded machine. */
    if (c->flags == NCCL_SHRINK_DEFAULT) {
      double end = harness_now() + 60.0;
      while (__atomic_load_n(&c->subs_done, __ATOMIC_ACQUIRE) < nranks - c->count &&
             harness_now() < end)
        usleep(10000);
      fails += allreduce_check(comm, (float)rank, all, rank, "parent after shrink");
    }
    ncclCommAbort(comm);
    return fails;
  }

  int want_rank = rank, want_n = nranks - c->count;
  float want_sum = 0;
  for (int q = 0; q < nranks; q++) {
    if (excluded(c, q)) {
      if (q < rank) want_rank--;
    } else {
      want_sum += (float)q;
    }
  }
  /* an error-feedback registration, carried over to the shrunk one */
  static float ef_buf[64];
  void *ef = NULL;
  if (geocclCommRegisterErrorFeedback(comm, ef_buf, sizeof(ef_buf), &ef) != ncclSuccess) {
    fprintf(stderr, "[rank %d] geocclCommRegisterErrorFeedback failed\n", rank);
    fails++;
  }
  double t0 = harness_now();
  r = ncclCommShrink(comm, (int *)c->exclude, c->count, &sub, NULL, c->flags);
  c->shrink_s[rank] = harness_now() - t0;
  if (r != ncclSuccess || sub == NULL) {
    fprintf(stderr, "[rank %d] ncclCommShrink: %s: %s\n", rank, ncclGetErrorString(r),
            ncclGetLastError(comm));
    ncclCommAbort(comm);
    return fails + 1;
  }
  int n = -1, ur = -1;
  ncclCommCount(sub, &n);
  ncclCommUserRank(sub, &ur);
  if (n != want_n || ur != want_rank) {
    fprintf(stderr, "[rank %d] shrunk: rank %d of %d, expected %d of %d\n", rank, ur, n,
            want_rank, want_n);
    fails++;
  }
  if (c->labels) {
    int nreg = 0, reg = -1, lr = -1, rs = 0;
    const char *name = NULL;
    char l[32];
    label_of(c->labels, rank, l, sizeof(l));
    geocclCommGetRegion(sub, &nreg, &reg, &lr, &rs, &name);
    if (nreg != c->want_nregions || name == NULL || strcmp(name, l) != 0) {
      fprintf(stderr, "[rank %d] shrunk: %d regions, mine '%s', expected %d and '%s'\n",
              rank, nreg, name ? name : "(null)", c->want_nregions, l);
      fails++;
    }
    geocclCommResetStats(sub);
  }
  fails += allreduce_check(sub, (float)rank, want_sum, rank, "shrunk communicator");
  /* the parent's registration is the shrunk one's, under the same handle:
   * the same memory registered again is it, part of it overlaps it, and
   * the handle deregisters it */
  void *again = NULL, *part = NULL;
  if (geocclCommRegisterErrorFeedback(sub, ef_buf, sizeof(ef_buf), &again) != ncclSuccess ||
      again != ef ||
      geocclCommRegisterErrorFeedback(sub, ef_buf, sizeof(float), &part) !=
          ncclInvalidArgument ||
      geocclCommDeregisterErrorFeedback(sub, ef) != ncclSuccess ||
      geocclCommDeregisterErrorFeedback(sub, ef) != ncclInvalidArgument ||
      geocclCommRegisterErrorFeedback(sub, ef_buf, sizeof(ef_buf), &again) != ncclSuccess) {
    fprintf(stderr, "[rank %d] shrunk: the parent's error-feedback registration was not "
                    "carried over\n", rank);
    fails++;
  }
  if (c->labels) {
    geocclStats st;
    memset(&st, 0, sizeof(st));
    geocclCommGetStats(sub, &st);
    if (st.callsHier != 1) {
      fprintf(stderr, "[rank %d] shrunk: %llu hierarchical and %llu flat calls, expected "
                      "the all-reduce to be hierarchical\n", rank, st.callsHier,
              st.callsFlat);
      fails++;
    }
  }
  if (ncclCommDestroy(sub) != ncclSuccess) fails++;
  __atomic_add_fetch(&c->subs_done, 1, __ATOMIC_ACQ_REL);
  if (c->flags == NCCL_SHRINK_DEFAULT) {
    fails += allreduce_check(comm, (float)rank, all, rank, "parent after shrink");
    if (ncclCommDestroy(comm) != ncclSuccess) fails++;
  } else {
    if (ncclCommAbort(comm) != ncclSuccess) fails++;
  }
  return fails;
}

static void run_case(struct shrink_case *proto)
{
  struct shrink_case *c = harness_shared_alloc(sizeof(*c));
  CU_ASSERT_FATAL(c != NULL);
  *c = *proto;
  harness_opts o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = 90.0;
  o.make_id = 1;
  o.expect_die = c->kill;
  CU_ASSERT_EQUAL(harness_run_opts(c->nranks, shrink_body, c, &o), 0);
  if (c->flags == NCCL_SHRINK_ABORT) {
    printf("\n    shrink took");
    for (int r = 0; r < c->nranks; r++)
      if (!excluded(c, r)) {
        printf(" %.2f s", c->shrink_s[r]);
        CU_ASSERT(c->shrink_s[r] < LIB_TIMEOUT_S);
      }
    printf("\n");
  }
  harness_shared_free(c, sizeof(*c));
}

static void test_default_first(void)
{
  struct shrink_case c = {.nranks = 4, .count = 1, .exclude = {0}};
  run_case(&c);
}

static void test_default_last(void)
{
  struct shrink_case c = {.nranks = 4, .count = 1, .exclude = {3}};
  run_case(&c);
}

static void test_default_two(void)
{
  struct shrink_case c = {.nranks = 5, .count = 2, .exclude = {4, 0}};
  run_case(&c);
}

static void test_abort_killed(void)
{
  struct shrink_case c = {.nranks = 4, .count = 1, .exclude = {0},
                          .flags = NCCL_SHRINK_ABORT, .kill = 1u << 0};
  run_case(&c);
}

static void test_abort_killed_two(void)
{
  struct shrink_case c = {.nranks = 5, .count = 2, .exclude = {4, 2},
                          .flags = NCCL_SHRINK_ABORT, .kill = 1u << 2 | 1u << 4};
  run_case(&c);
}

static void test_abort_alive(void)
{
  struct shrink_case c = {.nranks = 5, .count = 2, .exclude = {1, 4},
                          .flags = NCCL_SHRINK_ABORT};
  run_case(&c);
}

static void test_regions(void)
{
  struct shrink_case c = {.nranks = 5, .count = 2, .exclude = {1, 4},
                          .labels = "a a b b b", .want_nregions = 2};
  run_case(&c);
}

static void test_regions_abort(void)
{
  struct shrink_case c = {.nranks = 5, .count = 2, .exclude = {1, 4},
                          .flags = NCCL_SHRINK_ABORT, .labels = "a a b b b",
                          .want_nregions = 2};
  run_case(&c);
}

/* ---- bad arguments ------------------------------------------------------ */

static int expect_invalid(ncclComm_t comm, int rank, const char *what, ncclResult_t r,
                          ncclComm_t sub)
{
  if (r != ncclInvalidArgument || sub != NULL) {
    fprintf(stderr, "[rank %d] %s: %s (newcomm %p), expected ncclInvalidArgument\n", rank,
            what, ncclGetErrorString(r), (void *)sub);
    return 1;
  }
  if (strstr(ncclGetLastError(comm), "ncclCommShrink") == NULL) {
    fprintf(stderr, "[rank %d] %s: last error does not say so: '%s'\n", rank, what,
            ncclGetLastError(comm));
    return 1;
  }
  return 0;
}

static int bad_args_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  int fails = 0, other = (rank + 1) % nranks;
  ncclComm_t sub = NULL;
  ncclResult_t r;

#define BAD(what, list, count, out, cfg, flags)                             \
  do {                                                                      \
    sub = NULL;                                                             \
    r = ncclCommShrink(comm, list, count, out, cfg, flags);                 \
    fails += expect_invalid(comm, rank, what, r, sub);                      \
  } while (0)

  int one[1] = {other};
  BAD("NULL newcomm", one, 1, NULL, NULL, NCCL_SHRINK_DEFAULT);
  BAD("negative count", one, -1, &sub, NULL, NCCL_SHRINK_DEFAULT);
  int many[HARNESS_MAX_RANKS];
  for (int i = 0; i < nranks; i++) many[i] = i;
  BAD("count == nranks", many, nranks, &sub, NULL, NCCL_SHRINK_DEFAULT);
  BAD("count > nranks", many, nranks + 1, &sub, NULL, NCCL_SHRINK_DEFAULT);
  BAD("NULL list", NULL, 1, &sub, NULL, NCCL_SHRINK_DEFAULT);
  int neg[1] = {-1};
  BAD("rank -1", neg, 1, &sub, NULL, NCCL_SHRINK_DEFAULT);
  int big[1] = {nranks};
  BAD("rank nranks", big, 1, &sub, NULL, NCCL_SHRINK_ABORT);
  int dup[2] = {other, other};
  BAD("duplicate", dup, 2, &sub, NULL, NCCL_SHRINK_DEFAULT);
  int self[2] = {other, rank};
  BAD("self", self, 2, &sub, NULL, NCCL_SHRINK_ABORT);
  BAD("flags 2", one, 1, &sub, NULL, 2);
  BAD("flags -1", one, 1, &sub, NULL, -1);
  ncclConfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  BAD("config without initializer", one, 1, &sub, &cfg, NCCL_SHRINK_DEFAULT);
#undef BAD

  /* Nothing was sent, and NCCL_SHRINK_ABORT was refused before it broke
   * anything: the parent's all-reduce is exact. */
  fails += allreduce_check(comm, (float)rank, (float)(nranks * (nranks - 1) / 2), rank,
                           "parent after bad arguments");
  return fails;
}

static void test_bad_args(void)
{
  CU_ASSERT_EQUAL(harness_run(4, bad_args_body, NULL, 60.0), 0);
}

static void test_null_comm(void)
{
  ncclComm_t sub = NULL;
  int ex[1] = {0};
  CU_ASSERT_EQUAL(ncclCommShrink(NULL, ex, 1, &sub, NULL, NCCL_SHRINK_DEFAULT),
                  ncclInvalidArgument);
  CU_ASSERT_PTR_NULL(sub);
}

int main(void)
{
  char t[16];
  snprintf(t, sizeof(t), "%d", LIB_TIMEOUT_S);
  setenv("GEOCCL_TIMEOUT", t, 1);
  unsetenv("GEOCCL_REGION");
  unsetenv("GEOCCL_TOPO_FILE");
  unsetenv("GEOCCL_ALGO");
  /* the region case checks the hierarchical algorithm, not the direct
   * exchange small all-reduces take */
  setenv("GEOCCL_DIRECT_MAX", "0", 1);
  harness_setup_env();

  if (CU_initialize_registry() != CUE_SUCCESS) return CU_get_error();
  CU_pSuite s = CU_add_suite("shrink", NULL, NULL);
  if (s == NULL) {
    CU_cleanup_registry();
    return CU_get_error();
  }
  CU_add_test(s, "NULL comm", test_null_comm);
  CU_add_test(s, "bad arguments: ncclInvalidArgument, nothing sent", test_bad_args);
  CU_add_test(s, "default, 4 ranks without rank 0", test_default_first);
  CU_add_test(s, "default, 4 ranks without the last", test_default_last);
  CU_add_test(s, "default, 5 ranks without 4 and 0", test_default_two);
  CU_add_test(s, "default, regions 'a a b b b' without 1 and 4", test_regions);
  CU_add_test(s, "abort, 4 ranks, rank 0 SIGKILLed", test_abort_killed);
  CU_add_test(s, "abort, 5 ranks, ranks 2 and 4 SIGKILLed", test_abort_killed_two);
  CU_add_test(s, "abort, 5 ranks without live 1 and 4", test_abort_alive);
  CU_add_test(s, "abort, regions 'a a b b b' without 1 and 4", test_regions_abort);
  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failures = CU_get_number_of_failures();
  CU_cleanup_registry();
  return failures != 0;
}
