#!/usr/bin/env python3
"""serve_load.py -- load benchmark and soak run for a running `zdp serve`.

Standard library only.  Started by bench/run_serve_load.sh, which also starts
the server and measures the engine alone with `zdp train`.

  serve_load.py --url http://127.0.0.1:PORT --pid RANK0_PID --log SERVER.log
                [--cs 1,4,16] [--load-s 20] [--soak-s 60] [--soak-clients 4]
                [--engine-ms1 X --engine-ms4 Y] [--json OUT.json]

Phases:
  idle     GET /healthz (HTTP thread only) and GET /info (queue + broadcast to
           every rank, no model work), one request at a time.
  shape    forward_backward of D = 2 and D = 8 datums of block_size tokens, one
           at a time: the p50 against the engine time for the same work.
  load C   C threads, each a keep-alive connection looping forward_backward of
           1-4 datums of 8-64 tokens for --load-s seconds; then one
           optim_step from the driver.
  soak     --soak-clients threads looping (1-3 forward_backward, optim_step)
           for --soak-s seconds; rank 0's VmRSS sampled every 2 s.
Accounting, after every phase: every request got exactly one answer, every
forward_backward answer has one logprobs row per datum of the right length,
/info's pending_backwards, global_samples and step equal what the 200 answers
imply (ceil(n / W) backward calls per request of n datums, b * W samples per
call), and pending_backwards is 0 after the last optim_step.  Then SIGTERM to
rank 0, and the log must say "stopped at step N" with N = /info's step.
Exit status: the number of failed checks (capped at 100).
"""
import argparse
import http.client
import json
import math
import os
import random
import signal
import statistics
import sys
import threading
import time
import urllib.parse

FAILS = []


def fail(msg):
    FAILS.append(msg)
    print("FAIL: " + msg, flush=True)


class Conn:
    """One keep-alive HTTP/1.1 connection.  A POST is never retried: a retry
    could run a forward_backward twice, which is what the accounting checks."""

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.c = None

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        if self.c is None:
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            self.c.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = self.c.getresponse()
            raw = r.read()
        except (http.client.HTTPException, OSError):
            self.c.close()
            self.c = None
            raise
        if r.getheader("Connection", "").lower() == "close":
            self.c.close()
            self.c = None
        return r.status, json.loads(raw or b"null")


def pct(xs, q):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def datum(rng, V, L):
    toks = [rng.randrange(V) for _ in range(L)]
    tgt = [rng.randrange(V) for _ in range(L)]
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": toks}]},
            "loss_fn_inputs": {"target_tokens": tgt}}


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Book:
    """What the 200 answers imply for the server's counters."""

    def __init__(self, W, b):
        self.W, self.b = W, b
        self.lock = threading.Lock()
        self.sent_lock = threading.Lock()
        self.pending = 0       # backward calls since the last applied optim_step
        self.samples = 0       # global_samples added by our forward_backwards
        self.steps = 0         # optim_step answered 200
        self.steps_409 = 0
        self.fb_ok = 0
        self.fb_sent = 0
        self.bad = 0           # non-200 forward_backward, exceptions, wrong answers

    def fb(self, conn, data):
        with self.sent_lock:
            self.fb_sent += 1
        t0 = time.perf_counter()
        try:
            st, js = conn.call("POST", "/forward_backward", {"data": data, "loss_fn": "cross_entropy"})
        except Exception as e:  # noqa: BLE001 -- every failure is counted
            with self.lock:
                self.bad += 1
            fail("forward_backward: %r" % e)
            return None
        dt = time.perf_counter() - t0
        if st != 200:
            with self.lock:
                self.bad += 1
            fail("forward_backward -> %d %s" % (st, str(js)[:200]))
            return None
        outs = js.get("loss_fn_outputs", [])
        lens = [len(d["model_input"]["chunks"][0]["tokens"]) for d in data]
        if [o["logprobs"]["shape"] for o in outs] != [[n] for n in lens]:
            with self.lock:
                self.bad += 1
            fail("forward_backward answer for datums of %s tokens has shapes %s" %
                 (lens, [o["logprobs"]["shape"] for o in outs]))
            return None
        calls = math.ceil(len(data) / self.W)
        with self.lock:
            self.fb_ok += 1
            self.pending += calls
            self.samples += self.b * self.W * calls
        return dt

    def step(self, conn, expect_409=None):
        """expect_409: None while clients run concurrently (a 409 then only means
        another client's step took the gradients first); True/False when quiet."""
        t0 = time.perf_counter()
        try:
            st, js = conn.call("POST", "/optim_step", {})
        except Exception as e:  # noqa: BLE001
            with self.lock:
                self.bad += 1
            fail("optim_step: %r" % e)
            return None
        dt = time.perf_counter() - t0
        with self.lock:
            if st == 200 and expect_409 is not True:
                self.steps += 1
                self.pending = 0
            elif st == 409 and expect_409 is not False:
                self.steps_409 += 1
                self.pending = 0
            else:
                self.bad += 1
                fail("optim_step -> %d %s (409 expected: %s)" % (st, str(js)[:200], expect_409))
                return None
        return dt


