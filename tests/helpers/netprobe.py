#!/usr/bin/env python3
"""Small network probes for the emulated-WAN tests, used where ping or
iperf3 are missing. Standard library only.

  netprobe.py udp-echo ADDR PORT [--timeout S]
      Echo UDP datagrams back to their sender until S seconds pass with
      nothing received (default 30).
  netprobe.py udp-ping ADDR PORT [-c COUNT] [-i INTERVAL]
      Send COUNT probes (default 20) INTERVAL seconds apart (default 0.05)
      and print, like ping:  rtt min/avg/max/mdev = a/b/c/d ms
      Exit status 1 when no probe came back.
  netprobe.py tcp-sink ADDR PORT [--omit S] [--timeout S]
      Accept one TCP connection, read it to the end and print the receive
      rate after the first S seconds (default 2):  receiver N Mbits/sec
  netprobe.py tcp-send ADDR PORT [-t SECONDS]
      Connect and send as fast as TCP allows for SECONDS (default 8).
  netprobe.py udp-flood ADDR PORT [-c COUNT] [-i INTERVAL] [-s BYTES]
      Send COUNT datagrams (default 5000) numbered 0..COUNT-1, INTERVAL
      seconds apart on average (default 0.0002), BYTES each (default 200).
  netprobe.py udp-count ADDR PORT -c COUNT [--idle S] [--timeout S]
      Receive udp-flood's datagrams until all COUNT came or S seconds
      (default 1) pass without one after the first (--timeout: before the
      first, default 30), and print one line of key=value: sent, received,
      lost, inversions (datagrams that came after one with a higher
      number), lost_after_lost (losses whose predecessor was lost too) and
      dups.
"""
import argparse
import math
import socket
import struct
import sys
import time


def udp_echo(args):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((args.addr, args.port))
    s.settimeout(args.timeout)
    try:
        while True:
            data, peer = s.recvfrom(2048)
            s.sendto(data, peer)
    except socket.timeout:
        return 0


def udp_ping(args):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((args.addr, args.port))
    s.settimeout(1.0)
    rtts = []
    for seq in range(args.count):
        t0 = time.monotonic()
        s.send(struct.pack("!Id", seq, t0))
        deadline = t0 + 1.0
        while True:
            try:
                data = s.recv(2048)
            except (socket.timeout, ConnectionRefusedError):
                break
            got_seq, sent = struct.unpack("!Id", data[:12])
            if got_seq == seq:
                rtts.append((time.monotonic() - sent) * 1e3)
                print("%d bytes from %s: seq=%d time=%.3f ms" % (len(data), args.addr, seq, rtts[-1]))
                break
            if time.monotonic() > deadline:
                break
        time.sleep(max(0.0, args.interval - (time.monotonic() - t0)))
    if not rtts:
        print("no reply from %s:%d" % (args.addr, args.port))
        return 1
    avg = sum(rtts) / len(rtts)
    mdev = math.sqrt(sum((r - avg) ** 2 for r in rtts) / len(rtts))
    print("%d probes, %d replies" % (args.count, len(rtts)))
    print("rtt min/avg/max/mdev = %.3f/%.3f/%.3f/%.3f ms" % (min(rtts), avg, max(rtts), mdev))
    return 0


def tcp_sink(args):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((args.addr, args.port))
    ls.listen(1)
    ls.settimeout(args.timeout)
    conn, _ = ls.accept()
    conn.settimeout(args.timeout)
    buf = bytearray(1 << 20)
    start = None
    counted = 0
    t_count = None
    last = None
    while True:
        n = conn.recv_into(buf)
        if n == 0:
            break
        now = time.monotonic()
        if start is None:
            start = now
        if now - start >= args.omit:
            if t_count is None:
                t_count = now
            else:
                counted += n
            last = now
    if t_count is None or last is None or last <= t_count:
        print("receiver 0 Mbits/sec (transfer shorter than the %.1f s omitted)" % args.omit)
        return 1
    print("receiver %.1f Mbits/sec" % (counted * 8 / (last - t_count) / 1e6))
    return 0


def tcp_send(args):
    s = socket.create_connection((args.addr, args.port), timeout=10)
    s.settimeout(None)
    chunk = b"\0" * (1 << 20)
    end = time.monotonic() + args.t
    while time.monotonic() < end:
        s.sendall(chunk)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    return 0


def udp_flood(args):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.connect((args.addr, args.port))
    pad = b"\0" * max(0, args.size - 4)
    t0 = time.monotonic()
    for seq in range(args.count):
        due = t0 + seq * args.interval
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        while True:
            try:
                s.send(struct.pack("!I", seq) + pad)
                break
            except (BlockingIOError, ConnectionRefusedError):
                time.sleep(0.001)
    return 0


def udp_count(args):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind((args.addr, args.port))
    s.settimeout(args.timeout)
    seen = bytearray(args.count)
    received = inversions = dups = 0
    top = -1
    try:
        while received < args.count:
            data = s.recv(65536)
            s.settimeout(args.idle)
            if len(data) < 4:
                continue
            seq = struct.unpack("!I", data[:4])[0]
            if seq >= args.count:
                continue
            if seen[seq]:
                dups += 1
                continue
            seen[seq] = 1
            received += 1
            if seq < top:
                inversions += 1
            else:
                top = seq
    except socket.timeout:
        pass
    lost = args.count - received
    after = sum(1 for i in range(1, args.count) if not seen[i] and not seen[i - 1])
    print("sent=%d received=%d lost=%d inversions=%d lost_after_lost=%d dups=%d"
          % (args.count, received, lost, inversions, after, dups))
    return 0 if received else 1


def main():
    p = argparse.ArgumentParser(description="probes for the emulated-WAN tests")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("udp-echo", "udp-ping", "tcp-sink", "tcp-send", "udp-flood", "udp-count"):
        sp = sub.add_parser(name)
        sp.add_argument("addr")
        sp.add_argument("port", type=int)
        if name == "udp-echo":
            sp.add_argument("--timeout", type=float, default=30)
        if name == "udp-ping":
            sp.add_argument("-c", dest="count", type=int, default=20)
            sp.add_argument("-i", dest="interval", type=float, default=0.05)
        if name == "tcp-sink":
            sp.add_argument("--omit", type=float, default=2)
            sp.add_argument("--timeout", type=float, default=30)
        if name == "tcp-send":
            sp.add_argument("-t", type=float, default=8)
        if name == "udp-flood":
            sp.add_argument("-c", dest="count", type=int, default=5000)
            sp.add_argument("-i", dest="interval", type=float, default=0.0002)
            sp.add_argument("-s", dest="size", type=int, default=200)
        if name == "udp-count":
            sp.add_argument("-c", dest="count", type=int, required=True)
            sp.add_argument("--idle", type=float, default=1)
            sp.add_argument("--timeout", type=float, default=30)
    args = p.parse_args()
    fn = {"udp-echo": udp_echo, "udp-ping": udp_ping, "tcp-sink": tcp_sink,
          "tcp-send": tcp_send, "udp-flood": udp_flood, "udp-count": udp_count}[args.cmd]
    return fn(args)


if __name__ == "__main__":
    sys.exit(main())
