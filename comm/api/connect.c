/* The connect stage of an init, everything after the handle exists: check
 * the socket, warm-up and encryption parameters before anything is sent,
 * join the bootstrap with this rank's peer info, believe the table only
 * within bounds, decide which connections are encrypted (on what the
 * ranks proved, never on region labels), connect the
 * transport, then probe, plan and prepare the device path.  Blocking init
 * runs it on the caller's thread, non-blocking init on a thread of its own. */
#include "config.h"
#include "comm/api/init_internal.h"
#include "comm/base/checks.h"
#include "comm/base/param.h"
#include "comm/bootstrap/bootstrap.h"
#include "comm/coll/cma.h"
#include "comm/coll/tuning.h"
#include "comm/core/comm.h"
#include "comm/device/coll_device.h"
#include "comm/elastic/elastic.h"
#include "comm/transport/ifaces.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* GEOCCL_ENCRYPT and GEOCCL_CIPHER, checked before anything is sent. */
static ncclResult_t encrypt_params(struct ncclComm *comm, int *mode, int *cipher)
{
    const char *e = geoParamStr(GEO_PARAM_ENCRYPT), *c = geoParamStr(GEO_PARAM_CIPHER);
    if (strcmp(e, "wan") == 0)
        *mode = GEO_ENCRYPT_WAN;
    else if (strcmp(e, "all") == 0)
        *mode = GEO_ENCRYPT_ALL;
    else if (strcmp(e, "off") == 0)
        *mode = GEO_ENCRYPT_OFF;
    else
        return GEO_COMM_ERR(comm, ncclInvalidArgument,
                            "init: GEOCCL_ENCRYPT=%s: must be wan, all or off", e);
    if (strcmp(c, "auto") == 0)
        *cipher = geoCipherPreferred();
    else if (strcmp(c, "aes-256-gcm") == 0)
        *cipher = GEO_CIPHER_AES256GCM;
    else if (strcmp(c, "chacha20-poly1305") == 0)
        *cipher = GEO_CIPHER_CHACHA20POLY1305;
    else
        return GEO_COMM_ERR(comm, ncclInvalidArgument, "init: GEOCCL_CIPHER=%s: must be auto, "
                            "aes-256-gcm or chacha20-poly1305", c);
    return ncclSuccess;
}

/* How a rank's address may be dialled: 1 a unicast address with a port;
 * 2 the same, on loopback (::ffff:127.x included); 0 none a rank can
 * listen on for others (unspecified, multicast, broadcast, port 0). */
static int addr_kind(const geoSockAddr *a)
{
    if (a->sa.sa_family == AF_INET) {
        uint32_t h = ntohl(a->sin.sin_addr.s_addr);
        if (a->sin.sin_port == 0 || h == INADDR_ANY || h == INADDR_BROADCAST ||
            IN_MULTICAST(h))
            return 0;
        return (h >> 24) == 127 ? 2 : 1;
    }
    const struct in6_addr *x = &a->sin6.sin6_addr;
    if (a->sin6.sin6_port == 0 || IN6_IS_ADDR_UNSPECIFIED(x) || IN6_IS_ADDR_MULTICAST(x))
        return 0;
    if (IN6_IS_ADDR_V4MAPPED(x)) {
        uint32_t h = ((uint32_t)x->s6_addr[12] << 24) | ((uint32_t)x->s6_addr[13] << 16) |
                     ((uint32_t)x->s6_addr[14] << 8) | x->s6_addr[15];
        if (h == INADDR_ANY || h == INADDR_BROADCAST || IN_MULTICAST(h))
            return 0;
        return (h >> 24) == 127 ? 2 : 1;
    }
    return IN6_IS_ADDR_LOOPBACK(x) ? 2 : 1;
}

/* What the table says is believed only within bounds: it comes from the
 * other ranks (authenticated, but they may run another build, be
 * misconfigured, or lie), and these values size loops, allocations and
 * connections, and say where this rank dials.  An address must be one a
 * rank can listen on for others, and loopback only when this rank's own is
 * loopback too (a job on one host's lo): otherwise one rank's entry could
 * send every other rank to a service on the other ranks' own hosts. */
