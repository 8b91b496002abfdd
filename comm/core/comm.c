/* The communicator's handle check and error reporting, for every layer
 * that holds a communicator (core/comm.h). */
#include "config.h"
#include "comm/core/comm.h"

#include <stdarg.h>
#include <stdlib.h>


__thread int geoGroupDepth;

ncclResult_t geoCommCheck(const struct ncclComm *comm, const char *fn)
{
    (void)fn;
    if (comm == NULL || comm->magic != GEO_COMM_MAGIC)
        return ncclInvalidArgument;
    return ncclSuccess;
}

void geoCommFail(struct ncclComm *comm, ncclResult_t res)
{
    geoErrFail(&comm->err, res);
}

ncclResult_t geoCommAsyncError(struct ncclComm *comm)
{
    return geoErrState(&comm->err);
}

/* ---- error-feedback registrations (comm.h) ------------------------------- */

ncclResult_t geoCommEfRegister(struct ncclComm *comm, const void *base, size_t bytes,
                               uint64_t *tag)
{
    uintptr_t b = (uintptr_t)base;
    geoEfReg *r = malloc(sizeof(*r));
    if (r == NULL)
        return ncclSystemError;
    pthread_mutex_lock(&comm->ef_lock);
    for (geoEfReg *x = comm->ef_regs; x; x = x->next)
        if (b < x->base + x->bytes && x->base < b + bytes) {
            pthread_mutex_unlock(&comm->ef_lock);
            free(r);
            return ncclInvalidArgument;
        }
    r->base = b;
    r->bytes = bytes;
    r->tag = comm->ef_next_tag < 2 ? 2 : comm->ef_next_tag;
    comm->ef_next_tag = r->tag + 1;
    r->next = comm->ef_regs;
    comm->ef_regs = r;
    pthread_mutex_unlock(&comm->ef_lock);
    *tag = r->tag;
    return ncclSuccess;
}

int geoCommEfUnregister(struct ncclComm *comm, uint64_t tag)
{
    geoEfReg *gone = NULL;
    pthread_mutex_lock(&comm->ef_lock);
    for (geoEfReg **pp = &comm->ef_regs; *pp; pp = &(*pp)->next)
        if ((*pp)->tag == tag) {
            gone = *pp;
            *pp = gone->next;
            break;
        }
    pthread_mutex_unlock(&comm->ef_lock);
    free(gone);
    return gone ? 0 : -1;
}

uint64_t geoCommEfKey(struct ncclComm *comm, const void *addr, size_t bytes)
{
    uintptr_t a = (uintptr_t)addr;
    uint64_t tag = 0;
    pthread_mutex_lock(&comm->ef_lock);
    for (geoEfReg *x = comm->ef_regs; x; x = x->next)
        if (a >= x->base && bytes <= x->bytes && a - x->base <= x->bytes - bytes) {
            tag = x->tag;
            break;
        }
    pthread_mutex_unlock(&comm->ef_lock);
    if (tag == 0 && comm->ef_by_address)
        tag = 1;
    return tag;
}
