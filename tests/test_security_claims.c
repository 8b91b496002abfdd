/* What a rank believes of what others claim and of files on disk: each
 * claim is held to what rank 0 and the environment allow, and a file no one
 * authenticates decides nothing about encryption.
 *  - region labels from GEOCCL_TOPO_FILE do not make a pair that is not
 *    proven to share a host send in the clear;
 *  - rank 0 writes the topology file under a fresh name, so a link planted
 *    where the file's temporary name used to be is not written through;
 *  - a first join claiming 2^20 ranks costs the root nothing and does not
 *    stop the real communicator from forming (the root's count: the one it
 *    was started with, or rank 0's);
 *  - a rank's address in the table must be one a rank can listen on, and
 *    loopback only for ranks on loopback themselves;
 *  - a peer that never acknowledges pins at most GEOCCL_RESUME_BUFFER of
 *    our memory, however many streams rank 0 asked for. */
#define _GNU_SOURCE
#include "config.h"
#include "tests/helpers/harness.h"
#include "tests/helpers/security_helpers.h"
#include "comm/api/init_internal.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/core/comm.h"
#include "comm/transport/net_tcp_internal.h"

#include <CUnit/Basic.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int all_reduce_right(ncclComm_t comm, int rank, int nranks)
{
    float x[1024];
    for (int i = 0; i < 1024; i++)
        x[i] = (float)(rank + 1) * (float)i;
    if (ncclAllReduce(x, x, 1024, ncclFloat, ncclSum, comm, NULL) != ncclSuccess)
        return 0;
    for (int i = 0; i < 1024; i++)
        if (x[i] != (float)(nranks * (nranks + 1) / 2) * (float)i)
            return 0;
    return 1;
}

/* ---- region labels from a file do not decide encryption ----------------- */

typedef struct {
    char topo[64];
    const char *shm;
    int encrypt[2], nregions[2], right[2];
} labelArgs;

static int label_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    labelArgs *a = arg;
    ncclComm_t comm = NULL;
    sec_set_env("GEOCCL_SHM", a->shm);
    sec_set_env("GEOCCL_ENCRYPT", "wan");
    sec_set_env("GEOCCL_PROBE", "0");
    sec_set_env("GEOCCL_TOPO_FILE", a->topo);
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    a->encrypt[rank] = comm->encrypt[1 - rank];
    a->nregions[rank] = comm->regions.nregions;
    a->right[rank] = all_reduce_right(comm, rank, nranks);
    ncclCommDestroy(comm);
    return 0;
}

static void test_file_labels_do_not_decide_encryption(void)
{
    labelArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    snprintf(a->topo, sizeof(a->topo), "/tmp/geoccl-labels-%d.topo", (int)getpid());
    FILE *f = fopen(a->topo, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    /* Whoever can write the file puts both ranks in one region. */
    fputs("region x\nrank 0 x\nrank 1 x\n", f);
    fclose(f);
    /* Without a same-host socket (GEOCCL_SHM=0) nothing proves the two
     * share a host: encrypted, whatever the file says. */
    a->shm = "0";
    CU_ASSERT_EQUAL(harness_run_noinit(2, label_body, a, 60), 0);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(a->nregions[r], 1); /* the file's regions are used for the plan */
        CU_ASSERT_EQUAL(a->encrypt[r], 1);
        CU_ASSERT_TRUE(a->right[r]);
    }
    /* Proven on one host (same kernel, namespace, and each other's socket
     * file): in the clear, as before. */
    a->shm = "1";
    CU_ASSERT_EQUAL(harness_run_noinit(2, label_body, a, 60), 0);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(a->encrypt[r], 0);
        CU_ASSERT_TRUE(a->right[r]);
    }
    unlink(a->topo);
    harness_shared_free(a, sizeof(*a));
}

/* ---- the topology file is not written through a planted link ------------ */

typedef struct {
    char dir[64];
    int wrote_through, is_link, written;
} writeArgs;

static int write_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    writeArgs *a = arg;
    ncclComm_t comm = NULL;
    char path[128], tmp[192], victim[128], text[64] = "";
    sec_set_env("GEOCCL_PROBE", "0");
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    snprintf(victim, sizeof(victim), "%s/victim", a->dir);
    snprintf(path, sizeof(path), "%s/t.topo", a->dir);
    FILE *f = fopen(victim, "w");
    if (f == NULL)
        return 1;
    fputs("precious\n", f);
    fclose(f);
    /* Another user of a shared directory plants a link where a writer
     * that names its temporary file <name>.<pid>.tmp would open it. */
    snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
    if (symlink(victim, tmp) != 0)
        return 1;
    setenv("GEOCCL_TOPO_FILE", path, 1);
    geoCommWriteTopoFile(comm);
    unsetenv("GEOCCL_TOPO_FILE");
    f = fopen(victim, "r");
    if (f == NULL || fgets(text, sizeof(text), f) == NULL)
        text[0] = '\0';
    if (f)
        fclose(f);
    a->wrote_through = strcmp(text, "precious\n") != 0;
    struct stat sb;
    a->written = lstat(path, &sb) == 0;
    a->is_link = a->written && S_ISLNK(sb.st_mode);
    unlink(tmp);
    unlink(path);
    unlink(victim);
    ncclCommDestroy(comm);
    return 0;
}

