/* What a stranger, or a peer that lies, can do to a rank: each attack is
 * refused with a clear error and nothing it sent is used.
 *  - a program on the GEOCCL_COMM_ID port before rank 0 (a port squatter)
 *    that answers as the root with a forged table, holding no secret;
 *  - a table whose values are out of bounds (a rank with the secret, or of
 *    another build, joining with a crafted peer info);
 *  - a rank that names another process's pid (ours) for single-copy;
 *  - a communicator over GEOCCL_COMM_ID with no secret (refused unless
 *    GEOCCL_INSECURE_NO_SECRET=1, which warns and never encrypts);
 *  - a relay that rewrites a joining rank's re-join token;
 *  - a process that holds the communicator's secret but is not the rank
 *    (a reader of the store, an excluded rank) that asks to resume a live
 *    connection, or to replace it with a fresh one, and a resume whose
 *    frame count is out of range or below what was acknowledged: each is
 *    refused alone and the live connection goes on untouched;
 * and encryption changes no result: all-reduces are bit-identical with
 * GEOCCL_ENCRYPT=off and =all, over TCP and over same-host rings. */
#define _GNU_SOURCE
#include "config.h"
#include "tests/helpers/harness.h"
#include "comm/base/crypto.h"
#include "comm/base/param.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/bootstrap_internal.h"
#include "comm/core/comm.h"
#include "comm/transport/net_tcp_internal.h"

#include <CUnit/Basic.h>
#include <geoccl.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* A rank of the forged-pid test claims another process's pid: this binary
 * interposes getpid() for the library, as a rank that lies would. */
static volatile pid_t fake_pid;
pid_t getpid(void)
{
    return fake_pid ? fake_pid : (pid_t)syscall(SYS_getpid);
}

static void set_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    geoParamReload();
}

/* ---- a port squatter answers as the root -------------------------------- */

typedef struct {
    int port;
    ncclResult_t res;
    char err[512];
} squatArgs;

static int squat_victim(int rank, int nranks, const ncclUniqueId *unused, void *arg)
{
    squatArgs *a = arg;
    char cid[64];
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    (void)unused;
    snprintf(cid, sizeof(cid), "127.0.0.1:%d", a->port);
    set_env("GEOCCL_COMM_ID", cid);
    set_env("GEOCCL_COMM_SECRET", "correct horse battery staple");
    set_env("GEOCCL_TIMEOUT", "10");
    if (ncclGetUniqueId(&id) != ncclSuccess)
        return 1;
    /* Rank 1: rank 0 never comes; the squatter holds the port. */
    a->res = ncclCommInitRank(&comm, nranks + 1, id, rank + 1);
    snprintf(a->err, sizeof(a->err), "%s", ncclGetLastError(comm));
    if (comm)
        ncclCommDestroy(comm);
    return 0;
}

static void test_port_squatter_root(void)
{
    squatArgs *a = harness_shared_alloc(sizeof(*a));
    geoSockAddr addr, bound;
    int lfd, fd;
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    a->port = harness_free_port();
    char cid[64];
    snprintf(cid, sizeof(cid), "127.0.0.1:%d", a->port);
    CU_ASSERT_EQUAL_FATAL(geoAddrFromString(cid, &addr), ncclSuccess);
    CU_ASSERT_EQUAL_FATAL(geoSocketListen(&addr, &lfd, &bound), ncclSuccess);

    pid_t child = fork();
    if (child == 0) {
        int rc = squat_victim(0, 1, NULL, a);
        _exit(rc);
    }
    /* The squatter: a challenge, the join message (whatever it holds), then
     * a table naming itself at every rank, with a MAC it cannot make. */
    const char *why;
    CU_ASSERT_EQUAL(geoSocketAccept(lfd, geoNow() + 20, NULL, &fd, NULL), ncclSuccess);
    uint8_t challenge[16] = {1, 2, 3}, join[80 + GEO_BOOT_INFO_BYTES];
    CU_ASSERT_EQUAL(geoSocketSendAll(fd, challenge, sizeof(challenge), geoNow() + 5, &why),
                    ncclSuccess);
    CU_ASSERT_EQUAL(geoSocketRecvAll(fd, join, sizeof(join), geoNow() + 5, &why), ncclSuccess);
    size_t tlen = 4 + 2 * GEO_BOOT_INFO_BYTES + GEO_SHA256_BYTES;
    uint8_t *table = calloc(1, tlen);
    uint32_t magic = 0x47454f54u;
    memcpy(table, &magic, 4);
    /* Rank 1's own entry as it sent it; rank 0's: a copy (its addresses
     * would be the squatter's own in a real attack). */
    memcpy(table + 4, join + 80, GEO_BOOT_INFO_BYTES);
    memcpy(table + 4 + GEO_BOOT_INFO_BYTES, join + 80, GEO_BOOT_INFO_BYTES);
    memset(table + tlen - GEO_SHA256_BYTES, 0x5a, GEO_SHA256_BYTES);
    CU_ASSERT_EQUAL(geoSocketSendAll(fd, table, tlen, geoNow() + 5, &why), ncclSuccess);
    free(table);
    int status = -1;
    double t0 = harness_now();
    waitpid(child, &status, 0);
    double took = harness_now() - t0;
    close(fd);
    close(lfd);
    CU_ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CU_ASSERT_EQUAL(a->res, ncclRemoteError);
    CU_ASSERT_PTR_NOT_NULL(strstr(a->err, "does not prove the communicator's secret"));
    /* Refused on the table itself, not after a timeout. */
    CU_ASSERT_TRUE(took < 5.0 * harness_time_scale());
    if (a->res != ncclRemoteError || strstr(a->err, "does not prove") == NULL)
        fprintf(stderr, "    victim: %s: %s\n", ncclGetErrorString(a->res), a->err);
    harness_shared_free(a, sizeof(*a));
}

