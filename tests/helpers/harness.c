/*
 * Multi-process test harness for GeoCCL: see harness.h for the contracts.
 *
 * No libm: the narrow float formats are converted by taking the double
 * apart bit by bit, which keeps the test binaries independent of -lm and
 * makes the rounding rule (to nearest, ties to even) explicit.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

/* ------------------------------------------------------------------------ */
/* Process harness                                                          */
/* ------------------------------------------------------------------------ */

/* Exit codes a child uses beyond "number of failures". */
#define EXIT_FAILS_MAX 199  /* failure counts are clipped to this */
#define EXIT_INIT_FAILED 201
#define EXIT_NEGATIVE 202   /* the test body returned a negative number */

void harness_setup_env(void) { setenv("GEOCCL_SOCKET_IFNAME", "lo", 0); }

double harness_time_scale(void)
{
  const char *s = getenv("GEOCCL_TEST_TIME_SCALE");
  double v = s ? atof(s) : 1;
  return v >= 1 ? v : 1;
}

int harness_race_matrix(void)
{
  const char *s = getenv("GEOCCL_SANITIZE");
  return s != NULL && strstr(s, "thread") != NULL;
}

int harness_race_keeps(ncclDataType_t t, ncclRedOp_t op)
{
  return !harness_race_matrix() || t == ncclFloat32 || op == ncclSum;
}

