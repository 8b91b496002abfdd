/* Admission of unproven connections (comm/transport/admit.h): source
 * groups, which connection gives way to a newer one, and the descriptor
 * budget from RLIMIT_NOFILE. */
#include "config.h"
#include "comm/transport/admit.h"

#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static geoSockAddr addr(const char *text)
{
    geoSockAddr a;
    memset(&a, 0, sizeof(a));
    if (strchr(text, ':') != NULL) {
        a.sin6.sin6_family = AF_INET6;
        CU_ASSERT_EQUAL(inet_pton(AF_INET6, text, &a.sin6.sin6_addr), 1);
    } else if (text[0] != '\0') {
        a.sin.sin_family = AF_INET;
        CU_ASSERT_EQUAL(inet_pton(AF_INET, text, &a.sin.sin_addr), 1);
    } /* "": a same-host socket's zeroed address */
    return a;
}

static void test_groups(void)
{
    static const struct {
        const char *a, *b;
        int same;
    } cases[] = {
        {"10.1.2.3", "10.1.2.200", 1},
        {"10.1.2.3", "10.1.3.3", 0},
        {"127.0.0.1", "127.0.1.1", 0},
        {"2001:db8:1:2::1", "2001:db8:1:2:ffff::9", 1},
        {"2001:db8:1:2::1", "2001:db8:1:3::1", 0},
        {"::ffff:10.1.2.9", "10.1.2.3", 1},
        {"::ffff:10.1.2.9", "10.1.9.3", 0},
        {"", "", 1},
        {"", "10.1.2.3", 0},
        /* a known peer's host is a group of its own, apart from its prefix */
        {"10.9.9.9", "10.9.9.8", 0},
        {"2001:db8:9::9", "2001:db8:9::8", 0},
    };
    geoSockAddr known[2] = {addr("10.9.9.9"), addr("2001:db8:9::9")};
    geoAdmitPeers peers;
    CU_ASSERT_EQUAL_FATAL(geoAdmitPeersInit(&peers, known, 2), 0);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        geoSockAddr a = addr(cases[i].a), b = addr(cases[i].b);
        geoAdmitGroup ga = geoAdmitGroupOf(&peers, &a), gb = geoAdmitGroupOf(&peers, &b);
        CU_ASSERT_EQUAL(geoAdmitSameGroup(&ga, &gb), cases[i].same);
        CU_ASSERT_EQUAL(geoAdmitSameGroup(&gb, &ga), cases[i].same);
        if (geoAdmitSameGroup(&ga, &gb) != cases[i].same)
            fprintf(stderr, "    %s / %s: expected %d\n", cases[i].a, cases[i].b, cases[i].same);
    }
    geoSockAddr a = addr("10.9.9.9"), b = addr("10.9.9.8");
    CU_ASSERT_EQUAL(geoAdmitGroupOf(&peers, &a).peer, 1);
    CU_ASSERT_EQUAL(geoAdmitGroupOf(&peers, &b).peer, 0);
    CU_ASSERT_EQUAL(geoAdmitGroupOf(NULL, &a).peer, 0);
    geoAdmitPeersFree(&peers);
}

/* A listener's table: a group per slot, and whether it has proved itself
 * (then the policy must never pick it). */
#define SLOTS 64
typedef struct {
    geoAdmitGroup g[SLOTS];
    int proven[SLOTS];
    int used[SLOTS];
} table;

static const geoAdmitGroup *table_group(const void *tab, int i)
{
    const table *t = tab;
    return t->used[i] && !t->proven[i] ? &t->g[i] : NULL;
}

static int count_group(const table *t, const geoAdmitGroup *like)
{
    int n = 0;
    for (int i = 0; i < SLOTS; i++)
        n += t->used[i] && !t->proven[i] && geoAdmitSameGroup(&t->g[i], like);
    return n;
}

/* A flood of n newcomers from the groups from[0..nfrom), each taking the
 * place of the connection that gives way.  Returns how many times the
 * entry at slot `watch` was picked; every pick is checked. */
static int flood(table *t, const geoAdmitGroup *from, int nfrom, int n, int per_group, int most,
                 int watch)
{
    int picked = 0;
    for (int k = 0; k < n; k++) {
        const geoAdmitGroup *g = &from[rand() % nfrom];
        int v = geoAdmitVictim(t, SLOTS, table_group, g, per_group, most);
        CU_ASSERT_TRUE_FATAL(v >= 0 && v < SLOTS);
        CU_ASSERT_FALSE(t->proven[v]);
        picked += v == watch;
        t->g[v] = *g;
        CU_ASSERT_TRUE(count_group(t, g) <= per_group);
    }
    return picked;
}

