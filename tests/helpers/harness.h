/*
 * Multi-process test harness for GeoCCL.
 *
 * A test forks one child process per rank. The parent creates the unique id
 * (ncclGetUniqueId starts the bootstrap root listener inside the parent, so
 * the parent stays alive and waits), the children initialise a communicator
 * over loopback, run the test body and exit with the number of failures.
 * The parent waits with a deadline, kills every child on timeout and says
 * which ranks had not finished.
 *
 * The second half of this header makes deterministic input data for every
 * (datatype, reduction op) pair whose reduction over the ranks is exact in
 * every type, including half, bfloat16 and the two fp8 formats, so results
 * can be compared byte for byte with a reference computed here.
 */
#ifndef GEOCCL_TESTS_HARNESS_H
#define GEOCCL_TESTS_HARNESS_H

#include <stddef.h>
#include <stdint.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest nranks the data helpers are designed for (value ranges shrink
 * as nranks grows so that sums and products stay exact). */
#define HARNESS_MAX_RANKS 8

/* ------------------------------------------------------------------------ */
/* Process harness                                                          */
/* ------------------------------------------------------------------------ */

/* Test body run by each rank with an initialised communicator. Returns the
 * number of failures (0 = success). Must print nothing on success; failures
 * go to stderr. */
typedef int (*harness_fn)(int rank, int nranks, ncclComm_t comm, void *arg);

/* Test body for tests that manage communicators themselves. id points to the
 * unique id made by the parent, or is NULL when the parent made none
 * (harness_opts.make_id == 0). */
typedef int (*harness_raw_fn)(int rank, int nranks, const ncclUniqueId *id,
                              void *arg);

/* What happened to one child, filled in by harness_run_opts. */
typedef struct {
  int done;        /* 1 if the child ended by itself before the deadline */
  int exit_code;   /* exit status, or -1 if it did not exit normally */
  int signal;      /* terminating signal, 0 if none */
  double seconds;  /* from fork to reaping */
} harness_status;

typedef struct {
  double timeout_s;       /* deadline for all children, from the first fork */
  int make_id;            /* 1: the parent calls ncclGetUniqueId */
  unsigned expect_die;    /* bit r set: rank r is expected to die or hang;
                             its status is not checked, and it is killed
                             (SIGKILL) once every other rank has ended */
  harness_status *status; /* optional, nranks entries */
} harness_opts;

/* Forks nranks children; each calls ncclCommInitRank(&comm, nranks, id, rank),
 * fn, ncclCommDestroy, and exits with fn's result. Returns 0 only if every
 * child exited 0 before timeout_s; otherwise prints what went wrong per rank
 * and returns the number of ranks that failed. */
int harness_run(int nranks, harness_fn fn, void *arg, double timeout_s);

/* Like harness_run but the child does not initialise anything: fn gets the
 * parent's unique id and manages communicators itself. */
int harness_run_noinit(int nranks, harness_raw_fn fn, void *arg,
                       double timeout_s);

/* The general form of the two above. Returns the number of ranks, outside
 * opts->expect_die, that did not exit 0 in time. */
int harness_run_opts(int nranks, harness_raw_fn fn, void *arg,
                     const harness_opts *opts);

/* Sets GEOCCL_SOCKET_IFNAME=lo unless it is already set. The library reads
 * its parameters once per process, at its first call, and forked children
 * inherit what the parent read: call this first thing in main(), before
 * any library call. (harness_run_opts calls it too, which is only early
 * enough when nothing was called before.) */
void harness_setup_env(void);

/* Seconds on CLOCK_MONOTONIC (the same clock in every process). */
double harness_now(void);
/* GEOCCL_TEST_TIME_SCALE (>= 1; 1 when unset): how much longer everything
 * takes in this build (sanitizers); the harness multiplies its limits by
 * it, and so should a test's own waits that are limits, not targets. */
double harness_time_scale(void);

/* 1 in the thread sanitizer's build (GEOCCL_SANITIZE names "thread"), where
 * the full matrices made test_hier take 209-244 s: there the type x op
 * matrices keep every type with sum and every operation on float32 (about
 * a third of the cases). A race
 * lives in the path a call takes through threads and queues, which the
 * element type's size can change and the operation does not; every pair
 * still runs in the plain build and under address,undefined. */
int harness_race_matrix(void);

/* Whether the matrix keeps type t with op in harness_race_matrix()'s runs. */
int harness_race_keeps(ncclDataType_t t, ncclRedOp_t op);

