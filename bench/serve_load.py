#!/usr/bin/env python3
"""serve_load.py -- load benchmark and soak run for a running `zdp serve`.

Standard library only (--lora and the tinker phase: the Tinker SDK).
Started by bench/run_serve_load.sh, which also starts the server and
measures the engine alone with `zdp train`.

  serve_load.py --url http://127.0.0.1:PORT --pid RANK0_PID --log SERVER.log
                [--cs 1,4,16] [--load-s 20] [--soak-s 60] [--soak-clients 4]
                [--engine-ms1 X --engine-ms4 Y] [--json OUT.json]
                [--tinker-soak-s S [--tinker-warm-s 30] [--tinker-chunk-len 3]
                 [--tinker-idle-s 65] [--malloc-stats]]

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
  tinker   (only with --tinker-soak-s S > 0) the Tinker SDK's /api/v1 protocol
           through tests/serve/tinker_sdk.py: one TrainingClient loops for S
           seconds forward_backward of 4-12 datums of 8-64 tokens, cut into
           chunks of --tinker-chunk-len datums (posted in parallel, the first
           last), then optim_step; meanwhile 2 threads loop GET /info and
           POST /forward (no gradient) on the plain endpoints.  Rank 0's VmRSS
           every 2 s; start = the first sample after --tinker-warm-s.
           Accounting: optim_step futures that returned = /info step delta,
           global_samples delta = b * W * sum over chunks of ceil(n / W),
           one logprobs row per datum, pending_backwards 0 at the end.
           Rank 0's heap / other anonymous memory / threads (/proc/PID/smaps)
           before and after; with --tinker-idle-s, again after that long idle
           and one more future (the server drops results read a minute ago
           when it makes a new future); with --malloc-stats, glibc's own
           in-use count at those idle points (gdb calls malloc_stats()).
Accounting, after every phase: every request got exactly one answer, every
forward_backward answer has one logprobs row per datum of the right length,
/info's pending_backwards, global_samples and step equal what the 200 answers
imply (ceil(n / W) backward calls per request of n datums, b * W samples per
call), and pending_backwards is 0 after the last optim_step.  Then SIGTERM to
rank 0, and the log must say "stopped at step N" with N = /info's step.
Exit status: the number of failed checks (capped at 100).

  serve_load.py --lora --url URL [--seconds S] [--repeats R] [--ks 1,2,4]

Request throughput with 1, 2 and 4 LoRA models at once, through the official
Tinker SDK (bench/run_serve_load.sh --lora; docs/benchmarks-serve.md).  Four
LoRA training clients (rank 8, every target) are created first, so every
phase runs with the same models loaded.  A phase uses K of them, one thread
each, for S seconds:
  train   each thread loops forward_backward (4 datums of 64 tokens,
          cross_entropy) + optim_step, submitted together, then awaited:
          one "step" = both requests;
  sample  each thread loops sample(num_samples=4, max_tokens=32,
          temperature 1) on its model's sampler weights (a PEFT folder:
          the adapter applied per sequence).
Phases alternate K (1, 2, 4, then 4, 2, 1, ...) so that a change of load
on the shared machine touches every K alike; the figure per K is the
median over the repeats.  The load average is printed beside each phase.
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
    could run a forward_backward twice, which is what the accounting checks.
    The server closes a connection that has been idle for 600 s
    (MHD_OPTION_CONNECTION_TIMEOUT), so one idle for more than REOPEN_S is
    replaced before the next request is sent, and a GET that finds its
    reused connection closed is sent once more on a new one."""

    REOPEN_S = 60.0

    def __init__(self, url):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.c = None
        self.last = 0.0

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        if self.c is not None and time.monotonic() - self.last > self.REOPEN_S:
            self.c.close()
            self.c = None
        reused = self.c is not None
        if self.c is None:
            self.c = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            self.c.request(method, path, body=data, headers={"Content-Type": "application/json"})
            r = self.c.getresponse()
            raw = r.read()
        except (http.client.HTTPException, OSError) as e:
            self.c.close()
            self.c = None
            if method == "GET" and reused and isinstance(e, (http.client.RemoteDisconnected,
                                                             ConnectionResetError, BrokenPipeError)):
                return self.call(method, path, body)
            raise
        self.last = time.monotonic()
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


