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
 *  - strangers holding descriptors, from several source prefixes, at a
 *    rank's set-up listener or bootstrap root under ulimit -n 1024, and
 *    crowding its resume listener while a reset connection resumes;
 * and encryption changes no result: all-reduces are bit-identical with
 * GEOCCL_ENCRYPT=off and =all, over TCP and over same-host rings. */
#define _GNU_SOURCE
#include "config.h"
#include "tests/helpers/harness.h"
#include "tests/helpers/security_helpers.h"
#include "comm/base/crypto.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/bootstrap/bootstrap_internal.h"
#include "comm/core/comm.h"
#include "comm/transport/net_tcp_internal.h"

#include <CUnit/Basic.h>
#include <geoccl.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
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
    sec_set_env("GEOCCL_COMM_ID", cid);
    sec_set_env("GEOCCL_COMM_SECRET", "correct horse battery staple");
    sec_set_env("GEOCCL_TIMEOUT", "10");
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

static void check_table(int32_t nstreams, int64_t chunk, const char *expect)
{
    geoPeerInfo info;
    memset(&info, 0, sizeof(info));
    info.nstreams = nstreams;
    info.chunk_size = chunk;
    info.net.addr.sin.sin_family = AF_INET;
    sec_check_table_refused(&info, "", expect, "");
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
    sec_set_env("GEOCCL_PROBE", "0");
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
    sec_set_env("GEOCCL_COMM_ID", cid);
    sec_set_env("GEOCCL_COMM_SECRET", NULL);
    sec_set_env("GEOCCL_INSECURE_NO_SECRET", a->insecure);
    sec_set_env("GEOCCL_ENCRYPT", a->encrypt);
    sec_set_env("GEOCCL_PROBE", "0");
    sec_set_env("GEOCCL_TIMEOUT", "20");
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
    pthread_t th;
    static const char entry[] = "rank 0, through the relay";
    (void)rank;
    (void)nranks;
    (void)unused;
    sec_set_env("GEOCCL_TIMEOUT", "10");
    /* The root (a thread of this process, which exits at the end). */
    if (sec_get_id(&uid, &id) != ncclSuccess)
        return 1;
    r.root = id.root;
    if (geoAddrFromString("127.0.0.1:0", &any) != ncclSuccess ||
        geoSocketListen(&any, &r.lfd, &id.root) != ncclSuccess)
        return 1;
    pthread_create(&th, NULL, token_relay, &r);
    t->res = sec_bootstrap_join(&id, 0, 1, 10, entry, sizeof(entry), t->err, sizeof(t->err));
    pthread_join(th, NULL);
    t->rewrote = r.rewrote;
    close(r.lfd);
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

/* ---- strangers holding descriptors, against a rank with ulimit -n 1024 --- */

/* 1,100 idle strangers from 5 source prefixes (127.0.1.x .. 127.0.5.x, two
 * addresses each; the ranks' own connections come from 127.0.0.1), each
 * prefix from a process of its own so that none needs more than 220
 * descriptors. */
#define FLOOD_PROCS 5
#define FLOOD_EACH 220
#define FLOOD_RANKS 3
#define FLOOD_FD_LIMIT 1024
/* What the application in the attacked rank asks for, again and again,
 * while it initialises: it must always get it. */
#define FLOOD_APP_FDS 100

typedef struct {
    int at_root;          /* 1: the strangers go to the bootstrap root, which
                           * rank 0 runs (it made the id); 0: to rank 0's
                           * set-up listener */
    const char *shm;
    int port;             /* where the strangers go, once known */
    ncclUniqueId id;      /* at_root: rank 0's id */
    int id_ready;
    int flooders;         /* flood processes done connecting */
    int connected;        /* strangers whose connect completed */
    int done;             /* rank 0 is through: the strangers may go */
    ncclResult_t res[FLOOD_RANKS];
    int wrong[FLOOD_RANKS];
    int redialled[FLOOD_RANKS]; /* a rank logged that it dialled a connection again */
    int app_short;        /* times rank 0's application got fewer than FLOOD_APP_FDS */
    int fdsize;           /* rank 0's descriptor table after init (FDSize) */
    char err[FLOOD_RANKS][400];
} floodArgs;

static int load_int(int *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

/* Wait until *p >= v; 0 when it came within s seconds. */
static int wait_int(int *p, int v, double s)
{
    double until = harness_now() + s * harness_time_scale();
    while (load_int(p) < v) {
        if (harness_now() > until)
            return -1;
        usleep(1000);
    }
    return 0;
}

/* The IPv4 TCP ports this process listens on, from /proc: a rank's
 * listener has a port chosen by the kernel, and this is how a stranger on
 * the host would find it too (a remote one scans). */
static int own_listen_ports(int *ports, int max)
{
    static unsigned long inode[4096];
    int ni = 0, n = 0;
    char line[512];
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL && ni < 4096;) {
        char path[300], link[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t l = readlink(path, link, sizeof(link) - 1);
        if (l > 0) {
            link[l] = '\0';
            if (sscanf(link, "socket:[%lu]", &inode[ni]) == 1)
                ni++;
        }
    }
    closedir(d);
    FILE *f = fopen("/proc/self/net/tcp", "r");
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) != NULL && n < max) {
        unsigned port, state;
        unsigned long ino;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &port,
                   &state, &ino) != 3 || state != 0x0A /* LISTEN */)
            continue;
        for (int i = 0; i < ni; i++)
            if (inode[i] == ino) {
                ports[n++] = (int)port;
                break;
            }
    }
    fclose(f);
    return n;
}

