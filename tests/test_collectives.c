/*
 * Multi-process collective matrix for GeoCCL on host buffers over loopback.
 *
 * Each CUnit test forks one set of ranks per nranks value (4, 3, 2, 8) and the
 * ranks loop over every case of one collective: every data type x every
 * reduction op x in-place/out-of-place x counts {0, 1, 7} x roots
 * {0, nranks-1}, plus a 1000003-element case for int8 and float. Results are
 * compared byte for byte with references computed in tests/helpers/harness.c, the
 * send buffer must be left untouched, nothing may be written past the end
 * of a buffer, and results that every rank holds must be bit-identical on
 * all ranks (hash all-gathered after the case).
 *
 * Also: pre-multiplied sum ops, grouped collectives, ncclCommSplit,
 * ncclCommCount/UserRank, ncclGetVersion, non-blocking init with
 * ncclCommFinalize, ncclCommInitAll from one thread and GEOCCL_COMM_ID
 * bootstrap.
 *
 * Under the sanitizers (GEOCCL_TEST_TIME_SCALE > 1: tests/run-sanitizers.sh)
 * the same cases run, but the large one has 524309 elements (big_count()),
 * where the 4-rank matrices with 1000003 took most of the test's time.
 * That count still takes the same paths: uneven segments on every ring
 * size, and a float segment of the 4-rank all-reduce just over one
 * 512 KiB chunk (GEOCCL_CHUNK_SIZE), so its ring pipelines two chunks, as
 * with 1000003; the other collectives move more per rank, so more chunks.
 * What the sanitizers look for (races, leaks, bad accesses) lies in those
 * paths, not in the number of elements.
 */
#define _GNU_SOURCE
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/helpers/harness.h"

#define TIMEOUT_S 150.0
#define BIG_COUNT ((size_t)1000003)
#define SANITIZED_BIG_COUNT ((size_t)524309)
static size_t big_count(void)
{
  return harness_time_scale() > 1 ? SANITIZED_BIG_COUNT : BIG_COUNT;
}
#define GUARD 64 /* bytes checked past the end of every output buffer */

typedef enum {
  C_ALLREDUCE,
  C_BROADCAST,
  C_BCAST,
  C_REDUCE,
  C_ALLGATHER,
  C_REDUCESCATTER,
  C_ALLTOALL,
  C_GATHER,
  C_SCATTER,
  C_SENDRECV,
  C_NUM
} coll_t;

static const char *const coll_names[C_NUM] = {
    "allreduce", "broadcast", "bcast",   "reduce",  "allgather",
    "reducescatter", "alltoall", "gather", "scatter", "sendrecv"};

static int coll_has_op(coll_t c)
{
  return c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER;
}

static int coll_has_root(coll_t c)
{
  return c == C_BROADCAST || c == C_BCAST || c == C_REDUCE || c == C_GATHER ||
         c == C_SCATTER;
}

/* In-place has a meaning for these (bcast is always in place; alltoall and
 * send/recv have no in-place form in NCCL). */
static int coll_has_inplace(coll_t c)
{
  return c != C_BCAST && c != C_ALLTOALL && c != C_SENDRECV;
}

typedef struct {
  coll_t coll;
  ncclDataType_t type;
  ncclRedOp_t op;
  int inplace;
  size_t count; /* per-rank count: recvcount for reducescatter, sendcount
                   for allgather, per-peer count for alltoall/gather/scatter */
  int root;
  int pattern;  /* sendrecv: 0 = ring, 1 = all pairs including self */
  uint32_t seed;
} tcase;

static const size_t small_counts[] = {0, 1, 7};

/* Enumerates the cases of one collective for nranks; writes them to out
 * when out is not NULL. Returns how many there are. Every rank calls this
 * and gets the same list in the same order. */
static size_t make_cases(coll_t coll, int nranks, int big, tcase *out)
{
  size_t n = 0;
  int nroots = coll_has_root(coll) ? (nranks > 1 ? 2 : 1) : 1;
  int nplace = coll_has_inplace(coll) ? 2 : 1;
  int nops = coll_has_op(coll) ? (int)ncclNumOps : 1;
  int npat = coll == C_SENDRECV ? 2 : 1;
  for (int t = 0; t < (int)ncclNumTypes; t++)
    for (int op = 0; op < nops; op++)
      for (int ip = 0; ip < nplace; ip++)
        for (size_t ci = 0; ci < sizeof(small_counts) / sizeof(small_counts[0]) + 1; ci++)
          for (int ri = 0; ri < nroots; ri++)
            for (int pat = 0; pat < npat; pat++) {
              size_t count;
              if (!harness_race_keeps((ncclDataType_t)t, (ncclRedOp_t)op))
                continue;
              if (ci < sizeof(small_counts) / sizeof(small_counts[0])) {
                count = small_counts[ci];
              } else {
                /* the big count only for int8 and float, with sum */
                if (!big || op != ncclSum ||
                    (t != ncclInt8 && t != ncclFloat32))
                  continue;
                count = big_count();
              }
              if (out != NULL) {
                tcase *c = &out[n];
                c->coll = coll;
                c->type = (ncclDataType_t)t;
                c->op = (ncclRedOp_t)op;
                c->inplace = coll == C_BCAST ? 1 : ip;
                c->count = count;
                c->root = ri == 0 ? 0 : nranks - 1;
                c->pattern = pat;
                c->seed = (uint32_t)(coll * 100000 + n + 1);
              }
              n++;
            }
  return n;
}

static void case_name(const tcase *c, char *buf, size_t len)
{
  int k = snprintf(buf, len, "%s %s", coll_names[c->coll],
                   harness_type_name(c->type));
  if (coll_has_op(c->coll))
    k += snprintf(buf + k, len - (size_t)k, " %s", harness_op_name(c->op));
  if (coll_has_inplace(c->coll))
    k += snprintf(buf + k, len - (size_t)k, " %s",
                  c->inplace ? "in-place" : "out-of-place");
  k += snprintf(buf + k, len - (size_t)k, " count=%zu", c->count);
  if (coll_has_root(c->coll))
    k += snprintf(buf + k, len - (size_t)k, " root=%d", c->root);
  if (c->coll == C_SENDRECV)
    snprintf(buf + k, len - (size_t)k, " %s",
             c->pattern ? "all-pairs" : "ring");
}

/* ------------------------------------------------------------------------ */
/* Buffers with a guard zone after the end                                  */
/* ------------------------------------------------------------------------ */

static void *galloc(size_t bytes)
{
  unsigned char *p = malloc(bytes + GUARD);
  if (p != NULL) harness_fill_bytes(p + bytes, GUARD, 0x6a6a, (uint32_t)bytes);
  return p;
}

