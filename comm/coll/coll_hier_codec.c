/* Compression in the hierarchical all-reduce (hier_internal.h): the
 * codecs a call takes (per sending region or one for all, through the
 * policy on types and operations, with error feedback's residuals), and
 * the encode and decode steps of X1 and X2 on a slice.  Why the results
 * stay bit-identical on every rank: coll_hier.c's top comment and
 * hierChooseCodec's. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/coll.h"
#include "comm/coll/hier_internal.h"
#include "comm/coll/reduce.h"
#include "comm/core/comm.h"
#include "compress/codec.h"
#include "compress/ef.h"

#include <string.h>

/* A codec step failed: report it on comm with the file:line of the step
 * (codec_error) and return its code, where a codec's ncclInvalidArgument
 * becomes ncclRemoteError (a chunk it calls invalid came so from its
 * sender).  peer < 0: no rank to name. */
static ncclResult_t codec_error_at(struct ncclComm *comm, const char *file, int line,
                                   const char *what, int peer, const char *why, ncclResult_t res)
{
    res = res == ncclInvalidArgument ? ncclRemoteError : res;
    if (peer >= 0)
        return geoErrReport(&comm->err, res, file, line, "%s: %s rank %d (host %s): %s",
                            geoErrOp(&comm->err), what, peer, comm->peers[peer].net.host,
                            why ? why : "invalid chunk");
    return geoErrReport(&comm->err, res, file, line, "%s: %s: %s", geoErrOp(&comm->err), what,
                        why ? why : "failed");
}
#define codec_error(comm, what, peer, why, res) \
    codec_error_at((comm), __FILE__, __LINE__, (what), (peer), (why), (res))

/* X1 sends of one slice: encode my region's partial of each part. */
ncclResult_t hierEncodeX1(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                          const hierCodec *hc, const hierView *v)
{
    const size_t es = geoTypeSize(op->dt);
    for (int i = 0; i < sl->ntx1; i++) {
        hierMsg *x = &sl->tx1[i];
        ncclResult_t r = hc->codec->encode(hierAt(v, x->off, es), x->n, op->dt,
                                           hc->params, hc->counter + 2 * x->off,
                                           hc->ef1 ? hc->ef1 + x->off : NULL, x->enc,
                                           x->enc_cap, &x->enc_len);
        if (r != ncclSuccess)
            return codec_error(comm, "encoding a partial for", x->peer, NULL, r);
    }
    return ncclSuccess;
}

/* X1 receives: decode the other regions' partials of my parts. */
ncclResult_t hierDecodeX1(struct ncclComm *comm, const geoOp *op, hierSlice *sl)
{
    for (int i = 0; i < sl->nrx1; i++) {
        hierMsg *x = &sl->rx1[i];
        const char *why = NULL;
        if (x->codec == NULL) /* an exact region's: already in place */
            continue;
        ncclResult_t r = x->codec->decode(x->enc, x->req.size, op->dt, x->tmp, x->n, &why);
        if (r != ncclSuccess)
            return codec_error(comm, "a corrupt compressed chunk from", x->peer, why, r);
    }
    return ncclSuccess;
}

/* X1 receives and R of a float32 sum/avg in one pass: the k partials of
 * each of my parts summed in region order, the other regions' decoded
 * straight into the sum (decodeAccumulate: one binary32 addition each, the
 * same bits as hierDecodeX1 then reduce_parts, without the decoded copies). */
int hierFusedDecode(const geoOp *op, const hierCodec *hc)
{
    return hc->any && op->dt == ncclFloat32 &&
           (op->op == ncclSum || op->op == ncclAvg);
}

ncclResult_t hierDecodeReduceX1(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                                float *acc, const hierView *v)
{
    const int k = comm->regions.nregions, g = comm->regions.region_of[comm->rank];
    for (int p = 0; p < sl->nparts; p++) {
        hierPart *part = &sl->parts[p];
        float *mine = (float *)hierAt(v, part->off, sizeof(float));
        if (part->n == 0)
            continue;
        for (int q = 0, j = 0; q < k; q++) {
            if (q == g) {
                if (q == 0)
                    memcpy(acc, mine, part->n * sizeof(float));
                else
                    geoReduce(acc, acc, mine, part->n, ncclFloat32, ncclSum);
                continue;
            }
            hierMsg *x = &sl->rx1[part->first_rx + j++];
            const char *why = NULL;
            ncclResult_t r = ncclSuccess;
            if (x->codec == NULL) { /* an exact region's partial, in x->tmp */
                if (q == 0)
                    memcpy(acc, x->tmp, part->n * sizeof(float));
                else
                    geoReduce(acc, acc, x->tmp, part->n, ncclFloat32, ncclSum);
            } else if (q == 0) {
                r = x->codec->decode(x->enc, x->req.size, ncclFloat32, acc, part->n, &why);
            } else {
                r = x->codec->decodeAccumulate(x->enc, x->req.size, ncclFloat32, acc, part->n,
                                               &why);
            }
            if (r != ncclSuccess)
                return codec_error(comm, "a corrupt compressed chunk from", x->peer, why, r);
        }
        if (op->op == ncclAvg)
            geoDivide(acc, part->n, ncclFloat32, comm->nranks);
        memcpy(mine, acc, part->n * sizeof(float));
    }
    return ncclSuccess;
}

