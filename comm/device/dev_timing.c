/* Phase timing of the cross-region collectives on device buffers
 * (geocclCommGetDeviceStats).
 *
 * A call's stream work is cut by timing events: devTimingPhase records an
 * event only where the phase changes, closing the interval of the phase
 * that was open, so a call of C rounds costs a few events a round.  The
 * intervals follow one another on the one stream, so they tile the call's
 * span and the phases sum to it.
 *
 * Nothing on the call path waits for an event: the calls stay on a list
 * until their last event is complete (cudaEventQuery, its not-ready answer
 * kept out of the thread's last error: devEventQuery) and their exchange
 * is finished (host_done, set by the exchange thread after it wrote what
 * it measured); they are read at the start of the next call and when the
 * figures are asked for.  Every event on one stream before a complete one
 * is complete, so the elapsed times read then never answer not ready.
 *
 * The events come from a pool of the communicator's that grows to at most
 * DEV_TIMING_MAX_EVENTS; a call that would need more (very many calls in
 * flight, unread) is counted as untimed, not waited for.  All of this is
 * the user thread's (the thread that issues collectives on the
 * communicator), but for host_done and the fields it publishes.  Without
 * CUDA the figures are all 0. */
#include "config.h"
#include "comm/device/coll_device.h"

#include <stdlib.h>
#include <string.h>

#ifdef HAVE_CUDA
#include "comm/device/dev_internal.h"

#define DEV_TIMING_MAX_EVENTS 16384