static int guard_ok(const void *p, size_t bytes)
{
  unsigned char g[GUARD];
  harness_fill_bytes(g, GUARD, 0x6a6a, (uint32_t)bytes);
  return memcmp((const unsigned char *)p + bytes, g, GUARD) == 0;
}

/* Result of one case on one rank. */
enum { CASE_OK = 0, CASE_WRONG = 1, CASE_CALL_FAILED = 2 };

struct outcome {
  int rc;
  char msg[512];
};

static void wrong(struct outcome *o, const char *fmt, const char *detail)
{
  if (o->rc == CASE_OK) {
    o->rc = CASE_WRONG;
    snprintf(o->msg, sizeof(o->msg), fmt, detail);
  }
}

static int call_failed(struct outcome *o, ncclComm_t comm, const char *what,
                       ncclResult_t r)
{
  o->rc = CASE_CALL_FAILED;
  snprintf(o->msg, sizeof(o->msg), "%s returned %s: %s", what,
           ncclGetErrorString(r), ncclGetLastError(comm));
  return -1;
}

#define CALL(o, comm, what, expr)                                            \
  do {                                                                       \
    ncclResult_t r_ = (expr);                                                \
    if (r_ != ncclSuccess) {                                                 \
      call_failed((o), (comm), (what), r_);                                  \
      goto out;                                                              \
    }                                                                        \
  } while (0)

/* The all-gathered hash check; a collective, so every rank calls it. */
static void check_same(struct outcome *o, ncclComm_t comm, const void *buf,
                       size_t bytes)
{
  int s = harness_same_on_all_ranks(comm, buf, bytes);
  if (s < 0) {
    o->rc = CASE_CALL_FAILED;
    snprintf(o->msg, sizeof(o->msg), "hash all-gather failed: %s",
             ncclGetLastError(comm));
  } else if (s > 0) {
    wrong(o, "%s", "result is not bit-identical on every rank");
  }
}

/* Stream ids for the byte patterns of the data-movement collectives. */
static uint32_t chunk_stream(int src, int dst) { return (uint32_t)(src * 256 + dst); }

/* ------------------------------------------------------------------------ */
/* One case per collective                                                  */
/* ------------------------------------------------------------------------ */

static void run_allreduce(const tcase *c, int rank, int n, ncclComm_t comm,
                          struct outcome *o)
{
  size_t nb = c->count * harness_type_size(c->type);
  char m[256];
  unsigned char *send = galloc(nb);
  unsigned char *recv = c->inplace ? send : galloc(nb);
  unsigned char *orig = malloc(nb + 1), *exp = malloc(nb + 1);
  harness_fill_input(send, c->type, c->op, n, rank, 0, c->count, c->seed);
  memcpy(orig, send, nb);
  if (!c->inplace) harness_fill_bytes(recv, nb, c->seed, 0xdead);
  harness_fill_expected(exp, c->type, c->op, n, 0, c->count, c->seed);
  CALL(o, comm, "ncclAllReduce",
       ncclAllReduce(send, recv, c->count, c->type, c->op, comm, NULL));
  if (harness_check(recv, exp, c->type, c->op, n, c->count, m, sizeof(m)))
    wrong(o, "%s", m);
  if (!c->inplace && memcmp(send, orig, nb) != 0)
    wrong(o, "%s", "sendbuff was modified");
  if (!guard_ok(recv, nb) || !guard_ok(send, nb))
    wrong(o, "%s", "wrote past the end of a buffer");
  check_same(o, comm, recv, nb);
out:
  if (!c->inplace) free(recv);
  free(send);
  free(orig);
  free(exp);
}

static void run_broadcast(const tcase *c, int rank, int n, ncclComm_t comm,
                          struct outcome *o)
{
  (void)n;
  size_t nb = c->count * harness_type_size(c->type);
  char m[256];
  unsigned char *send = galloc(nb);
  unsigned char *recv = c->inplace ? send : galloc(nb);
  unsigned char *orig = malloc(nb + 1), *exp = malloc(nb + 1);
  harness_fill_bytes(exp, nb, c->seed, chunk_stream(c->root, 0));
  if (rank == c->root) memcpy(send, exp, nb);
  else harness_fill_bytes(send, nb, c->seed, chunk_stream(rank, 1));
  if (!c->inplace) harness_fill_bytes(recv, nb, c->seed, chunk_stream(rank, 2));
  memcpy(orig, send, nb);
  if (c->coll == C_BCAST)
    CALL(o, comm, "ncclBcast",
         ncclBcast(recv, c->count, c->type, c->root, comm, NULL));
  else
    CALL(o, comm, "ncclBroadcast",
         ncclBroadcast(send, recv, c->count, c->type, c->root, comm, NULL));
  if (harness_check_bytes(recv, exp, nb, m, sizeof(m))) wrong(o, "%s", m);
  if (!c->inplace && memcmp(send, orig, nb) != 0)
    wrong(o, "%s", "sendbuff was modified");
  if (!guard_ok(recv, nb) || !guard_ok(send, nb))
    wrong(o, "%s", "wrote past the end of a buffer");
  check_same(o, comm, recv, nb);
out:
  if (!c->inplace) free(recv);
  free(send);
  free(orig);
  free(exp);
}

static void run_reduce(const tcase *c, int rank, int n, ncclComm_t comm,
                       struct outcome *o)
{
  size_t nb = c->count * harness_type_size(c->type);
  char m[256];
  int is_root = rank == c->root;
  unsigned char *send = galloc(nb);
  unsigned char *recv = NULL;
  unsigned char *orig = malloc(nb + 1), *exp = malloc(nb + 1);
  if (c->inplace) recv = send;
  /* recvbuff may be NULL except on the root: exercise that when the root is
   * the last rank, pass a buffer otherwise */
  else if (is_root || c->root == 0) recv = galloc(nb);
  harness_fill_input(send, c->type, c->op, n, rank, 0, c->count, c->seed);
  memcpy(orig, send, nb);
  if (recv != NULL && !c->inplace)
    harness_fill_bytes(recv, nb, c->seed, 0xdead);
  harness_fill_expected(exp, c->type, c->op, n, 0, c->count, c->seed);
  CALL(o, comm, "ncclReduce",
       ncclReduce(send, recv, c->count, c->type, c->op, c->root, comm, NULL));
  if (is_root &&
      harness_check(recv, exp, c->type, c->op, n, c->count, m, sizeof(m)))
    wrong(o, "%s", m);
  if (!c->inplace && memcmp(send, orig, nb) != 0)
    wrong(o, "%s", "sendbuff was modified");
  if (!guard_ok(send, nb) || (recv != NULL && !guard_ok(recv, nb)))
    wrong(o, "%s", "wrote past the end of a buffer");
out:
  if (recv != NULL && !c->inplace) free(recv);
  free(send);
  free(orig);
  free(exp);
}

