#include "config.h"
#include "comm/transport/socket.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double geoNow(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

socklen_t geoAddrLen(const geoSockAddr *addr)
{
    return addr->sa.sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                          : sizeof(struct sockaddr_in);
}

int geoAddrPort(const geoSockAddr *addr)
{
    return ntohs(addr->sa.sa_family == AF_INET6 ? addr->sin6.sin6_port : addr->sin.sin_port);
}

static void host_str(const geoSockAddr *addr, char *buf, size_t len)
{
    const void *a = addr->sa.sa_family == AF_INET6 ? (const void *)&addr->sin6.sin6_addr
                                                   : (const void *)&addr->sin.sin_addr;
    if (inet_ntop(addr->sa.sa_family == AF_INET6 ? AF_INET6 : AF_INET, a, buf,
                  (socklen_t)len) == NULL)
        snprintf(buf, len, "?");
}

const char *geoAddrHost(const geoSockAddr *addr, char buf[GEO_ADDR_STRLEN])
{
    host_str(addr, buf, GEO_ADDR_STRLEN);
    return buf;
}

const char *geoAddrToString(const geoSockAddr *addr, char buf[GEO_ADDR_STRLEN])
{
    char host[INET6_ADDRSTRLEN];
    host_str(addr, host, sizeof(host));
    if (addr->sa.sa_family == AF_INET6)
        snprintf(buf, GEO_ADDR_STRLEN, "[%s]:%d", host, geoAddrPort(addr));
    else
        snprintf(buf, GEO_ADDR_STRLEN, "%s:%d", host, geoAddrPort(addr));
    return buf;
}

ncclResult_t geoAddrFromString(const char *s, geoSockAddr *out)
{
    char host[256];
    const char *port;
    struct addrinfo hints, *res = NULL;
    int rc;

    GEO_RETURN_IF(s == NULL, ncclInvalidArgument, "no address given (NULL)");
    if (s[0] == '[') {
        const char *end = strchr(s, ']');
        GEO_RETURN_IF(end == NULL || end[1] != ':', ncclInvalidArgument,
                      "address '%s' is not [ipv6]:port", s);
        snprintf(host, sizeof(host), "%.*s", (int)(end - s - 1), s + 1);
        port = end + 2;
    } else {
        const char *colon = strrchr(s, ':');
        GEO_RETURN_IF(colon == NULL, ncclInvalidArgument, "address '%s' is not host:port", s);
        snprintf(host, sizeof(host), "%.*s", (int)(colon - s), s);
        port = colon + 1;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = getaddrinfo(host, port, &hints, &res);
    GEO_RETURN_IF(rc != 0 || res == NULL, ncclInvalidArgument, "cannot resolve '%s': %s", s,
                  gai_strerror(rc));
    memset(out, 0, sizeof(*out));
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return ncclSuccess;
}

int geoSocketSetNonBlocking(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

static int64_t read_sysctl(const char *path)
{
    FILE *f = fopen(path, "r");
    long long v = -1;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

/* Fixed buffers must be set before connect/listen, so that the TCP window
 * scale negotiated in the handshake fits them; set afterwards (or clamped
 * by a small *mem_max) they cap the window far below a WAN's
 * bandwidth-delay product.  GEOCCL_SOCKET_BUFSIZE=0 (the default) keeps
 * the kernel's autotuning, which measured best on the emulated WAN. */
static void pre_tune(int fd)
{
    /* Checked at init (geoSocketCheckParams); accepted sockets inherit it
     * from the listener. */
    const char *cc = geoParamStr(GEO_PARAM_TCP_CC);
    if (cc != NULL && cc[0] != '\0')
        setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc));
    int64_t bufsize = geoParamInt(GEO_PARAM_SOCKET_BUFSIZE);
    if (bufsize <= 0)
        return;
    int64_t rmax = read_sysctl("/proc/sys/net/core/rmem_max");
    int64_t wmax = read_sysctl("/proc/sys/net/core/wmem_max");
    int v = (int)bufsize;
    if (wmax >= bufsize)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
    if (rmax >= bufsize)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
    if (wmax < bufsize || rmax < bufsize)
        geoInfo(GEO_LOG_NET, "GEOCCL_SOCKET_BUFSIZE=%lld exceeds net.core.rmem_max/wmem_max "
                "(%lld/%lld): kept the kernel's autotuning for that direction",
                (long long)bufsize, (long long)rmax, (long long)wmax);
}

int geoSocketCcAllowed(const char *var, const char *cc, char *err, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, len, "%s=%s: cannot open a socket to check it: %s", var, cc,
                 strerror(errno));
        return -1;
    }
    int rc = setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, (socklen_t)strlen(cc));
    int e = errno;
    close(fd);
    if (rc == 0)
        return 0;
    char allowed[256] = "";
    FILE *f = fopen("/proc/sys/net/ipv4/tcp_allowed_congestion_control", "r");
    if (f != NULL) {
        if (fgets(allowed, sizeof(allowed), f) == NULL)
            allowed[0] = '\0';
        allowed[strcspn(allowed, "\n")] = '\0';
        fclose(f);
    }
    snprintf(err, len, "%s=%s: the kernel refuses it (%s); allowed here: %s", var, cc,
             strerror(e), allowed[0] ? allowed : "unknown");
    return -1;
}

