/*
 * ABI check: this file is compiled against the CUDA toolkit's own nccl.h
 * (not GeoCCL's include/nccl.h) and linked to libgeoccl only, the way a
 * program built for NVIDIA's NCCL would be. It must not use any GeoCCL
 * header, so it carries its own small fork loop.
 *
 * Four forked ranks run every collective on host buffers (float sum and
 * int32 max, counts 1 and 4099, in and out of place), check the results, and
 * check that a bad datatype and a NULL buffer give ncclInvalidArgument. The
 * communicators are made with ncclCommInitRankConfig and a config from
 * NCCL_CONFIG_INITIALIZER. No CUDA function is called: streams are NULL.
 * The parent also checks that every nccl.h function (and its pnccl twin) is
 * exported (dlsym is in libc from glibc 2.34 on; older systems need -ldl).
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NRANKS 4
#define TIMEOUT_S 120
#define STREAM ((cudaStream_t)0)

/* Per-rank check counts, in memory shared with the parent. */
struct tally {
  int passed[NRANKS];
  int failed[NRANKS];
};

static struct tally *tally;
static int my_rank;
static int exports_passed, exports_failed; /* checked in the parent */

static void check(int ok, const char *what, const char *detail)
{
  if (ok) {
    tally->passed[my_rank]++;
  } else {
    tally->failed[my_rank]++;
    fprintf(stderr, "[rank %d] FAIL %s%s%s\n", my_rank, what,
            detail ? ": " : "", detail ? detail : "");
  }
}

/* The two element types under test. */
typedef struct {
  ncclDataType_t type;
  ncclRedOp_t op;
  const char *name;
} kind_t;

static const kind_t kinds[] = {{ncclFloat32, ncclSum, "float sum"},
                               {ncclInt32, ncclMax, "int32 max"}};

static void put(const kind_t *k, void *b, size_t i, long v)
{
  if (k->type == ncclFloat32) ((float *)b)[i] = (float)v;
  else ((int32_t *)b)[i] = (int32_t)v;
}

static long get(const kind_t *k, const void *b, size_t i)
{
  if (k->type == ncclFloat32) return (long)((const float *)b)[i];
  return ((const int32_t *)b)[i];
}

/* Reduction input of rank r at index i; every value and sum is an integer
 * that float holds exactly. */
static long red_in(const kind_t *k, int r, size_t i)
{
  if (k->type == ncclFloat32) return (long)(i % 97) - 48 + r;
  return (long)((i * 31 + (size_t)r * 17) % 1000) - 500;
}

static long red_out(const kind_t *k, size_t i)
{
  long acc = red_in(k, 0, i);
  for (int r = 1; r < NRANKS; r++) {
    long v = red_in(k, r, i);
    if (k->type == ncclFloat32) acc += v;
    else if (v > acc) acc = v;
  }
  return acc;
}

/* Data-movement value that rank r owns at index i. */
static long mov(int r, size_t i) { return (long)r * 100000 + (long)i; }

/* Compares n elements of b with want(i); reports the first difference. */
#define EXPECT_ARRAY(k, b, n, want_expr, what)                               \
  do {                                                                       \
    char d_[128] = "";                                                       \
    int ok_ = 1;                                                             \
    for (size_t i = 0; i < (n); i++) {                                       \
      long w_ = (want_expr);                                                 \
      if (get((k), (b), i) != w_) {                                          \
        snprintf(d_, sizeof(d_), "element %zu: got %ld expected %ld", i,     \
                 get((k), (b), i), w_);                                      \
        ok_ = 0;                                                             \
        break;                                                               \
      }                                                                      \
    }                                                                        \
    check(ok_, (what), ok_ ? NULL : d_);                                     \
  } while (0)

static char label[256];

static const char *lab(const char *coll, const kind_t *k, size_t n, int inplace)
{
  snprintf(label, sizeof(label), "%s %s count=%zu %s", coll, k->name, n,
           inplace ? "in-place" : "out-of-place");
  return label;
}

static int call_ok(ncclResult_t r, ncclComm_t comm, const char *what)
{
  if (r == ncclSuccess) return 1;
  char d[512];
  snprintf(d, sizeof(d), "returned %s: %s", ncclGetErrorString(r),
           ncclGetLastError(comm));
  check(0, what, d);
  return 0;
}