static void run_allgather(const tcase *c, int rank, int n, ncclComm_t comm,
                          struct outcome *o)
{
  size_t nb = c->count * harness_type_size(c->type);
  size_t total = nb * (size_t)n;
  char m[256];
  unsigned char *recv = galloc(total);
  unsigned char *send = c->inplace ? recv + (size_t)rank * nb : galloc(nb);
  unsigned char *exp = malloc(total + 1), *orig = malloc(nb + 1);
  for (int r = 0; r < n; r++)
    harness_fill_bytes(exp + (size_t)r * nb, nb, c->seed, chunk_stream(r, 0));
  if (!c->inplace) harness_fill_bytes(recv, total, c->seed, 0xdead);
  else harness_fill_bytes(recv, total, c->seed, 0xbeef);
  memcpy(send, exp + (size_t)rank * nb, nb);
  memcpy(orig, send, nb);
  CALL(o, comm, "ncclAllGather",
       ncclAllGather(send, recv, c->count, c->type, comm, NULL));
  if (harness_check_bytes(recv, exp, total, m, sizeof(m))) wrong(o, "%s", m);
  if (!c->inplace && memcmp(send, orig, nb) != 0)
    wrong(o, "%s", "sendbuff was modified");
  if (!guard_ok(recv, total) || (!c->inplace && !guard_ok(send, nb)))
    wrong(o, "%s", "wrote past the end of a buffer");
  check_same(o, comm, recv, total);
out:
  if (!c->inplace) free(send);
  free(recv);
  free(exp);
  free(orig);
}

static void run_reducescatter(const tcase *c, int rank, int n,
                              ncclComm_t comm, struct outcome *o)
{
  size_t es = harness_type_size(c->type);
  size_t nb = c->count * es;
  size_t total = nb * (size_t)n;
  char m[256];
  unsigned char *send = galloc(total);
  unsigned char *recv = c->inplace ? send + (size_t)rank * nb : galloc(nb);
  unsigned char *exp = malloc(nb + 1), *orig = malloc(total + 1);
  harness_fill_input(send, c->type, c->op, n, rank, 0, c->count * (size_t)n,
                     c->seed);
  memcpy(orig, send, total);
  if (!c->inplace) harness_fill_bytes(recv, nb, c->seed, 0xdead);
  harness_fill_expected(exp, c->type, c->op, n, (size_t)rank * c->count,
                        c->count, c->seed);
  CALL(o, comm, "ncclReduceScatter",
       ncclReduceScatter(send, recv, c->count, c->type, c->op, comm, NULL));
  if (harness_check(recv, exp, c->type, c->op, n, c->count, m, sizeof(m)))
    wrong(o, "%s", m);
  if (!c->inplace && memcmp(send, orig, total) != 0)
    wrong(o, "%s", "sendbuff was modified");
  if (!guard_ok(send, total) || (!c->inplace && !guard_ok(recv, nb)))
    wrong(o, "%s", "wrote past the end of a buffer");
out:
  if (!c->inplace) free(recv);
  free(send);
  free(exp);
  free(orig);
}

static void run_alltoall(const tcase *c, int rank, int n, ncclComm_t comm,
                         struct outcome *o)
{
  size_t nb = c->count * harness_type_size(c->type);
  size_t total = nb * (size_t)n;
  char m[256];
  unsigned char *send = galloc(total), *recv = galloc(total);
  unsigned char *exp = malloc(total + 1), *orig = malloc(total + 1);
  for (int j = 0; j < n; j++) {
    harness_fill_bytes(send + (size_t)j * nb, nb, c->seed, chunk_stream(rank, j));
    harness_fill_bytes(exp + (size_t)j * nb, nb, c->seed, chunk_stream(j, rank));
  }
  memcpy(orig, send, total);
  harness_fill_bytes(recv, total, c->seed, 0xdead);
  CALL(o, comm, "ncclAlltoAll",
       ncclAlltoAll(send, recv, c->count, c->type, comm, NULL));
  if (harness_check_bytes(recv, exp, total, m, sizeof(m))) wrong(o, "%s", m);
  if (memcmp(send, orig, total) != 0) wrong(o, "%s", "sendbuff was modified");
  if (!guard_ok(send, total) || !guard_ok(recv, total))
    wrong(o, "%s", "wrote past the end of a buffer");
out:
  free(send);
  free(recv);
  free(exp);
  free(orig);
}

static void run_gather(const tcase *c, int rank, int n, ncclComm_t comm,
                       struct outcome *o)
{
  size_t nb = c->count * harness_type_size(c->type);
  size_t total = nb * (size_t)n;
  char m[256];
  int is_root = rank == c->root;
  unsigned char *recv = NULL, *send;
  unsigned char *exp = malloc(total + 1), *orig = malloc(nb + 1);
  /* recvbuff is unused off the root: NULL when the root is the last rank */
  if (is_root || c->root == 0) recv = galloc(total);
  if (c->inplace && is_root) send = recv + (size_t)rank * nb;
  else send = galloc(nb);
  for (int r = 0; r < n; r++)
    harness_fill_bytes(exp + (size_t)r * nb, nb, c->seed, chunk_stream(r, 0));
  if (recv != NULL) harness_fill_bytes(recv, total, c->seed, 0xdead);
  memcpy(send, exp + (size_t)rank * nb, nb);
  memcpy(orig, send, nb);
  CALL(o, comm, "ncclGather",
       ncclGather(send, recv, c->count, c->type, c->root, comm, NULL));
  if (is_root && harness_check_bytes(recv, exp, total, m, sizeof(m)))
    wrong(o, "%s", m);
  if (memcmp(send, orig, nb) != 0) wrong(o, "%s", "sendbuff was modified");
  if ((recv != NULL && !guard_ok(recv, total)) ||
      (!(c->inplace && is_root) && !guard_ok(send, nb)))
    wrong(o, "%s", "wrote past the end of a buffer");
out:
  if (!(c->inplace && is_root)) free(send);
  free(recv);
  free(exp);
  free(orig);
}

static void run_scatter(const tcase *c, int rank, int n, ncclComm_t comm,
                        struct outcome *o)
{
  size_t nb = c->count * harness_type_size(c->type);
  size_t total = nb * (size_t)n;
  char m[256];
  int is_root = rank == c->root;
  unsigned char *send = NULL, *recv;
  unsigned char *exp = malloc(nb + 1), *orig = malloc(total + 1);
  /* sendbuff is unused off the root: NULL when the root is the last rank */
  if (is_root || c->root == 0) send = galloc(total);
  if (c->inplace && is_root) recv = send + (size_t)rank * nb;
  else recv = galloc(nb);
  if (send != NULL) {
    if (is_root)
      for (int j = 0; j < n; j++)
        harness_fill_bytes(send + (size_t)j * nb, nb, c->seed,
                           chunk_stream(c->root, j));
    else
      harness_fill_bytes(send, total, c->seed, 0xbeef);
    memcpy(orig, send, total);
  }
  harness_fill_bytes(exp, nb, c->seed, chunk_stream(c->root, rank));
  if (!(c->inplace && is_root)) harness_fill_bytes(recv, nb, c->seed, 0xdead);
  CALL(o, comm, "ncclScatter",
       ncclScatter(send, recv, c->count, c->type, c->root, comm, NULL));
  if (harness_check_bytes(recv, exp, nb, m, sizeof(m))) wrong(o, "%s", m);
  if (send != NULL && memcmp(send, orig, total) != 0)
    wrong(o, "%s", "sendbuff was modified");
  if ((send != NULL && !guard_ok(send, total)) ||
      (!(c->inplace && is_root) && !guard_ok(recv, nb)))
    wrong(o, "%s", "wrote past the end of a buffer");
out:
  if (!(c->inplace && is_root)) free(recv);
  free(send);
  free(exp);
  free(orig);
}

