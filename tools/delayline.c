/*
 * delayline.c: holds every packet that the kernel routes into a TUN device
 * for a fixed time, then hands it back to the kernel through the same
 * device. Routed through it, a link gains a one-way delay: this is the
 * latency half of the emulated WAN built by tools/geoccl-wan (the
 * kernel here has no netem; tbf on the TUN device does the bandwidth).
 *
 *   delayline -i IFNAME -d DELAY_MS [-j JITTER_MS [-R]] [-l LOSS_PCT | -g P,R[,H[,K]]]
 *             [-S SEED] [-s STATS_FILE] [-c CONTROL_FILE] [-q MAX_QUEUE_BYTES] [-r RT_PRIO]
 *             [-t EVERY] [-G] [-v]
 *
 * -i  TUN device to attach (created if absent; an existing persistent one
 *     made by `ip tuntap add mode tun` is attached to). Opened IFF_TUN |
 *     IFF_NO_PI: every read is one IP packet (behind a vnet header unless
 *     -G), every write injects one.
 * -d  delay in milliseconds, fractional allowed (0 .. 600000).
 * -j  jitter: each packet is held DELAY_MS plus a uniform random part in
 *     [0, JITTER_MS), but never released before the packet ahead of it, so
 *     the order of packets is kept (as on a real path, where jitter is
 *     queueing, not reordering).
 * -R  with -j: each packet's extra hold is drawn on its own and packets
 *     leave in due-time order, not arrival order, so a packet held less
 *     than the one ahead of it overtakes it (reordering, as on a path that
 *     spreads packets over links of different lengths).
 * -l  random loss: each packet is dropped with probability LOSS_PCT/100,
 *     independently of the others (0 .. 100, fractional allowed).
 * -g  bursty loss, the Gilbert-Elliott model, all four in percent: a
 *     two-state chain stepped once per packet, P = P(good -> bad), R =
 *     P(bad -> good); a packet is lost with probability 100-H percent in
 *     the bad state and 100-K in the good one (defaults H = 0, K = 100:
 *     every packet lost in the bad state, none in the good, the Gilbert
 *     model). Mean loss: P/(P+R) (1-h) + R/(P+R) (1-k). Excludes -l.
 * -S  seed of the random draws (jitter, loss); the default mixes the
 *     time and the pid. The same seed and the same packets give the same
 *     losses and holds: loss and jitter draw from streams of their own, so
 *     adding jitter does not change which packets are lost.
 * -s  also write the counters to STATS_FILE as "key value" lines (packets
 *     in, forwarded, lost to the model, dropped for a full queue, ...),
 *     replaced whole on SIGUSR1 and at exit, for scripts.
 * -c  control file: on SIGUSR2 the delay line re-reads CONTROL_FILE, "key
 *     value" lines, and applies what it names to the packets read from
 *     then on: delay MS, jitter MS, loss PCT (random loss; it replaces -l
 *     or -g), gen N (any number, echoed back). Unknown keys and bad values
 *     are reported and the whole file is ignored. After applying, it
 *     rewrites the -s file, which names the values in force and the last
 *     gen applied (ctrl_gen), so a script can wait until a change has taken
 *     effect. Packets already held keep the due time they were given; when
 *     the delay falls, the ones read after the change wait behind them (the
 *     order of packets is kept, nothing is dropped), so the shorter delay
 *     shows from the first packet read at least the old delay after the
 *     change. -R is fixed at start (reordering follows the new jitter).
 * -q  most bytes held at once (suffix K, M or G; default 256M). A packet
 *     that does not fit is dropped and counted, as a full router queue does.
 * -r  run both threads SCHED_FIFO at this priority (1..99). On a machine
 *     whose CPUs are busy, an ordinary thread wakes up milliseconds after
 *     a packet's due time; a real-time one is not kept waiting by ordinary
 *     tasks. Its CPU use is bounded by the packet rate (and by the kernel's
 *     real-time throttling), so it cannot lock the machine up.
 * -t  tamper: in every EVERY-th IPv4 TCP packet that carries payload (1 =
 *     every one; 0, the default, none), flip the bits of one payload byte,
 *     the middle one, and keep the packet valid, so that the receiving
 *     kernel accepts it and hands the changed byte to the application
 *     (checksums: see "Tampering" below). This is a man in the middle for
 *     testing what the endpoints notice; packets too short to hold a TCP
 *     header and payload, IP fragments and other protocols pass unchanged.
 * -G  no segmentation offload: the kernel hands over MTU-sized packets
 *     (one read and one write per 1500 bytes), as delay lines did before.
 * -v  print statistics to stderr on SIGUSR1 and at exit (without -v,
 *     SIGUSR1 still prints them).
 *
 * SIGUSR2 applies the -c file (ignored without -c).
 * SIGTERM, SIGINT and SIGHUP stop it cleanly (packets still held are
 * discarded and counted). Exit status: 0 after a stop signal, 1 on a system
 * error, 2 on a usage error.
 *
 * How it works. The main thread reads packets straight into a byte ring (no
 * allocation per packet), stamping each with its due time, now + delay, on
 * CLOCK_MONOTONIC. A second thread writes the packet at the head of the ring
 * back into the device when it is due: it sleeps on a futex with an absolute
 * CLOCK_MONOTONIC deadline (timer slack 1 ns), so it wakes for the due time
 * or for a stop request, never polls. Every packet has the same delay (or,
 * with -j, a hold never shorter than the one ahead of it), so the ring is
 * in due order and the order of packets is kept. With -R the ring is in
 * arrival order and not in due order: the writer keeps a min-heap (on due
 * time) of the records it has seen, writes the earliest when due, marks it
 * sent, and frees ring space by moving the head past sent records, so a
 * long-held packet keeps the space behind it until it leaves (the queue
 * bound counts it). One reader, one
 * writer: the ring needs only the two positions, published with
 * release/acquire. The writer sleeps on the futex when the ring is empty;
 * the reader wakes it only on that transition.
 *
 * Offload. By default the device is opened with IFF_VNET_HDR and told
 * (TUNSETOFFLOAD) that checksums and TCP segmentation may be left to it, so
 * TCP hands it GSO packets of up to 64 KiB: each read returns one such packet
 * behind a 10-byte virtio_net_hdr, and writing the same bytes back gives the
 * kernel the same packet, still to be segmented (or, as here between
 * namespaces over veth and a bridge, delivered whole). That is one read and
 * one write per 64 KiB instead of per 1500 bytes: at 1 Gbit/s, the per-packet
 * system calls were what a delay line spent its CPU on. Shaping is unchanged:
 * tbf sits before the device and counts a GSO packet as its segments' bytes
 * (it splits one larger than its burst). The header is stored with the
 * packet and only -t reads it; the byte counters leave it out.
 *
 * Loss (-l, -g) is decided when a packet is read, before it is queued: a
 * lost packet takes no ring space and is counted. With offload one record
 * may be a TCP GSO packet of up to 44 MTU-sized segments; losing it whole
 * would lose all of them at once, a burst no real path of that loss rate
 * makes. So the model draws once per segment the packet will become on the
 * wire (the vnet header's gso_size of payload each). When none is lost the
 * record is queued whole, as without loss; when all are, it is dropped;
 * otherwise it is cut here into its segments as the kernel's GSO would cut
 * it (IP length and, for IPv4, ID and header checksum per segment; TCP
 * sequence number; FIN and PSH on the last segment only, CWR on the first
 * only; the TCP checksum left to the kernel, its field the pseudo-header's
 * sum for the segment's length, as for any offloaded packet), and only the
 * segments drawn to survive are queued, each a packet of its own with the
 * same due time. At 0.1% loss about 4% of 64 KiB records are cut, at 1%
 * about 36%: the delay line keeps most of offload's saving (one read and
 * write per 64 KiB) where one packet per MTU costs it most of 2 cores at
 * 1 Gbit/s. Counters count segments for the loss (in_segs, lost_pkts).
 *
 * Random numbers come from a splitmix64-style generator per use (a 64-bit
 * counter stepped by an odd constant, each value passed through a
 * multiply-xorshift finaliser), seeded from -S through the same mix.
 *
 * Tampering (-t) and checksums. A changed byte must come with a TCP checksum
 * that matches, or the receiver drops the segment and TCP sends it again
 * (untouched: the byte would never arrive). Which checksum there is depends
 * on the vnet header's flags. With VIRTIO_NET_HDR_F_NEEDS_CSUM (offload on,
 * the usual case for a local sender's TCP) the checksum field holds only
 * the pseudo-header's sum and the kernel completes it over the payload
 * after the packet is written back (or never does: over veth the receiver
 * takes the packet as checked), so the field is left alone. Without that
 * flag (-G: no vnet header; or a header whose flags say the checksum is
 * already complete) the full checksum is updated for the one changed 16-bit
 * word, incrementally as RFC 1624 eqn. 3 gives it: HC' = ~(~HC + ~m + m').
 * Both cases are counted.
 *
 * Build: cc -std=c11 -O2 -Wall -Wextra -pthread -o delayline delayline.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/if_tun.h>
#include <linux/virtio_net.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define VNET_HDR 10u             /* struct virtio_net_hdr before each packet */
#define MAX_PKT (65536u + 256u)  /* largest record a TUN read can return:
                                  * a 64 KiB GSO packet and its vnet header */