def mem_detail(pid):
    """Rank 0's memory by kind (/proc/PID/smaps, kB): the main heap, other
    anonymous mappings (malloc's per-thread arenas, thread stacks, mmap'd
    blocks), files; and the number of threads."""
    out = {"heap_kb": 0, "anon_kb": 0, "file_kb": 0, "threads": None}
    try:
        kind = None
        with open("/proc/%d/smaps" % pid) as f:
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):
                    parts = line.split()
                    name = parts[5] if len(parts) > 5 else ""
                    kind = "heap_kb" if name == "[heap]" else "anon_kb" if name == "" or name.startswith("[") \
                        else "file_kb"
                elif first == "Rss:" and kind:
                    out[kind] += int(line.split()[1])
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
    except OSError:
        pass
    return out


def malloc_stats(pid, log):
    """glibc's own count of rank 0's heap: gdb calls malloc_stats() in the
    process, which prints to its stderr (the server log).  Returns
    {"arenas", "system_bytes", "in_use_bytes"} (the "Total (incl. mmap)"
    lines), or None.  Only call it while the server is idle: gdb stops every
    thread, and one stopped inside malloc would deadlock the call."""
    import subprocess
    try:
        size0 = os.path.getsize(log)
        subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "call (void)malloc_stats()"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    for _ in range(50):
        with open(log, errors="replace") as f:
            f.seek(size0)
            txt = f.read()
        if "max mmap bytes" in txt:
            break
        time.sleep(0.1)
    else:
        return None
    tot = txt.split("Total (incl. mmap):", 1)
    if len(tot) != 2:
        return None
    nums = [int(x.split("=")[1]) for x in tot[1].splitlines() if "bytes" in x and "=" in x][:2]
    return {"arenas": txt.count("Arena "), "system_bytes": nums[0], "in_use_bytes": nums[1]}


class RssMonitor:
    """VmRSS of `pids` every `period` s, in a thread: samples = [(t, {pid: kB})]."""

    def __init__(self, pids, period=2.0, detail_pid=None, detail_every=15):
        self.pids, self.period = pids, period
        self.detail_pid, self.detail_every = detail_pid, detail_every
        self.detail = []       # [(t, mem_detail(detail_pid))] every detail_every samples
        self.samples = []
        self.stop_ev = threading.Event()
        self.t0 = None
        self.th = None

    def _run(self):
        while not self.stop_ev.is_set():
            self.samples.append((time.perf_counter() - self.t0, {p: rss_kb(p) for p in self.pids}))
            if self.detail_pid is not None and len(self.samples) % self.detail_every == 1:
                self.detail.append((time.perf_counter() - self.t0, mem_detail(self.detail_pid)))
            self.stop_ev.wait(self.period)

    def start(self):
        self.t0 = time.perf_counter()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()
        return self

    def stop(self):
        self.stop_ev.set()
        self.th.join()
        self.samples.append((time.perf_counter() - self.t0, {p: rss_kb(p) for p in self.pids}))
        return self.samples