static void run_all(ncclComm_t comm, int rank)
{
  static const size_t counts[] = {1, 4099};
  const int nr = NRANKS;
  for (size_t ki = 0; ki < 2; ki++) {
    const kind_t *k = &kinds[ki];
    for (size_t ci = 0; ci < 2; ci++) {
      size_t n = counts[ci];
      size_t es = 4;
      char *s = malloc(n * es * nr), *d = malloc(n * es * nr);
      for (int ip = 0; ip < 2; ip++) {
        const char *w;
        int root = ip ? nr - 1 : 0;

        /* all-reduce */
        w = lab("allreduce", k, n, ip);
        for (size_t i = 0; i < n; i++) put(k, s, i, red_in(k, rank, i));
        if (call_ok(ncclAllReduce(s, ip ? s : d, n, k->type, k->op, comm, STREAM), comm, w))
          EXPECT_ARRAY(k, ip ? s : d, n, red_out(k, i), w);

        /* reduce */
        w = lab("reduce", k, n, ip);
        for (size_t i = 0; i < n; i++) put(k, s, i, red_in(k, rank, i));
        if (call_ok(ncclReduce(s, ip ? s : d, n, k->type, k->op, root, comm, STREAM), comm, w) &&
            rank == root)
          EXPECT_ARRAY(k, ip ? s : d, n, red_out(k, i), w);

        /* reduce-scatter: in place, recvbuff = sendbuff + rank*recvcount */
        w = lab("reducescatter", k, n, ip);
        for (size_t i = 0; i < n * nr; i++) put(k, s, i, red_in(k, rank, i));
        {
          char *out = ip ? s + (size_t)rank * n * es : d;
          if (call_ok(ncclReduceScatter(s, out, n, k->type, k->op, comm, STREAM), comm, w))
            EXPECT_ARRAY(k, out, n, red_out(k, (size_t)rank * n + i), w);
        }

        /* broadcast and the deprecated in-place bcast */
        w = lab("broadcast", k, n, ip);
        for (size_t i = 0; i < n; i++) {
          put(k, s, i, rank == root ? mov(root, i) : -1);
          put(k, d, i, -2);
        }
        if (call_ok(ncclBroadcast(s, ip ? s : d, n, k->type, root, comm, STREAM), comm, w))
          EXPECT_ARRAY(k, ip ? s : d, n, mov(root, i), w);
        w = lab("bcast", k, n, 1);
        for (size_t i = 0; i < n; i++) put(k, d, i, rank == root ? mov(root, i) + 7 : -1);
        if (call_ok(ncclBcast(d, n, k->type, root, comm, STREAM), comm, w))
          EXPECT_ARRAY(k, d, n, mov(root, i) + 7, w);

        /* all-gather: in place, sendbuff = recvbuff + rank*sendcount */
        w = lab("allgather", k, n, ip);
        {
          char *in = ip ? d + (size_t)rank * n * es : s;
          for (size_t i = 0; i < n * nr; i++) put(k, d, i, -1);
          for (size_t i = 0; i < n; i++) put(k, in, i, mov(rank, i));
          if (call_ok(ncclAllGather(in, d, n, k->type, comm, STREAM), comm, w))
            EXPECT_ARRAY(k, d, n * nr, mov((int)(i / n), i % n), w);
        }

        /* gather: in place on the root, sendbuff = recvbuff + root*count */
        w = lab("gather", k, n, ip);
        {
          char *in = (ip && rank == root) ? d + (size_t)root * n * es : s;
          for (size_t i = 0; i < n * nr; i++) put(k, d, i, -1);
          for (size_t i = 0; i < n; i++) put(k, in, i, mov(rank, i));
          if (call_ok(ncclGather(in, d, n, k->type, root, comm, STREAM), comm, w) &&
              rank == root)
            EXPECT_ARRAY(k, d, n * nr, mov((int)(i / n), i % n), w);
        }

        /* scatter: in place on the root, recvbuff = sendbuff + root*count */
        w = lab("scatter", k, n, ip);
        {
          for (size_t i = 0; i < n * nr; i++)
            put(k, s, i, rank == root ? mov((int)(i / n), i % n) : -1);
          char *out = (ip && rank == root) ? s + (size_t)root * n * es : d;
          if (!(ip && rank == root))
            for (size_t i = 0; i < n; i++) put(k, out, i, -2);
          if (call_ok(ncclScatter(s, out, n, k->type, root, comm, STREAM), comm, w))
            EXPECT_ARRAY(k, out, n, mov(rank, i), w);
        }

        if (ip) continue; /* no in-place form for the rest */

        /* all-to-all: block j of rank r goes to rank j */
        w = lab("alltoall", k, n, 0);
        for (size_t i = 0; i < n * nr; i++) {
          put(k, s, i, (long)rank * 100000 + (long)(i / n) * 10000 + (long)(i % n));
          put(k, d, i, -1);
        }
        if (call_ok(ncclAlltoAll(s, d, n, k->type, comm, STREAM), comm, w))
          EXPECT_ARRAY(k, d, n * nr,
                       (long)(i / n) * 100000 + (long)rank * 10000 + (long)(i % n), w);

        /* send/recv ring inside a group */
        w = lab("send/recv ring", k, n, 0);
        {
          int next = (rank + 1) % nr, prev = (rank + nr - 1) % nr;
          for (size_t i = 0; i < n; i++) {
            put(k, s, i, mov(rank, i));
            put(k, d, i, -1);
          }
          ncclResult_t r0 = ncclGroupStart();
          ncclResult_t r1 = ncclSend(s, n, k->type, next, comm, STREAM);
          ncclResult_t r2 = ncclRecv(d, n, k->type, prev, comm, STREAM);
          ncclResult_t r3 = ncclGroupEnd();
          if (call_ok(r0 != ncclSuccess ? r0 : r1 != ncclSuccess ? r1
                      : r2 != ncclSuccess ? r2 : r3, comm, w))
            EXPECT_ARRAY(k, d, n, mov(prev, i), w);
        }
      }
      free(s);
      free(d);
    }
  }

  /* bad arguments */
  float x[4] = {0}, y[4] = {0};
  check(ncclAllReduce(x, y, 4, (ncclDataType_t)ncclNumTypes, ncclSum, comm, STREAM) ==
            ncclInvalidArgument, "allreduce with datatype ncclNumTypes gives ncclInvalidArgument", NULL);
  check(ncclAllReduce(x, y, 4, (ncclDataType_t)-1, ncclSum, comm, STREAM) ==
            ncclInvalidArgument, "allreduce with datatype -1 gives ncclInvalidArgument", NULL);
  check(ncclAllReduce(NULL, y, 4, ncclFloat32, ncclSum, comm, STREAM) ==
            ncclInvalidArgument, "allreduce with NULL sendbuff gives ncclInvalidArgument", NULL);
  check(ncclAllGather(x, NULL, 1, ncclFloat32, comm, STREAM) ==
            ncclInvalidArgument, "allgather with NULL recvbuff gives ncclInvalidArgument", NULL);
  /* the ranks are still in step after the refused calls */
  for (int i = 0; i < 4; i++) x[i] = (float)(rank + i);
  if (call_ok(ncclAllReduce(x, y, 4, ncclFloat32, ncclSum, comm, STREAM), comm,
              "allreduce after bad calls"))
    check(y[0] == 6.0f && y[3] == 18.0f, "allreduce after bad calls", NULL);
}

