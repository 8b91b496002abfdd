/*
 * Hierarchical all-reduce (comm/coll/coll_hier.c) over forked ranks on loopback.
 *
 * Each rank sets GEOCCL_REGION to its label before ncclCommInitRank, which
 * gives the communicator more than one region and so routes ncclAllReduce
 * through the hierarchical algorithm. One CUnit test per region layout
 * (2x2, 3x2, 3+1, 1+3, interleaved 3+2, 2x1, 4x1, 2x4); in each, the ranks
 * run every data type x every op x in-place/out-of-place x counts
 * {0, 1, 2, 7}, 1000003 elements for float sum and int8 max, and a
 * pre-multiplied float sum. Results must equal the reference of
 * tests/helpers/harness.c byte for byte (within rounding where the harness says the
 * result is approximate), be bit-identical on every rank, leave the send
 * buffer alone and write nothing past the end of the output.
 *
 * Each layout test also checks geocclCommGetRegion against the map the
 * labels imply, that geocclCommGetStats counts every all-reduce as
 * hierarchical, and the bytes of a 1000003-float sum: each rank's WAN bytes
 * equal what the piece arithmetic described in coll_hier.c implies, each
 * region's WAN total is 2(k-1)/k of the buffer (k regions) within rounding,
 * and each region's intra bytes are 2(n-1) times the buffer (n ranks: a ring
 * reduce-scatter and all-gather).
 *
 * Regions of several emulated hosts (GEOCCL_NODE_RANKS: every run of that
 * many ranks of a region is one node) run the node stage, then the region
 * stage (comm/coll/coll_hier_node.c): the same checks, with the WAN bytes
 * of the nested segments that leaves each rank.
 *
 * Then: GEOCCL_ALGO=flat on the 3x2 layout runs flat, gives the same bits
 * as the hierarchical run and sends more over the WAN; and
 * GEOCCL_HIER_SLICE=4096 (and 4100) cuts a 1000003-element all-reduce into
 * hundreds of pipelined slices, still exact and with the bytes the slice
 * arithmetic implies.
 *
 * Forked ranks share a host, so by default every region of several ranks
 * reads its members' buffers directly (GEOCCL_CMA, comm/coll/cma.h; each rank
 * checks geocclCommGetSingleCopy, and the bytes read count as intra bytes,
 * so the 2(n-1) rule holds either way). The last test runs the ring
 * instead: GEOCCL_CMA=0 on every rank (the matrix and small slices), and on
 * rank 1 alone, whose region must then agree on the ring while the other
 * keeps the reads. And one rank's input, then another's in-place buffer, in
 * secret memory (memfd_secret), which process_vm_readv cannot read: those
 * calls must take the ring and still be right.
 *
 * Under the sanitizers (GEOCCL_TEST_TIME_SCALE > 1: tests/run-sanitizers.sh)
 * every test above runs, on every layout, with the same cases, but the
 * large all-reduces of the matrices, byte counts, flat comparison, secret
 * buffers and small slices have 262147 elements instead of 1000003
 * (big_count(); still several single-copy blocks per segment, an uneven
 * split everywhere and hundreds of 4096-byte slices), the ring's slices
 * with GEOCCL_CMA=0 are 40004 bytes, and under thread the type x op
 * matrices are cut as harness_race_matrix() says.  What those runs look
 * for (races, leaks, bad accesses, undefined arithmetic) lies in which
 * paths the calls take, not in how many elements or slices go through
 * them; the full sizes run in the plain build.
 */
#define _GNU_SOURCE
#include <CUnit/Basic.h>
#include <CUnit/CUnit.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <geoccl.h>

#include "tests/helpers/harness.h"

#define TIMEOUT_S 120.0
/* The large all-reduces: 1000003 elements (a float sum is one 4 MB slice
 * of the default slicing), kept for the planned runs whose plan depends
 * on the size (uneven links, a codec per region).  The matrices, the
 * byte counts, the flat comparison, the secret buffers and the small
 * slices use big_count(): the same, but 262147 elements under the
 * sanitizers (harness_time_scale() > 1), where those calls and their
 * references took most of the test's time.  That count still splits
 * unevenly over every region size here (it is odd, and not a multiple of
 * 3, 5 or 7), its float segments still span many 64 KiB blocks of the
 * single-copy reads, and at 4096- and 4100-byte slices it is still
 * hundreds of slices: the same code paths, a quarter of the work. */
#define BIG_COUNT ((size_t)1000003)
#define SANITIZED_BIG_COUNT ((size_t)262147)
static size_t big_count(void)
{
  return harness_time_scale() > 1 ? SANITIZED_BIG_COUNT : BIG_COUNT;
}
#define GUARD 64                 /* bytes checked past the end of outputs */
#define LABEL_LEN 32             /* GEOCCL_REGION labels are shorter */
#define DEFAULT_SLICE (4u << 20) /* GEOCCL_HIER_SLICE default, 4M */

/* ------------------------------------------------------------------------ */
/* Layouts: one region label per rank                                       */
/* ------------------------------------------------------------------------ */

/* The region map the labels imply, computed here independently of the
 * library: regions are numbered in order of their lowest rank. */
struct layout {
  int nranks, nregions;
  char label[HARNESS_MAX_RANKS][LABEL_LEN];
  int region_of[HARNESS_MAX_RANKS];
  int local_rank[HARNESS_MAX_RANKS];
  int size[HARNESS_MAX_RANKS]; /* per region */
  int node_ranks;              /* GEOCCL_NODE_RANKS the ranks set; 0: none */
};

/* Parses "a a b b" into a layout. Returns 0, or -1 for a malformed spec. */
static int layout_parse(const char *spec, struct layout *l)
{
  memset(l, 0, sizeof(*l));
  const char *p = spec;
  while (*p != '\0') {
    while (*p == ' ') p++;
    if (*p == '\0') break;
    size_t n = strcspn(p, " ");
    if (l->nranks == HARNESS_MAX_RANKS || n >= LABEL_LEN) return -1;
    memcpy(l->label[l->nranks], p, n);
    int r = l->nranks++, g = l->nregions;
    /* the region of an earlier rank with the same label, else a new one */
    for (int q = 0; q < r; q++)
      if (strcmp(l->label[q], l->label[r]) == 0) {
        g = l->region_of[q];
        break;
      }
    if (g == l->nregions) l->nregions++;
    l->region_of[r] = g;
    l->local_rank[r] = l->size[g]++;
    p += n;
  }
  return l->nranks > 0 ? 0 : -1;
}

/* The balanced split the algorithm uses for segments and parts: element
 * range i of count split n ways, the first count % n ranges one longer. */
static void seg_range(size_t count, int n, int i, size_t *off, size_t *len)
{
  size_t base = count / (size_t)n, extra = count % (size_t)n;
  *off = (size_t)i * base + ((size_t)i < extra ? (size_t)i : extra);
  *len = base + ((size_t)i < extra ? 1 : 0);
}

static int cmp_size(const void *a, const void *b)
{
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? -1 : x > y;
}

/* The segment local rank i of region q holds after the reduce-scatter of
 * a slice of len elements: seg_range's, or where GEOCCL_NODE_RANKS = G
 * makes the region H >= 2 nodes of G >= 2 ranks (every G ranks in rank
 * order one node), the node stage's: part i / G (its node) of node
 * segment i % G (its place on the node), as coll_hier_node.c says. */
static void rank_seg(const struct layout *l, size_t len, int q, int i, size_t *off,
                     size_t *n)
{
  const int G = l->node_ranks, P = l->size[q];
  if (G < 2 || P % G != 0 || P / G < 2) {
    seg_range(len, P, i, off, n);
    return;
  }
  size_t no, nl, ro;
  seg_range(len, G, i % G, &no, &nl);
  seg_range(nl, P / G, i / G, &ro, n);
  *off = no + ro;
}

/* Bytes `rank` sends to other regions in one hierarchical all-reduce of
 * count elements of es bytes, per the contract in coll_hier.c: per slice,
 * the starts of every region's reduce-scatter segments cut my segment into
 * pieces; piece p is split k ways; I send the k-1 parts that are not mine
 * (X1) and my finished part to the k-1 other owners (X2). */