static cudaEvent_t ev_get(devTiming *t)
{
    cudaEvent_t ev = NULL;
    if (t->npool > 0)
        return t->pool[--t->npool];
    if (t->nev >= DEV_TIMING_MAX_EVENTS)
        return NULL;
    if (cudaEventCreate(&ev) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    t->nev++;
    return ev;
}

/* Back to the pool (an event still pending may be recorded again: the new
 * record replaces it). */
static void ev_put(devTiming *t, cudaEvent_t ev)
{
    if (t->npool == t->pool_cap) {
        int cap = t->pool_cap ? 2 * t->pool_cap : 64;
        cudaEvent_t *p = realloc(t->pool, (size_t)cap * sizeof(*p));
        if (p == NULL) {
            cudaEventDestroy(ev);
            t->nev--;
            return;
        }
        t->pool = p;
        t->pool_cap = cap;
    }
    t->pool[t->npool++] = ev;
}

static void call_free(devTiming *t, devTimedCall *tc)
{
    for (int i = 0; i < tc->n; i++)
        ev_put(t, tc->ev[i]);
    free(tc->ev);
    free(tc->ph);
    free(tc);
}

/* Record the event that closes the open phase (and opens ph). */
static void mark(devTiming *t, devTimedCall *tc, int ph, cudaStream_t s)
{
    if (tc->bad)
        return;
    if (tc->n == tc->cap) {
        int cap = tc->cap ? 2 * tc->cap : 32;
        cudaEvent_t *ev = realloc(tc->ev, (size_t)cap * sizeof(*ev));
        if (ev != NULL)
            tc->ev = ev;
        unsigned char *p = ev ? realloc(tc->ph, (size_t)cap) : NULL;
        if (p == NULL) {
            tc->bad = 1;
            return;
        }
        tc->ph = p;
        tc->cap = cap;
    }
    cudaEvent_t ev = ev_get(t);
    if (ev == NULL) {
        tc->bad = 1;
        return;
    }
    if (cudaEventRecord(ev, s) != cudaSuccess) {
        cudaGetLastError();
        ev_put(t, ev);
        tc->bad = 1;
        return;
    }
    tc->ev[tc->n] = ev;
    tc->ph[tc->n] = (unsigned char)tc->cur;
    tc->n++;
    tc->cur = ph;
}

devTimedCall *devTimingBegin(struct geoDevState *st, cudaStream_t s)
{
    devTiming *t = &st->timing;
    devTimingHarvest(st);
    devTimedCall *tc = calloc(1, sizeof(*tc));
    if (tc == NULL) {
        t->untimed++;
        return NULL;
    }
    tc->cur = DEV_PH_OTHER;
    tc->gen = t->gen;
    mark(t, tc, DEV_PH_OTHER, s);
    if (tc->bad) {
        call_free(t, tc);
        t->untimed++;
        return NULL;
    }
    t->inflight++;
    return tc;
}

void devTimingPhase(struct geoDevState *st, devTimedCall *tc, int ph, cudaStream_t s)
{
    if (tc != NULL && ph != tc->cur)
        mark(&st->timing, tc, ph, s);
}

void devTimingEnd(struct geoDevState *st, devTimedCall *tc, cudaStream_t s, ncclResult_t r)
{
    devTiming *t = &st->timing;
    if (tc == NULL)
        return;
    if (r != ncclSuccess)
        tc->bad = 1;
    mark(t, tc, DEV_PH_OTHER, s);
    if (!tc->linked)
        __atomic_store_n(&tc->host_done, 1, __ATOMIC_RELEASE);
    tc->next = NULL;
    if (t->tail)
        t->tail->next = tc;
    else
        t->head = tc;
    t->tail = tc;
}

void devTimingHost(devJob *j, unsigned long long wan, unsigned long long wan_raw)
{
    devTimedCall *tc = j->timing;
    if (tc == NULL)
        return;
    tc->host_sec = j->wan_t1 > j->wan_t0 && j->wan_t0 > 0 ? j->wan_t1 - j->wan_t0 : 0;
    tc->wan = wan;
    tc->wan_raw = wan_raw;
    __atomic_store_n(&tc->host_done, 1, __ATOMIC_RELEASE);
}

/* Add tc's intervals to the sums; 0 when an elapsed time could not be read
 * (then nothing of it is added). */
static int read_call(devTiming *t, devTimedCall *tc)
{
    double sec[DEV_PH_N] = {0}, call = 0;
    for (int i = 1; i < tc->n; i++) {
        float ms = 0;
        cudaError_t e = cudaEventElapsedTime(&ms, tc->ev[i - 1], tc->ev[i]);
        if (e != cudaSuccess) {
            if (e == cudaErrorNotReady)
                cudaGetLastError(); /* as devEventQuery: not the caller's error */
            return 0;
        }
        double x = ms > 0 ? 1e-3 * (double)ms : 0;
        sec[tc->ph[i]] += x;
        call += x;
    }
    for (int p = 0; p < DEV_PH_N; p++)
        t->sec[p] += sec[p];
    t->call += call;
    t->host += tc->host_sec;
    t->wan += tc->wan;
    t->wan_raw += tc->wan_raw;
    t->calls++;
    return 1;
}

void devTimingHarvest(struct geoDevState *st)
{
    devTiming *t = &st->timing;
    devTimedCall **pp = &t->head, *prev = NULL;
    while (*pp) {
        devTimedCall *tc = *pp;
        int done = __atomic_load_n(&tc->host_done, __ATOMIC_ACQUIRE) &&
                   (tc->bad || tc->n == 0 || devEventQuery(tc->ev[tc->n - 1]) == cudaSuccess);
        if (!done) {
            prev = tc;
            pp = &tc->next;
            continue;
        }
        if (tc->gen == t->gen) {
            if (tc->bad || !read_call(t, tc))
                t->untimed++;
            t->inflight--;
        }
        *pp = tc->next;
        if (t->tail == tc)
            t->tail = prev;
        call_free(t, tc);
    }
}

void devTimingFree(struct geoDevState *st)
{
    devTiming *t = &st->timing;
    while (t->head) {
        devTimedCall *tc = t->head;
        t->head = tc->next;
        call_free(t, tc);
    }
    t->tail = NULL;
    for (int i = 0; i < t->npool; i++)
        cudaEventDestroy(t->pool[i]); /* pending ones are released when done */
    free(t->pool);
    memset(t, 0, sizeof(*t));
}

void geoDevGetStats(struct ncclComm *comm, geocclDeviceStats *out)
{
    struct geoDevState *st = __atomic_load_n(&comm->dev, __ATOMIC_ACQUIRE);
    devGuard g;
    memset(out, 0, sizeof(*out));
    if (st == NULL || devEnter(comm, &g) != ncclSuccess)
        return;
    devTimingHarvest(st);
    devLeave(&g);
    const devTiming *t = &st->timing;
    out->calls = t->calls;
    out->callsInFlight = t->inflight;
    out->callsUntimed = t->untimed;
    out->secCall = t->call;
    out->secReduceScatter = t->sec[DEV_PH_RS];
    out->secEncode = t->sec[DEV_PH_ENCODE];
    out->secCopyOut = t->sec[DEV_PH_COPYOUT];
    out->secWan = t->sec[DEV_PH_WAN];
    out->secCopyIn = t->sec[DEV_PH_COPYIN];
    out->secDecode = t->sec[DEV_PH_DECODE];
    out->secAllGather = t->sec[DEV_PH_AG];
    out->secOther = t->sec[DEV_PH_OTHER];
    out->secExchange = t->host;
    out->bytesWan = t->wan;
    out->bytesWanRaw = t->wan_raw;
}

void geoDevResetStats(struct ncclComm *comm)
{
    struct geoDevState *st = __atomic_load_n(&comm->dev, __ATOMIC_ACQUIRE);
    if (st == NULL)
        return;
    devTiming *t = &st->timing;
    /* calls in flight belong to the old generation: read, not counted */
    t->gen++;
    t->calls = t->untimed = t->inflight = t->wan = t->wan_raw = 0;
    t->call = t->host = 0;
    memset(t->sec, 0, sizeof(t->sec));
}

#else /* !HAVE_CUDA */

void geoDevGetStats(struct ncclComm *comm, geocclDeviceStats *out)
{
    (void)comm;
    memset(out, 0, sizeof(*out));
}
void geoDevResetStats(struct ncclComm *comm) { (void)comm; }
#endif