/* Every function of NCCL 2.28's nccl.h; each is also exported with a "p"
 * prefix (the profiling entry points). A program built against NCCL links
 * to all of them, so libgeoccl must export every one, even those it only
 * answers with ncclInvalidUsage. */
static const char *const api_functions[] = {
    "ncclAllGather", "ncclAllReduce", "ncclAlltoAll", "ncclBcast",
    "ncclBroadcast", "ncclCommAbort", "ncclCommCount", "ncclCommCuDevice",
    "ncclCommDeregister", "ncclCommDestroy", "ncclCommFinalize",
    "ncclCommGetAsyncError", "ncclCommInitAll", "ncclCommInitRank",
    "ncclCommInitRankConfig", "ncclCommInitRankScalable", "ncclCommRegister",
    "ncclCommRevoke", "ncclCommShrink", "ncclCommSplit", "ncclCommUserRank",
    "ncclCommWindowDeregister", "ncclCommWindowRegister", "ncclGather",
    "ncclGetErrorString", "ncclGetLastError", "ncclGetUniqueId",
    "ncclGetVersion", "ncclGroupEnd", "ncclGroupSimulateEnd",
    "ncclGroupStart", "ncclMemAlloc", "ncclMemFree", "ncclRecv",
    "ncclRedOpCreatePreMulSum", "ncclRedOpDestroy", "ncclReduce",
    "ncclReduceScatter", "ncclScatter", "ncclSend",
};