const char *geoSocketWanCc(void)
{
    const char *cc = geoParamStr(GEO_PARAM_WAN_CC);
    return cc == NULL || cc[0] == '\0' || strcmp(cc, "host") == 0 ? NULL : cc;
}

int geoSocketCheckParams(char *err, size_t len)
{
    const char *cc = geoParamStr(GEO_PARAM_TCP_CC);
    if (cc != NULL && cc[0] != '\0' && geoSocketCcAllowed("GEOCCL_TCP_CC", cc, err, len) != 0)
        return -1;
    /* The default WAN choice may be missing from a kernel: then the WAN
     * connections keep what the others have (topology/wan_cc.c, geoWanCcInit). */
    cc = geoSocketWanCc();
    if (cc != NULL && geoParamIsSet(GEO_PARAM_WAN_CC) && strcmp(cc, "auto") != 0 &&
        geoSocketCcAllowed("GEOCCL_WAN_CC", cc, err, len) != 0)
        return -1;
    int64_t ka = geoParamInt(GEO_PARAM_KEEPALIVE);
    if (ka < 0 || ka > 32767) { /* the kernel's TCP_KEEPIDLE limit */
        snprintf(err, len, "GEOCCL_KEEPALIVE=%lld: must be 0 (the system's settings) or "
                 "1..32767 seconds", (long long)ka);
        return -1;
    }
    int64_t rt = geoParamInt(GEO_PARAM_RECONNECT_TIMEOUT);
    if (rt < 0 || rt > 86400) {
        snprintf(err, len, "GEOCCL_RECONNECT_TIMEOUT=%lld: must be 0 (a reset is an error) or "
                 "1..86400 seconds", (long long)rt);
        return -1;
    }
    int64_t rb = geoParamInt(GEO_PARAM_RESUME_BUFFER);
    if (rb < 0 || rb > ((int64_t)1 << 40)) {
        snprintf(err, len, "GEOCCL_RESUME_BUFFER=%lld: must be 0..1T bytes", (long long)rb);
        return -1;
    }
    return 0;
}

void geoSocketTune(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    /* The system's default idle time (net.ipv4.tcp_keepalive_time, 2 hours)
     * outlives the idle timeouts of NAT gateways and firewalls (minutes):
     * a connection idle between training steps would be forgotten by the
     * middlebox and reset at its next use. */
    int idle = (int)geoParamInt(GEO_PARAM_KEEPALIVE), intvl = 10, cnt = 6;
    if (idle > 0) {
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
        setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    }
}

static ncclResult_t listen_on(const geoSockAddr *addr, int *fd, geoSockAddr *bound, int quiet)
{
    int s, one = 1, err;
    socklen_t len = sizeof(*bound);
    char buf[GEO_ADDR_STRLEN];

    s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return quiet ? ncclSystemError
                     : GEO_ERR(NULL, ncclSystemError, "socket() failed: %s", strerror(errno));
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    pre_tune(s);
    if (bind(s, &addr->sa, geoAddrLen(addr)) != 0 || listen(s, 16384) != 0) {
        err = errno;
        close(s);
        errno = err;
        return quiet ? ncclSystemError
                     : GEO_ERR(NULL, ncclSystemError, "cannot listen on %s: %s",
                               geoAddrToString(addr, buf), strerror(err));
    }
    memset(bound, 0, sizeof(*bound));
    getsockname(s, &bound->sa, &len);
    *fd = s;
    return ncclSuccess;
}

ncclResult_t geoSocketListen(const geoSockAddr *addr, int *fd, geoSockAddr *bound)
{
    return listen_on(addr, fd, bound, 0);
}

ncclResult_t geoSocketListenQuiet(const geoSockAddr *addr, int *fd, geoSockAddr *bound)
{
    return listen_on(addr, fd, bound, 1);
}

