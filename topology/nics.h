/* The local NICs: IP interfaces with the link speed the kernel reports
 * (/sys/class/net/NAME/speed) and, when libibverbs is built in, RDMA devices
 * with their ports' active rates.  What the probe prints beside what it
 * measured; a NIC's nominal rate bounds what a region's link can carry.
 * Depends on nothing in comm/. */
#ifndef GEOCCL_TOPO_NICS_H_
#define GEOCCL_TOPO_NICS_H_

typedef struct {
    char name[64];      /* interface, or "mlx5_0:1" (device:port) */
    int rdma;           /* 1: an ibverbs port */
    int up;             /* operational (IP: IFF_RUNNING; RDMA: port active) */
    double gbit;        /* nominal rate in Gbit/s; <= 0 unknown (virtual links) */
} topoNic;

/* Nominal rate of IP interface `ifname` in Gbit/s, or -1 when the kernel
 * does not know it (veth, tun, loopback report none or -1). */
double topoNicSpeed(const char *ifname);

/* Up to max NICs: RDMA ports first (when built with libibverbs), then IP
 * interfaces other than loopback.  Returns the count. */
int topoNicList(topoNic *out, int max);

#endif
