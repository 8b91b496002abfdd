#!/usr/bin/env python3
"""tcp_floor.py: what TCP alone takes to move the WAN bytes of a hierarchical
all-reduce, with no collective around it.

Run as one process per rank, like the all-reduce tools (bench_wan.sh, kind
tcpfloor): rank r is local rank i = r % P of region q = r // P, at
HOST:PORT + i.  It opens STREAMS connections to local rank i of every other
region (the pairs GeoCCL's hierarchical all-reduce uses with equal shares)
and, per iteration and size S, sends 2 S / (P R) bytes on every pair while
receiving as many: the partials out and the finished parts back, which is
what each rank pair carries in the all-reduce.  Every byte is in memory
when the iteration starts, and nothing waits for anything but the socket.

An iteration ends for a rank when its bytes are in, every peer has said
so of its own (one byte back on the pair's first connection) and every
rank of its region has heard that from its peers (a byte to local rank 0
and one back): the next iteration starts on no rank before every rank has
all its bytes, as no all-reduce call can (each result needs every rank's
input).  So the figure holds TCP's own time for the bytes, its congestion
control's answer to loss and every connection's last round trip, plus one
one-way delay; --no-sync drops the waiting (an iteration then starts on
the tail of the one before, and tails overlap).  Set against the
all-reduce on the same links, it says how much of what is over the link's
bound the transport takes.

The output is geoccl-perf's table (size, count, type, op, root, time in
microseconds, algbw, busbw, wrong; the in-place columns repeat the same
figures), so bench_wan.sh reads it like the others.  Time per size: the
mean over -n iterations after -w warm-up ones, as rank 0 saw them.
"""
import argparse
import socket
import struct
import sys
import threading
import time

HELLO = struct.Struct("!8sII")  # tag, rank, stream
TAG = b"geoflr01"


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def connect(host, port, deadline):
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


