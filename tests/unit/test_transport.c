/* The TCP transport directly: variable-length messages (sizes the receiver
 * does not know), several streams, and a size mismatch between a send and
 * its receive, which must be an error on both sides, never truncation.
 * Connection set-up: many ranks and streams at once, and strangers at the
 * data listeners, who must not delay anyone's init. */
#include "config.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/core/comm.h"
#include "comm/base/param.h"
#include "comm/transport/tcp_info.h"
#include "comm/transport/transport.h"
#include "geoccl.h"
#include "tests/helpers/harness.h"

#include <CUnit/Basic.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

typedef struct {
    ncclUniqueId id;
    int rank;
    int mode; /* 0: variable-length, 1: mismatched sizes */
    int fails;
    ncclResult_t wait_res;
    int local_peers;    /* geocclCommGetLocalPeers after init */
    int ring_peers;     /* of those, through shared-memory rings */
    int socket_left;    /* the same-host socket file still existed after init */
    int switch_to;      /* > 0: after the 5th message, use this many streams */
} targ;

static const size_t sizes[] = {0, 1, 100, 262144, 262145, 3000000, 0, 7};
#define NMSG (sizeof(sizes) / sizeof(sizes[0]))

static void *vlen_rank(void *p)
{
    targ *a = p;
    ncclComm_t c;
    geoNetRequest req[NMSG], fixed[2];
    char *bufs[NMSG], fx[2][64];
    if (ncclCommInitRank(&c, 2, a->id, a->rank) != ncclSuccess) {
        a->fails++;
        return NULL;
    }
    geocclCommGetLocalPeers(c, &a->local_peers);
    a->ring_peers = c->net.ctx.ring_peers;
    const char *path = c->peers[c->rank].net.local.path;
    a->socket_left = path[0] != '\0' && access(path, F_OK) == 0;
    for (size_t i = 0; i < NMSG; i++) {
        bufs[i] = malloc(4000000);
        if (a->rank == 0) {
            for (size_t k = 0; k < sizes[i]; k++)
                bufs[i][k] = (char)(k * 7 + i);
            CU_ASSERT_EQUAL(geoNetIsendV(&c->net, 1, bufs[i], sizes[i], &req[i]), ncclSuccess);
        } else {
            CU_ASSERT_EQUAL(geoNetIrecvV(&c->net, 0, bufs[i], 4000000, &req[i]), ncclSuccess);
        }
        if (i == 3) { /* a fixed-size message in between keeps its place */
            memset(fx[0], 0x5a, sizeof(fx[0]));
            if (a->rank == 0)
                geoNetIsend(&c->net, 1, fx[0], sizeof(fx[0]), &fixed[0]);
            else
                geoNetIrecv(&c->net, 0, fx[1], sizeof(fx[1]), &fixed[0]);
        }
        /* Fewer streams from here on, with messages posted before the
         * switch still in flight on all of them (both ends switch at the
         * same point of their sequence, as the probe does). */
        if (i == 4 && a->switch_to > 0)
            c->net.ops->setStreams(c->net.state, 1 - a->rank, a->switch_to);
    }
    for (size_t i = 0; i < NMSG; i++) {
        if (geoNetWait(&c->net, &req[i]) != ncclSuccess) {
            a->fails++;
            continue;
        }
        if (a->rank == 1) {
            if (req[i].size != sizes[i])
                a->fails++;
            for (size_t k = 0; k < sizes[i]; k++)
                if (bufs[i][k] != (char)(k * 7 + i)) {
                    a->fails++;
                    break;
                }
        }
        free(bufs[i]);
    }
    if (geoNetWait(&c->net, &fixed[0]) != ncclSuccess ||
        (a->rank == 1 && memcmp(fx[1], fx[0], sizeof(fx[0])) != 0 && fx[1][0] != 0x5a))
        a->fails++;
    float x = 1, y = 0;
    if (ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, c, NULL) != ncclSuccess || y != 2)
        a->fails++;
    ncclCommDestroy(c);
    return NULL;
}