def info(conn):
    st, js = conn.call("GET", "/info")
    if st != 200:
        fail("GET /info -> %d" % st)
        return {}
    return js


def audit(conn, book, base, what):
    js = info(conn)
    got = (js.get("step"), js.get("global_samples"), js.get("pending_backwards"))
    # The engine adds to global_samples when it steps, not at each backward().
    want = (base["step"] + book.steps,
            base["global_samples"] + book.samples - book.b * book.W * book.pending, book.pending)
    if got != want:
        fail("%s: /info (step, global_samples, pending_backwards) = %s, the answers imply %s" %
             (what, got, want))
    if book.fb_ok + book.bad != book.fb_sent:
        fail("%s: %d forward_backward sent, %d answered 200, %d failed" %
             (what, book.fb_sent, book.fb_ok, book.bad))
    return js


def timed_loop(n, fn):
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def load_phase(url, book, C, secs, V, seed):
    lat = [[] for _ in range(C)]
    done_at = [[] for _ in range(C)]
    deadline = time.perf_counter() + secs

    def worker(k):
        rng = random.Random(seed * 1000 + k)
        conn = Conn(url)
        while time.perf_counter() < deadline:
            data = [datum(rng, V, rng.randint(8, 64)) for _ in range(rng.randint(1, 4))]
            dt = book.fb(conn, data)
            if dt is not None:
                lat[k].append(dt)
                done_at[k].append(time.perf_counter())

    t0 = time.perf_counter()
    th = [threading.Thread(target=worker, args=(k,)) for k in range(C)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    el = time.perf_counter() - t0
    allat = [x for l in lat for x in l]
    ends = sorted([t0] + [x for l in done_at for x in l])
    gap = max(b - a for a, b in zip(ends, ends[1:])) if len(ends) > 1 else float("nan")
    return {"clients": C, "seconds": el, "requests": len(allat), "req_per_s": len(allat) / el,
            "p50_ms": 1e3 * pct(allat, 0.5), "p99_ms": 1e3 * pct(allat, 0.99),
            "max_ms": 1e3 * max(allat, default=float("nan")), "max_gap_ms": 1e3 * gap}


def soak_phase(url, book, C, secs, V, pids, warm_s=5.0):
    lat_fb, lat_st = [], []
    lk = threading.Lock()
    deadline = time.perf_counter() + secs
    samples = []          # (t, {pid: kB})
    stop = threading.Event()
    t0 = time.perf_counter()

    def monitor():
        while not stop.is_set():
            samples.append((time.perf_counter() - t0, {p: rss_kb(p) for p in pids}))
            stop.wait(2.0)

    def worker(k):
        rng = random.Random(777 + k)
        conn = Conn(url)
        while time.perf_counter() < deadline:
            for _ in range(rng.randint(1, 3)):
                data = [datum(rng, V, rng.randint(8, 64)) for _ in range(rng.randint(1, 4))]
                dt = book.fb(conn, data)
                if dt is not None:
                    with lk:
                        lat_fb.append(dt)
            dt = book.step(conn)
            if dt is not None:
                with lk:
                    lat_st.append(dt)

    mon = threading.Thread(target=monitor)
    mon.start()
    th = [threading.Thread(target=worker, args=(k,)) for k in range(C)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    el = time.perf_counter() - t0
    stop.set()
    mon.join()
    samples.append((el, {p: rss_kb(p) for p in pids}))
    return {"clients": C, "seconds": el, "fb": len(lat_fb), "steps": len(lat_st),
            "fb_per_s": len(lat_fb) / el, "fb_p50_ms": 1e3 * pct(lat_fb, 0.5),
            "fb_p99_ms": 1e3 * pct(lat_fb, 0.99), "step_p50_ms": 1e3 * pct(lat_st, 0.5),
            "step_p99_ms": 1e3 * pct(lat_st, 0.99),
            "max_ms": 1e3 * max(lat_fb + lat_st, default=float("nan")),
            "rss": samples, "warm_s": warm_s}


def sibling_pids(pid):
    """rank 0 and the other ranks: the zdp processes with rank 0's parent (mpirun's daemon)."""
    try:
        ppid = int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return [pid]
    out = [pid]
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != pid:
            try:
                st = open("/proc/%s/stat" % d).read()
            except OSError:
                continue
            name = st[st.index("(") + 1:st.rindex(")")]
            if name == "zdp" and int(st.rsplit(")", 1)[1].split()[1]) == ppid:
                out.append(int(d))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--cs", default="1,4,16")
    ap.add_argument("--load-s", type=float, default=20)
    ap.add_argument("--soak-s", type=float, default=60)
    ap.add_argument("--soak-clients", type=int, default=4)
    ap.add_argument("--micro-batch", type=int, default=1, help="the config's train_micro_batch_size_per_gpu")
    ap.add_argument("--engine-ms1", type=float, help="zdp train ms/step, 1 micro-batch per rank per step")
    ap.add_argument("--engine-ms4", type=float, help="zdp train ms/step, 4 micro-batches per rank per step")
    ap.add_argument("--json")
    a = ap.parse_args()

    conn = Conn(a.url)
    base = info(conn)
    W, V, T = base["world_size"], base["model"]["vocab_size"], base["model"]["block_size"]
    book = Book(W, a.micro_batch)
    pids = sibling_pids(a.pid)
    res = {"world_size": W, "zero_stage": base["zero_stage"], "model": base["model"],
           "optimizer": base["optimizer"]["type"], "pids": pids}

    # warm-up
    rng = random.Random(1)
    for _ in range(5):
        book.fb(conn, [datum(rng, V, T) for _ in range(2)])
    book.step(conn, expect_409=False)

    # idle: the HTTP path alone, and the queue + broadcast with no model work
    hz = timed_loop(300, lambda: conn.call("GET", "/healthz"))
    inf = timed_loop(100, lambda: conn.call("GET", "/info"))
    res["healthz"] = {"p50_ms": 1e3 * pct(hz, 0.5), "p99_ms": 1e3 * pct(hz, 0.99)}
    res["info"] = {"p50_ms": 1e3 * pct(inf, 0.5), "p99_ms": 1e3 * pct(inf, 0.99)}

    # fixed shapes, one request at a time, against the engine alone
    shape = {}
    for D in (2, 8):
        data = [datum(rng, V, T) for _ in range(D)]
        book.fb(conn, data)
        lat = [book.fb(conn, data) for _ in range(40)]
        lat = [x for x in lat if x is not None]
        shape[D] = {"datums": D, "tokens": T, "calls_per_rank": math.ceil(D / W),
                    "p50_ms": 1e3 * pct(lat, 0.5), "p99_ms": 1e3 * pct(lat, 0.99)}
    st_lat = []
    for _ in range(10):
        book.fb(conn, [datum(rng, V, T) for _ in range(2)])
        st_lat.append(book.step(conn, expect_409=False))
    res["optim_step_p50_ms"] = 1e3 * pct([x for x in st_lat if x is not None], 0.5)
    if a.engine_ms1 and a.engine_ms4:
        per = (a.engine_ms4 - a.engine_ms1) / 3.0
        res["engine"] = {"ms_step_1": a.engine_ms1, "ms_step_4": a.engine_ms4,
                         "ms_per_microbatch": per, "ms_step_fixed": a.engine_ms1 - per}
        for s in shape.values():
            s["engine_ms"] = per * s["calls_per_rank"]
            s["overhead_ms"] = s["p50_ms"] - s["engine_ms"]
    # The serve's own fit: p50 = fixed + per_call * calls_per_rank; fixed is the
    # per-request cost with no model work in it (HTTP, JSON both ways, queue,
    # broadcast, rank wake-up), measured without `zdp train`.
    s2, s8 = shape[2], shape[8]
    per_call = (s8["p50_ms"] - s2["p50_ms"]) / (s8["calls_per_rank"] - s2["calls_per_rank"])
    res["serve_fit"] = {"ms_per_call": per_call, "fixed_ms": s2["p50_ms"] - per_call * s2["calls_per_rank"]}
    res["shape"] = list(shape.values())
    audit(conn, book, base, "after warm-up and shapes")

    # load
    res["load"] = []
    for i, C in enumerate(int(c) for c in a.cs.split(",")):
        r = load_phase(a.url, book, C, a.load_s, V, seed=i + 2)
        audit(conn, book, base, "load C=%d, before optim_step" % C)
        book.step(conn, expect_409=book.pending == 0)
        audit(conn, book, base, "load C=%d, after optim_step" % C)
        res["load"].append(r)
        print("load C=%-3d %7.1f req/s  p50 %7.2f ms  p99 %7.2f ms  (%d requests)" %
              (C, r["req_per_s"], r["p50_ms"], r["p99_ms"], r["requests"]), flush=True)

    # soak
    s = soak_phase(a.url, book, a.soak_clients, a.soak_s, V, pids)
    # A final step: 200, or 409 when a client's last step left nothing.  The
    # clients' own bookkeeping of pending calls is not exact (answers are booked
    # in another order than the server ran them), so ask the server.
    book.pending = info(conn).get("pending_backwards", -1)
    book.step(conn, expect_409=book.pending == 0)
    fin = audit(conn, book, base, "after the soak")
    if fin.get("pending_backwards") != 0:
        fail("pending_backwards = %s after the last optim_step" % fin.get("pending_backwards"))
    rs = s["rss"]
    after_warm = [x for x in rs if x[0] >= s["warm_s"]] or rs
    s["rss_start_kb"] = after_warm[0][1].get(a.pid)
    s["rss_end_kb"] = rs[-1][1].get(a.pid)
    s["rss_max_kb"] = max(x[1].get(a.pid) or 0 for x in rs)
    s["rss_all_ranks_start_kb"] = sum(v or 0 for v in after_warm[0][1].values())
    s["rss_all_ranks_end_kb"] = sum(v or 0 for v in rs[-1][1].values())
    res["soak"] = s
    res["totals"] = {"forward_backward_sent": book.fb_sent, "forward_backward_200": book.fb_ok,
                     "optim_step_200": book.steps, "optim_step_409": book.steps_409,
                     "failed": book.bad, "server_step": fin.get("step"),
                     "server_global_samples": fin.get("global_samples"),
                     "server_pending_backwards": fin.get("pending_backwards")}

    # stop: SIGTERM to rank 0
    t0 = time.perf_counter()
    os.kill(a.pid, signal.SIGTERM)
    while os.path.exists("/proc/%d" % a.pid) and time.perf_counter() - t0 < 30:
        try:  # a zombie still has /proc; its state is Z
            if open("/proc/%d/stat" % a.pid).read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    res["stop_s"] = time.perf_counter() - t0
    stopped = None
    for _ in range(100):
        txt = open(a.log, errors="replace").read()
        if "stopped at step" in txt:
            stopped = int(txt.split("stopped at step")[1].split()[0])
            break
        time.sleep(0.1)
    res["stopped_at_step"] = stopped
    if stopped != fin.get("step"):
        fail("the log says stopped at step %s, /info said %s" % (stopped, fin.get("step")))

    # table
    m = res["model"]
    print()
    print("zdp serve -np %d, ZeRO stage %d, %s, gpt L=%d H=%d C=%d V=%d T=%d (%d params)" %
          (W, res["zero_stage"], res["optimizer"], m["n_layer"], m["n_head"], m["n_embd"],
           m["vocab_size"], m["block_size"], m["n_params"]))
    print("%-44s %10s %10s" % ("one request at a time", "p50 ms", "p99 ms"))
    print("%-44s %10.3f %10.3f" % ("GET /healthz (HTTP thread only)", res["healthz"]["p50_ms"], res["healthz"]["p99_ms"]))
    print("%-44s %10.3f %10.3f" % ("GET /info (queue + broadcast, no model)", res["info"]["p50_ms"], res["info"]["p99_ms"]))
    for sh in res["shape"]:
        print("%-44s %10.3f %10.3f" % ("forward_backward %d x %d tokens" % (sh["datums"], sh["tokens"]),
                                      sh["p50_ms"], sh["p99_ms"]))
    print("%-44s %10.3f" % ("optim_step (after a 2-datum forward_backward)", res["optim_step_p50_ms"]))
    if "engine" in res:
        e = res["engine"]
        print("engine alone (zdp train): %.3f ms per micro-batch per rank, %.3f ms fixed per step" %
              (e["ms_per_microbatch"], e["ms_step_fixed"]))
        for sh in res["shape"]:
            print("  forward_backward %d x %d: p50 %.3f - engine %.3f = HTTP path overhead %.3f ms" %
                  (sh["datums"], sh["tokens"], sh["p50_ms"], sh["engine_ms"], sh["overhead_ms"]))
    f = res["serve_fit"]
    print("serve's own fit over the two shapes: %.3f ms per micro-batch per rank + %.3f ms fixed per request" %
          (f["ms_per_call"], f["fixed_ms"]))
    print("%-8s %8s %9s %9s %9s %9s %11s" % ("clients", "req/s", "p50 ms", "p99 ms", "max ms", "requests", "max gap ms"))
    for r in res["load"]:
        print("%-8d %8.1f %9.2f %9.2f %9.2f %9d %11.1f" % (r["clients"], r["req_per_s"], r["p50_ms"],
                                                        r["p99_ms"], r["max_ms"], r["requests"], r["max_gap_ms"]))
    print("soak %.0f s, %d clients: %d forward_backward (%.1f/s, p50 %.2f p99 %.2f ms), %d optim_step "
          "(p50 %.2f p99 %.2f ms), max latency %.1f ms" %
          (s["seconds"], s["clients"], s["fb"], s["fb_per_s"], s["fb_p50_ms"], s["fb_p99_ms"], s["steps"],
           s["step_p50_ms"], s["step_p99_ms"], s["max_ms"]))
    print("rank 0 VmRSS: %s kB at %.0f s -> %s kB at the end (max %s kB); all %d ranks %d -> %d kB" %
          (s["rss_start_kb"], s["warm_s"], s["rss_end_kb"], s["rss_max_kb"], len(pids),
           s["rss_all_ranks_start_kb"], s["rss_all_ranks_end_kb"]))
    print("rank 0 VmRSS samples (s: kB): " + " ".join("%.0f:%s" % (t, v.get(a.pid)) for t, v in rs))
    tt = res["totals"]
    print("accounting: %d forward_backward sent, %d answered 200, %d failed; optim_step %d x 200, %d x 409; "
          "server step %s, global_samples %s, pending %s; stopped at step %s in %.2f s" %
          (tt["forward_backward_sent"], tt["forward_backward_200"], tt["failed"], tt["optim_step_200"],
           tt["optim_step_409"], tt["server_step"], tt["server_global_samples"],
           tt["server_pending_backwards"], stopped, res["stop_s"]))
    res["failures"] = FAILS
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print("serve_load: %s" % ("all checks passed" if not FAILS else "%d check(s) failed" % len(FAILS)))
    return min(len(FAILS), 100)


if __name__ == "__main__":
    sys.exit(main())
