/* Single-copy reads between same-host ranks of a region (cma.h). */
#define _GNU_SOURCE
#include "config.h"
#include "comm/coll/cma.h"
#include "comm/base/checks.h"
#include "comm/core/comm.h"
#include "comm/base/param.h"
#include "comm/transport/transport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <unistd.h>

/* What a rank tells the others of its region at set-up. */
typedef struct {
    int64_t pid;
    uint64_t addr;              /* of its token */
    uint8_t token[16];
} cmaHello;

/* Send sbuf (sbytes) to every other rank of my region and receive into
 * rbuf + j * rbytes from local rank j; wait for all.  A pair with a
 * mailbox (transport.h: same host, shared memory) uses it when the message
 * fits: this is how a region's ranks signal each other, and the mailbox
 * wakes the waiting thread itself, where a message passes through both
 * ends' progress threads: a hierarchical 64 KiB all-reduce of 2 x 4 ranks
 * on loopback took about half the time through the mailboxes. */
static ncclResult_t region_exchange(struct ncclComm *comm, const void *sbuf, size_t sbytes,
                                    void *rbuf, size_t rbytes)
{
    const geoRing *ring = &comm->region_ring;
    const geoNetTransport *t = comm->net.ops;
    geoNetRequest *req = calloc(2 * (size_t)ring->n, sizeof(*req));
    char *mail = calloc((size_t)ring->n, 1);
    ncclResult_t res = ncclSuccess;
    if (req == NULL || mail == NULL) {
        free(req);
        free(mail);
        return GEO_COMM_ERR(comm, ncclSystemError, "out of memory exchanging with %d local ranks",
                            ring->n);
    }
    for (int k = 1; k < ring->n && res == ncclSuccess; k++) {
        int j = (ring->me + k) % ring->n;
        mail[j] = t->mail != NULL && sbytes == rbytes && sbytes <= GEO_NET_MAIL_BYTES &&
                  t->hasMailbox(comm->net.state, ring->ranks[j]);
        if (mail[j])
            continue;
        res = geoNetIrecv(&comm->net, ring->ranks[j], (char *)rbuf + (size_t)j * rbytes, rbytes,
                          &req[2 * j]);
        if (res == ncclSuccess)
            res = geoNetIsendCtl(&comm->net, ring->ranks[j], sbuf, sbytes, &req[2 * j + 1]);
    }
    for (int send = 1; send >= 0; send--)
        for (int k = 1; k < ring->n && res == ncclSuccess; k++) {
            int j = (ring->me + k) % ring->n;
            if (mail[j])
                res = t->mail(comm->net.state, ring->ranks[j],
                              send ? (void *)sbuf : (char *)rbuf + (size_t)j * rbytes, sbytes,
                              send);
        }
    for (int i = 0; i < 2 * ring->n && res == ncclSuccess; i++)
        if (!mail[i / 2])
            res = geoNetWait(&comm->net, &req[i]);
    if (res != ncclSuccess)
        geoNetBreak(&comm->net); /* requests in flight point at our buffers */
    free(req);
    free(mail);
    return res;
}