double harness_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
  struct timespec ts;
  ts.tv_sec = (time_t)s;
  ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void *harness_shared_alloc(size_t bytes)
{
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void harness_shared_free(void *p, size_t bytes)
{
  if (p != NULL) munmap(p, bytes);
}

int harness_free_port(void)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static int clip_exit(int fails)
{
  if (fails < 0) return EXIT_NEGATIVE;
  return fails > EXIT_FAILS_MAX ? EXIT_FAILS_MAX : fails;
}

static const char *describe_exit(int code)
{
  switch (code) {
  case EXIT_INIT_FAILED: return " (communicator init failed)";
  case EXIT_NEGATIVE: return " (test body returned a negative value)";
  case EXIT_FAILS_MAX: return " (failures, at least this many)";
  default: return " (failures)";
  }
}

static int may_die(const harness_opts *opts, int r)
{
  return r < 32 && (opts->expect_die & (1u << r)) != 0;
}

/* The bootstrap root of a run lives in a process of its own: it is a
 * thread of the process that called ncclGetUniqueId, and a process that
 * forks must have no threads (the ranks' copies of them would be dead, and
 * ThreadSanitizer refuses to run a child of a threaded process).  The id
 * comes back through a pipe; the server lives until *stop is closed. */
static pid_t id_server(ncclUniqueId *id, int *stop)
{
  int idp[2], sp[2];
  if (pipe(idp) != 0) return -1;
  if (pipe(sp) != 0) {
    close(idp[0]);
    close(idp[1]);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    close(idp[0]);
    close(sp[1]);
    ncclUniqueId mine;
    ncclResult_t r = ncclGetUniqueId(&mine);
    if (r != ncclSuccess)
      fprintf(stderr, "harness: ncclGetUniqueId failed: %s: %s\n",
              ncclGetErrorString(r), ncclGetLastError(NULL));
    else if (write(idp[1], &mine, sizeof(mine)) != (ssize_t)sizeof(mine))
      r = ncclSystemError;
    close(idp[1]);
    char c;
    for (;;) {
      ssize_t n = read(sp[0], &c, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    _exit(r == ncclSuccess ? 0 : 1);
  }
  close(idp[1]);
  close(sp[0]);
  if (pid < 0) {
    close(idp[0]);
    close(sp[1]);
    return -1;
  }
  size_t got = 0;
  while (got < sizeof(*id)) {
    ssize_t n = read(idp[0], (char *)id + got, sizeof(*id) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(idp[0]);
  if (got < sizeof(*id)) {
    close(sp[1]);
    waitpid(pid, NULL, 0);
    return -1;
  }
  *stop = sp[1];
  return pid;
}

static void id_server_stop(pid_t pid, int stop)
{
  if (pid <= 0) return;
  close(stop);
  while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
  }
}

int harness_run_opts(int nranks, harness_raw_fn fn, void *arg,
                     const harness_opts *opts)
{
  if (nranks < 1 || fn == NULL || opts == NULL) return nranks < 1 ? 1 : nranks;
  harness_setup_env();

  ncclUniqueId id;
  const ncclUniqueId *idp = NULL;
  pid_t server = -1;
  int server_stop = -1;
  if (opts->make_id) {
    server = id_server(&id, &server_stop);
    if (server < 0) {
      fprintf(stderr, "harness: no unique id (see above)\n");
      return nranks;
    }
    idp = &id;
  }

  pid_t *pids = calloc((size_t)nranks, sizeof(*pids));
  harness_status *st = calloc((size_t)nranks, sizeof(*st));
  int *reaped = calloc((size_t)nranks, sizeof(*reaped));
  if (pids == NULL || st == NULL || reaped == NULL) {
    free(pids); free(st); free(reaped);
    id_server_stop(server, server_stop);
    fprintf(stderr, "harness: out of memory\n");
    return nranks;
  }

  fflush(stdout);
  fflush(stderr);
  double t0 = harness_now();
  int forked = 0;
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid == 0) {
#ifdef __linux__
      prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
      int res = fn(r, nranks, idp, arg);
      fflush(stdout);
      fflush(stderr);
      _exit(clip_exit(res));
    }
    if (pid < 0) {
      fprintf(stderr, "harness: fork for rank %d failed: %s\n", r,
              strerror(errno));
      break;
    }
    pids[r] = pid;
    forked++;
  }
  for (int r = 0; r < nranks; r++) {
    st[r].exit_code = -1;
    if (r >= forked) reaped[r] = 1; /* never started */
  }

  double deadline = t0 + opts->timeout_s * harness_time_scale();
  for (;;) {
    int pending = 0, pending_checked = 0;
    for (int r = 0; r < forked; r++) {
      if (reaped[r]) continue;
      int ws;
      pid_t p = waitpid(pids[r], &ws, WNOHANG);
      if (p == pids[r]) {
        reaped[r] = 1;
        st[r].done = 1;
        st[r].seconds = harness_now() - t0;
        if (WIFEXITED(ws)) st[r].exit_code = WEXITSTATUS(ws);
        if (WIFSIGNALED(ws)) st[r].signal = WTERMSIG(ws);
        continue;
      }
      pending++;
      if (!may_die(opts, r)) pending_checked++;
    }
    if (pending == 0) break;
    if (pending_checked == 0 || harness_now() > deadline) {
      if (pending_checked != 0) {
        fprintf(stderr, "harness: timeout after %.1f s; ranks not finished:",
                opts->timeout_s);
        for (int r = 0; r < forked; r++)
          if (!reaped[r]) fprintf(stderr, " %d", r);
        fprintf(stderr, "\n");
      }
      for (int r = 0; r < forked; r++)
        if (!reaped[r]) kill(pids[r], SIGKILL);
      for (int r = 0; r < forked; r++) {
        if (reaped[r]) continue;
        int ws;
        while (waitpid(pids[r], &ws, 0) < 0 && errno == EINTR) {
        }
        reaped[r] = 1;
        st[r].seconds = harness_now() - t0;
        st[r].signal = SIGKILL;
      }
      break;
    }
    sleep_s(0.002);
  }

  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    if (may_die(opts, r)) continue;
    if (r >= forked) {
      fprintf(stderr, "harness: rank %d: never started\n", r);
      failed++;
    } else if (!st[r].done) {
      fprintf(stderr, "harness: rank %d: killed after the %.1f s timeout\n",
              r, opts->timeout_s);
      failed++;
    } else if (st[r].signal != 0) {
      fprintf(stderr, "harness: rank %d: died of signal %d (%s)\n", r,
              st[r].signal, strsignal(st[r].signal));
      failed++;
    } else if (st[r].exit_code != 0) {
      fprintf(stderr, "harness: rank %d: exit code %d%s\n", r,
              st[r].exit_code, describe_exit(st[r].exit_code));
      failed++;
    }
  }
  if (opts->status != NULL)
    memcpy(opts->status, st, (size_t)nranks * sizeof(*st));
  id_server_stop(server, server_stop);
  free(pids);
  free(st);
  free(reaped);
  return failed;
}

struct init_trampoline {
  harness_fn fn;
  void *arg;
};

static int run_with_comm(int rank, int nranks, const ncclUniqueId *id,
                         void *arg)
{
  struct init_trampoline *t = arg;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, *id, rank);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommInitRank(nranks=%d): %s: %s\n", rank,
            nranks, ncclGetErrorString(r), ncclGetLastError(NULL));
    return EXIT_INIT_FAILED;
  }
  int fails = t->fn(rank, nranks, comm, t->arg);
  if (fails < 0) fails = 1;
  if (fails > EXIT_FAILS_MAX - 1) fails = EXIT_FAILS_MAX - 1;
  r = ncclCommDestroy(comm);
  if (r != ncclSuccess) {
    fprintf(stderr, "[rank %d] ncclCommDestroy: %s: %s\n", rank,
            ncclGetErrorString(r), ncclGetLastError(NULL));
    fails++;
  }
  return fails;
}