static uint64_t hier_wan_bytes(const struct layout *l, int rank, size_t count,
                               size_t es, size_t slice_bytes)
{
  const int k = l->nregions, g = l->region_of[rank];
  const size_t se = slice_bytes / es ? slice_bytes / es : 1;
  uint64_t elems = 0;
  for (size_t s0 = 0; s0 < count; s0 += se) {
    size_t len = count - s0 < se ? count - s0 : se;
    size_t mo, ml, cuts[HARNESS_MAX_RANKS + 2];
    int nc = 0;
    rank_seg(l, len, g, l->local_rank[rank], &mo, &ml);
    cuts[nc++] = mo;
    cuts[nc++] = mo + ml;
    for (int q = 0; q < k; q++)
      for (int i = 0; i < l->size[q]; i++) {
        size_t o, n;
        rank_seg(l, len, q, i, &o, &n);
        if (q != g && o > mo && o < mo + ml) cuts[nc++] = o;
      }
    qsort(cuts, (size_t)nc, sizeof(cuts[0]), cmp_size);
    for (int c = 0; c + 1 < nc; c++) {
      size_t plen = cuts[c + 1] - cuts[c], po, pn;
      if (plen == 0) continue;
      seg_range(plen, k, g, &po, &pn);
      elems += (plen - pn) + (uint64_t)(k - 1) * pn;
    }
  }
  return elems * es;
}

/* ------------------------------------------------------------------------ */
/* Cases                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
  ncclDataType_t type;
  ncclRedOp_t op;
  int inplace;
  size_t count;
  uint32_t seed;
} tcase;

/* 2 is fewer elements than regions in the 3- and 4-region layouts */
static const size_t small_counts[] = {0, 1, 2, 7};
#define NSMALL (sizeof(small_counts) / sizeof(small_counts[0]))

/* Every case of the matrix, the same list in the same order on every
 * rank; writes them to out when out is not NULL and returns how many. */
static size_t make_cases(tcase *out)
{
  size_t n = 0;
  for (int t = 0; t < (int)ncclNumTypes; t++)
    for (int op = 0; op < (int)ncclNumOps; op++)
      for (int ip = 0; ip < 2; ip++)
        for (size_t ci = 0; ci <= NSMALL; ci++) {
          size_t count;
          if (!harness_race_keeps((ncclDataType_t)t, (ncclRedOp_t)op))
            continue;
          if (ci < NSMALL) {
            count = small_counts[ci];
          } else {
            int big = (t == ncclFloat32 && op == ncclSum) ||
                      (t == ncclInt8 && op == ncclMax);
            if (!big) continue;
            count = big_count();
          }
          if (out != NULL) {
            out[n].type = (ncclDataType_t)t;
            out[n].op = (ncclRedOp_t)op;
            out[n].inplace = ip;
            out[n].count = count;
            out[n].seed = (uint32_t)(n + 1);
          }
          n++;
        }
  return n;
}

static void case_name(const tcase *c, char *buf, size_t len)
{
  snprintf(buf, len, "allreduce %s %s %s count=%zu", harness_type_name(c->type),
           harness_op_name(c->op), c->inplace ? "in-place" : "out-of-place",
           c->count);
}

/* ------------------------------------------------------------------------ */
/* Buffers with a guard zone, outcomes                                      */
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

enum { CASE_OK = 0, CASE_WRONG = 1, CASE_CALL_FAILED = 2 };

struct outcome {
  int rc;
  char msg[512];
};

static void wrong(struct outcome *o, const char *detail)
{
  if (o->rc == CASE_OK) {
    o->rc = CASE_WRONG;
    snprintf(o->msg, sizeof(o->msg), "%s", detail);
  }
}

static void call_failed(struct outcome *o, ncclComm_t comm, const char *what,
                        ncclResult_t r)
{
  o->rc = CASE_CALL_FAILED;
  snprintf(o->msg, sizeof(o->msg), "%s returned %s: %s", what,
           ncclGetErrorString(r), ncclGetLastError(comm));
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
    wrong(o, "result is not bit-identical on every rank");
  }
}

/* Collectives issued on a communicator, to check geocclCommGetStats. */
struct calls {
  unsigned long long allreduce; /* non-empty all-reduces */
  unsigned long long other;     /* everything else (hash all-gathers) */
};

/* One all-reduce case. If keep is not NULL it receives a copy of the result
 * (count elements). */
static void run_allreduce(const tcase *c, int rank, int n, ncclComm_t comm,
                          struct calls *calls, void *keep, struct outcome *o)
{
  size_t nb = c->count * harness_type_size(c->type);
  char m[256];
  unsigned char *send = galloc(nb);
  unsigned char *recv = c->inplace ? send : galloc(nb);
  unsigned char *orig = malloc(nb + 1), *exp = malloc(nb + 1);
  o->rc = CASE_OK;
  o->msg[0] = '\0';
  if (send == NULL || recv == NULL || orig == NULL || exp == NULL) {
    o->rc = CASE_CALL_FAILED;
    snprintf(o->msg, sizeof(o->msg), "out of memory");
    goto out;
  }
  harness_fill_input(send, c->type, c->op, n, rank, 0, c->count, c->seed);
  memcpy(orig, send, nb);
  if (!c->inplace) harness_fill_bytes(recv, nb, c->seed, 0xdead);
  harness_fill_expected(exp, c->type, c->op, n, 0, c->count, c->seed);
  CALL(o, comm, "ncclAllReduce",
       ncclAllReduce(send, recv, c->count, c->type, c->op, comm, NULL));
  if (c->count > 0) calls->allreduce++;
  if (harness_check(recv, exp, c->type, c->op, n, c->count, m, sizeof(m)))
    wrong(o, m);
  if (!c->inplace && memcmp(send, orig, nb) != 0)
    wrong(o, "sendbuff was modified");
  if (!guard_ok(recv, nb) || !guard_ok(send, nb))
    wrong(o, "wrote past the end of a buffer");
  if (keep != NULL) memcpy(keep, recv, nb);
  check_same(o, comm, recv, nb);
  calls->other++;
out:
  if (!c->inplace) free(recv);
  free(send);
  free(orig);
  free(exp);
}

/* Runs cases [0, ncases); returns the number that failed. After a failed
 * call the ranks may be out of step, so the rank stops there. */
static int run_cases(const tcase *cases, size_t ncases, int rank, int n,
                     ncclComm_t comm, struct calls *calls, const char *tag)
{
  int fails = 0;
  for (size_t i = 0; i < ncases; i++) {
    struct outcome o;
    char name[160];
    run_allreduce(&cases[i], rank, n, comm, calls, NULL, &o);
    if (o.rc == CASE_OK) continue;
    case_name(&cases[i], name, sizeof(name));
    fprintf(stderr, "[rank %d/%d %s] FAIL %s: %s\n", rank, n, tag, name, o.msg);
    fails++;
    if (o.rc == CASE_CALL_FAILED) {
      fprintf(stderr, "[rank %d/%d %s] stopping after the failed call (%zu "
                      "cases not run)\n", rank, n, tag, ncases - i - 1);
      break;
    }
  }
  return fails;
}

/* ------------------------------------------------------------------------ */
/* Pre-multiplied sum                                                       */
/* ------------------------------------------------------------------------ */

/* Powers of two and small integers: every product and sum is exact. */
static float premul_scalar(int rank) { return rank % 3 == 0 ? 0.5f : rank % 3 == 1 ? 2.0f : 4.0f; }

static float premul_input(int rank, size_t i)
{
  return (float)((int)((i * 7 + (size_t)rank * 13) % 61) - 30);
}

static int premul_cases(int rank, int n, ncclComm_t comm, struct calls *calls,
                        const char *tag)
{
  static const size_t counts[] = {1, 2, 7, 1000};
  int fails = 0;
  float scalar = premul_scalar(rank);
  ncclRedOp_t op;
  ncclResult_t r = ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32,
                                            ncclScalarHostImmediate, comm);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] ncclRedOpCreatePreMulSum: %s: %s\n", rank,
            tag, ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++)
    for (int ip = 0; ip < 2; ip++) {
      size_t count = counts[ci], nb = count * sizeof(float);
      float *send = galloc(nb), *recv = ip ? send : galloc(nb);
      float *exp = malloc(nb);
      struct outcome o = {CASE_OK, ""};
      char m[256];
      for (size_t i = 0; i < count; i++) {
        float sum = 0;
        for (int q = 0; q < n; q++) sum += premul_scalar(q) * premul_input(q, i);
        send[i] = premul_input(rank, i);
        exp[i] = sum;
      }
      r = ncclAllReduce(send, recv, count, ncclFloat32, op, comm, NULL);
      if (r != ncclSuccess) {
        fprintf(stderr, "[rank %d %s] premulsum float %s count=%zu: %s: %s\n",
                rank, tag, ip ? "in-place" : "out-of-place", count,
                ncclGetErrorString(r), ncclGetLastError(comm));
        if (!ip) free(recv);
        free(send);
        free(exp);
        ncclRedOpDestroy(op, comm);
        return fails + 1;
      }
      calls->allreduce++;
      if (harness_check(recv, exp, ncclFloat32, ncclSum, n, count, m, sizeof(m)))
        wrong(&o, m);
      if (!guard_ok(recv, nb)) wrong(&o, "wrote past the end of a buffer");
      check_same(&o, comm, recv, nb);
      calls->other++;
      if (o.rc != CASE_OK) {
        fprintf(stderr, "[rank %d %s] FAIL premulsum float %s count=%zu: %s\n",
                rank, tag, ip ? "in-place" : "out-of-place", count, o.msg);
        fails++;
      }
      if (!ip) free(recv);
      free(send);
      free(exp);
      if (o.rc == CASE_CALL_FAILED) {
        ncclRedOpDestroy(op, comm);
        return fails;
      }
    }
  if ((r = ncclRedOpDestroy(op, comm)) != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] ncclRedOpDestroy: %s\n", rank, tag,
            ncclGetErrorString(r));
    fails++;
  }
  return fails;
}

