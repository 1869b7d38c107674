#!/usr/bin/env python3
"""Slow and idle clients against `zdp serve`, with a time bound.

usage: slowloris.py URL MODE N SECONDS [SOURCE_IP]

MODE idle: N sockets connect and send nothing.  MODE dribble: N sockets
send a request's headers one byte a second.  MODE body: N sockets send the
headers of a POST at once, then its 50 kB body one byte a second.
The sockets come from SOURCE_IP (default 127.0.0.2: on Linux the whole of
127/8 is loopback, so the attacker is another address than the prober's
127.0.0.1).  For SECONDS, /healthz is probed from 127.0.0.1 every 0.25 s on
a fresh connection; every probe must get 200, and each must take < 100 ms
(the best of two tries, so that one scheduling hiccup of a shared CI
machine is not a failure).  Prints the latencies and how many attack
sockets the server accepted and kept.
"""
import socket
import sys
import time
import urllib.parse


def probe(host, port, timeout=5.0):
    t0 = time.monotonic()
    s = socket.create_connection((host, port), timeout=timeout, source_address=("127.0.0.1", 0))
    try:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n" % (host.encode(), port))
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    dt = time.monotonic() - t0
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status, dt


def main():
    url, mode, n, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    src = sys.argv[5] if len(sys.argv) > 5 else "127.0.0.2"
    u = urllib.parse.urlparse(url)
    host, port = u.hostname, u.port
    # prefix: sent at once; script: then one byte a second.
    prefix = b""
    if mode == "idle":
        script = b""
    elif mode == "dribble":
        script = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100000
    elif mode == "body":
        prefix = (b"POST /forward HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 50000\r\n\r\n")
        script = b" " * 50000
    else:
        sys.exit("mode: idle, dribble or body")

    socks = []
    t_end = time.monotonic() + seconds
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((src, 0))
            s.connect_ex((host, port))
        except OSError as e:
            print("attack socket:", e)
            s.close()
            continue
        socks.append([s, 0])
    time.sleep(0.5)
    for rec in socks:
        try:
            rec[0].send(prefix)
        except OSError:  # refused: over the per-address limit
            rec[0].close()
            rec[0] = None

    worst, probes, bad = 0.0, 0, []
    next_byte = time.monotonic()
    while time.monotonic() < t_end:
        if script and time.monotonic() >= next_byte:
            next_byte += 1.0
            for rec in socks:
                s, off = rec
                if s is None or off >= len(script):
                    continue
                try:
                    s.send(script[off:off + 1])
                    rec[1] = off + 1
                except OSError:
                    s.close()
                    rec[0] = None
        best, st = 1e9, 0
        for _ in range(2):
            try:
                st, dt = probe(host, port)
            except OSError as e:
                st, dt = 0, 5.0
                print("probe:", e)
            best = min(best, dt)
            if st == 200 and dt < 0.1:
                break
        probes += 1
        worst = max(worst, best)
        if st != 200 or best >= 0.1:
            bad.append((round(time.monotonic() - (t_end - seconds), 2), st, round(best * 1e3, 1)))
        time.sleep(0.25)

    # Which attack sockets does the server still hold open?  A refused or
    # timed-out one reads EOF or an error.
    alive = 0
    answered = 0
    for s, _ in socks:
        if s is None:
            continue
        try:
            answered += bool(s.recv(1))
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
        s.close()
    print(f"slowloris {mode}: {n} sockets from {src}, {alive} still open and {answered} answered after {seconds:.0f} s; "
          f"{probes} /healthz probes, worst {worst * 1e3:.1f} ms, {len(bad)} bad {bad[:5]}")
    sys.exit(1 if bad or probes == 0 else 0)


if __name__ == "__main__":
    main()