int harness_run(int nranks, harness_fn fn, void *arg, double timeout_s)
{
  struct init_trampoline t = {fn, arg};
  harness_opts o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = timeout_s;
  o.make_id = 1;
  return harness_run_opts(nranks, run_with_comm, &t, &o);
}

int harness_run_noinit(int nranks, harness_raw_fn fn, void *arg,
                       double timeout_s)
{
  harness_opts o;
  memset(&o, 0, sizeof(o));
  o.timeout_s = timeout_s;
  o.make_id = 1;
  return harness_run_opts(nranks, fn, arg, &o);
}

/* ------------------------------------------------------------------------ */
/* Narrow float formats                                                     */
/* ------------------------------------------------------------------------ */

/* A binary format with ebits exponent bits, mbits stored mantissa bits and
 * the IEEE bias. e4m3 (ieee == 0) has no infinities: exponent field 15 is
 * an ordinary binade except for mantissa 111, which is NaN. */
struct minifloat {
  int ebits, mbits, ieee;
};

static const struct minifloat MF_HALF = {5, 10, 1};
static const struct minifloat MF_BF16 = {8, 7, 1};
static const struct minifloat MF_E4M3 = {4, 3, 0};
static const struct minifloat MF_E5M2 = {5, 2, 1};

static uint64_t double_bits(double v)
{
  uint64_t b;
  memcpy(&b, &v, sizeof(b));
  return b;
}

static double bits_double(uint64_t b)
{
  double v;
  memcpy(&v, &b, sizeof(v));
  return v;
}

static uint32_t mf_nan(struct minifloat f)
{
  uint32_t emask = (1u << f.ebits) - 1;
  uint32_t mmask = (1u << f.mbits) - 1;
  return f.ieee ? (emask << f.mbits) | (1u << (f.mbits - 1))
                : (emask << f.mbits) | mmask;
}

static uint32_t mf_encode(double v, struct minifloat f, int *exact)
{
  uint64_t b = double_bits(v);
  uint32_t sign = (uint32_t)(b >> 63) << (f.ebits + f.mbits);
  int dexp = (int)((b >> 52) & 0x7ff);
  uint64_t dman = b & ((UINT64_C(1) << 52) - 1);
  int bias = (1 << (f.ebits - 1)) - 1;
  int emin = 1 - bias;
  uint32_t emask = (1u << f.ebits) - 1;
  int ex = 1;

  if (dexp == 0x7ff) { /* inf or NaN */
    if (exact) *exact = (dman == 0) ? f.ieee : 0;
    if (dman != 0 || !f.ieee) return sign | mf_nan(f);
    return sign | (emask << f.mbits);
  }
  if (dexp == 0 && dman == 0) {
    if (exact) *exact = 1;
    return sign;
  }
  /* value = sig * 2^(e - 52) with sig holding 53 bits (double subnormals
   * are far below every narrow format and round to zero) */
  uint64_t sig = dman | (dexp != 0 ? (UINT64_C(1) << 52) : 0);
  int e = (dexp != 0 ? dexp : 1) - 1023;
  int shift = 52 - f.mbits;
  int subnormal = e < emin;
  if (subnormal) shift += emin - e;
  uint64_t r;
  if (shift >= 64) {
    r = 0;
    ex = 0;
  } else {
    r = sig >> shift;
    uint64_t rem = sig & ((UINT64_C(1) << shift) - 1);
    uint64_t halfway = UINT64_C(1) << (shift - 1);
    if (rem != 0) ex = 0;
    if (rem > halfway || (rem == halfway && (r & 1))) r++;
  }
  uint32_t out;
  if (subnormal) {
    /* r == 2^mbits lands exactly on the smallest normal: same bits */
    out = (uint32_t)r;
  } else {
    if (r == (UINT64_C(2) << f.mbits)) {
      r >>= 1;
      e++;
    }
    int field = e + bias;
    uint32_t mant = (uint32_t)(r - (UINT64_C(1) << f.mbits));
    int maxfield = f.ieee ? (int)emask - 1 : (int)emask;
    if (field > maxfield ||
        (!f.ieee && field == (int)emask && mant == (1u << f.mbits) - 1)) {
      if (exact) *exact = 0;
      return sign | (f.ieee ? (emask << f.mbits) : mf_nan(f));
    }
    out = ((uint32_t)field << f.mbits) | mant;
  }
  if (exact) *exact = ex;
  return sign | out;
}

