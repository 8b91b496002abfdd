/* Admission of unproven connections (admit.h): the descriptor budget a
 * listener gets from RLIMIT_NOFILE, the source groups connections are
 * counted by, and which unproven connection gives way to a newer one. */
#include "config.h"
#include "comm/transport/admit.h"
#include "comm/base/checks.h"
#include "comm/base/crypto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static void raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    unsigned long long was = (unsigned long long)rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        geoInfo(GEO_LOG_INIT, "could not raise the limit on open files (RLIMIT_NOFILE) from "
                "%llu to its hard limit %llu: %s", was, (unsigned long long)rl.rlim_max,
                strerror(errno));
        return;
    }
    geoInfo(GEO_LOG_INIT, "raised the limit on open files (RLIMIT_NOFILE) from %llu to its "
            "hard limit %llu, for connections to peers and room against strangers", was,
            (unsigned long long)rl.rlim_max);
}

/* The limit is the process's, so the raise is done once per process; the
 * once flag is the only state here, and it can only go one way. */
void geoAdmitRaiseFdLimit(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, raise_fd_limit);
}

/* Descriptors open in this process now: /proc/self/fd, or, without /proc,
 * a probe of every number below the limit (at most 65536 of them). */
static long long open_fds(long long limit)
{
    DIR *d = opendir("/proc/self/fd");
    long long n = 0;
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            n += e->d_name[0] != '.';
        closedir(d);
        return n - 1; /* the directory's own */
    }
    for (int fd = 0; fd < limit && fd < 65536; fd++)
        n += fcntl(fd, F_GETFD) != -1;
    return n;
}

int geoAdmitBudget(const char *who, int needs, int most)
{
    struct rlimit rl;
    if (most < GEO_ADMIT_MIN)
        most = GEO_ADMIT_MIN;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return most;
    long long limit = (long long)rl.rlim_cur, open = open_fds(limit);
    long long share = (limit - open - needs) / GEO_ADMIT_SHARE;
    int budget = share < GEO_ADMIT_MIN ? GEO_ADMIT_MIN : share > most ? most : (int)share;
    if (budget < most)
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "%s: at most %d unproven connections at once, "
                "%d from one source (RLIMIT_NOFILE %lld, %lld descriptors open, %d kept "
                "for this communicator's own connections)", who, budget,
                geoAdmitPerGroup(budget), limit, open, needs);
    return budget;
}

int geoAdmitPerGroup(int budget)
{
    int n = budget / GEO_ADMIT_GROUP_SHARE;
    return n < GEO_ADMIT_MIN / 2 ? GEO_ADMIT_MIN / 2 : n;
}

/* The group key of an address: IPv4 (and IPv4-mapped IPv6) in hi, IPv6 in
 * hi and lo; cut to the prefix unless whole. */
static geoAdmitGroup group_key(const geoSockAddr *a, int whole)
{
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    geoAdmitGroup g = {0, AF_UNSPEC, 0, 0};
    const uint8_t *b = NULL;
    if (a->sa.sa_family == AF_INET)
        b = (const uint8_t *)&a->sin.sin_addr;
    else if (a->sa.sa_family == AF_INET6 &&
             memcmp(a->sin6.sin6_addr.s6_addr, mapped, sizeof(mapped)) == 0)
        b = a->sin6.sin6_addr.s6_addr + 12;
    if (b != NULL) {
        g.family = AF_INET;
        g.hi = (uint64_t)b[0] << 24 | (uint64_t)b[1] << 16 | (uint64_t)b[2] << 8 | b[3];
        if (!whole)
            g.hi >>= 8; /* the /24 */
    } else if (a->sa.sa_family == AF_INET6) {
        g.family = AF_INET6;
        for (int i = 0; i < 8; i++) {
            g.hi = g.hi << 8 | a->sin6.sin6_addr.s6_addr[i];
            g.lo = g.lo << 8 | a->sin6.sin6_addr.s6_addr[8 + i];
        }
        if (!whole)
            g.lo = 0; /* the /64 */
    }
    return g;
}