typedef struct {
    floodArgs *a;
    int stop;
    int known[64], nknown;
} rank0Watch;

/* Rank 0's side threads: the listener its init opens, published for the
 * strangers; and its application, which asks for descriptors all along. */
static void *find_listener(void *p)
{
    rank0Watch *w = p;
    while (!load_int(&w->stop)) {
        int ports[64], n = own_listen_ports(ports, 64);
        for (int i = 0; i < n; i++) {
            int old = 0;
            for (int k = 0; k < w->nknown; k++)
                old |= ports[i] == w->known[k];
            if (!old) {
                __atomic_store_n(&w->a->port, ports[i], __ATOMIC_RELEASE);
                return NULL;
            }
        }
        usleep(1000);
    }
    return NULL;
}

static void *application(void *p)
{
    rank0Watch *w = p;
    while (!load_int(&w->stop)) {
        int fds[FLOOD_APP_FDS], n = 0;
        while (n < FLOOD_APP_FDS && (fds[n] = dup(2)) >= 0)
            n++;
        if (n < FLOOD_APP_FDS)
            w->a->app_short++;
        while (n > 0)
            close(fds[--n]);
        usleep(200);
    }
    return NULL;
}

static int fd_table_size(void)
{
    char line[128];
    int size = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f != NULL && fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "FDSize: %d", &size) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return size;
}

/* One stranger process: FLOOD_EACH connections from its prefix, kept open
 * and silent until rank 0 is through. */
static int flood_body(int k, floodArgs *a)
{
    int fds[FLOOD_EACH], n = 0, made = 0;
    struct pollfd pfd[FLOOD_EACH];
    if (wait_int(&a->port, 1, 30) != 0)
        return 1;
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < FLOOD_EACH; i++) {
        struct sockaddr_in from = {.sin_family = AF_INET};
        from.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)(k + 1) << 8 | (uint32_t)(1 + i % 2));
        int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (s < 0)
            break;
        if (bind(s, (struct sockaddr *)&from, sizeof(from)) != 0 ||
            (connect(s, (struct sockaddr *)&to, sizeof(to)) != 0 && errno != EINPROGRESS)) {
            close(s);
            continue;
        }
        pfd[n] = (struct pollfd){.fd = s, .events = POLLOUT};
        fds[n++] = s;
    }
    /* Until every connect has completed (or 5 s). */
    double until = harness_now() + 5;
    for (int left = n; left > 0 && harness_now() < until;) {
        if (poll(pfd, (nfds_t)n, 100) < 0)
            break;
        for (int i = 0; i < n; i++)
            if (pfd[i].fd >= 0 && pfd[i].revents) {
                made += geoSocketConnectResult(pfd[i].fd) != ECONNREFUSED;
                pfd[i].fd = -1;
                left--;
            }
    }
    __atomic_add_fetch(&a->connected, made, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&a->flooders, 1, __ATOMIC_ACQ_REL);
    wait_int(&a->done, 1, 60);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return 0;
}