#define REC_ALIGN 16u            /* record size granularity in the ring */
#define DEFAULT_QUEUE (256u << 20)
#define MIN_QUEUE (1u << 20)
#define READ_BATCH 256           /* reads per poll wake-up, at most */

/* One queued packet: this header, then len bytes, padded to REC_ALIGN. A
 * record never straddles the end of the ring; when the space left before the
 * end is too small, a record with wrap set fills it and the next record
 * starts at offset 0. */
struct rec {
  uint32_t len;
  uint32_t wrap;                 /* REC_PKT, REC_WRAP or (writer, -R) REC_SENT */
  int64_t due_ns;
};
enum { REC_PKT = 0, REC_WRAP = 1, REC_SENT = 2 };
_Static_assert(sizeof(struct rec) == REC_ALIGN, "record header size");

/* Counters: each has one writing thread (reader or writer); anyone may read
 * them for a report, hence relaxed atomics. */
struct stats {
  _Atomic uint64_t rx_pkts, rx_bytes;      /* read from the device */
  _Atomic uint64_t drop_pkts, drop_bytes;  /* ring full */
  _Atomic uint64_t max_queued;             /* most bytes held at once */
  _Atomic uint64_t tx_pkts, tx_bytes;      /* written back */
  _Atomic uint64_t tx_errors;              /* writes refused by the kernel */
  _Atomic uint64_t late_sum_ns, late_max_ns, late_over_1ms;
  _Atomic uint64_t discarded;              /* still held at exit */
  _Atomic uint64_t tcp_payload_pkts;       /* -t: TCP packets with payload seen */
  _Atomic uint64_t tamper_csum;            /* -t: tampered, full checksum updated */
  _Atomic uint64_t tamper_partial;         /* -t: tampered, checksum left to the kernel */
  _Atomic uint64_t lost_pkts, lost_bytes;  /* -l, -g: dropped by the loss model (segments) */
  _Atomic uint64_t rx_segs;                /* read, a GSO packet counted as its segments */
  _Atomic uint64_t split_pkts;             /* GSO packets cut into segments for a loss */
  _Atomic uint64_t reordered;              /* -R: sent before a packet that came earlier */
};

/* A small generator: splitmix64 (Steele, Lea, Flood 2014) as described,
 * a Weyl sequence through a 64-bit mixing function. */
struct rng {
  uint64_t s;
};

static uint64_t mix64(uint64_t z)
{
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static inline uint64_t rng_next(struct rng *g)
{
  g->s += 0x9e3779b97f4a7c15ULL;
  return mix64(g->s);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double rng_unit(struct rng *g)
{
  return (double)(rng_next(g) >> 11) * (1.0 / 9007199254740992.0);
}

/* Loss models, decided by the reader per packet. */
enum { LOSS_NONE, LOSS_RANDOM, LOSS_GILBERT };
struct loss {
  int model;
  double p_loss;                           /* LOSS_RANDOM */
  double p, r, loss_bad, loss_good;        /* LOSS_GILBERT, probabilities */
  int bad;                                 /* LOSS_GILBERT: current state */
  struct rng g;
};

/* Writer side of -R: records seen but not yet sent, by due time. */
struct pend {
  int64_t due_ns;
  uint64_t pos;                            /* absolute ring offset of the record */
  uint64_t seq;                            /* arrival order */
};

struct line {
  int fd;
  uint32_t hdr;                            /* vnet header bytes per record (0 or VNET_HDR) */
  char ifname[IFNAMSIZ];
  _Atomic int64_t delay_ns;                /* written by the reader thread (-c), read by both */
  int64_t jitter_ns;                       /* -j: uniform extra hold; reader only */
  int64_t last_due_ns;                     /* reader only: keeps FIFO order */
  int reorder;                             /* -R: holds independent, order not kept */
  struct rng jit;                          /* reader only: jitter draws */
  struct loss loss;                        /* reader only */
  const char *stats_path;                  /* -s */
  const char *ctrl_path;                   /* -c */
  uint64_t ctrl_gen;                       /* -c: last gen applied */
  uint64_t seed;                           /* -S, or the one chosen */
  uint64_t tamper_every;                   /* -t: 0 = off */
  unsigned char *mem;
  uint64_t cap;                            /* multiple of REC_ALIGN */
  _Atomic uint64_t head;                   /* absolute; advanced by writer */
  _Atomic uint64_t tail;                   /* absolute; advanced by reader */
  _Atomic uint32_t wake;                   /* futex word, bumped to wake */
  _Atomic int writer_idle;                 /* writer waits for a packet */
  _Atomic int stop;
  struct stats st;
};

static unsigned char scratch[MAX_PKT];
static unsigned char split_src[MAX_PKT];  /* reader only: a GSO packet being cut */

static void usage(FILE *f)
{
  fprintf(f,
          "usage: delayline -i IFNAME -d DELAY_MS [-j JITTER_MS [-R]] [-l LOSS_PCT | -g P,R[,H[,K]]]\n"
          "                 [-S SEED] [-s STATS_FILE] [-c CONTROL_FILE] [-q MAX_QUEUE_BYTES]\n"
          "                 [-r RT_PRIO] [-t EVERY] [-G] [-v]\n"
          "  holds each packet routed into TUN device IFNAME for DELAY_MS\n"
          "  milliseconds, then gives it back to the kernel.\n"
          "  -j  add a uniform random hold in [0, JITTER_MS), order kept\n"
          "  -R  with -j: holds drawn independently, later packets may overtake\n"
          "  -l  drop each packet with probability LOSS_PCT percent\n"
          "  -g  Gilbert-Elliott loss, percent: P(good->bad), P(bad->good),\n"
          "      pass in bad H (default 0), pass in good K (default 100)\n"
          "  -S  seed of the random draws (default: time and pid)\n"
          "  -s  write counters to STATS_FILE on SIGUSR1 and at exit\n"
          "  -c  on SIGUSR2 re-read CONTROL_FILE (lines: delay MS, jitter MS,\n"
          "      loss PCT, gen N) and apply it to the packets read from then on\n"
          "  -q  queue bound, suffix K/M/G allowed (default 256M)\n"
          "  -r  SCHED_FIFO priority 1..99 for its threads (default: none)\n"
          "  -t  flip one payload byte of every EVERY-th TCP packet with payload,\n"
          "      checksum kept valid (test tampering; default 0 = never)\n"
          "  -G  no segmentation offload (one packet per MTU)\n"
          "  -v  statistics to stderr on SIGUSR1 and at exit\n");
}

static int64_t mono_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline uint64_t rec_size(uint32_t len)
{
  return ((uint64_t)sizeof(struct rec) + len + REC_ALIGN - 1) & ~(uint64_t)(REC_ALIGN - 1);
}

static inline void counter_add(_Atomic uint64_t *c, uint64_t v)
{
  /* Single writer per counter: a plain load and store is enough. */
  atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + v,
                        memory_order_relaxed);
}

static inline uint64_t counter(_Atomic uint64_t *c)
{
  return atomic_load_explicit(c, memory_order_relaxed);
}

/* Sleeps until *word is no longer seq, a wake-up, or the absolute monotonic
 * deadline (0: none). Spurious returns are fine: every caller re-checks. */
static void futex_wait_until(_Atomic uint32_t *word, uint32_t seq, int64_t deadline_ns)
{
  struct timespec ts, *tsp = NULL;
  if (deadline_ns > 0) {
    ts.tv_sec = deadline_ns / 1000000000;
    ts.tv_nsec = deadline_ns % 1000000000;
    tsp = &ts;
  }
  /* FUTEX_WAIT_BITSET takes an absolute timeout on CLOCK_MONOTONIC. */
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG,
          seq, tsp, NULL, FUTEX_BITSET_MATCH_ANY);
}

