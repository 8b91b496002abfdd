/* Socket helpers and interface selection. */
#include "config.h"
#include "comm/transport/socket.h"
#include "comm/base/param.h"
#include "geoccl.h"
#include "tests/helpers/harness.h"
#include "comm/transport/ifaces.h"
#include "comm/core/comm.h"
#include "comm/transport/net_tcp_tune.h"

#include <CUnit/Basic.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <netinet/tcp.h>
#include <linux/inet_diag.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_addr_parse(void)
{
    geoSockAddr a;
    char buf[GEO_ADDR_STRLEN];
    CU_ASSERT_EQUAL(geoAddrFromString("127.0.0.1:1234", &a), ncclSuccess);
    CU_ASSERT_STRING_EQUAL(geoAddrToString(&a, buf), "127.0.0.1:1234");
    CU_ASSERT_EQUAL(geoAddrFromString("[::1]:5", &a), ncclSuccess);
    CU_ASSERT_STRING_EQUAL(geoAddrToString(&a, buf), "[::1]:5");
    CU_ASSERT_EQUAL(geoAddrFromString("localhost:80", &a), ncclSuccess);
    CU_ASSERT_EQUAL(geoAddrPort(&a), 80);
    CU_ASSERT_EQUAL(geoAddrFromString("no-port", &a), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geoAddrFromString("[::1", &a), ncclInvalidArgument);
    CU_ASSERT_EQUAL(geoAddrFromString(NULL, &a), ncclInvalidArgument);
}

static void test_send_recv_and_timeout(void)
{
    geoSockAddr any, bound, peer;
    int lfd, cfd, sfd;
    const char *why = NULL;
    char big[1 << 20], got[1 << 20];

    geoAddrFromString("127.0.0.1:0", &any);
    CU_ASSERT_EQUAL_FATAL(geoSocketListen(&any, &lfd, &bound), ncclSuccess);
    CU_ASSERT_NOT_EQUAL(geoAddrPort(&bound), 0);
    CU_ASSERT_EQUAL_FATAL(geoSocketConnect(&bound, geoNow() + 5, &cfd), ncclSuccess);
    CU_ASSERT_EQUAL_FATAL(geoSocketAccept(lfd, geoNow() + 5, NULL, &sfd, &peer), ncclSuccess);
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)(i * 31);
    /* 1 MiB does not fit the socket buffers: needs both sides moving. */
    pthread_t t;
    struct { int fd; char *buf; size_t n; } arg = {sfd, got, sizeof(got)};
    void *(*rx)(void *) = NULL;
    (void)rx;
    CU_ASSERT_EQUAL(geoSocketSetNonBlocking(cfd, 1), 0);
    pid_t child = fork();
    if (child == 0) {
        const char *w;
        _exit(geoSocketRecvAll(arg.fd, arg.buf, arg.n, geoNow() + 10, &w) == ncclSuccess &&
                      memcmp(arg.buf, big, arg.n) == 0
                  ? 0
                  : 1);
    }
    (void)t;
    CU_ASSERT_EQUAL(geoSocketSendAll(cfd, big, sizeof(big), geoNow() + 10, &why), ncclSuccess);
    int st;
    waitpid(child, &st, 0);
    CU_ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    /* Nothing more is coming: the receive gives up at its deadline. */
    double t0 = geoNow();
    char one;
    CU_ASSERT_EQUAL(geoSocketRecvAll(sfd, &one, 1, geoNow() + 0.3, &why), ncclRemoteError);
    CU_ASSERT_STRING_EQUAL(why, "timed out");
    CU_ASSERT_TRUE(geoNow() - t0 >= 0.29 && geoNow() - t0 < 2.0);
    /* The peer closes: the receive says so at once. */
    close(cfd);
    CU_ASSERT_EQUAL(geoSocketRecvAll(sfd, &one, 1, geoNow() + 5, &why), ncclRemoteError);
    CU_ASSERT_STRING_EQUAL(why, "connection closed by peer");
    close(sfd);
    close(lfd);
}

static void test_connect_refused_until_deadline(void)
{
    geoSockAddr any, bound;
    int lfd, fd;
    geoAddrFromString("127.0.0.1:0", &any);
    CU_ASSERT_EQUAL_FATAL(geoSocketListen(&any, &lfd, &bound), ncclSuccess);
    close(lfd); /* nobody listens there now */
    double t0 = geoNow();
    CU_ASSERT_EQUAL(geoSocketConnect(&bound, geoNow() + 0.5, &fd), ncclRemoteError);
    CU_ASSERT_TRUE(geoNow() - t0 >= 0.45 && geoNow() - t0 < 3.0);
}