static double mf_decode(uint32_t bits, struct minifloat f)
{
  uint32_t emask = (1u << f.ebits) - 1;
  uint32_t mmask = (1u << f.mbits) - 1;
  uint64_t sign = (uint64_t)((bits >> (f.ebits + f.mbits)) & 1) << 63;
  uint32_t field = (bits >> f.mbits) & emask;
  uint32_t mant = bits & mmask;
  int bias = (1 << (f.ebits - 1)) - 1;

  if (f.ieee && field == emask)
    return bits_double(sign | (UINT64_C(0x7ff) << 52) |
                       (mant ? (UINT64_C(1) << 51) : 0));
  if (!f.ieee && field == emask && mant == mmask)
    return bits_double(sign | (UINT64_C(0x7ff) << 52) | (UINT64_C(1) << 51));
  if (field == 0) {
    if (mant == 0) return bits_double(sign);
    /* normalise: value = mant * 2^(1 - bias - mbits) */
    int p = 31;
    while (!(mant & (1u << p))) p--;
    int e = 1 - bias - f.mbits + p;
    uint64_t frac = (uint64_t)(mant & ~(1u << p)) << (52 - p);
    return bits_double(sign | ((uint64_t)(e + 1023) << 52) | frac);
  }
  int e = (int)field - bias;
  return bits_double(sign | ((uint64_t)(e + 1023) << 52) |
                     ((uint64_t)mant << (52 - f.mbits)));
}

uint16_t harness_double_to_half(double v, int *exact)
{
  return (uint16_t)mf_encode(v, MF_HALF, exact);
}
uint16_t harness_double_to_bf16(double v, int *exact)
{
  return (uint16_t)mf_encode(v, MF_BF16, exact);
}
uint8_t harness_double_to_e4m3(double v, int *exact)
{
  return (uint8_t)mf_encode(v, MF_E4M3, exact);
}
uint8_t harness_double_to_e5m2(double v, int *exact)
{
  return (uint8_t)mf_encode(v, MF_E5M2, exact);
}
double harness_half_to_double(uint16_t h) { return mf_decode(h, MF_HALF); }
double harness_bf16_to_double(uint16_t b) { return mf_decode(b, MF_BF16); }
double harness_e4m3_to_double(uint8_t b) { return mf_decode(b, MF_E4M3); }
double harness_e5m2_to_double(uint8_t b) { return mf_decode(b, MF_E5M2); }

/* ------------------------------------------------------------------------ */
/* Data types                                                               */
/* ------------------------------------------------------------------------ */

size_t harness_type_size(ncclDataType_t t)
{
  switch (t) {
  case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2:
    return 1;
  case ncclFloat16: case ncclBfloat16:
    return 2;
  case ncclInt32: case ncclUint32: case ncclFloat32:
    return 4;
  case ncclInt64: case ncclUint64: case ncclFloat64:
    return 8;
  default:
    return 0;
  }
}

const char *harness_type_name(ncclDataType_t t)
{
  switch (t) {
  case ncclInt8: return "int8";
  case ncclUint8: return "uint8";
  case ncclInt32: return "int32";
  case ncclUint32: return "uint32";
  case ncclInt64: return "int64";
  case ncclUint64: return "uint64";
  case ncclFloat16: return "half";
  case ncclFloat32: return "float";
  case ncclFloat64: return "double";
  case ncclBfloat16: return "bfloat16";
  case ncclFloat8e4m3: return "fp8e4m3";
  case ncclFloat8e5m2: return "fp8e5m2";
  default: return "?type";
  }
}

