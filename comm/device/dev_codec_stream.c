/* The cross-region all-reduce with the GPU codecs, on the user's stream
 * (the design is at the top of dev_codec_job.c): the reduce-scatter, the
 * encode and decode kernels round by round between waits on the flag, the
 * copies to and from pinned staging, the residuals of my shard, the
 * all-gather; and what a failure half-way must still enqueue. */
#include "config.h"

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

#include "comm/coll/reduce.h"
#include "cuda/codec_kernels.h"

#include <stdlib.h>

/* One copy of the chunks of l's round c between device and host staging. */
static ncclResult_t copy_round(struct ncclComm *comm, devCodecJob *cj, const devCodecRounds *l,
                               int c, int d2h, cudaStream_t s)
{
    int a = l->first[c], b = l->first[c + 1];
    if (a == b)
        return ncclSuccess;
    size_t lo = l->m[a].at, hi = l->m[b - 1].at + l->m[b - 1].len;
    cudaError_t e = d2h ? cudaMemcpyAsync(cj->host + lo, cj->dbuf + lo, hi - lo,
                                          cudaMemcpyDeviceToHost, s)
                        : cudaMemcpyAsync(cj->dbuf + lo, cj->host + lo, hi - lo,
                                          cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess)
        return devCudaError(comm, d2h ? "copying chunks to the host" : "copying chunks to the GPU",
                            e);
    return ncclSuccess;
}

/* A codec kernel failed to launch: report it on comm with the file:line of
 * the step (kernel_error) and return r. */
static ncclResult_t kernel_error_at(struct ncclComm *comm, const char *file, int line,
                                    const char *what, ncclResult_t r, const char *why)
{
    return geoErrReport(&comm->err, r, file, line, "%s: %s on the GPU failed: %s",
                        geoErrOp(&comm->err), what, why ? why : "no detail");
}
#define kernel_error(comm, what, r, why) \
    kernel_error_at((comm), __FILE__, __LINE__, (what), (r), (why))

/* Enqueue everything between the reduce-scatter and the all-gather (see
 * the top of dev_codec_job.c).  mine: my shard on the device, elements [off,
 * off + len) of the call; ef1, ef2: its residuals or NULL; tc: its phase
 * timing or NULL (decoding our own chunk back is part of encoding it). */