static int flood_rank_body(int rank, int nranks, const ncclUniqueId *hid, void *arg)
{
    floodArgs *a = arg;
    ncclComm_t comm = NULL;
    ncclUniqueId id;
    char logpath[] = "/tmp/geoccl-flood-XXXXXX";
    int log = -1, saved = -1;
    rank0Watch w = {.a = a};
    pthread_t finder, app;
    (void)nranks;
    if (rank >= FLOOD_RANKS)
        return flood_body(rank - FLOOD_RANKS, a);
    sec_set_env("GEOCCL_SHM", a->shm);
    sec_set_env("GEOCCL_PROBE", "0");
    sec_set_env("GEOCCL_TIMEOUT", "20");
    if (rank == 0) {
        struct rlimit rl = {FLOOD_FD_LIMIT, FLOOD_FD_LIMIT};
        geoUniqueIdInternal in;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0 ||
            (a->at_root && sec_get_id(&id, &in) != ncclSuccess)) {
            __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
            return 1;
        }
        if (a->at_root) {
            a->id = id;
            __atomic_store_n(&a->id_ready, 1, __ATOMIC_RELEASE);
            __atomic_store_n(&a->port, geoAddrPort(&in.root), __ATOMIC_RELEASE);
        } else {
            id = *hid;
            w.nknown = own_listen_ports(w.known, 64); /* inherited ones are not its */
            pthread_create(&finder, NULL, find_listener, &w);
        }
        pthread_create(&app, NULL, application, &w);
        if (a->at_root) /* the strangers hold the root's room before the ranks come */
            wait_int(&a->flooders, FLOOD_PROCS, 30);
    } else {
        /* The ranks come once the strangers are in: at rank 0's set-up
         * listener they wait in its backlog, ahead of the ranks' own. */
        if (wait_int(&a->flooders, FLOOD_PROCS, 30) != 0 || wait_int(&a->id_ready, 1, 30) != 0)
            return 1;
        id = a->at_root ? a->id : *hid;
        sec_set_env("GEOCCL_DEBUG", "INFO");
        fflush(stderr);
        log = mkstemp(logpath);
        saved = dup(2);
        if (log >= 0 && saved >= 0)
            dup2(log, 2);
    }
    a->res[rank] = ncclCommInitRank(&comm, FLOOD_RANKS, id, rank);
    snprintf(a->err[rank], sizeof(a->err[rank]), "%s", ncclGetLastError(comm));
    if (rank == 0) {
        __atomic_store_n(&w.stop, 1, __ATOMIC_RELEASE);
        pthread_join(app, NULL);
        if (!a->at_root)
            pthread_join(finder, NULL);
        a->fdsize = fd_table_size();
    }
    if (a->res[rank] == ncclSuccess) {
        float x[1000];
        for (int i = 0; i < 1000; i++)
            x[i] = (float)((rank + 1) * i);
        if (ncclAllReduce(x, x, 1000, ncclFloat, ncclSum, comm, NULL) != ncclSuccess)
            a->wrong[rank]++;
        for (int i = 0; i < 1000; i++)
            a->wrong[rank] += x[i] != (float)(6 * i);
    }
    if (comm != NULL)
        ncclCommDestroy(comm);
    if (rank == 0)
        __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    if (log >= 0) {
        char line[1024];
        fflush(stderr);
        dup2(saved, 2);
        FILE *f = fdopen(log, "r");
        rewind(f);
        while (fgets(line, sizeof(line), f) != NULL)
            a->redialled[rank] += strstr(line, "dialled again") != NULL;
        fclose(f);
        unlink(logpath);
        close(saved);
    }
    return 0;
}