static void *mismatch_rank(void *p)
{
    targ *a = p;
    ncclComm_t c;
    geoNetRequest req;
    char buf[1000];
    if (ncclCommInitRank(&c, 2, a->id, a->rank) != ncclSuccess) {
        a->fails++;
        return NULL;
    }
    memset(buf, 1, sizeof(buf));
    if (a->rank == 0)
        geoNetIsend(&c->net, 1, buf, 1000, &req);
    else
        geoNetIrecv(&c->net, 0, buf, 999, &req); /* one byte short */
    a->wait_res = geoNetWait(&c->net, &req);
    if (a->rank == 1 && strstr(ncclGetLastError(c), "does not match") == NULL)
        a->fails++;
    ncclCommAbort(c);
    return NULL;
}

static void run2s(int mode, targ *a, int switch_to)
{
    pthread_t t[2];
    ncclUniqueId id;
    CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&id), ncclSuccess);
    for (int r = 0; r < 2; r++) {
        a[r] = (targ){.id = id, .rank = r, .mode = mode, .switch_to = switch_to};
        pthread_create(&t[r], NULL, mode ? mismatch_rank : vlen_rank, &a[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
}

static void run2(int mode, targ *a)
{
    run2s(mode, a, 0);
}

static void test_vlen_streams(void)
{
    const char *streams[] = {"1", "2", "3"};
    for (int i = 0; i < 3; i++) {
        targ a[2];
        setenv("GEOCCL_NSTREAMS", streams[i], 1);
        geoParamReload();
        run2(0, a);
        CU_ASSERT_EQUAL(a[0].fails + a[1].fails, 0);
    }
    unsetenv("GEOCCL_NSTREAMS");
    geoParamReload();
}

/* A pair told to use fewer of its connections (what the probe does when a
 * link's bandwidth-delay product needs fewer) midway through a sequence of
 * variable-length, multi-frame and fixed messages: over TCP and over the
 * shared-memory rings, 3 connections down to 1 and 2; everything arrives
 * intact and in order, and the all-reduce after it works. */
static void test_fewer_streams(void)
{
    const char *shm[] = {"0", "1"};
    for (int k = 0; k < 2; k++)
        for (int n = 1; n <= 2; n++) {
            targ a[2];
            setenv("GEOCCL_NSTREAMS", "3", 1);
            setenv("GEOCCL_SHM", shm[k], 1);
            geoParamReload();
            run2s(0, a, n);
            CU_ASSERT_EQUAL(a[0].fails + a[1].fails, 0);
        }
    unsetenv("GEOCCL_NSTREAMS");
    unsetenv("GEOCCL_SHM");
    geoParamReload();
}

/* Two ranks of one process share the host and the network namespace: with
 * GEOCCL_SHM=1 (the default) both reach each other over the same-host
 * socket, whose file is gone once init returns, with frames through shared-
 * memory rings; with 2 over the socket alone; with 0 over TCP.  The
 * variable-length (3 MB ones wrap around the 2 MiB rings), fixed and
 * all-reduce traffic of vlen_rank must arrive intact every way. */
static void test_local_fast_path(void)
{
    static const struct {
        const char *shm;
        int local, ring;
    } cases[] = {{"1", 1, 1}, {"2", 1, 0}, {"0", 0, 0}};
    for (int i = 0; i < 3; i++) {
        targ a[2];
        setenv("GEOCCL_SHM", cases[i].shm, 1);
        setenv("GEOCCL_NSTREAMS", "2", 1);
        geoParamReload();
        run2(0, a);
        for (int r = 0; r < 2; r++) {
            CU_ASSERT_EQUAL(a[r].fails, 0);
            CU_ASSERT_EQUAL(a[r].local_peers, cases[i].local);
            CU_ASSERT_EQUAL(a[r].ring_peers, cases[i].ring);
            CU_ASSERT_EQUAL(a[r].socket_left, 0);
        }
    }
    unsetenv("GEOCCL_SHM");
    unsetenv("GEOCCL_NSTREAMS");
    geoParamReload();
}

/* Who counts as the same host: boot id AND network namespace, never the
 * host name; and only when both offer a socket. */
static void test_local_same_place_rule(void)
{
    geoLocalInfo me, peer;
    geoLocalIdentify(&me);
    CU_ASSERT_NOT_EQUAL(me.boot_id[0], '\0');
    CU_ASSERT_NOT_EQUAL(me.netns_ino, 0);
    snprintf(me.path, sizeof(me.path), "/dev/shm/geoccl-test/r0");
    peer = me;
    snprintf(peer.path, sizeof(peer.path), "/dev/shm/geoccl-test/r1");
    CU_ASSERT_EQUAL(geoLocalSamePlace(&me, &peer), 1);
    peer.netns_ino++; /* another namespace of this host: an emulated region */
    CU_ASSERT_EQUAL(geoLocalSamePlace(&me, &peer), 0);
    peer = me;
    peer.boot_id[0] = peer.boot_id[0] == 'a' ? 'b' : 'a'; /* another kernel */
    CU_ASSERT_EQUAL(geoLocalSamePlace(&me, &peer), 0);
    peer = me;
    peer.path[0] = '\0'; /* GEOCCL_SHM=0 there */
    CU_ASSERT_EQUAL(geoLocalSamePlace(&me, &peer), 0);
    CU_ASSERT_EQUAL(geoLocalSamePlace(&peer, &me), 0);
    me.boot_id[0] = '\0'; /* unknown boot id: never the same host */
    peer = me;
    CU_ASSERT_EQUAL(geoLocalSamePlace(&me, &peer), 0);
}

static void test_size_mismatch_is_an_error(void)
{
    targ a[2];
    setenv("GEOCCL_TIMEOUT", "5", 1);
    geoParamReload();
    run2(1, a);
    /* The receiver sees a frame that does not fit; the sender then sees
     * the receiver shut its connections. */
    CU_ASSERT_EQUAL(a[1].wait_res, ncclRemoteError);
    CU_ASSERT_EQUAL(a[1].fails, 0);
    unsetenv("GEOCCL_TIMEOUT");
    geoParamReload();
}

/* ---- connection set-up ---------------------------------------------- */

typedef struct {
    ncclUniqueId id;
    int rank, nranks;
    ncclResult_t res;
    double init_done; /* geoNow() when ncclCommInitRank returned */
    float result;
    char err[1024];   /* the thread's last error when init failed */
} irank;

static void *init_rank(void *p)
{
    irank *a = p;
    ncclComm_t c;
    a->res = ncclCommInitRank(&c, a->nranks, a->id, a->rank);
    a->init_done = geoNow();
    if (a->res != ncclSuccess) {
        snprintf(a->err, sizeof(a->err), "%s", ncclGetLastError(NULL));
        return NULL;
    }
    float v = (float)(a->rank + 1);
    a->res = ncclAllReduce(&v, &a->result, 1, ncclFloat, ncclSum, c, NULL);
    ncclCommDestroy(c);
    return NULL;
}

/* Ports of this process's listening TCP sockets: its socket inodes from
 * /proc/self/fd, matched against the LISTEN rows of /proc/self/net/tcp. */
static int listening_ports(int *ports, int max)
{
    unsigned long inodes[4096];
    int ninodes = 0, n = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    char path[300], link[64], line[512];
    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL && ninodes < 4096) {
        unsigned long ino;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t l = readlink(path, link, sizeof(link) - 1);
        if (l <= 0)
            continue;
        link[l] = 0;
        if (sscanf(link, "socket:[%lu]", &ino) == 1)
            inodes[ninodes++] = ino;
    }
    closedir(d);
    FILE *f = fopen("/proc/self/net/tcp", "r");
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) && n < max) {
        unsigned addr, port, st;
        unsigned long ino;
        if (sscanf(line, " %*d: %x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*u %lu", &addr,
                   &port, &st, &ino) != 4 || st != 0x0a)
            continue;
        for (int i = 0; i < ninodes; i++)
            if (inodes[i] == ino) {
                ports[n++] = (int)port;
                break;
            }
    }
    fclose(f);
    return n;
}

