/* Making, sharing and agreeing on the host segment (hostseg.h).
 *
 * Rank 0 creates the memfd (sized, sealed against shrinking and growing,
 * header written with a token derived from the communicator's secret) and
 * tells the others its pid and descriptor number down a binomial tree over
 * the transport: log2(n) rounds, each rank talking to log2(n) peers, so no
 * rank needs a connection to every other.  Each rank opens
 * /proc/<pid>/fd/<fd>, checks the seals, the size and the header, and
 * votes; the votes go up the tree and the verdict comes down it, so every
 * rank decides alike whatever failed where (a rank in another pid or mount
 * namespace, ptrace rules that forbid the open, GEOCCL_HOST_COLL=0 on one
 * rank).  Rank 0 closes its descriptor after the verdict: from then on the
 * segment lives in the mappings alone and goes with the last of them. */
#define _GNU_SOURCE
#include "config.h"
#include "comm/intra/hostseg_internal.h"
#include "comm/base/checks.h"
#include "comm/base/crypto.h"
#include "comm/base/param.h"
#include "comm/core/comm.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HS_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)
/* The data of all slots stays below this (only the pages a call touches
 * are ever allocated); a slot is at least HS_SLOT_MIN and at most
 * HS_SLOT_MAX bytes. */
#define HS_DATA_MAX ((size_t)32 << 20)
#define HS_SLOT_MIN ((size_t)16 << 10)
#define HS_SLOT_MAX ((size_t)1 << 20)
/* Reduce-scatter needs a slot of at least n 8-byte elements. */
#define HS_MAX_RANKS 2048

size_t hsSlotBytes(int n)
{
    size_t s = HS_SLOT_MAX;
    while (s > HS_SLOT_MIN && 2 * (size_t)n * s > HS_DATA_MAX)
        s /= 2;
    return s;
}

static size_t lines_bytes(int n)
{
    return ((size_t)n * HS_LINE + HS_PAGE - 1) / HS_PAGE * HS_PAGE;
}

size_t hsSegmentSize(int n, size_t slot)
{
    if (n < 1 || n > HS_MAX_RANKS || slot == 0 || slot > HS_SLOT_MAX)
        return 0;
    return HS_PAGE + lines_bytes(n) + 2 * (size_t)n * slot;
}

void hsViews(geoHostSeg *hs, void *base, size_t size)
{
    hs->base = base;
    hs->size = size;
    hs->hdr = base;
    hs->lines = (hsLine *)((char *)base + HS_PAGE);
    hs->data = (char *)base + HS_PAGE + lines_bytes(hs->n);
}

