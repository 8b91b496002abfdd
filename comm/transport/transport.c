#include "config.h"
#include "comm/transport/transport.h"

#include <string.h>

/* In order of preference: the first whose canConnect() says yes is used. */
const geoNetTransport *const geoNetTransports[] = {&geoNetTcp, NULL};

static ncclResult_t post(geoNet *net, int peer, int dir, void *buf, size_t size,
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
    return net->ops->post(net->state, req);
}

/* Statistics of a send; raw: its uncompressed size when it crosses the WAN
 * (a compressed chunk's caller counts that itself and passes 0). */
static void count_send(geoNet *net, int peer, size_t size, size_t raw)
{
    if (net->region_of && net->region_of[peer] != net->region_of[net->ctx.rank]) {
        net->sent.wan += size;
        net->sent.wan_raw += raw;
        net->sent.wan_msgs++;
    } else {
        net->sent.intra += size;
    }
}

ncclResult_t geoNetIsend(geoNet *net, int peer, const void *buf, size_t size,
                         geoNetRequest *req)
{
    count_send(net, peer, size, size);
    return post(net, peer, GEO_NET_SEND, (void *)buf, size, req, 0);
}

ncclResult_t geoNetIsendCtl(geoNet *net, int peer, const void *buf, size_t size,
                            geoNetRequest *req)
{
    return post(net, peer, GEO_NET_SEND, (void *)buf, size, req, 0);
}

ncclResult_t geoNetIrecv(geoNet *net, int peer, void *buf, size_t size,
                         geoNetRequest *req)
{
    return post(net, peer, GEO_NET_RECV, buf, size, req, 0);
}

ncclResult_t geoNetIsendV(geoNet *net, int peer, const void *buf, size_t size,
                          geoNetRequest *req)
{
    count_send(net, peer, size, 0); /* compressed chunks: raw size counted by the caller */
    return post(net, peer, GEO_NET_SEND, (void *)buf, size, req, 1);
}

ncclResult_t geoNetIrecvV(geoNet *net, int peer, void *buf, size_t capacity,
                          geoNetRequest *req)
{
    return post(net, peer, GEO_NET_RECV, buf, capacity, req, 1);
}

ncclResult_t geoNetWait(geoNet *net, geoNetRequest *req)
{
    /* The progress thread publishes result (and a variable-length
     * receive's size) and its last touch of the buffer before its release
     * store of done; this acquire load orders the caller's reads, and its
     * reuse of the buffer, after them.  A fixed-size request of zero bytes
     * was never posted (post() completes it at once, and arrays of requests
     * hold unposted ones): nobody else writes it. */
    if (__atomic_load_n(&req->done, __ATOMIC_ACQUIRE) && req->result != ncclInProgress)
        return req->result;
    if (!req->vlen && req->size == 0)
        return req->result;
    return net->ops->wait(net->state, req);
}

void geoNetBreak(geoNet *net)
{
    if (net->ops && net->state)
        net->ops->breakAll(net->state);
}
