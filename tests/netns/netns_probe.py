#!/usr/bin/env python3
"""TCP probes for the namespace-host test (standard library only).

  netns_probe.py serve ADDR PORT N [--timeout S]
      accept N connections; for each, print "got <peer-ip> <bytes> <seconds> <mbit/s>",
      timing from the first byte received to EOF.
  netns_probe.py send ADDR PORT BYTES [--timeout S]
      connect (retrying while the listener is not up yet, until the timeout) and send BYTES.
  netns_probe.py connect ADDR PORT [--timeout S]
      exit 0 if a TCP connection can be made, 1 otherwise (no retry).
"""
import socket
import sys
import time


def opt_timeout(args, default):
    if "--timeout" in args:
        i = args.index("--timeout")
        t = float(args[i + 1])
        del args[i:i + 2]
        return t
    return default


def serve(addr, port, n, timeout):
    deadline = time.monotonic() + timeout
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(16)
    for _ in range(n):
        srv.settimeout(max(0.1, deadline - time.monotonic()))
        conn, peer = srv.accept()
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        total, t0 = 0, None
        while True:
            b = conn.recv(1 << 20)
            if not b:
                break
            if t0 is None:
                t0 = time.monotonic()
            total += len(b)
        dt = time.monotonic() - t0 if t0 is not None else 0.0
        rate = total * 8 / dt / 1e6 if dt > 0 else 0.0
        print("got %s %d %.4f %.2f" % (peer[0], total, dt, rate), flush=True)
        conn.close()
    srv.close()


def send(addr, port, nbytes, timeout):
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=max(0.1, deadline - time.monotonic()))
            break
        except ConnectionRefusedError:
            # The listener is not up yet: retry with backoff until the deadline.
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
    c.settimeout(max(0.1, deadline - time.monotonic()))
    chunk = b"k" * (1 << 16)
    left = nbytes
    while left > 0:
        m = min(left, len(chunk))
        c.sendall(chunk[:m])
        left -= m
    c.shutdown(socket.SHUT_WR)
    c.recv(1)  # wait for the server to close: every byte has arrived
    c.close()


def connect(addr, port, timeout):
    try:
        socket.create_connection((addr, port), timeout=timeout).close()
    except OSError as e:
        print("connect %s:%d: %s" % (addr, port, e), file=sys.stderr)
        return 1
    return 0


def main(argv):
    args = argv[1:]
    timeout = opt_timeout(args, 20.0)
    if len(args) == 4 and args[0] == "serve":
        serve(args[1], int(args[2]), int(args[3]), timeout)
        return 0
    if len(args) == 4 and args[0] == "send":
        send(args[1], int(args[2]), int(args[3]), timeout)
        return 0
    if len(args) == 3 and args[0] == "connect":
        return connect(args[1], int(args[2]), timeout)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