static void test_topo_file_not_written_through_a_link(void)
{
    writeArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    snprintf(a->dir, sizeof(a->dir), "/tmp/geoccl-topo-XXXXXX");
    CU_ASSERT_PTR_NOT_NULL_FATAL(mkdtemp(a->dir));
    CU_ASSERT_EQUAL(harness_run_noinit(1, write_body, a, 60), 0);
    CU_ASSERT_FALSE(a->wrote_through);
    CU_ASSERT_TRUE(a->written);
    CU_ASSERT_FALSE(a->is_link);
    rmdir(a->dir);
    harness_shared_free(a, sizeof(*a));
}

/* ---- a first join claiming 2^20 ranks ------------------------------------ */

typedef struct {
    const geoUniqueIdInternal *id;
    int rank, nranks;
    double timeout;
    ncclResult_t res;
    double took;
} joinThread;

static void *join_main(void *arg)
{
    joinThread *j = arg;
    char entry[64];
    double t0 = geoNow();
    snprintf(entry, sizeof(entry), "rank %d of %d", j->rank, j->nranks);
    j->res = sec_bootstrap_join(j->id, j->rank, j->nranks, j->timeout, entry, strlen(entry), NULL,
                                0);
    j->took = geoNow() - t0;
    return NULL;
}

typedef struct {
    int env_root, port;
    ncclResult_t claim, real[2];
    double claim_took;
} claimArgs;