static ncclResult_t enqueue_program(struct ncclComm *comm, struct geoDevState *st,
                                    devCodecJob *cj, const geoOp *op, char *mine, size_t off,
                                    float *ef1, float *ef2, devTimedCall *tc, cudaStream_t s)
{
    const int C = cj->rounds, k1 = comm->regions.nregions - 1;
    const geoCodecId codec = (geoCodecId)cj->ch.codec;
    const size_t E = cj->E;
    int *status = (int *)(cj->dbuf + cj->status_at);
    void *scratch = cj->scratch_bytes ? cj->dbuf + cj->scratch_at : NULL;
    const char *why = NULL;
    size_t written;
    ncclResult_t r;
#define SHARD_AT(o) ((float *)(mine + ((o) - off) * sizeof(float)))

    devTimingPhase(st, tc, DEV_PH_OTHER, s);
    if (cj->nstatus > 0)
        CUDA_CHECK(comm, cudaMemsetAsync(status, 0, (size_t)cj->nstatus * sizeof(int), s),
                   "clearing the decoders' status words");
    for (int c = 0; c < C; c++) {
        devTimingPhase(st, tc, DEV_PH_ENCODE, s);
        for (int i = cj->tx1.first[c]; i < cj->tx1.first[c + 1]; i++) {
            devCodecChunk *x = &cj->tx1.m[i];
            r = geoCudaCodecEncode(codec, SHARD_AT(x->off), x->n, ncclFloat32, &cj->ch.p1,
                                   cj->ch.counter + 2 * x->off, ef1 ? ef1 + (x->off - off) : NULL,
                                   cj->dbuf + x->at, x->len, scratch, cj->scratch_bytes, s,
                                   &written, &why);
            if (r != ncclSuccess)
                return kernel_error(comm, "encoding a partial", r, why);
        }
        devTimingPhase(st, tc, DEV_PH_COPYOUT, s);
        GEO_CHECK(copy_round(comm, cj, &cj->tx1, c, 1, s));
        CUDA_CHECK(comm, cudaEventRecord(cj->ev[c], s), "cudaEventRecord");
        __atomic_add_fetch(&cj->recorded, 1, __ATOMIC_RELEASE);
    }
    for (int c = 0; c < C; c++) {
        devTimingPhase(st, tc, DEV_PH_WAN, s);
        GEO_CHECK(devStreamWait(comm, st, s, cj->base + 1 + (uint32_t)c));
        devTimingPhase(st, tc, DEV_PH_COPYIN, s);
        GEO_CHECK(copy_round(comm, cj, &cj->rx1, c, 0, s));
        int i = cj->rx1.first[c], t = cj->tx2.first[c];
        for (int p = 0; p < cj->plan.nparts; p++) {
            const hierXferPart *part = &cj->plan.parts[p];
            size_t o = (size_t)c * E;
            if (o >= part->n)
                continue;
            size_t m = part->n - o < E ? part->n - o : E;
            float *dst = SHARD_AT(part->off + o);
            devTimingPhase(st, tc, DEV_PH_DECODE, s);
            for (int j = 0; j < k1; j++, i++) {
                devCodecChunk *x = &cj->rx1.m[i];
                if (i >= cj->rx1.first[c + 1] || x->msg != part->first_rx + j || x->n != m) {
                    return GEO_COMM_ERR(comm, ncclInternalError, "%s: internal error: the "
                                        "exchange plan and its rounds disagree",
                                        geoErrOp(&comm->err));
                }
                r = geoCudaCodecDecodeAccumulate(codec, cj->dbuf + x->at, x->len, ncclFloat32,
                                                 dst, m, status + x->status, s, &why);
                if (r != ncclSuccess)
                    return kernel_error(comm, "decoding a partial", r, why);
            }
            if (op->op == ncclAvg &&
                (r = geoCudaDivideF32(dst, m, comm->nranks, s, &why)) != ncclSuccess)
                return kernel_error(comm, "averaging", r, why);
            devCodecChunk *x = &cj->tx2.m[t];
            if (t >= cj->tx2.first[c + 1] || x->off != part->off + o || x->n != m) {
                return GEO_COMM_ERR(comm, ncclInternalError, "%s: internal error: the return "
                                    "trip's rounds disagree with the parts", geoErrOp(&comm->err));
            }
            devTimingPhase(st, tc, DEV_PH_ENCODE, s);
            r = geoCudaCodecEncode(codec, dst, m, ncclFloat32, &cj->ch.p2,
                                   cj->ch.counter + 2 * x->off + 1,
                                   ef2 ? ef2 + (x->off - off) : NULL, cj->dbuf + x->at, x->len,
                                   scratch, cj->scratch_bytes, s, &written, &why);
            if (r != ncclSuccess)
                return kernel_error(comm, "encoding a reduced part", r, why);
            /* lossy: keep what every other region decodes (none: equal) */
            if (codec != GEO_CODEC_NONE &&
                (r = geoCudaCodecDecode(codec, cj->dbuf + x->at, x->len, ncclFloat32, dst, m,
                                        status + x->status, s, &why)) != ncclSuccess)
                return kernel_error(comm, "decoding our own chunk", r, why);
            t += k1;
        }
        devTimingPhase(st, tc, DEV_PH_COPYOUT, s);
        GEO_CHECK(copy_round(comm, cj, &cj->tx2, c, 1, s));
        CUDA_CHECK(comm, cudaEventRecord(cj->ev[C + c], s), "cudaEventRecord");
        __atomic_add_fetch(&cj->recorded, 1, __ATOMIC_RELEASE);
    }
    for (int c = 0; c < C; c++) {
        devTimingPhase(st, tc, DEV_PH_WAN, s);
        GEO_CHECK(devStreamWait(comm, st, s, cj->base + 1 + (uint32_t)(C + c)));
        devTimingPhase(st, tc, DEV_PH_COPYIN, s);
        GEO_CHECK(copy_round(comm, cj, &cj->rx2, c, 0, s));
        devTimingPhase(st, tc, DEV_PH_DECODE, s);
        for (int i = cj->rx2.first[c]; i < cj->rx2.first[c + 1]; i++) {
            devCodecChunk *x = &cj->rx2.m[i];
            r = geoCudaCodecDecode(codec, cj->dbuf + x->at, x->len, ncclFloat32, SHARD_AT(x->off),
                                   x->n, status + x->status, s, &why);
            if (r != ncclSuccess)
                return kernel_error(comm, "decoding a finished part", r, why);
        }
    }
    devTimingPhase(st, tc, DEV_PH_OTHER, s);
    if (cj->nstatus > 0)
        CUDA_CHECK(comm, cudaMemcpyAsync(cj->host + cj->status_at, status,
                                         (size_t)cj->nstatus * sizeof(int),
                                         cudaMemcpyDeviceToHost, s),
                   "copying the decoders' status words");
    CUDA_CHECK(comm, cudaEventRecord(cj->ev[2 * C], s), "cudaEventRecord");
    __atomic_add_fetch(&cj->recorded, 1, __ATOMIC_RELEASE);
#undef SHARD_AT
    return ncclSuccess;
}