static void flood_case(int at_root, const char *shm)
{
    /* At the set-up listener the strangers wait in its backlog, which the
     * kernel bounds by net.core.somaxconn. */
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
    int somaxconn = 0;
    if (f != NULL) {
        if (fscanf(f, "%d", &somaxconn) != 1)
            somaxconn = 0;
        fclose(f);
    }
    if (!at_root && somaxconn < FLOOD_PROCS * FLOOD_EACH) {
        printf("\n    skipped: net.core.somaxconn is %d, below the %d strangers\n", somaxconn,
               FLOOD_PROCS * FLOOD_EACH);
        return;
    }
    floodArgs *a = harness_shared_alloc(sizeof(*a));
    harness_opts o = {.timeout_s = 90, .make_id = !at_root};
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    a->at_root = at_root;
    a->shm = shm;
    a->id_ready = !at_root;
    double t0 = harness_now();
    CU_ASSERT_EQUAL(harness_run_opts(FLOOD_RANKS + FLOOD_PROCS, flood_rank_body, a, &o), 0);
    printf("\n    %d idle strangers at rank 0's %s (GEOCCL_SHM=%s, ulimit -n %d): init %s in "
           "%.2f s in all; its application short of %d descriptors %d times; its descriptor "
           "table grew to %d\n", a->connected, at_root ? "bootstrap root" : "set-up listener", shm,
           FLOOD_FD_LIMIT, a->res[0] == ncclSuccess ? "succeeded" : "failed",
           harness_now() - t0, FLOOD_APP_FDS, a->app_short, a->fdsize);
    for (int r = 0; r < FLOOD_RANKS; r++) {
        CU_ASSERT_EQUAL(a->res[r], ncclSuccess);
        CU_ASSERT_EQUAL(a->wrong[r], 0);
        /* No rank's handshake was dropped among the strangers. */
        CU_ASSERT_EQUAL(a->redialled[r], 0);
        if (a->res[r] != ncclSuccess)
            fprintf(stderr, "    rank %d: %s\n", r, a->err[r]);
    }
    /* The strangers got in (else this tests nothing), and never held what
     * the application needs: it always found its descriptors, and the
     * descriptor table (which only grows) stayed within half the limit. */
    CU_ASSERT_TRUE(a->connected > FLOOD_FD_LIMIT);
    CU_ASSERT_EQUAL(a->app_short, 0);
    CU_ASSERT_TRUE(a->fdsize > 0 && a->fdsize <= FLOOD_FD_LIMIT / 2);
    harness_shared_free(a, sizeof(*a));
}

static void test_fd_flood_setup(void)
{
    flood_case(0, "0"); /* the ranks' connections come over TCP, behind the strangers */
    flood_case(0, "1"); /* over the same-host sockets */
}

static void test_fd_flood_root(void)
{
    flood_case(1, "1");
}

/* ---- strangers at the resume listener while a connection resumes -------- */

#define RFLOOD_PROCS 5
#define RFLOOD_EACH 40     /* 200 strangers wanting the 64 resume slots */

typedef struct {
    int port;             /* rank 0's listener, once it is up */
    int flooders;         /* stranger processes churning */
    int done;             /* rank 1 is through: the strangers may go */
    int churned;          /* strangers the listener dropped and that came again */
    int reset;            /* connections rank 1 reset */
    uint64_t reconnects;
    int wrong[2];
    int redialled;        /* rank 1 logged a resume dial dropped and dialled again */
    double took;          /* reset to the next all-reduce's end, on rank 1 */
} rfloodArgs;

/* A connected TCP socket whose peer has reset it: what the library finds
 * when a middlebox resets one of its connections. */
static int reset_socket(void)
{
    geoSockAddr any, bound;
    int l = -1, c = -1, s;
    if (geoAddrFromString("127.0.0.1:0", &any) != ncclSuccess ||
        geoSocketListen(&any, &l, &bound) != ncclSuccess)
        return -1;
    if (geoSocketConnect(&bound, harness_now() + 5, &c) == ncclSuccess &&
        (s = accept(l, NULL, NULL)) >= 0) {
        struct linger lg = {1, 0};
        setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(s);
        struct pollfd p = {.fd = c, .events = POLLIN};
        poll(&p, 1, 1000);
    }
    close(l);
    return c;
}

/* Reset this process's TCP connections to addr, as a middlebox would: the
 * peer gets a reset, and the descriptor the library holds is replaced by a
 * socket that was reset too.  How many were. */