static ncclResult_t check_peer_table(struct ncclComm *comm)
{
    const geoPeerInfo *p0 = &comm->peers[0];
    if (p0->nstreams < 1 || p0->nstreams > 64)
        return GEO_COMM_ERR(comm, ncclRemoteError, "init: rank 0 asks for %d streams per peer "
                            "pair: outside 1..64; refusing the communicator", p0->nstreams);
    if (p0->chunk_size < 4096 || p0->chunk_size > ((int64_t)1 << 30))
        return GEO_COMM_ERR(comm, ncclRemoteError, "init: rank 0 asks for chunks of %lld bytes: "
                            "outside 4 KiB..1 GiB; refusing the communicator",
                            (long long)p0->chunk_size);
    for (int r = 0; r < comm->nranks; r++) {
        geoPeerInfo *p = &comm->peers[r];
        /* Strings end inside their fields, whatever was sent. */
        p->net.host[sizeof(p->net.host) - 1] = '\0';
        p->net.local.path[sizeof(p->net.local.path) - 1] = '\0';
        p->net.local.boot_id[sizeof(p->net.local.boot_id) - 1] = '\0';
        p->region[sizeof(p->region) - 1] = '\0';
        if (p->encrypt < GEO_ENCRYPT_OFF || p->encrypt > GEO_ENCRYPT_ALL ||
            (p->net.addr.sa.sa_family != AF_INET && p->net.addr.sa.sa_family != AF_INET6))
            return GEO_COMM_ERR(comm, ncclRemoteError, "init: rank %d's entry in the bootstrap "
                                "table is malformed (address family %d, encryption mode %d): "
                                "another GeoCCL version?", r, p->net.addr.sa.sa_family,
                                p->encrypt);
    }
    const int mine = addr_kind(&comm->peers[comm->rank].net.addr);
    for (int r = 0; r < comm->nranks; r++) {
        const geoPeerInfo *p = &comm->peers[r];
        int kind = addr_kind(&p->net.addr);
        char a[GEO_ADDR_STRLEN];
        if (r != comm->rank && (kind == 0 || (kind == 2 && mine != 2)))
            return GEO_COMM_ERR(comm, ncclRemoteError, "init: rank %d (host %s) gives %s as its "
                                "address, which %s; refusing the communicator rather than "
                                "dialling it", r, p->net.host, geoAddrToString(&p->net.addr, a),
                                kind == 0 ? "no rank can listen on for others"
                                          : "is loopback while this rank's own is not");
    }
    return ncclSuccess;
}

/* Which connections are encrypted: every one under "all"; under "wan"
 * every one to a rank that is not proven to share this host: the same
 * kernel, network namespace and a same-host socket (geoLocalSamePlace, on
 * the table, whose entries each rank proved with the secret).  Region
 * labels do not count: they come from GEOCCL_REGION or a topology file,
 * which nothing authenticates, and the probe puts sites a few ms apart in
 * one region.  A pair follows the stronger of its two ends' settings, so
 * both ends compute the same.  Without a secret (GEOCCL_INSECURE_NO_SECRET)
 * every rank must run on this host (the same kernel), nothing is
 * encrypted, and asking for encryption is refused: keys that follow from a
 * public string protect nothing. */
static ncclResult_t encrypt_plan(struct ncclComm *comm)
{
    static const char *const mode_name[] = {"off", "wan", "all"};
    const geoPeerInfo *me = &comm->peers[comm->rank];
    comm->encrypt = calloc((size_t)comm->nranks, 1);
    if (comm->encrypt == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for %d peers",
                            comm->nranks);
    for (int r = 0; r < comm->nranks; r++) {
        const geoPeerInfo *p = &comm->peers[r];
        int mode = me->encrypt > p->encrypt ? me->encrypt : p->encrypt;
        if (r == comm->rank)
            continue;
        if (comm->nosecret) {
            const char *mine = me->net.local.boot_id, *theirs = p->net.local.boot_id;
            if (mine[0] == '\0' || strcmp(mine, theirs) != 0)
                return GEO_COMM_ERR(comm, ncclInvalidArgument, "init: rank %d runs on host "
                                    "%s, not on this one (another kernel), and this "
                                    "communicator has no secret: GEOCCL_INSECURE_NO_SECRET=1 "
                                    "is only for ranks of one host.  Set GEOCCL_COMM_SECRET to "
                                    "a passphrase every rank shares", r, p->net.host);
            if (mode == GEO_ENCRYPT_ALL)
                return GEO_COMM_ERR(comm, ncclInvalidArgument, "init: connections to rank %d "
                                    "are to be encrypted (GEOCCL_ENCRYPT=%s here, %s there), "
                                    "but this communicator has no secret "
                                    "(GEOCCL_INSECURE_NO_SECRET=1): every key would follow "
                                    "from GEOCCL_COMM_ID, which anyone can know.  Set "
                                    "GEOCCL_COMM_SECRET to a passphrase every rank shares", r,
                                    mode_name[me->encrypt], mode_name[p->encrypt]);
            continue;
        }
        comm->encrypt[r] = mode == GEO_ENCRYPT_ALL ||
                           (mode == GEO_ENCRYPT_WAN &&
                            !geoLocalSamePlace(&me->net.local, &p->net.local));
    }
    return ncclSuccess;
}