/* ---- a table with values out of bounds -------------------------------- */

typedef struct {
    int32_t nstreams;
    int64_t chunk;
    ncclResult_t res[3];
    char err[3][400];
} tableArgs;

static int table_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    tableArgs *a = arg;
    ncclComm_t comm = NULL;
    set_env("GEOCCL_TIMEOUT", "10");
    set_env("GEOCCL_PROBE", "0");
    if (rank == 0) {
        /* Rank 0 holds the secret but sends values of its own choosing. */
        geoUniqueIdInternal in;
        geoErr err;
        geoPeerInfo info;
        geoBootInfo mine, *all = calloc((size_t)nranks, sizeof(*all));
        geoErrInit(&err);
        geoBootstrapDecode(id, &in);
        memset(&info, 0, sizeof(info));
        info.nstreams = a->nstreams;
        info.chunk_size = a->chunk;
        info.net.addr.sin.sin_family = AF_INET;
        memcpy(mine.bytes, &info, sizeof(info));
        geoBootSelf self = {.rank = 0, .nranks = nranks, .timeout = 10, .err = &err};
        a->res[0] = geoBootstrapJoin(&self, &in, &mine, all);
        free(all);
        geoErrDestroy(&err);
        return 0;
    }
    a->res[rank] = ncclCommInitRank(&comm, nranks, *id, rank);
    snprintf(a->err[rank], sizeof(a->err[rank]), "%s", ncclGetLastError(comm));
    if (comm)
        ncclCommDestroy(comm);
    return 0;
}

static void check_table(int32_t nstreams, int64_t chunk, const char *expect)
{
    tableArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    a->nstreams = nstreams;
    a->chunk = chunk;
    CU_ASSERT_EQUAL(harness_run_noinit(3, table_body, a, 60), 0);
    CU_ASSERT_EQUAL(a->res[0], ncclSuccess); /* the table went out */
    for (int r = 1; r < 3; r++) {
        CU_ASSERT_EQUAL(a->res[r], ncclRemoteError);
        CU_ASSERT_PTR_NOT_NULL(strstr(a->err[r], expect));
        if (strstr(a->err[r], expect) == NULL)
            fprintf(stderr, "    rank %d: %s\n", r, a->err[r]);
    }
    harness_shared_free(a, sizeof(*a));
}

static void test_table_values_clamped(void)
{
    check_table(100000, 512 << 10, "asks for 100000 streams per peer pair");
    check_table(0, 512 << 10, "asks for 0 streams per peer pair");
    check_table(2, 0, "asks for chunks of 0 bytes");
}

/* ---- a rank names our pid for single-copy ------------------------------- */

typedef struct {
    volatile pid_t pid0;
    int forge;
    int cma[2];
    int wrong;
} pidArgs;

static int pid_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    pidArgs *a = arg;
    ncclComm_t comm = NULL;
    set_env("GEOCCL_PROBE", "0");
    if (rank == 0)
        a->pid0 = getpid();
    if (rank == 1 && a->forge) {
        double t0 = harness_now();
        while (a->pid0 == 0 && harness_now() - t0 < 20)
            usleep(1000);
        fake_pid = a->pid0; /* from now on this rank says it is rank 0's process */
    }
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    a->cma[rank] = comm->cma;
    /* The all-reduce is right either way. */
    size_t n = 1 << 18;
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rank + 1) * (float)(i % 1000);
    if (ncclAllReduce(x, x, n, ncclFloat, ncclSum, comm, NULL) != ncclSuccess)
        a->wrong++;
    for (size_t i = 0; i < n; i++)
        if (x[i] != 3.0f * (float)(i % 1000)) {
            a->wrong++;
            break;
        }
    free(x);
    fake_pid = 0;
    ncclCommDestroy(comm);
    return 0;
}