/* ------------------------------------------------------------------------ */
/* Region map and statistics                                                */
/* ------------------------------------------------------------------------ */

static int check_region(ncclComm_t comm, const struct layout *l, int rank,
                        const char *tag)
{
  int k = -1, g = -1, lr = -1, sz = -1;
  const char *name = NULL;
  ncclResult_t r = geocclCommGetRegion(comm, &k, &g, &lr, &sz, &name);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] geocclCommGetRegion: %s: %s\n", rank, tag,
            ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  int want_g = l->region_of[rank];
  if (k != l->nregions || g != want_g || lr != l->local_rank[rank] ||
      sz != l->size[want_g] || name == NULL || strcmp(name, l->label[rank]) != 0) {
    fprintf(stderr, "[rank %d %s] geocclCommGetRegion gave nregions %d region "
                    "%d localRank %d regionSize %d name '%s'; expected %d %d "
                    "%d %d '%s'\n", rank, tag, k, g, lr, sz, name ? name : "(null)",
            l->nregions, want_g, l->local_rank[rank], l->size[want_g],
            l->label[rank]);
    return 1;
  }
  /* every output is optional */
  if (geocclCommGetRegion(comm, NULL, NULL, NULL, NULL, NULL) != ncclSuccess ||
      geocclCommGetRegion(comm, NULL, &g, NULL, NULL, NULL) != ncclSuccess ||
      g != want_g) {
    fprintf(stderr, "[rank %d %s] geocclCommGetRegion with NULL outputs failed\n",
            rank, tag);
    return 1;
  }
  return 0;
}

static int get_stats(ncclComm_t comm, geocclStats *st, int rank, const char *tag)
{
  ncclResult_t r = geocclCommGetStats(comm, st);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] geocclCommGetStats: %s: %s\n", rank, tag,
            ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  return 0;
}

static int reset_stats(ncclComm_t comm, int rank, const char *tag)
{
  ncclResult_t r = geocclCommResetStats(comm);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] geocclCommResetStats: %s: %s\n", rank, tag,
            ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  return 0;
}

/* geocclCommGetStats counts what was issued since the last reset: every
 * non-empty all-reduce as hierarchical (or flat when flat is set); other
 * collectives as hierarchical (all-gather, reduce-scatter) or flat. */
static int check_calls(ncclComm_t comm, const struct calls *c, int flat,
                       int rank, const char *tag)
{
  geocclStats st;
  if (get_stats(comm, &st, rank, tag)) return 1;
  int ok = st.callsHier + st.callsFlat == c->allreduce + c->other &&
           (flat ? st.callsHier == 0 : st.callsHier >= c->allreduce);
  if (!ok) {
    fprintf(stderr, "[rank %d %s] stats count %llu hierarchical and %llu flat "
                    "calls; issued %llu all-reduces and %llu other "
                    "collectives (%s)\n", rank, tag, st.callsHier,
            st.callsFlat, c->allreduce, c->other,
            flat ? "GEOCCL_ALGO=flat" : "hierarchical");
    return 1;
  }
  return 0;
}

/* Each rank's counters as of st, all-gathered: all[r] = {bytesWan,
 * bytesIntra}. The gather is itself a collective, counted afterwards. */
static int gather_bytes(ncclComm_t comm, const geocclStats *st,
                        uint64_t (*all)[2], int rank, const char *tag)
{
  uint64_t mine[2] = {st->bytesWan, st->bytesIntra};
  ncclResult_t r = ncclAllGather(mine, all, 2, ncclUint64, comm, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] all-gather of the byte counters: %s: %s\n",
            rank, tag, ncclGetErrorString(r), ncclGetLastError(comm));
    return 1;
  }
  return 0;
}

/* One all-reduce of count elements of t (sum, out-of-place), alone between
 * a stats reset and a stats read, with the bytes checked:
 *  - this rank's WAN bytes equal hier_wan_bytes exactly;
 *  - each region's WAN total is 2(k-1)/k * count * es within
 *    k * nranks * es per slice;
 *  - each region's intra bytes are 2(n-1) * count * es exactly (ring
 *    reduce-scatter and all-gather pass every element n-1 times each).
 * WAN totals per rank go to wan_out (nranks entries) when not NULL. */
static int check_bytes(ncclComm_t comm, const struct layout *l, int rank,
                       ncclDataType_t t, size_t count, size_t slice_bytes,
                       struct calls *calls, uint64_t *wan_out, const char *tag)
{
  const int n = l->nranks, k = l->nregions;
  const size_t es = harness_type_size(t), nb = count * es;
  const uint32_t seed = 9001;
  int fails = 0;
  char m[256];
  void *buf = malloc(nb), *out = malloc(nb), *exp = malloc(nb);
  uint64_t all[HARNESS_MAX_RANKS][2];
  geocclStats st;
  harness_fill_input(buf, t, ncclSum, n, rank, 0, count, seed);
  harness_fill_expected(exp, t, ncclSum, n, 0, count, seed);
  if (reset_stats(comm, rank, tag)) {
    fails = 1;
    goto out;
  }
  ncclResult_t r = ncclAllReduce(buf, out, count, t, ncclSum, comm, NULL);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] bytes check: all-reduce %s count=%zu: %s: %s\n",
            rank, tag, harness_type_name(t), count, ncclGetErrorString(r),
            ncclGetLastError(comm));
    fails = 1;
    goto out;
  }
  if (get_stats(comm, &st, rank, tag)) {
    fails = 1;
    goto out;
  }
  calls->allreduce = 1;
  calls->other = 0;
  fails += check_calls(comm, calls, 0, rank, tag);
  if (harness_check(out, exp, t, ncclSum, n, count, m, sizeof(m))) {
    fprintf(stderr, "[rank %d %s] bytes check: all-reduce %s count=%zu: %s\n",
            rank, tag, harness_type_name(t), count, m);
    fails++;
  }
  uint64_t want = hier_wan_bytes(l, rank, count, es, slice_bytes);
  if (st.bytesWan != want) {
    fprintf(stderr, "[rank %d %s] %s sum of %zu elements: sent %llu bytes over "
                    "the WAN, the algorithm implies %llu\n", rank, tag,
            harness_type_name(t), count, st.bytesWan, (unsigned long long)want);
    fails++;
  }
  if (gather_bytes(comm, &st, all, rank, tag)) {
    fails++;
    goto out;
  }
  if (wan_out != NULL)
    for (int q = 0; q < n; q++) wan_out[q] = all[q][0];
  const size_t se = slice_bytes / es ? slice_bytes / es : 1;
  const uint64_t nslices = (count + se - 1) / se;
  for (int g = 0; g < k; g++) {
    uint64_t wan = 0, intra = 0;
    for (int q = 0; q < n; q++)
      if (l->region_of[q] == g) {
        wan += all[q][0];
        intra += all[q][1];
      }
    double ideal = 2.0 * (k - 1) / k * (double)nb;
    double slack = (double)k * n * (double)es * (double)nslices;
    double diff = (double)wan - ideal;
    if (diff < -slack || diff > slack) {
      fprintf(stderr, "[rank %d %s] region %d sent %llu bytes over the WAN for "
                      "%zu bytes; 2(k-1)/k of it is %.0f (allowed +-%.0f)\n",
              rank, tag, g, (unsigned long long)wan, nb, ideal, slack);
      fails++;
    }
    uint64_t want_intra = 2 * (uint64_t)(l->size[g] - 1) * nb;
    if (intra != want_intra) {
      fprintf(stderr, "[rank %d %s] region %d (%d ranks) sent %llu bytes "
                      "inside the region for %zu bytes; expected %llu\n",
              rank, tag, g, l->size[g], (unsigned long long)intra, nb,
              (unsigned long long)want_intra);
      fails++;
    }
  }