static int port_in(int port, const int *ports, int n)
{
    for (int i = 0; i < n; i++)
        if (ports[i] == port)
            return 1;
    return 0;
}

static int stranger_connect(int port)
{
    geoSockAddr a;
    char s[32];
    int fd = -1;
    snprintf(s, sizeof(s), "127.0.0.1:%d", port);
    if (geoAddrFromString(s, &a) != ncclSuccess ||
        geoSocketConnect(&a, geoNow() + 5, &fd) != ncclSuccess)
        return -1;
    return fd;
}

/* Init of 4 ranks; returns seconds from the start of the last rank to the
 * end of the last init.  With strangers: once ranks 0..2 listen (and
 * before rank 3 joins, so before any rank connects), one stranger at each
 * of their data listeners says nothing, and one sends 10 bytes of garbage
 * (less than a hello) and then nothing. */
static double init4(int strangers, int *fails)
{
    enum { N = 4 };
    irank a[N];
    pthread_t t[N];
    ncclUniqueId id;
    geoUniqueIdInternal in;
    int before[256], now[256], nbefore, nnow = 0, sfd[64], nsfd = 0;

    nbefore = listening_ports(before, 256);
    CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&id), ncclSuccess);
    geoBootstrapDecode(&id, &in);
    for (int r = 0; r < N; r++)
        a[r] = (irank){.id = id, .rank = r, .nranks = N};
    for (int r = 0; r < N - 1; r++)
        pthread_create(&t[r], NULL, init_rank, &a[r]);
    double give_up = geoNow() + 10;
    int ndata = 0;
    while (ndata < N - 1 && geoNow() < give_up) {
        usleep(2000);
        nnow = listening_ports(now, 256);
        ndata = 0;
        for (int i = 0; i < nnow; i++)
            if (!port_in(now[i], before, nbefore) && now[i] != geoAddrPort(&in.root))
                now[ndata++] = now[i];
    }
    CU_ASSERT_EQUAL(ndata, N - 1);
    for (int i = 0; strangers && i < ndata && nsfd + 2 <= 64; i++) {
        int q = stranger_connect(now[i]), g = stranger_connect(now[i]);
        char junk[10];
        memset(junk, 0x42, sizeof(junk));
        if (g >= 0 && send(g, junk, sizeof(junk), MSG_NOSIGNAL) != (ssize_t)sizeof(junk))
            (*fails)++;
        if (q < 0 || g < 0)
            (*fails)++;
        sfd[nsfd++] = q;
        sfd[nsfd++] = g;
    }
    double t0 = geoNow(), end = t0;
    pthread_create(&t[N - 1], NULL, init_rank, &a[N - 1]);
    for (int r = 0; r < N; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < N; r++) {
        if (a[r].res != ncclSuccess || a[r].result != (float)(N * (N + 1) / 2))
            (*fails)++;
        if (a[r].init_done > end)
            end = a[r].init_done;
    }
    for (int i = 0; i < nsfd; i++)
        if (sfd[i] >= 0)
            close(sfd[i]);
    return end - t0;
}