static void futex_wake(_Atomic uint32_t *word)
{
  atomic_fetch_add(word, 1);
  syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE | FUTEX_PRIVATE_FLAG, 1, NULL, NULL, 0);
}

/* Reader side: returns where a record of up to need bytes (header included)
 * may be written, writing a wrap record first when the end of the ring is too
 * close; NULL when the ring lacks the room. *tail is the reader's unpublished
 * tail and is moved past a wrap record. */
static struct rec *ring_reserve(struct line *l, uint64_t *tail, uint64_t need)
{
  uint64_t head = atomic_load_explicit(&l->head, memory_order_acquire);
  uint64_t free_bytes = l->cap - (*tail - head);
  uint64_t idx = *tail % l->cap;
  uint64_t contig = l->cap - idx;
  if (contig >= need)
    return free_bytes >= need ? (struct rec *)(l->mem + idx) : NULL;
  if (free_bytes < contig + need)
    return NULL;
  struct rec *w = (struct rec *)(l->mem + idx);
  w->len = 0;
  w->wrap = 1;
  w->due_ns = 0;
  *tail += contig;
  return (struct rec *)l->mem;
}

static void publish(struct line *l, uint64_t tail)
{
  atomic_store_explicit(&l->tail, tail, memory_order_seq_cst);
  uint64_t queued = tail - atomic_load_explicit(&l->head, memory_order_relaxed);
  if (queued > counter(&l->st.max_queued))
    atomic_store_explicit(&l->st.max_queued, queued, memory_order_relaxed);
  /* Pairs with the writer's store of writer_idle then load of tail: one of
   * the two sides sees the other's store (both seq_cst). */
  if (atomic_load_explicit(&l->writer_idle, memory_order_seq_cst))
    futex_wake(&l->wake);
}

/* The one's complement sum after one 16-bit word of the summed data changed
 * from m to m1 (RFC 1624 eqn. 3; all values in host order). */
static uint16_t csum_replace16(uint16_t hc, uint16_t m, uint16_t m1)
{
  uint32_t s = (uint32_t)(uint16_t)~hc + (uint16_t)~m + m1;
  s = (s & 0xffff) + (s >> 16);
  s = (s & 0xffff) + (s >> 16);
  return (uint16_t)~s;
}

/* -t: rec is one record as read (vnet header, if any, then the IP packet),
 * n bytes. Every tamper_every-th IPv4 TCP packet with payload gets the bits
 * of its middle payload byte flipped, its checksum kept valid (see
 * "Tampering" at the top). */