const char *harness_op_name(ncclRedOp_t op)
{
  switch (op) {
  case ncclSum: return "sum";
  case ncclProd: return "prod";
  case ncclMax: return "max";
  case ncclMin: return "min";
  case ncclAvg: return "avg";
  default: return "premulsum";
  }
}

int harness_type_is_float(ncclDataType_t t)
{
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 ||
         t == ncclBfloat16 || t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

enum family { FAM_SIGNED, FAM_UNSIGNED, FAM_FLOAT };

static enum family type_family(ncclDataType_t t)
{
  switch (t) {
  case ncclInt8: case ncclInt32: case ncclInt64: return FAM_SIGNED;
  case ncclUint8: case ncclUint32: case ncclUint64: return FAM_UNSIGNED;
  default: return FAM_FLOAT;
  }
}

/* Significand precision in bits, including the implicit one. */
static int float_precision(ncclDataType_t t)
{
  switch (t) {
  case ncclFloat16: return 11;
  case ncclBfloat16: return 8;
  case ncclFloat8e4m3: return 4;
  case ncclFloat8e5m2: return 3;
  case ncclFloat32: return 24;
  default: return 53;
  }
}

static int64_t signed_max(ncclDataType_t t)
{
  return t == ncclInt8 ? INT8_MAX : t == ncclInt32 ? INT32_MAX : INT64_MAX;
}

static uint64_t unsigned_max(ncclDataType_t t)
{
  return t == ncclUint8 ? UINT8_MAX : t == ncclUint32 ? UINT32_MAX
                                                      : UINT64_MAX;
}

/* One element, in the arithmetic of its family. */
typedef union {
  int64_t i;
  uint64_t u;
  double d;
} hval;

static void store(ncclDataType_t t, void *buf, size_t idx, hval v)
{
  char *p = (char *)buf + idx * harness_type_size(t);
  switch (t) {
  case ncclInt8: { int8_t x = (int8_t)v.i; memcpy(p, &x, 1); break; }
  case ncclUint8: { uint8_t x = (uint8_t)v.u; memcpy(p, &x, 1); break; }
  case ncclInt32: { int32_t x = (int32_t)v.i; memcpy(p, &x, 4); break; }
  case ncclUint32: { uint32_t x = (uint32_t)v.u; memcpy(p, &x, 4); break; }
  case ncclInt64: memcpy(p, &v.i, 8); break;
  case ncclUint64: memcpy(p, &v.u, 8); break;
  case ncclFloat16: {
    uint16_t x = harness_double_to_half(v.d, NULL);
    memcpy(p, &x, 2);
    break;
  }
  case ncclBfloat16: {
    uint16_t x = harness_double_to_bf16(v.d, NULL);
    memcpy(p, &x, 2);
    break;
  }
  case ncclFloat8e4m3: { uint8_t x = harness_double_to_e4m3(v.d, NULL); memcpy(p, &x, 1); break; }
  case ncclFloat8e5m2: { uint8_t x = harness_double_to_e5m2(v.d, NULL); memcpy(p, &x, 1); break; }
  case ncclFloat32: { float x = (float)v.d; memcpy(p, &x, 4); break; }
  case ncclFloat64: memcpy(p, &v.d, 8); break;
  default: break;
  }
}

double harness_load_double(ncclDataType_t t, const void *buf, size_t idx)
{
  const char *p = (const char *)buf + idx * harness_type_size(t);
  switch (t) {
  case ncclInt8: { int8_t x; memcpy(&x, p, 1); return x; }
  case ncclUint8: { uint8_t x; memcpy(&x, p, 1); return x; }
  case ncclInt32: { int32_t x; memcpy(&x, p, 4); return x; }
  case ncclUint32: { uint32_t x; memcpy(&x, p, 4); return x; }
  case ncclInt64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
  case ncclUint64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
  case ncclFloat16: { uint16_t x; memcpy(&x, p, 2); return harness_half_to_double(x); }
  case ncclBfloat16: { uint16_t x; memcpy(&x, p, 2); return harness_bf16_to_double(x); }
  case ncclFloat8e4m3: { uint8_t x; memcpy(&x, p, 1); return harness_e4m3_to_double(x); }
  case ncclFloat8e5m2: { uint8_t x; memcpy(&x, p, 1); return harness_e5m2_to_double(x); }
  case ncclFloat32: { float x; memcpy(&x, p, 4); return x; }
  case ncclFloat64: { double x; memcpy(&x, p, 8); return x; }
  default: return 0;
  }
}

/* Formats element idx exactly, with its bits for floating types. */
static void format_elem(ncclDataType_t t, const void *buf, size_t idx,
                        char *out, size_t len)
{
  const char *p = (const char *)buf + idx * harness_type_size(t);
  switch (type_family(t)) {
  case FAM_SIGNED: {
    int64_t v = t == ncclInt8 ? (int64_t)*(const int8_t *)p : 0;
    if (t == ncclInt32) { int32_t x; memcpy(&x, p, 4); v = x; }
    if (t == ncclInt64) memcpy(&v, p, 8);
    snprintf(out, len, "%" PRId64, v);
    return;
  }
  case FAM_UNSIGNED: {
    uint64_t v = t == ncclUint8 ? (uint64_t)*(const uint8_t *)p : 0;
    if (t == ncclUint32) { uint32_t x; memcpy(&x, p, 4); v = x; }
    if (t == ncclUint64) memcpy(&v, p, 8);
    snprintf(out, len, "%" PRIu64, v);
    return;
  }
  case FAM_FLOAT: {
    uint64_t bits = 0;
    memcpy(&bits, p, harness_type_size(t)); /* little-endian host */
    snprintf(out, len, "%.17g (0x%0*" PRIx64 ")", harness_load_double(t, buf, idx),
             (int)harness_type_size(t) * 2, bits);
    return;
  }
  }
}

/* ------------------------------------------------------------------------ */
/* Reduction inputs and references                                          */
/* ------------------------------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
  x += UINT64_C(0x9e3779b97f4a7c15);
  x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
  return x ^ (x >> 31);
}

static uint64_t elem_hash(ncclDataType_t t, ncclRedOp_t op, int nranks,
                          int rank, size_t idx, uint32_t seed)
{
  uint64_t k = ((uint64_t)seed << 32) ^ ((uint64_t)(unsigned)t << 24) ^
               ((uint64_t)(unsigned)op << 16) ^ ((uint64_t)rank << 8) ^
               (uint64_t)nranks;
  return mix64(mix64(k) ^ (uint64_t)idx);
}

/* Max/Min input for a floating type: random bits of the type, rejecting NaN,
 * infinities and negative zero (whose order against +0 is unspecified). */
static double random_float(ncclDataType_t t, uint64_t h)
{
  for (;;) {
    double v;
    switch (t) {
    case ncclFloat16: v = harness_half_to_double((uint16_t)h); break;
    case ncclBfloat16: v = harness_bf16_to_double((uint16_t)h); break;
    case ncclFloat8e4m3: v = harness_e4m3_to_double((uint8_t)h); break;
    case ncclFloat8e5m2: v = harness_e5m2_to_double((uint8_t)h); break;
    case ncclFloat32: {
      uint32_t b = (uint32_t)h;
      float f;
      memcpy(&f, &b, 4);
      v = f;
      break;
    }
    default: v = bits_double(h); break;
    }
    uint64_t b = double_bits(v);
    int finite = ((b >> 52) & 0x7ff) != 0x7ff;
    if (finite && b != (UINT64_C(1) << 63)) return v;
    h = mix64(h);
  }
}

/* Small factors whose product over up to 4 ranks fits every type exactly;
 * fp8 only gets powers of two. 0 appears rarely so products stay
 * informative. */
static const int prod_signed[16] = {1, 2, 3, -1, -2, 1, 2, 3,
                                    -1, 1, 2, -2, 3, 1, -3, 0};
static const int prod_unsigned[16] = {1, 2, 3, 1, 2, 3, 1, 2,
                                      3, 1, 1, 2, 3, 2, 1, 0};
static const int prod_pow2[16] = {1, 2, -1, -2, 1, 2, -1, -2,
                                  1, 2, -1, -2, 1, -1, 2, 0};

static hval gen_value(ncclDataType_t t, ncclRedOp_t op, int nranks, int rank,
                      size_t idx, uint32_t seed)
{
  uint64_t h = elem_hash(t, op, nranks, rank, idx, seed);
  enum family fam = type_family(t);
  hval v;
  v.u = 0;
  if (nranks < 1) nranks = 1;

  if (op == ncclMax || op == ncclMin) {
    if (fam == FAM_SIGNED) {
      if (t == ncclInt8) v.i = (int8_t)(uint8_t)h;
      else if (t == ncclInt32) v.i = (int32_t)(uint32_t)h;
      else v.i = (int64_t)h;
    } else if (fam == FAM_UNSIGNED) {
      v.u = h & unsigned_max(t);
    } else {
      v.d = random_float(t, h);
    }
    return v;
  }

  if (op == ncclProd) {
    int k = (int)(h & 15);
    int x;
    if (fam == FAM_UNSIGNED) x = nranks <= 4 ? prod_unsigned[k] : (k == 0 ? 0 : 1);
    else if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2 || nranks > 4)
      x = nranks <= 7 ? prod_pow2[k] : (k & 1 ? 1 : -1);
    else x = prod_signed[k];
    if (fam == FAM_SIGNED) v.i = x;
    else if (fam == FAM_UNSIGNED) v.u = (uint64_t)x;
    else v.d = x;
    return v;
  }

  /* Sum and Avg: |x| <= B with nranks * B within the type (integers) or
   * within 2^precision (floats), so every partial sum is exact. */
  if (fam == FAM_SIGNED) {
    uint64_t b = (uint64_t)(signed_max(t) / nranks);
    uint64_t span = 2 * b + 1;
    uint64_t off = span == 0 ? h : h % span;
    v.i = (int64_t)(off - b);
  } else if (fam == FAM_UNSIGNED) {
    uint64_t b = unsigned_max(t) / (uint64_t)nranks;
    v.u = b == UINT64_MAX ? h : h % (b + 1);
  } else {
    uint64_t b = (UINT64_C(1) << float_precision(t)) / (uint64_t)nranks;
    int64_t x = (int64_t)(h % (2 * b + 1)) - (int64_t)b;
    v.d = (double)x;
  }
  return v;
}