static void test_stranger_at_data_listener(void)
{
    int fails = 0;
    setenv("GEOCCL_PROBE", "0", 1);
    geoParamReload();
    double plain = init4(0, &fails);
    double with = init4(1, &fails);
    printf("\n    init of 4 ranks: %.3f s alone, %.3f s with 2 strangers at each of 3 "
           "data listeners\n", plain, with);
    CU_ASSERT_EQUAL(fails, 0);
    /* Before concurrent set-up each stranger stalled its acceptor for the
     * 5 s handshake limit (at least 10 s here).  Half of one such stall
     * is the bound: the thread-sanitized build beside the whole suite took
     * over 1 s more with the strangers, a stall not of the set-up. */
    CU_ASSERT_TRUE(with - plain < 2.5);
    unsetenv("GEOCCL_PROBE");
    geoParamReload();
}

/* n ranks with the given streams; returns seconds from the first start to
 * the end of the last init. */
static double init_n(int n, const char *streams, int *fails)
{
    irank a[16];
    pthread_t t[16];
    ncclUniqueId id;
    setenv("GEOCCL_NSTREAMS", streams, 1);
    geoParamReload();
    CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&id), ncclSuccess);
    double t0 = geoNow(), end = t0;
    for (int r = 0; r < n; r++) {
        a[r] = (irank){.id = id, .rank = r, .nranks = n};
        pthread_create(&t[r], NULL, init_rank, &a[r]);
    }
    for (int r = 0; r < n; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < n; r++) {
        if (a[r].res != ncclSuccess || a[r].result != (float)(n * (n + 1) / 2))
            (*fails)++;
        if (a[r].init_done > end)
            end = a[r].init_done;
    }
    unsetenv("GEOCCL_NSTREAMS");
    geoParamReload();
    return end - t0;
}