ncclResult_t geoCmaSetup(struct ncclComm *comm)
{
    const geoRing *ring = &comm->region_ring;
    const int n = ring->n, me = ring->me;
    comm->cma = 0;
    if (n < 2 || (comm->connect_want != NULL && n > GEO_CMA_LAZY_MAX_RANKS))
        return ncclSuccess;
    /* Decided from what every rank knows alike: no message unless all of
     * the region is on my host. */
    for (int i = 0; i < n; i++)
        if (strcmp(comm->peers[ring->ranks[i]].net.host, comm->peers[comm->rank].net.host) != 0)
            return ncclSuccess;

    cmaHello mine = {.pid = getpid(), .addr = (uint64_t)(uintptr_t)comm->cma_token};
    /* Without getrandom (unlikely), pid and address still tell processes apart. */
    if (getrandom(comm->cma_token, sizeof(comm->cma_token), 0) != (ssize_t)sizeof(comm->cma_token))
        for (size_t i = 0; i < sizeof(comm->cma_token); i++)
            comm->cma_token[i] = (uint8_t)(((uint64_t)mine.pid ^ mine.addr) >> (8 * (i % 8)));
    memcpy(mine.token, comm->cma_token, sizeof(mine.token));
    cmaHello *all = calloc((size_t)n, sizeof(*all));
    int64_t *ok = calloc((size_t)n, sizeof(*ok));
    ncclResult_t res = ncclSuccess;
    if (all == NULL || ok == NULL) {
        res = GEO_COMM_ERR(comm, ncclSystemError, "init: out of memory for %d local ranks", n);
        goto out;
    }
    GEO_CHECK_GOTO(region_exchange(comm, &mine, sizeof(mine), all, sizeof(*all)), res, out);
    /* My verdict: I read every other rank's token where it said.  A rank
     * with GEOCCL_CMA=0 still takes part (the others cannot know) and
     * votes no. */
    const int wanted = geoParamInt(GEO_PARAM_CMA) != 0;
    int64_t verdict = wanted;
    int bad = -1, bad_errno = 0;
    for (int j = 0; j < n && verdict; j++) {
        if (j == me)
            continue;
        /* The pid comes from the kernel (SO_PEERCRED on the pair's
         * same-host socket), never from what the peer said: a peer that
         * named another process, or ours, would have us read and write at
         * addresses it chose in that process. */
        geoPeerInfo *pj = &comm->peers[ring->ranks[j]];
        int vouched = comm->net.ops->peerPid ? comm->net.ops->peerPid(comm->net.state,
                                                                      ring->ranks[j])
                                             : 0;
        /* Claiming to be us while the kernel names another process is the
         * attack; ranks that are threads of this one process (kernel and
         * table agree it is us) read their own memory. */
        if (pj->pid == (int32_t)getpid() && vouched != getpid()) {
            geoWarn(GEO_LOG_INIT, "single-copy: rank %d claims this process's own pid, but the "
                    "kernel says it is pid %d: refused", ring->ranks[j], vouched);
            verdict = 0;
            bad = ring->ranks[j];
            break;
        }
        if (vouched == 0) {
            geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "single-copy: rank %d has no same-host socket "
                    "with us (GEOCCL_SHM=0?), so the kernel cannot vouch for its pid; not "
                    "used", ring->ranks[j]);
            verdict = 0;
            bad = ring->ranks[j];
            break;
        }
        if (vouched != pj->pid)
            geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "single-copy: rank %d said pid %d, the kernel "
                    "says %d: using the kernel's", ring->ranks[j], (int)pj->pid, vouched);
        pj->pid = vouched;
        all[j].pid = vouched;
        uint8_t got[16];
        struct iovec li = {got, sizeof(got)};
        struct iovec ri = {(void *)(uintptr_t)all[j].addr, sizeof(got)};
        errno = 0;
        ssize_t r = process_vm_readv((pid_t)all[j].pid, &li, 1, &ri, 1, 0);
        if (r != (ssize_t)sizeof(got) || memcmp(got, all[j].token, sizeof(got)) != 0) {
            verdict = 0;
            bad = ring->ranks[j];
            bad_errno = r < 0 ? errno : 0;
        }
    }
    free(comm->cma_peer_buf);
    comm->cma_peer_buf = calloc(3 * (size_t)n, sizeof(*comm->cma_peer_buf));
    if (comm->cma_peer_buf == NULL)
        verdict = 0; /* told to the others like a failed read */
    GEO_CHECK_GOTO(region_exchange(comm, &verdict, sizeof(verdict), ok, sizeof(*ok)), res, out);
    ok[me] = verdict;
    int all_ok = 1;
    for (int j = 0; j < n; j++)
        all_ok &= ok[j] != 0;
    comm->cma = all_ok;
    const int g = comm->regions.region_of[comm->rank];
    if (all_ok)
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "region %d: its %d ranks read each other's inputs and "
                "write each other's outputs directly (process_vm_readv/writev; GEOCCL_CMA=0 turns "
                "it off)", g, n);
    else if (!wanted)
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "region %d: no single-copy transfers (GEOCCL_CMA=0 "
                "here)", g);
    else if (!verdict)
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "region %d: no single-copy transfers between its "
                "ranks: rank %d could not read rank %d's memory (%s); the ring carries the data", g,
                comm->rank, bad, bad < 0 ? "out of memory" : bad_errno ? strerror(bad_errno)
                                                                       : "another process answered");
    else
        geoInfo(GEO_LOG_INIT | GEO_LOG_NET, "region %d: no single-copy transfers: another rank of "
                "the region could not read (its log says why) or has GEOCCL_CMA=0", g);
out:
    free(all);
    free(ok);
    return res;
}

/* 1 when process_vm_readv can read this process's [p, p + bytes) (and,
 * with write, process_vm_writev can write it): its first and last byte.
 * Not every mapping can be reached that way, though the process itself
 * reads and writes it: secret memory (memfd_secret), or memory that a
 * device driver mapped (VM_IO, VM_PFNMAP), fail with EFAULT.  The write
 * puts back the byte just read, before any other rank knows the address. */