static void test_iface_filter(void)
{
    CU_ASSERT_TRUE(topoIfaceMatch("eth", "eth0"));
    CU_ASSERT_FALSE(topoIfaceMatch("eth", "ib0"));
    CU_ASSERT_TRUE(topoIfaceMatch("ib,eth", "eth1"));
    CU_ASSERT_FALSE(topoIfaceMatch("=eth", "eth0"));
    CU_ASSERT_TRUE(topoIfaceMatch("=eth0", "eth0"));
    CU_ASSERT_FALSE(topoIfaceMatch("^eth", "eth0"));
    CU_ASSERT_TRUE(topoIfaceMatch("^eth", "ib0"));
    CU_ASSERT_TRUE(topoIfaceMatch("^=eth", "eth0"));
    CU_ASSERT_FALSE(topoIfaceMatch(NULL, "lo"));
    CU_ASSERT_FALSE(topoIfaceMatch("", "docker0"));
    CU_ASSERT_TRUE(topoIfaceMatch(NULL, "eth0"));

    topoIface ifs[8];
    CU_ASSERT_TRUE(topoFindIfaces("lo", NULL, ifs, 8) >= 1);
    CU_ASSERT_STRING_EQUAL(ifs[0].name, "lo");
    CU_ASSERT_EQUAL(ifs[0].addr.ss_family, AF_INET); /* IPv4 first */
    /* A root on loopback leads to lo even without a filter. */
    geoSockAddr near;
    geoAddrFromString("127.0.0.1:9", &near);
    CU_ASSERT_TRUE(topoFindIfaces(NULL, &near.sa, ifs, 8) >= 1);
    CU_ASSERT_STRING_EQUAL(ifs[0].name, "lo");
    CU_ASSERT_EQUAL(topoFindIfaces("=no-such-if", NULL, ifs, 8), 0);
}

/* var naming a congestion control the kernel refuses: the check says so,
 * and an init fails with ncclInvalidArgument naming var, before anything
 * is sent. */
static void refused_cc_fails_init(const char *var)
{
    char err[400];
    setenv(var, "no-such-cc", 1);
    geoParamReload();
    CU_ASSERT_EQUAL(geoSocketCheckParams(err, sizeof(err)), -1);
    char want[64];
    snprintf(want, sizeof(want), "%s=no-such-cc", var);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, want));
    /* An env id (GEOCCL_COMM_ID): ncclGetUniqueId starts no bootstrap root
     * in this process, which forks the next tests' ranks and must have no
     * thread then (tests/helpers/harness.c; under AddressSanitizer a child of a
     * process whose other thread held an allocator lock at fork hangs). The
     * port is never listened on: init fails before. */
    ncclUniqueId id;
    ncclComm_t c = NULL;
    setenv("GEOCCL_COMM_ID", "127.0.0.1:9", 1);
    setenv("GEOCCL_COMM_SECRET",
           "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff", 1);
    CU_ASSERT_EQUAL_FATAL(ncclGetUniqueId(&id), ncclSuccess);
    CU_ASSERT_EQUAL(ncclCommInitRank(&c, 1, id, 0), ncclInvalidArgument);
    CU_ASSERT_PTR_NOT_NULL(strstr(ncclGetLastError(NULL), var));
    unsetenv("GEOCCL_COMM_ID");
    unsetenv("GEOCCL_COMM_SECRET");
    unsetenv(var);
    geoParamReload();
}

/* GEOCCL_TCP_CC: listening, connecting and accepted sockets get it (reno is
 * built into every Linux and allowed for any process); a name the kernel
 * refuses is reported before anything is sent, and an init fails with
 * ncclInvalidArgument naming the parameter. */