static uint64_t pidns_inode(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

static void make_token(const struct ncclComm *comm, uint8_t out[32])
{
    char msg[64];
    int len = snprintf(msg, sizeof(msg), "geoccl host segment %016llx",
                       (unsigned long long)comm->comm_hash);
    geoHmacSha256(comm->secret, sizeof(comm->secret), msg, (size_t)len, out);
}

/* What rank 0 tells the others. */
typedef struct {
    int64_t pid;
    int64_t fd;                 /* -1: rank 0 has no segment to offer */
    uint64_t pidns;             /* rank 0's pid namespace: pid means nothing in another */
} hsOffer;

/* Rank 0: a sealed memfd with the header written; fd and mapping kept. */
static int create_segment(struct ncclComm *comm, geoHostSeg *hs, int *fd_out)
{
    int fd = memfd_create("geoccl-host", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    if (ftruncate(fd, (off_t)hs->size) != 0 ||
        fcntl(fd, F_ADD_SEALS, HS_SEALS | F_SEAL_SEAL) != 0) {
        close(fd);
        return -1;
    }
    void *p = mmap(NULL, hs->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return -1;
    }
    hsViews(hs, p, hs->size);
    hsHeader *h = hs->hdr;
    h->magic = HS_MAGIC;
    h->nranks = (uint64_t)hs->n;
    h->slot = hs->slot;
    h->size = hs->size;
    make_token(comm, h->token);
    *fd_out = fd;
    return 0;
}

/* The others: open rank 0's memfd through /proc and check it before use. */
static int attach_segment(struct ncclComm *comm, geoHostSeg *hs, const hsOffer *o)
{
    char path[64];
    struct stat sb;
    uint8_t token[32];
    /* pid and descriptor come from rank 0: in this pid namespace, in range,
     * and what they name a plain file (no tty or device opened by mistake) */
    if (o->pidns != hs->pidns || o->pid <= 0 || o->pid > INT32_MAX || o->fd < 0 ||
        o->fd > INT32_MAX) {
        errno = ESRCH;
        return -1;
    }
    snprintf(path, sizeof(path), "/proc/%lld/fd/%lld", (long long)o->pid, (long long)o->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return -1;
    /* The size must not change under the mapping (a SIGBUS otherwise). */
    int seals = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? fcntl(fd, F_GET_SEALS) : -1;
    if (seals < 0 || (seals & HS_SEALS) != HS_SEALS || (uint64_t)sb.st_size != hs->size) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    void *p = mmap(NULL, hs->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return -1;
    hsViews(hs, p, hs->size);
    const hsHeader *h = hs->hdr;
    make_token(comm, token);
    if (h->magic != HS_MAGIC || h->nranks != (uint64_t)hs->n || h->slot != hs->slot ||
        h->size != hs->size || !geoDigestEqual(h->token, token, sizeof(token))) {
        munmap(p, hs->size);
        hs->base = NULL;
        errno = EPROTO; /* another process's memfd, or another communicator's */
        return -1;
    }
    return 0;
}

/* Binomial tree from rank 0 over the transport: down (bcast) copies
 * rank 0's buf to everyone; up (!bcast) leaves in rank 0's buf the
 * minimum of everyone's int64 value. */
static ncclResult_t tree(struct ncclComm *comm, void *buf, size_t len, int bcast)
{
    const int n = comm->nranks, me = comm->rank;
    int64_t in;
    geoNetRequest req;
    int mask = 1;
    if (bcast) {
        while (mask < n) {
            if (me & mask) {
                GEO_CHECK(geoNetIrecv(&comm->net, me - mask, buf, len, &req));
                GEO_CHECK(geoNetWait(&comm->net, &req));
                break;
            }
            mask <<= 1;
        }
        for (mask >>= 1; mask > 0; mask >>= 1)
            if (me + mask < n) {
                GEO_CHECK(geoNetIsendCtl(&comm->net, me + mask, buf, len, &req));
                GEO_CHECK(geoNetWait(&comm->net, &req));
            }
        return ncclSuccess;
    }
    for (; mask < n; mask <<= 1) {
        if (me & mask) {
            GEO_CHECK(geoNetIsendCtl(&comm->net, me - mask, buf, len, &req));
            return geoNetWait(&comm->net, &req);
        }
        if (me + mask < n) {
            GEO_CHECK(geoNetIrecv(&comm->net, me + mask, &in, sizeof(in), &req));
            GEO_CHECK(geoNetWait(&comm->net, &req));
            if (in < *(int64_t *)buf)
                *(int64_t *)buf = in;
        }
    }
    return ncclSuccess;
}

/* All ranks on this host, in one region, with the fast path on (the same
 * answer on every rank: from the bootstrap table alone). */
static int one_host(const struct ncclComm *comm)
{
    if (comm->nranks < 2 || comm->nranks > HS_MAX_RANKS || comm->regions.nregions > 1)
        return 0;
    const geoLocalInfo *me = &comm->peers[comm->rank].net.local;
    for (int r = 0; r < comm->nranks; r++)
        if (r != comm->rank && !geoLocalSamePlace(me, &comm->peers[r].net.local))
            return 0;
    return 1;
}

static void hs_unmap(geoHostSeg *hs)
{
    if (hs->base != NULL)
        munmap(hs->base, hs->size);
    free(hs);
}

void geoHostSegFree(struct ncclComm *comm, int abort)
{
    if (comm->hostseg != NULL && abort)
        hsBreak(comm->hostseg, comm->hostseg->me, HS_LEFT);
    if (comm->hostseg != NULL)
        hs_unmap(comm->hostseg);
    comm->hostseg = NULL;
}

ncclResult_t geoHostSegSetup(struct ncclComm *comm)
{
    comm->hostseg = NULL;
    if (!one_host(comm))
        return ncclSuccess;
    geoHostSeg *hs = calloc(1, sizeof(*hs));
    if (hs == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for the host segment");
    hs->n = comm->nranks;
    hs->me = comm->rank;
    hs->slot = hsSlotBytes(hs->n);
    hs->size = hsSegmentSize(hs->n, hs->slot);
    hs->pidns = pidns_inode();

    int fd = -1, why = 0;
    hsOffer offer = {.pid = getpid(), .fd = -1, .pidns = hs->pidns};
    /* The vote is this rank's GEOCCL_HOST_COLL (0 off, 1 auto, 2 always),
     * 0 where it cannot map the segment; the least of the votes holds, so
     * rank 0 voting 0 makes no segment. */
    int64_t mode = geoParamInt(GEO_PARAM_HOST_COLL);
    if (comm->rank == 0 && mode > 0) {
        if (create_segment(comm, hs, &fd) == 0)
            offer.fd = fd;
        else
            why = errno;
    }
    ncclResult_t res = tree(comm, &offer, sizeof(offer), 1);
    if (res != ncclSuccess) {
        if (fd >= 0)
            close(fd);
        goto fail;
    }
    int64_t vote = offer.fd < 0 ? 0 : mode < 0 ? 0 : mode > 2 ? 2 : mode;
    if (vote && comm->rank != 0 && attach_segment(comm, hs, &offer) != 0) {
        why = errno;
        vote = 0;
    }
    if (hs->base != NULL) {
        hsLine *l = &hs->lines[hs->me];
        l->pid = (int32_t)getpid();
        l->pidns = hs->pidns;
    }
    res = tree(comm, &vote, sizeof(vote), 0);
    if (res == ncclSuccess)
        res = tree(comm, &vote, sizeof(vote), 1);
    if (fd >= 0)
        close(fd);
    if (res != ncclSuccess)
        goto fail;
    if (!vote) {
        if (why != 0)
            geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "host segment: not used: %s rank 0's memfd "
                    "(pid %lld, descriptor %lld) failed here (%s)",
                    comm->rank == 0 ? "creating" : "opening", (long long)offer.pid,
                    (long long)offer.fd, strerror(why));
        else
            geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "host segment: not used (GEOCCL_HOST_COLL=0 "
                    "here, or another rank could not map it: its log says why)");
        hs_unmap(hs);
        return ncclSuccess;
    }
    hs->mode = (int)vote;
    comm->hostseg = hs;
    res = hsCalibrate(comm, hs);
    if (res != ncclSuccess)
        goto fail;
    return ncclSuccess;
fail:
    comm->hostseg = NULL;
    if (hs->base != NULL) /* ranks in a calibration phase stop waiting for us */
        hsBreak(hs, hs->me, HS_LEFT);
    hs_unmap(hs);
    return res;
}