static void run_sendrecv(const tcase *c, int rank, int n, ncclComm_t comm,
                         struct outcome *o)
{
  size_t nb = c->count * harness_type_size(c->type);
  size_t total = nb * (size_t)n;
  char m[256];
  unsigned char *send = galloc(total), *recv = galloc(total);
  unsigned char *exp = malloc(total + 1), *orig = malloc(total + 1);
  int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  harness_fill_bytes(recv, total, c->seed, 0xdead);
  memcpy(exp, recv, total);
  /* chunk j of send goes to rank j; chunk i of recv comes from rank i */
  for (int j = 0; j < n; j++)
    harness_fill_bytes(send + (size_t)j * nb, nb, c->seed, chunk_stream(rank, j));
  if (c->pattern == 0) {
    harness_fill_bytes(exp + (size_t)prev * nb, nb, c->seed, chunk_stream(prev, rank));
  } else {
    for (int i = 0; i < n; i++)
      harness_fill_bytes(exp + (size_t)i * nb, nb, c->seed, chunk_stream(i, rank));
  }
  memcpy(orig, send, total);
  CALL(o, comm, "ncclGroupStart", ncclGroupStart());
  if (c->pattern == 0) {
    ncclResult_t r1 = ncclSend(send + (size_t)next * nb, c->count, c->type,
                               next, comm, NULL);
    ncclResult_t r2 = ncclRecv(recv + (size_t)prev * nb, c->count, c->type,
                               prev, comm, NULL);
    if (r1 != ncclSuccess || r2 != ncclSuccess) {
      ncclGroupEnd();
      call_failed(o, comm, "ncclSend/ncclRecv", r1 != ncclSuccess ? r1 : r2);
      goto out;
    }
  } else {
    /* every pair, self included, posted in a rank-dependent order so a
     * library that pairs operations by posting order would deadlock */
    for (int k = 0; k < n; k++) {
      int p = (rank + k) % n, q = (rank + n - k) % n;
      ncclResult_t r1 = ncclSend(send + (size_t)p * nb, c->count, c->type, p,
                                 comm, NULL);
      ncclResult_t r2 = ncclRecv(recv + (size_t)q * nb, c->count, c->type, q,
                                 comm, NULL);
      if (r1 != ncclSuccess || r2 != ncclSuccess) {
        ncclGroupEnd();
        call_failed(o, comm, "ncclSend/ncclRecv", r1 != ncclSuccess ? r1 : r2);
        goto out;
      }
    }
  }
  CALL(o, comm, "ncclGroupEnd", ncclGroupEnd());
  if (harness_check_bytes(recv, exp, total, m, sizeof(m))) wrong(o, "%s", m);
  if (memcmp(send, orig, total) != 0) wrong(o, "%s", "sendbuff was modified");
  if (!guard_ok(send, total) || !guard_ok(recv, total))
    wrong(o, "%s", "wrote past the end of a buffer");
out:
  free(send);
  free(recv);
  free(exp);
  free(orig);
}

static void run_case(const tcase *c, int rank, int n, ncclComm_t comm,
                     struct outcome *o)
{
  o->rc = CASE_OK;
  o->msg[0] = '\0';
  switch (c->coll) {
  case C_ALLREDUCE: run_allreduce(c, rank, n, comm, o); break;
  case C_BROADCAST:
  case C_BCAST: run_broadcast(c, rank, n, comm, o); break;
  case C_REDUCE: run_reduce(c, rank, n, comm, o); break;
  case C_ALLGATHER: run_allgather(c, rank, n, comm, o); break;
  case C_REDUCESCATTER: run_reducescatter(c, rank, n, comm, o); break;
  case C_ALLTOALL: run_alltoall(c, rank, n, comm, o); break;
  case C_GATHER: run_gather(c, rank, n, comm, o); break;
  case C_SCATTER: run_scatter(c, rank, n, comm, o); break;
  case C_SENDRECV: run_sendrecv(c, rank, n, comm, o); break;
  default: break;
  }
}

struct matrix_arg {
  coll_t coll;
  int big;
};

/* Runs every case of one collective on this rank; returns the number of
 * failed cases. After a call fails the ranks may be out of step, so the
 * rank stops there rather than wait on peers that went on. */
static int matrix_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  const struct matrix_arg *a = arg;
  size_t ncases = make_cases(a->coll, nranks, a->big, NULL);
  tcase *cases = calloc(ncases, sizeof(*cases));
  if (cases == NULL) return 1;
  make_cases(a->coll, nranks, a->big, cases);
  int fails = 0;
  for (size_t i = 0; i < ncases; i++) {
    struct outcome o;
    char name[160];
    run_case(&cases[i], rank, nranks, comm, &o);
    if (o.rc == CASE_OK) continue;
    case_name(&cases[i], name, sizeof(name));
    fprintf(stderr, "[rank %d/%d] FAIL %s: %s\n", rank, nranks, name, o.msg);
    fails++;
    if (o.rc == CASE_CALL_FAILED) {
      fprintf(stderr, "[rank %d/%d] stopping after the failed call (%zu cases "
                      "not run)\n", rank, nranks, ncases - i - 1);
      break;
    }
  }
  free(cases);
  return fails;
}

static void run_matrix(coll_t coll)
{
  /* 4 ranks with the big count; 3 and 2 for odd and minimal rings; 8 for
   * more ranks than cores */
  static const int sizes[] = {4, 3, 2, 8};
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    struct matrix_arg a = {coll, sizes[s] == 4};
    size_t ncases = make_cases(coll, sizes[s], a.big, NULL);
    double t0 = harness_now();
    int rc = harness_run(sizes[s], matrix_body, &a, TIMEOUT_S);
    printf("\n  %s: %zu cases x %d ranks %s (%.1f s)", coll_names[coll],
           ncases, sizes[s], rc == 0 ? "ok" : "FAILED", harness_now() - t0);
    fflush(stdout);
    CU_ASSERT_EQUAL(rc, 0);
  }
  printf("\n");
}

