#!/usr/bin/env python3
"""Checks of `zdp serve`'s resource limits over raw sockets (test_serve_ops.sh).

usage: ops_check.py budget URL MAX_BODY MAX_INFLIGHT
       ops_check.py request-timeout URL SECONDS
       ops_check.py header-timeout URL SECONDS
       ops_check.py idle-timeout URL SECONDS
       ops_check.py busy URL HEALTH_TIMEOUT

budget: one client announces a body of MAX_BODY bytes and sends half of
it; while it holds that, GET /info reports the bytes in flight, and a second
body that would take the total over MAX_INFLIGHT gets 503 naming
--max-inflight-bytes (with Content-Length, and chunked without one); a
small one still fits; when the first client hangs up the budget is free
again.

request-timeout: a client that sends its body one byte every 0.2 s loses
the connection about SECONDS after its headers; /healthz answers meanwhile.

header-timeout: a client that sends its headers one byte every 0.2 s loses
the connection about SECONDS after opening it; keep-alive requests are each
given SECONDS again.

idle-timeout: a connection that sends nothing is closed about SECONDS after
it opened.

busy: while a forward of 10,000 datums or more runs longer than HEALTH_TIMEOUT,
/healthz is 503 naming the forward, and 200 after it.
"""
import json
import socket
import sys
import time
import urllib.parse


def fail(msg):
    print("FAIL:", msg)
    global failures
    failures += 1


failures = 0


def connect(url, timeout=10):
    u = urllib.parse.urlparse(url)
    return socket.create_connection((u.hostname, u.port), timeout=timeout)


