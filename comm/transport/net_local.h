/* Same-host peers: who counts as one, and the AF_UNIX sockets that carry
 * their connections instead of TCP (the fast path of the TCP transport, net_tcp_internal.h).
 *
 * Two ranks use the fast path only when all of these hold:
 *   1. the same boot id (/proc/sys/kernel/random/boot_id): the same running
 *      kernel.  The host name proves nothing (network namespaces, containers
 *      and cloned VMs share it);
 *   2. the same network namespace (the device and inode of /proc/self/ns/net).
 *      Ranks in different namespaces of one host are on the same host, but
 *      they talk through whatever links join their namespaces, and those
 *      links may be the point: the emulated regions of tools/geoccl-wan are
 *      namespaces joined by shaped veth pairs, and a fast path between them
 *      would bypass the WAN emulation and make every WAN figure a lie.  So
 *      such ranks keep using TCP, always;
 *   3. the connector can open the listener's socket file (a path in a
 *      private 0700 directory that exists only during init): proof that both
 *      see the same filesystem, not merely the same kernel;
 *   4. both enabled it (GEOCCL_SHM 1, the default, or 2).
 * The socket is only the medium: every connection still runs the HMAC
 * handshake of net_tcp_handshake.c before it carries a byte of data. */
#ifndef GEOCCL_NET_LOCAL_H_
#define GEOCCL_NET_LOCAL_H_

#include <stdint.h>

#define GEO_LOCAL_PATH_LEN 108 /* sizeof(sockaddr_un.sun_path) */
#define GEO_BOOT_ID_LEN 40

/* What a rank publishes at bootstrap about its same-host listener. */
typedef struct {
    char boot_id[GEO_BOOT_ID_LEN]; /* "" when unknown: never the same host */
    uint64_t netns_dev;            /* /proc/self/ns/net */
    uint64_t netns_ino;
    char path[GEO_LOCAL_PATH_LEN]; /* AF_UNIX listener; "" when there is none */
} geoLocalInfo;

/* Fill boot id and network namespace of this process (path left empty).
 * Fields it cannot read stay empty/zero, which matches no peer. */
void geoLocalIdentify(geoLocalInfo *me);
/* Create a private directory and listen on an AF_UNIX stream socket in it,
 * mode 0600.  rank names the file.  0: [out] fd (non-blocking, close-on-exec)
 * and me->path set; -1: cause in errno, nothing left behind. */
int geoLocalListen(int rank, int *fd, geoLocalInfo *me);
/* Remove the socket file and its directory (idempotent; me->path emptied).
 * Peers already connected keep their connections. */
void geoLocalUnlink(geoLocalInfo *me);
/* 1 when peer is reachable on the fast path from me by rules 1, 2 and 4
 * above (rule 3 is the connect itself). */
int geoLocalSamePlace(const geoLocalInfo *me, const geoLocalInfo *peer);
/* Start a non-blocking connect to path.  0: [out] fd connected or
 * connecting (poll POLLOUT, then geoSocketConnectResult); -1: failed at
 * once, cause in errno (EAGAIN: the listener's backlog is full, try again;
 * anything else: the path cannot be reached from here). */
int geoLocalConnectStart(const char *path, int *fd);

#endif
