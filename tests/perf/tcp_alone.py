#!/usr/bin/env python3
"""tcp_alone.py: TCP alone moving the WAN bytes of a hierarchical all-reduce,
with no collective around them.

Run as one process per rank, like the all-reduce tools (bench_wan.sh, kinds
tcpstep and tcpfree): rank r is local rank i = r % P of region q = r // P,
at HOST:PORT + i.  It opens STREAMS connections to local rank i of every
other region (the pairs GeoCCL's hierarchical all-reduce uses with equal
shares) and, per iteration and size S, sends 2 S / (P R) bytes on every pair
while receiving as many: the partials out and the finished parts back,
what each rank pair carries in the all-reduce.  Every byte is in memory
when the iteration starts, and nothing waits for anything but the sockets.

By default every rank is kept in step: an iteration ends for a rank when
its bytes are in, every peer has said so of its own (one byte back on the
pair's first connection) and every rank of its region has heard that from
its peers (a byte to local rank 0 and one back), so no iteration starts
anywhere before every rank has all the bytes of the one before.  That is
stricter than an all-reduce, whose next call may start on a rank while
others still finish the last one.
--no-sync drops the step between iterations: each rank starts its next
iteration as soon as its own bytes are in, and iterations overlap more
than calls of an all-reduce can (a call's results need every rank's
bytes); the ranks still start the timed iterations together and the time
runs to a step after the last one.  The two bracket what the transport
gives an all-reduce on the same links.

--pace RATE caps every connection at RATE bytes/s (SO_MAX_PACING_RATE), as
GeoCCL's uplink pace does, and --restart-bbr starts BBR again on every
connection at each iteration's start (through reno and back), as GeoCCL's
restartBbr does before BBR's PROBE_RTT: what each does for TCP alone.

The output is geoccl-perf's table (size, count, type, op, root, time in
microseconds, algbw, busbw, wrong; the in-place columns repeat the same
figures), so bench_wan.sh reads it like the others.  Time per size: the
time of the -n iterations after -w warm-up ones, over -n, on this rank's
clock (bench_wan.sh keeps rank 0's).
"""
import argparse
import socket
import struct
import sys
import threading
import time

HELLO = struct.Struct("!8sII")  # tag, rank, stream
PIECE = struct.Struct("!I")     # --dynamic: bytes of the piece that follows; 0 ends
TAG = b"geotcp01"
TCP_NOTSENT_LOWAT = 25          # linux/tcp.h
SO_MAX_PACING_RATE = 47         # asm-generic/socket.h


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(float(text[:-1]) * units[text[-1].upper()])
    return int(text)