static void test_8_ranks_many_streams(void)
{
    int fails = 0;
    setenv("GEOCCL_PROBE", "0", 1);
    double t2 = init_n(8, "2", &fails);
    double t4 = init_n(8, "4", &fails);
    double t8 = init_n(8, "8", &fails);
    /* Not asserted: a figure to compare before and after a change. */
    printf("\n    init of 8 ranks on loopback: %.3f s with 2 streams, %.3f s with 4, "
           "%.3f s with 8\n", t2, t4, t8);
    CU_ASSERT_EQUAL(fails, 0);
    unsetenv("GEOCCL_PROBE");
    geoParamReload();
}

/* A rank that joins the bootstrap but whose data listener never answers
 * (fake), against a real one: the real rank's init fails within its
 * timeout and the error names the fake's rank, address and stream. */
typedef struct {
    ncclUniqueId id;
    int rank;
    int lfd;
    char addr[GEO_ADDR_STRLEN];
} fakeArgs;

static void *fake_rank(void *p)
{
    fakeArgs *f = p;
    geoUniqueIdInternal in;
    geoErr err;
    geoPeerInfo mine;
    geoBootInfo me, all[2];
    geoSockAddr lo, bound;
    geoBootstrapDecode(&f->id, &in);
    geoAddrFromString("127.0.0.1:0", &lo);
    if (geoSocketListen(&lo, &f->lfd, &bound) != ncclSuccess)
        return NULL;
    geoAddrToString(&bound, f->addr);
    memset(&mine, 0, sizeof(mine));
    mine.net.addr = bound;
    snprintf(mine.net.host, sizeof(mine.net.host), "fake");
    mine.nstreams = 2;
    mine.chunk_size = 512 * 1024;
    geoBootSelf self = {.rank = f->rank, .nranks = 2, .timeout = 10, .err = &err};
    geoErrInit(&err);
    memset(&me, 0, sizeof(me));
    memcpy(me.bytes, &mine, sizeof(mine));
    CU_ASSERT_EQUAL(geoBootstrapJoin(&self, &in, &me, all), ncclSuccess);
    geoErrDestroy(&err);
    return NULL; /* the listener stays open and silent */
}