def slope_kb_min(pts):
    """Least-squares slope of [(t s, kB)] in kB/min (nan with < 3 points)."""
    pts = [(t, v) for t, v in pts if v is not None]
    if len(pts) < 3:
        return float("nan")
    mt = sum(t for t, _ in pts) / len(pts)
    mv = sum(v for _, v in pts) / len(pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / den if den > 0 else float("nan")


def rss_summary(samples, pid, warm_s):
    """start (the first sample at >= warm_s), middle, end, max, and slopes of
    rank 0's RSS; the sum over all ranks at start and end."""
    after = [x for x in samples if x[0] >= warm_s] or samples
    t_end = samples[-1][0]
    t_mid = (after[0][0] + t_end) / 2
    mid = min(after, key=lambda x: abs(x[0] - t_mid))
    pts = [(t, v.get(pid)) for t, v in after]
    half = [(t, v) for t, v in pts if t >= t_mid]
    return {"rss_start_t": after[0][0], "rss_start_kb": after[0][1].get(pid),
            "rss_mid_t": mid[0], "rss_mid_kb": mid[1].get(pid),
            "rss_end_t": t_end, "rss_end_kb": samples[-1][1].get(pid),
            "rss_max_kb": max(x[1].get(pid) or 0 for x in samples),
            "rss_slope_kb_min": slope_kb_min(pts), "rss_slope_2nd_half_kb_min": slope_kb_min(half),
            "rss_all_ranks_start_kb": sum(v or 0 for v in after[0][1].values()),
            "rss_all_ranks_end_kb": sum(v or 0 for v in samples[-1][1].values())}


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


def run_threads(n, worker):
    """worker(0), ..., worker(n - 1) on n threads at once, until all return:
    (when they started, the seconds they took)."""
    t0 = time.perf_counter()
    th = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    return t0, time.perf_counter() - t0


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

    t0, el = run_threads(C, worker)
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
    mon = RssMonitor(pids).start()
    t0 = mon.t0

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

    run_threads(C, worker)
    el = time.perf_counter() - t0
    samples = mon.stop()
    return {"clients": C, "seconds": el, "fb": len(lat_fb), "steps": len(lat_st),
            "fb_per_s": len(lat_fb) / el, "fb_p50_ms": 1e3 * pct(lat_fb, 0.5),
            "fb_p99_ms": 1e3 * pct(lat_fb, 0.99), "step_p50_ms": 1e3 * pct(lat_st, 0.5),
            "step_p99_ms": 1e3 * pct(lat_st, 0.99),
            "max_ms": 1e3 * max(lat_fb + lat_st, default=float("nan")),
            "rss": samples, "warm_s": warm_s}


def tinker_phase(url, secs, warm_s, chunk_len, V, W, b, pids, rank0, lr, clip, idle_s=0.0, log=None,
                 mstats=False):
    """One Tinker TrainingClient looping forward_backward + optim_step for
    `secs` s, while 2 threads loop GET /info and POST /forward."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "serve"))
    sys.dont_write_bytecode = True
    import tinker_sdk as TS  # noqa: E402 -- the SDK-faithful stdlib client

    conn = Conn(url)
    sc = TS.ServiceClient(url, heartbeat_interval=10.0,
                          client_config_overrides={"fwdbwd_max_chunk_len": chunk_len})
    sc.http.log_bodies = False
    model = sc.get_server_capabilities()["supported_models"][0]["model_name"]
    tc = sc.create_lora_training_client(model)
    before = info(conn)
    if before.get("pending_backwards") != 0:
        fail("tinker: pending_backwards = %s before the phase" % before.get("pending_backwards"))
    mem = {"before": dict(mem_detail(rank0), rss_kb=rss_kb(rank0))}
    if mstats:
        mem["before"]["malloc"] = malloc_stats(rank0, log)
    adam = {"learning_rate": lr, "grad_clip_norm": clip}
    rng = random.Random(4242)
    r = {"model_name": model, "model_id": tc.model_id, "chunk_len": chunk_len, "warm_s": warm_s,
         "fb_calls": 0, "fb_ok": 0, "chunks": 0, "datums": 0, "backward_calls": 0,
         "steps_sent": 0, "steps_ok": 0, "errors": 0}
    lat_fb, at_fb, lat_st, lrs = [], [], [], []
    stop = threading.Event()
    plain = {"info": [], "forward": [], "info_bad": 0, "forward_bad": 0}
    plk = threading.Lock()

    def info_loop():
        c = Conn(url)
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                st, js = c.call("GET", "/info")
                ok = st == 200 and isinstance(js.get("step"), int)
            except Exception as e:  # noqa: BLE001
                ok, st = False, repr(e)
            dt = time.perf_counter() - t0
            with plk:
                if ok:
                    plain["info"].append(dt)
                else:
                    plain["info_bad"] += 1
                    fail("tinker phase: GET /info -> %s" % st)

    def forward_loop():
        c = Conn(url)
        prng = random.Random(99)
        while not stop.is_set():
            data = [datum(prng, V, prng.randint(8, 64)) for _ in range(prng.randint(1, 4))]
            lens = [[len(d["model_input"]["chunks"][0]["tokens"])] for d in data]
            t0 = time.perf_counter()
            try:
                st, js = c.call("POST", "/forward", {"data": data, "loss_fn": "cross_entropy"})
                ok = st == 200 and [o["logprobs"]["shape"] for o in js["loss_fn_outputs"]] == lens
            except Exception as e:  # noqa: BLE001
                ok, st, js = False, repr(e), None
            dt = time.perf_counter() - t0
            with plk:
                if ok:
                    plain["forward"].append(dt)
                else:
                    plain["forward_bad"] += 1
                    fail("tinker phase: POST /forward -> %s %s" % (st, str(js)[:200]))

    mon = RssMonitor(pids, detail_pid=rank0).start()
    t_start = mon.t0
    deadline = t_start + secs
    th = [threading.Thread(target=info_loop, daemon=True), threading.Thread(target=forward_loop, daemon=True)]
    for t in th:
        t.start()
    while time.perf_counter() < deadline:
        data = []
        for _ in range(rng.randint(4, 12)):
            L = rng.randint(8, 64)
            data.append(TS.datum([rng.randrange(V) for _ in range(L)], [rng.randrange(V) for _ in range(L)],
                                 [1.0] * L))
        lens = [len(d["model_input"]["chunks"][0]["tokens"]) for d in data]
        r["fb_calls"] += 1
        t0 = time.perf_counter()
        try:
            fut = tc.forward_backward(data, "cross_entropy")
            res = fut.result(timeout=180)
        except Exception as e:  # noqa: BLE001 -- a failure or a hang ends the phase
            r["errors"] += 1
            fail("tinker forward_backward #%d (%d datums): %r" % (r["fb_calls"], len(data), e))
            break
        lat_fb.append(time.perf_counter() - t0)
        at_fb.append(t0 - t_start)
        shapes = [o.get("logprobs", {}).get("shape") for o in res["loss_fn_outputs"]]
        if shapes != [[n] for n in lens] or any(len(o["logprobs"]["data"]) != n
                                               for o, n in zip(res["loss_fn_outputs"], lens)):
            r["errors"] += 1
            fail("tinker forward_backward #%d: datums of %s tokens, logprobs shapes %s" %
                 (r["fb_calls"], lens, shapes))
        if "loss:sum" not in res["metrics"]:
            r["errors"] += 1
            fail("tinker forward_backward #%d: metrics %s lack loss:sum" % (r["fb_calls"], res["metrics"]))
        r["fb_ok"] += 1
        r["chunks"] += len(fut.chunks)
        r["datums"] += len(data)
        r["backward_calls"] += sum(math.ceil(n / W) for _, n in fut.chunks)
        r["steps_sent"] += 1
        t0 = time.perf_counter()
        try:
            out = tc.optim_step(adam).result(timeout=180)
        except Exception as e:  # noqa: BLE001
            r["errors"] += 1
            fail("tinker optim_step #%d: %r" % (r["steps_sent"], e))
            break
        lat_st.append(time.perf_counter() - t0)
        r["steps_ok"] += 1
        lrs.append(out.get("metrics", {}).get("learning_rate:mean"))
        if r["fb_calls"] % 50 == 0:   # the client's own logs would grow for the whole run
            with sc.http._lock:
                sc.http.http_log.clear()
            with tc._id_lock:
                tc.sent.clear()
    el = time.perf_counter() - t_start
    stop.set()
    for t in th:
        t.join(timeout=60)
        if t.is_alive():
            fail("tinker phase: a plain-endpoint thread did not finish")
    samples = mon.stop()
    after = info(conn)
    mem["end"] = dict(mem_detail(rank0), rss_kb=rss_kb(rank0))
    if mstats:
        mem["end"]["malloc"] = malloc_stats(rank0, log)
    if idle_s > 0:
        # Idle past the minute a read result is kept, then one more future
        # (a 1-datum forward: no gradient) makes the server drop the old ones.
        time.sleep(idle_s)
        mem["idle"] = dict(mem_detail(rank0), rss_kb=rss_kb(rank0))
        try:
            tc.forward([TS.datum([1, 2, 3], [2, 3, 4])], "cross_entropy").result(timeout=120)
        except Exception as e:  # noqa: BLE001
            fail("tinker: the forward after the idle wait: %r" % e)
        time.sleep(2)
        mem["pruned"] = dict(mem_detail(rank0), rss_kb=rss_kb(rank0))
        if mstats:
            mem["pruned"]["malloc"] = malloc_stats(rank0, log)
    sc.close()
    slow = sorted(zip(lat_fb, at_fb), reverse=True)[:5]
    by_min = {}
    for x, t in zip(lat_fb, at_fb):
        by_min.setdefault(int(t // 60), []).append(x)
    d_step = after.get("step", 0) - before.get("step", 0)
    d_samples = after.get("global_samples", 0) - before.get("global_samples", 0)
    if d_step != r["steps_ok"]:
        fail("tinker: %d optim_step futures returned, /info step moved by %d" % (r["steps_ok"], d_step))
    if d_samples != b * W * r["backward_calls"]:
        fail("tinker: global_samples moved by %d, the chunks imply %d" % (d_samples, b * W * r["backward_calls"]))
    if after.get("pending_backwards") != 0:
        fail("tinker: pending_backwards = %s at the end" % after.get("pending_backwards"))
    bad_lr = [x for x in lrs if x is None or abs(x - lr) > 1e-6 * lr]
    if bad_lr:
        fail("tinker: %d optim_step answers had learning_rate:mean != %g (e.g. %s)" % (len(bad_lr), lr, bad_lr[:3]))
    r.update({"seconds": el, "steps_per_s": r["steps_ok"] / el,
              "fb_p50_ms": 1e3 * pct(lat_fb, 0.5), "fb_p99_ms": 1e3 * pct(lat_fb, 0.99),
              "fb_max_ms": 1e3 * max(lat_fb, default=float("nan")),
              "step_p50_ms": 1e3 * pct(lat_st, 0.5), "step_p99_ms": 1e3 * pct(lat_st, 0.99),
              "step_max_ms": 1e3 * max(lat_st, default=float("nan")),
              "server_step_delta": d_step, "server_samples_delta": d_samples,
              "server_pending_end": after.get("pending_backwards"),
              "plain_info": len(plain["info"]), "plain_info_bad": plain["info_bad"],
              "plain_info_p50_ms": 1e3 * pct(plain["info"], 0.5),
              "plain_info_p99_ms": 1e3 * pct(plain["info"], 0.99),
              "plain_forward": len(plain["forward"]), "plain_forward_bad": plain["forward_bad"],
              "plain_forward_p50_ms": 1e3 * pct(plain["forward"], 0.5),
              "plain_forward_p99_ms": 1e3 * pct(plain["forward"], 0.99),
              "http_attempts": {k: {str(st): n for st, n in v.items()} for k, v in sc.stats.items()},
              "future_counters": dict(sc.counters), "rss": samples, "mem": mem,
              "fb_slowest": [{"ms": 1e3 * x, "at_s": t} for x, t in slow],
              "fb_p50_ms_by_minute": [1e3 * pct(by_min[m], 0.5) for m in sorted(by_min)],
              "detail": mon.detail})
    r.update(rss_summary(samples, rank0, warm_s))
    return r, after


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


# ---- --lora: 1, 2 and 4 LoRA models through the Tinker SDK ----------------------

def lcg(seed, n, vocab):
    x, out = seed, []
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(3 + x % (vocab - 3))
    return out


def lora_datum(toks):
    from tinker import types
    return types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]),
                       loss_fn_inputs={"target_tokens": toks[1:]})


def lora_phase(kind, clients, samplers, k, seconds, vocab):
    from tinker import types
    counts = [0] * k
    tokens = [0] * k
    stop = time.monotonic() + seconds
    errors = []

    def worker(i):
        try:
            if kind == "train":
                tc = clients[i]
                data = [lora_datum(lcg(100 * i + j, 65, vocab)) for j in range(4)]
                adam = types.AdamParams(learning_rate=1e-4)
                while time.monotonic() < stop:
                    fb = tc.forward_backward(data, "cross_entropy")
                    op = tc.optim_step(adam)
                    fb.result()
                    op.result()
                    counts[i] += 1
            else:
                sc = samplers[i]
                prompt = types.ModelInput.from_ints(lcg(7 + i, 16, vocab))
                sp = types.SamplingParams(max_tokens=32, temperature=1.0)
                while time.monotonic() < stop:
                    r = sc.sample(prompt, 4, sp).result()
                    counts[i] += 1
                    tokens[i] += sum(len(s.tokens) for s in r.sequences)
        except Exception as e:  # noqa: BLE001 -- reported, the phase is void
            errors.append(f"{kind} client {i}: {type(e).__name__}: {e}")

    _, dt = run_threads(k, worker)
    if errors:
        raise RuntimeError("; ".join(errors))
    return sum(counts) / dt, [c / dt for c in counts], sum(tokens) / dt


def lora_main(argv):
    import tinker
    from tinker import types
    ap = argparse.ArgumentParser()
    ap.add_argument("--lora", action="store_true", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ks", default="1,2,4")
    a = ap.parse_args(argv)
    ks = [int(x) for x in a.ks.split(",")]
    sc = tinker.ServiceClient(base_url=a.url)
    base = sc.get_server_capabilities().supported_models[0].model_name
    vocab = 4096
    clients = [sc.create_lora_training_client(base_model=base, rank=8, seed=i) for i in range(max(ks))]
    # One step each, so the adapters differ from the base; then their sampler weights.
    for i, tc in enumerate(clients):
        tc.forward_backward([lora_datum(lcg(i, 65, vocab))], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    samplers = [tc.save_weights_and_get_sampling_client() for tc in clients]
    res = {(kind, k): [] for kind in ("train", "sample") for k in ks}
    for rep in range(a.repeats):
        order = ks if rep % 2 == 0 else ks[::-1]
        for k in order:
            for kind in ("train", "sample"):
                la = os.getloadavg()[0]
                total, per, tok = lora_phase(kind, clients, samplers, k, a.seconds, vocab)
                res[(kind, k)].append((total, per, tok))
                per_s = " ".join(f"{p:.2f}" for p in per)
                extra = f", {tok:.0f} sampled tokens/s" if kind == "sample" else ""
                print(f"repeat {rep} {kind:6s} K={k}: {total:.2f} req/s in all (per model {per_s}){extra}; "
                      f"load {la:.1f} -> {os.getloadavg()[0]:.1f}", flush=True)
    print("\nmedians over the repeats:")
    for kind in ("train", "sample"):
        for k in ks:
            tot = statistics.median(r[0] for r in res[(kind, k)])
            fair = statistics.median(min(r[1]) / max(r[1]) for r in res[(kind, k)])
            tok = statistics.median(r[2] for r in res[(kind, k)])
            extra = f", {tok:.0f} sampled tokens/s" if kind == "sample" else ""
            unit = "steps/s (forward_backward + optim_step)" if kind == "train" else "sample requests/s"
            print(f"  {kind:6s} K={k}: {tot:.2f} {unit} in all, slowest/fastest model {fair:.2f}{extra}")
    return 0


def main():
    if "--lora" in sys.argv[1:]:
        return lora_main(sys.argv[1:])
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
    ap.add_argument("--tinker-soak-s", type=float, default=0,
                    help="seconds of the Tinker /api/v1 phase (0: skipped)")
    ap.add_argument("--tinker-warm-s", type=float, default=30,
                    help="the Tinker phase's RSS start is the first sample after this")
    ap.add_argument("--tinker-chunk-len", type=int, default=3, help="the client's fwdbwd_max_chunk_len")
    ap.add_argument("--tinker-lr", type=float, default=1e-3, help="AdamParams.learning_rate")
    ap.add_argument("--tinker-clip", type=float, default=1.0, help="AdamParams.grad_clip_norm")
    ap.add_argument("--tinker-idle-s", type=float, default=0,
                    help="after the Tinker phase, idle this long, send one more future (the server then "
                         "drops results read over a minute ago) and measure rank 0 again")
    ap.add_argument("--malloc-stats", action="store_true",
                    help="around the Tinker phase, have gdb call malloc_stats() in rank 0 (idle moments only)")
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
    s.update(rss_summary(rs, a.pid, s["warm_s"]))
    res["soak"] = s
    res["totals"] = {"forward_backward_sent": book.fb_sent, "forward_backward_200": book.fb_ok,
                     "optim_step_200": book.steps, "optim_step_409": book.steps_409,
                     "failed": book.bad, "server_step": fin.get("step"),
                     "server_global_samples": fin.get("global_samples"),
                     "server_pending_backwards": fin.get("pending_backwards")}

    last = fin
    if a.tinker_soak_s > 0:
        tk, last = tinker_phase(a.url, a.tinker_soak_s, a.tinker_warm_s, a.tinker_chunk_len, V, W,
                                a.micro_batch, pids, a.pid, a.tinker_lr, a.tinker_clip, a.tinker_idle_s,
                                a.log, a.malloc_stats)
        res["tinker"] = tk

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
    if stopped != last.get("step"):
        fail("the log says stopped at step %s, /info said %s" % (stopped, last.get("step")))

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
    print("rank 0 VmRSS: %s kB at %.0f s, %s kB at %.0f s, %s kB at the end (max %s kB); slope %.1f kB/min "
          "(second half %.1f); all %d ranks %d -> %d kB" %
          (s["rss_start_kb"], s["rss_start_t"], s["rss_mid_kb"], s["rss_mid_t"], s["rss_end_kb"],
           s["rss_max_kb"], s["rss_slope_kb_min"], s["rss_slope_2nd_half_kb_min"], len(pids),
           s["rss_all_ranks_start_kb"], s["rss_all_ranks_end_kb"]))
    print("rank 0 VmRSS samples (s: kB): " + " ".join("%.0f:%s" % (t, v.get(a.pid)) for t, v in rs))
    tt = res["totals"]
    print("accounting: %d forward_backward sent, %d answered 200, %d failed; optim_step %d x 200, %d x 409; "
          "server step %s, global_samples %s, pending %s; stopped at step %s in %.2f s" %
          (tt["forward_backward_sent"], tt["forward_backward_200"], tt["failed"], tt["optim_step_200"],
           tt["optim_step_409"], tt["server_step"], tt["server_global_samples"],
           tt["server_pending_backwards"], stopped, res["stop_s"]))
    if "tinker" in res:
        k = res["tinker"]
        print("tinker %.0f s (one TrainingClient, fwdbwd_max_chunk_len %d, + 2 plain threads): %d steps "
              "(%.2f/s); forward_backward %d calls, %d chunks (%.2f/call), %d datums, p50 %.1f p99 %.1f "
              "max %.1f ms; optim_step p50 %.1f p99 %.1f ms" %
              (k["seconds"], k["chunk_len"], k["steps_ok"], k["steps_per_s"], k["fb_ok"], k["chunks"],
               k["chunks"] / max(1, k["fb_ok"]), k["datums"], k["fb_p50_ms"], k["fb_p99_ms"], k["fb_max_ms"],
               k["step_p50_ms"], k["step_p99_ms"]))
        print("  plain during it: %d GET /info (p50 %.2f p99 %.2f ms, %d failed), %d POST /forward "
              "(p50 %.2f p99 %.2f ms, %d failed)" %
              (k["plain_info"], k["plain_info_p50_ms"], k["plain_info_p99_ms"], k["plain_info_bad"],
               k["plain_forward"], k["plain_forward_p50_ms"], k["plain_forward_p99_ms"], k["plain_forward_bad"]))
        print("  accounting: %d optim_step futures returned, /info step +%d; global_samples +%d for %d "
              "backward calls; pending %s at the end" %
              (k["steps_ok"], k["server_step_delta"], k["server_samples_delta"], k["backward_calls"],
               k["server_pending_end"]))
        print("  http attempts: %s" % json.dumps(k["http_attempts"], sort_keys=True))
        print("  future counters: %s" % json.dumps(k["future_counters"], sort_keys=True))
        print("  rank 0 VmRSS: %s kB at %.0f s, %s kB at %.0f s, %s kB at %.0f s (max %s kB); slope %.1f kB/min "
              "from %.0f s, %.1f kB/min over the second half; all ranks %d -> %d kB" %
              (k["rss_start_kb"], k["rss_start_t"], k["rss_mid_kb"], k["rss_mid_t"], k["rss_end_kb"],
               k["rss_end_t"], k["rss_max_kb"], k["rss_slope_kb_min"], k["rss_start_t"],
               k["rss_slope_2nd_half_kb_min"], k["rss_all_ranks_start_kb"], k["rss_all_ranks_end_kb"]))
        print("  slowest forward_backward calls: " + ", ".join("%.0f ms at %.0f s" % (x["ms"], x["at_s"])
                                                            for x in k["fb_slowest"]))
        print("  forward_backward p50 by minute (ms): " + " ".join("%.1f" % x for x in k["fb_p50_ms_by_minute"]))
        for name, m in k["mem"].items():
            ml = m.get("malloc")
            print("  rank 0 %-7s VmRSS %s kB: heap %d, other anon %d, files %d kB; %s threads%s" %
                  (name, m["rss_kb"], m["heap_kb"], m["anon_kb"], m["file_kb"], m["threads"],
                   "; malloc: %d arenas, %d kB from the system, %d kB in use" %
                   (ml["arenas"], ml["system_bytes"] // 1024, ml["in_use_bytes"] // 1024) if ml else ""))
        print("  rank 0 every 30 s (s: heap/other anon kB, threads): " +
              " ".join("%.0f:%d/%d,%s" % (t, d["heap_kb"], d["anon_kb"], d["threads"]) for t, d in k["detail"]))
        print("  rank 0 VmRSS samples (s: kB): " + " ".join("%.0f:%s" % (t, v.get(a.pid)) for t, v in k["rss"]))
    res["failures"] = FAILS
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print("serve_load: %s" % ("all checks passed" if not FAILS else "%d check(s) failed" % len(FAILS)))
    return min(len(FAILS), 100)


if __name__ == "__main__":
    sys.exit(main())