def fail(msg):
    sys.exit("tcp_alone: " + msg)


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
    ap.add_argument("--cc", default="bbr",
                    help="TCP congestion control (default bbr, what GeoCCL picks on lossy "
                    "paths); '' keeps the host's")
    ap.add_argument("--dynamic", type=parse_size, default=0, metavar="CHUNK",
                    help="a pair's bytes go in CHUNK pieces, each to the first of its streams "
                    "with room for it (TCP_NOTSENT_LOWAT of one piece), instead of an equal "
                    "part per stream")
    ap.add_argument("--pace", type=parse_size, default=0, metavar="RATE",
                    help="cap every connection at RATE bytes/s (SO_MAX_PACING_RATE; "
                    "K, M, G are powers of 1024)")
    ap.add_argument("--restart-bbr", action="store_true",
                    help="start BBR again on every connection at each iteration's start")
    ap.add_argument("--no-sync", action="store_true",
                    help="start an iteration as soon as my own bytes are in")
    ap.add_argument("-b", type=parse_size, default=parse_size("64M"))
    ap.add_argument("-e", type=parse_size, default=parse_size("64M"))
    ap.add_argument("-f", type=int, default=2)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("-w", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to set up")
    ap.add_argument("-T", type=float, default=600.0,
                    help="the most one size's send or receive on a socket may take, seconds")
    # accepted and ignored, so bench_wan.sh can pass the all-reduce tools' options
    ap.add_argument("-d")
    ap.add_argument("-o")
    ap.add_argument("-c")
    a = ap.parse_args()

    hosts = a.hosts.split(",")
    P, N = a.per_region, a.size
    if P < 1 or N < 2 * P or N % P or len(hosts) != N // P or not 0 <= a.rank < N:
        fail("--size must be R x --per-region (R >= 2) with one host per region, "
             "and --rank below --size")
    if a.b < 1 or a.e < a.b or a.f < 2 or a.n < 1 or a.w < 0 or a.streams < 1 or a.dynamic < 0 \
            or a.pace < 0:
        fail("need 1 <= -b <= -e, -f >= 2, -n >= 1, -w >= 0, --streams >= 1, --dynamic >= 0, "
             "--pace >= 0")
    if a.restart_bbr and a.cc != "bbr":
        fail("--restart-bbr needs --cc bbr")
    R = N // P
    q, i = divmod(a.rank, P)
    peers = [r * P + i for r in range(R) if r != q]
    conns = {p: [None] * a.streams for p in peers}
    # the step inside a region: local rank 0 hears from the others and answers
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
                c.settimeout(a.timeout)
                tag, r, s = HELLO.unpack(c.recv(HELLO.size, socket.MSG_WAITALL))
                if tag != TAG or r not in conns or not 0 <= s < len(conns[r]):
                    raise ConnectionError("unexpected connection")
                conns[r][s] = c
        except Exception as ex:  # reported below
            failed.append(ex)

    acceptor = threading.Thread(target=accept_all, daemon=True)
    acceptor.start()
    try:
        for p in peers:
            if p < a.rank:
                for s in range(a.streams):
                    c = connect(hosts[p // P], a.port + i, deadline)
                    c.settimeout(a.timeout)
                    c.sendall(HELLO.pack(TAG, a.rank, s))
                    conns[p][s] = c
        if i != 0:
            c = connect(hosts[q], a.port, deadline)
            c.settimeout(a.timeout)
            c.sendall(HELLO.pack(TAG, a.rank, 0))
            conns[lead][0] = c
    except OSError as ex:
        fail("set-up failed: %s" % ex)
    acceptor.join()
    lsock.close()
    if failed:
        fail("set-up failed: %s" % failed[0])
    for p in conns:
        for c in conns[p]:
            c.settimeout(a.T if a.T > 0 else None)
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    socks = [c for p in peers for c in conns[p]]
    for c in socks:
        if a.pace:
            try:
                c.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE,
                             struct.pack("I", min(a.pace, 2**32 - 2)))
            except OSError as ex:
                fail("--pace %d refused: %s" % (a.pace, ex.strerror))
        if a.dynamic:
            c.setsockopt(socket.IPPROTO_TCP, TCP_NOTSENT_LOWAT, a.dynamic)
        if a.cc:
            try:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, a.cc.encode())
            except OSError as ex:
                fail("congestion control %s refused: %s (--cc '' keeps the host's)"
                     % (a.cc, ex.strerror))

    print("# tcp_alone: rank %d of %d, %d regions x %d, %d stream(s) per pair%s, cc %s%s%s, %s"
          % (a.rank, N, R, P, a.streams,
             ", %d-byte pieces to the first stream with room" % a.dynamic if a.dynamic else "",
             a.cc or "of the host",
             ", each connection paced at %d bytes/s" % a.pace if a.pace else "",
             ", BBR started again every iteration" if a.restart_bbr else "",
             "no step" if a.no_sync else "every rank in step"))
    print("#  size  count  type  redop  root  time(us)  algbw  busbw  #wrong"
          "  time(us)  algbw  busbw  #wrong")
    size = a.b
    while size <= a.e:
        per_pair = 2 * size // (P * R)
        per_conn = [per_pair // a.streams + (1 if s < per_pair % a.streams else 0)
                    for s in range(a.streams)]
        cap = max(max(per_conn), a.dynamic) or 1
        out = bytearray(cap)
        inbufs = [bytearray(cap) for _ in socks]
        lens = [per_conn[k % a.streams] for k in range(len(socks))]
        left = []  # --dynamic: bytes of each pair not yet handed to a stream
        got = []   # --dynamic: bytes of each pair received
        lock = threading.Lock()
        errs = []

        def send(k):
            try:
                if not a.dynamic:
                    socks[k].sendall(memoryview(out)[:lens[k]])
                    return
                while True:
                    with lock:
                        n = min(a.dynamic, left[k // a.streams])
                        left[k // a.streams] -= n
                    socks[k].sendall(PIECE.pack(n) + bytes(memoryview(out)[:n]))
                    if n == 0:
                        return
            except Exception as ex:
                errs.append("to rank %d: %s" % (peers[k // a.streams], ex))

        def recv(k):
            try:
                if not a.dynamic:
                    recv_exact(socks[k], memoryview(inbufs[k])[:lens[k]])
                    return
                h = bytearray(PIECE.size)
                while True:
                    recv_exact(socks[k], memoryview(h))
                    n = PIECE.unpack(h)[0]
                    if n == 0:
                        return
                    if n > cap:
                        raise ConnectionError("a piece of %d bytes, over %d" % (n, cap))
                    recv_exact(socks[k], memoryview(inbufs[k])[:n])
                    with lock:
                        got[k // a.streams] += n
            except Exception as ex:
                errs.append("from rank %d: %s" % (peers[k // a.streams], ex))

        def step():
            one = memoryview(bytearray(1))
            for p in peers:
                conns[p][0].sendall(b"D")
            for p in peers:
                recv_exact(conns[p][0], one)
            if i == 0:
                for p in local:
                    recv_exact(conns[p][0], one)
                for p in local:
                    conns[p][0].sendall(b"G")
            else:
                conns[lead][0].sendall(b"R")
                recv_exact(conns[lead][0], one)

        t_start = 0.0
        for it in range(a.w + a.n):
            left[:] = [per_pair] * len(peers)
            got[:] = [0] * len(peers)
            try:
                if it == a.w:
                    if a.no_sync:
                        step()  # the timed iterations start together
                    t_start = time.perf_counter()
            except OSError as ex:
                fail("size %d, before iteration %d: %s" % (size, it, ex))
            if a.restart_bbr:
                for c in socks:
                    try:
                        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"reno")
                        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"bbr")
                    except OSError as ex:
                        fail("--restart-bbr: %s" % ex.strerror)
            th = [threading.Thread(target=f, args=(k,)) for k in range(len(socks))
                  for f in (send, recv)]
            for t in th:
                t.start()
            for t in th:
                t.join()
            if a.dynamic and not errs and got != [per_pair] * len(peers):
                errs.append("received %s bytes per pair, not %d" % (got, per_pair))
            try:
                # in step: after every iteration; without: after the last
                # one only, so the time is the whole timed run's
                if not errs and (not a.no_sync or it == a.w + a.n - 1):
                    step()
            except OSError as ex:
                errs.append("in the step after it: %s" % ex)
            if errs:
                fail("size %d, iteration %d: %s" % (size, it, errs[0]))
        total = time.perf_counter() - t_start
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
