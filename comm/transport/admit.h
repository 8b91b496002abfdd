/* Admission of connections that have not proved the communicator's secret
 * yet, for every listener of the library (the bootstrap root, a rank's
 * set-up, the resume listener): how many descriptors they may hold, from
 * RLIMIT_NOFILE, and which one gives way when a newer one comes.
 *
 * A stranger costs one descriptor from its connect to its handshake's
 * deadline, and descriptors belong to the whole process: the
 * communicator's own connections and the application's files and sockets
 * come from the same RLIMIT_NOFILE.  So strangers get a share of what is
 * left, never all of it.  They are counted by source group: the source
 * prefix (an attacker owns a /24 or an IPv6 /64 more easily than a single
 * address), or, for a connection from the host of a peer the listener
 * knows, that host's whole address.  When room is needed the loudest group
 * of strangers gives way, and a known peer's connection only when no
 * stranger's is left: a flood, from however few or many prefixes, then
 * replaces itself, not a peer's handshake.  Running out anyway (the
 * application took the rest) drops strangers, never a proven connection,
 * and is never an error by itself. */
#ifndef GEOCCL_ADMIT_H_
#define GEOCCL_ADMIT_H_

#include <stdint.h>

#include "comm/transport/socket.h"

/* Unproven connections may hold 1/GEO_ADMIT_SHARE of the descriptors the
 * process has left once the communicator's own are set aside: the rest is
 * the application's, and that of listeners whose budgets were counted at
 * the same time (the bootstrap root and a rank's set-up in one process, or
 * several communicators starting together: two such take half). */
#define GEO_ADMIT_SHARE 4
/* Whatever is left, a listener may hold this many: below it peers would
 * drop one another's handshakes. */
#define GEO_ADMIT_MIN 16
/* One source group may hold 1/GEO_ADMIT_GROUP_SHARE of a listener's
 * budget: a flood from one prefix leaves the other half to everyone else
 * and only replaces itself; from more, the loudest gives way.  Not less:
 * the peers of one host, or a whole job's ranks in one /24 at the root,
 * connect at once. */
#define GEO_ADMIT_GROUP_SHARE 2
/* Descriptors a communicator keeps beyond its connections: the progress
 * thread's eventfd, a ring's memfd while it is handed over, the probe's
 * and the logger's files. */
#define GEO_ADMIT_SLACK 16
/* Out of descriptors with no stranger to drop: how long a listener leaves
 * its backlog alone before it tries again (peers wait there meanwhile). */
#define GEO_ADMIT_PAUSE_S 0.01

/* Raise this process's soft limit on open files to its hard limit, once
 * per process, saying so at INFO (a failure too).  Any thread. */
void geoAdmitRaiseFdLimit(void);

/* How many unproven connections a listener may hold at once:
 * 1/GEO_ADMIT_SHARE of what RLIMIT_NOFILE leaves once the descriptors open
 * now and `needs` more (the communicator's own, still to come) are set
 * aside, within [GEO_ADMIT_MIN, most].  who names the listener in the INFO
 * line said when the bound is below most.  Any thread. */
int geoAdmitBudget(const char *who, int needs, int most);

/* The per-source-group limit that goes with a listener's budget. */
int geoAdmitPerGroup(int budget);

/* A source group: what the per-source limits count by. */
typedef struct {
    int peer;            /* 1: a known peer's host, by its whole address */
    int family;          /* AF_INET (IPv4-mapped IPv6 too), AF_INET6, or AF_UNSPEC:
                          * any other family (the same-host sockets), one group */
    uint64_t hi, lo;     /* the prefix (/24, /64), or the whole address */
} geoAdmitGroup;

/* The hosts of the peers a listener knows (the communicator's table),
 * sorted for lookups. */
typedef struct {
    geoAdmitGroup *host;
    int n;
} geoAdmitPeers;

/* Know the hosts of addr[0..n).  0, or -1 when out of memory (then none
 * is known: every source is counted by its prefix). */
int geoAdmitPeersInit(geoAdmitPeers *peers, const geoSockAddr *addr, int n);
void geoAdmitPeersFree(geoAdmitPeers *peers);

/* The group of a connection from src: its host's when peers (may be NULL)
 * knows it, else its prefix: the same /24 (IPv4) or /64 (IPv6). */
geoAdmitGroup geoAdmitGroupOf(const geoAdmitPeers *peers, const geoSockAddr *src);
int geoAdmitSameGroup(const geoAdmitGroup *a, const geoAdmitGroup *b);

/* A listener's table as the policy sees it: the group of entry i while it
 * is unproven (it may be dropped), NULL when it has proved the secret, is
 * done or is gone (never dropped for room). */
typedef const geoAdmitGroup *(*geoAdmitGroupFn)(const void *tab, int i);

/* The newcomer gives way (geoAdmitVictim): every entry it could replace is
 * a known peer's. */
#define GEO_ADMIT_REFUSE (-2)

/* Which unproven entry of tab[0..n) gives way so that one more connection,
 * of group `from`, fits within per_group (from its group) and most (in
 * all): one of from's own group when that group is full; else, when the
 * table is, one of the loudest group of strangers (from's own when it
 * would then be the loudest), a known peer's only when no stranger's is
 * left, chosen at random within the group so that a flood cannot aim at a
 * given one.  Returns the entry's index; -1 when none needs to go, or none
 * can (every entry has proved itself); GEO_ADMIT_REFUSE when a stranger
 * finds only peers' entries to replace.  from NULL: the process is out of
 * descriptors and one must go whatever the bounds (a stranger's first). */
int geoAdmitVictim(const void *tab, int n, geoAdmitGroupFn group, const geoAdmitGroup *from,
                   int per_group, int most);

#endif