static void test_tcp_cc(void)
{
    geoSockAddr any, bound, peer;
    int lfd, cfd, sfd;
    char name[32], err[400];
    socklen_t len;

    setenv("GEOCCL_TCP_CC", "reno", 1);
    geoParamReload();
    CU_ASSERT_EQUAL(geoSocketCheckParams(err, sizeof(err)), 0);
    geoAddrFromString("127.0.0.1:0", &any);
    CU_ASSERT_EQUAL_FATAL(geoSocketListen(&any, &lfd, &bound), ncclSuccess);
    CU_ASSERT_EQUAL_FATAL(geoSocketConnect(&bound, geoNow() + 5, &cfd), ncclSuccess);
    CU_ASSERT_EQUAL_FATAL(geoSocketAccept(lfd, geoNow() + 5, NULL, &sfd, &peer), ncclSuccess);
    int fds[3] = {lfd, cfd, sfd};
    for (int i = 0; i < 3; i++) {
        memset(name, 0, sizeof(name));
        len = sizeof(name);
        CU_ASSERT_EQUAL(getsockopt(fds[i], IPPROTO_TCP, TCP_CONGESTION, name, &len), 0);
        CU_ASSERT_STRING_EQUAL(name, "reno");
        close(fds[i]);
    }

    refused_cc_fails_init("GEOCCL_TCP_CC");
}

/* GEOCCL_WAN_CC: once the regions are known, the TCP connections to ranks
 * in other regions, and only those, carry the named congestion control.
 * Three forked ranks on loopback labelled "a a b", TCP only (GEOCCL_SHM=0:
 * the same-host fast path would replace the sockets), two streams per
 * pair. Counted from outside the library: the connected TCP sockets of the
 * process whose TCP_CONGESTION is the name. */
struct wan_cc_arg {
    const char *set;    /* GEOCCL_WAN_CC, NULL: unset */
    const char *name;   /* what the WAN sockets must say, NULL: left alone */
    const char *count;  /* the name counted: name, or one no socket may carry */
    int exact;          /* no other socket may say it */
};

static int count_cc(const char *name)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int type = 0;
        socklen_t tl = sizeof(type);
        char got[32] = "";
        socklen_t gl = sizeof(got);
        if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0 ||
            (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) ||
            getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM)
            continue;
        if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, got, &gl) == 0 && strcmp(got, name) == 0)
            n++;
    }
    return n;
}

static int wan_cc_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    const struct wan_cc_arg *a = arg;
    int fails = 0;
    setenv("GEOCCL_REGION", rank < 2 ? "a" : "b", 1);
    setenv("GEOCCL_SHM", "0", 1);
    setenv("GEOCCL_NSTREAMS", "2", 1);
    if (a->set)
        setenv("GEOCCL_WAN_CC", a->set, 1);
    else
        unsetenv("GEOCCL_WAN_CC");
    geoParamReload();
    ncclComm_t c = NULL;
    ncclResult_t r = ncclCommInitRank(&c, nranks, *id, rank);
    if (r != ncclSuccess) {
        fprintf(stderr, "[rank %d] init: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    /* rank 0 and 1 (region a) each have one peer in region b; rank 2 two */
    int want = a->name ? 2 * (rank < 2 ? 1 : 2) : 0;
    int got = count_cc(a->count);
    if (a->exact ? got != want : got < want) {
        fprintf(stderr, "[rank %d] GEOCCL_WAN_CC=%s: %d connected TCP sockets say %s, want %s%d\n",
                rank, a->set ? a->set : "(unset)", got, a->count, a->exact ? "" : ">= ", want);
        fails++;
    }
    const char *said = NULL;
    if (geocclCommGetWanCongestion(c, &said) != ncclSuccess || said == NULL ||
        strcmp(said, a->name ? a->name : "") != 0) {
        fprintf(stderr, "[rank %d] geocclCommGetWanCongestion says '%s', want '%s'\n", rank,
                said ? said : "(null)", a->name ? a->name : "");
        fails++;
    }
    /* The connections still carry an all-reduce. */
    float v[3] = {1.0f + (float)rank, 2, 3};
    if (ncclAllReduce(v, v, 3, ncclFloat32, ncclSum, c, NULL) != ncclSuccess ||
        v[0] != 6.0f || v[1] != 6.0f || v[2] != 9.0f) {
        fprintf(stderr, "[rank %d] all-reduce after GEOCCL_WAN_CC: %g %g %g\n", rank, v[0], v[1],
                v[2]);
        fails++;
    }
    if (ncclCommDestroy(c) != ncclSuccess)
        fails++;
    return fails;
}

static void host_cc(char *buf, size_t len)
{
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");
    buf[0] = '\0';
    if (f != NULL) {
        if (fgets(buf, (int)len, f) == NULL)
            buf[0] = '\0';
        buf[strcspn(buf, "\n")] = '\0';
        fclose(f);
    }
}

/* Keepalive probes start after GEOCCL_KEEPALIVE idle seconds (60 unset),
 * not the system's two hours; 0 leaves the system's settings; a negative
 * value is refused before anything is sent. */
static int keepidle_of(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), v = -1, on = 0;
    socklen_t len = sizeof(v);
    geoSocketTune(fd);
    getsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &v, &len);
    len = sizeof(on);
    getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, &len);
    close(fd);
    return on ? v : -1;
}