static void silent_peer(int fake)
{
    fakeArgs f;
    irank a;
    pthread_t t[2];
    CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&f.id), ncclSuccess);
    f.rank = fake;
    f.lfd = -1;
    a = (irank){.id = f.id, .rank = 1 - fake, .nranks = 2};
    double t0 = geoNow();
    pthread_create(&t[0], NULL, fake_rank, &f);
    pthread_create(&t[1], NULL, init_rank, &a);
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    CU_ASSERT_EQUAL(a.res, ncclRemoteError);
    CU_ASSERT_TRUE(a.init_done - t0 < 2 + 1.5);
    const char *err = a.err;
    char want[128];
    snprintf(want, sizeof(want), "rank %d at %s (host fake)", fake, f.addr);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "stream 0"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err, fake == 0 ? "challenge never came" : "to connect"));
    if (f.lfd >= 0)
        close(f.lfd);
}

static void test_silent_peer_named(void)
{
    setenv("GEOCCL_TIMEOUT", "2", 1);
    setenv("GEOCCL_PROBE", "0", 1);
    geoParamReload();
    silent_peer(0); /* we connect to it; its challenge never comes */
    silent_peer(1); /* it never connects to us */
    unsetenv("GEOCCL_TIMEOUT");
    unsetenv("GEOCCL_PROBE");
    geoParamReload();
}

static double now_s(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* The busy time the re-plan reads leaves out the time the receiver's
 * window held the sender (the receiving rank not reading: it is behind,
 * the link is not slow).  The kernel's tcpi_busy_time counts that time
 * too; here a receiver that never reads holds a loopback sender for
 * 400 ms, of which the link was busy a fraction. */
static void test_busy_leaves_out_the_receivers_window(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    int rcv = 4096, l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0);
    CU_ASSERT_FATAL(l >= 0 && c >= 0);
    CU_ASSERT_FATAL(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0);
    CU_ASSERT_FATAL(getsockname(l, (struct sockaddr *)&a, &al) == 0 && listen(l, 1) == 0);
    CU_ASSERT_FATAL(connect(c, (struct sockaddr *)&a, sizeof(a)) == 0);
    int s = accept(l, NULL, NULL);
    CU_ASSERT_FATAL(s >= 0);
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
    fcntl(c, F_SETFL, O_NONBLOCK);
    static char buf[65536];
    double t0 = now_s();
    while (send(c, buf, sizeof(buf), 0) > 0 && now_s() - t0 < 5)
        ;
    usleep(400000);
    geoLinkStats st;
    memset(&st, 0, sizeof(st));
    CU_ASSERT_EQUAL_FATAL(geoTcpInfoAdd(c, &st), 0);
    double held = now_s() - t0;
    printf("\n    held %.3f s, busy read %.3f s", held, st.busy);
    CU_ASSERT(st.busy < 0.6 * held);
    close(s);
    close(c);
    close(l);
}

/* The full time the re-plan reads: how long a connection's socket held
 * data the path had not taken.  Two ranks over TCP on loopback (GEOCCL_SHM
 * 0), 64 MiB from rank 0: where rank 1 posts its receive 400 ms late, the
 * socket is full most of that; where rank 0 sends 64 KiB messages 10 ms
 * apart (its own data coming no faster: a rank forwarding a slower
 * region's), never. */
typedef struct {
    ncclUniqueId id;
    int rank, late;
    double full, took;
    int fails;
} fullArgs;