static int reset_connections_to(const geoSockAddr *addr)
{
    int n = 0;
    for (int fd = 3; fd < 1024; fd++) {
        geoSockAddr peer;
        socklen_t len = sizeof(peer);
        int type = 0;
        socklen_t tl = sizeof(type);
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM ||
            getpeername(fd, &peer.sa, &len) != 0 || peer.sa.sa_family != AF_INET ||
            peer.sin.sin_addr.s_addr != addr->sin.sin_addr.s_addr ||
            peer.sin.sin_port != addr->sin.sin_port)
            continue;
        struct linger lg = {1, 0};
        int d = reset_socket();
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        if (d >= 0 && dup2(d, fd) == fd)
            n++;
        if (d >= 0)
            close(d);
    }
    return n;
}

/* Strangers that come again as soon as the listener drops them, each
 * process from a /24 of its own, until rank 1 is through. */
static int rflood_body(int k, rfloodArgs *a)
{
    struct pollfd pfd[RFLOOD_EACH];
    int up = 0, counted = 0;
    if (wait_int(&a->port, 1, 30) != 0)
        return 1;
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)a->port)};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < RFLOOD_EACH; i++)
        pfd[i] = (struct pollfd){.fd = -1};
    double until = harness_now() + 60;
    while (!load_int(&a->done) && harness_now() < until) {
        for (int i = 0; i < RFLOOD_EACH; i++) {
            if (pfd[i].fd >= 0)
                continue;
            struct sockaddr_in from = {.sin_family = AF_INET};
            from.sin_addr.s_addr = htonl(0x7f000000u | (uint32_t)(k + 1) << 8 | 1u);
            int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (s >= 0 && bind(s, (struct sockaddr *)&from, sizeof(from)) == 0 &&
                (connect(s, (struct sockaddr *)&to, sizeof(to)) == 0 || errno == EINPROGRESS)) {
                pfd[i] = (struct pollfd){.fd = s, .events = POLLIN};
                up += counted;
            } else if (s >= 0) {
                close(s);
            }
        }
        if (!counted) {
            counted = 1;
            __atomic_add_fetch(&a->flooders, 1, __ATOMIC_ACQ_REL);
        }
        if (poll(pfd, RFLOOD_EACH, 10) <= 0)
            continue;
        for (int i = 0; i < RFLOOD_EACH; i++) {
            char sink[64];
            if (pfd[i].fd < 0 || pfd[i].revents == 0)
                continue;
            ssize_t r = recv(pfd[i].fd, sink, sizeof(sink), MSG_DONTWAIT); /* the challenge */
            if (r == 0 || (r < 0 && errno != EAGAIN)) {
                close(pfd[i].fd); /* dropped: come again */
                pfd[i].fd = -1;
            }
        }
    }
    __atomic_add_fetch(&a->churned, up, __ATOMIC_ACQ_REL);
    for (int i = 0; i < RFLOOD_EACH; i++)
        if (pfd[i].fd >= 0)
            close(pfd[i].fd);
    return 0;
}