ncclResult_t geoSocketConnect(const geoSockAddr *addr, double deadline, int *fd)
{
    char buf[GEO_ADDR_STRLEN];
    int err = 0;
    useconds_t backoff = 1000;

    for (;;) {
        int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        /* Out of descriptors: others in the process may give some back
         * (a listener drops strangers), so that is waited out too. */
        GEO_RETURN_IF(s < 0 && errno != EMFILE && errno != ENFILE, ncclSystemError,
                      "socket() failed: %s", strerror(errno));
        if (s >= 0) {
            pre_tune(s);
            if (connect(s, &addr->sa, geoAddrLen(addr)) == 0) {
                *fd = s;
                return ncclSuccess;
            }
        }
        err = errno;
        if (s >= 0)
            close(s);
        if (!geoSocketRetryable(err) && err != EMFILE && err != ENFILE)
            break;
        if (geoNow() >= deadline)
            break;
        usleep(backoff);
        if (backoff < 100000)
            backoff *= 2;
    }
    return GEO_ERR(NULL, ncclRemoteError, "cannot connect to %s: %s", geoAddrToString(addr, buf),
                   strerror(err));
}

int geoSocketRetryable(int err)
{
    return err == ECONNREFUSED || err == ETIMEDOUT || err == EINTR || err == ENETUNREACH ||
           err == EHOSTUNREACH || err == EAGAIN;
}

int geoSocketConnectStart(const geoSockAddr *addr, int *fd)
{
    int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    pre_tune(s);
    if (connect(s, &addr->sa, geoAddrLen(addr)) == 0 || errno == EINPROGRESS) {
        *fd = s;
        return 0;
    }
    int err = errno;
    close(s);
    errno = err;
    return -1;
}

int geoSocketConnectResult(int fd)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return errno;
    return err;
}

int geoSocketAcceptNB(int lfd, int *fd, geoSockAddr *peer)
{
    for (;;) {
        socklen_t len = sizeof(*peer);
        int s = accept4(lfd, &peer->sa, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (s >= 0) {
            *fd = s;
            return 1;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        /* Connections reset before we took them, or a signal: try the next. */
        if (errno != EINTR && errno != ECONNABORTED && errno != EPROTO)
            return -1;
    }
}

int geoSocketStep(int fd, void *buf, size_t len, size_t *done, int send_, const char **why)
{
    while (*done < len) {
        char *p = (char *)buf + *done;
        ssize_t n = send_ ? send(fd, p, len - *done, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : recv(fd, p, len - *done, MSG_DONTWAIT);
        if (n > 0) {
            *done += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (n < 0 && errno == EINTR)
            continue;
        *why = n == 0 ? "connection closed by peer" : strerror(errno);
        return -1;
    }
    return 1;
}

static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - geoNow();
        struct pollfd p = {.fd = fd, .events = events};
        int ms, rc;
        if (left <= 0)
            return 0;
        ms = left > 0.1 ? 100 : (int)(left * 1000) + 1;
        rc = poll(&p, 1, ms);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

ncclResult_t geoSocketAccept(int lfd, double deadline, const volatile int *abort, int *fd,
                             geoSockAddr *peer)
{
    socklen_t len = sizeof(*peer);
    for (;;) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int rc;
        if (abort && *abort)
            return ncclRemoteError;
        if (geoNow() >= deadline)
            return ncclRemoteError;
        rc = poll(&p, 1, 100);
        GEO_RETURN_IF(rc < 0 && errno != EINTR, ncclSystemError, "poll on listener failed: %s",
                      strerror(errno));
        if (rc <= 0)
            continue;
        len = sizeof(*peer);
        int s = peer ? accept4(lfd, &peer->sa, &len, SOCK_CLOEXEC)
                     : accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (s >= 0) {
            *fd = s;
            return ncclSuccess;
        }
        GEO_RETURN_IF(errno != EINTR && errno != EAGAIN && errno != ECONNABORTED,
                      ncclSystemError, "accept failed: %s", strerror(errno));
    }
}

ncclResult_t geoSocketSendAll(int fd, const void *buf, size_t len, double deadline,
                              const char **why)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int w = wait_fd(fd, POLLOUT, deadline);
            if (w == 0) {
                *why = "timed out";
                return ncclRemoteError;
            }
            continue;
        }
        *why = n == 0 ? "connection closed" : strerror(errno);
        return ncclRemoteError;
    }
    return ncclSuccess;
}

ncclResult_t geoSocketRecvAll(int fd, void *buf, size_t len, double deadline, const char **why)
{
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            int w = wait_fd(fd, POLLIN, deadline);
            if (w == 0) {
                *why = "timed out";
                return ncclRemoteError;
            }
            continue;
        }
        *why = n == 0 ? "connection closed by peer" : strerror(errno);
        return ncclRemoteError;
    }
    return ncclSuccess;
}