static void test_allreduce(void) { run_matrix(C_ALLREDUCE); }
static void test_broadcast(void) { run_matrix(C_BROADCAST); }
static void test_bcast(void) { run_matrix(C_BCAST); }
static void test_reduce(void) { run_matrix(C_REDUCE); }
static void test_allgather(void) { run_matrix(C_ALLGATHER); }
static void test_reducescatter(void) { run_matrix(C_REDUCESCATTER); }
static void test_alltoall(void) { run_matrix(C_ALLTOALL); }
static void test_gather(void) { run_matrix(C_GATHER); }
static void test_scatter(void) { run_matrix(C_SCATTER); }
static void test_sendrecv(void) { run_matrix(C_SENDRECV); }

/* ------------------------------------------------------------------------ */
/* Pre-multiplied sum                                                       */
/* ------------------------------------------------------------------------ */

/* Rank r's scalar: a power of two so every product is exact. */
static double premul_scalar(int rank) { return rank % 3 == 0 ? 0.5 : rank % 3 == 1 ? 2.0 : 4.0; }

static double premul_input(int rank, size_t i)
{
  return (double)((int)((i * 7 + (size_t)rank * 13) % 61) - 30);
}

static void store_real(ncclDataType_t t, void *buf, size_t i, double v)
{
  if (t == ncclFloat32) ((float *)buf)[i] = (float)v;
  else ((double *)buf)[i] = v;
}

static int premul_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  static const ncclDataType_t types[] = {ncclFloat32, ncclFloat64};
  static const size_t counts[] = {1, 7, 1000};
  int fails = 0;
  for (size_t ti = 0; ti < 2; ti++) {
    ncclDataType_t t = types[ti];
    size_t es = harness_type_size(t);
    ncclRedOp_t op;
    union { float f; double d; } scalar;
    if (t == ncclFloat32) scalar.f = (float)premul_scalar(rank);
    else scalar.d = premul_scalar(rank);
    ncclResult_t r = ncclRedOpCreatePreMulSum(&op, &scalar, t,
                                              ncclScalarHostImmediate, comm);
    if (r != ncclSuccess) {
      fprintf(stderr, "[rank %d] ncclRedOpCreatePreMulSum(%s): %s: %s\n", rank,
              harness_type_name(t), ncclGetErrorString(r),
              ncclGetLastError(comm));
      return fails + 1;
    }
    if ((int)op < (int)ncclNumOps) {
      fprintf(stderr, "[rank %d] premulsum op %d is a built-in op value\n",
              rank, (int)op);
      fails++;
    }
    /* host-immediate: the scalar was read during the create call */
    if (t == ncclFloat32) scalar.f = 1000.0f;
    else scalar.d = 1000.0;

    for (size_t ci = 0; ci < 3; ci++) {
      size_t count = counts[ci];
      size_t nb = count * es;
      unsigned char *send = malloc(nb * (size_t)nranks);
      unsigned char *recv = malloc(nb * (size_t)nranks);
      unsigned char *exp = malloc(nb * (size_t)nranks);
      for (size_t i = 0; i < count * (size_t)nranks; i++) {
        double sum = 0;
        for (int q = 0; q < nranks; q++)
          sum += premul_scalar(q) * premul_input(q, i);
        store_real(t, send, i, premul_input(rank, i));
        store_real(t, exp, i, sum);
      }
      char m[256];
      for (int variant = 0; variant < 4; variant++) {
        const char *what = variant == 0   ? "allreduce out-of-place"
                           : variant == 1 ? "allreduce in-place"
                           : variant == 2 ? "reduce root=last"
                                          : "reducescatter";
        void *in = send, *outb = recv;
        unsigned char *inplace = NULL;
        if (variant == 1) {
          inplace = malloc(nb);
          memcpy(inplace, send, nb);
          in = outb = inplace;
        }
        if (variant == 3) r = ncclReduceScatter(in, outb, count, t, op, comm, NULL);
        else if (variant == 2) r = ncclReduce(in, outb, count, t, op, nranks - 1, comm, NULL);
        else r = ncclAllReduce(in, outb, count, t, op, comm, NULL);
        if (r != ncclSuccess) {
          fprintf(stderr, "[rank %d] premulsum %s %s count=%zu: %s: %s\n",
                  rank, harness_type_name(t), what, count,
                  ncclGetErrorString(r), ncclGetLastError(comm));
          free(inplace); free(send); free(recv); free(exp);
          return fails + 1;
        }
        const unsigned char *want = variant == 3 ? exp + (size_t)rank * nb : exp;
        int check = variant != 2 || rank == nranks - 1;
        if (check && harness_check(outb, want, t, ncclSum, nranks, count, m,
                                   sizeof(m))) {
          fprintf(stderr, "[rank %d] FAIL premulsum %s %s count=%zu: %s\n",
                  rank, harness_type_name(t), what, count, m);
          fails++;
        }
        free(inplace);
      }
      free(send);
      free(recv);
      free(exp);
    }
    r = ncclRedOpDestroy(op, comm);
    if (r != ncclSuccess) {
      fprintf(stderr, "[rank %d] ncclRedOpDestroy: %s: %s\n", rank,
              ncclGetErrorString(r), ncclGetLastError(comm));
      fails++;
    }
  }
  return fails;
}

static void test_premulsum(void)
{
  CU_ASSERT_EQUAL(harness_run(4, premul_body, NULL, 60.0), 0);
  CU_ASSERT_EQUAL(harness_run(3, premul_body, NULL, 60.0), 0);
}

/* ------------------------------------------------------------------------ */
/* Several collectives fused in one group                                   */
/* ------------------------------------------------------------------------ */