static int claim_body(int rank, int nranks, const ncclUniqueId *unused, void *arg)
{
    claimArgs *a = arg;
    ncclUniqueId uid;
    geoUniqueIdInternal id;
    pthread_t t[3];
    (void)rank;
    (void)nranks;
    (void)unused;
    sec_set_env("GEOCCL_TIMEOUT", "10");
    if (a->env_root) {
        /* Rank 0's root under GEOCCL_COMM_ID: it knows the count, 2. */
        char cid[64];
        snprintf(cid, sizeof(cid), "127.0.0.1:%d", a->port);
        sec_set_env("GEOCCL_COMM_ID", cid);
        sec_set_env("GEOCCL_COMM_SECRET",
                    "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
    }
    if (sec_get_id(&uid, &id) != ncclSuccess)
        return 1;
    if (a->env_root && geoBootstrapStartRoot(&id, 2, 10) != ncclSuccess)
        return 1;
    /* A holder of the secret joins first, as rank 1 of 2^20. */
    joinThread j[3] = {{.id = &id, .rank = 1, .nranks = 1 << 20, .timeout = 6},
                       {.id = &id, .rank = 0, .nranks = 2, .timeout = 8},
                       {.id = &id, .rank = 1, .nranks = 2, .timeout = 8}};
    pthread_create(&t[0], NULL, join_main, &j[0]);
    usleep(500000);
    pthread_create(&t[1], NULL, join_main, &j[1]);
    pthread_create(&t[2], NULL, join_main, &j[2]);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    a->claim = j[0].res;
    a->claim_took = j[0].took;
    a->real[0] = j[1].res;
    a->real[1] = j[2].res;
    return 0;
}

static void test_claimed_rank_count(void)
{
    claimArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    for (int env = 0; env < 2; env++) {
        memset(a, 0, sizeof(*a));
        a->env_root = env;
        a->port = harness_free_port();
        CU_ASSERT_EQUAL(harness_run_noinit(1, claim_body, a, 60), 0);
        /* The claim is refused (at once where the root knew the count, when
         * rank 0 came otherwise), and the real two ranks form. */
        CU_ASSERT_EQUAL(a->claim, ncclRemoteError);
        CU_ASSERT_EQUAL(a->real[0], ncclSuccess);
        CU_ASSERT_EQUAL(a->real[1], ncclSuccess);
        if (env)
            CU_ASSERT_TRUE(a->claim_took < 3.0 * harness_time_scale());
        if (a->real[0] != ncclSuccess || a->real[1] != ncclSuccess)
            fprintf(stderr, "    %s root: ranks 0 and 1 of 2 got %s and %s after a claim of "
                    "2^20 ranks\n", env ? "GEOCCL_COMM_ID" : "ncclGetUniqueId's",
                    ncclGetErrorString(a->real[0]), ncclGetErrorString(a->real[1]));
    }
    harness_shared_free(a, sizeof(*a));
}

/* ---- addresses in the table ---------------------------------------------- */

/* Rank 0 holds the secret and gives addr as its address in the table; the
 * other ranks (on ifname, "" for lo) must refuse it, saying expect. */
static void check_addr(const char *addr, const char *ifname, const char *expect)
{
    geoPeerInfo info;
    char what[80];
    memset(&info, 0, sizeof(info));
    info.nstreams = 2;
    info.chunk_size = 512 << 10;
    geoAddrFromString(addr, &info.net.addr);
    snprintf(what, sizeof(what), "%s: ", addr);
    double t0 = harness_now();
    sec_check_table_refused(&info, ifname, expect, what);
    /* Refused on the table, not after dialling until the timeout. */
    CU_ASSERT_TRUE(harness_now() - t0 < 8.0 * harness_time_scale());
}

/* An IPv4 interface other than lo that is up, or "". */
static void other_iface(char out[IF_NAMESIZE])
{
    struct ifaddrs *ifa = NULL;
    out[0] = '\0';
    if (getifaddrs(&ifa) != 0)
        return;
    for (struct ifaddrs *i = ifa; i && !out[0]; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
            !(i->ifa_flags & IFF_LOOPBACK))
            snprintf(out, IF_NAMESIZE, "=%.*s", IF_NAMESIZE - 2, i->ifa_name);
    freeifaddrs(ifa);
}

static void test_table_addresses(void)
{
    char ifname[IF_NAMESIZE];
    check_addr("0.0.0.0:4000", "", "gives 0.0.0.0:4000 as its address, which no rank can "
               "listen on");
    check_addr("224.0.0.1:4000", "", "no rank can listen on");
    check_addr("127.0.0.1:0", "", "no rank can listen on");
    /* Loopback from a rank whose own address is not: a service on the
     * victims' own host. */
    other_iface(ifname);
    if (ifname[0])
        check_addr("127.0.0.1:22", ifname, "is loopback while this rank's own is not");
    else
        fprintf(stderr, "    (no interface but lo: the loopback case is not run)\n");
}

/* ---- what a peer that never acknowledges can pin ------------------------- */

typedef struct {
    size_t kept_max[2];
    int nstreams[2];
} keptArgs;

static int kept_body(int rank, int nranks, const ncclUniqueId *id, void *arg)
{
    keptArgs *a = arg;
    ncclComm_t comm = NULL;
    sec_set_env("GEOCCL_SHM", "0");
    sec_set_env("GEOCCL_PROBE", "0");
    sec_set_env("GEOCCL_NSTREAMS", "4");
    sec_set_env("GEOCCL_RESUME_BUFFER", "4M");
    if (ncclCommInitRank(&comm, nranks, *id, rank) != ncclSuccess)
        return 1;
    const tcpState *st = comm->net.state;
    a->nstreams[rank] = st->nstreams;
    for (int s = 0; s < st->nstreams; s++)
        a->kept_max[rank] += st->peers[1 - rank].conns[s].k_max * GEO_TCP_FRAME;
    int ok = all_reduce_right(comm, rank, nranks);
    ncclCommDestroy(comm);
    return ok ? 0 : 1;
}

static void test_resume_buffer_per_peer(void)
{
    keptArgs *a = harness_shared_alloc(sizeof(*a));
    CU_ASSERT_PTR_NOT_NULL_FATAL(a);
    CU_ASSERT_EQUAL(harness_run_noinit(2, kept_body, a, 60), 0);
    for (int r = 0; r < 2; r++) {
        CU_ASSERT_EQUAL(a->nstreams[r], 4);
        /* What the peer's connections may keep, all together: the budget. */
        CU_ASSERT_EQUAL(a->kept_max[r], (size_t)4 << 20);
        if (a->kept_max[r] != (size_t)4 << 20)
            fprintf(stderr, "    rank %d keeps up to %zu bytes for its peer (%d streams)\n", r,
                    a->kept_max[r], a->nstreams[r]);
    }
    harness_shared_free(a, sizeof(*a));
}

int main(void)
{
    harness_setup_env();
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("security: claims", NULL, NULL);
    CU_add_test(s, "region labels from a file do not decide encryption",
                test_file_labels_do_not_decide_encryption);
    CU_add_test(s, "the topology file is not written through a planted link",
                test_topo_file_not_written_through_a_link);
    CU_add_test(s, "a first join claiming 2^20 ranks stops nothing", test_claimed_rank_count);
    CU_add_test(s, "a rank's address must be one a rank can listen on", test_table_addresses);
    CU_add_test(s, "a peer pins at most GEOCCL_RESUME_BUFFER", test_resume_buffer_per_peer);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    unsigned f = CU_get_number_of_failures();
    CU_cleanup_registry();
    return f ? 1 : 0;
}