void harness_fill_input(void *buf, ncclDataType_t t, ncclRedOp_t op,
                        int nranks, int rank, size_t first, size_t count,
                        uint32_t seed)
{
  for (size_t i = 0; i < count; i++)
    store(t, buf, i, gen_value(t, op, nranks, rank, first + i, seed));
}

static hval reduce2(enum family fam, ncclRedOp_t op, hval a, hval b)
{
  hval r;
  switch (fam) {
  case FAM_SIGNED:
    switch (op) {
    case ncclProd: r.i = a.i * b.i; break;
    case ncclMax: r.i = a.i > b.i ? a.i : b.i; break;
    case ncclMin: r.i = a.i < b.i ? a.i : b.i; break;
    default: r.i = a.i + b.i; break;
    }
    break;
  case FAM_UNSIGNED:
    switch (op) {
    case ncclProd: r.u = a.u * b.u; break;
    case ncclMax: r.u = a.u > b.u ? a.u : b.u; break;
    case ncclMin: r.u = a.u < b.u ? a.u : b.u; break;
    default: r.u = a.u + b.u; break;
    }
    break;
  default:
    switch (op) {
    case ncclProd: r.d = a.d * b.d; break;
    case ncclMax: r.d = a.d > b.d ? a.d : b.d; break;
    case ncclMin: r.d = a.d < b.d ? a.d : b.d; break;
    default: r.d = a.d + b.d; break;
    }
    break;
  }
  return r;
}

