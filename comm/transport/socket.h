/* Blocking-with-deadline socket helpers for the bootstrap and connection
 * handshakes; the data path uses the same sockets non-blocking (net_tcp_frame.c). */
#ifndef GEOCCL_SOCKET_H_
#define GEOCCL_SOCKET_H_

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

typedef union {
    struct sockaddr sa;
    struct sockaddr_in sin;
    struct sockaddr_in6 sin6;
} geoSockAddr;

#define GEO_ADDR_STRLEN 64

/* Monotonic clock in seconds. */
double geoNow(void);
/* The numeric address alone, "a.b.c.d" or a v6 address ("?" if unknown):
 * what tells nodes apart and what topology files name. */
const char *geoAddrHost(const geoSockAddr *addr, char buf[GEO_ADDR_STRLEN]);
/* "a.b.c.d:port" or "[v6]:port". */
const char *geoAddrToString(const geoSockAddr *addr, char buf[GEO_ADDR_STRLEN]);
/* Parse "host:port" / "[v6]:port" (host may be a name). */
ncclResult_t geoAddrFromString(const char *s, geoSockAddr *out);
socklen_t geoAddrLen(const geoSockAddr *addr);
int geoAddrPort(const geoSockAddr *addr);

/* Listen on addr (port 0: any).  [out] fd, bound (address with its port).
 * A failure is reported (GEO_ERR on the thread). */
ncclResult_t geoSocketListen(const geoSockAddr *addr, int *fd, geoSockAddr *bound);
/* The same without a report: ncclSystemError leaves errno set, for a caller
 * that tries other addresses and reports once when none is left. */
ncclResult_t geoSocketListenQuiet(const geoSockAddr *addr, int *fd, geoSockAddr *bound);
/* Connect, retrying refused or unreachable attempts until deadline (geoNow
 * seconds).  The connected socket is blocking.  [out] fd. */
ncclResult_t geoSocketConnect(const geoSockAddr *addr, double deadline, int *fd);
/* Accept one connection, waiting until deadline or *abort becomes non-zero
 * (abort may be NULL); [out] peer (may be NULL): its address.
 * ncclRemoteError on timeout. */
ncclResult_t geoSocketAccept(int lfd, double deadline, const volatile int *abort, int *fd,
                             geoSockAddr *peer);
/* Send or receive exactly len bytes by deadline.  ncclRemoteError when the
 * peer closes, resets or the deadline passes (errno-style cause in *why). */
ncclResult_t geoSocketSendAll(int fd, const void *buf, size_t len, double deadline,
                              const char **why);
ncclResult_t geoSocketRecvAll(int fd, void *buf, size_t len, double deadline,
                              const char **why);
/* Non-blocking building blocks for set-up loops that drive many sockets
 * with one poll() (net_tcp_setup.c, the bootstrap root).
 *
 * geoSocketConnectStart: start connecting a non-blocking socket to addr.
 * 0: [out] fd is connected or connecting (poll it for POLLOUT, then ask
 * geoSocketConnectResult); -1: failed at once, cause in errno, no fd.
 * geoSocketConnectResult: 0 once the connect succeeded, else its errno.
 * geoSocketRetryable: 1 if a connect that failed with err may succeed on
 * a later attempt (nobody listening yet, network briefly unreachable).
 * geoSocketAcceptNB: on a non-blocking listener lfd, 1: [out] fd
 * (non-blocking) and peer; 0: nothing to accept now; -1: accept failed
 * (errno). */
int geoSocketConnectStart(const geoSockAddr *addr, int *fd);
int geoSocketConnectResult(int fd);
int geoSocketRetryable(int err);
int geoSocketAcceptNB(int lfd, int *fd, geoSockAddr *peer);
/* Move bytes [*done, len) of buf on non-blocking fd (send if send != 0,
 * else receive), advancing *done.  1: all len bytes done; 0: the socket
 * would block; -1: the peer closed or reset (cause in *why). */
int geoSocketStep(int fd, void *buf, size_t len, size_t *done, int send, const char **why);

/* TCP_NODELAY and keepalive on a connected socket (buffer sizes, from
 * GEOCCL_SOCKET_BUFSIZE, are set before connect/listen). */
void geoSocketTune(int fd);
/* 0 when the socket parameters can be applied here (GEOCCL_TCP_CC, and
 * GEOCCL_WAN_CC when the user set it, name a congestion control this
 * process may set); else -1 with why in err. */
int geoSocketCheckParams(char *err, size_t len);
/* 0 when this process may set congestion control cc on a TCP socket; else
 * -1 with why in err (naming the variable var and what is allowed). */
int geoSocketCcAllowed(const char *var, const char *cc, char *err, size_t len);
/* GEOCCL_WAN_CC: the congestion control for connections between regions,
 * or NULL to leave them as the others ("host" or empty). */
const char *geoSocketWanCc(void);
int geoSocketSetNonBlocking(int fd, int on);

#endif