static int self_reachable(const void *p, size_t bytes, int write)
{
    if (bytes == 0)
        return 1;
    char *at[2] = {(char *)p, (char *)p + bytes - 1};
    for (int i = 0; i < 2; i++) {
        char b;
        struct iovec li = {&b, 1};
        struct iovec ri = {at[i], 1};
        if (process_vm_readv(getpid(), &li, 1, &ri, 1, 0) != 1 ||
            (write && process_vm_writev(getpid(), &li, 1, &ri, 1, 0) != 1))
            return 0;
    }
    return 1;
}

ncclResult_t geoCmaExchange(struct ncclComm *comm, const void *send, const void *recv,
                            size_t bytes, int *use)
{
    const int me = comm->region_ring.me, n = comm->region_ring.n;
    uint64_t a[3] = {(uint64_t)(uintptr_t)send, (uint64_t)(uintptr_t)recv,
                     (uint64_t)(self_reachable(send, bytes, 0) && self_reachable(recv, bytes, 1))};
    uint64_t *all = comm->cma_peer_buf;
    memcpy(all + 3 * me, a, sizeof(a));
    *use = 0;
    GEO_CHECK(region_exchange(comm, a, sizeof(a), all, sizeof(a)));
    int who = -1; /* the first rank whose buffers cannot be read */
    for (int j = 0; j < n && who < 0; j++)
        if (!all[3 * j + 2])
            who = comm->region_ring.ranks[j];
    *use = who < 0;
    if (who >= 0 && !comm->cma_refused_noted) {
        comm->cma_refused_noted = 1;
        geoInfo(GEO_LOG_COLL | GEO_LOG_NET, "%s: rank %d's buffers cannot be reached with "
                "process_vm_readv/writev (secret memory, or memory a device driver mapped); such calls "
                "pass them round the region's ring", geoErrOp(&comm->err), who);
    }
    return ncclSuccess;
}

ncclResult_t geoCmaSignal(struct ncclComm *comm, uint64_t token)
{
    const geoRing *ring = &comm->region_ring;
    uint64_t *got = calloc((size_t)ring->n, sizeof(*got));
    if (got == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory", geoErrOp(&comm->err));
    got[ring->me] = token;
    ncclResult_t res = region_exchange(comm, &token, sizeof(token), got, sizeof(*got));
    for (int j = 0; j < ring->n && res == ncclSuccess; j++)
        if (got[j] != token) {
            res = GEO_COMM_ERR(comm, ncclInternalError,
                               "%s: rank %d (host %s) is out of step: signal %llu where %llu "
                               "was due", geoErrOp(&comm->err), ring->ranks[j],
                               comm->peers[ring->ranks[j]].net.host, (unsigned long long)got[j],
                               (unsigned long long)token);
            geoNetBreak(&comm->net);
        }
    free(got);
    return res;
}

/* process_vm_readv (write 0) or process_vm_writev (1) of bytes between my
 * local and remote in global rank peer's memory, to the last byte. */
static ncclResult_t cma_copy(struct ncclComm *comm, int peer, void *local, uint64_t remote,
                             size_t bytes, int write)
{
    size_t done = 0;
    while (done < bytes) {
        struct iovec li = {(char *)local + done, bytes - done};
        struct iovec ri = {(void *)(uintptr_t)(remote + done), bytes - done};
        const pid_t pid = (pid_t)comm->peers[peer].pid;
        ssize_t r = write ? process_vm_writev(pid, &li, 1, &ri, 1, 0)
                          : process_vm_readv(pid, &li, 1, &ri, 1, 0);
        if (r > 0) {
            done += (size_t)r;
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        int e = r < 0 ? errno : EIO;
        return GEO_COMM_ERR(comm, e == ESRCH ? ncclRemoteError : ncclSystemError,
                            "%s: %s rank %d's buffer (host %s, pid %d): %s%s",
                            geoErrOp(&comm->err), write ? "writing into" : "reading", peer,
                            comm->peers[peer].net.host, (int)pid, strerror(e),
                            e == ESRCH ? " (the process is gone)" : "");
    }
    comm->net.sent.intra += bytes;
    return ncclSuccess;
}

ncclResult_t geoCmaRead(struct ncclComm *comm, int peer, void *dst, uint64_t src, size_t bytes)
{
    return cma_copy(comm, peer, dst, src, bytes, 0);
}

ncclResult_t geoCmaWrite(struct ncclComm *comm, int peer, uint64_t dst, const void *src,
                         size_t bytes)
{
    return cma_copy(comm, peer, (void *)src, dst, bytes, 1);
}