static void tamper(struct line *l, unsigned char *rec, size_t n)
{
  if (n < l->hdr + 20)
    return;
  unsigned char *ip = rec + l->hdr;
  size_t len = n - l->hdr;
  size_t ihl = (size_t)(ip[0] & 15) * 4;
  size_t tot = (size_t)ip[2] << 8 | ip[3];
  /* Version 4, TCP, not a fragment (MF or an offset: the TCP header or the
   * checksum's other bytes are in another packet). */
  if (ip[0] >> 4 != 4 || ip[9] != 6 || ihl < 20 || (((unsigned)ip[6] << 8 | ip[7]) & 0x3fff))
    return;
  if (tot > len || tot < ihl + 20)
    return;
  unsigned char *tcp = ip + ihl;
  size_t seg = tot - ihl;                  /* TCP header and payload */
  size_t doff = (size_t)(tcp[12] >> 4) * 4;
  if (doff < 20 || doff >= seg)
    return;                                /* no payload */
  uint64_t seen = counter(&l->st.tcp_payload_pkts) + 1;
  counter_add(&l->st.tcp_payload_pkts, 1);
  if (seen % l->tamper_every)
    return;
  size_t at = doff + (seg - doff) / 2;     /* offset in the segment */
  /* The checksum sums 16-bit words from the TCP header on (an even offset
   * in the packet: ihl is a multiple of 4); an odd last byte is padded with
   * a zero. */
  size_t w = at & ~(size_t)1;
  uint16_t m = (uint16_t)(tcp[w] << 8 | (w + 1 < seg ? tcp[w + 1] : 0));
  tcp[at] ^= 0xff;
  uint16_t m1 = (uint16_t)(tcp[w] << 8 | (w + 1 < seg ? tcp[w + 1] : 0));
  if (l->hdr && (rec[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM)) {
    counter_add(&l->st.tamper_partial, 1);
    return;
  }
  uint16_t hc = (uint16_t)(tcp[16] << 8 | tcp[17]);
  hc = csum_replace16(hc, m, m1);
  tcp[16] = (unsigned char)(hc >> 8);
  tcp[17] = (unsigned char)hc;
  counter_add(&l->st.tamper_csum, 1);
}

/* Whether the next packet is lost; steps the Gilbert-Elliott chain. */
static int loss_draw(struct loss *m)
{
  switch (m->model) {
  case LOSS_RANDOM:
    return rng_unit(&m->g) < m->p_loss;
  case LOSS_GILBERT: {
    /* The state moves first, then the packet is lost or not in the state
     * it finds (the stationary mean loss is the same either way). */
    double u = rng_unit(&m->g);
    if (m->bad ? u < m->r : u < m->p)
      m->bad = !m->bad;
    return rng_unit(&m->g) < (m->bad ? m->loss_bad : m->loss_good);
  }
  default:
    return 0;
  }
}

/* A TCP GSO packet as read with its vnet header (see "Loss" at the top). */
#define MAX_SEGS 256u                      /* 64 KiB of payload in 256-byte segments */
struct gso {
  struct virtio_net_hdr vh;
  size_t ihl, thl, payload;                /* IP and TCP header bytes, payload bytes */
  unsigned gso_size, nseg, v6;
  unsigned char lost[MAX_SEGS];
};

/* Whether rec (n bytes: vnet header, then the IP packet) is a TCP GSO packet
 * of two or more segments that can be cut here: IPv4 or IPv6 with TCP right
 * after the fixed header, its checksum left to the kernel. Fills g. */
static int gso_parse(const struct line *l, const unsigned char *rec, size_t n, struct gso *g)
{
  if (l->hdr != VNET_HDR || n < VNET_HDR + 40)
    return 0;
  memcpy(&g->vh, rec, sizeof g->vh);
  unsigned type = g->vh.gso_type & ~(unsigned)VIRTIO_NET_HDR_GSO_ECN;
  if ((type != VIRTIO_NET_HDR_GSO_TCPV4 && type != VIRTIO_NET_HDR_GSO_TCPV6) ||
      !(g->vh.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM) || g->vh.gso_size < 256)
    return 0;
  const unsigned char *ip = rec + VNET_HDR;
  size_t len = n - VNET_HDR, tot;
  if (ip[0] >> 4 == 4) {
    g->v6 = 0;
    g->ihl = (size_t)(ip[0] & 15) * 4;
    tot = (size_t)ip[2] << 8 | ip[3];
    if (ip[9] != 6 || g->ihl < 20)
      return 0;
  } else if (ip[0] >> 4 == 6) {
    g->v6 = 1;
    g->ihl = 40;
    tot = 40 + ((size_t)ip[4] << 8 | ip[5]);
    if (ip[6] != 6)
      return 0;
  } else {
    return 0;
  }
  if (tot > len || tot < g->ihl + 20)
    return 0;
  g->thl = (size_t)(ip[g->ihl + 12] >> 4) * 4;
  if (g->thl < 20 || g->ihl + g->thl > tot)
    return 0;
  g->payload = tot - g->ihl - g->thl;
  g->gso_size = g->vh.gso_size;
  g->nseg = (unsigned)((g->payload + g->gso_size - 1) / g->gso_size);
  return g->nseg >= 2 && g->nseg <= MAX_SEGS;
}

/* Folded one's-complement sum of len bytes (big-endian words) onto sum. */
static uint32_t csum_add(uint32_t sum, const unsigned char *p, size_t len)
{
  for (size_t i = 0; i + 1 < len; i += 2)
    sum += (uint32_t)p[i] << 8 | p[i + 1];
  if (len & 1)
    sum += (uint32_t)p[len - 1] << 8;
  while (sum >> 16)
    sum = (sum & 0xffff) + (sum >> 16);
  return sum;
}

/* Queues the segments of the GSO packet src (n bytes, parsed into g) that
 * the draw kept, from *tail on, each due at due; publishes them. A segment
 * the ring has no room for is counted as a queue drop. */
static void split_publish(struct line *l, uint64_t *tail, const unsigned char *src, const struct gso *g,
                          int64_t due)
{
  const unsigned char *ip = src + VNET_HDR, *tcp = ip + g->ihl, *data = tcp + g->thl;
  uint32_t seq0 = (uint32_t)tcp[4] << 24 | (uint32_t)tcp[5] << 16 | (uint32_t)tcp[6] << 8 | tcp[7];
  unsigned id0 = (unsigned)ip[4] << 8 | ip[5];
  counter_add(&l->st.split_pkts, 1);
  for (unsigned i = 0; i < g->nseg; i++) {
    size_t off = (size_t)i * g->gso_size;
    size_t seg = g->payload - off < g->gso_size ? g->payload - off : g->gso_size;
    uint32_t len = (uint32_t)(VNET_HDR + g->ihl + g->thl + seg);
    if (g->lost[i])
      continue;
    uint64_t t = *tail;
    struct rec *r = ring_reserve(l, &t, rec_size(len));
    if (!r) {
      counter_add(&l->st.drop_pkts, 1);
      counter_add(&l->st.drop_bytes, len - VNET_HDR);
      continue;
    }
    unsigned char *o = (unsigned char *)(r + 1), *oip = o + VNET_HDR, *otcp = oip + g->ihl;
    struct virtio_net_hdr vh = {.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM,
                                .gso_type = VIRTIO_NET_HDR_GSO_NONE,
                                .csum_start = (uint16_t)g->ihl,
                                .csum_offset = 16};
    memcpy(o, &vh, sizeof vh);
    memcpy(oip, ip, g->ihl + g->thl);
    memcpy(otcp + g->thl, data + off, seg);
    size_t tcplen = g->thl + seg;
    if (!g->v6) {
      size_t tot = g->ihl + tcplen;
      unsigned id = (id0 + i) & 0xffff;
      oip[2] = (unsigned char)(tot >> 8), oip[3] = (unsigned char)tot;
      oip[4] = (unsigned char)(id >> 8), oip[5] = (unsigned char)id;
      oip[10] = oip[11] = 0;
      uint16_t hc = (uint16_t)~csum_add(0, oip, g->ihl);
      oip[10] = (unsigned char)(hc >> 8), oip[11] = (unsigned char)hc;
    } else {
      oip[4] = (unsigned char)(tcplen >> 8), oip[5] = (unsigned char)tcplen;
    }
    uint32_t seq = seq0 + (uint32_t)off;
    otcp[4] = (unsigned char)(seq >> 24), otcp[5] = (unsigned char)(seq >> 16);
    otcp[6] = (unsigned char)(seq >> 8), otcp[7] = (unsigned char)seq;
    if (i + 1 < g->nseg)
      otcp[13] &= (unsigned char)~0x09;    /* FIN, PSH: the last segment's */
    if (i > 0)
      otcp[13] &= (unsigned char)~0x80;    /* CWR: the first segment's */
    /* The pseudo-header's sum, not complemented: the kernel adds the
     * segment's own bytes (VIRTIO_NET_HDR_F_NEEDS_CSUM). */
    unsigned char pl[4] = {0, 0, (unsigned char)(tcplen >> 8), (unsigned char)tcplen};
    unsigned char pp[4] = {0, 0, 0, 6};
    uint32_t ps = g->v6 ? csum_add(0, oip + 8, 32) : csum_add(0, oip + 12, 8);
    ps = csum_add(csum_add(ps, pl, 4), pp, 4);
    otcp[16] = (unsigned char)(ps >> 8), otcp[17] = (unsigned char)ps;
    r->len = len;
    r->wrap = REC_PKT;
    r->due_ns = due;
    *tail = t + rec_size(len);
  }
  publish(l, *tail);
}

/* When a packet read at now is due, keeping FIFO order unless -R: the
 * writer sends the ring in order, so a due time never precedes the one
 * ahead of it (with jitter, or after -c lowered the delay). */
static int64_t due_time(struct line *l, int64_t now)
{
  int64_t due = now + atomic_load_explicit(&l->delay_ns, memory_order_relaxed);
  if (l->jitter_ns > 0)
    due += (int64_t)(rng_next(&l->jit) % (uint64_t)l->jitter_ns);
  if (!l->reorder) {
    if (due < l->last_due_ns)
      due = l->last_due_ns;
    l->last_due_ns = due;
  }
  return due;
}

/* Reads what the device has ready (up to READ_BATCH packets). Returns 0, or
 * -1 after printing the cause when the device failed. */
static int read_batch(struct line *l)
{
  uint64_t tail = atomic_load_explicit(&l->tail, memory_order_relaxed);
  for (int i = 0; i < READ_BATCH; i++) {
    uint64_t t = tail;
    struct rec *r = ring_reserve(l, &t, sizeof(struct rec) + MAX_PKT);
    unsigned char *dst = r ? (unsigned char *)(r + 1) : scratch;
    ssize_t n = read(l->fd, dst, MAX_PKT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR)
        return 0;
      fprintf(stderr, "delayline %s: read: %s\n", l->ifname, strerror(errno));
      return -1;
    }
    if (n == 0)
      continue;
    int64_t now = mono_ns();
    counter_add(&l->st.rx_pkts, 1);
    counter_add(&l->st.rx_bytes, (uint64_t)n - l->hdr);
    if (!r) {
      /* No room for the largest packet; this one may still fit. */
      t = tail;
      r = ring_reserve(l, &t, rec_size((uint32_t)n));
      if (!r) {
        counter_add(&l->st.drop_pkts, 1);
        counter_add(&l->st.drop_bytes, (uint64_t)n - l->hdr);
        continue;
      }
      memcpy(r + 1, scratch, (size_t)n);
    }
    unsigned char *pkt = (unsigned char *)(r + 1);
    static struct gso g;
    if (l->loss.model != LOSS_NONE && gso_parse(l, pkt, (size_t)n, &g)) {
      unsigned nlost = 0;
      for (unsigned k = 0; k < g.nseg; k++)
        nlost += g.lost[k] = (unsigned char)loss_draw(&l->loss);
      counter_add(&l->st.rx_segs, g.nseg);
      if (nlost > 0) {
        counter_add(&l->st.lost_pkts, nlost);
        counter_add(&l->st.lost_bytes, (uint64_t)nlost * (g.ihl + g.thl + g.gso_size));
        if (nlost == g.nseg)
          continue;                        /* not published, as below */
        if (l->tamper_every)
          tamper(l, pkt, (size_t)n);
        memcpy(split_src, pkt, (size_t)n);
        split_publish(l, &tail, split_src, &g, due_time(l, now));
        continue;
      }
    } else {
      counter_add(&l->st.rx_segs, 1);
      if (loss_draw(&l->loss)) {
        /* Written into the ring (or scratch) but not published: the space
         * is reused by the next packet. A wrap record written for it by
         * ring_reserve is not published either. */
        counter_add(&l->st.lost_pkts, 1);
        counter_add(&l->st.lost_bytes, (uint64_t)n - l->hdr);
        continue;
      }
    }
    if (l->tamper_every)
      tamper(l, pkt, (size_t)n);
    r->len = (uint32_t)n;
    r->wrap = REC_PKT;
    r->due_ns = due_time(l, now);
    tail = t + rec_size((uint32_t)n);
    publish(l, tail);
  }
  return 0;
}