out:
  free(buf);
  free(out);
  free(exp);
  return fails;
}

/* ------------------------------------------------------------------------ */
/* Rank bodies                                                              */
/* ------------------------------------------------------------------------ */

enum {
  RUN_MATRIX = 1,       /* the type x op x place x count matrix, premulsum */
  RUN_FLAT_COMPARE = 2, /* the same exact cases again under GEOCCL_ALGO=flat */
  RUN_SECRET = 4        /* buffers process_vm_readv cannot read (secret_body) */
};

struct hier_arg {
  const char *spec;   /* region labels, one per rank */
  int what;           /* RUN_* bits */
  size_t slice_bytes; /* GEOCCL_HIER_SLICE to set; 0 leaves the default */
  int cma;            /* CMA_*: GEOCCL_CMA for the ranks */
  int node_ranks;     /* GEOCCL_NODE_RANKS to set; 0 leaves it unset */
};

enum {
  CMA_DEFAULT = 0, /* unset: regions of forked ranks read each other (cma.h) */
  CMA_OFF = 1,     /* GEOCCL_CMA=0 on every rank: the ring */
  CMA_ONE_OFF = 2  /* GEOCCL_CMA=0 on rank 1 only: its region agrees on the ring */
};

/* Sets GEOCCL_REGION (and GEOCCL_HIER_SLICE) for this rank and creates the
 * communicator. The parameter cache was filled in the parent, before the
 * fork, so cached parameters are reloaded. */
static ncclComm_t init_rank(const struct layout *l, const struct hier_arg *a,
                            int rank, const ncclUniqueId *id, const char *tag)
{
  ncclComm_t comm = NULL;
  setenv("GEOCCL_REGION", l->label[rank], 1);
  if (a->slice_bytes != 0) {
    char v[32];
    snprintf(v, sizeof(v), "%zu", a->slice_bytes);
    setenv("GEOCCL_HIER_SLICE", v, 1);
  }
  if (a->cma == CMA_OFF || (a->cma == CMA_ONE_OFF && rank == 1))
    setenv("GEOCCL_CMA", "0", 1);
  if (a->node_ranks != 0) {
    char v[32];
    snprintf(v, sizeof(v), "%d", a->node_ranks);
    setenv("GEOCCL_NODE_RANKS", v, 1);
  }
  if (a->slice_bytes != 0 || a->cma != CMA_DEFAULT || a->node_ranks != 0)
    ncclResetDebugInit();
  ncclResult_t r = ncclCommInitRank(&comm, l->nranks, *id, rank);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] ncclCommInitRank: %s: %s\n", rank, tag,
            ncclGetErrorString(r), ncclGetLastError(NULL));
    return NULL;
  }
  return comm;
}

/* Exact cases for the flat comparison: every type with sum, prod, max, min
 * and the integer averages (float averages over 6 ranks round, and the two
 * algorithms may round differently), plus the two big cases. */
static size_t make_exact_cases(int nranks, tcase *out)
{
  size_t n = 0;
  for (int t = 0; t < (int)ncclNumTypes; t++)
    for (int op = 0; op < (int)ncclNumOps; op++) {
      if (harness_result_is_approx((ncclDataType_t)t, (ncclRedOp_t)op, nranks))
        continue;
      if (out != NULL)
        out[n] = (tcase){(ncclDataType_t)t, (ncclRedOp_t)op, 0, 1001,
                         (uint32_t)(5000 + n)};
      n++;
    }
  if (out != NULL) {
    out[n] = (tcase){ncclFloat32, ncclSum, 0, big_count(), 7000};
    out[n + 1] = (tcase){ncclInt8, ncclMax, 1, big_count(), 7001};
  }
  return n + 2;
}

/* Runs the exact cases on comm keeping each result (results[i] must hold
 * case i). Returns the number of failures. */
static int run_kept(const tcase *cases, size_t ncases, void **results,
                    int rank, int n, ncclComm_t comm, struct calls *calls,
                    const char *tag)
{
  int fails = 0;
  for (size_t i = 0; i < ncases; i++) {
    struct outcome o;
    char name[160];
    run_allreduce(&cases[i], rank, n, comm, calls, results[i], &o);
    if (o.rc == CASE_OK) continue;
    case_name(&cases[i], name, sizeof(name));
    fprintf(stderr, "[rank %d/%d %s] FAIL %s: %s\n", rank, n, tag, name, o.msg);
    fails++;
    if (o.rc == CASE_CALL_FAILED) return fails;
  }
  return fails;
}

/* The same exact cases hierarchical, then on a communicator split off
 * under GEOCCL_ALGO=flat (same regions, since GEOCCL_REGION is still set):
 * the flat one counts flat calls only and gives the same bits, and the
 * hierarchical algorithm sends fewer bytes over the WAN. */
static int flat_compare(ncclComm_t comm, const struct layout *l, int rank,
                        const char *tag)
{
  const int n = l->nranks;
  size_t ncases = make_exact_cases(n, NULL);
  tcase *cases = calloc(ncases, sizeof(*cases));
  void **hier = calloc(ncases, sizeof(void *)), **flat = calloc(ncases, sizeof(void *));
  uint64_t wan_hier[HARNESS_MAX_RANKS], wan_flat[HARNESS_MAX_RANKS];
  struct calls calls = {0, 0};
  ncclComm_t fc = NULL;
  ncclResult_t r;
  int fails = 0;
  char ftag[80];
  snprintf(ftag, sizeof(ftag), "%s flat", tag);
  if (cases == NULL || hier == NULL || flat == NULL) return 1;
  make_exact_cases(n, cases);
  for (size_t i = 0; i < ncases; i++) {
    size_t nb = cases[i].count * harness_type_size(cases[i].type);
    hier[i] = malloc(nb);
    flat[i] = malloc(nb);
  }

  if (reset_stats(comm, rank, tag)) {
    fails++;
    goto out;
  }
  fails += run_kept(cases, ncases, hier, rank, n, comm, &calls, tag);
  if (fails) goto out;
  fails += check_calls(comm, &calls, 0, rank, tag);
  fails += check_bytes(comm, l, rank, ncclFloat32, big_count(), DEFAULT_SLICE,
                       &calls, wan_hier, tag);
  if (fails) goto out;

  setenv("GEOCCL_ALGO", "flat", 1);
  ncclResetDebugInit();
  r = ncclCommSplit(comm, 0, rank, &fc, NULL);
  unsetenv("GEOCCL_ALGO");
  ncclResetDebugInit();
  if (r != ncclSuccess || fc == NULL) {
    fprintf(stderr, "[rank %d %s] ncclCommSplit under GEOCCL_ALGO=flat: %s: %s\n",
            rank, ftag, ncclGetErrorString(r), ncclGetLastError(comm));
    fails++;
    goto out;
  }
  fails += check_region(fc, l, rank, ftag);
  memset(&calls, 0, sizeof(calls));
  fails += run_kept(cases, ncases, flat, rank, n, fc, &calls, ftag);
  if (fails) goto out;
  fails += check_calls(fc, &calls, 1, rank, ftag);
  for (size_t i = 0; i < ncases; i++) {
    size_t nb = cases[i].count * harness_type_size(cases[i].type);
    if (memcmp(hier[i], flat[i], nb) != 0) {
      char name[160];
      case_name(&cases[i], name, sizeof(name));
      fprintf(stderr, "[rank %d %s] %s: flat and hierarchical results differ\n",
              rank, ftag, name);
      fails++;
    }
  }

  /* WAN bytes of the same float sum run flat */
  {
    size_t nb = big_count() * sizeof(float);
    float *x = malloc(nb);
    geocclStats st;
    uint64_t all[HARNESS_MAX_RANKS][2];
    harness_fill_input(x, ncclFloat32, ncclSum, n, rank, 0, big_count(), 9001);
    if (reset_stats(fc, rank, ftag) ||
        ncclAllReduce(x, x, big_count(), ncclFloat32, ncclSum, fc, NULL) != ncclSuccess ||
        get_stats(fc, &st, rank, ftag) || gather_bytes(fc, &st, all, rank, ftag)) {
      fprintf(stderr, "[rank %d %s] flat WAN bytes run failed: %s\n", rank, ftag,
              ncclGetLastError(fc));
      free(x);
      fails++;
      goto out;
    }
    free(x);
    if (st.callsFlat != 1 || st.callsHier != 0) {
      fprintf(stderr, "[rank %d %s] one flat all-reduce counted %llu flat and "
                      "%llu hierarchical\n", rank, ftag, st.callsFlat, st.callsHier);
      fails++;
    }
    uint64_t th = 0, tf = 0;
    for (int q = 0; q < n; q++) {
      wan_flat[q] = all[q][0];
      th += wan_hier[q];
      tf += wan_flat[q];
    }
    if (th >= tf) {
      fprintf(stderr, "[rank %d %s] hierarchical all-reduce sent %llu WAN bytes "
                      "in all, flat ring %llu: expected fewer\n", rank, ftag,
              (unsigned long long)th, (unsigned long long)tf);
      fails++;
    }
  }
out:
  if (fc != NULL && (r = ncclCommDestroy(fc)) != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] ncclCommDestroy of the flat comm: %s\n",
            rank, ftag, ncclGetErrorString(r));
    fails++;
  }
  for (size_t i = 0; i < ncases; i++) {
    free(hier[i]);
    free(flat[i]);
  }
  free(hier);
  free(flat);
  free(cases);
  return fails;
}