def read_response(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/"):
        return 0, {}, b""
    status = int(head.split(b" ", 2)[1])
    length = None
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
        if k.strip().lower() == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
    while length is not None and len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    if chunked:  # /info is small: read to the end
        while not body.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
        out, rest = b"", body
        while rest:
            n, _, rest = rest.partition(b"\r\n")
            n = int(n, 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return status, head, body


def request(url, method, path, body=None, headers=(), timeout=10):
    s = connect(url, timeout)
    try:
        h = "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" % (method, path)
        for k, v in headers:
            h += "%s: %s\r\n" % (k, v)
        if body is not None and not any(k.lower() == "transfer-encoding" for k, _ in headers):
            h += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
        s.sendall(h.encode() + b"\r\n" + (body or b""))
        st, _, b = read_response(s)
        return st, b
    finally:
        s.close()


def info(url):
    st, b = request(url, "GET", "/info")
    if st != 200:
        fail("GET /info: %d %s" % (st, b[:200]))
        return {}
    return json.loads(b)


def budget(url, max_body, max_inflight):
    limits = info(url).get("limits", {})
    want = {"max_body_bytes": max_body, "max_inflight_bytes": max_inflight, "inflight_bytes": 0}
    for k, v in want.items():
        if limits.get(k) != v:
            fail("GET /info limits.%s = %s, wanted %s (limits: %s)" % (k, limits.get(k), v, limits))
    holder = connect(url)
    holder.sendall(b"POST /forward HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % max_body + b" " * (max_body // 2))
    time.sleep(0.5)
    held = info(url).get("limits", {}).get("inflight_bytes")
    if held != max_body:
        fail("while one client holds a %d-byte body, inflight_bytes = %s" % (max_body, held))
    over = max_inflight - max_body + 1  # fits --max-body, not the budget
    st, b = request(url, "POST", "/forward", b" " * over)
    if st != 503 or b"--max-inflight-bytes" not in b:
        fail("a %d-byte body over the budget: %d %s (wanted 503 naming --max-inflight-bytes)" % (over, st, b[:300]))
    # Chunked, no Content-Length: counted as it arrives.
    chunk = b" " * over
    st, b = request(url, "POST", "/forward", b"%x\r\n" % len(chunk) + chunk + b"\r\n0\r\n\r\n",
                    headers=[("Transfer-Encoding", "chunked"), ("Content-Type", "application/json")])
    if st != 503 or b"--max-inflight-bytes" not in b:
        fail("a chunked %d-byte body over the budget: %d %s (wanted 503)" % (over, st, b[:300]))
    st, b = request(url, "POST", "/forward", b"{}")
    if st != 400 or b"data" not in b:
        fail("a small body within the budget: %d %s (wanted the usual 400 naming data)" % (st, b[:300]))
    holder.close()
    time.sleep(0.5)
    after = info(url).get("limits", {}).get("inflight_bytes")
    if after != 0:
        fail("after the holder hung up, inflight_bytes = %s (wanted 0)" % after)
    st, b = request(url, "POST", "/forward", b" " * over)
    if st != 400:
        fail("the same %d-byte body once the budget is free: %d %s (wanted 400: not JSON)" % (over, st, b[:200]))
    print("budget: %d-byte budget held, 503 over it, free again after" % max_inflight)


def request_timeout(url, seconds):
    s = connect(url)
    s.sendall(b"POST /forward HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n")
    t0 = time.monotonic()
    closed_at = None
    while time.monotonic() - t0 < seconds + 5:
        try:
            s.sendall(b" ")
            s.settimeout(0.2)
            if s.recv(1) == b"":
                closed_at = time.monotonic() - t0
                break
        except socket.timeout:
            pass
        except OSError:
            closed_at = time.monotonic() - t0
            break
        st, _ = request(url, "GET", "/healthz")
        if st != 200:
            fail("/healthz during a slow body: %d" % st)
    s.close()
    if closed_at is None or not seconds - 0.5 <= closed_at <= seconds + 2:
        fail("a body sent one byte every 0.2 s was closed after %s s (wanted about --request-timeout-seconds %g)"
             % (closed_at, seconds))
    else:
        print("request-timeout: a slow body was closed after %.1f s" % closed_at)


def header_timeout(url, seconds):
    """Headers sent one byte every 0.2 s: the connection is closed about
    SECONDS after it opened.  A keep-alive connection gets SECONDS again after
    each answer: two requests 0.6 × SECONDS apart on one connection work."""
    s = connect(url)
    t0 = time.monotonic()
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
    closed_at = None
    while time.monotonic() - t0 < seconds + 5:
        try:
            s.sendall(b"a")
            s.settimeout(0.2)
            if s.recv(1) == b"":
                closed_at = time.monotonic() - t0
                break
        except socket.timeout:
            pass
        except OSError:
            closed_at = time.monotonic() - t0
            break
    s.close()
    if closed_at is None or not seconds - 0.5 <= closed_at <= seconds + 2:
        fail("headers sent one byte every 0.2 s were cut after %s s (wanted about --request-timeout-seconds %g)"
             % (closed_at, seconds))
    else:
        print("header-timeout: headers sent a byte at a time were cut after %.1f s" % closed_at)
    s = connect(url)
    for i in range(3):
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        st, _, _ = read_response(s)
        if st != 200:
            fail("keep-alive request %d, %.1f s apart: %d" % (i, 0.6 * seconds, st))
            break
        time.sleep(0.6 * seconds)
    s.close()


def idle_timeout(url, seconds):
    s = connect(url)
    t0 = time.monotonic()
    s.settimeout(seconds + 5)
    try:
        eof = s.recv(1) == b""
    except OSError:
        eof = True
    dt = time.monotonic() - t0
    s.close()
    if not eof or not seconds - 0.5 <= dt <= seconds + 2:
        fail("an idle connection was closed after %.1f s (wanted about --idle-timeout-seconds %g)" % (dt, seconds))
    else:
        print("idle-timeout: an idle connection was closed after %.1f s" % dt)


def busy(url, limit):
    """A forward of many datums runs longer than --health-timeout-seconds
    (LIMIT): meanwhile /healthz must say which request it waits for.  The
    forward doubles from 10,000 datums until it runs long enough on this
    machine (sanitizer builds are slower)."""
    import threading
    d = {"model_input": {"chunks": [{"tokens": list(range(16))}]},
         "loss_fn_inputs": {"target_tokens": list(range(16))}}
    for n in (10000, 20000, 40000, 80000):
        body = json.dumps({"data": [d] * n}).encode()
        res = {}
        th = threading.Thread(target=lambda: res.update(r=request(url, "POST", "/forward", body, timeout=300)))
        th.start()
        seen = None
        while th.is_alive():
            st, b = request(url, "GET", "/healthz")
            if st == 503:
                seen = json.loads(b)
            time.sleep(0.1)
        th.join()
        if res.get("r", (0,))[0] != 200:
            fail("the long forward of %d datums: %s" % (n, res.get("r", (0, b""))[1][:200]))
            return
        ran = info(url).get("requests", {}).get("forward", {}).get("max_exec_ms", 0) / 1e3
        if ran >= limit + 0.5:
            break
    else:
        fail("no forward ran longer than %g s" % (limit + 0.5))
        return
    if seen is None or seen.get("waiting_for") != "forward" or "--health-timeout-seconds" not in seen["error"]["message"]:
        fail("/healthz during a %.1f s forward (limit %g s): %s (wanted 503 naming the forward)" % (ran, limit, seen))
    else:
        print("busy: /healthz during a %.1f s forward: %s" % (ran, seen["error"]["message"]))
    st, b = request(url, "GET", "/healthz")
    if st != 200:
        fail("/healthz after the long forward: %d %s" % (st, b[:200]))


def main(argv):
    if argv[1] == "budget":
        budget(argv[2], int(argv[3]), int(argv[4]))
    elif argv[1] == "request-timeout":
        request_timeout(argv[2], float(argv[3]))
    elif argv[1] == "busy":
        busy(argv[2], float(argv[3]))
    elif argv[1] == "header-timeout":
        header_timeout(argv[2], float(argv[3]))
    elif argv[1] == "idle-timeout":
        idle_timeout(argv[2], float(argv[3]))
    else:
        sys.exit(__doc__)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