/* Looks each name up in the running program, where libgeoccl is loaded. */
static void check_exports(void)
{
  size_t n = sizeof(api_functions) / sizeof(api_functions[0]);
  int missing = 0;
  for (size_t i = 0; i < n; i++) {
    char pname[64];
    snprintf(pname, sizeof(pname), "p%s", api_functions[i]);
    if (dlsym(RTLD_DEFAULT, api_functions[i]) == NULL) {
      fprintf(stderr, "FAIL libgeoccl does not export %s\n", api_functions[i]);
      missing++;
    }
    if (dlsym(RTLD_DEFAULT, pname) == NULL) {
      fprintf(stderr, "FAIL libgeoccl does not export %s\n", pname);
      missing++;
    }
  }
  exports_passed = 2 * (int)n - missing;
  exports_failed = missing;
}

static int child(int rank, ncclUniqueId id)
{
  my_rank = rank;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  config.commName = "abi-test";
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRankConfig(&comm, NRANKS, id, rank, &config);
  if (!call_ok(r, NULL, "ncclCommInitRankConfig")) return 1;
  int n = 0, ur = -1;
  check(ncclCommCount(comm, &n) == ncclSuccess && n == NRANKS, "ncclCommCount", NULL);
  check(ncclCommUserRank(comm, &ur) == ncclSuccess && ur == rank, "ncclCommUserRank", NULL);
  run_all(comm, rank);
  call_ok(ncclCommDestroy(comm), NULL, "ncclCommDestroy");
  return tally->failed[rank] != 0;
}

int main(void)
{
  setenv("GEOCCL_SOCKET_IFNAME", "lo", 0);
  tally = mmap(NULL, sizeof(*tally), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (tally == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  memset(tally, 0, sizeof(*tally));

  check_exports();

  int version = 0;
  int version_ok = ncclGetVersion(&version) == ncclSuccess && version >= 22800;
  if (!version_ok) fprintf(stderr, "FAIL ncclGetVersion gave %d\n", version);

  /* Fork first, then make the id and hand it over pipes: the bootstrap
   * root is a thread of the process that makes the id, and a child forked
   * while that thread holds a lock (malloc's, the logger's) can hang. */
  int pipes[NRANKS][2];
  fflush(stdout);
  pid_t pids[NRANKS];
  for (int i = 0; i < NRANKS; i++) {
    if (pipe(pipes[i]) != 0) {
      perror("pipe");
      return 1;
    }
    pids[i] = fork();
    if (pids[i] == 0) {
      ncclUniqueId rid;
      close(pipes[i][1]);
      if (read(pipes[i][0], &rid, sizeof(rid)) != (ssize_t)sizeof(rid)) _exit(1);
      _exit(child(i, rid));
    }
    if (pids[i] < 0) {
      perror("fork");
      return 1;
    }
    close(pipes[i][0]);
  }
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    fprintf(stderr, "FAIL ncclGetUniqueId: %s: %s\n", ncclGetErrorString(r),
            ncclGetLastError(NULL));
  for (int i = 0; i < NRANKS; i++) {
    if (r == ncclSuccess && write(pipes[i][1], &id, sizeof(id)) != (ssize_t)sizeof(id))
      perror("write");
    close(pipes[i][1]);
  }

  /* wait with a deadline; a rank that hangs is killed and counted */
  int done[NRANKS] = {0}, bad_exit = 0, remaining = NRANKS;
  const char *scale_env = getenv("GEOCCL_TEST_TIME_SCALE");
  int scale = scale_env && atoi(scale_env) > 1 ? atoi(scale_env) : 1; /* sanitizers */
  time_t deadline = time(NULL) + (time_t)TIMEOUT_S * scale;
  while (remaining > 0) {
    for (int i = 0; i < NRANKS; i++) {
      int ws;
      if (done[i] || waitpid(pids[i], &ws, WNOHANG) != pids[i]) continue;
      done[i] = 1;
      remaining--;
      if (WIFSIGNALED(ws)) {
        fprintf(stderr, "FAIL rank %d died of signal %d\n", i, WTERMSIG(ws));
        bad_exit++;
      }
    }
    if (remaining > 0 && time(NULL) > deadline) {
      for (int i = 0; i < NRANKS; i++) {
        if (done[i]) continue;
        fprintf(stderr, "FAIL rank %d did not finish in %d s\n", i, TIMEOUT_S * scale);
        kill(pids[i], SIGKILL);
        waitpid(pids[i], NULL, 0);
        done[i] = 1;
        remaining--;
        bad_exit++;
      }
    }
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }

  int passed = version_ok + exports_passed;
  int failed = !version_ok + bad_exit + exports_failed + (r != ncclSuccess);
  for (int i = 0; i < NRANKS; i++) {
    passed += tally->passed[i];
    failed += tally->failed[i];
  }
  printf("test_abi: %d passed, %d failed\n", passed, failed);
  return failed != 0;
}
