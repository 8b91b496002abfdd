#include "config.h"
#include "comm/core/comm.h"
#include "comm/transport/transport.h"

#include <string.h>

/* In order of preference: the first whose canConnect() says yes is used. */
const geoNetTransport *const geoNetTransports[] = {&geoNetTcp, NULL};

static ncclResult_t post(struct ncclComm *comm, int peer, int dir, void *buf, size_t size,
                         geoNetRequest *req, int vlen)
{
    memset(req, 0, sizeof(*req));
    req->peer = peer;
    req->dir = dir;
    req->buf = buf;
    req->size = size;
    req->capacity = size;
    req->vlen = vlen;
    if (size == 0 && !vlen) {
        req->done = 1;
        req->result = ncclSuccess;
        return ncclSuccess;
    }
    return comm->net->post(comm->net_state, req);
}

/* Statistics of a send; raw: its uncompressed size when it crosses the WAN
 * (a compressed chunk's caller counts that itself and passes 0). */
static void count_send(struct ncclComm *comm, int peer, size_t size, size_t raw)
{
    if (comm->regions.region_of &&
        comm->regions.region_of[peer] != comm->regions.region_of[comm->rank]) {
        comm->stats.bytes_wan += size;
        comm->stats.bytes_wan_raw += raw;
    } else {
        comm->stats.bytes_intra += size;
    }
}

ncclResult_t geoNetIsend(struct ncclComm *comm, int peer, const void *buf, size_t size,
                         geoNetRequest *req)
{
    count_send(comm, peer, size, size);
    return post(comm, peer, GEO_NET_SEND, (void *)buf, size, req, 0);
}

ncclResult_t geoNetIsendCtl(struct ncclComm *comm, int peer, const void *buf, size_t size,
                            geoNetRequest *req)
{
    return post(comm, peer, GEO_NET_SEND, (void *)buf, size, req, 0);
}

ncclResult_t geoNetIrecv(struct ncclComm *comm, int peer, void *buf, size_t size,
                         geoNetRequest *req)
{
    return post(comm, peer, GEO_NET_RECV, buf, size, req, 0);
}

ncclResult_t geoNetIsendV(struct ncclComm *comm, int peer, const void *buf, size_t size,
                          geoNetRequest *req)
{
    count_send(comm, peer, size, 0); /* compressed chunks: raw size counted by the caller */
    return post(comm, peer, GEO_NET_SEND, (void *)buf, size, req, 1);
}

ncclResult_t geoNetIrecvV(struct ncclComm *comm, int peer, void *buf, size_t capacity,
                          geoNetRequest *req)
{
    return post(comm, peer, GEO_NET_RECV, buf, capacity, req, 1);
}

ncclResult_t geoNetWait(struct ncclComm *comm, geoNetRequest *req)
{
    if ((req->size == 0 && !req->vlen) || (req->done && req->result != ncclInProgress))
        return req->result;
    return comm->net->wait(comm->net_state, req);
}