static int group_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  enum { N = 1001 };
  int fails = 0;
  float *a = malloc(N * sizeof(float)), *ea = malloc(N * sizeof(float));
  int32_t *b = malloc(N * sizeof(int32_t)), *eb = malloc(N * sizeof(int32_t));
  unsigned char *c = malloc(N), *ec = malloc(N);
  int32_t *g = malloc((size_t)nranks * N * sizeof(int32_t));
  harness_fill_input(a, ncclFloat32, ncclSum, nranks, rank, 0, N, 11);
  harness_fill_expected(ea, ncclFloat32, ncclSum, nranks, 0, N, 11);
  harness_fill_input(b, ncclInt32, ncclMax, nranks, rank, 0, N, 12);
  harness_fill_expected(eb, ncclInt32, ncclMax, nranks, 0, N, 12);
  harness_fill_bytes(ec, N, 13, 0);
  if (rank == 1) memcpy(c, ec, N);
  else memset(c, 0, N);
  for (int i = 0; i < N; i++) g[(size_t)rank * N + (size_t)i] = rank * 100000 + i;

  ncclGroupStart();
  ncclResult_t r1 = ncclAllReduce(a, a, N, ncclFloat32, ncclSum, comm, NULL);
  ncclResult_t r2 = ncclAllReduce(b, b, N, ncclInt32, ncclMax, comm, NULL);
  ncclResult_t r3 = ncclBroadcast(c, c, N, ncclUint8, 1, comm, NULL);
  ncclResult_t r4 = ncclAllGather(g + (size_t)rank * N, g, N, ncclInt32, comm, NULL);
  ncclResult_t r5 = ncclGroupEnd();
  if (r1 || r2 || r3 || r4 || r5) {
    fprintf(stderr, "[rank %d] grouped calls returned %d %d %d %d, end %d: %s\n",
            rank, r1, r2, r3, r4, r5, ncclGetLastError(comm));
    fails++;
  } else {
    char m[256];
    if (harness_check(a, ea, ncclFloat32, ncclSum, nranks, N, m, sizeof(m))) {
      fprintf(stderr, "[rank %d] FAIL group allreduce float sum: %s\n", rank, m);
      fails++;
    }
    if (harness_check(b, eb, ncclInt32, ncclMax, nranks, N, m, sizeof(m))) {
      fprintf(stderr, "[rank %d] FAIL group allreduce int32 max: %s\n", rank, m);
      fails++;
    }
    if (harness_check_bytes(c, ec, N, m, sizeof(m))) {
      fprintf(stderr, "[rank %d] FAIL group broadcast: %s\n", rank, m);
      fails++;
    }
    for (int r = 0; r < nranks; r++)
      for (int i = 0; i < N; i++)
        if (g[(size_t)r * N + (size_t)i] != r * 100000 + i) {
          fprintf(stderr, "[rank %d] FAIL group allgather: element %d of "
                          "rank %d\n", rank, i, r);
          fails++;
          r = nranks;
          break;
        }
  }
  free(a); free(ea); free(b); free(eb); free(c); free(ec); free(g);
  return fails;
}

static void test_group_mixed(void)
{
  CU_ASSERT_EQUAL(harness_run(4, group_body, NULL, 60.0), 0);
}

/* ------------------------------------------------------------------------ */
/* Communicator queries and split                                           */
/* ------------------------------------------------------------------------ */

/* A reduce-scatter whose segments hold many chunks: 8 MiB per rank in
 * 16 KiB chunks (512 per segment), 5 ranks, one stream.  geoRingRun
 * forwards partial sums from slots it reuses once their sends complete;
 * with 2 x GEOCCL_WINDOW slots the ring waited on itself unless the
 * transport buffered most of a segment per link, and this hung (then timed
 * out) over TCP and the same-host fast path alike. */
#define RS_MANY_COUNT ((size_t)2 << 20) /* floats per rank */

static int rs_many_chunks_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  size_t total = RS_MANY_COUNT * (size_t)nranks;
  float *send = malloc(total * sizeof(float)), *recv = malloc(RS_MANY_COUNT * sizeof(float));
  float *exp = malloc(RS_MANY_COUNT * sizeof(float));
  char m[256];
  int fails = 0;
  if (send == NULL || recv == NULL || exp == NULL) return 1;
  harness_fill_input(send, ncclFloat32, ncclSum, nranks, rank, 0, total, 11);
  harness_fill_expected(exp, ncclFloat32, ncclSum, nranks, (size_t)rank * RS_MANY_COUNT,
                        RS_MANY_COUNT, 11);
  ncclResult_t r = ncclReduceScatter(send, recv, RS_MANY_COUNT, ncclFloat32, ncclSum, comm,
                                     NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclReduceScatter: %s: %s\n", rank, ncclGetErrorString(r),
            ncclGetLastError(comm));
    fails++;
  } else if (harness_check(recv, exp, ncclFloat32, ncclSum, nranks, RS_MANY_COUNT, m,
                           sizeof(m))) {
    fprintf(stderr, "[rank %d] reduce-scatter wrong: %s\n", rank, m);
    fails++;
  }
  free(send);
  free(recv);
  free(exp);
  return fails;
}

static void test_reducescatter_many_chunks(void)
{
  setenv("GEOCCL_CHUNK_SIZE", "16K", 1);
  setenv("GEOCCL_NSTREAMS", "1", 1);
  setenv("GEOCCL_TIMEOUT", "10", 1); /* a hang fails in seconds */
  ncclResetDebugInit();
  CU_ASSERT_EQUAL(harness_run(5, rs_many_chunks_body, NULL, 60.0), 0);
  unsetenv("GEOCCL_CHUNK_SIZE");
  unsetenv("GEOCCL_NSTREAMS");
  unsetenv("GEOCCL_TIMEOUT");
  ncclResetDebugInit();
}

static void test_version(void)
{
  int v = 0;
  CU_ASSERT_EQUAL(ncclGetVersion(&v), ncclSuccess);
  CU_ASSERT(v >= 22800);
}

static int query_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  int fails = 0, n = -1, r = -1;
  if (ncclCommCount(comm, &n) != ncclSuccess || n != nranks) {
    fprintf(stderr, "[rank %d] ncclCommCount gave %d, expected %d\n", rank, n,
            nranks);
    fails++;
  }
  if (ncclCommUserRank(comm, &r) != ncclSuccess || r != rank) {
    fprintf(stderr, "[rank %d] ncclCommUserRank gave %d\n", rank, r);
    fails++;
  }
  ncclResult_t async = ncclInternalError;
  if (ncclCommGetAsyncError(comm, &async) != ncclSuccess || async != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommGetAsyncError on a healthy comm gave %s\n",
            rank, ncclGetErrorString(async));
    fails++;
  }
  return fails;
}

static void test_count_userrank(void)
{
  CU_ASSERT_EQUAL(harness_run(4, query_body, NULL, 30.0), 0);
  CU_ASSERT_EQUAL(harness_run(1, query_body, NULL, 30.0), 0);
}

/* All-reduces (sum of int32) each member's parent rank over comm and checks
 * against want. */
static int allreduce_ranks(ncclComm_t comm, int parent_rank, int want,
                           const char *what)
{
  int32_t v[3] = {parent_rank, parent_rank, parent_rank};
  ncclResult_t r = ncclAllReduce(v, v, 3, ncclInt32, ncclSum, comm, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] %s: all-reduce returned %s: %s\n", parent_rank,
            what, ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  if (v[0] != want || v[2] != want) {
    fprintf(stderr, "[rank %d] %s: all-reduce gave %d, expected %d\n",
            parent_rank, what, (int)v[0], want);
    return 1;
  }
  return 0;
}