/* X2: encode each finished part once, and keep decode(encode(part)) as my
 * own copy: the bytes every other region decodes. */
ncclResult_t hierEncodeX2(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                          const hierCodec *hc, const hierView *v)
{
    const size_t es = geoTypeSize(op->dt);
    int k1 = comm->regions.nregions - 1;
    for (int i = 0; i < sl->ntx2; i += k1) {
        hierMsg *x = &sl->tx2[i];
        char *part = hierAt(v, x->off, es);
        const char *why = NULL;
        ncclResult_t r = hc->codec->encode(part, x->n, op->dt, &hc->p2,
                                           hc->counter + 2 * x->off + 1,
                                           hc->ef2 ? hc->ef2 + x->off : NULL, x->enc, x->enc_cap,
                                           &x->enc_len);
        if (r != ncclSuccess)
            return codec_error(comm, "encoding a reduced part for", x->peer, NULL, r);
        if (hc->codec->lossy &&
            (r = hc->codec->decode(x->enc, x->enc_len, op->dt, part, x->n, &why)) != ncclSuccess)
            return codec_error(comm, "decoding our own chunk", -1, why, r);
        for (int j = 1; j < k1; j++)
            sl->tx2[i + j].enc_len = x->enc_len;
    }
    return ncclSuccess;
}

/* X2 receives: decode the finished parts owned by other regions. */
ncclResult_t hierDecodeX2(struct ncclComm *comm, const geoOp *op, hierSlice *sl,
                          const hierView *v)
{
    const size_t es = geoTypeSize(op->dt);
    for (int i = 0; i < sl->nrx2; i++) {
        hierMsg *x = &sl->rx2[i];
        const char *why = NULL;
        if (x->codec == NULL) /* an exact region's: already in place */
            continue;
        ncclResult_t r = x->codec->decode(x->enc, x->req.size, op->dt, hierAt(v, x->off, es),
                                          x->n, &why);
        if (r != ncclSuccess)
            return codec_error(comm, "a corrupt compressed chunk from", x->peer, why, r);
    }
    return ncclSuccess;
}

/* The codec a call may use (coll.h): lossy codecs only on float32 sum/avg,
 * and only when the user chose one; anything else is sent exactly (said
 * once at INFO). */
void geoHierCodecPolicy(struct ncclComm *comm, const geoOp *op, int codec,
                        geoHierCodecChoice *out)
{
    memset(out, 0, sizeof(*out));
    out->codec = GEO_CODEC_NONE;
    geoCodecId id = (geoCodecId)codec;
    if (id == GEO_CODEC_NONE || id >= GEO_CODEC_COUNT)
        return;
    const geoCodec *c = geoCodecGet(id);
    if (c == NULL)
        return;
    int ok = c->supports(op->dt) &&
             (!c->lossy || op->op == ncclSum || op->op == ncclAvg);
    if (!ok) {
        if (!comm->compress_fallback_noted) {
            comm->compress_fallback_noted = 1;
            geoInfo(GEO_LOG_COMPRESS, "GEOCCL_COMPRESS=%s applies to float sum/avg only: %s %s "
                    "all-reduces cross the WAN exactly", c->name, geoTypeName(op->dt),
                    geoOpName(op->op));
        }
        return;
    }
    out->codec = id;
    out->p1 = comm->codec_auto ? comm->auto_params : comm->codec_params;
    out->p2 = out->p1;
    if (id == GEO_CODEC_TOPK) {
        double k2 = out->p2.topkFraction * comm->regions.nregions;
        out->p2.topkFraction = k2 < 1 ? k2 : 1;
    }
    /* the call's own number: a device call's exchange runs on the
     * exchange thread, when the user thread may have issued later calls */
    out->counter = (op->seq ? op->seq : comm->op_seq) << 40;
    if (c->lossy && comm->ef_enabled) {
        /* GEOCCL_EF=2: only the return trip keeps a residual; 3: only the
         * first trip (see the parameter's help).  Unset: 3 for sign, whose
         * residuals on both trips made the digits example diverge while the
         * first trip alone matched uncompressed accuracy (BENCHMARKS.md,
         * "Which trip keeps the residual"); 1 for the others. */
        int mode = comm->ef_mode ? comm->ef_mode : id == GEO_CODEC_SIGN ? 3 : 1;
        out->ef1 = mode != 2;
        out->ef2 = mode != 3;
    }
}

