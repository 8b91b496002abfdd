/* Local network interfaces: which addresses this process may use.  Part of
 * topology/ (the probe will also read NIC rates here); depends on nothing in
 * comm/. */
#ifndef GEOCCL_TOPO_IFACES_H_
#define GEOCCL_TOPO_IFACES_H_

#include <netinet/in.h>
#include <net/if.h>
#include <sys/socket.h>

typedef struct {
    char name[IF_NAMESIZE];
    struct sockaddr_storage addr; /* port 0 */
} topoIface;

/* Does interface `name` pass the filter?  Filter syntax (as NCCL_SOCKET_IFNAME):
 * comma-separated prefixes ("eth,ib"); '=' in front asks exact names; '^' in
 * front excludes the listed ones instead.  NULL or "" passes all but
 * loopback and docker bridges. */
int topoIfaceMatch(const char *filter, const char *name);

/* Up to max usable interfaces, best first: those passing the filter; with
 * no filter, when `near` is given the one whose subnet holds near comes
 * first (so a root on 127.0.0.1 leads to lo), then others, IPv4 before
 * IPv6; loopback only when nothing else exists or the filter asks for it.
 * Returns the count (0: none). */
int topoFindIfaces(const char *filter, const struct sockaddr *near, topoIface *out, int max);

#endif
