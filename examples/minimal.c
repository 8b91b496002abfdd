/*
 * minimal.c: the smallest complete GeoCCL program.
 *
 * It sums an array of 1M floats over every rank with ncclAllReduce, checks
 * the answer and prints one line per rank. GeoCCL speaks the NCCL API, so
 * the calls below are the ones a NCCL program makes; the buffers here are
 * ordinary host memory.
 *
 * Two ways to run it:
 *
 *   ./minimal
 *       forks 4 ranks on this machine (over loopback).
 *
 *   GEOCCL_COMM_ID=host:port GEOCCL_COMM_SECRET=s RANK=r NRANKS=n ./minimal
 *       runs one rank of an n-rank job; start it once per rank, on any
 *       machines that can reach host:port, each with the same secret s.
 *       Rank 0 listens on that address, so host must be rank 0's machine.
 *
 * Build: cc -o minimal minimal.c -lgeoccl
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define COUNT (1 << 20) /* floats per rank */

/* Stops with a readable message when an NCCL call fails. ncclGetLastError
 * says what went wrong (which peer, which address, which operation). */
#define CHECK(call)                                                         \
  do {                                                                      \
    ncclResult_t r_ = (call);                                               \
    if (r_ != ncclSuccess) {                                                \
      fprintf(stderr, "%s failed: %s: %s\n", #call, ncclGetErrorString(r_), \
              ncclGetLastError(NULL));                                      \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

/* One rank: join the communicator, all-reduce, check, leave. */
static int run_rank(int rank, int nranks, ncclUniqueId id)
{
  ncclComm_t comm;
  /* Blocks until all nranks ranks have called it with the same id. */
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  float *buf = malloc(COUNT * sizeof(float));
  if (buf == NULL) return 1;
  for (int i = 0; i < COUNT; i++) buf[i] = (float)(rank + 1); /* 1, 2, ... */

  /* In place: sendbuff == recvbuff. The stream argument is for GPU
   * buffers; with host buffers pass NULL and the call returns when the
   * result is in buf. */
  CHECK(ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL));

  /* Every element is now 1 + 2 + ... + nranks. */
  float want = (float)nranks * (float)(nranks + 1) / 2.0f;
  int wrong = 0;
  for (int i = 0; i < COUNT; i++)
    if (buf[i] != want) wrong++;
  printf("rank %d of %d: all-reduce of %d floats %s (value %g, expected %g)\n",
         rank, nranks, COUNT, wrong ? "WRONG" : "ok", (double)buf[0],
         (double)want);
  fflush(stdout);

  free(buf);
  CHECK(ncclCommDestroy(comm));
  return wrong != 0;
}

int main(void)
{
  const char *rank_env = getenv("RANK"), *nranks_env = getenv("NRANKS");

  if (rank_env != NULL && nranks_env != NULL) {
    /* One rank of a job launched by hand or by a script. With
     * GEOCCL_COMM_ID set, ncclGetUniqueId only encodes that address, so
     * every rank computes the same id without any exchange. */
    if (getenv("GEOCCL_COMM_ID") == NULL) {
      fprintf(stderr, "set GEOCCL_COMM_ID=host:port and GEOCCL_COMM_SECRET with RANK and "
                      "NRANKS\n");
      return 2;
    }
    ncclUniqueId id;
    CHECK(ncclGetUniqueId(&id));
    return run_rank(atoi(rank_env), atoi(nranks_env), id);
  }

  /* No launcher: fork 4 ranks, then make the id here and hand it to each
   * through a pipe. The id holds the address of a listener that
   * ncclGetUniqueId starts as a thread of this process, so this process
   * stays alive until the ranks are done; and it forks first, because a
   * child forked while that thread holds a lock (malloc's) could hang. */
  const int nranks = 4;
  setenv("GEOCCL_SOCKET_IFNAME", "lo", 0); /* everything on this machine */
  int pipes[4][2];
  fflush(stdout);
  for (int r = 0; r < nranks; r++) {
    if (pipe(pipes[r]) != 0) {
      perror("pipe");
      return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      ncclUniqueId rid;
      close(pipes[r][1]);
      if (read(pipes[r][0], &rid, sizeof(rid)) != (ssize_t)sizeof(rid)) _exit(1);
      _exit(run_rank(r, nranks, rid));
    }
    close(pipes[r][0]);
  }
  ncclUniqueId id;
  ncclResult_t made = ncclGetUniqueId(&id);
  if (made != ncclSuccess)
    fprintf(stderr, "ncclGetUniqueId: %s: %s\n", ncclGetErrorString(made),
            ncclGetLastError(NULL));
  for (int r = 0; r < nranks; r++) {
    /* A rank whose pipe is closed without an id exits with an error. */
    if (made == ncclSuccess && write(pipes[r][1], &id, sizeof(id)) != (ssize_t)sizeof(id))
      perror("write");
    close(pipes[r][1]);
  }
  int failed = 0;
  for (int r = 0; r < nranks; r++) {
    int status;
    if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failed++;
  }
  return failed != 0;
}