/* The slice test: the big cases (and a double sum) through many slices,
 * then the bytes, which depend on the slice arithmetic. */
static int slices_body(ncclComm_t comm, const struct layout *l, int rank,
                       size_t slice_bytes, const char *tag)
{
  const size_t big = big_count();
  const tcase cases[] = {
      {ncclFloat32, ncclSum, 0, big, 1},
      {ncclFloat32, ncclSum, 1, big, 2},
      {ncclInt8, ncclMax, 0, big, 3},
      {ncclFloat64, ncclSum, 1, 100003, 4},
      {ncclBfloat16, ncclProd, 0, 30011, 5},
  };
  struct calls calls = {0, 0};
  int fails = 0;
  if (reset_stats(comm, rank, tag)) return 1;
  fails += run_cases(cases, sizeof(cases) / sizeof(cases[0]), rank, l->nranks,
                     comm, &calls, tag);
  if (fails) return fails;
  fails += check_calls(comm, &calls, 0, rank, tag);
  fails += check_bytes(comm, l, rank, ncclFloat32, big, slice_bytes,
                       &calls, NULL, tag);
  fails += check_bytes(comm, l, rank, ncclFloat64, 100003, slice_bytes,
                       &calls, NULL, tag);
  return fails;
}

/* Whether my region reads inputs directly: forked ranks share a host, so
 * yes when the region has several ranks and none set GEOCCL_CMA=0 (rank
 * 1's region in CMA_ONE_OFF). */
static int check_single_copy(ncclComm_t comm, const struct layout *l,
                             const struct hier_arg *a, int rank, const char *tag)
{
  int single = -1;
  ncclResult_t r = geocclCommGetSingleCopy(comm, &single);
  int want = l->size[l->region_of[rank]] > 1 && a->cma != CMA_OFF &&
             !(a->cma == CMA_ONE_OFF && l->region_of[rank] == l->region_of[1]);
  if (r != ncclSuccess || single != want) {
    fprintf(stderr, "[rank %d %s] geocclCommGetSingleCopy: %s, %d; expected %d\n", rank,
            tag, ncclGetErrorString(r), single, want);
    return 1;
  }
  if (geocclCommGetSingleCopy(comm, NULL) != ncclInvalidArgument) {
    fprintf(stderr, "[rank %d %s] geocclCommGetSingleCopy(comm, NULL) accepted\n", rank,
            tag);
    return 1;
  }
  return 0;
}

/* The node layout the communicator found (geocclCommPrintPlan's "nodes:"
 * line): with GEOCCL_NODE_RANKS = G, every region of H >= 2 nodes of G >= 2
 * ranks named with its H and G, no other region; without, no line (forked
 * ranks share one host). */
static int check_nodes(ncclComm_t comm, const struct layout *l, int rank, const char *tag)
{
  char *text = NULL;
  size_t len = 0;
  int fails = 0;
  FILE *f = open_memstream(&text, &len);
  if (f == NULL) return 1;
  geocclCommPrintPlan(comm, f, 0);
  fclose(f);
  const char *line = strstr(text, "nodes:");
  int any = 0;
  for (int q = 0; q < l->nregions; q++) {
    const int G = l->node_ranks, P = l->size[q];
    int want = G >= 2 && P % G == 0 && P / G >= 2;
    char label[LABEL_LEN] = "", expect[96];
    for (int r = 0; r < l->nranks; r++)
      if (l->region_of[r] == q) {
        snprintf(label, sizeof(label), "%s", l->label[r]);
        break;
      }
    snprintf(expect, sizeof(expect), "region '%s' %d nodes of %d ranks", label,
             want ? P / G : 0, G);
    int has = line != NULL && strstr(line, expect) != NULL;
    char named[48];
    snprintf(named, sizeof(named), "region '%s' ", label);
    if (!want) has = line != NULL && strstr(line, named) != NULL;
    any |= want;
    if (has != want) {
      fprintf(stderr, "[rank %d %s] plan text %s '%s': %s\n", rank, tag,
              want ? "lacks" : "names", want ? expect : named, text);
      fails++;
    }
  }
  if (!any && line != NULL) {
    fprintf(stderr, "[rank %d %s] plan text names nodes: %s\n", rank, tag, text);
    fails++;
  }
  free(text);
  return fails;
}

/* bytes of secret memory (memfd_secret(2)): this process reads and writes
 * it, the kernel will not read it for anyone else, so process_vm_readv
 * fails on it with EFAULT, as on memory a device driver mapped. NULL (errno
 * set) where the kernel has no secret memory. */
#ifndef SYS_memfd_secret
#define SYS_memfd_secret 447
#endif
static void *secret_alloc(size_t bytes)
{
  int fd = (int)syscall(SYS_memfd_secret, 0);
  if (fd < 0) return NULL;
  void *p = NULL;
  if (ftruncate(fd, (off_t)bytes) == 0) {
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) p = NULL;
  }
  int e = errno;
  close(fd);
  errno = e;
  return p;
}

/* Rank 1's input and rank 2's output (in place) in secret memory, the
 * others' on the heap: each such call must see that a buffer of its region
 * cannot be read directly and pass it round the ring, with the right
 * result, where reading it would fail the call. */
static int secret_body(ncclComm_t comm, const struct layout *l, int rank, const char *tag)
{
  const size_t count = big_count(), nb = count * sizeof(float);
  const int n = l->nranks;
  int fails = 0;
  char m[256];
  for (int v = 0; v < 2; v++) {
    const int secret_rank = v == 0 ? 1 : 2, inplace = v == 1;
    int secret = rank == secret_rank;
    void *in = secret ? secret_alloc(nb) : malloc(nb);
    void *out = inplace ? in : malloc(nb), *exp = malloc(nb);
    if (secret && in == NULL) {
      /* all ranks must make the call: fall back to the heap and say so */
      printf("\n  (rank %d: memfd_secret: %s; its buffer is ordinary memory)", rank,
             strerror(errno));
      in = malloc(nb);
      out = inplace ? in : out;
      secret = 0;
    }
    if (in == NULL || out == NULL || exp == NULL) return fails + 1;
    harness_fill_input(in, ncclFloat32, ncclSum, n, rank, 0, count, 77 + v);
    harness_fill_expected(exp, ncclFloat32, ncclSum, n, 0, count, 77 + v);
    ncclResult_t r = ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, NULL);
    if (r != ncclSuccess) {
      fprintf(stderr, "[rank %d %s] all-reduce with rank %d's %s in secret memory: %s: %s\n",
              rank, tag, secret_rank, inplace ? "buffer" : "input", ncclGetErrorString(r),
              ncclGetLastError(comm));
      fails++;
    } else if (harness_check(out, exp, ncclFloat32, ncclSum, n, count, m, sizeof(m))) {
      fprintf(stderr, "[rank %d %s] all-reduce with rank %d's buffer in secret memory: %s\n",
              rank, tag, secret_rank, m);
      fails++;
    }
    if (secret)
      munmap(in, nb);
    else
      free(in);
    if (!inplace) free(out);
    free(exp);
  }
  return fails;
}

