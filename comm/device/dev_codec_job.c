/* The cross-region all-reduce, encoded on the GPU: its layout and the
 * exchange thread's schedule (the stream program is dev_codec_stream.c's).
 *
 * When a float32 call is compressed with a codec the GPU implements (every
 * codec but lossless), or is an uncompressed float32 sum or average (codec
 * none: a chunk is a copy with a header), the shard does not go to the
 * host whole (GEOCCL_CUDA_CODECS=0 turns this off): the stream encodes it
 * with the kernels of cuda/ (error feedback residuals in device memory),
 * copies only the chunks to pinned memory, and the exchange thread moves
 * them.  The messages are those of
 * the host exchange (geoHierExchangePlan), each cut in sub-chunks of E
 * elements; sub-chunk c of every message forms round c.  GPU chunks have
 * exact sizes, so every buffer is laid out before anything runs, the same
 * offsets in device and host staging, a round's chunks of one kind
 * contiguous (one copy each way).
 *
 * On the user's stream, in this order:
 *   NCCL reduce-scatter into my shard
 *   for each round c: encode its first-trip sub-chunks (residual of trip
 *       1), copy them to the host, record tx1[c]
 *   for each round c: wait until flag >= base + 1 + c (round c of the other
 *       regions' partials is on the host), copy it in, decode-accumulate
 *       each onto my region's partial of my part (the other regions in
 *       ascending order), divide (avg),
 *       encode the finished part (residual of trip 2), decode that chunk
 *       back into my part (so every region holds the very same bits),
 *       copy the chunks out, record tx2[c]
 *   for each round c: wait until flag >= base + 1 + C + c, copy the other
 *       regions' finished parts in, decode them into place
 *   copy the decoders' status words out, record end, free the device
 *   staging (stream-ordered)
 *   NCCL all-gather
 * The exchange thread runs one fixed schedule that every rank shares, so
 * each peer pair posts its messages in the same order (transport.h):
 *   it = 0 .. C + D - 1:
 *     it < C:  wait tx1[it]; post round it's first-trip sends and receives
 *     it >= D: r = it - D: wait round r's first-trip receives, release the
 *              stream (flag = base + 1 + r), wait tx2[r], post round r's
 *              return-trip sends and receives
 *   then, round by round: wait the return trip, release the stream
 *   then: wait end, read the status words: a corrupt chunk fails the
 *   communicator (ncclCommGetAsyncError), as a failed kernel does in NCCL.
 * The WAN carries round c while the GPU encodes round c + 1, and the return
 * trip of round r overlaps the first trip of the rounds after it.  Kernels
 * and copies share the user's stream; beside a WAN transfer they are short.
 *
 * The job is queued to the exchange thread before its stream program is
 * enqueued: the user thread may block on a full launch queue behind a wait
 * that only the exchange thread releases.  An event not yet recorded reads
 * as complete, so the exchange thread first waits for the user thread to
 * have recorded it (devCodecJob.recorded).  If enqueuing fails half-way,
 * the flag is raised past the job's values, so no stream waits forever,
 * the all-gather is still enqueued (region peers are in it) and the
 * communicator is failed.
 *
 * Numbers: the sum starts from my region's partial (the host path sums in
 * region order), and codecs scale (int8, int4, sign) and select (topk) per
 * sub-chunk of E elements rather than per message, so the GPU and host
 * paths may differ in the last bits; every rank still ends bit-identical.
 * Both sides of a pair must take the same path: GEOCCL_CUDA_CODECS must be
 * the same on every rank (a mismatch shows as chunks of unexpected size).
 */
#include "config.h"

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

#include "cuda/codec_kernels.h"

#include <stdlib.h>
#include <string.h>

#define CODEC_PIPELINE_DEPTH 2

static void free_rounds(devCodecRounds *l)
{
    free(l->m);
    free(l->first);
    memset(l, 0, sizeof(*l));
}

void devCodecJobFree(devCodecJob *cj)
{
    if (cj == NULL)
        return;
    geoHierExchangePlanFree(&cj->plan);
    free_rounds(&cj->tx1);
    free_rounds(&cj->rx1);
    free_rounds(&cj->tx2);
    free_rounds(&cj->rx2);
    for (int i = 0; i < cj->nev; i++)
        cudaEventDestroy(cj->ev[i]); /* pending ones are released when done */
    free(cj->ev);
    free(cj);
}