static void test_keepalive(void)
{
    char err[256];
    int sys_idle = -1;
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_keepalive_time", "r");
    if (f != NULL) {
        if (fscanf(f, "%d", &sys_idle) != 1)
            sys_idle = -1;
        fclose(f);
    }
    unsetenv("GEOCCL_KEEPALIVE");
    geoParamReload();
    CU_ASSERT_EQUAL(keepidle_of(), 60);
    setenv("GEOCCL_KEEPALIVE", "7", 1);
    geoParamReload();
    CU_ASSERT_EQUAL(keepidle_of(), 7);
    setenv("GEOCCL_KEEPALIVE", "0", 1);
    geoParamReload();
    if (sys_idle > 0)
        CU_ASSERT_EQUAL(keepidle_of(), sys_idle);
    setenv("GEOCCL_KEEPALIVE", "-1", 1);
    geoParamReload();
    CU_ASSERT_EQUAL(geoSocketCheckParams(err, sizeof(err)), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "GEOCCL_KEEPALIVE=-1"));
    unsetenv("GEOCCL_KEEPALIVE");
    geoParamReload();
    CU_ASSERT_EQUAL(geoSocketCheckParams(err, sizeof(err)), 0);
}

static void test_wan_cc(void)
{
    char host[32], err[400];
    host_cc(host, sizeof(host));
    /* A name nothing else uses here: reno, unless the host runs reno. */
    const char *named = strcmp(host, "reno") == 0 ? "cubic" : "reno";
    struct wan_cc_arg set = {named, named, named, 1};
    CU_ASSERT_EQUAL(harness_run_noinit(3, wan_cc_body, &set, 60), 0);
    /* host: the WAN connections are left alone (none says the name) */
    struct wan_cc_arg keep = {"host", NULL, named, 1};
    CU_ASSERT_EQUAL(harness_run_noinit(3, wan_cc_body, &keep, 60), 0);
    /* The default (auto) on labelled regions of one host has no loss
     * figure (no link to measure): bbr, when this kernel has it; other
     * sockets say bbr too when it is also the host's. */
    if (geoSocketCcAllowed("GEOCCL_WAN_CC", "bbr", err, sizeof(err)) == 0) {
        struct wan_cc_arg def = {NULL, "bbr", "bbr", strcmp(host, "bbr") != 0};
        CU_ASSERT_EQUAL(harness_run_noinit(3, wan_cc_body, &def, 60), 0);
    }
    refused_cc_fails_init("GEOCCL_WAN_CC");
}

/* The TCP transport's geoNetTcpRestartBbr (net_tcp_tune.h): BBR starts again, through
 * another congestion control and back, on the WAN connections to a peer
 * once they are older_than_s, skipping one after max_in_row in a row.
 * Three forked ranks on loopback labelled "a a b", TCP only, two streams,
 * GEOCCL_WAN_CC=bbr; rank 2's connected TCP sockets all go to region a,
 * and a restarted BBR has measured no bandwidth yet (TCP_CC_INFO). */
static int bbr_zero_bw(void)
{
    int n = 0;
    for (int fd = 0; fd < 1024; fd++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        union tcp_cc_info info;
        socklen_t il = sizeof(info);
        char got[32] = "";
        socklen_t gl = sizeof(got);
        if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0 ||
            (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) ||
            getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, got, &gl) != 0 || strcmp(got, "bbr") != 0)
            continue;
        memset(&info, 0, sizeof(info));
        if (getsockopt(fd, IPPROTO_TCP, TCP_CC_INFO, &info, &il) == 0 &&
            info.bbr.bbr_bw_lo == 0 && info.bbr.bbr_bw_hi == 0)
            n++;
    }
    return n;
}

static int allreduce_ok(ncclComm_t c, int rank, int nranks, float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(rank + 1) * (float)(i % 7);
    if (ncclAllReduce(v, v, n, ncclFloat32, ncclSum, c, NULL) != ncclSuccess)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (v[i] != (float)(nranks * (nranks + 1) / 2) * (float)(i % 7))
            return 0;
    return 1;
}