static void test_forged_pid_refused(void)
{
    pidArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    /* Control: honest ranks of one host use single-copy. */
    CU_ASSERT_EQUAL(harness_run_noinit(2, pid_body, a, 60), 0);
    CU_ASSERT_EQUAL(a->cma[0], 1);
    CU_ASSERT_EQUAL(a->cma[1], 1);
    memset(a, 0, sizeof(*a));
    a->forge = 1;
    CU_ASSERT_EQUAL(harness_run_noinit(2, pid_body, a, 60), 0);
    CU_ASSERT_EQUAL(a->cma[0], 0);
    CU_ASSERT_EQUAL(a->cma[1], 0);
    CU_ASSERT_EQUAL(a->wrong, 0);
    harness_shared_free(a, sizeof(*a));
}

/* ---- GEOCCL_COMM_ID without a secret ------------------------------------ */

/* Without GEOCCL_COMM_SECRET every key follows from the address: a stranger
 * could join as a rank (and did, in a review: it set rank 0's all-reduce
 * result).  Such an id is refused, on one host and with encryption off
 * too, unless GEOCCL_INSECURE_NO_SECRET=1, which runs (on one host, with a
 * WARN) but refuses to pretend to encrypt; no message recommends turning
 * encryption off. */

typedef struct {
    int port;
    const char *encrypt, *insecure;
    ncclResult_t id_res[2], res[2];
    char err[2][700];
    int warned[2];
} envArgs;

static int env_body(int rank, int nranks, const ncclUniqueId *unused, void *arg)
{
    envArgs *a = arg;
    char cid[64], logname[64];
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    (void)unused;
    snprintf(cid, sizeof(cid), "127.0.0.1:%d", a->port);
    set_env("GEOCCL_COMM_ID", cid);
    set_env("GEOCCL_COMM_SECRET", NULL);
    set_env("GEOCCL_INSECURE_NO_SECRET", a->insecure);
    set_env("GEOCCL_ENCRYPT", a->encrypt);
    set_env("GEOCCL_PROBE", "0");
    set_env("GEOCCL_TIMEOUT", "20");
    /* What the library logs at WARN goes to a file of this rank's. */
    snprintf(logname, sizeof(logname), "/tmp/geoccl-nosecret-%d.log", (int)getpid());
    fflush(stderr);
    int saved = dup(2);
    FILE *log = fopen(logname, "w+");
    if (log == NULL || saved < 0)
        return 1;
    dup2(fileno(log), 2);
    a->id_res[rank] = ncclGetUniqueId(&id);
    if (a->id_res[rank] != ncclSuccess) {
        snprintf(a->err[rank], sizeof(a->err[rank]), "%s", ncclGetLastError(NULL));
    } else {
        a->res[rank] = ncclCommInitRank(&comm, nranks, id, rank);
        snprintf(a->err[rank], sizeof(a->err[rank]), "%s", ncclGetLastError(comm));
        if (comm)
            ncclCommDestroy(comm);
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char line[1024];
    rewind(log);
    while (fgets(line, sizeof(line), log))
        if (strstr(line, "WARN") && strstr(line, "GEOCCL_INSECURE_NO_SECRET=1"))
            a->warned[rank] = 1;
    fclose(log);
    unlink(logname);
    return 0;
}

static void run_env(envArgs *a, const char *encrypt, const char *insecure)
{
    harness_opts o = {.timeout_s = 60, .make_id = 0};
    memset(a, 0, sizeof(*a));
    a->port = harness_free_port();
    a->encrypt = encrypt;
    a->insecure = insecure;
    CU_ASSERT_EQUAL(harness_run_opts(2, env_body, a, &o), 0);
}

static void test_no_secret_refused(void)
{
    envArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    /* One host, encryption off: nothing to encrypt, and still refused, at
     * the id already (before anything listens or joins). */
    const char *modes[] = {"off", "wan", "all"};
    for (int m = 0; m < 3; m++) {
        run_env(a, modes[m], NULL);
        for (int r = 0; r < 2; r++) {
            CU_ASSERT_EQUAL(a->id_res[r], ncclInvalidArgument);
            CU_ASSERT_PTR_NOT_NULL(strstr(a->err[r], "GEOCCL_COMM_SECRET is not"));
            CU_ASSERT_PTR_NOT_NULL(strstr(a->err[r], "GEOCCL_INSECURE_NO_SECRET=1"));
            CU_ASSERT_PTR_NULL(strstr(a->err[r], "GEOCCL_ENCRYPT=off"));
            if (a->id_res[r] != ncclInvalidArgument)
                fprintf(stderr, "    GEOCCL_ENCRYPT=%s, rank %d: %s: %s\n", modes[m], r,
                        ncclGetErrorString(a->id_res[r]), a->err[r]);
        }
    }
    /* Neither is a value the opt-out does not know. */
    run_env(a, "off", "yes");
    CU_ASSERT_EQUAL(a->id_res[0], ncclInvalidArgument);
    CU_ASSERT_PTR_NOT_NULL(strstr(a->err[0], "GEOCCL_INSECURE_NO_SECRET=yes"));
    harness_shared_free(a, sizeof(*a));
}

static void test_no_secret_opt_out(void)
{
    envArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    /* The opt-out on one host runs, each rank saying at WARN what it gives up. */
    run_env(a, "wan", "1");
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(a->id_res[r], ncclSuccess);
        CU_ASSERT_EQUAL(a->res[r], ncclSuccess);
        CU_ASSERT_TRUE(a->warned[r]);
        if (a->res[r] != ncclSuccess)
            fprintf(stderr, "    rank %d: %s: %s\n", r, ncclGetErrorString(a->res[r]),
                    a->err[r]);
    }
    /* Asked to encrypt under keys anyone can derive: refused, with the way
     * out that protects (a secret), not the one that does not. */
    run_env(a, "all", "1");
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(a->res[r], ncclInvalidArgument);
        CU_ASSERT_PTR_NOT_NULL(strstr(a->err[r], "Set GEOCCL_COMM_SECRET"));
        CU_ASSERT_PTR_NULL(strstr(a->err[r], "GEOCCL_ENCRYPT=off"));
    }
    harness_shared_free(a, sizeof(*a));
}