static int hier_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  const struct hier_arg *a = arg;
  struct layout l;
  char tag[64];
  int fails = 0;
  snprintf(tag, sizeof(tag), "'%s'", a->spec);
  if (layout_parse(a->spec, &l) != 0 || l.nranks != nranks) {
    fprintf(stderr, "[rank %d] bad layout '%s'\n", rank, a->spec);
    return 1;
  }
  l.node_ranks = a->node_ranks;
  ncclComm_t comm = init_rank(&l, a, rank, id, tag);
  if (comm == NULL) return 1;
  fails += check_region(comm, &l, rank, tag);
  fails += check_single_copy(comm, &l, a, rank, tag);
  fails += check_nodes(comm, &l, rank, tag);

  if (a->what & RUN_MATRIX) {
    size_t ncases = make_cases(NULL);
    tcase *cases = calloc(ncases, sizeof(*cases));
    struct calls calls = {0, 0};
    if (cases == NULL) return fails + 1;
    make_cases(cases);
    if (reset_stats(comm, rank, tag)) fails++;
    int f = run_cases(cases, ncases, rank, nranks, comm, &calls, tag);
    if (f == 0) f += premul_cases(rank, nranks, comm, &calls, tag);
    if (f == 0) f += check_calls(comm, &calls, 0, rank, tag);
    if (f == 0)
      f += check_bytes(comm, &l, rank, ncclFloat32, big_count(), DEFAULT_SLICE,
                       &calls, NULL, tag);
    fails += f;
    free(cases);
  }
  if (fails == 0 && (a->what & RUN_FLAT_COMPARE))
    fails += flat_compare(comm, &l, rank, tag);
  if (fails == 0 && a->slice_bytes != 0)
    fails += slices_body(comm, &l, rank, a->slice_bytes, tag);
  if (fails == 0 && (a->what & RUN_SECRET))
    fails += secret_body(comm, &l, rank, tag);

  ncclResult_t r = ncclCommDestroy(comm);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] ncclCommDestroy: %s\n", rank, tag,
            ncclGetErrorString(r));
    fails++;
  }
  return fails;
}

/* ------------------------------------------------------------------------ */
/* CUnit tests                                                              */
/* ------------------------------------------------------------------------ */

static void run_layout_nodes(const char *spec, int what, size_t slice_bytes, int cma,
                             int node_ranks)
{
  struct layout l;
  CU_ASSERT_FATAL(layout_parse(spec, &l) == 0);
  struct hier_arg a = {spec, what, slice_bytes, cma, node_ranks};
  double t0 = harness_now();
  int rc = harness_run_noinit(l.nranks, hier_body, &a, TIMEOUT_S);
  char nodes[48] = "";
  if (node_ranks != 0)
    snprintf(nodes, sizeof(nodes), ", nodes of %d ranks", node_ranks);
  printf("\n  '%s': %d ranks in %d regions%s %s (%.1f s)\n", spec, l.nranks,
         l.nregions, nodes, rc == 0 ? "ok" : "FAILED", harness_now() - t0);
  fflush(stdout);
  CU_ASSERT_EQUAL(rc, 0);
}

static void run_layout_cma(const char *spec, int what, size_t slice_bytes, int cma)
{
  run_layout_nodes(spec, what, slice_bytes, cma, 0);
}

static void run_layout(const char *spec, int what, size_t slice_bytes)
{
  run_layout_cma(spec, what, slice_bytes, CMA_DEFAULT);
}

static void test_2x2(void) { run_layout("a a b b", RUN_MATRIX, 0); }
static void test_3x2(void) { run_layout("a a b b c c", RUN_MATRIX, 0); }
static void test_3p1(void) { run_layout("a a a b", RUN_MATRIX, 0); }
static void test_1p3(void) { run_layout("a b b b", RUN_MATRIX, 0); }
static void test_interleaved(void) { run_layout("a b a b a", RUN_MATRIX, 0); }
static void test_2x1(void) { run_layout("a b", RUN_MATRIX, 0); }
static void test_4x1(void) { run_layout("a b c d", RUN_MATRIX, 0); }
static void test_2x4(void) { run_layout("a a a a b b b b", RUN_MATRIX, 0); }
/* Regions of several emulated hosts (GEOCCL_NODE_RANKS: every run of that
 * many ranks of a region is one node): the node stage, then the region
 * stage, in every region of two nodes or more (coll_hier_node.c); one
 * ring, or the single-copy reads, in a region on one node.  Exact results,
 * the WAN bytes the nested segments imply, 2(n-1) intra bytes per region
 * as with one ring; then hundreds of small slices. */
static void test_nodes(void)
{
  run_layout_nodes("a a a a b b b b", RUN_MATRIX, 0, CMA_DEFAULT, 2);
  run_layout_nodes("a a a a a a b b", RUN_MATRIX, 0, CMA_DEFAULT, 2);
  run_layout_nodes("a a a a a a b b", 0, 4100, CMA_DEFAULT, 3);
}

static void test_flat(void) { run_layout("a a b b c c", RUN_FLAT_COMPARE, 0); }

/* The ring reduce-scatter, which the defaults above no longer take on one
 * host: every rank off (the matrix, and hundreds of small slices), and one
 * rank off (its region agrees on the ring, the other region keeps the
 * single-copy reads; the flat comparison and byte counts hold for both). */
static void test_cma_off(void)
{
  /* The ring through hundreds of 4100-byte slices takes 15 s in the plain
   * build and 35 s under the thread sanitizer; there 40004-byte slices
   * (still no multiple of 8) take the same paths in a tenth of the
   * steps (and of big_count()'s fewer elements there: some 26 slices). */
  size_t slice = harness_time_scale() > 1 ? 40004 : 4100;
  run_layout_cma("a a a b b b b", RUN_MATRIX, 0, CMA_OFF);
  run_layout_cma("a a a b b b b", 0, slice, CMA_OFF);
  run_layout_cma("a a a b b b b", RUN_FLAT_COMPARE, 0, CMA_ONE_OFF);
}

/* Uneven links (labels a, b, c; a topology file gives region a 100 Mbit/s
 * and b, c 1 Gbit/s): the plan gives a no share of the pieces (its ranks
 * send their partials once and receive the finished sums), b and c half
 * each.  Every result stays exact; each rank of a sends exactly its
 * segment over the WAN, each rank of b and c one and a half (equal shares:
 * four thirds for everyone); GEOCCL_HIER_SHARES=equal brings the equal
 * split back, bit for bit the same results. */
struct uneven_arg {
  const char *topo;   /* the topology file */
  const char *shares; /* GEOCCL_HIER_SHARES */
  uint64_t wan[6];    /* bytes each rank sent over the WAN */
  uint64_t digest[6];
};

static uint64_t fnv64(const void *p, size_t n)
{
  const unsigned char *b = p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Rank `rank` of 3 regions x 2 ranks labelled a, b, c, whose links the
 * topology file `topo` gives, hierarchical, with GEOCCL_HIER_SHARES=shares;
 * NULL (said on stderr) when init fails. */
static ncclComm_t uneven_init(int rank, int nranks, const ncclUniqueId *id, const char *topo,
                              const char *shares, const char *what)
{
  static const char *label[6] = {"a", "a", "b", "b", "c", "c"};
  ncclComm_t comm = NULL;
  setenv("GEOCCL_REGION", label[rank], 1);
  setenv("GEOCCL_TOPO_FILE", topo, 1);
  setenv("GEOCCL_HIER_SHARES", shares, 1);
  setenv("GEOCCL_ALGO", "hier", 1);
  ncclResetDebugInit();
  if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess) {
    fprintf(stderr, "[rank %d %s] init: %s\n", rank, what, ncclGetLastError(NULL));
    return NULL;
  }
  return comm;
}