static int split_body(int rank, int nranks, ncclComm_t comm, void *arg)
{
  (void)arg;
  int fails = 0;
  ncclComm_t sub = NULL;
  int color = rank % 2;

  /* split by parity, ordered by parent rank */
  ncclResult_t r = ncclCommSplit(comm, color, rank, &sub, NULL);
  if (r != ncclSuccess || sub == NULL) {
    fprintf(stderr, "[rank %d] ncclCommSplit(color=%d): %s: %s\n", rank, color,
            ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  int n = -1, ur = -1;
  ncclCommCount(sub, &n);
  ncclCommUserRank(sub, &ur);
  int want_n = (nranks - color + 1) / 2;
  if (n != want_n || ur != rank / 2) {
    fprintf(stderr, "[rank %d] split: count %d rank %d, expected %d and %d\n",
            rank, n, ur, want_n, rank / 2);
    fails++;
  }
  int want = 0;
  for (int q = color; q < nranks; q += 2) want += q;
  fails += allreduce_ranks(sub, rank, want, "parity split");
  if ((r = ncclCommDestroy(sub)) != ncclSuccess) {
    fprintf(stderr, "[rank %d] destroy split comm: %s\n", rank,
            ncclGetErrorString(r));
    fails++;
  }

  /* key reverses the order; the last rank opts out with NCCL_SPLIT_NOCOLOR */
  sub = NULL;
  int c2 = rank == nranks - 1 ? NCCL_SPLIT_NOCOLOR : 7;
  r = ncclCommSplit(comm, c2, nranks - rank, &sub, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommSplit(color=%d): %s: %s\n", rank, c2,
            ncclGetErrorString(r), ncclGetLastError(comm));
    return fails + 1;
  }
  if (c2 == NCCL_SPLIT_NOCOLOR) {
    if (sub != NULL) {
      fprintf(stderr, "[rank %d] NOCOLOR split returned a communicator\n", rank);
      fails++;
    }
  } else {
    ncclCommCount(sub, &n);
    ncclCommUserRank(sub, &ur);
    if (n != nranks - 1 || ur != nranks - 2 - rank) {
      fprintf(stderr, "[rank %d] reversed split: count %d rank %d, expected "
                      "%d and %d\n", rank, n, ur, nranks - 1, nranks - 2 - rank);
      fails++;
    }
    fails += allreduce_ranks(sub, rank, (nranks - 1) * (nranks - 2) / 2,
                             "reversed split");
    ncclCommDestroy(sub);
  }

  /* the parent still works */
  fails += allreduce_ranks(comm, rank, nranks * (nranks - 1) / 2,
                           "parent after split");
  return fails;
}

static void test_comm_split(void)
{
  CU_ASSERT_EQUAL(harness_run(4, split_body, NULL, 60.0), 0);
}

/* ------------------------------------------------------------------------ */
/* Non-blocking communicator (config.blocking = 0) and ncclCommFinalize     */
/* ------------------------------------------------------------------------ */

/* Polls ncclCommGetAsyncError until the communicator is no longer busy. */
static ncclResult_t wait_not_in_progress(ncclComm_t comm, double timeout_s)
{
  double end = harness_now() + timeout_s;
  ncclResult_t st = ncclInProgress;
  while (harness_now() < end) {
    ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
    if (st != ncclInProgress) return st;
    struct timespec ts = {0, 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return ncclInProgress;
}

static int nonblocking_body(int rank, int nranks, const ncclUniqueId *id,
                            void *arg)
{
  (void)arg;
  enum { N = 10007 };
  int fails = 0;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, *id, rank, &cfg);
  if (r != ncclSuccess && r != ncclInProgress) {
    fprintf(stderr, "[rank %d] non-blocking ncclCommInitRankConfig: %s: %s\n",
            rank, ncclGetErrorString(r), ncclGetLastError(NULL));
    return 1;
  }
  if (comm == NULL) {
    fprintf(stderr, "[rank %d] non-blocking init gave no comm handle\n", rank);
    return 1;
  }
  r = wait_not_in_progress(comm, 30.0);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] non-blocking init ended with %s: %s\n", rank,
            ncclGetErrorString(r), ncclGetLastError(comm));
    ncclCommAbort(comm);
    return 1;
  }
  float *x = malloc(N * sizeof(float)), *e = malloc(N * sizeof(float));
  harness_fill_input(x, ncclFloat32, ncclSum, nranks, rank, 0, N, 77);
  harness_fill_expected(e, ncclFloat32, ncclSum, nranks, 0, N, 77);
  r = ncclAllReduce(x, x, N, ncclFloat32, ncclSum, comm, NULL);
  if (r == ncclInProgress) r = wait_not_in_progress(comm, 30.0);
  char m[256];
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] non-blocking all-reduce: %s: %s\n", rank,
            ncclGetErrorString(r), ncclGetLastError(comm));
    fails++;
  } else if (harness_check(x, e, ncclFloat32, ncclSum, nranks, N, m, sizeof(m))) {
    fprintf(stderr, "[rank %d] non-blocking all-reduce: %s\n", rank, m);
    fails++;
  }
  /* finalize flushes, then destroy frees */
  r = ncclCommFinalize(comm);
  if (r == ncclInProgress) r = wait_not_in_progress(comm, 30.0);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommFinalize: %s: %s\n", rank,
            ncclGetErrorString(r), ncclGetLastError(comm));
    fails++;
  }
  r = ncclCommDestroy(comm);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommDestroy after finalize: %s\n", rank,
            ncclGetErrorString(r));
    fails++;
  }
  free(x);
  free(e);
  return fails;
}

static void test_nonblocking(void)
{
  CU_ASSERT_EQUAL(harness_run_noinit(4, nonblocking_body, NULL, 60.0), 0);
}

/* ------------------------------------------------------------------------ */
/* ncclCommInitAll: three communicators driven from one thread              */
/* ------------------------------------------------------------------------ */