/* ---- the re-join token is under the join MAC ---------------------------- */

/* A relay on the path to the root passes everything through but changes
 * one byte of the joining rank's re-join token.  Had the root taken it,
 * the rank's own re-join after a reset would be refused as another
 * process's claim on its place; the token is under the proof, so the root
 * refuses the altered join itself and keeps nothing of it. */

typedef struct {
    int lfd;
    geoSockAddr root;
    int rewrote;
} relayArgs;

static void *token_relay(void *arg)
{
    relayArgs *r = arg;
    int in = -1, out = -1;
    const char *why;
    uint8_t challenge[GEO_CHALLENGE_BYTES];
    geoJoinMsg m;
    if (geoSocketAccept(r->lfd, geoNow() + 10, NULL, &in, NULL) != ncclSuccess ||
        geoSocketConnect(&r->root, geoNow() + 10, &out) != ncclSuccess)
        goto done;
    if (geoSocketRecvAll(out, challenge, sizeof(challenge), geoNow() + 10, &why) != ncclSuccess ||
        geoSocketSendAll(in, challenge, sizeof(challenge), geoNow() + 10, &why) != ncclSuccess ||
        geoSocketRecvAll(in, &m, sizeof(m), geoNow() + 10, &why) != ncclSuccess)
        goto done;
    m.token[0] ^= 0x80;
    r->rewrote = 1;
    if (geoSocketSendAll(out, &m, sizeof(m), geoNow() + 10, &why) != ncclSuccess)
        goto done;
    /* Then both ways as they come, until either end closes. */
    for (double end = geoNow() + 10; geoNow() < end;) {
        struct pollfd p[2] = {{.fd = in, .events = POLLIN}, {.fd = out, .events = POLLIN}};
        char buf[4096];
        if (poll(p, 2, 100) <= 0)
            continue;
        int from = p[0].revents ? in : out, to = from == in ? out : in;
        ssize_t n = read(from, buf, sizeof(buf));
        if (n <= 0 || geoSocketSendAll(to, buf, (size_t)n, geoNow() + 5, &why) != ncclSuccess)
            break;
    }
done:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return NULL;
}

typedef struct {
    ncclResult_t res;
    int rewrote;
    char err[600];
} tokenArgs;