static void *full_rank(void *p)
{
    fullArgs *a = p;
    ncclComm_t c;
    if (ncclCommInitRank(&c, 2, a->id, a->rank) != ncclSuccess) {
        a->fails++;
        return NULL;
    }
    const size_t big = 64u << 20, small = 64u << 10;
    const int nsmall = 32;
    char *buf = calloc(1, big);
    geoNetRequest req[32];
    geoLinkStats st0, st1;
    memset(&st0, 0, sizeof(st0));
    memset(&st1, 0, sizeof(st1));
    if (a->rank == 0)
        c->net.ops->linkStats(c->net.state, 1, &st0);
    double t0 = now_s();
    if (a->late) {
        if (a->rank == 0) {
            CU_ASSERT_EQUAL(geoNetIsend(&c->net, 1, buf, big, &req[0]), ncclSuccess);
        } else {
            usleep(400000);
            CU_ASSERT_EQUAL(geoNetIrecv(&c->net, 0, buf, big, &req[0]), ncclSuccess);
        }
        if (geoNetWait(&c->net, &req[0]) != ncclSuccess)
            a->fails++;
    } else {
        /* 10 ms apart, times the sanitizer builds' scale: there a
         * receiver on a loaded machine lagged 64 KiB messages 10 ms apart
         * (0.075 s full of 0.366 under the thread sanitizer) */
        const useconds_t gap = (useconds_t)(10000 * harness_time_scale());
        for (int i = 0; i < nsmall; i++) {
            if (a->rank == 0) {
                usleep(gap);
                CU_ASSERT_EQUAL(geoNetIsend(&c->net, 1, buf + i * small, small, &req[i]),
                                ncclSuccess);
            } else {
                CU_ASSERT_EQUAL(geoNetIrecv(&c->net, 0, buf + i * small, small, &req[i]),
                                ncclSuccess);
            }
        }
        for (int i = 0; i < nsmall; i++)
            if (geoNetWait(&c->net, &req[i]) != ncclSuccess)
                a->fails++;
    }
    a->took = now_s() - t0;
    if (a->rank == 0) {
        c->net.ops->linkStats(c->net.state, 1, &st1);
        a->full = st1.full - st0.full;
    }
    free(buf);
    ncclCommDestroy(c);
    return NULL;
}

static void test_full_time(void)
{
    setenv("GEOCCL_SHM", "0", 1);
    setenv("GEOCCL_PROBE", "0", 1);
    geoParamReload();
    for (int late = 1; late >= 0; late--) {
        fullArgs a[2];
        pthread_t t[2];
        CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&a[0].id), ncclSuccess);
        for (int r = 0; r < 2; r++) {
            a[r] = (fullArgs){.id = a[0].id, .rank = r, .late = late};
            pthread_create(&t[r], NULL, full_rank, &a[r]);
        }
        for (int r = 0; r < 2; r++)
            pthread_join(t[r], NULL);
        CU_ASSERT_EQUAL(a[0].fails + a[1].fails, 0);
        printf("\n    %s: full %.3f s of %.3f s", late ? "receiver 400 ms late" : "paced sender",
               a[0].full, a[0].took);
        if (late) {
            /* held at least 400 ms less the few ms to fill the socket
             * (0.56-0.61 s here with the draining after it; a look skipped
             * before the progress thread's poll once read 0.19) */
            CU_ASSERT(a[0].full > 0.35);
        } else {
            CU_ASSERT(a[0].full < 0.1 * a[0].took);
        }
    }
    unsetenv("GEOCCL_SHM");
    unsetenv("GEOCCL_PROBE");
    geoParamReload();
}

int main(void)
{
    setenv("GEOCCL_SOCKET_IFNAME", "lo", 0);
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("transport", NULL, NULL);
    CU_add_test(s, "variable-length messages over 1, 2, 3 streams", test_vlen_streams);
    CU_add_test(s, "a pair switched to fewer streams mid-sequence", test_fewer_streams);
    CU_add_test(s, "send/recv size mismatch is an error", test_size_mismatch_is_an_error);
    CU_add_test(s, "same-host fast path: rings with GEOCCL_SHM=1, sockets with 2, TCP with 0",
                test_local_fast_path);
    CU_add_test(s, "same host means boot id and network namespace",
                test_local_same_place_rule);
    CU_add_test(s, "strangers at data listeners do not delay init",
                test_stranger_at_data_listener);
    CU_add_test(s, "8 ranks with 2, 4 and 8 streams", test_8_ranks_many_streams);
    CU_add_test(s, "a silent peer times out, named", test_silent_peer_named);
    CU_add_test(s, "busy time leaves out the receiver's window",
                test_busy_leaves_out_the_receivers_window);
    CU_add_test(s, "full time: a sender held back, not one whose data comes slowly",
                test_full_time);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
