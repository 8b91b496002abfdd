/*
 * wan_mark.c: a marked buffer from one region to another, for looking at
 * what crosses the WAN (tests/wan/run_wan_security.sh captures it and tampers
 * with it). One process per rank, two ranks, the NCCL API of include/nccl.h
 * only:
 *
 *   RANK=r NRANKS=2 GEOCCL_COMM_ID=host:port wan_mark [BYTES]
 *   wan_mark --pattern
 *
 * Rank 0 (GEOCCL_COMM_ID is its address) fills BYTES (default 8 MiB; a
 * multiple of 16) with the 16-byte ASCII pattern that --pattern prints and
 * ncclSends it to rank 1, which ncclRecvs it into a zeroed buffer and
 * checks every byte. Then rank 1 ncclSends rank 0 its count of wrong bytes
 * (4 bytes), so that rank 0 does not leave before rank 1 has everything.
 * Buffers are host memory, so every call returns when it is done.
 *
 * Prints "wan_mark rank R: ..." lines. Exit status:
 *   0  rank 1: every byte right (and the count went back); rank 0: both
 *      calls succeeded (its line repeats rank 1's count);
 *   3  rank 1: some bytes were wrong (how many, and the first, are printed);
 *      this wins over a failure of the call after the check;
 *   4  a call returned an error: a line "ERROR <call>: <ncclGetErrorString>",
 *      then "last error: <ncclGetLastError>" (the library's text: the peer,
 *      its address, the operation); the communicator is aborted;
 *   1  setup (environment, memory); 2 usage.
 * Every wait inside the calls is bounded by GEOCCL_TIMEOUT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#define PATTERN "<GEOCCL:MARKED!>" /* 16 bytes, no terminator sent */
#define PATTERN_LEN 16
#define DEFAULT_BYTES ((size_t)8 << 20)

_Static_assert(sizeof(PATTERN) - 1 == PATTERN_LEN, "pattern length");

static int g_rank = -1;
static int g_aborted; /* call_failed aborted the communicator */

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Reports a failed call and gives 4 (after aborting the communicator). */
static int call_failed(const char *what, ncclResult_t r, ncclComm_t comm)
{
  /* The library's own text on a line of its own: whether it names the
   * peer must not depend on what this program says. */
  printf("wan_mark rank %d: ERROR %s: %s\n", g_rank, what, ncclGetErrorString(r));
  printf("wan_mark rank %d: last error: %s\n", g_rank, ncclGetLastError(comm));
  fflush(stdout);
  if (comm != NULL && !g_aborted) {
    ncclCommAbort(comm);
    g_aborted = 1;
  }
  return 4;
}

static int env_int(const char *name, long lo, long hi, long *out)
{
  const char *s = getenv(name);
  char *end;
  if (s == NULL || *s == '\0') {
    fprintf(stderr, "wan_mark: %s is not set\n", name);
    return -1;
  }
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "wan_mark: %s=%s: want an integer in %ld..%ld\n", name, s, lo, hi);
    return -1;
  }
  *out = v;
  return 0;
}

static int sender(ncclComm_t comm, unsigned char *buf, size_t bytes)
{
  for (size_t i = 0; i < bytes; i += PATTERN_LEN)
    memcpy(buf + i, PATTERN, PATTERN_LEN);
  double t0 = now_s();
  ncclResult_t r = ncclSend(buf, bytes, ncclUint8, 1, comm, NULL);
  if (r != ncclSuccess)
    return call_failed("ncclSend of the marked buffer to rank 1", r, comm);
  int32_t wrong = -1;
  r = ncclRecv(&wrong, 1, ncclInt32, 1, comm, NULL);
  if (r != ncclSuccess)
    return call_failed("ncclRecv of rank 1's count of wrong bytes", r, comm);
  printf("wan_mark rank 0: sent %zu bytes of \"%s\" to rank 1 in %.2f s; rank 1 reports %d "
         "wrong\n", bytes, PATTERN, now_s() - t0, (int)wrong);
  return 0;
}

static int receiver(ncclComm_t comm, unsigned char *buf, size_t bytes)
{
  memset(buf, 0, bytes);
  double t0 = now_s();
  ncclResult_t r = ncclRecv(buf, bytes, ncclUint8, 0, comm, NULL);
  if (r != ncclSuccess)
    return call_failed("ncclRecv of the marked buffer from rank 0", r, comm);
  double took = now_s() - t0;
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < bytes; i++)
    if (buf[i] != (unsigned char)PATTERN[i % PATTERN_LEN] && wrong++ == 0)
      first = i;
  if (wrong)
    printf("wan_mark rank 1: received %zu bytes from rank 0 in %.2f s: %zu WRONG (first at "
           "offset %zu: 0x%02x, want 0x%02x)\n", bytes, took, wrong, first, buf[first],
           (unsigned char)PATTERN[first % PATTERN_LEN]);
  else
    printf("wan_mark rank 1: received %zu bytes from rank 0 in %.2f s: all right\n", bytes,
           took);
  fflush(stdout);
  int32_t count = wrong > INT32_MAX ? INT32_MAX : (int32_t)wrong;
  r = ncclSend(&count, 1, ncclInt32, 0, comm, NULL);
  if (r != ncclSuccess) {
    int st = call_failed("ncclSend of the count of wrong bytes to rank 0", r, comm);
    return wrong ? 3 : st;
  }
  return wrong ? 3 : 0;
}

int main(int argc, char **argv)
{
  size_t bytes = DEFAULT_BYTES;
  if (argc == 2 && strcmp(argv[1], "--pattern") == 0) {
    puts(PATTERN);
    return 0;
  }
  if (argc > 2 || (argc == 2 && argv[1][0] == '-')) {
    fprintf(stderr, "usage: RANK=r NRANKS=2 GEOCCL_COMM_ID=host:port wan_mark [BYTES]\n"
                    "       wan_mark --pattern\n");
    return 2;
  }
  if (argc == 2) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(argv[1], &end, 10);
    if (errno || end == argv[1] || *end || v == 0 || v % PATTERN_LEN || v > ((size_t)1 << 31)) {
      fprintf(stderr, "wan_mark: BYTES %s: want a multiple of %d in 16..2^31\n", argv[1],
              PATTERN_LEN);
      return 2;
    }
    bytes = (size_t)v;
  }
  long rank, nranks;
  if (env_int("RANK", 0, 1, &rank) < 0 || env_int("NRANKS", 2, 2, &nranks) < 0)
    return 1;
  g_rank = (int)rank;
  if (getenv("GEOCCL_COMM_ID") == NULL) {
    fprintf(stderr, "wan_mark: GEOCCL_COMM_ID=host:port (rank 0's address) is not set\n");
    return 1;
  }
  unsigned char *buf = malloc(bytes);
  if (buf == NULL) {
    fprintf(stderr, "wan_mark: no memory for %zu bytes\n", bytes);
    return 1;
  }

  /* With GEOCCL_COMM_ID set the id only encodes that address: both ranks
   * compute the same one. */
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    return call_failed("ncclGetUniqueId", r, NULL);
  r = ncclCommInitRank(&comm, (int)nranks, id, g_rank);
  if (r != ncclSuccess)
    return call_failed("ncclCommInitRank", r, NULL);

  int status = g_rank == 0 ? sender(comm, buf, bytes) : receiver(comm, buf, bytes);
  free(buf);
  if (!g_aborted) {
    r = ncclCommDestroy(comm);
    if (r != ncclSuccess && status == 0)
      return call_failed("ncclCommDestroy", r, NULL);
  }
  return status;
}
