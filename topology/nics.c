#include "config.h"
#include "topology/nics.h"

#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>

#ifdef HAVE_IBVERBS
#include <infiniband/verbs.h>
#endif

double topoNicSpeed(const char *ifname)
{
    char path[128];
    long mbit = -1;
    if (ifname == NULL || strchr(ifname, '/') != NULL)
        return -1;
    snprintf(path, sizeof(path), "/sys/class/net/%s/speed", ifname);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    if (fscanf(f, "%ld", &mbit) != 1)
        mbit = -1;
    fclose(f);
    return mbit > 0 ? (double)mbit / 1000.0 : -1;
}

#ifdef HAVE_IBVERBS
/* IB lane rate in Gbit/s from ibv_port_attr.active_speed. */
static double lane_gbit(int speed)
{
    switch (speed) {
    case 1: return 2.5;   /* SDR */
    case 2: return 5.0;   /* DDR */
    case 4:               /* QDR */
    case 8: return 10.0;  /* FDR10 */
    case 16: return 14.0; /* FDR */
    case 32: return 25.0; /* EDR */
    case 64: return 50.0; /* HDR */
    case 128: return 100.0; /* NDR */
    default: return -1;
    }
}

static int lanes(int width)
{
    switch (width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
    }
}

static int rdma_ports(topoNic *out, int max)
{
    int n = 0, ndev = 0;
    struct ibv_device **devs = ibv_get_device_list(&ndev);
    if (devs == NULL)
        return 0;
    for (int d = 0; d < ndev && n < max; d++) {
        struct ibv_context *ctx = ibv_open_device(devs[d]);
        struct ibv_device_attr da;
        if (ctx == NULL)
            continue;
        if (ibv_query_device(ctx, &da) == 0)
            for (int p = 1; p <= da.phys_port_cnt && n < max; p++) {
                struct ibv_port_attr pa;
                if (ibv_query_port(ctx, (uint8_t)p, &pa) != 0)
                    continue;
                topoNic *x = &out[n++];
                memset(x, 0, sizeof(*x));
                snprintf(x->name, sizeof(x->name), "%s:%d", ibv_get_device_name(devs[d]), p);
                x->rdma = 1;
                x->up = pa.state == IBV_PORT_ACTIVE;
                double l = lane_gbit(pa.active_speed);
                int w = lanes(pa.active_width);
                x->gbit = l > 0 && w > 0 ? l * w : -1;
            }
        ibv_close_device(ctx);
    }
    ibv_free_device_list(devs);
    return n;
}
#endif

int topoNicList(topoNic *out, int max)
{
    int n = 0;
    struct ifaddrs *ifa = NULL;
#ifdef HAVE_IBVERBS
    n = rdma_ports(out, max);
#endif
    if (getifaddrs(&ifa) != 0)
        return n;
    for (struct ifaddrs *i = ifa; i != NULL && n < max; i = i->ifa_next) {
        if (i->ifa_name == NULL || (i->ifa_flags & IFF_LOOPBACK))
            continue;
        int seen = 0;
        for (int k = 0; k < n; k++)
            if (!out[k].rdma && strcmp(out[k].name, i->ifa_name) == 0)
                seen = 1;
        if (seen)
            continue;
        topoNic *x = &out[n++];
        memset(x, 0, sizeof(*x));
        snprintf(x->name, sizeof(x->name), "%s", i->ifa_name);
        x->up = (i->ifa_flags & IFF_RUNNING) != 0;
        x->gbit = topoNicSpeed(i->ifa_name);
    }
    freeifaddrs(ifa);
    return n;
}