static int token_body(int rank, int nranks, const ncclUniqueId *unused, void *arg)
{
    tokenArgs *t = arg;
    ncclUniqueId uid;
    geoUniqueIdInternal id;
    relayArgs r = {.lfd = -1};
    geoSockAddr any;
    geoErr err;
    geoBootInfo mine, all;
    pthread_t th;
    (void)rank;
    (void)nranks;
    (void)unused;
    set_env("GEOCCL_TIMEOUT", "10");
    /* The root (a thread of this process, which exits at the end). */
    if (ncclGetUniqueId(&uid) != ncclSuccess || geoBootstrapDecode(&uid, &id) != ncclSuccess)
        return 1;
    r.root = id.root;
    if (geoAddrFromString("127.0.0.1:0", &any) != ncclSuccess ||
        geoSocketListen(&any, &r.lfd, &id.root) != ncclSuccess)
        return 1;
    pthread_create(&th, NULL, token_relay, &r);
    geoErrInit(&err);
    memset(&mine, 0, sizeof(mine));
    strcpy((char *)mine.bytes, "rank 0, through the relay");
    geoBootSelf self = {.rank = 0, .nranks = 1, .timeout = 10, .err = &err};
    t->res = geoBootstrapJoin(&self, &id, &mine, &all);
    snprintf(t->err, sizeof(t->err), "%s", geoErrLast(&err));
    pthread_join(th, NULL);
    t->rewrote = r.rewrote;
    close(r.lfd);
    geoErrDestroy(&err);
    return 0;
}

static void test_token_under_mac(void)
{
    tokenArgs *t = harness_shared_alloc(sizeof(*t));
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_EQUAL(harness_run_noinit(1, token_body, t, 60), 0);
    CU_ASSERT_TRUE(t->rewrote);
    CU_ASSERT_EQUAL(t->res, ncclRemoteError);
    CU_ASSERT_PTR_NOT_NULL(strstr(t->err, "refused rank 0"));
    if (t->res != ncclRemoteError)
        fprintf(stderr, "    the root took a join whose token was rewritten: %s %s\n",
                ncclGetErrorString(t->res), t->err);
    harness_shared_free(t, sizeof(*t));
}

/* ---- encryption changes no result --------------------------------------- */

#define BIT_RANKS 4

typedef struct {
    const char *encrypt, *shm;
    uint8_t digest[BIT_RANKS][GEO_SHA256_BYTES];
    int cipher[BIT_RANKS];
} bitArgs;

static int bit_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    bitArgs *a = arg;
    ncclComm_t comm = NULL;
    set_env("GEOCCL_ENCRYPT", a->encrypt);
    set_env("GEOCCL_SHM", a->shm);
    set_env("GEOCCL_PROBE", "0");
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    /* Floats whose sum depends on the order of additions: any change in
     * what arrives, or in how it is split, shows in the digest. */
    size_t n = (3u << 20) / 4 + 123;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    uint32_t s = 12345u + 977u * (uint32_t)rank;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)(int32_t)s * 1e-7f;
    }
    int bad = ncclAllReduce(x, y, n, ncclFloat, ncclSum, comm, NULL) != ncclSuccess;
    bad |= ncclBroadcast(y, x, n, ncclFloat, 1, comm, NULL) != ncclSuccess;
    geoSha256(x, n * sizeof(float), a->digest[rank]);
    a->cipher[rank] = comm->net.ctx.cipher_used;
    free(x);
    free(y);
    ncclCommDestroy(comm);
    return bad;
}

