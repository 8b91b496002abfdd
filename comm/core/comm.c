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
            /* exactly that memory again (a registration carried over from
             * the parent, registered again as before a shrink): the same
             * registration, its handle */
            int same = x->base == b && x->bytes == bytes;
            if (same)
                *tag = x->tag;
            pthread_mutex_unlock(&comm->ef_lock);
            free(r);
            return same ? ncclSuccess : ncclInvalidArgument;
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

ncclResult_t geoCommEfInherit(struct ncclComm *parent, struct ncclComm *child)
{
    ncclResult_t res = ncclSuccess;
    geoEfReg *copies = NULL, **tail = &copies;
    pthread_mutex_lock(&parent->ef_lock);
    for (geoEfReg *x = parent->ef_regs; x; x = x->next) {
        geoEfReg *r = malloc(sizeof(*r));
        if (r == NULL) {
            res = ncclSystemError;
            break;
        }
        *r = *x;
        r->next = NULL;
        *tail = r;
        tail = &r->next;
    }
    uint64_t next = parent->ef_next_tag;
    pthread_mutex_unlock(&parent->ef_lock);
    if (res != ncclSuccess) {
        while (copies) {
            geoEfReg *x = copies;
            copies = x->next;
            free(x);
        }
        return res;
    }
    pthread_mutex_lock(&child->ef_lock);
    *tail = child->ef_regs; /* none yet: the child was just made */
    child->ef_regs = copies;
    if (next > child->ef_next_tag)
        child->ef_next_tag = next;
    pthread_mutex_unlock(&child->ef_lock);
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