static int group_cmp(const void *x, const void *y)
{
    const geoAdmitGroup *a = x, *b = y;
    if (a->family != b->family)
        return a->family < b->family ? -1 : 1;
    if (a->hi != b->hi)
        return a->hi < b->hi ? -1 : 1;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

int geoAdmitSameGroup(const geoAdmitGroup *a, const geoAdmitGroup *b)
{
    return a->peer == b->peer && group_cmp(a, b) == 0;
}

int geoAdmitPeersInit(geoAdmitPeers *peers, const geoSockAddr *addr, int n)
{
    peers->n = 0;
    peers->host = n > 0 ? malloc(sizeof(*peers->host) * (size_t)n) : NULL;
    if (peers->host == NULL)
        return n > 0 ? -1 : 0;
    for (int i = 0; i < n; i++)
        if (addr[i].sa.sa_family == AF_INET || addr[i].sa.sa_family == AF_INET6) {
            peers->host[peers->n] = group_key(&addr[i], 1);
            peers->host[peers->n++].peer = 1;
        }
    qsort(peers->host, (size_t)peers->n, sizeof(*peers->host), group_cmp);
    return 0;
}

void geoAdmitPeersFree(geoAdmitPeers *peers)
{
    free(peers->host);
    peers->host = NULL;
    peers->n = 0;
}

geoAdmitGroup geoAdmitGroupOf(const geoAdmitPeers *peers, const geoSockAddr *src)
{
    geoAdmitGroup host = group_key(src, 1);
    if (peers != NULL && peers->n > 0 && host.family != AF_UNSPEC &&
        bsearch(&host, peers->host, (size_t)peers->n, sizeof(host), group_cmp) != NULL) {
        host.peer = 1;
        return host;
    }
    return group_key(src, 0);
}

/* The choices of one call: seeded from the system's randomness once, so
 * that a flood cannot predict them, then a xorshift (a call may break
 * hundreds of ties). */
static uint32_t next_u32(uint32_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 17;
    *x ^= *x << 5;
    return *x;
}

/* One of the count unproven entries of group k, chosen at random. */
static int pick_in(const void *tab, int n, geoAdmitGroupFn group, const geoAdmitGroup *k,
                   int count, uint32_t *rng)
{
    int r = (int)(next_u32(rng) % (uint32_t)count);
    for (int i = 0; i < n; i++) {
        const geoAdmitGroup *g = group(tab, i);
        if (g != NULL && geoAdmitSameGroup(g, k) && r-- == 0)
            return i;
    }
    return -1;
}

typedef struct {
    geoAdmitGroup key;
    int count;
} groupCount;

static uint64_t key_hash(const geoAdmitGroup *k)
{
    uint64_t h = (k->hi ^ (k->lo * 0xff51afd7ed558ccdull) ^ (uint64_t)k->family << 56 ^
                  (uint64_t)k->peer << 48) * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

/* The loudest group of kind `peer` (1: known peers', 0: strangers') but
 * `not`, ties broken at random; its count in *top (0: none).  One pass
 * and a hash table: under a flood this runs for every connection taken. */
static geoAdmitGroup loudest(const void *tab, int n, geoAdmitGroupFn group, int total, int peer,
                             const geoAdmitGroup *not, int *top, uint32_t *rng)
{
    size_t cap = 16;
    while (cap < 2 * (size_t)total)
        cap *= 2;
    groupCount *t = calloc(cap, sizeof(*t));
    geoAdmitGroup best = {0, AF_UNSPEC, 0, 0};
    int ties = 0;
    *top = 0;
    for (int i = 0; i < n; i++) {
        const geoAdmitGroup *g = group(tab, i);
        if (g == NULL || g->peer != peer || (not != NULL && geoAdmitSameGroup(g, not)))
            continue;
        if (t == NULL) { /* out of memory: any one will do */
            *top = 1;
            return *g;
        }
        size_t j = (size_t)key_hash(g) & (cap - 1);
        while (t[j].count > 0 && !geoAdmitSameGroup(&t[j].key, g))
            j = (j + 1) & (cap - 1);
        t[j].key = *g;
        int c = ++t[j].count;
        if (c > *top) {
            *top = c;
            best = *g;
            ties = 1;
        } else if (c == *top && next_u32(rng) % (uint32_t)++ties == 0) {
            best = *g; /* each group tied at the top is as likely */
        }
    }
    free(t);
    return best;
}

/* Among the groups of kind `peer`: from's own (mine of its entries, from
 * of that kind) when it would be the loudest with the newcomer, else the
 * loudest other; -1 when the kind has none. */
static int give_way(const void *tab, int n, geoAdmitGroupFn group, int total, int peer,
                    const geoAdmitGroup *from, int mine, uint32_t *rng)
{
    int top = 0;
    const geoAdmitGroup *own = from != NULL && from->peer == peer ? from : NULL;
    geoAdmitGroup k = loudest(tab, n, group, total, peer, own, &top, rng);
    if (own != NULL && mine > 0 && mine + 1 > top)
        return pick_in(tab, n, group, own, mine, rng);
    return top > 0 ? pick_in(tab, n, group, &k, top, rng) : -1;
}

int geoAdmitVictim(const void *tab, int n, geoAdmitGroupFn group, const geoAdmitGroup *from,
                   int per_group, int most)
{
    static uint32_t fallback = 0x9e3779b9u; /* no randomness: any choice will do */
    int total = 0, strangers = 0, mine = 0;
    uint32_t rng;
    for (int i = 0; i < n; i++) {
        const geoAdmitGroup *g = group(tab, i);
        if (g == NULL)
            continue;
        total++;
        strangers += !g->peer;
        mine += from != NULL && geoAdmitSameGroup(g, from);
    }
    if (total == 0 || (from != NULL && mine < per_group && total < most))
        return -1;
    if (geoRandomBytes(&rng, sizeof(rng)) != 0)
        rng = __atomic_add_fetch(&fallback, 0x9e3779b9u, __ATOMIC_RELAXED);
    rng |= 1; /* xorshift's state is never 0 */
    if (from != NULL && mine >= per_group)
        return pick_in(tab, n, group, from, mine, &rng);
    if (strangers > 0)
        return give_way(tab, n, group, total, 0, from, mine, &rng);
    if (from != NULL && !from->peer)
        return GEO_ADMIT_REFUSE;
    return give_way(tab, n, group, total, 1, from, mine, &rng);
}