/* Writes one packet back; the kernel takes it as received on the device. */
static void write_packet(struct line *l, const struct rec *r)
{
  for (int tries = 0;; tries++) {
    ssize_t n = write(l->fd, r + 1, r->len);
    if (n >= 0)
      break;
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN && tries < 100) {
      struct pollfd p = {.fd = l->fd, .events = POLLOUT};
      poll(&p, 1, 1);
      continue;
    }
    if (counter(&l->st.tx_errors) == 0)
      fprintf(stderr, "delayline %s: write of a %" PRIu32 "-byte packet: %s (dropped; further "
              "errors only counted)\n", l->ifname, r->len, strerror(errno));
    counter_add(&l->st.tx_errors, 1);
    return;
  }
  counter_add(&l->st.tx_pkts, 1);
  counter_add(&l->st.tx_bytes, r->len - l->hdr);
}

static void note_late(struct line *l, int64_t now, int64_t due);

static void *writer_main(void *arg)
{
  struct line *l = arg;
  /* Default slack (50 us) would be added to every due-time wake-up. */
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  uint64_t head = atomic_load_explicit(&l->head, memory_order_relaxed);
  while (!atomic_load_explicit(&l->stop, memory_order_relaxed)) {
    uint32_t seq = atomic_load_explicit(&l->wake, memory_order_seq_cst);
    uint64_t tail = atomic_load_explicit(&l->tail, memory_order_acquire);
    if (head == tail) {
      atomic_store_explicit(&l->writer_idle, 1, memory_order_seq_cst);
      if (atomic_load_explicit(&l->tail, memory_order_seq_cst) == head &&
          !atomic_load_explicit(&l->stop, memory_order_seq_cst))
        futex_wait_until(&l->wake, seq, 0);
      atomic_store_explicit(&l->writer_idle, 0, memory_order_relaxed);
      continue;
    }
    const struct rec *r = (const struct rec *)(l->mem + head % l->cap);
    if (r->wrap) {
      head += l->cap - head % l->cap;
      atomic_store_explicit(&l->head, head, memory_order_release);
      continue;
    }
    int64_t now = mono_ns();
    if (r->due_ns > now) {
      futex_wait_until(&l->wake, seq, r->due_ns);
      continue;
    }
    write_packet(l, r);
    note_late(l, now, r->due_ns);
    head += rec_size(r->len);
    atomic_store_explicit(&l->head, head, memory_order_release);
  }
  /* Count what is left; the reader has stopped by now. */
  uint64_t tail = atomic_load_explicit(&l->tail, memory_order_acquire);
  while (head != tail) {
    const struct rec *r = (const struct rec *)(l->mem + head % l->cap);
    if (r->wrap) {
      head += l->cap - head % l->cap;
      continue;
    }
    counter_add(&l->st.discarded, 1);
    head += rec_size(r->len);
  }
  atomic_store_explicit(&l->head, head, memory_order_release);
  return NULL;
}

/* The writer of -R: sends records in due order, whatever their order in the
 * ring (see "How it works"). Returns when stopped; on a failed allocation
 * it stops the delay line (status 1 via l->stop = 2). */
struct heap {
  struct pend *v;
  size_t n, cap;
};

static int pend_before(const struct pend *a, const struct pend *b)
{
  return a->due_ns < b->due_ns || (a->due_ns == b->due_ns && a->seq < b->seq);
}

static int heap_push(struct heap *h, struct pend e)
{
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 1024;
    struct pend *v = realloc(h->v, cap * sizeof *v);
    if (!v)
      return -1;
    h->v = v;
    h->cap = cap;
  }
  size_t i = h->n++;
  while (i > 0 && pend_before(&e, &h->v[(i - 1) / 2])) {
    h->v[i] = h->v[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->v[i] = e;
  return 0;
}

static struct pend heap_pop(struct heap *h)
{
  struct pend top = h->v[0], last = h->v[--h->n];
  size_t i = 0;
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n)
      break;
    if (c + 1 < h->n && pend_before(&h->v[c + 1], &h->v[c]))
      c++;
    if (!pend_before(&h->v[c], &last))
      break;
    h->v[i] = h->v[c];
    i = c;
  }
  if (h->n)
    h->v[i] = last;
  return top;
}

static void note_late(struct line *l, int64_t now, int64_t due)
{
  uint64_t late = (uint64_t)(now - due);
  counter_add(&l->st.late_sum_ns, late);
  if (late > counter(&l->st.late_max_ns))
    atomic_store_explicit(&l->st.late_max_ns, late, memory_order_relaxed);
  if (late > 1000000)
    counter_add(&l->st.late_over_1ms, 1);
}