ncclResult_t geoCommConnect(struct ncclComm *comm, const geoUniqueIdInternal *id,
                            int allow_env_root)
{
    geoPeerInfo mine;
    topoIface ifs[1];
    geoNetAddr addr;
    ncclResult_t res;
    const char *filter = geoParamStr(GEO_PARAM_SOCKET_IFNAME);
    char a[GEO_ADDR_STRLEN];

    geoDebugSetRank(comm->rank);
    {
        char why[400];
        if (geoSocketCheckParams(why, sizeof(why)) != 0)
            return GEO_COMM_ERR(comm, ncclInvalidArgument, "init: %s", why);
        int64_t warm = geoParamInt(GEO_PARAM_WAN_WARMUP);
        if (warm < 0 || warm > 2)
            return GEO_COMM_ERR(comm, ncclInvalidArgument, "init: GEOCCL_WAN_WARMUP=%lld: must "
                                "be 0 (never), 1 (every pair of regions) or 2 (fast pairs)",
                                (long long)warm);
    }
    int enc_mode = GEO_ENCRYPT_OFF, cipher = GEO_CIPHER_NONE; /* or what encrypt_params says */
    GEO_CHECK(encrypt_params(comm, &enc_mode, &cipher));
    if ((id->flags & GEO_ID_ENV) && allow_env_root && comm->rank == 0) {
        GEO_CHECK(geoBootstrapStartRoot(id, comm->nranks, comm->timeout));
        geoElasticStoreMaybeServe(&id->root);
    }
    comm->net.ctx = (geoNetCtx){.rank = comm->rank,
                                .nranks = comm->nranks,
                                .nstreams = comm->nstreams,
                                .timeout = comm->timeout,
                                .secret = comm->secret,
                                .comm_hash = comm->comm_hash,
                                .cipher = cipher,
                                .err = &comm->err};
    for (int i = 0; geoNetTransports[i]; i++)
        if (geoNetTransports[i]->canConnect(&comm->net.ctx)) {
            comm->net.ops = geoNetTransports[i];
            break;
        }
    if (comm->net.ops == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError,
                            "init: no transport can connect this communicator");
    if (topoFindIfaces(filter, &id->root.sa, ifs, 1) < 1) {
        char set[300];
        return GEO_COMM_ERR(comm, ncclSystemError, "init: no usable network interface (%s)",
                            geoParamSetting(GEO_PARAM_SOCKET_IFNAME, set, sizeof(set)));
    }
    memset(&addr, 0, sizeof(addr));
    memcpy(&addr.addr, &ifs[0].addr,
           ifs[0].addr.ss_family == AF_INET6 ? sizeof(addr.addr.sin6) : sizeof(addr.addr.sin));
    GEO_CHECK(comm->net.ops->listen(&comm->net.ctx, &comm->net.state, &addr));
    snprintf(comm->if_name, sizeof(comm->if_name), "%s", ifs[0].name);

    memset(&mine, 0, sizeof(mine));
    mine.net.addr = addr.addr;
    mine.net.local = addr.local;
    gethostname(mine.net.host, sizeof(mine.net.host) - 1);
    mine.pid = (int32_t)getpid();
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    mine.ncpu = (int32_t)(ncpu > 0 ? ncpu : 1);
    mine.streams_set = geoParamIsSet(GEO_PARAM_NSTREAMS);
    mine.window = geoProbeStreamWindow();
    mine.nstreams = comm->nstreams;
    mine.chunk_size = (int64_t)comm->chunk_size;
    mine.probe = (int32_t)geoParamInt(GEO_PARAM_PROBE);
    mine.warmup = (int32_t)geoParamInt(GEO_PARAM_WAN_WARMUP);
    mine.landmarks = (int32_t)geoParamInt(GEO_PARAM_PROBE_LANDMARKS);
    mine.encrypt = enc_mode;
    {
        const char *ni = geoParamStr(GEO_PARAM_NCCL_INIT);
        mine.nccl_init = GEO_NCCL_INIT_AUTO;
        if (ni && strcasecmp(ni, "eager") == 0)
            mine.nccl_init = GEO_NCCL_INIT_EAGER;
        else if (ni && strcasecmp(ni, "lazy") == 0)
            mine.nccl_init = GEO_NCCL_INIT_LAZY;
        else if (ni && strcasecmp(ni, "auto") != 0)
            return GEO_COMM_ERR(comm, ncclInvalidArgument,
                                "init: GEOCCL_NCCL_INIT=%s: must be auto, eager or lazy", ni);
        /* Lazy here: NCCL is not even loaded at init. */
        if (mine.nccl_init != GEO_NCCL_INIT_LAZY)
            mine.dev_ready = geoDevIdentify(comm->cuda_dev, mine.dev_bus);
    }
    GEO_CHECK(geoCommResolveRegion(comm, &addr.addr, mine.net.host, mine.region));
    /* The streams a cached probe found necessary, unless set by hand. */
    if (comm->topo_file_loaded && comm->topo_file.streams > 0 &&
        !geoParamIsSet(GEO_PARAM_NSTREAMS))
        mine.nstreams = comm->topo_file.streams > 64 ? 64 : comm->topo_file.streams;
    comm->peers = calloc((size_t)comm->nranks, sizeof(geoPeerInfo));
    if (comm->peers == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for %d peers",
                            comm->nranks);
    {
        char b[GEO_ADDR_STRLEN];
        geoInfo(GEO_LOG_INIT, "rank %d of %d joining root %s, listening on %s (%s)", comm->rank,
                comm->nranks, geoAddrToString(&id->root, a), geoAddrToString(&addr.addr, b),
                ifs[0].name);
    }
    {
        geoBootSelf self = {.rank = comm->rank, .nranks = comm->nranks,
                            .timeout = comm->timeout, .err = &comm->err};
        geoBootInfo *table = calloc((size_t)comm->nranks, sizeof(*table));
        geoBootInfo me;
        if (table == NULL)
            return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for %d peers",
                                comm->nranks);
        memset(&me, 0, sizeof(me));
        memcpy(me.bytes, &mine, sizeof(mine));
        res = geoBootstrapJoin(&self, id, &me, table);
        for (int r = 0; res == ncclSuccess && r < comm->nranks; r++)
            memcpy(&comm->peers[r], table[r].bytes, sizeof(comm->peers[r]));
        free(table);
        if (res != ncclSuccess)
            return res;
    }
    GEO_CHECK(check_peer_table(comm));
    /* Every rank uses rank 0's stream count and chunk size. */
    comm->nstreams = comm->peers[0].nstreams;
    comm->chunk_size = (size_t)comm->peers[0].chunk_size;
    GEO_CHECK(geoCommBuildRegions(comm));
    GEO_CHECK(encrypt_plan(comm));
    comm->net.ctx.nstreams = comm->nstreams;
    comm->net.ctx.peers = calloc((size_t)comm->nranks, sizeof(geoNetPeer));
    if (comm->net.ctx.peers == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for %d peers",
                            comm->nranks);
    for (int r = 0; r < comm->nranks; r++)
        comm->net.ctx.peers[r] = comm->peers[r].net;
    comm->net.ctx.encrypt = comm->encrypt;
    comm->net.ctx.failed = calloc((size_t)comm->nranks, 1);
    if (comm->net.ctx.failed == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for %d peers",
                            comm->nranks);
    res = comm->net.ops->connect(&comm->net.ctx, comm->net.state);
    if (res != ncclSuccess)
        return res;
    {
        int nenc = 0;
        for (int r = 0; r < comm->nranks; r++)
            nenc += comm->encrypt[r];
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "encryption (GEOCCL_ENCRYPT=%s): connections to %d "
                "of %d peers, %s", geoParamStr(GEO_PARAM_ENCRYPT), nenc, comm->nranks - 1,
                nenc ? geoCipherName(comm->net.ctx.cipher_used) : "none");
    }
    GEO_CHECK(geoCommProbe(comm));
    GEO_CHECK(geoCmaSetup(comm)); /* the region map is final now */
    if (comm->topo_file_missing && comm->rank == 0)
        geoCommWriteTopoFile(comm);
    GEO_CHECK(geoTuningInit(comm));
    GEO_CHECK(geoDevInitAtInit(comm));
    GEO_CHECK(geoElasticAttach(comm));
    geoInfo(GEO_LOG_INIT, "communicator %016llx%s%s ready: rank %d of %d, %s, %d streams, "
            "chunk %zu", (unsigned long long)comm->comm_hash, comm->name[0] ? " " : "",
            comm->name, comm->rank, comm->nranks, comm->net.ops->name, comm->nstreams,
            comm->chunk_size);
    return ncclSuccess;
}
