/* One rank's message to the others of a communicator, as the agreements of
 * ncclCommShrink and geocclCommGrow make them: the deciding rank sends the
 * same bytes to every member not marked in skip, and each of those receives
 * them from it.  The sender sends even after its own decision failed (the
 * message says so), so that nobody waits for a message that never comes;
 * each wait is the transport's, bounded by GEOCCL_TIMEOUT. */
#include "config.h"
#include "comm/base/checks.h"
#include "comm/coll/coll.h"
#include "comm/core/comm.h"

#include <stdlib.h>
#include <string.h>

ncclResult_t geoFanOut(struct ncclComm *comm, int from, const uint8_t *skip, void *buf,
                       size_t len, const char *what)
{
    ncclResult_t res = ncclSuccess;
    if (comm->rank != from) {
        geoNetRequest req;
        memset(&req, 0, sizeof(req));
        GEO_CHECK(geoNetIrecv(&comm->net, from, buf, len, &req));
        return geoNetWait(&comm->net, &req);
    }
    geoNetRequest *req = calloc((size_t)comm->nranks, sizeof(*req));
    if (req == NULL)
        return GEO_COMM_ERR(comm, ncclSystemError, "%s: out of memory", what);
    for (int r = 0; r < comm->nranks && res == ncclSuccess; r++)
        if (r != comm->rank && !(skip && skip[r]))
            res = geoNetIsend(&comm->net, r, buf, len, &req[r]);
    for (int r = 0; r < comm->nranks; r++)
        if (req[r].size) {
            ncclResult_t w = geoNetWait(&comm->net, &req[r]);
            if (res == ncclSuccess)
                res = w;
        }
    free(req);
    return res;
}