/* The residuals of my shard (those the policy keeps), from the device
 * store.  Evicted ones are freed on the stream after every earlier job
 * (see dev_staging.c). */
static void shard_residuals(struct ncclComm *comm, struct geoDevState *st, const geoOp *op,
                            const geoHierCodecChoice *ch, size_t off, size_t len, float **ef1,
                            float **ef2)
{
    /* keyed by the buffer's registration and my shard's address: (buffer,
     * shard) names a bucket of it */
    const char *key = (const char *)op->recvbuff + off * sizeof(float);
    size_t evicted = 0;
    ncclResult_t r1 = ncclSuccess, r2 = ncclSuccess;
    *ef1 = *ef2 = NULL;
    if (len == 0 || (!ch->ef1 && !ch->ef2))
        return;
    if (op->ef_key == 0) {
        geoEfNoteUnregistered(comm, op->recvbuff);
        return;
    }
    st->ef_stream = op->stream;
    st->ef_stream_valid = 1;
    geoEfBeginOp(&st->ef);
    if (ch->ef1)
        r1 = geoEfGet(&st->ef, op->ef_key, key, len, 1, ef1, &evicted);
    if (ch->ef2 && r1 == ncclSuccess)
        r2 = geoEfGet(&st->ef, op->ef_key, key, len, 2, ef2, &evicted);
    st->ef_stream_valid = 0;
    if (r1 != ncclSuccess || r2 != ncclSuccess) {
        *ef1 = *ef2 = NULL;
        if (!comm->ef_full_noted) {
            comm->ef_full_noted = 1;
            geoInfo(GEO_LOG_COMPRESS, "error feedback: no device residual for a %zu-element "
                    "shard (%s; GEOCCL_EF_MAX_BYTES=%zu per store); it is compressed without "
                    "error feedback", len,
                    (r1 == ncclSystemError || r2 == ncclSystemError) ? "out of device memory"
                                                                     : "over the bound",
                    st->ef.maxBytes);
        }
    }
    if (geoEfTakeEvictionNotice(&st->ef))
        geoInfo(GEO_LOG_COMPRESS, "error feedback (device): GEOCCL_EF_MAX_BYTES=%zu reached; "
                "least recently used residuals are dropped (%llu so far)", st->ef.maxBytes,
                (unsigned long long)st->ef.evictions);
}

/* The cross-region all-reduce with the GPU codecs (see the top of
 * dev_codec_job.c); cj is laid out (devCodecPrepare) and becomes the
 * job's. */