static int init_all_body(int rank, int nranks, const ncclUniqueId *id,
                         void *arg)
{
  (void)rank; (void)nranks; (void)id; (void)arg;
  enum { NC = 3, N = 4097 };
  ncclComm_t comms[NC] = {NULL, NULL, NULL};
  int fails = 0;
  ncclResult_t r = ncclCommInitAll(comms, NC, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "ncclCommInitAll: %s: %s\n", ncclGetErrorString(r),
            ncclGetLastError(NULL));
    return 1;
  }
  for (int i = 0; i < NC; i++) {
    int n = -1, ur = -1;
    ncclCommCount(comms[i], &n);
    ncclCommUserRank(comms[i], &ur);
    if (n != NC || ur != i) {
      fprintf(stderr, "InitAll comm %d: count %d rank %d\n", i, n, ur);
      fails++;
    }
  }
  float *buf[NC], *exp = malloc(N * sizeof(float));
  int64_t *ib[NC], *iexp = malloc(N * sizeof(int64_t));
  harness_fill_expected(exp, ncclFloat32, ncclSum, NC, 0, N, 5);
  harness_fill_expected(iexp, ncclInt64, ncclMin, NC, 0, N, 6);
  for (int i = 0; i < NC; i++) {
    buf[i] = malloc(N * sizeof(float));
    ib[i] = malloc(N * sizeof(int64_t));
    harness_fill_input(buf[i], ncclFloat32, ncclSum, NC, i, 0, N, 5);
    harness_fill_input(ib[i], ncclInt64, ncclMin, NC, i, 0, N, 6);
  }
  for (int round = 0; round < 2 && fails == 0; round++) {
    ncclGroupStart();
    for (int i = 0; i < NC; i++) {
      if (round == 0)
        r = ncclAllReduce(buf[i], buf[i], N, ncclFloat32, ncclSum, comms[i], NULL);
      else
        r = ncclAllReduce(ib[i], ib[i], N, ncclInt64, ncclMin, comms[i], NULL);
      if (r != ncclSuccess) {
        fprintf(stderr, "InitAll: all-reduce on comm %d: %s\n", i,
                ncclGetErrorString(r));
        fails++;
      }
    }
    r = ncclGroupEnd();
    if (r != ncclSuccess) {
      fprintf(stderr, "InitAll: ncclGroupEnd: %s: %s\n", ncclGetErrorString(r),
              ncclGetLastError(NULL));
      fails++;
    }
  }
  char m[256];
  for (int i = 0; i < NC && fails == 0; i++) {
    if (harness_check(buf[i], exp, ncclFloat32, ncclSum, NC, N, m, sizeof(m))) {
      fprintf(stderr, "InitAll comm %d float sum: %s\n", i, m);
      fails++;
    }
    if (harness_check(ib[i], iexp, ncclInt64, ncclMin, NC, N, m, sizeof(m))) {
      fprintf(stderr, "InitAll comm %d int64 min: %s\n", i, m);
      fails++;
    }
  }
  for (int i = 0; i < NC; i++) {
    if (comms[i] != NULL && ncclCommDestroy(comms[i]) != ncclSuccess) fails++;
    free(buf[i]);
    free(ib[i]);
  }
  free(exp);
  free(iexp);
  return fails;
}

static void test_init_all(void)
{
  harness_opts o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = 60.0;
  o.make_id = 0;
  CU_ASSERT_EQUAL(harness_run_opts(1, init_all_body, NULL, &o), 0);
}

/* ------------------------------------------------------------------------ */
/* GEOCCL_COMM_ID bootstrap: no id from the parent                          */
/* ------------------------------------------------------------------------ */

/* The library reads GEOCCL_COMM_ID once per process, and a forked child
 * inherits what its parent read before the variable was set. So each rank
 * re-executes this program (argv: --env-rank RANK NRANKS) and starts with a
 * fresh library; env_rank_main is what it runs. */
static int env_rank_main(int rank, int nranks)
{
  ncclUniqueId mine;
  ncclComm_t comm = NULL;
  /* under GEOCCL_COMM_ID this only encodes the address: no exchange */
  ncclResult_t r = ncclGetUniqueId(&mine);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclGetUniqueId under GEOCCL_COMM_ID: %s: %s\n",
            rank, ncclGetErrorString(r), ncclGetLastError(NULL));
    return 1;
  }
  r = ncclCommInitRank(&comm, nranks, mine, rank);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommInitRank under GEOCCL_COMM_ID=%s: %s: "
                    "%s\n", rank, getenv("GEOCCL_COMM_ID"),
            ncclGetErrorString(r), ncclGetLastError(NULL));
    return 1;
  }
  int fails = allreduce_ranks(comm, rank, nranks * (nranks - 1) / 2,
                              "GEOCCL_COMM_ID comm");
  if (ncclCommDestroy(comm) != ncclSuccess) fails++;
  return fails;
}

static int env_id_body(int rank, int nranks, const ncclUniqueId *id,
                       void *arg)
{
  (void)id; (void)arg;
  char r[16], n[16];
  snprintf(r, sizeof(r), "%d", rank);
  snprintf(n, sizeof(n), "%d", nranks);
  execl("/proc/self/exe", "test_collectives", "--env-rank", r, n, (char *)NULL);
  perror("exec /proc/self/exe");
  return 1;
}

static void test_comm_id_env(void)
{
  int port = harness_free_port();
  CU_ASSERT_FATAL(port > 0);
  char addr[64];
  snprintf(addr, sizeof(addr), "127.0.0.1:%d", port);
  setenv("GEOCCL_COMM_ID", addr, 1);
  /* a 256-bit key as 64 hex digits: no scrypt at each rank's init */
  setenv("GEOCCL_COMM_SECRET",
         "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", 1);
  harness_opts o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = 60.0;
  o.make_id = 0;
  int rc = harness_run_opts(4, env_id_body, NULL, &o);
  unsetenv("GEOCCL_COMM_ID");
  unsetenv("GEOCCL_COMM_SECRET");
  CU_ASSERT_EQUAL(rc, 0);
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
  harness_setup_env();
  if (argc == 4 && strcmp(argv[1], "--env-rank") == 0)
    return env_rank_main(atoi(argv[2]), atoi(argv[3]));

  if (CU_initialize_registry() != CUE_SUCCESS) return CU_get_error();
  CU_pSuite s = CU_add_suite("collectives", NULL, NULL);
  if (s == NULL) {
    CU_cleanup_registry();
    return CU_get_error();
  }
  CU_add_test(s, "ncclGetVersion >= 22800", test_version);
  CU_add_test(s, "ncclCommCount/ncclCommUserRank", test_count_userrank);
  CU_add_test(s, "allreduce", test_allreduce);
  CU_add_test(s, "broadcast", test_broadcast);
  CU_add_test(s, "bcast", test_bcast);
  CU_add_test(s, "reduce", test_reduce);
  CU_add_test(s, "allgather", test_allgather);
  CU_add_test(s, "reducescatter", test_reducescatter);
  CU_add_test(s, "alltoall", test_alltoall);
  CU_add_test(s, "gather", test_gather);
  CU_add_test(s, "scatter", test_scatter);
  CU_add_test(s, "send/recv ring and all-pairs in groups", test_sendrecv);
  CU_add_test(s, "premulsum float/double", test_premulsum);
  CU_add_test(s, "mixed collectives in one group", test_group_mixed);
  CU_add_test(s, "ncclCommSplit", test_comm_split);
  CU_add_test(s, "non-blocking init, finalize, destroy", test_nonblocking);
  CU_add_test(s, "ncclCommInitAll from one thread", test_init_all);
  CU_add_test(s, "GEOCCL_COMM_ID bootstrap", test_comm_id_env);
  CU_add_test(s, "reduce-scatter of 512 chunks per segment, 5 ranks, 1 stream",
              test_reducescatter_many_chunks);

  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failures = CU_get_number_of_failures();
  CU_cleanup_registry();
  return failures != 0;
}