void harness_fill_expected(void *buf, ncclDataType_t t, ncclRedOp_t op,
                           int nranks, size_t first, size_t count,
                           uint32_t seed)
{
  enum family fam = type_family(t);
  for (size_t i = 0; i < count; i++) {
    hval acc = gen_value(t, op, nranks, 0, first + i, seed);
    for (int r = 1; r < nranks; r++)
      acc = reduce2(fam, op, acc, gen_value(t, op, nranks, r, first + i, seed));
    if (op == ncclAvg) {
      if (fam == FAM_SIGNED) acc.i /= nranks; /* truncates toward zero */
      else if (fam == FAM_UNSIGNED) acc.u /= (uint64_t)nranks;
      else acc.d /= nranks;
    }
    store(t, buf, i, acc);
  }
}

static int is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

int harness_result_is_approx(ncclDataType_t t, ncclRedOp_t op, int nranks)
{
  return op == ncclAvg && harness_type_is_float(t) && !is_pow2(nranks);
}

int harness_check(const void *got, const void *expected, ncclDataType_t t,
                  ncclRedOp_t op, int nranks, size_t count, char *msg,
                  size_t msglen)
{
  size_t es = harness_type_size(t);
  if (count == 0) return 0;
  if (!harness_result_is_approx(t, op, nranks)) {
    if (memcmp(got, expected, count * es) == 0) return 0;
    for (size_t i = 0; i < count; i++) {
      if (memcmp((const char *)got + i * es, (const char *)expected + i * es,
                 es) != 0) {
        char g[64], e[64];
        format_elem(t, got, i, g, sizeof(g));
        format_elem(t, expected, i, e, sizeof(e));
        snprintf(msg, msglen, "element %zu of %zu: got %s, expected %s", i,
                 count, g, e);
        return 1;
      }
    }
    return 0;
  }
  /* Each input is scaled by 1/nranks with one rounding, the sum adds at
   * most nranks-1 more, the reference one more: bound them all by
   * (2n+1) * B * 2^-p with B = 2^p / n the input bound of gen_value. */
  int p = float_precision(t);
  double unit = 1.0;
  for (int k = 0; k < p; k++) unit /= 2;
  double bound = (double)((UINT64_C(1) << p) / (uint64_t)nranks);
  double tol = (2.0 * nranks + 1.0) * bound * unit;
  for (size_t i = 0; i < count; i++) {
    double g = harness_load_double(t, got, i);
    double e = harness_load_double(t, expected, i);
    double d = g - e;
    if (d < 0) d = -d;
    if (!(d <= tol + (e < 0 ? -e : e) * 2 * unit)) { /* also catches NaN */
      char gs[64], xs[64];
      format_elem(t, got, i, gs, sizeof(gs));
      format_elem(t, expected, i, xs, sizeof(xs));
      snprintf(msg, msglen,
               "element %zu of %zu: got %s, expected %s within %.3g", i,
               count, gs, xs, tol);
      return 1;
    }
  }
  return 0;
}