static void *writer_reorder_main(void *arg)
{
  struct line *l = arg;
  struct heap h = {0};
  uint64_t seq = 1, max_sent = 0;
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  uint64_t head = atomic_load_explicit(&l->head, memory_order_relaxed), scan = head;
  while (!atomic_load_explicit(&l->stop, memory_order_relaxed)) {
    uint32_t wseq = atomic_load_explicit(&l->wake, memory_order_seq_cst);
    uint64_t tail = atomic_load_explicit(&l->tail, memory_order_acquire);
    while (scan != tail) {
      struct rec *r = (struct rec *)(l->mem + scan % l->cap);
      if (r->wrap == REC_WRAP) {
        scan += l->cap - scan % l->cap;
        continue;
      }
      if (heap_push(&h, (struct pend){.due_ns = r->due_ns, .pos = scan, .seq = seq++}) < 0) {
        fprintf(stderr, "delayline %s: out of memory for the reorder heap (%zu packets held)\n",
                l->ifname, h.n);
        atomic_store(&l->stop, 2);
        kill(getpid(), SIGTERM);           /* to the main thread's signalfd */
        break;
      }
      scan += rec_size(r->len);
    }
    /* Space back to the reader: everything before the oldest unsent record. */
    uint64_t old_head = head;
    while (head != scan) {
      struct rec *r = (struct rec *)(l->mem + head % l->cap);
      if (r->wrap == REC_WRAP)
        head += l->cap - head % l->cap;
      else if (r->wrap == REC_SENT)
        head += rec_size(r->len);
      else
        break;
    }
    if (head != old_head)
      atomic_store_explicit(&l->head, head, memory_order_release);
    int64_t now = mono_ns();
    if (h.n == 0 || h.v[0].due_ns > now) {
      /* A packet still to come is due at least one delay after it comes:
       * if the earliest held one is due before that, nothing can overtake
       * it and the reader need not wake us. Otherwise it must. */
      int need_wake = h.n == 0 ||
                      h.v[0].due_ns - now > atomic_load_explicit(&l->delay_ns, memory_order_relaxed);
      if (need_wake) {
        atomic_store_explicit(&l->writer_idle, 1, memory_order_seq_cst);
        if (atomic_load_explicit(&l->tail, memory_order_seq_cst) == scan &&
            !atomic_load_explicit(&l->stop, memory_order_seq_cst))
          futex_wait_until(&l->wake, wseq, h.n ? h.v[0].due_ns : 0);
        atomic_store_explicit(&l->writer_idle, 0, memory_order_relaxed);
      } else {
        futex_wait_until(&l->wake, wseq, h.v[0].due_ns);
      }
      continue;
    }
    struct pend e = heap_pop(&h);
    struct rec *r = (struct rec *)(l->mem + e.pos % l->cap);
    write_packet(l, r);
    note_late(l, now, e.due_ns);
    if (e.seq < max_sent)
      counter_add(&l->st.reordered, 1);
    else
      max_sent = e.seq;
    r->wrap = REC_SENT;
  }
  /* Count what is left (the reader has stopped by now). */
  uint64_t tail = atomic_load_explicit(&l->tail, memory_order_acquire);
  while (head != tail) {
    const struct rec *r = (const struct rec *)(l->mem + head % l->cap);
    if (r->wrap == REC_WRAP) {
      head += l->cap - head % l->cap;
      continue;
    }
    if (r->wrap == REC_PKT)
      counter_add(&l->st.discarded, 1);
    head += rec_size(r->len);
  }
  atomic_store_explicit(&l->head, head, memory_order_release);
  free(h.v);
  return NULL;
}

/* -s: the counters as "key value" lines, replaced whole (written beside
 * it, then renamed) so that a reader never sees half a file. */
static void write_stats_file(struct line *l)
{
  if (!l->stats_path)
    return;
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", l->stats_path) >= (int)sizeof tmp)
    return;
  FILE *f = fopen(tmp, "w");
  if (!f) {
    fprintf(stderr, "delayline %s: write %s: %s\n", l->ifname, tmp, strerror(errno));
    return;
  }
  struct stats *s = &l->st;
  fprintf(f,
          "seed %" PRIu64 "\nin_pkts %" PRIu64 "\nin_bytes %" PRIu64 "\nout_pkts %" PRIu64
          "\nout_bytes %" PRIu64 "\nlost_pkts %" PRIu64 "\nlost_bytes %" PRIu64
          "\nqueue_drop_pkts %" PRIu64 "\nwrite_errors %" PRIu64 "\nreordered %" PRIu64
          "\ndiscarded %" PRIu64 "\nlate_avg_us %.1f\nlate_max_us %.1f\nlate_over_1ms %" PRIu64
          "\nin_segs %" PRIu64 "\nsplit_pkts %" PRIu64 "\ndelay_ms %.6g\njitter_ms %.6g\nloss_pct %.6g"
          "\nctrl_gen %" PRIu64 "\n",
          l->seed, counter(&s->rx_pkts), counter(&s->rx_bytes), counter(&s->tx_pkts),
          counter(&s->tx_bytes), counter(&s->lost_pkts), counter(&s->lost_bytes),
          counter(&s->drop_pkts), counter(&s->tx_errors), counter(&s->reordered),
          counter(&s->discarded),
          counter(&s->tx_pkts) ? (double)counter(&s->late_sum_ns) / (double)counter(&s->tx_pkts) / 1e3 : 0.0,
          (double)counter(&s->late_max_ns) / 1e3, counter(&s->late_over_1ms),
          counter(&s->rx_segs), counter(&s->split_pkts), (double)atomic_load(&l->delay_ns) / 1e6,
          (double)l->jitter_ns / 1e6, l->loss.model == LOSS_RANDOM ? 100.0 * l->loss.p_loss : 0.0,
          l->ctrl_gen);
  if (fclose(f) != 0 || rename(tmp, l->stats_path) != 0)
    fprintf(stderr, "delayline %s: write %s: %s\n", l->ifname, l->stats_path, strerror(errno));
}

static void print_stats(struct line *l)
{
  struct stats *s = &l->st;
  uint64_t tx = counter(&s->tx_pkts);
  uint64_t queued = atomic_load(&l->tail) - atomic_load(&l->head);
  char tampered[200] = "";
  if (l->tamper_every)
    snprintf(tampered, sizeof tampered,
             "; tampered %" PRIu64 " of %" PRIu64 " TCP packets with payload (every %" PRIu64
             "): checksum updated %" PRIu64 ", left to the kernel %" PRIu64,
             counter(&s->tamper_csum) + counter(&s->tamper_partial),
             counter(&s->tcp_payload_pkts), l->tamper_every, counter(&s->tamper_csum),
             counter(&s->tamper_partial));
  char model[256] = "";
  if (l->loss.model != LOSS_NONE || l->reorder)
    snprintf(model, sizeof model, "; lost (model) %" PRIu64 " of %" PRIu64 " segments, %" PRIu64
             " B; GSO packets cut %" PRIu64 "; reordered %" PRIu64 "; seed %" PRIu64,
             counter(&s->lost_pkts), counter(&s->rx_segs), counter(&s->lost_bytes),
             counter(&s->split_pkts), counter(&s->reordered), l->seed);
  /* One call: stderr is unbuffered and the writer may report an error. */
  fprintf(stderr,
          "delayline %s: delay %.3f ms; in %" PRIu64 " pkts %" PRIu64 " B; out %" PRIu64
          " pkts %" PRIu64 " B; dropped (queue full) %" PRIu64 " pkts %" PRIu64
          " B; write errors %" PRIu64 "; held now %" PRIu64 " B, most %" PRIu64
          " B of %" PRIu64 "; late avg %.1f us max %.1f us, >1 ms %" PRIu64
          "; discarded at exit %" PRIu64 "%s%s\n",
          l->ifname, (double)atomic_load(&l->delay_ns) / 1e6, counter(&s->rx_pkts), counter(&s->rx_bytes), tx,
          counter(&s->tx_bytes), counter(&s->drop_pkts), counter(&s->drop_bytes),
          counter(&s->tx_errors), queued, counter(&s->max_queued), l->cap,
          tx ? (double)counter(&s->late_sum_ns) / (double)tx / 1e3 : 0.0,
          (double)counter(&s->late_max_ns) / 1e3, counter(&s->late_over_1ms),
          counter(&s->discarded), model, tampered);
}