static int rflood_rank_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    rfloodArgs *a = arg;
    ncclComm_t comm = NULL;
    char logpath[] = "/tmp/geoccl-rflood-XXXXXX";
    int log = -1, saved = -1;
    float x[1000];
    if (rank >= 2)
        return rflood_body(rank - 2, a);
    (void)nranks;
    sec_set_env("GEOCCL_SHM", "0"); /* TCP connections: those are the ones resumed */
    sec_set_env("GEOCCL_PROBE", "0");
    sec_set_env("GEOCCL_TIMEOUT", "20");
    if (rank == 1) {
        sec_set_env("GEOCCL_DEBUG", "INFO");
        fflush(stderr);
        log = mkstemp(logpath);
        saved = dup(2);
        if (log >= 0 && saved >= 0)
            dup2(log, 2);
    }
    if (ncclCommInitRank(&comm, 2, *id, rank) != ncclSuccess)
        return 1;
    if (rank == 0)
        __atomic_store_n(&a->port, geoAddrPort(&comm->net.ctx.peers[0].addr), __ATOMIC_RELEASE);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 1000; i++)
            x[i] = (float)((rank + 1) * (i + round));
        double t0 = harness_now();
        if (rank == 1 && round == 1) {
            /* The resume listener is full of strangers and they keep
             * coming: then rank 1's connections to rank 0 are reset, and
             * it dials rank 0 again through them. */
            wait_int(&a->flooders, RFLOOD_PROCS, 30);
            usleep(300000);
            t0 = harness_now();
            a->reset = reset_connections_to(&comm->net.ctx.peers[0].addr);
        }
        if (ncclAllReduce(x, x, 1000, ncclFloat, ncclSum, comm, NULL) != ncclSuccess)
            a->wrong[rank]++;
        for (int i = 0; i < 1000; i++)
            a->wrong[rank] += x[i] != (float)(3 * (i + round));
        if (rank == 1 && round == 1) {
            uint64_t resent = 0;
            a->took = harness_now() - t0;
            /* The all-reduce needed one of the connections; the others
             * resume on their own. */
            double until = harness_now() + 10 * harness_time_scale();
            while (geocclCommGetReconnects(comm, 0, &a->reconnects, &resent) == ncclSuccess &&
                   a->reconnects < (uint64_t)a->reset && harness_now() < until)
                usleep(1000);
        }
    }
    ncclCommDestroy(comm);
    if (rank == 1) {
        __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
        char line[1024];
        fflush(stderr);
        dup2(saved, 2);
        FILE *f = log >= 0 ? fdopen(log, "r") : NULL;
        if (f != NULL) {
            rewind(f);
            while (fgets(line, sizeof(line), f) != NULL)
                a->redialled += strstr(line, "dialled again") != NULL;
            fclose(f);
        }
        unlink(logpath);
        close(saved);
    }
    return 0;
}

static void test_resume_through_strangers(void)
{
    rfloodArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL(harness_run_noinit(2 + RFLOOD_PROCS, rflood_rank_body, a, 90), 0);
    printf("\n    %d connections reset while strangers from %d prefixes (dropped and back %d "
           "times) held the resume listener: %llu resumed, the next all-reduce took %.3f s, "
           "%d resume dials dropped\n", a->reset, RFLOOD_PROCS, a->churned,
           (unsigned long long)a->reconnects, a->took, a->redialled);
    CU_ASSERT_TRUE(a->reset > 0);
    CU_ASSERT_EQUAL(a->wrong[0], 0);
    CU_ASSERT_EQUAL(a->wrong[1], 0);
    CU_ASSERT_TRUE(a->reconnects >= (uint64_t)a->reset);
    /* The listener was crowded (else this tests nothing), and rank 1's
     * dials, from a prefix of their own, were never the ones dropped. */
    CU_ASSERT_TRUE(a->churned > 64);
    CU_ASSERT_EQUAL(a->redialled, 0);
    harness_shared_free(a, sizeof(*a));
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
    sec_set_env("GEOCCL_ENCRYPT", a->encrypt);
    sec_set_env("GEOCCL_SHM", a->shm);
    sec_set_env("GEOCCL_PROBE", "0");
    /* The same algorithm in every run: with GEOCCL_SHM=1 the host segment
     * (comm/intra/hostseg.h) would add in another order than the ring of
     * the GEOCCL_SHM=0 run, whatever encryption does. */
    sec_set_env("GEOCCL_HOST_COLL", "0");
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
    sec_set_env("GEOCCL_ENCRYPT", a->encrypt);
    sec_set_env("GEOCCL_SHM", "0"); /* TCP: the connections that resume */
    sec_set_env("GEOCCL_PROBE", "0");
    sec_set_env("GEOCCL_TIMEOUT", "20");
    sec_set_env("GEOCCL_RECONNECT_TIMEOUT", "5");
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
    CU_add_test(s, "1,100 idle strangers at a rank's set-up listener cost it nothing (ulimit -n "
                "1024)", test_fd_flood_setup);
    CU_add_test(s, "1,100 idle strangers at the bootstrap root cost its rank nothing (ulimit -n "
                "1024)", test_fd_flood_root);
    CU_add_test(s, "a connection resumes through strangers crowding the resume listener",
                test_resume_through_strangers);
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