/* Writes text to a new file named after template (mkstemp). */
static void temp_topo(char *template, const char *text)
{
  int fd = mkstemp(template);
  CU_ASSERT_FATAL(fd >= 0);
  CU_ASSERT_EQUAL(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

static int uneven_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  struct uneven_arg *a = arg;
  int fails = 0;
  ncclComm_t comm = uneven_init(rank, nranks, id, a->topo, a->shares, "uneven");
  if (comm == NULL)
    return 1;
  /* the matrix of exact cases, then one float sum whose bytes are counted */
  size_t ncases = make_cases(NULL);
  tcase *cases = calloc(ncases, sizeof(*cases));
  struct calls calls = {0, 0};
  make_cases(cases);
  fails += run_cases(cases, ncases, rank, nranks, comm, &calls, "uneven");
  free(cases);
  size_t count = BIG_COUNT;
  float *x = malloc(count * sizeof(float)), *e = malloc(count * sizeof(float));
  char m[256];
  geocclStats st;
  harness_fill_input(x, ncclFloat32, ncclSum, nranks, rank, 0, count, 77);
  harness_fill_expected(e, ncclFloat32, ncclSum, nranks, 0, count, 77);
  geocclCommResetStats(comm);
  if (ncclAllReduce(x, x, count, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess ||
      geocclCommGetStats(comm, &st) != ncclSuccess ||
      harness_check(x, e, ncclFloat32, ncclSum, nranks, count, m, sizeof(m))) {
    fprintf(stderr, "[rank %d uneven] float sum: %s\n", rank, m);
    fails++;
  }
  a->wan[rank] = st.bytesWan;
  a->digest[rank] = fnv64(x, count * sizeof(float));
  free(x);
  free(e);
  ncclCommDestroy(comm);
  return fails;
}

/* Regions of emulated hosts with a plan: a topology file gives the WAN
 * and the links inside and between nodes, so the plan decides per size
 * between the node stage and one ring (hier+node or hier in its table);
 * every rank follows the same plan and every result is exact.  Rank 0
 * copies the plan's all-reduce lines into plan (shared memory). */
struct planned_arg {
  const char *topo;
  char plan[8][160];
  int stages;          /* a plan line with the node stage was seen */
};

static int planned_nodes_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  static const char *label[8] = {"a", "a", "a", "a", "b", "b", "b", "b"};
  struct planned_arg *a = arg;
  ncclComm_t comm = NULL;
  int fails = 0;
  setenv("GEOCCL_REGION", label[rank], 1);
  setenv("GEOCCL_TOPO_FILE", a->topo, 1);
  setenv("GEOCCL_NODE_RANKS", "2", 1);
  ncclResetDebugInit();
  if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess) {
    fprintf(stderr, "[rank %d planned nodes] init: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  if (rank == 0) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    geocclCommPrintPlan(comm, f, 0);
    fclose(f);
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
      if (strstr(line, "allreduce") && n < 8) {
        snprintf(a->plan[n++], sizeof(a->plan[0]), "%s", line);
        a->stages |= strstr(line, "hier+node") != NULL;
      }
    free(text);
  }
  size_t ncases = make_cases(NULL);
  tcase *cases = calloc(ncases, sizeof(*cases));
  struct calls calls = {0, 0};
  make_cases(cases);
  fails += run_cases(cases, ncases, rank, nranks, comm, &calls, "planned nodes");
  free(cases);
  ncclCommDestroy(comm);
  return fails;
}

static void test_planned_nodes(void)
{
  char path[] = "/tmp/geoccl-nodes-XXXXXX";
  /* a slow hop between nodes (1 ms a message) and a fast one inside:
   * the node stage saves two of them per phase and slice, which the plan
   * takes where they are more than 1% of the call */
  temp_topo(path, "region a bw=100mbit delay=5 ranks=4\n"
                  "region b bw=100mbit delay=5 ranks=4\n"
                  "intra bw=1G delay=1\n"
                  "node ranks=2 bw=4G delay=0.01\n");
  struct planned_arg *u = harness_shared_alloc(sizeof(*u));
  CU_ASSERT_PTR_NOT_NULL_FATAL(u);
  u->topo = path;
  CU_ASSERT_EQUAL(harness_run_noinit(8, planned_nodes_body, u, TIMEOUT_S), 0);
  for (int i = 0; i < 8 && u->plan[i][0]; i++)
    printf("\n    %s", u->plan[i]);
  printf("\n");
  CU_ASSERT_TRUE(u->stages);
  harness_shared_free(u, sizeof(*u));
  unlink(path);
}

static void test_uneven_shares(void)
{
  char path[] = "/tmp/geoccl-uneven-XXXXXX";
  temp_topo(path, "region a bw=100mbit delay=25 ranks=2\n"
                  "region b bw=1gbit delay=25 ranks=2\n"
                  "region c bw=1gbit delay=25 ranks=2\n"
                  "intra bw=1G delay=0.05\n");
  struct uneven_arg *u = harness_shared_alloc(2 * sizeof(*u));
  CU_ASSERT_PTR_NOT_NULL_FATAL(u);
  u[0].topo = u[1].topo = path;
  u[0].shares = "auto";
  u[1].shares = "equal";
  for (int k = 0; k < 2; k++)
    CU_ASSERT_EQUAL(harness_run_noinit(6, uneven_body, &u[k], TIMEOUT_S), 0);
  /* a rank's segment: half of the slice's floats, slice by slice */
  const uint64_t seg = (uint64_t)BIG_COUNT / 2 * 4;
  for (int r = 0; r < 6; r++) {
    double want = r < 2 ? 1.0 : 1.5, got = (double)u[0].wan[r] / (double)seg;
    double eq = (double)u[1].wan[r] / (double)seg;
    printf("\n    rank %d: WAN bytes / segment %.4f with shares (expect %.1f), %.4f equal "
           "(expect 1.3333)", r, got, want, eq);
    CU_ASSERT_TRUE(fabs(got - want) < 1e-3);
    CU_ASSERT_TRUE(fabs(eq - 4.0 / 3.0) < 1e-3);
    CU_ASSERT_EQUAL(u[0].digest[r], u[0].digest[0]);
    CU_ASSERT_EQUAL(u[1].digest[r], u[0].digest[r]);
  }
  printf("\n");
  harness_shared_free(u, 2 * sizeof(*u));
  unlink(path);
}

/* Uneven links and GEOCCL_COMPRESS=auto: region a at 10 Mbit/s, b and c
 * far faster, so the plan compresses what a sends and nothing else
 * (model.h, topoPlanBuild's codec per sending region).  Two runs of one
 * 1000003-float sum: the exact codecs (auto: lossless on a), and int8
 * with equal shares (auto:int8: a's partials and its finished part in
 * int8, b's and c's exact).  Every rank must end with the same bits; the
 * exact run with the exact sum; a's ranks must send fewer bytes than
 * they carry, b's and c's exactly what they carry. */
struct bycodec_arg {
  const char *topo, *compress, *shares;
  char plan[8][160]; /* rank 0: the plan's lines about codecs by region */
  uint64_t wan[6], raw[6], digest[6];
  double err[6];     /* largest |result - exact sum| */
  double in[6];      /* largest |input| */
};

static int bycodec_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
  struct bycodec_arg *a = arg;
  int fails = 0;
  setenv("GEOCCL_COMPRESS", a->compress, 1);
  ncclComm_t comm = uneven_init(rank, nranks, id, a->topo, a->shares, "by codec");
  unsetenv("GEOCCL_COMPRESS");
  if (comm == NULL)
    return 1;
  if (rank == 0) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    geocclCommPrintPlan(comm, f, 0);
    fclose(f);
    int n = 0;
    for (char *line = strtok(text, "\n"); line && n < 8; line = strtok(NULL, "\n"))
      if (strstr(line, "codec of what each region sends"))
        snprintf(a->plan[n++], sizeof(a->plan[0]), "%s", line);
    free(text);
  }
  size_t count = BIG_COUNT;
  float *x = malloc(count * sizeof(float)), *e = malloc(count * sizeof(float));
  char m[256] = "";
  geocclStats st;
  harness_fill_input(x, ncclFloat32, ncclSum, nranks, rank, 0, count, 91);
  harness_fill_expected(e, ncclFloat32, ncclSum, nranks, 0, count, 91);
  a->in[rank] = 0;
  for (size_t i = 0; i < count; i++)
    a->in[rank] = fmax(a->in[rank], fabs((double)x[i]));
  geocclCommResetStats(comm);
  if (ncclAllReduce(x, x, count, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess ||
      geocclCommGetStats(comm, &st) != ncclSuccess) {
    fprintf(stderr, "[rank %d by codec] %s\n", rank, ncclGetLastError(comm));
    fails++;
  }
  double err = 0;
  for (size_t i = 0; i < count; i++)
    err = fmax(err, fabs((double)x[i] - (double)e[i]));
  if (strcmp(a->compress, "auto") == 0 &&
      harness_check(x, e, ncclFloat32, ncclSum, nranks, count, m, sizeof(m))) {
    fprintf(stderr, "[rank %d by codec] float sum: %s\n", rank, m);
    fails++;
  }
  a->wan[rank] = st.bytesWan;
  a->raw[rank] = st.bytesWanRaw;
  a->err[rank] = err;
  a->digest[rank] = fnv64(x, count * sizeof(float));
  /* An int32 sum under the exact codecs: each partial decoded on its own,
   * then summed (decode_x1 and reduce_parts, not the fused float path);
   * lossless shrinks what a sends, exact everywhere. */
  if (strcmp(a->compress, "auto") == 0) {
    int32_t *xi = (int32_t *)x, *ei = (int32_t *)e;
    harness_fill_input(xi, ncclInt32, ncclSum, nranks, rank, 0, count, 92);
    harness_fill_expected(ei, ncclInt32, ncclSum, nranks, 0, count, 92);
    geocclCommResetStats(comm);
    if (ncclAllReduce(xi, xi, count, ncclInt32, ncclSum, comm, NULL) != ncclSuccess ||
        geocclCommGetStats(comm, &st) != ncclSuccess ||
        harness_check(xi, ei, ncclInt32, ncclSum, nranks, count, m, sizeof(m)) ||
        (rank < 2) != (st.bytesWan < st.bytesWanRaw)) {
      fprintf(stderr, "[rank %d by codec] int32 sum: %s (WAN %llu of %llu bytes)\n", rank,
              m, (unsigned long long)st.bytesWan, (unsigned long long)st.bytesWanRaw);
      fails++;
    }
  }
  free(x);
  free(e);
  ncclCommDestroy(comm);
  return fails;
}