ncclResult_t devCodecAllReduce(struct ncclComm *comm, struct geoDevState *st, geoOp *op,
                               devCodecJob *cj, devTimedCall *tc)
{
    const geoNcclRealLib *L = st->lib;
    const int n = comm->region_ring.n, me = comm->region_ring.me;
    const size_t es = sizeof(float), count = op->count;
    const size_t shard = (count + (size_t)n - 1) / (size_t)n;
    const uint32_t nvals = 2 * (uint32_t)cj->rounds;
    size_t off, len;
    cudaStream_t s = op->stream;
    ncclResult_t r = ncclSuccess, ag;
    cudaError_t ce;
    char *tmp = NULL, *work;
    const char *send;
    float *ef1 = NULL, *ef2 = NULL;
    devSlot *slot = NULL;
    devJob *j = NULL;

    geoSegPadded(count, n, me, &off, &len);
    /* Everything that can fail alone comes before the reduce-scatter, so
     * that a failure leaves no region peer waiting in NCCL. */
    if (cj->rounds > 0) {
        GEO_CHECK_GOTO(devFlagRewind(comm, st, nvals), r, fail);
        GEO_CHECK_GOTO(devSlotGet(comm, st, cj->bytes, &slot), r, fail);
        cj->host = slot->host;
        j = calloc(1, sizeof(*j));
        if (j == NULL) {
            r = GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory", geoErrOp(&comm->err));
            goto fail_slot;
        }
        if ((ce = devMalloc(st, (void **)&cj->dbuf, cj->bytes, s)) != cudaSuccess) {
            cj->dbuf = NULL;
            r = devCudaError(comm, "cudaMallocAsync of the chunk staging", ce);
            goto fail_slot;
        }
    }
    /* Jobs on different streams touch the same residuals: each waits for
     * the one before. */
    if (st->ef_ev != NULL && st->last_stream != s &&
        (ce = cudaStreamWaitEvent(s, st->ef_ev, 0)) != cudaSuccess) {
        r = devCudaError(comm, "ordering after the previous call's stream", ce);
        goto fail_dbuf;
    }
    shard_residuals(comm, st, op, &cj->ch, off, len, &ef1, &ef2);
    if (count % (size_t)n == 0) {
        send = op->sendbuff;
        work = op->recvbuff;
    } else {
        /* NCCL cuts a reduce-scatter in equal shards: pad to n * shard. */
        if ((ce = devMalloc(st, (void **)&tmp, shard * (size_t)n * es, s)) != cudaSuccess) {
            tmp = NULL;
            r = devCudaError(comm, "cudaMallocAsync of the padded buffer", ce);
            goto fail_dbuf;
        }
        if ((ce = cudaMemcpyAsync(tmp, op->sendbuff, count * es, cudaMemcpyDeviceToDevice, s)) !=
                cudaSuccess ||
            (ce = cudaMemsetAsync(tmp + count * es, 0, (shard * (size_t)n - count) * es, s)) !=
                cudaSuccess) {
            r = devCudaError(comm, "padding the input", ce);
            goto fail_dbuf;
        }
        send = tmp;
        work = tmp;
    }
    char *mine = work + (size_t)me * shard * es;
    devTimingPhase(st, tc, DEV_PH_RS, s);
    GEO_REAL_CALL(r, L, ReduceScatter, send, mine, shard, ncclFloat32, ncclSum, st->real, s);
    if (r != ncclSuccess) {
        r = devRealError(comm, L, st->real, "the intra-region reduce-scatter", r);
        goto fail_dbuf;
    }
    /* From here on a failure still enqueues the all-gather (region peers
     * are in it) and fails the communicator. */
    if (cj->rounds > 0) {
        j->op = *op;
        j->op.next = NULL;
        j->slot = slot;
        j->off = off;
        j->len = len;
        j->op_seq = comm->op_seq;
        j->codec = cj->ch.codec;
        j->codec_job = cj;
        devTimingLink(j, tc);
        cj->base = devJobPush(st, j, nvals);
        r = enqueue_program(comm, st, cj, op, mine, off, ef1, ef2, tc, s);
        ce = cudaFreeAsync(cj->dbuf, s);
        if (r == ncclSuccess && ce != cudaSuccess)
            r = devCudaError(comm, "cudaFreeAsync", ce);
        ce = cudaEventRecord(slot->done, s);
        if (r == ncclSuccess && ce != cudaSuccess)
            r = devCudaError(comm, "cudaEventRecord", ce);
        if (r != ncclSuccess) {
            /* Waits of this job may be enqueued: let them (and those of
             * jobs still in flight before it, whose results are then not
             * valid either) pass; the communicator reports the failure. */
            __atomic_store_n(&cj->failed, 1, __ATOMIC_RELEASE);
            devFlagRelease(st, cj->base + nvals);
            geoCommFail(comm, r);
            if (ce != cudaSuccess) {
                /* no done event after the queued copies: never reuse it */
                pthread_mutex_lock(&st->lock);
                slot->cap = 0;
                slot->host = NULL; /* leaked on purpose: copies may still land */
                pthread_mutex_unlock(&st->lock);
            }
        }
        __atomic_store_n(&cj->enq_done, 1, __ATOMIC_RELEASE); /* cj is the thread's now */
    } else {
        devCodecJobFree(cj); /* nothing of mine crosses the WAN */
    }
    if (st->ef_ev != NULL || cudaEventCreateWithFlags(&st->ef_ev, cudaEventDisableTiming) ==
                                 cudaSuccess) {
        if (cudaEventRecord(st->ef_ev, s) == cudaSuccess)
            st->last_stream = s;
        else
            cudaGetLastError();
    } else {
        cudaGetLastError();
        st->ef_ev = NULL;
    }
    devTimingPhase(st, tc, DEV_PH_AG, s);
    GEO_REAL_CALL(ag, L, AllGather, mine, work, shard, ncclFloat32, st->real, s);
    if (ag != ncclSuccess && r == ncclSuccess)
        r = devRealError(comm, L, st->real, "the intra-region all-gather", ag);
    devTimingPhase(st, tc, DEV_PH_OTHER, s);
    if (tmp) {
        if ((ce = cudaMemcpyAsync(op->recvbuff, tmp, count * es, cudaMemcpyDeviceToDevice, s)) !=
                cudaSuccess &&
            r == ncclSuccess)
            r = devCudaError(comm, "copying the result out of the padded buffer", ce);
        cudaFreeAsync(tmp, s);
    }
    return r;

fail_dbuf:
    if (cj->dbuf)
        cudaFreeAsync(cj->dbuf, s);
fail_slot:
    free(j);
    if (slot)
        devSlotPut(st, slot);
fail:
    if (tmp)
        cudaFreeAsync(tmp, s);
    devCodecJobFree(cj);
    return r;
}
#endif