static void test_encryption_bit_identical(void)
{
    bitArgs *a = harness_shared_alloc(3 * sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    a[0] = (bitArgs){.encrypt = "off", .shm = "1"};
    a[1] = (bitArgs){.encrypt = "all", .shm = "1"};
    a[2] = (bitArgs){.encrypt = "all", .shm = "0"};
    for (int k = 0; k < 3; k++)
        CU_ASSERT_EQUAL(harness_run_noinit(BIT_RANKS, bit_body, &a[k], 120), 0);
    for (int r = 0; r < BIT_RANKS; r++) {
        CU_ASSERT_EQUAL(a[0].cipher[r], 0);
        CU_ASSERT_NOT_EQUAL(a[1].cipher[r], 0);
        CU_ASSERT_NOT_EQUAL(a[2].cipher[r], 0);
        CU_ASSERT_EQUAL(memcmp(a[0].digest[r], a[0].digest[0], GEO_SHA256_BYTES), 0);
        CU_ASSERT_EQUAL(memcmp(a[1].digest[r], a[0].digest[r], GEO_SHA256_BYTES), 0);
        CU_ASSERT_EQUAL(memcmp(a[2].digest[r], a[0].digest[r], GEO_SHA256_BYTES), 0);
    }
    harness_shared_free(a, 3 * sizeof(*a));
}

/* ---- resume takeover by a holder of the communicator's secret ----------- */

/* Ranks 0 and 1 run a 2-rank communicator over TCP; a third process, the
 * attacker, knows what a reader of the store knows (the communicator's
 * secret, its hash, rank 0's address) and speaks the handshake as rank 1
 * would on stream 0 (net_tcp_internal.h):
 *   fresh:    right after init, a fresh hello for the slot (as a rank that
 *             lost our ack dials again);
 *   resume:   after traffic, a resume hello with a plausible count;
 *   huge:     a resume hello claiming 2^40 frames;
 * and, holding rank 1's resumption secret of that connection too (taken
 * from its memory: what a corrupt rank 1 would send):
 *   above:    a resume claiming one frame more than rank 0 sent;
 *   below:    a resume claiming one frame fewer than rank 1 acknowledged.
 * Each must be refused (rank 0 closes it without its ack), and the
 * all-reduces after them must be exact, with no reconnect on either rank. */
enum { TK_FRESH, TK_RESUME, TK_HUGE, TK_ABOVE, TK_BELOW, TK_N };
static const char *const tk_name[TK_N] = {"fresh", "resume", "huge", "above", "below"};
/* Why rank 0 refuses them: fresh; resume and huge; above and below. */
static const char *const tk_reason[3] = {"a fresh connection for one that is up",
                                         "does not prove the connection's resumption secret",
                                         "its resume claims"};

typedef struct {
    const char *encrypt;
    volatile int ready, traffic[2], phase;
    uint8_t secret[GEO_SHA256_BYTES];
    uint64_t comm_hash;
    geoSockAddr addr0;
    int enc;
    uint8_t rsecret[GEO_SHA256_BYTES], claim[GEO_CHALLENGE_BYTES]; /* rank 1's, stream 0 */
    uint64_t s_count, a_got; /* rank 0's, toward rank 1 on stream 0 */
    int taken[TK_N];         /* 1: rank 0 acknowledged it; 0: refused; -1: no answer */
    int wrong[2];
    uint64_t reconnects[2];
    int logged[3];           /* refusals in rank 0's log, by reason (tk_reason) */
} takeArgs;

static int tk_wait(volatile int *flag, int value)
{
    double t0 = harness_now();
    while (*flag < value) {
        if (harness_now() - t0 > 60 * harness_time_scale())
            return -1;
        usleep(1000);
    }
    return 0;
}

/* The handshake's MAC (net_tcp_handshake.c, hello_mac), as a peer makes it. */
static void tk_mac(const uint8_t *key, uint64_t comm_hash, const char *label,
                   const uint8_t *challenge, const tcpHello *m, const uint8_t *claim,
                   uint8_t out[GEO_SHA256_BYTES])
{
    enum { F = 32, C = F + 24, N = C + 16, K = N + 2 * GEO_CHALLENGE_BYTES,
           L = K + 2 * GEO_X25519_BYTES };
    uint8_t msg[L + GEO_CHALLENGE_BYTES];
    int32_t f[6] = {m->rank, m->to, m->stream, m->encrypt, m->cipher, m->resume};
    uint64_t counts[2] = {m->count, 0};
    memset(msg, 0, sizeof(msg));
    memcpy(msg, label, strlen(label));
    memcpy(msg + 24, &comm_hash, 8);
    memcpy(msg + F, f, sizeof(f));
    memcpy(msg + C, counts, sizeof(counts));
    memcpy(msg + N, challenge, GEO_CHALLENGE_BYTES);
    memcpy(msg + N + GEO_CHALLENGE_BYTES, m->nonce, GEO_CHALLENGE_BYTES);
    memcpy(msg + K, m->pub, GEO_X25519_BYTES);
    if (claim != NULL)
        memcpy(msg + L, claim, GEO_CHALLENGE_BYTES);
    geoHmacSha256(key, GEO_SHA256_BYTES, msg, claim != NULL ? sizeof(msg) : L, out);
}

/* The hello's second proof (tcpHello.cproof): a fresh hello's under the
 * communicator's secret, with a claim of the attacker's own; a resume's
 * under rank 1's resumption secret when the attacker holds it, else none. */
static void tk_second_proof(const takeArgs *a, const uint8_t *challenge, tcpHello *m,
                            int with_rsecret)
{
    if (!m->resume) {
        geoRandomBytes(m->claim, sizeof(m->claim));
        tk_mac(a->secret, a->comm_hash, "geoccl/v2/claim", challenge, m, m->claim, m->cproof);
    } else if (with_rsecret) {
        memcpy(m->claim, a->claim, sizeof(m->claim));
        tk_mac(a->rsecret, a->comm_hash, "geoccl/v2/resume", challenge, m, m->claim,
               m->cproof);
    }
}

/* Rank 1 hands out its resumption secret of the connection (a corrupt
 * rank 1 would use it itself). */
static void tk_publish_rsecret(takeArgs *a, const tcpConn *c)
{
    memcpy(a->rsecret, c->resume_secret, sizeof(a->rsecret));
    memcpy(a->claim, c->claim, sizeof(a->claim));
}

/* One hello as rank 1, stream 0, to rank 0; with_rsecret: with rank 1's
 * resumption secret.  1 if rank 0 acknowledged it, 0 if it closed it, -1
 * if there was no handshake. */
static int tk_hello(const takeArgs *a, int resume, uint64_t count, int with_rsecret)
{
    uint8_t challenge[GEO_CHALLENGE_BYTES];
    const char *why;
    tcpHello m;
    tcpAccept ack;
    void *eph = NULL;
    int fd, taken = -1;
    if (geoSocketConnect(&a->addr0, geoNow() + 10, &fd) != ncclSuccess)
        return -1;
    if (geoSocketRecvAll(fd, challenge, sizeof(challenge), geoNow() + 10, &why) != ncclSuccess)
        goto out;
    memset(&m, 0, sizeof(m));
    m.magic = GEO_HELLO_MAGIC;
    m.rank = 1;
    m.to = 0;
    m.stream = 0;
    m.encrypt = a->enc;
    m.cipher = GEO_CIPHER_CHACHA20POLY1305;
    m.resume = resume;
    m.count = count;
    if (geoRandomBytes(m.nonce, sizeof(m.nonce)) != 0 || geoX25519New(&eph, m.pub) != 0)
        goto out;
    tk_mac(a->secret, a->comm_hash, "geoccl/v2/hello", challenge, &m, NULL, m.proof);
    tk_second_proof(a, challenge, &m, with_rsecret);
    if (geoSocketSendAll(fd, &m, sizeof(m), geoNow() + 10, &why) != ncclSuccess)
        goto out;
    taken = geoSocketRecvAll(fd, &ack, sizeof(ack), geoNow() + 10, &why) == ncclSuccess;
out:
    geoX25519Free(eph);
    close(fd);
    return taken;
}

static int tk_attacker(takeArgs *a)
{
    if (tk_wait(&a->ready, 1) != 0)
        return 1;
    a->taken[TK_FRESH] = tk_hello(a, 0, 0, 0);
    a->phase = 1;
    if (tk_wait(&a->traffic[0], 1) != 0 || tk_wait(&a->traffic[1], 1) != 0)
        return 1;
    a->taken[TK_RESUME] = tk_hello(a, 1, a->s_count, 0);
    a->taken[TK_HUGE] = tk_hello(a, 1, (uint64_t)1 << 40, 0);
    a->taken[TK_ABOVE] = tk_hello(a, 1, a->s_count + 1, 1);
    a->taken[TK_BELOW] = tk_hello(a, 1, a->a_got - 1, 1);
    a->phase = 2;
    return 0;
}

/* Three exact all-reduces; the count of wrong ones. */
static int tk_allreduces(ncclComm_t comm, int rank)
{
    size_t n = 1 << 20;
    float *x = malloc(n * sizeof(float));
    int wrong = 0;
    for (int it = 0; it < 3; it++) {
        for (size_t i = 0; i < n; i++)
            x[i] = (float)((rank + 1) * (int)(i % 1000) + it);
        if (ncclAllReduce(x, x, n, ncclFloat, ncclSum, comm, NULL) != ncclSuccess) {
            wrong++;
            continue;
        }
        for (size_t i = 0; i < n; i++)
            if (x[i] != (float)(3 * (int)(i % 1000) + 2 * it)) {
                wrong++;
                break;
            }
    }
    free(x);
    return wrong;
}

static int take_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    takeArgs *a = arg;
    ncclComm_t comm = NULL;
    char logpath[64] = "";
    int saved = -1;
    (void)nranks;
    set_env("GEOCCL_ENCRYPT", a->encrypt);
    set_env("GEOCCL_SHM", "0"); /* TCP: the connections that resume */
    set_env("GEOCCL_PROBE", "0");
    set_env("GEOCCL_TIMEOUT", "20");
    set_env("GEOCCL_RECONNECT_TIMEOUT", "5");
    if (rank == 2)
        return tk_attacker(a);
    if (rank == 0) { /* rank 0's warnings, to count the refusals */
        snprintf(logpath, sizeof(logpath), "/tmp/geoccl-take-%d.log", (int)getpid());
        int fd = open(logpath, O_CREAT | O_TRUNC | O_RDWR, 0600);
        saved = dup(2);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
    }
    int bad = ncclCommInitRank(&comm, 2, *id, rank) != ncclSuccess;
    tcpState *st = bad ? NULL : comm->net.state;
    if (rank == 0 && !bad) {
        geoNetCtx *ctx = &comm->net.ctx;
        memcpy(a->secret, ctx->secret, GEO_SHA256_BYTES);
        a->comm_hash = ctx->comm_hash;
        a->addr0 = ctx->peers[0].addr;
        a->enc = ctx->encrypt != NULL && ctx->encrypt[1];
        a->ready = 1;
    }
    if (!bad && tk_wait(&a->phase, 1) == 0) {
        a->wrong[rank] = tk_allreduces(comm, rank);
        /* Let every frame be acknowledged, so that counts are exact. */
        double t0 = harness_now();
        for (int done = 0; !done && harness_now() - t0 < 10;) {
            pthread_mutex_lock(&st->lock);
            tcpConn *c = &st->peers[1 - rank].conns[0];
            done = c->a_got == c->s_count && c->r_count == c->a_sent;
            if (rank == 0) {
                a->s_count = c->s_count;
                a->a_got = c->a_got;
            } else {
                tk_publish_rsecret(a, c);
            }
            pthread_mutex_unlock(&st->lock);
            usleep(1000);
        }
        a->traffic[rank] = 1;
        if (tk_wait(&a->phase, 2) == 0)
            a->wrong[rank] += tk_allreduces(comm, rank);
        else
            bad = 1;
        geocclCommGetReconnects(comm, -1, &a->reconnects[rank], NULL);
    } else {
        bad = 1;
    }
    if (comm)
        ncclCommDestroy(comm);
    if (rank == 0 && saved >= 0) {
        fflush(stderr);
        dup2(saved, 2);
        close(saved);
        FILE *f = fopen(logpath, "r");
        char line[1024];
        while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
            for (int k = 0; k < 3 && strstr(line, "dropped connection from") != NULL; k++)
                a->logged[k] += strstr(line, tk_reason[k]) != NULL;
            if (strstr(line, "[geoccl] WARN") != NULL || strstr(line, "ERROR") != NULL)
                fputs(line, stderr); /* shown with the test's output */
        }
        if (f != NULL)
            fclose(f);
        unlink(logpath);
    }
    return bad;
}