/* -c, on SIGUSR2 (main thread, which is also the reader: delay, jitter and
 * loss change between two packets). All or nothing: a file with a bad line
 * changes nothing. The writer is woken so that -R's wake-up rule sees the
 * new delay at once. */
static void ctrl_apply(struct line *l)
{
  FILE *f = fopen(l->ctrl_path, "r");
  if (!f) {
    fprintf(stderr, "delayline %s: control file %s: %s\n", l->ifname, l->ctrl_path,
            strerror(errno));
    return;
  }
  double delay_ms = (double)atomic_load(&l->delay_ns) / 1e6, jitter_ms = (double)l->jitter_ns / 1e6;
  double loss_pct = -1;                    /* < 0: loss model unchanged */
  uint64_t gen = l->ctrl_gen;
  char line[256], key[32];
  int ok = 1, lineno = 0;
  while (ok && fgets(line, sizeof line, f)) {
    lineno++;
    char val[64], *end;
    int n = sscanf(line, "%31s %63s", key, val);
    if (n <= 0 || key[0] == '#')
      continue;
    errno = 0;
    double v = n == 2 ? strtod(val, &end) : -1;
    if (n != 2 || errno || end == val || *end || v < 0)
      ok = 0;
    else if (!strcmp(key, "delay") && v <= 600000)
      delay_ms = v;
    else if (!strcmp(key, "jitter") && v <= 60000)
      jitter_ms = v;
    else if (!strcmp(key, "loss") && v <= 100)
      loss_pct = v;
    else if (!strcmp(key, "gen"))
      gen = (uint64_t)v;
    else
      ok = 0;
  }
  fclose(f);
  if (!ok) {
    fprintf(stderr, "delayline %s: control file %s, line %d: want delay MS, jitter MS, loss PCT "
            "or gen N; nothing changed\n", l->ifname, l->ctrl_path, lineno);
    return;
  }
  atomic_store_explicit(&l->delay_ns, (int64_t)(delay_ms * 1e6 + 0.5), memory_order_relaxed);
  l->jitter_ns = (int64_t)(jitter_ms * 1e6 + 0.5);
  if (loss_pct >= 0) {
    l->loss.model = loss_pct > 0 ? LOSS_RANDOM : LOSS_NONE;
    l->loss.p_loss = loss_pct / 100.0;
  }
  l->ctrl_gen = gen;
  futex_wake(&l->wake);
  fprintf(stderr, "delayline %s: control gen %" PRIu64 ": delay %.3f ms, jitter %.3f ms, loss %s\n",
          l->ifname, gen, delay_ms, jitter_ms,
          l->loss.model == LOSS_RANDOM ? "random" : l->loss.model == LOSS_GILBERT ? "gilbert" : "none");
  write_stats_file(l);
}

static int parse_size(const char *s, uint64_t *out)
{
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v <= 0)
    return -1;
  switch (*end) {
  case 'k': case 'K': v *= 1024.0; end++; break;
  case 'm': case 'M': v *= 1024.0 * 1024.0; end++; break;
  case 'g': case 'G': v *= 1024.0 * 1024.0 * 1024.0; end++; break;
  default: break;
  }
  if (*end == 'i' || *end == 'B' || *end == 'b')
    end += (*end == 'i' && (end[1] == 'B' || end[1] == 'b')) ? 2 : 1;
  if (*end || v > 64.0 * 1024 * 1024 * 1024)
    return -1;
  *out = (uint64_t)v;
  return 0;
}

/* Attaches to the TUN device; with offload, as a vnet-header device that
 * takes GSO packets. Sets *hdr to the bytes of header before each packet. */
static int open_tun(const char *name, int offload, uint32_t *hdr)
{
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    fprintf(stderr, "delayline: open /dev/net/tun: %s\n", strerror(errno));
    return -1;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI | (offload ? IFF_VNET_HDR : 0);
  memcpy(ifr.ifr_name, name, strlen(name));
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    fprintf(stderr, "delayline: attach TUN device %s: %s%s\n", name, strerror(errno),
            errno == EPERM ? " (needs CAP_NET_ADMIN)"
            : errno == EINVAL ? " (is it a tap or multi-queue device?)" : "");
    close(fd);
    return -1;
  }
  *hdr = 0;
  if (offload) {
    int sz = VNET_HDR;
    if (ioctl(fd, TUNSETVNETHDRSZ, &sz) < 0 ||
        ioctl(fd, TUNSETOFFLOAD, (unsigned long)(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6)) < 0) {
      fprintf(stderr, "delayline %s: warning: segmentation offload refused (%s); one packet "
              "per MTU\n", name, strerror(errno));
      /* The header stays (the flag is the device's now) but is all zeros. */
      ioctl(fd, TUNSETOFFLOAD, 0UL);
    }
    *hdr = VNET_HDR;
  }
  return fd;
}