/* The sub-chunks of msgs, round-major, their chunks laid out from *at.
 * group > 1: messages come in runs of group that carry one chunk (the
 * return trip sends a part to each other region): only the first of a run
 * gets room. */
static ncclResult_t lay_out_rounds(devCodecRounds *l, const hierXferMsg *msgs, int nmsgs, int rounds,
                                   size_t E, int codec, const geoCodecParams *p, int group,
                                   size_t *at, int *nstatus)
{
    size_t cnt = 0;
    for (int i = 0; i < nmsgs; i++)
        cnt += (msgs[i].n + E - 1) / E;
    l->m = calloc(cnt + 1, sizeof(devCodecChunk));
    l->first = calloc((size_t)rounds + 1, sizeof(int));
    if (l->m == NULL || l->first == NULL)
        return ncclSystemError;
    int k = 0;
    for (int c = 0; c < rounds; c++) {
        l->first[c] = k;
        for (int i = 0; i < nmsgs; i++) {
            size_t o = (size_t)c * E;
            if (o >= msgs[i].n)
                continue;
            devCodecChunk *x = &l->m[k++];
            x->peer = msgs[i].peer;
            x->msg = i;
            x->off = msgs[i].off + o;
            x->n = msgs[i].n - o < E ? msgs[i].n - o : E;
            x->status = nstatus ? (*nstatus)++ : -1;
            if (group > 1 && i % group != 0) {
                /* the run's first message is the one before (same n) */
                x->at = l->m[k - 2].at;
                x->len = l->m[k - 2].len;
                continue;
            }
            x->len = geoCudaCodecEncodedSize((geoCodecId)codec, x->n, ncclFloat32, p);
            if (x->len == 0)
                return ncclInvalidArgument;
            x->at = *at;
            *at = devStageAlign(*at + x->len);
        }
    }
    l->first[rounds] = k;
    l->n = k;
    return ncclSuccess;
}

/* Lay out one job: sub-chunks, staging offsets, status words, events. */
ncclResult_t devCodecPrepare(struct ncclComm *comm, const geoOp *op,
                             const geoHierCodecChoice *ch, size_t chunk, devCodecJob **out)
{
    devCodecJob *cj = calloc(1, sizeof(*cj));
    ncclResult_t r;
    *out = NULL;
    if (cj == NULL)
        goto oom;
    cj->ch = *ch;
    GEO_CHECK_GOTO(geoHierExchangePlan(comm, op->count, &cj->plan), r, fail);
    cj->E = (chunk ? chunk : comm->hier_slice) / sizeof(float);
    if (cj->E < 1024)
        cj->E = 1024;
    const hierXferMsg *lists[4] = {cj->plan.tx1, cj->plan.rx1, cj->plan.tx2, cj->plan.rx2};
    const int ns[4] = {cj->plan.ntx1, cj->plan.nrx1, cj->plan.ntx2, cj->plan.nrx2};
    size_t maxn = 0;
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < ns[l]; i++)
            if (lists[l][i].n > maxn)
                maxn = lists[l][i].n;
    cj->rounds = (int)((maxn + cj->E - 1) / cj->E);
    if (cj->rounds == 0) {
        *out = cj; /* nothing crosses the WAN from or to this rank */
        return ncclSuccess;
    }
    const int k1 = comm->regions.nregions - 1;
    size_t at = 0;
    if ((r = lay_out_rounds(&cj->tx1, cj->plan.tx1, cj->plan.ntx1, cj->rounds, cj->E, ch->codec,
                            &ch->p1, 1, &at, NULL)) != ncclSuccess ||
        (r = lay_out_rounds(&cj->rx1, cj->plan.rx1, cj->plan.nrx1, cj->rounds, cj->E, ch->codec,
                            &ch->p1, 1, &at, &cj->nstatus)) != ncclSuccess ||
        (r = lay_out_rounds(&cj->tx2, cj->plan.tx2, cj->plan.ntx2, cj->rounds, cj->E, ch->codec,
                            &ch->p2, k1, &at, &cj->nstatus)) != ncclSuccess ||
        (r = lay_out_rounds(&cj->rx2, cj->plan.rx2, cj->plan.nrx2, cj->rounds, cj->E, ch->codec,
                            &ch->p2, 1, &at, &cj->nstatus)) != ncclSuccess) {
        if (r == ncclSystemError)
            goto oom;
        goto fail; /* ncclInvalidArgument: the caller falls back, unreported */
    }
    size_t s1 = geoCudaCodecScratchBytes((geoCodecId)ch->codec, cj->E, &ch->p1);
    size_t s2 = geoCudaCodecScratchBytes((geoCodecId)ch->codec, cj->E, &ch->p2);
    cj->scratch_bytes = s1 > s2 ? s1 : s2;
    cj->scratch_at = at;
    at = devStageAlign(at + cj->scratch_bytes);
    cj->status_at = at;
    cj->bytes = at + (size_t)cj->nstatus * sizeof(int) + 1;
    cj->nev = 2 * cj->rounds + 1;
    cj->ev = calloc((size_t)cj->nev, sizeof(cudaEvent_t));
    if (cj->ev == NULL)
        goto oom;
    for (int i = 0; i < cj->nev; i++) {
        cudaError_t e = cudaEventCreateWithFlags(&cj->ev[i], cudaEventDisableTiming);
        if (e != cudaSuccess) {
            cj->nev = i;
            r = devCudaError(comm, "cudaEventCreate", e);
            goto fail;
        }
    }
    *out = cj;
    return ncclSuccess;