static void test_codec_by_region(void)
{
  char path[] = "/tmp/geoccl-bycodec-XXXXXX";
  temp_topo(path, "region a bw=10mbit delay=25 ranks=2\n"
                  "region b bw=100gbit delay=25 ranks=2\n"
                  "region c bw=100gbit delay=25 ranks=2\n"
                  "intra bw=1G delay=0.05\n");
  struct bycodec_arg *u = harness_shared_alloc(2 * sizeof(*u));
  CU_ASSERT_PTR_NOT_NULL_FATAL(u);
  u[0].topo = u[1].topo = path;
  u[0].compress = "auto";
  u[0].shares = "auto";
  u[1].compress = "auto:int8";
  u[1].shares = "equal";
  static const char *want[2] = {"a lossless, b none, c none", "a int8, b none, c none"};
  for (int k = 0; k < 2; k++) {
    CU_ASSERT_EQUAL(harness_run_noinit(6, bycodec_body, &u[k], TIMEOUT_S), 0);
    printf("\n    GEOCCL_COMPRESS=%s, shares %s:", u[k].compress, u[k].shares);
    int seen = 0;
    for (int i = 0; i < 8 && u[k].plan[i][0]; i++) {
      printf("\n      plan: %s", u[k].plan[i] + strspn(u[k].plan[i], " "));
      seen |= strstr(u[k].plan[i], want[k]) != NULL;
    }
    CU_ASSERT_TRUE(seen);
    for (int r = 0; r < 6; r++) {
      printf("\n      rank %d: WAN %llu of %llu bytes carried, largest error %.3g", r,
             (unsigned long long)u[k].wan[r], (unsigned long long)u[k].raw[r], u[k].err[r]);
      CU_ASSERT_EQUAL(u[k].digest[r], u[k].digest[0]);
      CU_ASSERT_TRUE(u[k].raw[r] > 0);
      if (r < 2) {
        CU_ASSERT_TRUE(u[k].wan[r] < u[k].raw[r] * (k == 0 ? 0.9 : 0.3));
      } else {
        CU_ASSERT_EQUAL(u[k].wan[r], u[k].raw[r]);
      }
    }
  }
  /* int8 on a's sends only: one rounding of a's partial (at most 2 x the
   * largest input) and one of its finished part (6 x), each within the
   * block's largest magnitude / 254 */
  double in = 0;
  for (int r = 0; r < 6; r++)
    in = fmax(in, u[1].in[r]);
  printf("\n    int8 run: largest error %.4g, bound %.4g", u[1].err[0], 8 * in / 254);
  CU_ASSERT_TRUE(u[1].err[0] > 0 && u[1].err[0] <= 8 * in / 254);
  CU_ASSERT_EQUAL(u[0].err[0], 0);
  printf("\n");
  harness_shared_free(u, 2 * sizeof(*u));
  unlink(path);
}

/* 2x2: rank 1's region, then rank 2's, takes the ring while the other
 * keeps reading; 3+1: both in the region of three. */
static void test_secret(void)
{
  run_layout("a a b b", RUN_SECRET, 0);
  run_layout("a a a b", RUN_SECRET, 0);
}

/* 4096 bytes, and 4100, which is no multiple of the element size (1025
 * floats, 512 doubles, 2050 bfloat16 per slice) */
static void test_small_slices(void)
{
  run_layout("a a a b", 0, 4096);
  run_layout("a b a b a", 0, 4100);
}

/* The layout helper itself, against hand-written maps. */
static void test_layout_helper(void)
{
  struct layout l;
  CU_ASSERT_EQUAL_FATAL(layout_parse("a b a b a", &l), 0);
  CU_ASSERT_EQUAL(l.nranks, 5);
  CU_ASSERT_EQUAL(l.nregions, 2);
  CU_ASSERT_EQUAL(l.region_of[3], 1);
  CU_ASSERT_EQUAL(l.local_rank[4], 2);
  CU_ASSERT_EQUAL(l.size[0], 3);
  CU_ASSERT_EQUAL(l.size[1], 2);
  /* 2 regions of 2, 8 floats: my segment of 4 is one piece, split 2 ways:
   * 2 out in X1, 2 back in X2 */
  CU_ASSERT_EQUAL_FATAL(layout_parse("a a b b", &l), 0);
  CU_ASSERT_EQUAL(hier_wan_bytes(&l, 0, 8, 4, DEFAULT_SLICE), 16);
  /* 3 + 1, 9 elements: rank 3 owns all of it, cut at 0, 3, 6 into three
   * pieces of 3, each split 2 ways (2 + 1; rank 3 is region 1: part 1 is
   * 1 element): X1 sends 2, X2 sends 1, per piece */
  CU_ASSERT_EQUAL_FATAL(layout_parse("a a a b", &l), 0);
  CU_ASSERT_EQUAL(hier_wan_bytes(&l, 3, 9, 1, DEFAULT_SLICE), 9);
  CU_ASSERT_EQUAL(hier_wan_bytes(&l, 0, 9, 1, DEFAULT_SLICE), 3);
  CU_ASSERT_EQUAL(layout_parse("", &l), -1);
}

int main(void)
{
  harness_setup_env();
  /* the tests choose these per rank; nothing from the caller's shell */
  unsetenv("GEOCCL_REGION");
  unsetenv("GEOCCL_TOPO_FILE");
  unsetenv("GEOCCL_ALGO");
  unsetenv("GEOCCL_HIER_SLICE");
  unsetenv("GEOCCL_CMA");
  unsetenv("GEOCCL_NODE_RANKS");
  /* Small all-reduces would take the direct exchange (GEOCCL_DIRECT_MAX):
   * this file tests the hierarchical algorithm at every size. */
  setenv("GEOCCL_DIRECT_MAX", "0", 1);

  if (CU_initialize_registry() != CUE_SUCCESS) return CU_get_error();
  CU_pSuite s = CU_add_suite("hierarchical all-reduce", NULL, NULL);
  if (s == NULL) {
    CU_cleanup_registry();
    return CU_get_error();
  }
  CU_add_test(s, "layout helper", test_layout_helper);
  CU_add_test(s, "2x2 'a a b b'", test_2x2);
  CU_add_test(s, "3x2 'a a b b c c'", test_3x2);
  CU_add_test(s, "3+1 'a a a b'", test_3p1);
  CU_add_test(s, "3x2, uneven links: shares by rate", test_uneven_shares);
  CU_add_test(s, "3x2, uneven links: a codec per sending region", test_codec_by_region);
  CU_add_test(s, "1+3 'a b b b'", test_1p3);
  CU_add_test(s, "interleaved 3+2 'a b a b a'", test_interleaved);
  CU_add_test(s, "2x1 'a b'", test_2x1);
  CU_add_test(s, "4x1 'a b c d'", test_4x1);
  CU_add_test(s, "2x4 'a a a a b b b b'", test_2x4);
  CU_add_test(s, "regions of several emulated hosts: node and region stages", test_nodes);
  CU_add_test(s, "regions of several emulated hosts, with a plan", test_planned_nodes);
  CU_add_test(s, "GEOCCL_ALGO=flat on 3x2: same bits, more WAN bytes", test_flat);
  CU_add_test(s, "GEOCCL_HIER_SLICE=4096 and 4100: hundreds of slices", test_small_slices);
  CU_add_test(s, "GEOCCL_CMA=0 on every rank, and on one: the ring, same results", test_cma_off);
  CU_add_test(s, "a rank's buffer in secret memory: that call takes the ring", test_secret);

  CU_basic_set_mode(CU_BRM_VERBOSE);
  CU_basic_run_tests();
  unsigned failures = CU_get_number_of_failures();
  CU_cleanup_registry();
  return failures != 0;
}