int main(int argc, char **argv)
{
  static struct line l;
  const char *ifname = NULL;
  double delay_ms = -1, jitter_ms = 0, loss_pct = 0, ge[4] = {0, 0, 0, 100};
  uint64_t qbytes = DEFAULT_QUEUE, tamper_every = 0, seed = 0;
  int verbose = 0, rt_prio = 0, offload = 1, opt, have_seed = 0, reorder = 0, gilbert = 0;
  const char *stats_path = NULL;
  char *end;

  while ((opt = getopt(argc, argv, "i:d:j:Rl:g:S:s:c:q:r:t:Gvh")) != -1) {
    switch (opt) {
    case 'R':
      reorder = 1;
      break;
    case 'l':
      errno = 0;
      loss_pct = strtod(optarg, &end);
      if (errno || end == optarg || *end || !(loss_pct >= 0 && loss_pct <= 100)) {
        fprintf(stderr, "delayline: -l %s: want a loss in percent, 0..100\n", optarg);
        return 2;
      }
      break;
    case 'g': {
      /* P,R[,H[,K]], percent each; H and K keep their defaults (0, 100)
       * when left out. */
      const char *q = optarg;
      int n = 0;
      for (; n < 4; n++) {
        errno = 0;
        ge[n] = strtod(q, &end);
        if (errno || end == q || !(ge[n] >= 0 && ge[n] <= 100))
          break;
        if (*end != ',') {
          n++;
          break;
        }
        q = end + 1;
      }
      if (n < 2 || *end || (n == 4 && *end) || ge[0] + ge[1] <= 0) {
        fprintf(stderr, "delayline: -g %s: want P,R[,H[,K]] in percent (0..100), P+R > 0\n",
                optarg);
        return 2;
      }
      gilbert = 1;
      break;
    }
    case 'S':
      errno = 0;
      seed = strtoull(optarg, &end, 0);
      if (errno || end == optarg || *end || optarg[0] == '-') {
        fprintf(stderr, "delayline: -S %s: want an unsigned 64-bit seed\n", optarg);
        return 2;
      }
      have_seed = 1;
      break;
    case 's':
      stats_path = optarg;
      break;
    case 'c':
      l.ctrl_path = optarg;
      break;
    case 'i':
      ifname = optarg;
      break;
    case 'd':
      errno = 0;
      delay_ms = strtod(optarg, &end);
      if (errno || end == optarg || *end || !(delay_ms >= 0 && delay_ms <= 600000)) {
        fprintf(stderr, "delayline: -d %s: want milliseconds in 0..600000\n", optarg);
        return 2;
      }
      break;
    case 'j':
      errno = 0;
      jitter_ms = strtod(optarg, &end);
      if (errno || end == optarg || *end || !(jitter_ms >= 0 && jitter_ms <= 60000)) {
        fprintf(stderr, "delayline: -j %s: want milliseconds in 0..60000\n", optarg);
        return 2;
      }
      break;
    case 'q':
      if (parse_size(optarg, &qbytes) < 0 || qbytes < MIN_QUEUE) {
        fprintf(stderr, "delayline: -q %s: want a byte count >= 1M (suffix K, M, G)\n", optarg);
        return 2;
      }
      break;
    case 'r':
      errno = 0;
      rt_prio = (int)strtol(optarg, &end, 10);
      if (errno || end == optarg || *end || rt_prio < 1 || rt_prio > 99) {
        fprintf(stderr, "delayline: -r %s: want a SCHED_FIFO priority in 1..99\n", optarg);
        return 2;
      }
      break;
    case 't':
      errno = 0;
      tamper_every = strtoull(optarg, &end, 10);
      if (errno || end == optarg || *end || optarg[0] == '-') {
        fprintf(stderr, "delayline: -t %s: want a packet count (0 = off)\n", optarg);
        return 2;
      }
      break;
    case 'G':
      offload = 0;
      break;
    case 'v':
      verbose = 1;
      break;
    case 'h':
      usage(stdout);
      return 0;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc || !ifname || delay_ms < 0) {
    usage(stderr);
    return 2;
  }
  if (strlen(ifname) == 0 || strlen(ifname) >= IFNAMSIZ) {
    fprintf(stderr, "delayline: -i %s: interface names have 1..%d characters\n", ifname,
            IFNAMSIZ - 1);
    return 2;
  }

  if (gilbert && loss_pct > 0) {
    fprintf(stderr, "delayline: -l and -g are two loss models; give one\n");
    return 2;
  }

  snprintf(l.ifname, sizeof l.ifname, "%s", ifname);
  l.delay_ns = (int64_t)(delay_ms * 1e6 + 0.5);
  l.jitter_ns = (int64_t)(jitter_ms * 1e6 + 0.5);
  l.reorder = reorder && l.jitter_ns > 0;
  if (!have_seed)
    seed = mix64((uint64_t)time(NULL) * 0x100000001b3ULL ^ (uint64_t)getpid() ^
                 (uint64_t)mono_ns());
  l.seed = seed;
  /* Two streams, far apart in the Weyl sequence's state space. */
  l.jit.s = mix64(seed ^ 0x6a697474657200ULL);
  l.loss.g.s = mix64(seed ^ 0x6c6f73730000ULL);
  if (loss_pct > 0) {
    l.loss.model = LOSS_RANDOM;
    l.loss.p_loss = loss_pct / 100.0;
  } else if (gilbert) {
    l.loss.model = LOSS_GILBERT;
    l.loss.p = ge[0] / 100.0;
    l.loss.r = ge[1] / 100.0;
    l.loss.loss_bad = 1.0 - ge[2] / 100.0;
    l.loss.loss_good = 1.0 - ge[3] / 100.0;
  }
  l.stats_path = stats_path;
  l.cap = qbytes & ~(uint64_t)(REC_ALIGN - 1);
  l.tamper_every = tamper_every;

  /* Signals go to the signalfd only; blocked before the writer exists so
   * that it inherits the mask. */
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  sigaddset(&sigs, SIGUSR1);
  sigaddset(&sigs, SIGUSR2);
  if (pthread_sigmask(SIG_BLOCK, &sigs, NULL) != 0) {
    fprintf(stderr, "delayline: block signals failed\n");
    return 1;
  }
  int sfd = signalfd(-1, &sigs, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) {
    fprintf(stderr, "delayline: signalfd: %s\n", strerror(errno));
    return 1;
  }

  /* Pages are touched only as the queue grows: a 256M bound costs nothing
   * until that much is held. */
  l.mem = mmap(NULL, l.cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
               -1, 0);
  if (l.mem == MAP_FAILED) {
    fprintf(stderr, "delayline: map a %" PRIu64 "-byte queue: %s\n", l.cap, strerror(errno));
    return 1;
  }

  l.fd = open_tun(ifname, offload, &l.hdr);
  if (l.fd < 0)
    return 1;

  /* Set before the writer starts, which inherits it. */
  if (rt_prio) {
    struct sched_param sp = {.sched_priority = rt_prio};
    int e = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp);
    if (e)
      fprintf(stderr, "delayline %s: warning: SCHED_FIFO priority %d: %s; running without "
              "(wake-ups may be late on a busy machine)\n", l.ifname, rt_prio, strerror(e));
  }

  pthread_t writer;
  int err = pthread_create(&writer, NULL, l.reorder ? writer_reorder_main : writer_main, &l);
  if (err) {
    fprintf(stderr, "delayline: start writer thread: %s\n", strerror(err));
    return 1;
  }
  if (verbose)
    fprintf(stderr, "delayline %s: delay %.3f ms, jitter %.3f ms%s, loss %s, seed %" PRIu64
            ", queue bound %" PRIu64 " B, pid %ld%s\n",
            l.ifname, delay_ms, jitter_ms, l.reorder ? " (reordering)" : "",
            l.loss.model == LOSS_RANDOM ? "random" : l.loss.model == LOSS_GILBERT ? "gilbert" : "none",
            seed, l.cap, (long)getpid(), tamper_every ? ", tampering with TCP payload (-t)" : "");

  int status = 0;
  struct pollfd pfd[2] = {{.fd = l.fd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
  for (;;) {
    if (poll(pfd, 2, -1) < 0) {
      if (errno == EINTR)
        continue;
      fprintf(stderr, "delayline %s: poll: %s\n", l.ifname, strerror(errno));
      status = 1;
      break;
    }
    if (pfd[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      int stop = 0;
      while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGUSR1) {
          print_stats(&l);
          write_stats_file(&l);
        } else if (si.ssi_signo == SIGUSR2) {
          if (l.ctrl_path)
            ctrl_apply(&l);
        } else
          stop = 1;
      }
      if (stop)
        break;
    }
    if (pfd[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
      fprintf(stderr, "delayline %s: device gone (poll events 0x%x)\n", l.ifname,
              (unsigned)pfd[0].revents);
      status = 1;
      break;
    }
    if ((pfd[0].revents & POLLIN) && read_batch(&l) < 0) {
      status = 1;
      break;
    }
  }

  atomic_store(&l.stop, 1);
  futex_wake(&l.wake);
  pthread_join(writer, NULL);
  if (verbose)
    print_stats(&l);
  write_stats_file(&l);
  if (atomic_load(&l.stop) == 2)
    status = 1;
  close(l.fd);
  munmap(l.mem, l.cap);
  return status;
}