def recv_exact(sock, view):
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--size", type=int, required=True, help="ranks in all")
    ap.add_argument("--per-region", type=int, required=True, help="ranks per region (P)")
    ap.add_argument("--hosts", required=True,
                    help="comma-separated address of each region, in region order")
    ap.add_argument("--port", type=int, default=27100)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--cc", default="bbr", help="TCP congestion control; '' keeps the host's")
    ap.add_argument("--dynamic", type=parse_size, default=0, metavar="CHUNK",
                    help="a pair's bytes go in CHUNK pieces to whichever of its streams "
                    "takes them first (TCP_NOTSENT_LOWAT of one piece), instead of an "
                    "equal part per stream")
    ap.add_argument("--no-sync", action="store_true",
                    help="start an iteration as soon as my own bytes are in, without waiting "
                    "for my peers to have theirs")
    ap.add_argument("-b", default="64M")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", type=int, default=2)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("-w", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to set up")
    # accepted and ignored, so bench_wan.sh can pass the all-reduce tools' options
    ap.add_argument("-d")
    ap.add_argument("-o")
    ap.add_argument("-c")
    ap.add_argument("-T")
    a = ap.parse_args()

    hosts = a.hosts.split(",")
    P, N = a.per_region, a.size
    R = N // P
    if N % P or len(hosts) != R or not 0 <= a.rank < N:
        sys.exit("tcp_floor: --size must be R x --per-region with one host per region")
    q, i = divmod(a.rank, P)
    peers = [r * P + i for r in range(R) if r != q]
    conns = {p: [None] * a.streams for p in peers}
    # region step: local rank 0 hears from the others and answers them
    lead = q * P
    local = [lead + j for j in range(1, P)] if i == 0 else [lead]
    for p in local:
        conns[p] = [None]
    deadline = time.time() + a.timeout

    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((hosts[q], a.port + i))
    lsock.listen(64)
    lsock.settimeout(a.timeout)
    n_accept = sum(a.streams for p in peers if p > a.rank) + (P - 1 if i == 0 else 0)
    failed = []

    def accept_all():
        try:
            for _ in range(n_accept):
                c, _ = lsock.accept()
                c.settimeout(None)
                tag, r, s = HELLO.unpack(c.recv(HELLO.size, socket.MSG_WAITALL))
                if tag != TAG or r not in conns or not 0 <= s < len(conns[r]):
                    raise ConnectionError("unexpected connection")
                conns[r][s] = c
        except Exception as ex:  # reported below
            failed.append(ex)

    acceptor = threading.Thread(target=accept_all)
    acceptor.start()
    for p in peers:
        if p < a.rank:
            for s in range(a.streams):
                c = connect(hosts[p // P], a.port + i, deadline)
                c.settimeout(None)
                c.sendall(HELLO.pack(TAG, a.rank, s))
                conns[p][s] = c
    if i != 0:
        c = connect(hosts[q], a.port, deadline)
        c.settimeout(None)
        c.sendall(HELLO.pack(TAG, a.rank, 0))
        conns[lead][0] = c
    acceptor.join()
    if failed:
        sys.exit("tcp_floor: set-up failed: %s" % failed[0])
    socks = [c for p in peers for c in conns[p]]
    cc = a.cc
    for c in socks:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if a.dynamic:
            c.setsockopt(socket.IPPROTO_TCP, 25, a.dynamic)  # TCP_NOTSENT_LOWAT
        if cc:
            try:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
            except OSError as ex:  # not offered by this kernel: the host's, and say so
                print("# tcp_floor: congestion control %s refused (%s); the host's kept"
                      % (cc, ex.strerror))
                cc = ""

    print("# tcp_floor: rank %d of %d, %d regions x %d, %d stream(s) per pair%s, cc %s, %s"
          % (a.rank, N, R, P, a.streams,
             " taking %d-byte pieces as they drain" % a.dynamic if a.dynamic else "",
             cc or "of the host",
             "no sync" if a.no_sync else "peers in step"))
    print("#  size  count  type  redop  root  time(us)  algbw  busbw  #wrong"
          "  time(us)  algbw  busbw  #wrong")
    size, end = parse_size(a.b), parse_size(a.e)
    while size <= end:
        per_pair = 2 * size // (P * R)
        per_conn = [per_pair // a.streams + (1 if s < per_pair % a.streams else 0)
                    for s in range(a.streams)]
        cap = max(max(per_conn), a.dynamic) or 1
        out = bytearray(cap)
        inbufs = [bytearray(cap) for _ in socks]
        lens = [per_conn[k % a.streams] for k in range(len(socks))]
        errs = []

        left = []  # --dynamic: bytes of each pair not yet taken in this iteration
        lock = threading.Lock()
        hdr = struct.Struct("!I")

        def send(k):
            try:
                if not a.dynamic:
                    socks[k].sendall(memoryview(out)[:lens[k]])
                    return
                while True:
                    with lock:
                        n = min(a.dynamic, left[k // a.streams])
                        left[k // a.streams] -= n
                    socks[k].sendall(hdr.pack(n) + (bytes(memoryview(out)[:n]) if n else b""))
                    if n == 0:
                        return
            except Exception as ex:
                errs.append(ex)

        def recv(k):
            try:
                if not a.dynamic:
                    recv_exact(socks[k], memoryview(inbufs[k])[:lens[k]])
                    return
                h = bytearray(hdr.size)
                while True:
                    recv_exact(socks[k], memoryview(h))
                    n = hdr.unpack(h)[0]
                    if n == 0:
                        return
                    recv_exact(socks[k], memoryview(inbufs[k])[:n])
            except Exception as ex:
                errs.append(ex)

        total = 0.0
        for it in range(a.w + a.n):
            left[:] = [per_pair] * len(peers)
            t0 = time.time()
            th = [threading.Thread(target=f, args=(k,)) for k in range(len(socks))
                  for f in (send, recv)]
            for t in th:
                t.start()
            for t in th:
                t.join()
            if errs:
                sys.exit("tcp_floor: %s" % errs[0])
            if not a.no_sync:
                # every peer has all its bytes too: one byte each way on the
                # pair's first connection, after the data
                for p in peers:
                    conns[p][0].sendall(b"D")
                for p in peers:
                    recv_exact(conns[p][0], memoryview(bytearray(1)))
                # and so has every rank: the others of my region have heard
                # from theirs (each rank pair of the all-reduce depends on
                # all of them through the reduce-scatter and all-gather)
                if i == 0:
                    for p in local:
                        recv_exact(conns[p][0], memoryview(bytearray(1)))
                    for p in local:
                        conns[p][0].sendall(b"G")
                else:
                    conns[lead][0].sendall(b"R")
                    recv_exact(conns[lead][0], memoryview(bytearray(1)))
            if it >= a.w:
                total += time.time() - t0
        us = total / a.n * 1e6
        algbw = size / us / 1e3
        busbw = algbw * 2 * (N - 1) / N
        row = "%12d  %12d  %6s  %6s  %5d  %12.2f  %6.2f  %6.2f  %6d" % (
            size, size // 4, "float", "sum", -1, us, algbw, busbw, 0)
        print(row + "  %12.2f  %6.2f  %6.2f  %6d" % (us, algbw, busbw, 0), flush=True)
        size *= a.f
    for p in conns:
        for c in conns[p]:
            c.close()


if __name__ == "__main__":
    main()