static void check_takeover(const char *encrypt)
{
    takeArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    a->encrypt = encrypt;
    CU_ASSERT_EQUAL(harness_run_noinit(3, take_body, a, 150), 0);
    for (int k = 0; k < TK_N; k++) {
        CU_ASSERT_EQUAL(a->taken[k], 0);
        if (a->taken[k] != 0)
            fprintf(stderr, "    GEOCCL_ENCRYPT=%s, %s: %s\n", encrypt, tk_name[k],
                    a->taken[k] > 0 ? "rank 0 took it" : "no handshake");
    }
    CU_ASSERT_TRUE(a->a_got > 0); /* "below" was below an acknowledged count */
    CU_ASSERT_EQUAL(a->logged[0], 1);
    CU_ASSERT_EQUAL(a->logged[1], 2);
    CU_ASSERT_EQUAL(a->logged[2], 2);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(a->wrong[r], 0);
        CU_ASSERT_EQUAL(a->reconnects[r], 0);
        if (a->wrong[r] != 0 || a->reconnects[r] != 0)
            fprintf(stderr, "    GEOCCL_ENCRYPT=%s, rank %d: %d wrong all-reduces, %llu "
                    "reconnects\n", encrypt, r, a->wrong[r],
                    (unsigned long long)a->reconnects[r]);
    }
    harness_shared_free(a, sizeof(*a));
}

static void test_resume_takeover_refused(void)
{
    check_takeover("all");
    check_takeover("off");
}

int main(void)
{
    harness_setup_env();
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("security", NULL, NULL);
    CU_add_test(s, "a port squatter's forged table is refused", test_port_squatter_root);
    CU_add_test(s, "table values out of bounds are refused", test_table_values_clamped);
    CU_add_test(s, "a rank naming our pid gets no single-copy", test_forged_pid_refused);
    CU_add_test(s, "no secret: refused, whatever GEOCCL_ENCRYPT says", test_no_secret_refused);
    CU_add_test(s, "no secret: the opt-out runs on one host, warns, never pretends to encrypt",
                test_no_secret_opt_out);
    CU_add_test(s, "a relay that rewrites the re-join token is refused", test_token_under_mac);
    CU_add_test(s, "results bit-identical with encryption on and off",
                test_encryption_bit_identical);
    CU_add_test(s, "a holder of the secret cannot take over or break a live connection",
                test_resume_takeover_refused);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
