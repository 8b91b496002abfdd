/* TCP_INFO through the kernel's own layout (linux/tcp.h): glibc's struct
 * tcp_info stops before the segment counters (tcpi_data_segs_in and
 * tcpi_data_segs_out, Linux 4.6).  The kernel copies min(its size, ours)
 * bytes and says how many, so a field past what it copied is absent, not
 * zero. */
#include "config.h"
#include "comm/transport/tcp_info.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <linux/tcp.h>
#include <linux/inet_diag.h>

#ifndef SOL_TCP
#define SOL_TCP 6
#endif

int geoTcpInfoAdd(int fd, geoLinkStats *acc)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);

    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, SOL_TCP, TCP_INFO, &ti, &len) != 0)
        return -1;
    if (len < offsetof(struct tcp_info, tcpi_data_segs_out) + sizeof(ti.tcpi_data_segs_out)) {
        errno = ENOTSUP;
        return -1;
    }
    acc->segs_out += ti.tcpi_data_segs_out;
    acc->segs_in += ti.tcpi_data_segs_in;
    acc->retrans += ti.tcpi_total_retrans;
    double srtt = ti.tcpi_rtt * 1e-6, var = ti.tcpi_rttvar * 1e-6;
    if (srtt > acc->srtt)
        acc->srtt = srtt;
    if (var > acc->rttvar)
        acc->rttvar = var;
    if (len >= offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof(ti.tcpi_bytes_acked))
        acc->bytes_acked += ti.tcpi_bytes_acked;
    if (len >= offsetof(struct tcp_info, tcpi_sndbuf_limited) + sizeof(ti.tcpi_sndbuf_limited)) {
        /* The kernel's busy time is the sum of its three states: sending,
         * limited by the receiver's window, limited by the send buffer.
         * The receiver's window is the receiving rank not reading yet (its
         * call is behind), not the path: that part is taken out. */
        uint64_t t = ti.tcpi_busy_time > ti.tcpi_rwnd_limited
                         ? ti.tcpi_busy_time - ti.tcpi_rwnd_limited : 0;
        double busy = (double)t * 1e-6;
        if (busy > acc->busy)
            acc->busy = busy;
    }
    acc->conns++;
    return 0;
}

int geoTcpBbrRttGrew(int fd, double factor)
{
    struct tcp_info ti;
    union tcp_cc_info cc;
    socklen_t len = sizeof(ti), cl = sizeof(cc);

    memset(&ti, 0, sizeof(ti));
    memset(&cc, 0, sizeof(cc));
    if (getsockopt(fd, SOL_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_min_rtt) + sizeof(ti.tcpi_min_rtt) ||
        ti.tcpi_min_rtt == 0 || getsockopt(fd, SOL_TCP, TCP_CC_INFO, &cc, &cl) != 0 ||
        cl < sizeof(cc.bbr) || cc.bbr.bbr_min_rtt == 0)
        return -1;
    return cc.bbr.bbr_min_rtt > factor * ti.tcpi_min_rtt;
}

double geoLinkLoss(double sent, double received)
{
    if (sent <= 0 || received >= sent)
        return 0;
    return (sent - received) / sent;
}