void geoEfNoteUnregistered(struct ncclComm *comm, const void *buf)
{
    if (__atomic_exchange_n(&comm->ef_unreg_noted, 1, __ATOMIC_RELAXED))
        return;
    geoInfo(GEO_LOG_COMPRESS, "error feedback: %p is in no buffer registered with "
            "geocclCommRegisterErrorFeedback: compressed without error feedback (this and "
            "every other such call; GEOCCL_EF_KEY=address keys residuals by address instead)",
            buf);
}

/* The call's codecs: region q's is by_region[q] where the plan gives each
 * region its own, else comm->call_codec (the plan's or the user's), each
 * through the policy.  Every rank takes the same, so each message is
 * decoded in the codec it was encoded in.  Why a codec per sending region
 * keeps the results bit-identical: a region's X1 partials are decoded only
 * by the owner of each part, which sums them in region order; its X2 part
 * is encoded once and every region, the owner included (hierEncodeX2),
 * decodes those same bytes.  Error feedback keeps residuals only for my
 * region's codec. */
void hierChooseCodec(struct ncclComm *comm, const geoOp *op, hierCodec *hc,
                     const unsigned char *by_region)
{
    const int R = comm->regions.nregions, g = comm->regions.region_of[comm->rank];
    geoHierCodecChoice ch, mine;
    memset(hc, 0, sizeof(*hc));
    memset(&mine, 0, sizeof(mine));
    for (int q = 0; q < R && q < 64; q++) {
        geoHierCodecPolicy(comm, op, by_region ? by_region[q] : comm->call_codec, &ch);
        if (ch.codec == GEO_CODEC_NONE)
            continue;
        hc->of[q] = geoCodecGet((geoCodecId)ch.codec);
        /* p2 differs from p1 only for topk (R k on the return trip) */
        if (!hc->any || ch.codec == GEO_CODEC_TOPK)
            hc->p2 = ch.p2;
        hc->any = 1;
        hc->counter = ch.counter;
        if (q == g)
            mine = ch;
    }
    if (!hc->any)
        return;
    hc->codec = hc->of[g];
    hc->params = comm->codec_auto ? &comm->auto_params : &comm->codec_params;
    ch = mine;
    if ((ch.ef1 || ch.ef2) && op->ef_key == 0) {
        geoEfNoteUnregistered(comm, op->recvbuff);
    } else if (ch.ef1 || ch.ef2) {
        size_t evicted = 0;
        geoEfBeginOp(&comm->ef);
        if (geoEfGet(&comm->ef, op->ef_key, op->recvbuff, op->count, 1, &hc->ef1, &evicted) !=
                ncclSuccess ||
            geoEfGet(&comm->ef, op->ef_key, op->recvbuff, op->count, 2, &hc->ef2, &evicted) !=
                ncclSuccess) {
            hc->ef1 = hc->ef2 = NULL;
            if (!comm->ef_full_noted) {
                comm->ef_full_noted = 1;
                geoInfo(GEO_LOG_COMPRESS, "error feedback: a %zu-element buffer does not fit "
                        "GEOCCL_EF_MAX_BYTES=%zu; it is compressed without error feedback",
                        op->count, comm->ef.maxBytes);
            }
        }
        if (!ch.ef1)
            hc->ef1 = NULL;
        if (!ch.ef2)
            hc->ef2 = NULL;
        if (geoEfTakeEvictionNotice(&comm->ef))
            geoInfo(GEO_LOG_COMPRESS, "error feedback: GEOCCL_EF_MAX_BYTES=%zu reached; least "
                    "recently used residuals are dropped (%llu so far)", comm->ef.maxBytes,
                    (unsigned long long)comm->ef.evictions);
    }
}