static int restart_bbr_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    (void)arg;
    int fails = 0;
    setenv("GEOCCL_REGION", rank < 2 ? "a" : "b", 1);
    setenv("GEOCCL_SHM", "0", 1);
    setenv("GEOCCL_NSTREAMS", "2", 1);
    setenv("GEOCCL_WAN_CC", "bbr", 1);
    geoParamReload();
    ncclComm_t c = NULL;
    if (ncclCommInitRank(&c, nranks, *id, rank) != ncclSuccess) {
        fprintf(stderr, "[rank %d] init: %s\n", rank, ncclGetLastError(NULL));
        return 1;
    }
    const size_t n = 1 << 20; /* 4 MiB: both streams carry frames */
    float *v = malloc(n * sizeof(float));
    if (v == NULL || !allreduce_ok(c, rank, nranks, v, n)) {
        fprintf(stderr, "[rank %d] all-reduce before the restarts\n", rank);
        free(v);
        ncclCommDestroy(c);
        return 1;
    }
    /* everything acknowledged: no sample reaches a restarted BBR */
    usleep(300000);
    const int zero_before = rank == 2 ? bbr_zero_bw() : 0;
    for (int p = 0; p < nranks; p++) {
        if (p == rank || (p < 2) == (rank < 2))
            continue;
        /* a new connection (its BBR's start not known) restarted whatever
         * older_than_s says; then skipped (its own PROBE_RTT), restarted,
         * skipped */
        int got[4];
        got[0] = geoNetTcpRestartBbr(&c->net, p, 60, 1);
        for (int i = 1; i < 4; i++)
            got[i] = geoNetTcpRestartBbr(&c->net, p, 0, 1);
        int young = geoNetTcpRestartBbr(&c->net, p, 60, 1);
        if (got[0] != 2 || got[1] != 0 || got[2] != 2 || got[3] != 0 || young != 0) {
            fprintf(stderr, "[rank %d] geoNetTcpRestartBbr to rank %d: %d %d %d %d, then %d; "
                    "want 2 0 2 0, then 0\n", rank, p, got[0], got[1], got[2], got[3], young);
            fails++;
        }
    }
    if (geoNetTcpRestartBbr(&c->net, rank, 0, 1) != -1 || geoNetTcpRestartBbr(&c->net, nranks, 0, 1) != -1) {
        fprintf(stderr, "[rank %d] geoNetTcpRestartBbr to itself or past the last rank did not fail\n",
                rank);
        fails++;
    }
    const int zero_after = rank == 2 ? bbr_zero_bw() : 0;
    if (rank == 2 && (zero_after < 4 || zero_before >= zero_after)) {
        fprintf(stderr, "[rank 2] connections with no bandwidth measured: %d before the "
                "restarts, %d after; want 4 or more after, and more than before\n", zero_before,
                zero_after);
        fails++;
    }
    if (count_cc("bbr") < 2 * (rank < 2 ? 1 : 2)) {
        fprintf(stderr, "[rank %d] WAN connections no longer on bbr after the restarts\n", rank);
        fails++;
    }
    if (!allreduce_ok(c, rank, nranks, v, n)) {
        fprintf(stderr, "[rank %d] all-reduce after the restarts\n", rank);
        fails++;
    }
    free(v);
    if (ncclCommDestroy(c) != ncclSuccess)
        fails++;
    return fails;
}

static void test_restart_bbr(void)
{
    char err[400];
    if (geoSocketCcAllowed("GEOCCL_WAN_CC", "bbr", err, sizeof(err)) != 0 ||
        geoSocketCcAllowed("GEOCCL_WAN_CC", "reno", err, sizeof(err)) != 0) {
        printf("\n  (no bbr or reno in this kernel: restartBbr not tested) ");
        return;
    }
    CU_ASSERT_EQUAL(harness_run_noinit(3, restart_bbr_body, NULL, 60), 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("socket", NULL, NULL);
    CU_add_test(s, "address parsing", test_addr_parse);
    CU_add_test(s, "send/recv all, deadline, close", test_send_recv_and_timeout);
    CU_add_test(s, "connect retries until deadline", test_connect_refused_until_deadline);
    CU_add_test(s, "interface filter and choice", test_iface_filter);
    CU_add_test(s, "GEOCCL_TCP_CC on every socket, refused names an error", test_tcp_cc);
    CU_add_test(s, "GEOCCL_WAN_CC on the connections between regions only", test_wan_cc);
    CU_add_test(s, "GEOCCL_KEEPALIVE on every TCP connection", test_keepalive);
    CU_add_test(s, "restartBbr: BBR started again on WAN connections, every so often",
                test_restart_bbr);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