void harness_fill_bytes(void *buf, size_t nbytes, uint32_t seed,
                        uint32_t stream)
{
  unsigned char *p = buf;
  uint64_t key = mix64(((uint64_t)seed << 32) | stream);
  size_t i = 0;
  for (; i + 8 <= nbytes; i += 8) {
    uint64_t v = mix64(key ^ (i / 8));
    memcpy(p + i, &v, 8);
  }
  if (i < nbytes) {
    uint64_t v = mix64(key ^ (i / 8));
    memcpy(p + i, &v, nbytes - i);
  }
}

int harness_check_bytes(const void *got, const void *expected, size_t nbytes,
                        char *msg, size_t msglen)
{
  if (nbytes == 0 || memcmp(got, expected, nbytes) == 0) return 0;
  const unsigned char *g = got, *e = expected;
  size_t i = 0;
  while (g[i] == e[i]) i++;
  size_t j = nbytes;
  while (g[j - 1] == e[j - 1]) j--;
  snprintf(msg, msglen,
           "bytes differ in [%zu, %zu) of %zu: first got 0x%02x expected 0x%02x",
           i, j, nbytes, g[i], e[i]);
  return 1;
}

uint64_t harness_hash(const void *buf, size_t nbytes)
{
  const unsigned char *p = buf;
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t i = 0; i < nbytes; i++) {
    h ^= p[i];
    h *= UINT64_C(0x100000001b3);
  }
  return h;
}

int harness_same_on_all_ranks(ncclComm_t comm, const void *buf,
                              size_t nbytes)
{
  int n = 0;
  if (ncclCommCount(comm, &n) != ncclSuccess || n < 1) return -1;
  uint64_t mine = harness_hash(buf, nbytes);
  uint64_t *all = calloc((size_t)n, sizeof(*all));
  if (all == NULL) return -1;
  ncclResult_t r = ncclAllGather(&mine, all, 1, ncclUint64, comm, NULL);
  int res = 0;
  if (r != ncclSuccess) {
    res = -1;
  } else {
    for (int i = 0; i < n; i++)
      if (all[i] != mine) res = 1;
  }
  free(all);
  return res;
}