oom:
    r = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory laying out the compressed exchange",
                     geoErrOp(&comm->err));
fail:
    if (r == ncclSuccess)
        r = ncclInternalError;
    devCodecJobFree(cj);
    return r;
}

/* Post round c of list l (sends or receives). */
static ncclResult_t post_round(struct ncclComm *comm, devCodecJob *cj, devCodecRounds *l, int c,
                               int send)
{
    for (int i = l->first[c]; i < l->first[c + 1]; i++) {
        devCodecChunk *x = &l->m[i];
        if (send) {
            GEO_CHECK(geoNetIsendV(&comm->net, x->peer, cj->host + x->at, x->len, &x->req));
            comm->net.sent.wan_raw += x->n * sizeof(float);
        } else {
            GEO_CHECK(geoNetIrecvV(&comm->net, x->peer, cj->host + x->at, x->len, &x->req));
        }
        x->posted = 1;
    }
    return ncclSuccess;
}

/* Wait round c of l (all rounds when c < 0); receives must have the exact
 * chunk size the GPU decoder will read. */
static ncclResult_t wait_round(struct ncclComm *comm, devCodecRounds *l, int c, int recv)
{
    int a = c < 0 ? 0 : l->first[c], b = c < 0 ? l->n : l->first[c + 1];
    for (int i = a; i < b; i++) {
        devCodecChunk *x = &l->m[i];
        if (!x->posted)
            continue;
        GEO_CHECK(geoNetWait(&comm->net, &x->req));
        x->posted = 0;
        if (recv && x->req.size != x->len) {
            return GEO_COMM_ERR(comm, ncclRemoteError, "%s: rank %d (host %s) sent a compressed "
                                "chunk of %zu bytes where %zu were expected (are GEOCCL_COMPRESS "
                                "and GEOCCL_CUDA_CODECS the same on every rank?)",
                                geoErrOp(&comm->err), x->peer, comm->peers[x->peer].net.host,
                                x->req.size, x->len);
        }
    }
    return ncclSuccess;
}

/* Wait for event idx of the job: first until the user thread has recorded
 * it, then until the stream has reached it. */