/* Memory shared between the parent and every child forked afterwards
 * (MAP_SHARED | MAP_ANONYMOUS), zero-filled. Returns NULL on failure. */
void *harness_shared_alloc(size_t bytes);
void harness_shared_free(void *p, size_t bytes);

/* A TCP port on 127.0.0.1 that was free a moment ago (0 on failure). */
int harness_free_port(void);

/* ------------------------------------------------------------------------ */
/* Data types                                                               */
/* ------------------------------------------------------------------------ */

size_t harness_type_size(ncclDataType_t t);        /* 0 for an invalid type */
const char *harness_type_name(ncclDataType_t t);
const char *harness_op_name(ncclRedOp_t op);
int harness_type_is_float(ncclDataType_t t);

/* Conversions between double and the narrow float formats, by bit
 * manipulation, rounding to nearest even. *exact (may be NULL) is set to 1
 * when v was representable without rounding. fp8 e4m3 has no infinity and
 * saturates to NaN; the others overflow to infinity. */
uint16_t harness_double_to_half(double v, int *exact);
uint16_t harness_double_to_bf16(double v, int *exact);
uint8_t harness_double_to_e4m3(double v, int *exact);
uint8_t harness_double_to_e5m2(double v, int *exact);
double harness_half_to_double(uint16_t h);
double harness_bf16_to_double(uint16_t b);
double harness_e4m3_to_double(uint8_t b);
double harness_e5m2_to_double(uint8_t b);

/* Element idx of a buffer of type t as a double (int64/uint64 values beyond
 * 2^53 are rounded; use only for printing or float types). */
double harness_load_double(ncclDataType_t t, const void *buf, size_t idx);

/* ------------------------------------------------------------------------ */
/* Reduction inputs and references                                          */
/* ------------------------------------------------------------------------ */

/* Writes elements [first, first+count) of rank `rank`'s input for a
 * reduction with op over nranks ranks. seed distinguishes test cases. The
 * values are exactly representable, and every partial sum or product over
 * any subset of ranks, in any order, is exact in type t. Max/Min inputs use
 * the whole range of the type (no NaN, no negative zero). */
void harness_fill_input(void *buf, ncclDataType_t t, ncclRedOp_t op,
                        int nranks, int rank, size_t first, size_t count,
                        uint32_t seed);

/* Writes the reference result of reducing the inputs above over all
 * nranks ranks, elements [first, first+count). Avg on integer types is the
 * sum divided by nranks, truncated toward zero (as NCCL does). */
void harness_fill_expected(void *buf, ncclDataType_t t, ncclRedOp_t op,
                           int nranks, size_t first, size_t count,
                           uint32_t seed);

/* 1 when the result of (t, op, nranks) is only defined up to rounding:
 * Avg on floating types when nranks is not a power of two (NCCL
 * pre-multiplies by 1/nranks, which is not exact then). */
int harness_result_is_approx(ncclDataType_t t, ncclRedOp_t op, int nranks);

/* Compares count elements of got with expected. Byte for byte, except for
 * harness_result_is_approx cases where a relative tolerance of a few units
 * in the last place of t is used. Returns 0 if equal; otherwise writes the
 * first mismatch (index, got, expected) into msg and returns 1. */
int harness_check(const void *got, const void *expected, ncclDataType_t t,
                  ncclRedOp_t op, int nranks, size_t count, char *msg,
                  size_t msglen);

/* Fills nbytes with a pattern determined by (seed, stream), for collectives
 * that only move data. */
void harness_fill_bytes(void *buf, size_t nbytes, uint32_t seed,
                        uint32_t stream);

/* Compares nbytes; on mismatch writes the first differing byte offset into
 * msg and returns 1. */
int harness_check_bytes(const void *got, const void *expected, size_t nbytes,
                        char *msg, size_t msglen);

/* FNV-1a 64-bit hash. */
uint64_t harness_hash(const void *buf, size_t nbytes);

/* Checks that buf holds the same bytes on every rank of comm: all-gathers
 * the hash of each rank's buffer. Returns 0 if equal, 1 if they differ, -1
 * if the all-gather itself failed. */
int harness_same_on_all_ranks(ncclComm_t comm, const void *buf,
                              size_t nbytes);

#ifdef __cplusplus
}
#endif

#endif /* GEOCCL_TESTS_HARNESS_H */