static void test_victims(void)
{
    table t;
    char text[64];
    geoSockAddr peer_addr = addr("198.51.100.7"), near = addr("198.51.100.8");
    geoAdmitPeers peers;
    geoAdmitGroup stranger[61], lone_peer, local;
    int per_group = 16, most = SLOTS - 2;
    CU_ASSERT_EQUAL_FATAL(geoAdmitPeersInit(&peers, &peer_addr, 1), 0);
    geoAdmitGroup peer = geoAdmitGroupOf(&peers, &peer_addr);
    memset(&t, 0, sizeof(t));
    for (int k = 0; k < 7; k++) {
        snprintf(text, sizeof(text), "203.0.%d.%d", 100 + k, 1 + k);
        geoSockAddr a = addr(text);
        stranger[k] = geoAdmitGroupOf(&peers, &a);
    }
    /* Room left: nobody goes. */
    t.used[0] = 1;
    t.g[0] = peer;
    CU_ASSERT_EQUAL(geoAdmitVictim(&t, SLOTS, table_group, &stranger[0], per_group, most), -1);
    /* A peer's handshake, two proven ones, strangers from 7 prefixes in
     * every other slot, then a flood from those: the peer's never gives
     * way, nor a proven one, and no group holds more than per_group. */
    for (int i = 1; i < SLOTS; i++) {
        t.used[i] = 1;
        t.proven[i] = i <= 2;
        t.g[i] = stranger[i % 7];
    }
    srand(1);
    CU_ASSERT_EQUAL(flood(&t, stranger, 7, 10000, per_group, most, 0), 0);
    /* Nor from the peer's own /24, nor from a prefix per connection. */
    stranger[0] = geoAdmitGroupOf(&peers, &near);
    CU_ASSERT_EQUAL(flood(&t, stranger, 1, 1000, per_group, most, 0), 0);
    for (int k = 0; k < 61; k++) {
        snprintf(text, sizeof(text), "2001:db8:%x::1", k);
        geoSockAddr a = addr(text);
        stranger[k] = geoAdmitGroupOf(&peers, &a);
    }
    CU_ASSERT_EQUAL(flood(&t, stranger, 61, 10000, per_group, most, 0), 0);
    /* Out of descriptors (no newcomer): a stranger's goes, of the loudest. */
    int v = geoAdmitVictim(&t, SLOTS, table_group, NULL, 0, 0);
    CU_ASSERT_TRUE_FATAL(v > 2);
    int loud = count_group(&t, &t.g[v]);
    for (int i = 3; i < SLOTS; i++)
        CU_ASSERT_TRUE(count_group(&t, &t.g[i]) <= loud);
    /* A newcomer's own group gives way when it would be the loudest. */
    memset(&t, 0, sizeof(t));
    for (int i = 0; i < 8; i++) {
        t.used[i] = 1;
        t.g[i] = i < 5 ? stranger[0] : stranger[1 + i % 3];
    }
    v = geoAdmitVictim(&t, SLOTS, table_group, &stranger[0], per_group, 8);
    CU_ASSERT_TRUE(v >= 0 && v < 5);
    /* Only peers' handshakes in a full table: a stranger is refused, a
     * peer's newcomer takes the place of the loudest peer's; the same-host
     * sockets are a group of their own. */
    memset(&t, 0, sizeof(t));
    geoSockAddr other = addr("192.0.2.1"), none = addr("");
    geoAdmitPeersFree(&peers);
    CU_ASSERT_EQUAL_FATAL(geoAdmitPeersInit(&peers, &other, 1), 0);
    lone_peer = geoAdmitGroupOf(&peers, &other);
    local = geoAdmitGroupOf(&peers, &none);
    CU_ASSERT_EQUAL(local.peer, 0);
    for (int i = 0; i < 8; i++) {
        t.used[i] = 1;
        t.g[i] = i < 6 ? peer : lone_peer;
    }
    CU_ASSERT_EQUAL(geoAdmitVictim(&t, SLOTS, table_group, &stranger[3], per_group, 8),
                    GEO_ADMIT_REFUSE);
    v = geoAdmitVictim(&t, SLOTS, table_group, &lone_peer, per_group, 8);
    CU_ASSERT_TRUE(v >= 0 && v < 6);
    /* Every slot proven: nobody can go. */
    for (int i = 0; i < SLOTS; i++)
        t.used[i] = t.proven[i] = 1;
    CU_ASSERT_EQUAL(geoAdmitVictim(&t, SLOTS, table_group, &stranger[0], 1, 1), -1);
    CU_ASSERT_EQUAL(geoAdmitVictim(&t, SLOTS, table_group, NULL, 0, 0), -1);
    geoAdmitPeersFree(&peers);
}

static void test_budget(void)
{
    struct rlimit rl, low;
    CU_ASSERT_EQUAL_FATAL(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max < 2048) {
        printf("\n    skipped: the hard limit on open files is %llu\n",
               (unsigned long long)rl.rlim_max);
        return;
    }
    low = (struct rlimit){1024, rl.rlim_max};
    CU_ASSERT_EQUAL_FATAL(setrlimit(RLIMIT_NOFILE, &low), 0);
    /* A quarter of what is left once the communicator's own are set aside. */
    int b = geoAdmitBudget("test", 100, 1024);
    CU_ASSERT_TRUE(b > GEO_ADMIT_MIN && b <= (1024 - 100) / GEO_ADMIT_SHARE);
    CU_ASSERT_EQUAL(geoAdmitPerGroup(b), b / GEO_ADMIT_GROUP_SHARE);
    /* Nothing left: still a few, so that peers get in. */
    CU_ASSERT_EQUAL(geoAdmitBudget("test", 5000, 1024), GEO_ADMIT_MIN);
    CU_ASSERT_EQUAL(geoAdmitPerGroup(GEO_ADMIT_MIN), GEO_ADMIT_MIN / 2);
    /* Init raises the soft limit to the hard one; then the cap rules. */
    geoAdmitRaiseFdLimit();
    CU_ASSERT_EQUAL_FATAL(getrlimit(RLIMIT_NOFILE, &low), 0);
    CU_ASSERT_EQUAL(low.rlim_cur, rl.rlim_max);
    if (rl.rlim_max >= 1 << 14)
        CU_ASSERT_EQUAL(geoAdmitBudget("test", 100, 1024), 1024);
    setrlimit(RLIMIT_NOFILE, &rl);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("admit", NULL, NULL);
    CU_add_test(s, "source groups: /24, /64, mapped, same-host, a peer's host", test_groups);
    CU_add_test(s, "the loudest strangers give way, never a peer's or a proven one",
                test_victims);
    CU_add_test(s, "budgets from RLIMIT_NOFILE; the soft limit raised", test_budget);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