static ncclResult_t wait_recorded(struct ncclComm *comm, struct geoDevState *st, devCodecJob *cj,
                                  int idx, const char *what)
{
    double t0 = geoNow();
    long backoff = 1;
    while (__atomic_load_n(&cj->recorded, __ATOMIC_ACQUIRE) <= idx) {
        if (__atomic_load_n(&cj->failed, __ATOMIC_ACQUIRE)) {
            return GEO_COMM_ERR(comm, ncclUnhandledCudaError, "%s: enqueuing the call on the "
                                "stream failed", geoErrOp(&comm->err));
        }
        if (geoErrAborted(&comm->err) || __atomic_load_n(&st->aborting, __ATOMIC_ACQUIRE)) {
            return GEO_COMM_ERR(comm, ncclInvalidUsage, "%s: aborted", geoErrOp(&comm->err));
        }
        if (geoNow() - t0 > comm->timeout) {
            return GEO_COMM_ERR(comm, ncclSystemError, "%s: the call was not enqueued within "
                                "GEOCCL_TIMEOUT=%.0f s", geoErrOp(&comm->err), comm->timeout);
        }
        devSleepUs(backoff);
        if (backoff < 200)
            backoff *= 2;
    }
    return devWaitEvent(comm, st, cj->ev[idx], what);
}

/* The exchange thread's part of a GPU-encoded job. */
ncclResult_t devCodecExchange(struct ncclComm *comm, struct geoDevState *st, devJob *j)
{
    devCodecJob *cj = j->codec_job;
    const int C = cj->rounds;
    ncclResult_t res = ncclSuccess;

    for (int it = 0; it < C + CODEC_PIPELINE_DEPTH; it++) {
        if (it < C) {
            GEO_CHECK_GOTO(wait_recorded(comm, st, cj, it, "the encoded partials"), res, out);
            if (it == 0)
                j->wan_t0 = geoNow(); /* the first data is on the host */
            GEO_CHECK_GOTO(post_round(comm, cj, &cj->tx1, it, 1), res, out);
            GEO_CHECK_GOTO(post_round(comm, cj, &cj->rx1, it, 0), res, out);
        }
        if (it >= CODEC_PIPELINE_DEPTH && it - CODEC_PIPELINE_DEPTH < C) {
            int r = it - CODEC_PIPELINE_DEPTH;
            GEO_CHECK_GOTO(wait_round(comm, &cj->rx1, r, 1), res, out);
            devFlagRelease(st, cj->base + 1 + (uint32_t)r);
            GEO_CHECK_GOTO(wait_recorded(comm, st, cj, C + r, "the encoded reduced parts"), res,
                           out);
            GEO_CHECK_GOTO(post_round(comm, cj, &cj->tx2, r, 1), res, out);
            GEO_CHECK_GOTO(post_round(comm, cj, &cj->rx2, r, 0), res, out);
        }
    }
    for (int r = 0; r < C; r++) {
        GEO_CHECK_GOTO(wait_round(comm, &cj->rx2, r, 1), res, out);
        devFlagRelease(st, cj->base + 1 + (uint32_t)(C + r));
    }
    GEO_CHECK_GOTO(wait_round(comm, &cj->tx1, -1, 0), res, out);
    GEO_CHECK_GOTO(wait_round(comm, &cj->tx2, -1, 0), res, out);
    j->wan_t1 = geoNow(); /* the last transfer is done */
    GEO_CHECK_GOTO(wait_recorded(comm, st, cj, 2 * C, "the decoders"), res, out);
    const int *status = (const int *)(cj->host + cj->status_at);
    const devCodecRounds *lists[3] = {&cj->rx1, &cj->tx2, &cj->rx2};
    for (int l = 0; l < 3; l++)
        for (int i = 0; i < lists[l]->n; i++) {
            const devCodecChunk *x = &lists[l]->m[i];
            int v = x->status >= 0 ? status[x->status] : 0;
            if (v != GEO_CUDA_DECODE_OK) {
                res = GEO_COMM_ERR(comm, ncclRemoteError, "%s: a corrupt compressed chunk %s rank "
                                   "%d (host %s): %s", geoErrOp(&comm->err),
                                   l == 1 ? "of ours, for" : "from", x->peer,
                                   comm->peers[x->peer].net.host, geoCudaDecodeStatusString(v));
                goto out;
            }
        }
out:
    if (res != ncclSuccess)
        geoNetBreak(&comm->net); /* posted requests must not outlive the job */
    return res;
}
#endif
