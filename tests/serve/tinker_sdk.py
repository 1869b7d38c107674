#!/usr/bin/env python3
"""tinker_sdk.py -- a standard-library re-implementation of what the Tinker
Python SDK sends over the wire: versions 0.18 - 0.24 (JSON), and with
sdk_version >= "0.25" what 0.25 does differently (§0, §1.6): forward_backward
-- and forward, as forward_backward with forward_only -- POSTed as a protobuf
ForwardBackwardRequest (Content-Type: application/x-protobuf), chunks sized by
0.25's estimate (§3), and ForwardBackwardOutput results read only as protobuf
(a JSON one raises ProtocolError, as 0.25 raises "Server returned a JSON
payload ... only supports as proto").

It exists so that `zdp serve` can be tested against a client that behaves like
the real SDK (which is not installed here).  Every behaviour is taken from
docs/tinker-protocol.md; the docstrings cite its section ("§1.3").

Layers, bottom up (each mirrors one layer of the SDK):

  HttpClient        the Stainless HTTP layer (§1.1): headers, one idempotency
                    key per call that survives the layer's own retries, up to
                    10 retries of 408/409/429/5xx/connection errors with
                    0.5 s .. 10 s backoff, x-should-retry, retry-after(-ms).
                    Counts every attempt in `stats` / `http_log`.
                    Fault injection (`Faults`) lives here.
  execute_with_retries
                    the SDK's outer retry loop (§1.1): a *new* call (new
                    idempotency key) for retryable failures, for up to 5 min.
  APIFuture         the retrieve_future polling loop (§1.3).
  TrainingClient    seq_ids, the turn rule, chunking, parallel chunks with the
                    first chunk sent last, merging chunk results (§1.5, §3).
  ServiceClient     bootstrap: client/config, create_session, heartbeat,
                    telemetry (§1.2); create_model (§1.4).

Public API (see the class docstrings for details):

  ServiceClient(base_url, api_key=$TINKER_API_KEY or "tml-test", sdk_version="0.24.1", fault=None, ...)
      .create_lora_training_client(base_model, rank=32, ...) -> TrainingClient
      .create_model(base_model, rank=32, ...)               -> APIFuture (CreateModel)
      .get_server_capabilities(), .healthz()                 (GET, direct)
      .stats, .http_log, .counters, .client_config, .session_id, .warnings
      .close()  (also a context manager)
  TrainingClient
      .forward_backward(data, loss_fn, loss_fn_config=None) -> CombinedFuture
      .forward(data, loss_fn, loss_fn_config=None)          -> CombinedFuture
      .optim_step(adam_params: dict | None)                 -> APIFuture
      .save_state(name, ttl_seconds=None)                   -> APIFuture
      .load_state(path, optimizer=False)                    -> APIFuture
      .load_state_with_optimizer(path)                      -> APIFuture
      .save_weights_for_sampler(name, ttl_seconds=None)     -> APIFuture
      .get_info()                                           -> dict (direct)
      .unload()                                             -> APIFuture
  datum(tokens, targets, weights=None, **extra_tensors), tensor(data, dtype=None, shape=None)
  combine_fwd_bwd_results(results)       the SDK's chunk-merge (§1.4, §1.5)
  encode_forward_backward_request_proto(model_id, seq_id, data, loss_fn, loss_fn_config=None,
      forward_only=False) -> bytes        0.25's request encoding (§1.6)
  decode_forward_backward_output_proto(raw) -> dict   0.25's result decoding (§1.6)
  ProtoBody(payload, message)            a protobuf POST body for HttpClient
  Faults()  .drop_response(...), .delay(...), .fired
  Exceptions: APIStatusError, APIConnectionError, APITimeoutError, ResponseLost,
              RequestFailedError, RetryableException, ProtocolError

Smoke mode (needs a running server):

  python3 tests/serve/tinker_sdk.py --base-url http://127.0.0.1:PORT [--base-model NAME]

Standard library only.
"""
import argparse
import array
import base64
import email.utils
import http.client
import json
import logging
import os
import platform
import random
import select
import socket
import struct
import sys
import threading
import time
import urllib.parse
import uuid

logger = logging.getLogger("tinker_sdk")

API = "/api/v1/"

# §1.1 HTTP layer defaults (Stainless _constants.py).
DEFAULT_MAX_RETRIES = 10
INITIAL_RETRY_DELAY = 0.5
MAX_RETRY_DELAY = 10.0
DEFAULT_TIMEOUT = 60.0
CONNECT_TIMEOUT = 5.0
# §1.3 the client timeout of one retrieve_future call.
RETRIEVE_TIMEOUT = 45.0
# §1.3 a bare 400 on retrieve_future is retried this many times, then raised.
MAX_BAD_REQUEST_RETRIES = 3
# §1.1 execute_with_retries keeps retrying for up to 5 minutes.
OUTER_MAX_WAIT = 300.0
# §1.2 heartbeat period.
HEARTBEAT_PERIOD = 10.0
# §1.2 client/config defaults for fields the server leaves out.
CLIENT_CONFIG_DEFAULTS = {
    "parallel_fwdbwd_chunks": True,
    "fwdbwd_max_chunk_len": 1024,
    "fwdbwd_max_chunk_bytes_count": 5_000_000,
    "proto_write_fwdbwd": False,
    "proto_compress_fwdbwd": False,
    "use_pyqwest_transport": False,
    "pjwt_auth_enabled": False,
    "create_model_via_load_weights": False,
}
# §1.4 AdamParams defaults.
ADAM_DEFAULTS = {
    "learning_rate": 1e-4,
    "beta1": 0.9,
    "beta2": 0.95,
    "eps": 1e-12,
    "weight_decay": 0.0,
    "grad_clip_norm": 0.0,
}
# §1.4 TensorData keys (strict, extra="forbid", in responses).
TENSOR_KEYS = {"data", "dtype", "shape", "sparse_crow_indices", "sparse_col_indices"}
PROTO_CONTENT_TYPE = "application/x-protobuf"


# ---- exceptions -------------------------------------------------------------

class APIError(Exception):
    """Base class of everything this client raises about the server."""


class APIStatusError(APIError):
    """A non-2xx answer that the HTTP layer did not (or no longer) retry (§1.1).

    Attributes: status (int), path, body (bytes), json (parsed body or None),
    headers (dict, lower-case keys).
    """

    def __init__(self, path, status, body, headers):
        self.path = path
        self.status = status
        self.body = body
        self.headers = headers
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None
        text = body.decode("utf-8", "replace")[:500] if body else ""
        super().__init__("POST %s -> HTTP %d: %s" % (path, status, text))

    @property
    def status_code(self):
        return self.status


class APIConnectionError(APIError):
    """No HTTP answer: refused, reset, closed early (§1.1: retried)."""


class APITimeoutError(APIConnectionError):
    """The read timed out (Stainless's APITimeoutError is a connection error)."""


class ResponseLost(APIConnectionError):
    """Injected fault: the request was sent in full, the response never read."""


class RequestFailedError(APIError):
    """retrieve_future answered {"error": ..., "category": ...} (§1.3)."""

    def __init__(self, message, category, request_id):
        self.error_message = message
        self.category = category
        self.request_id = request_id
        super().__init__("Request failed: %s (category=%s, request_id=%s)"
                         % (message, category, request_id))


class RetryableException(APIError):
    """retrieve_future answered 410: the promise expired (§1.3)."""


class ProtocolError(APIError, ValueError):
    """A response the SDK's strict validation would reject (§1.3, §1.4)."""


# ---- request bodies -------------------------------------------------------------

class ProtoBody:
    """A protobuf POST body (SDK 0.25's forward_backward, §1.6): `payload` is
    what goes on the wire with Content-Type: application/x-protobuf;
    `message` is the same request as a dict (model_id, seq_id, forward_only,
    ...), for http_log, fault rules and `sent`."""

    def __init__(self, payload, message):
        self.payload = payload
        self.message = message

    def get(self, key, default=None):
        return self.message.get(key, default)


# ---- fault injection ----------------------------------------------------------

class FaultContext:
    """What a fault callable is told about one HTTP attempt.

    path            "/api/v1/forward_backward", ... (without the base URL prefix)
    body            the JSON body (dict), a protobuf body's message (dict), or None
    seq_id          body["seq_id"] if present, else None
    attempt         0 for the first attempt of a call, 1.. for the HTTP layer's retries
    nth             1-based index of this attempt among all attempts to `path`
    idempotency_key the X-Idempotency-Key of this call
    """

    def __init__(self, path, body, attempt, nth, idempotency_key):
        self.path = path
        self.body = body
        self.seq_id = body.get("seq_id") if isinstance(body, dict) else None
        self.attempt = attempt
        self.nth = nth
        self.idempotency_key = idempotency_key

    def __repr__(self):
        return ("FaultContext(path=%r, seq_id=%r, attempt=%d, nth=%d)"
                % (self.path, self.seq_id, self.attempt, self.nth))


class FaultAction:
    """What to do with one HTTP attempt.

    delay              seconds to sleep before sending the request
    drop_response      send the request in full, then close the connection
                       without reading the response (a response lost on the
                       network); the HTTP layer then retries with the same
                       idempotency key, as for any connection error (§1.1)
    wait_for_response  with drop_response: wait up to this many seconds for the
                       first response byte before closing, so the server has
                       surely read and handled the request (0: close at once)
    """

    def __init__(self, delay=0.0, drop_response=False, wait_for_response=5.0):
        self.delay = delay
        self.drop_response = drop_response
        self.wait_for_response = wait_for_response

    @classmethod
    def coerce(cls, value):
        if value is None or isinstance(value, FaultAction):
            return value
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError("a fault must return None, a FaultAction or a dict, not %r" % (value,))


class Faults:
    """A rule list usable as the `fault` argument of ServiceClient.

        faults = Faults()
        faults.drop_response("forward_backward", seq_id=2)   # lose seq 2's first response
        faults.drop_response("optim_step", nth=1)            # lose the 1st POST to optim_step
        faults.delay("forward_backward", 0.5, seq_id=3)      # send seq 3 half a second late
        sc = ServiceClient(url, fault=faults)
        ...
        assert faults.fired == [("drop_response", "/api/v1/forward_backward", 2, 1), ...]

    `path` may be given with or without the "/api/v1/" prefix.  A rule matches an
    HTTP attempt when the path matches, `seq_id` (if given) equals the body's
    seq_id, and `nth` (if given) equals the attempt's 1-based index among all
    attempts to that path (retries count, since the server sees them).  Each rule
    fires `times` times (default 1), so the HTTP layer's retry of a dropped
    request goes through.  `fired` lists (kind, path, seq_id, nth) per firing.

    Any other callable `fault(ctx: FaultContext) -> FaultAction | dict | None`
    may be passed to ServiceClient instead.
    """

    def __init__(self):
        self._rules = []
        self._lock = threading.Lock()
        self.fired = []

    @staticmethod
    def _norm(path):
        return path if path.startswith("/") else API + path

    def drop_response(self, path, seq_id=None, nth=None, times=1, wait_for_response=5.0):
        """Lose the response of matching attempts (see FaultAction.drop_response)."""
        self._rules.append({"kind": "drop_response", "path": self._norm(path), "seq_id": seq_id,
                            "nth": nth, "left": times,
                            "action": FaultAction(drop_response=True,
                                                  wait_for_response=wait_for_response)})
        return self

    def delay(self, path, seconds, seq_id=None, nth=None, times=1):
        """Sleep `seconds` before sending matching attempts."""
        self._rules.append({"kind": "delay", "path": self._norm(path), "seq_id": seq_id,
                            "nth": nth, "left": times, "action": FaultAction(delay=seconds)})
        return self

    def pending(self):
        """Rules that have not fired as often as asked."""
        return [r for r in self._rules if r["left"] > 0]

    def __call__(self, ctx):
        with self._lock:
            delay, drop, wait = 0.0, False, 5.0
            hit = False
            for rule in self._rules:
                if rule["left"] <= 0 or rule["path"] != ctx.path:
                    continue
                if rule["seq_id"] is not None and rule["seq_id"] != ctx.seq_id:
                    continue
                if rule["nth"] is not None and rule["nth"] != ctx.nth:
                    continue
                rule["left"] -= 1
                hit = True
                self.fired.append((rule["kind"], ctx.path, ctx.seq_id, ctx.nth))
                delay += rule["action"].delay
                if rule["action"].drop_response:
                    drop, wait = True, rule["action"].wait_for_response
            return FaultAction(delay, drop, wait) if hit else None


# ---- HTTP layer (§1.1) ---------------------------------------------------------

class HttpResponse:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers          # lower-case keys
        self.body = body

    @property
    def content_type(self):
        return self.headers.get("content-type", "")

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise ProtocolError("response is not JSON (%s): %r" % (e, self.body[:200])) from e


def _parse_retry_after(headers):
    """Stainless _parse_retry_after_header: retry-after-ms, then retry-after
    as seconds or as an HTTP date (§1.1)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return float(ms) / 1000.0
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    return email.utils.mktime_tz(parsed) - time.time()


class HttpClient:
    """The Stainless HTTP layer of the SDK (§1.1).

    Every POST carries X-API-Key, Content-Type: application/json, the
    X-Stainless-* platform headers, x-stainless-retry-count, and an
    X-Idempotency-Key "stainless-python-retry-<uuid4>" that is the same for all
    of this layer's retries of one call.  408, 409, 429, 5xx and connection
    errors are retried up to `max_retries` (10) times with a backoff of
    min(backoff_base * 2**n, backoff_max) * (1 - 0.25 * random()), unless the
    response says x-should-retry: false (x-should-retry: true forces a retry);
    retry-after-ms / retry-after in (0, 60] s replace the backoff.  Anything
    else non-2xx raises APIStatusError.

    Every attempt is counted: stats[path][status] (status is the HTTP code, or
    "lost" for a dropped response, "conn_error", "timeout"), and appended to
    http_log as a dict (path, seq_id, attempt, idempotency_key, status,
    t_start, t_sent, t_done, fault, body).
    """

    def __init__(self, base_url, api_key, sdk_version, fault=None, max_retries=DEFAULT_MAX_RETRIES,
                 backoff_base=INITIAL_RETRY_DELAY, backoff_max=MAX_RETRY_DELAY,
                 timeout=DEFAULT_TIMEOUT, keep_alive=True, log_bodies=True):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise ValueError("base_url must be http:// or https://, got %r" % base_url)
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")          # §1.1: a path prefix in the base is kept
        self.api_key = api_key
        self.sdk_version = sdk_version
        self.fault = fault
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.timeout = timeout
        self.keep_alive = keep_alive
        self.log_bodies = log_bodies
        self.stats = {}
        self.http_log = []
        self._nth = {}
        self._lock = threading.Lock()
        self._idle = []
        self.default_headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": "AsyncTinker/Python %s" % sdk_version,
            "X-Stainless-Lang": "python",
            "X-Stainless-Package-Version": sdk_version,
            "X-Stainless-OS": platform.system() or "Unknown",
            "X-Stainless-Arch": {"x86_64": "x64", "aarch64": "arm64"}.get(
                platform.machine(), platform.machine() or "unknown"),
            "X-Stainless-Runtime": platform.python_implementation(),
            "X-Stainless-Runtime-Version": platform.python_version(),
            "X-Stainless-Async": "async:asyncio",
            "X-API-Key": api_key,
        }

    # -- bookkeeping --

    def _count(self, path, status):
        with self._lock:
            per_path = self.stats.setdefault(path, {})
            per_path[status] = per_path.get(status, 0) + 1

    def count(self, path, status=None):
        """Attempts to `path` (with or without "/api/v1/"), optionally only those
        that ended with `status`."""
        path = path if path.startswith("/") else API + path
        with self._lock:
            per_path = self.stats.get(path, {})
            return sum(per_path.values()) if status is None else per_path.get(status, 0)

    def _next_nth(self, path):
        with self._lock:
            self._nth[path] = self._nth.get(path, 0) + 1
            return self._nth[path]

    # -- connections --

    def _connect(self, timeout):
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = cls(self.host, self.port, timeout=CONNECT_TIMEOUT)
        conn.connect()
        conn.sock.settimeout(timeout)
        return conn

    def _take_conn(self, timeout):
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is not None:
            conn.sock.settimeout(timeout)
            return conn, True
        return self._connect(timeout), False

    def _give_conn(self, conn):
        if not self.keep_alive:
            conn.close()
            return
        with self._lock:
            self._idle.append(conn)

    def close(self):
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- one attempt --

    def _attempt(self, method, path, payload, headers, timeout, action):
        """Send once.  Returns HttpResponse, or raises APIConnectionError."""
        conn = None
        try:
            try:
                conn, _reused = self._take_conn(timeout)
            except socket.timeout as e:
                raise APITimeoutError("connect to %s:%s timed out" % (self.host, self.port)) from e
            except OSError as e:
                raise APIConnectionError("connect to %s:%s: %s" % (self.host, self.port, e)) from e
            conn.request(method, self.prefix + path, body=payload, headers=headers)
            t_sent = time.monotonic()
            if action is not None and action.drop_response:
                if action.wait_for_response > 0:
                    select.select([conn.sock], [], [], action.wait_for_response)
                conn.close()
                conn = None
                err = ResponseLost("response to %s %s dropped (injected fault)" % (method, path))
                err.t_sent = t_sent
                raise err
            resp = conn.getresponse()
            body = resp.read()
            headers_in = {k.lower(): v for k, v in resp.getheaders()}
            if resp.will_close:
                conn.close()
            else:
                self._give_conn(conn)
            conn = None
            result = HttpResponse(resp.status, headers_in, body)
            result.t_sent = t_sent
            return result
        except ResponseLost:
            raise
        except socket.timeout as e:
            raise APITimeoutError("%s %s: read timed out" % (method, path)) from e
        except (OSError, http.client.HTTPException) as e:
            raise APIConnectionError("%s %s: %s: %s" % (method, path, type(e).__name__, e)) from e
        finally:
            if conn is not None:
                conn.close()

    def _backoff(self, retries_taken, headers):
        """Stainless _calculate_retry_timeout (§1.1)."""
        if headers is not None:
            retry_after = _parse_retry_after(headers)
            if retry_after is not None and 0 < retry_after <= 60:
                return retry_after
        sleep = min(self.backoff_base * (2.0 ** retries_taken), self.backoff_max)
        return sleep * (1 - 0.25 * random.random())

    @staticmethod
    def _should_retry(resp):
        """Stainless _should_retry (§1.1)."""
        flag = resp.headers.get("x-should-retry")
        if flag == "true":
            return True
        if flag == "false":
            return False
        return resp.status in (408, 409, 429) or resp.status >= 500

    # -- one call --

    def request(self, method, path, body=None, max_retries=None, timeout=None, extra_headers=None):
        """One SDK call: the first attempt plus this layer's retries (§1.1).

        Returns the 2xx HttpResponse; raises APIStatusError or APIConnectionError.
        """
        max_retries = self.max_retries if max_retries is None else max_retries
        timeout = self.timeout if timeout is None else timeout
        payload = None
        content_type = "application/json"
        if isinstance(body, ProtoBody):
            payload, body, content_type = body.payload, body.message, PROTO_CONTENT_TYPE
        elif body is not None:
            payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        idempotency_key = None
        if method != "GET":
            idempotency_key = "stainless-python-retry-%s" % uuid.uuid4()
        seq_id = body.get("seq_id") if isinstance(body, dict) else None
        retries_taken = 0
        while True:
            headers = dict(self.default_headers)
            if method == "GET":
                headers.pop("Content-Type")
            else:
                headers["Content-Type"] = content_type
                headers["X-Idempotency-Key"] = idempotency_key
            headers["x-stainless-retry-count"] = str(retries_taken)
            headers["x-stainless-read-timeout"] = str(timeout)
            if extra_headers:
                headers.update(extra_headers)
            nth = self._next_nth(path)
            action = None
            if self.fault is not None:
                action = FaultAction.coerce(self.fault(
                    FaultContext(path, body, retries_taken, nth, idempotency_key)))
            record = {"method": method, "path": path, "seq_id": seq_id, "attempt": retries_taken,
                      "nth": nth, "idempotency_key": idempotency_key, "status": None,
                      "t_start": time.monotonic(), "t_sent": None, "t_done": None,
                      "fault": None, "body": body if self.log_bodies else None}
            if action is not None:
                record["fault"] = {"delay": action.delay, "drop_response": action.drop_response}
                if action.delay > 0:
                    time.sleep(action.delay)
            with self._lock:
                self.http_log.append(record)
            try:
                resp = self._attempt(method, path, payload, headers, timeout, action)
            except APIConnectionError as e:
                status = ("lost" if isinstance(e, ResponseLost)
                          else "timeout" if isinstance(e, APITimeoutError) else "conn_error")
                record.update(status=status, t_done=time.monotonic(),
                              t_sent=getattr(e, "t_sent", None))
                self._count(path, status)
                if retries_taken < max_retries:
                    logger.info("%s %s: %s; retry %d", method, path, e, retries_taken + 1)
                    time.sleep(self._backoff(retries_taken, None))
                    retries_taken += 1
                    continue
                raise
            record.update(status=resp.status, t_sent=resp.t_sent, t_done=time.monotonic())
            self._count(path, resp.status)
            if 200 <= resp.status < 300:
                return resp
            if retries_taken < max_retries and self._should_retry(resp):
                logger.info("%s %s: HTTP %d; retry %d", method, path, resp.status, retries_taken + 1)
                time.sleep(self._backoff(retries_taken, resp.headers))
                retries_taken += 1
                continue
            raise APIStatusError(path, resp.status, resp.body, resp.headers)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, None, **kw)


# ---- response validation (§1.3, §1.4) -----------------------------------------

def _require(cond, what, obj):
    if not cond:
        raise ProtocolError("%s: %s" % (what, json.dumps(obj)[:500]))


def _check_tensor(t, where):
    _require(isinstance(t, dict), where + " is not a TensorData object", t)
    extra = set(t) - TENSOR_KEYS
    _require(not extra, "%s has keys TensorData forbids %s" % (where, sorted(extra)), t)
    _require(isinstance(t.get("data"), list)
             and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in t["data"]),
             where + ".data must be a list of numbers", t)
    _require(t.get("dtype") in ("int64", "float32"), where + ".dtype must be int64|float32", t)
    shape = t.get("shape")
    _require(shape is None or (isinstance(shape, list) and all(isinstance(x, int) for x in shape)),
             where + ".shape must be a list of ints or absent", t)


def parse_untyped_future(obj):
    """UntypedAPIFuture {"request_id": str, "model_id"?: str}; the SDK validates
    strictly, so request_id must be a JSON string (§1.3)."""
    _require(isinstance(obj, dict), "future is not an object", obj)
    _require(isinstance(obj.get("request_id"), str), "future.request_id must be a JSON string", obj)
    _require(obj.get("model_id") is None or isinstance(obj["model_id"], str),
             "future.model_id must be a string", obj)
    return obj


def parse_forward_backward_output(obj):
    """ForwardBackwardOutput (§1.4): loss_fn_output_type, loss_fn_outputs (one
    dict of TensorData per datum) and metrics (required in JSON)."""
    _require(isinstance(obj, dict), "ForwardBackwardOutput is not an object", obj)
    _require(isinstance(obj.get("loss_fn_output_type"), str),
             "ForwardBackwardOutput.loss_fn_output_type must be a string", obj)
    _require(isinstance(obj.get("loss_fn_outputs"), list),
             "ForwardBackwardOutput.loss_fn_outputs must be a list", obj)
    _require(isinstance(obj.get("metrics"), dict),
             "ForwardBackwardOutput.metrics is required and must be an object", obj)
    for k, v in obj["metrics"].items():
        _require(isinstance(v, (int, float)) and not isinstance(v, bool),
                 "metric %r must be a number" % k, obj["metrics"])
    for i, out in enumerate(obj["loss_fn_outputs"]):
        _require(isinstance(out, dict), "loss_fn_outputs[%d] must be an object" % i, out)
        for name, t in out.items():
            _check_tensor(t, "loss_fn_outputs[%d][%r]" % (i, name))
    return obj


def parse_optim_step_response(obj):
    """OptimStepResponse {"metrics"?: {str: float}} (§1.4)."""
    _require(isinstance(obj, dict), "OptimStepResponse is not an object", obj)
    _require(obj.get("metrics") is None or isinstance(obj["metrics"], dict),
             "OptimStepResponse.metrics must be an object", obj)
    return obj


def _parse_with_string(field, name, optional=False):
    def parse(obj):
        _require(isinstance(obj, dict), name + " is not an object", obj)
        if optional and obj.get(field) is None:
            return obj
        _require(isinstance(obj.get(field), str), "%s.%s must be a string" % (name, field), obj)
        return obj
    return parse


parse_create_model_response = _parse_with_string("model_id", "CreateModelResponse")
parse_save_weights_response = _parse_with_string("path", "SaveWeightsResponse")
parse_load_weights_response = _parse_with_string("path", "LoadWeightsResponse", optional=True)
parse_unload_model_response = _parse_with_string("model_id", "UnloadModelResponse", optional=True)


def parse_save_weights_for_sampler_response(obj):
    _require(isinstance(obj, dict), "SaveWeightsForSamplerResponse is not an object", obj)
    _require(isinstance(obj.get("path"), str) or isinstance(obj.get("sampling_session_id"), str),
             "SaveWeightsForSamplerResponse needs path or sampling_session_id", obj)
    return obj


# ---- protobuf ForwardBackwardRequest (§1.6, SDK 0.25) ------------------------------
#
# What the SDK's request_conv.forward_backward_request_to_proto builds and
# protobuf's SerializeToString writes: fields in number order, proto3 scalars
# left out at their default (model_id "", seq_id 0, loss_fn "", dtype 0,
# forward_only false), a oneof member always written once set, map entries
# {1 key, 2 value} with both written, repeated int64 packed.

def _pb_uvarint(v):
    v &= (1 << 64) - 1          # a negative int goes out as its 64-bit two's complement
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _pb_key(number, wire):
    return _pb_uvarint(number << 3 | wire)


def _pb_len(number, payload):
    return _pb_key(number, 2) + _pb_uvarint(len(payload)) + payload


def _pb_packed(values):
    return b"".join(_pb_uvarint(int(v)) for v in values)


def _pb_le(code, values):
    a = array.array(code, values)
    if sys.byteorder != "little":
        a.byteswap()
    return a.tobytes()


# TensorData dtype -> (DType, array code); the SDK writes only these two.
_PB_WRITE_DTYPES = {"float32": (1, "f"), "int64": (2, "q")}


def _pb_tensor(td):
    """TensorData {data, dtype, shape?, sparse_*?} -> Tensor bytes."""
    if td.get("dtype") not in _PB_WRITE_DTYPES:
        raise ValueError("Unsupported TensorData dtype for proto write: %r" % td.get("dtype"))
    dtype, code = _PB_WRITE_DTYPES[td["dtype"]]
    values = [float(x) for x in td["data"]] if code == "f" else [int(x) for x in td["data"]]
    if td.get("sparse_crow_indices") is not None:
        sparse = (_pb_len(1, _pb_le(code, values))
                  + _pb_len(2, _pb_le("q", td["sparse_crow_indices"]))
                  + _pb_len(3, _pb_le("q", td.get("sparse_col_indices") or [])))
        out = _pb_len(2, sparse)
    else:
        out = _pb_len(1, _pb_le(code, values))
    out += _pb_key(3, 0) + _pb_uvarint(dtype)
    if td.get("shape"):
        out += _pb_len(4, _pb_packed(td["shape"]))
    return out


def _pb_chunk(chunk):
    """A ModelInput chunk -> Chunk bytes (encoded_text: int32 tokens; image:
    raw bytes, format, expected_tokens?)."""
    kind = chunk.get("type", "encoded_text")
    if kind == "encoded_text":
        return _pb_len(1, _pb_len(1, _pb_le("i", [int(t) for t in chunk["tokens"]])))
    if kind == "image":
        image = _pb_len(1, base64.b64decode(chunk.get("data", ""))) \
            + _pb_len(2, chunk.get("format", "png").encode("utf-8"))
        if chunk.get("expected_tokens") is not None:
            image += _pb_key(3, 0) + _pb_uvarint(int(chunk["expected_tokens"]))
        return _pb_len(2, image)
    raise ValueError("Unsupported model input chunk type: %r" % kind)


def encode_forward_backward_request_proto(model_id, seq_id, data, loss_fn, loss_fn_config=None,
                                          forward_only=False):
    """The protobuf ForwardBackwardRequest SDK 0.25 posts (§1.6): 1 model_id,
    2 seq_id, 3 data (Datum: 1 model_input chunks, 2 loss_fn_inputs map), 4
    loss_fn, 5 loss_fn_config map<string,double>, 6 forward_only."""
    out = b""
    if model_id:
        out += _pb_len(1, model_id.encode("utf-8"))
    if seq_id:
        out += _pb_key(2, 0) + _pb_uvarint(int(seq_id))
    for d in data:
        body = b"".join(_pb_len(1, _pb_chunk(c)) for c in d["model_input"]["chunks"])
        for name, td in d["loss_fn_inputs"].items():
            if not isinstance(td, dict):
                td = tensor(td)
            body += _pb_len(2, _pb_len(1, name.encode("utf-8")) + _pb_len(2, _pb_tensor(td)))
        out += _pb_len(3, body)
    if loss_fn:
        out += _pb_len(4, loss_fn.encode("utf-8"))
    for key, value in (loss_fn_config or {}).items():
        out += _pb_len(5, _pb_len(1, key.encode("utf-8")) + _pb_key(2, 1) + struct.pack("<d", float(value)))
    if forward_only:
        out += _pb_key(6, 0) + b"\x01"
    return out


# ---- protobuf ForwardBackwardOutput (§1.6) ---------------------------------------

def _pb_varint(buf, i):
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ProtocolError("truncated varint in protobuf response")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _pb_fields(buf):
    """Yield (field_number, wire_type, value) for one message."""
    i = 0
    while i < len(buf):
        key, i = _pb_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _pb_varint(buf, i)
        elif wire == 1:
            value, i = bytes(buf[i:i + 8]), i + 8
        elif wire == 2:
            n, i = _pb_varint(buf, i)
            value, i = bytes(buf[i:i + n]), i + n
        elif wire == 5:
            value, i = bytes(buf[i:i + 4]), i + 4
        else:
            raise ProtocolError("unsupported protobuf wire type %d" % wire)
        if i > len(buf):
            raise ProtocolError("truncated protobuf message")
        yield number, wire, value


def _pb_int64s(wire, value):
    if wire == 0:
        return [value - (1 << 64) if value >= 1 << 63 else value]
    out, i = [], 0
    while i < len(value):
        v, i = _pb_varint(value, i)
        out.append(v - (1 << 64) if v >= 1 << 63 else v)
    return out


def _pb_array(code, raw):
    a = array.array(code)
    if len(raw) % a.itemsize:
        raise ProtocolError("protobuf tensor bytes not a multiple of %d" % a.itemsize)
    a.frombytes(raw)
    if sys.byteorder != "little":
        a.byteswap()
    return a


# DType enum (§1.6): 1 FLOAT32, 2 INT64, 3 INT32, 4 BFLOAT16 -> (array code, public dtype)
_PB_DTYPES = {1: ("f", "float32"), 2: ("q", "int64"), 3: ("i", "int64"), 4: ("H", "float32")}


def decode_forward_backward_output_proto(raw):
    """Decode a protobuf ForwardBackwardOutput (§1.6) into the JSON shape (§1.4),
    as the SDK's response_conv does (int32 -> int64, bfloat16 -> float32)."""
    out_type = ""
    records = []
    metrics = {}
    for number, wire, value in _pb_fields(raw):
        if number == 1 and wire == 2:
            out_type = value.decode("utf-8")
        elif number == 2 and wire == 2:
            records.append(value)
        elif number == 3 and wire == 2:
            key, val = None, 0.0
            for n2, w2, v2 in _pb_fields(value):
                if n2 == 1:
                    key = v2.decode("utf-8")
                elif n2 == 2 and w2 == 1:
                    val = struct.unpack("<d", v2)[0]
            metrics[key] = val
    per_field, meta, num_datums = {}, {}, 0
    for rec in records:
        for number, wire, value in _pb_fields(rec):
            if number == 3 and wire == 0:
                num_datums += value
            elif number == 2 and wire == 2:
                name, bt = None, b""
                for n2, w2, v2 in _pb_fields(value):
                    if n2 == 1:
                        name = v2.decode("utf-8")
                    elif n2 == 2:
                        bt = v2
                data, offsets, dtype, trailing = b"", b"", 0, []
                for n3, w3, v3 in _pb_fields(bt):
                    if n3 == 1:
                        data = v3
                    elif n3 == 2:
                        offsets = v3
                    elif n3 == 3:
                        dtype = v3
                    elif n3 == 4:
                        trailing += _pb_int64s(w3, v3)
                if dtype not in _PB_DTYPES:
                    raise ProtocolError("unsupported protobuf DType %d on field %r" % (dtype, name))
                code, public = _PB_DTYPES[dtype]
                values = _pb_array(code, data)
                if dtype == 4:
                    values = [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in values]
                itemsize = array.array(code).itemsize
                offs = _pb_array("q", offsets)
                chunks = per_field.setdefault(name, [])
                for k in range(len(offs) - 1):
                    chunks.append(list(values[offs[k] // itemsize: offs[k + 1] // itemsize]))
                meta.setdefault(name, (public, trailing))
    if num_datums == 0 and per_field:
        num_datums = len(next(iter(per_field.values())))
    outputs = []
    for i in range(num_datums):
        d = {}
        for name, chunks in per_field.items():
            public, trailing = meta[name]
            inner = 1
            for s in trailing:
                inner *= s
            d[name] = {"data": chunks[i], "dtype": public,
                       "shape": [len(chunks[i]) // inner if inner else 0] + list(trailing)}
        outputs.append(d)
    return {"loss_fn_output_type": out_type.rsplit(":", 1)[-1] if records else (out_type or "ArrayRecord"),
            "loss_fn_outputs": outputs, "metrics": metrics}


# ---- futures (§1.3) -------------------------------------------------------------

class _FutureBase:
    """Thread-backed future: result(timeout=None) blocks; exceptions re-raise."""

    def __init__(self):
        self._done = threading.Event()
        self._result = None
        self._error = None

    def _set(self, result=None, error=None):
        self._result, self._error = result, error
        self._done.set()

    def done(self):
        return self._done.is_set()

    def exception(self, timeout=None):
        if not self._done.wait(timeout):
            raise TimeoutError("future not done after %s s" % timeout)
        return self._error

    def result(self, timeout=None):
        if not self._done.wait(timeout):
            raise TimeoutError("future not done after %s s" % timeout)
        if self._error is not None:
            raise self._error
        return self._result


class APIFuture(_FutureBase):
    """One server-side future, polled with POST /api/v1/retrieve_future (§1.3).

    Polling starts as soon as the future exists (as in the SDK).  Body
    {"request_id", "allow_metadata_only"}; headers X-Tinker-Request-Iteration,
    X-Tinker-Request-Type and (first poll only)
    X-Tinker-Create-Promise-Roundtrip-Time; 45 s client timeout, no HTTP-layer
    retries.  Answers:
      {"type": "try_again", ...}     -> poll again at once, no sleep
      {"status": "complete_metadata"} -> only legal if allow_metadata_only; poll
                                         again with allow_metadata_only=false
      {"error", "category"}           -> RequestFailedError
      anything else (HTTP 200)        -> the result, validated by `parse`
      HTTP 408                        -> poll again at once
      HTTP 410                        -> RetryableException
      HTTP 429                        -> poll again after a backoff
      HTTP 5xx                        -> poll again at once
      HTTP 400                        -> retried 3 times, then raised
      other HTTP 4xx                  -> APIStatusError
      connection error / timeout      -> poll again after min(2**n, 30) s
    Attributes: request_id, request_type, iterations, try_agains.
    """

    def __init__(self, holder, untyped, request_type, parse, request_start_time):
        super().__init__()
        self.holder = holder
        self.request_id = untyped["request_id"]
        self.model_id = untyped.get("model_id")
        self.request_type = request_type
        self.parse = parse
        self.roundtrip = time.time() - request_start_time
        self.iterations = 0
        self.try_agains = 0
        self.content_type = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="retrieve-%s" % self.request_id)
        self._thread.start()

    def _run(self):
        try:
            self._set(result=self._poll())
        except BaseException as e:   # noqa: BLE001 - handed to result()
            self._set(error=e)

    def _poll(self):
        h = self.holder
        allow_metadata_only = h.allow_metadata_only
        bad_request_retries = conn_retries = rate_limit_retries = 0
        iteration = -1
        while True:
            if h.closed:
                raise APIError("ServiceClient closed while polling %s" % self.request_id)
            iteration += 1
            self.iterations = iteration + 1
            headers = {"X-Tinker-Request-Iteration": str(iteration),
                       "X-Tinker-Request-Type": self.request_type}
            if self.request_type in ("ForwardBackward", "Forward") and h.accept_proto:
                headers["Accept"] = PROTO_CONTENT_TYPE + ", application/json"
            if iteration == 0:
                headers["X-Tinker-Create-Promise-Roundtrip-Time"] = str(self.roundtrip)
            body = {"request_id": self.request_id, "allow_metadata_only": allow_metadata_only}
            try:
                resp = h.http.post(API + "retrieve_future", body, max_retries=0,
                                   timeout=h.retrieve_timeout, extra_headers=headers)
            except APIStatusError as e:
                conn_retries = 0
                h._bump("retrieve_%d" % e.status)
                if e.status == 408:
                    bad_request_retries = 0
                    continue
                if e.status == 410:
                    raise RetryableException("promise expired for request %s" % self.request_id) from e
                if 500 <= e.status < 600:
                    continue
                if e.status == 429:
                    time.sleep(h.http._backoff(min(rate_limit_retries, 10), e.headers))
                    rate_limit_retries += 1
                    continue
                if e.status == 400 and bad_request_retries < MAX_BAD_REQUEST_RETRIES:
                    bad_request_retries += 1
                    continue
                raise
            except APIConnectionError:
                h._bump("retrieve_conn_error")
                time.sleep(min(2 ** conn_retries, 30) * h.outer_backoff_unit)
                conn_retries += 1
                continue
            self.content_type = resp.content_type
            if PROTO_CONTENT_TYPE in resp.content_type:
                if self.request_type not in ("ForwardBackward", "Forward"):
                    raise ProtocolError("protobuf answer for a %s future" % self.request_type)
                h._bump("result_proto")
                return self.parse(decode_forward_backward_output_proto(resp.body))
            obj = resp.json()
            _require(isinstance(obj, dict), "retrieve_future answer is not an object", obj)
            if "request_id" in obj:
                _require(isinstance(obj["request_id"], str),
                         "retrieve_future request_id must be a JSON string", obj)
            if obj.get("type") == "try_again":
                self.try_agains += 1
                h._bump("try_again")
                continue
            if obj.get("status") == "complete_metadata":
                _require(allow_metadata_only,
                         "complete_metadata although allow_metadata_only was false", obj)
                allow_metadata_only = False
                h._bump("complete_metadata")
                continue
            if "error" in obj:
                h._bump("request_failed")
                category = obj.get("category")
                if category not in ("user", "server", "unknown"):
                    category = "unknown"
                raise RequestFailedError(obj["error"], category, self.request_id)
            h._bump("result_json")
            if h.proto_results_only and self.request_type in ("ForwardBackward", "Forward"):
                raise ProtocolError("Server returned a JSON payload for ForwardBackwardOutput, which this "
                                    "SDK version only supports as proto (SDK %s)" % h.sdk_version)
            return self.parse(obj)


class CombinedFuture(_FutureBase):
    """The future forward_backward()/forward() return: waits until every chunk
    was submitted and every chunk future finished, then merges (§1.5).

    Attributes: futures (the per-chunk APIFutures in chunk order, once
    submitted), chunks (list of (seq_id, n_datums)).
    """

    def __init__(self, chunks):
        super().__init__()
        self.chunks = chunks
        self.futures = []


# ---- chunk merging (§1.4, §1.5) ------------------------------------------------

def _wmean(values, weights):
    total = float(sum(weights))
    if total == 0:
        raise ZeroDivisionError("weights sum to zero")   # numpy.average raises too
    return sum(v * w for v, w in zip(values, weights)) / total


def combine_fwd_bwd_results(results):
    """Merge per-chunk ForwardBackwardOutputs like the SDK's
    combine_fwd_bwd_output_results (§1.4, §1.5).

    loss_fn_outputs are concatenated in chunk order.  For each key of the FIRST
    chunk's metrics: the key is split on ":" into exactly (name, reduction) --
    any other shape raises ValueError, as the SDK's tuple unpacking does; keys
    with an unknown reduction, or missing from some chunk, are dropped.
    sum: summed; mean: averaged, weighted by each chunk's datum count; min,
    max; slack: max - weighted mean; hash_unordered / hash2: sum of the values
    as unsigned 64-bit ints, mod 2**64; unique: the first chunk's value under
    the key, later chunks' values under key_1, key_2, ...
    """
    if not results:
        return {"loss_fn_output_type": "", "metrics": {}, "loss_fn_outputs": []}
    weights = [len(r["loss_fn_outputs"]) for r in results]
    metrics = {}
    for key in results[0]["metrics"]:
        parts = key.split(":")
        if len(parts) != 2:
            raise ValueError("metric key %r: expected exactly one ':' (name:reduction)" % key)
        _name, reduction = parts
        if reduction not in ("sum", "mean", "min", "max", "slack", "hash_unordered", "hash2",
                             "unique"):
            logger.debug("dropping metric %r: unknown reduction", key)
            continue
        if not all(key in r["metrics"] for r in results):
            continue
        values = [r["metrics"][key] for r in results]
        if reduction == "sum":
            metrics[key] = float(sum(values))
        elif reduction == "mean":
            metrics[key] = _wmean(values, weights)
        elif reduction == "min":
            metrics[key] = min(values)
        elif reduction == "max":
            metrics[key] = max(values)
        elif reduction == "slack":
            metrics[key] = max(values) - _wmean(values, weights)
        elif reduction in ("hash_unordered", "hash2"):
            mask = 0xFFFF_FFFF_FFFF_FFFF
            metrics[key] = sum(int(v) & mask for v in values) & mask
        else:  # unique
            metrics[key] = values[0]
            for i, v in enumerate(values[1:]):
                metrics["%s_%d" % (key, i + 1)] = v
    return {"loss_fn_output_type": results[0]["loss_fn_output_type"],
            "metrics": metrics,
            "loss_fn_outputs": [o for r in results for o in r["loss_fn_outputs"]]}


# ---- data helpers (§1.4) ---------------------------------------------------------

def tensor(data, dtype=None, shape=None):
    """TensorData {"data", "dtype", "shape"} (§1.4).  dtype defaults to int64
    when every value is an int, float32 otherwise; shape to [len(data)]."""
    data = list(data)
    if dtype is None:
        dtype = "int64" if all(isinstance(x, int) and not isinstance(x, bool) for x in data) \
            else "float32"
    if dtype == "float32":
        data = [float(x) for x in data]
    return {"data": data, "dtype": dtype, "shape": [len(data)] if shape is None else list(shape)}


def datum(tokens, targets, weights=None, **extra_tensors):
    """Datum {"model_input": {"chunks": [encoded_text]}, "loss_fn_inputs": {...}} (§1.4).

    targets -> target_tokens (int64, [N]); weights (if given) -> float32 [N];
    every extra keyword becomes a loss_fn_input: a list becomes float32 [N]
    (e.g. logprobs=..., advantages=...), a dict is used as the TensorData itself.
    """
    inputs = {"target_tokens": tensor([int(t) for t in targets], "int64")}
    if weights is not None:
        inputs["weights"] = tensor(weights, "float32")
    for name, value in extra_tensors.items():
        inputs[name] = value if isinstance(value, dict) else tensor(value, "float32")
    return {"model_input": {"chunks": [{"type": "encoded_text", "tokens": [int(t) for t in tokens]}]},
            "loss_fn_inputs": inputs}


def model_input_length(d):
    return sum(len(c.get("tokens", [])) for c in d["model_input"]["chunks"])


def estimate_bytes_count(d):
    """≤0.24 size estimate (§3): 10 per token plus 10 per loss tensor element."""
    return 10 * model_input_length(d) + sum(10 * len(t["data"]) for t in d["loss_fn_inputs"].values())


def estimate_bytes_count_025(d):
    """0.25's size estimate (§3): 4 per token plus each loss tensor's raw bytes."""
    width = {"int64": 8, "float32": 4}
    return 4 * model_input_length(d) + sum(width.get(t.get("dtype"), 4) * len(t["data"])
                                           for t in d["loss_fn_inputs"].values())


def chunk_data(data, max_len, max_bytes, estimate=estimate_bytes_count):
    """Cut data into consecutive chunks (§3): a chunk closes when it holds
    max_len datums, or when adding the next datum would push the estimated size
    past max_bytes.  A single datum is never split (a chunk always takes at
    least one datum)."""
    chunks, current, current_bytes = [], [], 0
    for d in data:
        size = estimate(d)
        if (current and current_bytes + size > max_bytes) or len(current) == max_len:
            chunks.append(current)
            current, current_bytes = [], 0
        current.append(d)
        current_bytes += size
    if current:
        chunks.append(current)
    return chunks


# ---- training client (§1.4, §1.5, §3) ---------------------------------------------

class TrainingClient:
    """One model (model_id) with its seq_id counter and turn rule (§3).

    Every fwd/fwd-bwd chunk, optim_step, save_weights, load_weights and
    save_weights_for_sampler reserves the next request id when the method is
    called; seq_id = request_id + 1 (the first is 1).  The POST for id k+1 is
    sent only after the POST for id k has returned its future, except that all
    chunks of one forward_backward are POSTed at once when
    parallel_fwdbwd_chunks is true -- chunks 2..K concurrently, then chunk 1
    once all of those POSTs have returned (the SDK awaits
    asyncio.gather(chunks 2..K) before submitting chunk 1).  get_info takes no id.

    Deviation, to keep a test process from hanging: in the SDK a chunk that is
    never sent (an earlier chunk of the same call failed for good) never
    releases its turn, so later calls wait forever; here it releases its turn,
    so later calls are still sent (with that seq_id missing on the wire).

    Attributes: model_id, model_seq_id, holder (the ServiceClient),
    sent (list of (seq_id, path) in the order POSTs were started).
    """

    def __init__(self, holder, model_seq_id, model_id):
        self.holder = holder
        self.model_seq_id = model_seq_id
        self.model_id = model_id
        self._id_lock = threading.Lock()
        self._next_request_id = 0
        self._turn = threading.Condition()
        self._turn_counter = 0
        self.sent = []

    # -- ids and turns (§3) --

    def _get_request_id(self):
        with self._id_lock:
            rid = self._next_request_id
            self._next_request_id += 1
            return rid

    def _wait_turn(self, min_turn, max_turn=None):
        max_turn = min_turn if max_turn is None else max_turn
        with self._turn:
            self._turn.wait_for(lambda: self._turn_counter >= min_turn)
            if self._turn_counter > max_turn:
                raise AssertionError("turn counter %d overshot %d" % (self._turn_counter, max_turn))

    def _release_turn(self):
        with self._turn:
            self._turn_counter += 1
            self._turn.notify_all()

    def _submit(self, request_id, path, body, request_type, parse, start_time,
                turn_min=None, turn_max=None):
        """Take the turn, POST through execute_with_retries, release the turn,
        return the APIFuture (which starts polling at once)."""
        self._wait_turn(request_id if turn_min is None else turn_min, turn_max)
        try:
            with self._id_lock:
                self.sent.append((body.get("seq_id"), path))   # a ProtoBody has .get too
            untyped = self.holder.execute_with_retries(path, body, parse_untyped_future)
            return APIFuture(self.holder, untyped, request_type, parse, start_time)
        finally:
            self._release_turn()

    # -- forward / forward_backward (§1.4, §1.5, §3) --

    def _fwd_body(self, path, seq_id, data, loss_fn, loss_fn_config, forward_only=False):
        if self.holder.proto_fwdbwd:
            # 0.25 (§1.6): always /forward_backward, forward_only for forward.
            payload = encode_forward_backward_request_proto(self.model_id, seq_id, data, loss_fn,
                                                            loss_fn_config, forward_only)
            return ProtoBody(payload, {"model_id": self.model_id, "seq_id": seq_id, "n_datums": len(data),
                                       "loss_fn": loss_fn, "forward_only": forward_only})
        inner = {"data": data, "loss_fn": loss_fn}
        if loss_fn_config is not None:           # exclude_none (§1.1)
            inner["loss_fn_config"] = loss_fn_config
        key = "forward_backward_input" if path.endswith("forward_backward") else "forward_input"
        return {key: inner, "model_id": self.model_id, "seq_id": seq_id}

    def forward_backward(self, data, loss_fn, loss_fn_config=None):
        """POST /api/v1/forward_backward, one request per chunk (§1.4, §3).

        Body {"forward_backward_input": {"data", "loss_fn", "loss_fn_config"?},
        "model_id", "seq_id"}.  Returns a CombinedFuture whose result is the
        merged ForwardBackwardOutput (combine_fwd_bwd_results)."""
        return self._run_chunks(API + "forward_backward", "ForwardBackward", data, loss_fn,
                                loss_fn_config, parallel=self.holder.client_config["parallel_fwdbwd_chunks"])

    def forward(self, data, loss_fn, loss_fn_config=None):
        """POST /api/v1/forward (≤0.24), body {"forward_input": {...}, "model_id",
        "seq_id"}; chunked like forward_backward but always one turn per chunk.
        0.25: POST /api/v1/forward_backward, protobuf with forward_only = true."""
        path = API + ("forward_backward" if self.holder.proto_fwdbwd else "forward")
        return self._run_chunks(path, "Forward", data, loss_fn, loss_fn_config, parallel=False)

    def _run_chunks(self, path, request_type, data, loss_fn, loss_fn_config, parallel):
        cfg = self.holder.client_config
        pieces = chunk_data(data, cfg["fwdbwd_max_chunk_len"], cfg["fwdbwd_max_chunk_bytes_count"],
                            estimate_bytes_count_025 if self.holder.proto_fwdbwd else estimate_bytes_count)
        if not pieces:
            raise ValueError("No data provided")
        requests = [(self._get_request_id(), piece) for piece in pieces]
        combined = CombinedFuture([(rid + 1, len(piece)) for rid, piece in requests])
        min_rid, max_rid = requests[0][0], requests[-1][0]
        start_time = time.time()

        def submit(rid, piece, parallel_turns):
            body = self._fwd_body(path, rid + 1, piece, loss_fn, loss_fn_config,
                                  forward_only=request_type == "Forward")
            if parallel_turns:
                return self._submit(rid, path, body, request_type, parse_forward_backward_output,
                                    start_time, turn_min=min_rid, turn_max=max_rid)
            return self._submit(rid, path, body, request_type, parse_forward_backward_output,
                                start_time)

        def run():
            futures = [None] * len(requests)
            errors = [None] * len(requests)
            try:
                if parallel and len(requests) > 1:
                    def one(i):
                        try:
                            futures[i] = submit(requests[i][0], requests[i][1], True)
                        except BaseException as e:   # noqa: BLE001
                            errors[i] = e
                    threads = [threading.Thread(target=one, args=(i,), daemon=True,
                                                name="chunk-seq%d" % (requests[i][0] + 1))
                               for i in range(1, len(requests))]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    if any(errors):
                        # The SDK never sends chunk 1 in this case (see class docstring).
                        self._wait_turn(min_rid, max_rid)
                        self._release_turn()
                    else:
                        futures[0] = submit(requests[0][0], requests[0][1], True)
                else:
                    failed = False
                    for i, (rid, piece) in enumerate(requests):
                        if failed and request_type == "Forward":
                            # forward() stops at the first failure (see class docstring).
                            self._wait_turn(rid)
                            self._release_turn()
                            continue
                        try:
                            futures[i] = submit(rid, piece, False)
                        except BaseException as e:   # noqa: BLE001
                            errors[i] = e
                            failed = True
                first_error = next((e for e in errors if e is not None), None)
                if first_error is not None:
                    raise first_error
                combined.futures = futures
                results = [f.result() for f in futures]
                combined._set(result=combine_fwd_bwd_results(results))
            except BaseException as e:   # noqa: BLE001
                combined._set(error=e)

        threading.Thread(target=run, daemon=True, name="%s-%d" % (request_type, min_rid + 1)).start()
        return combined

    # -- single-id verbs (§1.4) --

    def _single(self, path, body_fn, request_type, parse):
        rid = self._get_request_id()
        body = body_fn(rid + 1)
        start_time = time.time()
        outer = _FutureBase()
        outer.seq_id = rid + 1

        def run():
            try:
                fut = self._submit(rid, path, body, request_type, parse, start_time)
                outer.api_future = fut
                outer._set(result=fut.result())
            except BaseException as e:   # noqa: BLE001
                outer._set(error=e)

        threading.Thread(target=run, daemon=True, name="%s-%d" % (request_type, rid + 1)).start()
        return outer

    def optim_step(self, adam_params=None):
        """POST /api/v1/optim_step {"adam_params", "model_id", "seq_id",
        "type": "optim_step"} (§1.4); missing AdamParams take the §1.4 defaults.
        Sent only after every earlier POST of this model returned its future (§3)."""
        params = dict(ADAM_DEFAULTS)
        unknown = set(adam_params or {}) - set(ADAM_DEFAULTS)
        if unknown:
            raise ValueError("unknown AdamParams %s" % sorted(unknown))
        params.update(adam_params or {})
        params = {k: float(v) for k, v in params.items()}
        return self._single(API + "optim_step",
                            lambda seq: {"adam_params": params, "model_id": self.model_id,
                                         "seq_id": seq, "type": "optim_step"},
                            "OptimStep", parse_optim_step_response)

    def save_state(self, name, ttl_seconds=None):
        """POST /api/v1/save_weights {"model_id", "path": name, "seq_id",
        "ttl_seconds"?, "overwrite": false, "type": "save_weights"} (§1.4)."""
        def body(seq):
            b = {"model_id": self.model_id, "path": name, "seq_id": seq}
            if ttl_seconds is not None:
                b["ttl_seconds"] = ttl_seconds
            b.update(overwrite=False, type="save_weights")
            return b
        return self._single(API + "save_weights", body, "SaveWeights", parse_save_weights_response)

    def load_state(self, path, optimizer=False):
        """POST /api/v1/load_weights {"model_id", "path", "seq_id", "optimizer",
        "type": "load_weights"} (§1.4).  As in the SDK, load_state loads the
        weights only (optimizer=false); load_state_with_optimizer sets it true."""
        return self._single(API + "load_weights",
                            lambda seq: {"model_id": self.model_id, "path": path, "seq_id": seq,
                                         "optimizer": bool(optimizer), "type": "load_weights"},
                            "LoadWeights", parse_load_weights_response)

    def load_state_with_optimizer(self, path):
        return self.load_state(path, optimizer=True)

    def save_weights_for_sampler(self, name, ttl_seconds=None):
        """POST /api/v1/save_weights_for_sampler {"model_id", "path", "seq_id",
        "ttl_seconds"?, "type"} (§1.4)."""
        def body(seq):
            b = {"model_id": self.model_id, "path": name, "seq_id": seq}
            if ttl_seconds is not None:
                b["ttl_seconds"] = ttl_seconds
            b["type"] = "save_weights_for_sampler"
            return b
        return self._single(API + "save_weights_for_sampler", body, "SaveWeightsForSampler",
                            parse_save_weights_for_sampler_response)

    def get_info(self):
        """POST /api/v1/get_info {"model_id", "type": "get_info"}: a direct answer,
        no future and no seq_id (§1.4, §3)."""
        info = self.holder.execute_with_retries(API + "get_info",
                                                {"model_id": self.model_id, "type": "get_info"})
        _require(isinstance(info, dict) and isinstance(info.get("model_data"), dict),
                 "GetInfoResponse needs model_data", info)
        return info

    def unload(self):
        """POST /api/v1/unload_model {"model_id", "type": "unload_model"} -> future (§1.4)."""
        start_time = time.time()
        untyped = self.holder.execute_with_retries(
            API + "unload_model", {"model_id": self.model_id, "type": "unload_model"},
            parse_untyped_future)
        return APIFuture(self.holder, untyped, "UnloadModel", parse_unload_model_response, start_time)


# ---- service client (§1.2) ------------------------------------------------------------

def _version_tuple(v):
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


class ServiceClient:
    """The SDK's ServiceClient: bootstrap (§1.2) and model creation (§1.4).

    Construction does, in order:
      1. POST /api/v1/client/config {"sdk_version"} -- any error (404 included)
         is fatal and raised.  The answer, with CLIENT_CONFIG_DEFAULTS for
         missing fields and then `client_config_overrides` applied, is
         `client_config`.
      2. POST /api/v1/create_session {"tags": [], "user_metadata": {},
         "sdk_version", "type": "create_session"} (+project_id); session_id must
         be a string; info/warning/error_message are logged and kept in
         `session_messages` (dict) and `warnings` (list of warning messages).
      3. starts the heartbeat thread: POST /api/v1/session_heartbeat
         {"session_id", "type": "session_heartbeat"} every `heartbeat_interval`
         s (first one after one interval), no HTTP-layer retries, 10 s timeout;
         failures are only logged and counted (counters["heartbeat_failed"]).
      4. POST /api/v1/telemetry with one SESSION_START event batch; the answer
         must be {"status": "accepted"} (else ProtocolError when
         require_telemetry, else a warning and telemetry_accepted=False).

    Parameters beyond the brief's three:
      heartbeat_interval  seconds between heartbeats (SDK: 10)
      backoff_base, backoff_max, max_retries, timeout
                          HTTP layer (§1.1: 0.5 s, 10 s, 10, 60 s); tests use e.g. 0.05
      outer_backoff_unit  scale of execute_with_retries' and retrieve's
                          connection-error backoff min(2**n, 30) (SDK: 1 s)
      outer_max_wait      execute_with_retries gives up after this (SDK: 300 s)
      client_config_overrides  dict applied over the server's client/config,
                          e.g. {"fwdbwd_max_chunk_len": 2, "parallel_fwdbwd_chunks": False}
      honor_server_chunk_limits  if False, use 1024 / 5,000,000 whatever the server
                          says (what ≤0.24 really does, §3); default True
      allow_metadata_only the retrieve_future flag (default False)
      accept_proto        send "Accept: application/x-protobuf, application/json"
                          when polling ForwardBackward/Forward futures, as SDKs
                          >= 0.18.1 do (§0); None (default) = by sdk_version
    sdk_version >= "0.25" (§0, §1.6): forward_backward and forward are POSTed as
      protobuf (proto_write_fwdbwd is not read), chunks are sized by 0.25's
      estimate, and a ForwardBackwardOutput that comes back as JSON raises
      ProtocolError (attributes proto_fwdbwd, proto_results_only).
      retrieve_timeout    client timeout of one retrieve_future call (45 s)
      require_telemetry   see step 4
      keep_alive          reuse HTTP connections (httpx does)
    Attributes: client_config, session_id, session_messages, warnings, http
    (the HttpClient), stats / http_log (its counters), counters (future-level
    events: try_again, retrieve_<status>, result_json, result_proto,
    outer_retry, heartbeat_ok, heartbeat_failed, ...).
    """

    def __init__(self, base_url, api_key=None, sdk_version="0.24.1", fault=None, *,
                 heartbeat_interval=HEARTBEAT_PERIOD, backoff_base=INITIAL_RETRY_DELAY,
                 backoff_max=MAX_RETRY_DELAY, max_retries=DEFAULT_MAX_RETRIES,
                 timeout=DEFAULT_TIMEOUT, outer_backoff_unit=1.0, outer_max_wait=OUTER_MAX_WAIT,
                 client_config_overrides=None, honor_server_chunk_limits=True,
                 allow_metadata_only=False, accept_proto=None, retrieve_timeout=RETRIEVE_TIMEOUT,
                 require_telemetry=True, keep_alive=True, tags=None, user_metadata=None,
                 project_id=None):
        if api_key is None:  # as the SDK: TINKER_API_KEY (a server with --api-key-file checks it)
            api_key = os.environ.get("TINKER_API_KEY", "tml-test")
        if not (api_key.startswith("tml-") or api_key.startswith("eyJ")):
            raise ValueError("the SDK refuses API keys that do not start with 'tml-' (§1.1)")
        self.base_url = base_url
        self.sdk_version = sdk_version
        self.http = HttpClient(base_url, api_key, sdk_version, fault=fault, max_retries=max_retries,
                               backoff_base=backoff_base, backoff_max=backoff_max, timeout=timeout,
                               keep_alive=keep_alive)
        self.outer_backoff_unit = outer_backoff_unit
        self.outer_max_wait = outer_max_wait
        self.allow_metadata_only = allow_metadata_only
        self.accept_proto = (_version_tuple(sdk_version) >= (0, 18, 1)
                             if accept_proto is None else accept_proto)
        self.proto_fwdbwd = self.proto_results_only = _version_tuple(sdk_version) >= (0, 25)
        self.retrieve_timeout = retrieve_timeout
        self.heartbeat_interval = heartbeat_interval
        self.closed = False
        self.counters = {}
        self._counter_lock = threading.Lock()
        self._model_seq_lock = threading.Lock()
        self._next_model_seq_id = 0
        self._stop = threading.Event()
        self.warnings = []
        self.session_messages = {}

        # 1. client/config (§1.2): 404 (any error) is fatal.
        resp = self.http.post(API + "client/config", {"sdk_version": sdk_version})
        server_config = resp.json()
        _require(isinstance(server_config, dict), "client/config answer is not an object",
                 server_config)
        self.server_client_config = server_config
        config = dict(CLIENT_CONFIG_DEFAULTS)
        config.update({k: v for k, v in server_config.items() if v is not None})
        if not honor_server_chunk_limits:
            config["fwdbwd_max_chunk_len"] = CLIENT_CONFIG_DEFAULTS["fwdbwd_max_chunk_len"]
            config["fwdbwd_max_chunk_bytes_count"] = \
                CLIENT_CONFIG_DEFAULTS["fwdbwd_max_chunk_bytes_count"]
        config.update(client_config_overrides or {})
        for key in ("parallel_fwdbwd_chunks", "proto_write_fwdbwd"):
            _require(isinstance(config[key], bool), "client/config %s must be a bool" % key, config)
        for key in ("fwdbwd_max_chunk_len", "fwdbwd_max_chunk_bytes_count"):
            _require(isinstance(config[key], int) and not isinstance(config[key], bool)
                     and config[key] > 0, "client/config %s must be a positive int" % key, config)
        if config["proto_compress_fwdbwd"] and self.proto_fwdbwd:
            raise ProtocolError("client/config asks for zstd-compressed protobuf (proto_compress_fwdbwd); "
                                "this standard-library client cannot compress")
        if config["proto_write_fwdbwd"] and not self.proto_fwdbwd:
            logger.warning("server asks for protobuf forward_backward requests "
                           "(proto_write_fwdbwd); this client sends JSON below SDK 0.25")
        self.client_config = config

        # 2. create_session (§1.2).
        body = {"tags": list(tags or []), "user_metadata": dict(user_metadata or {}),
                "sdk_version": sdk_version, "type": "create_session"}
        if project_id is not None:
            body["project_id"] = project_id
        session = self.http.post(API + "create_session", body).json()   # HTTP-layer retries only
        _require(isinstance(session, dict) and isinstance(session.get("session_id"), str),
                 "create_session must answer a string session_id", session)
        self.session_id = session["session_id"]
        for level, key in (("info", "info_message"), ("warning", "warning_message"),
                           ("error", "error_message")):
            message = session.get(key)
            if message:
                self.session_messages[level] = message
                getattr(logger, level)("server: %s", message)
                if level == "warning":
                    self.warnings.append(message)

        # 3. heartbeat (§1.2).
        self._heartbeat_thread = threading.Thread(target=self._heartbeat, daemon=True,
                                                  name="heartbeat")
        self._heartbeat_thread.start()

        # 4. telemetry (§1.2).
        self.telemetry_accepted = self._send_telemetry(require_telemetry)

    # -- plumbing --

    @property
    def stats(self):
        return self.http.stats

    @property
    def http_log(self):
        return self.http.http_log

    def _bump(self, name, n=1):
        with self._counter_lock:
            self.counters[name] = self.counters.get(name, 0) + n

    def execute_with_retries(self, path, body, parse=None):
        """The SDK's execute_with_retries (§1.1): one HTTP-layer call; if it fails
        with a connection error or 408/409/429/5xx, make a NEW call (new
        idempotency key) after min(2**n, 30) * outer_backoff_unit s, for up to
        outer_max_wait s.  A bare 400 with an empty body counts as a connection
        error (the SDK's connection pool treats it as a bad connection).
        Returns the parsed JSON answer (checked by `parse` if given)."""
        start = time.time()
        attempt = 0
        while True:
            try:
                resp = self.http.post(path, body)
                obj = resp.json()
                return parse(obj) if parse else obj
            except (APIConnectionError, APIStatusError) as e:
                retryable = isinstance(e, APIConnectionError) or e.status in (408, 409, 429) \
                    or 500 <= e.status < 600 or (e.status == 400 and not e.body)
                elapsed = time.time() - start
                if not retryable or elapsed >= self.outer_max_wait or self.closed:
                    raise
                self._bump("outer_retry")
                wait = min(2 ** attempt, 30) * self.outer_backoff_unit
                wait = min(wait, max(0.0, self.outer_max_wait - elapsed))
                logger.warning("%s failed (%s); new call in %.2f s", path, e, wait)
                time.sleep(wait)
                attempt += 1

    def _heartbeat(self):
        while not self._stop.wait(self.heartbeat_interval):
            try:
                resp = self.http.post(API + "session_heartbeat",
                                      {"session_id": self.session_id, "type": "session_heartbeat"},
                                      max_retries=0, timeout=10)
                resp.json()
                self._bump("heartbeat_ok")
            except Exception as e:   # noqa: BLE001 - the SDK only logs
                self._bump("heartbeat_failed")
                logger.warning("session heartbeat failed: %s", e)

    def _send_telemetry(self, required):
        event = {"event": "SESSION_START", "event_id": str(uuid.uuid4()),
                 "event_name": "ServiceClient.__init__", "event_session_index": 0,
                 "severity": "INFO",
                 "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                 "event_data": {"sdk_version": self.sdk_version}}
        body = {"events": [event], "platform": platform.system().lower(),
                "sdk_version": self.sdk_version, "session_id": self.session_id}
        try:
            answer = self.http.post(API + "telemetry", body).json()
            if isinstance(answer, dict) and answer.get("status") == "accepted":
                return True
            problem = "telemetry answer is not {\"status\":\"accepted\"}: %r" % (answer,)
        except APIError as e:
            problem = "telemetry failed: %s" % e
        if required:
            raise ProtocolError(problem)
        logger.warning("%s (the SDK would re-send every second)", problem)
        return False

    # -- public --

    def create_model(self, base_model, rank=32, seed=None, train_mlp=True, train_attn=True,
                     train_unembed=True, user_metadata=None):
        """POST /api/v1/create_model {"session_id", "model_seq_id" (per-session
        counter from 0), "base_model", "lora_config": {"rank", "seed"?,
        "train_mlp", "train_attn", "train_unembed"}, "user_metadata"?,
        "type": "create_model"} (§1.4).  Returns an APIFuture (request type
        "CreateModel") whose result is {"model_id", ...}; `.model_seq_id` is set."""
        with self._model_seq_lock:
            model_seq_id = self._next_model_seq_id
            self._next_model_seq_id += 1
        lora = {"rank": rank}
        if seed is not None:
            lora["seed"] = seed
        lora.update(train_mlp=train_mlp, train_attn=train_attn, train_unembed=train_unembed)
        body = {"session_id": self.session_id, "model_seq_id": model_seq_id,
                "base_model": base_model, "lora_config": lora}
        if user_metadata is not None:
            body["user_metadata"] = user_metadata
        body["type"] = "create_model"
        start_time = time.time()
        untyped = self.execute_with_retries(API + "create_model", body, parse_untyped_future)
        fut = APIFuture(self, untyped, "CreateModel", parse_create_model_response, start_time)
        fut.model_seq_id = model_seq_id
        return fut

    def create_lora_training_client(self, base_model, rank=32, **kw):
        """create_model, then wait for the retrieve that gives model_id (§1.5);
        returns a TrainingClient."""
        fut = self.create_model(base_model, rank=rank, **kw)
        result = fut.result()
        return TrainingClient(self, fut.model_seq_id, result["model_id"])

    def get_server_capabilities(self):
        """GET /api/v1/get_server_capabilities (direct)."""
        return self.http.get(API + "get_server_capabilities").json()

    def healthz(self):
        """GET /api/v1/healthz (direct)."""
        return self.http.get(API + "healthz").json()

    def close(self):
        """Stop the heartbeat and polling; close idle connections."""
        self.closed = True
        self._stop.set()
        if self._heartbeat_thread.is_alive() and threading.current_thread() is not self._heartbeat_thread:
            self._heartbeat_thread.join(timeout=15)
        self.http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- smoke mode ---------------------------------------------------------------------

def _smoke(argv=None):
    p = argparse.ArgumentParser(description="Drive a Tinker-protocol server the way SDK 0.24 does "
                                            "(--sdk-version 0.25.0: the way 0.25 does, protobuf).")
    p.add_argument("--base-url", required=True)
    p.add_argument("--base-model", help="default: the first of get_server_capabilities, else gpt2")
    p.add_argument("--api-key", default="tml-smoke")
    p.add_argument("--sdk-version", default="0.24.1")
    p.add_argument("--chunk-len", type=int, default=2, help="client-side fwdbwd_max_chunk_len")
    p.add_argument("--serial", action="store_true", help="force parallel_fwdbwd_chunks=false")
    p.add_argument("--json-only", action="store_true", help="do not Accept protobuf results")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

    overrides = {"fwdbwd_max_chunk_len": args.chunk_len}
    if args.serial:
        overrides["parallel_fwdbwd_chunks"] = False
    failures = []
    sc = ServiceClient(args.base_url, api_key=args.api_key, sdk_version=args.sdk_version,
                       client_config_overrides=overrides,
                       accept_proto=False if args.json_only else None)
    try:
        print("client_config:", json.dumps(sc.client_config, sort_keys=True))
        print("session_id:", sc.session_id, " messages:", sc.session_messages)
        base_model = args.base_model
        if base_model is None:
            try:
                models = sc.get_server_capabilities().get("supported_models") or []
                base_model = models[0]["model_name"] if models else "gpt2"
            except APIError as e:
                print("get_server_capabilities failed (%s); using gpt2" % e)
                base_model = "gpt2"
        tc = sc.create_lora_training_client(base_model)
        print("model_id:", tc.model_id)

        rng = random.Random(args.seed)
        data = []
        for _ in range(5):
            n = rng.randint(2, 16)
            seq = [rng.randrange(256) for _ in range(n + 1)]
            data.append(datum(seq[:-1], seq[1:], [1.0] * n))
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step({"learning_rate": 1e-4})
        fb_result = fb.result(timeout=600)
        opt_result = opt.result(timeout=600)
        print("forward_backward chunks (seq_id, datums):", fb.chunks)
        print("forward_backward metrics:", json.dumps(fb_result["metrics"], sort_keys=True))
        print("loss_fn_outputs:", len(fb_result["loss_fn_outputs"]),
              "keys:", sorted(fb_result["loss_fn_outputs"][0]) if fb_result["loss_fn_outputs"] else [])
        print("optim_step:", json.dumps(opt_result, sort_keys=True))
        info = tc.get_info()
        print("get_info:", json.dumps(info, sort_keys=True))
        if len(fb_result["loss_fn_outputs"]) != len(data):
            failures.append("expected %d loss_fn_outputs, got %d"
                            % (len(data), len(fb_result["loss_fn_outputs"])))
        for i, (d, out) in enumerate(zip(data, fb_result["loss_fn_outputs"])):
            n = model_input_length(d)
            lp = out.get("logprobs")
            if lp is None or len(lp["data"]) != n:
                failures.append("datum %d: logprobs missing or not of length %d" % (i, n))
        if "loss:sum" not in fb_result["metrics"]:
            failures.append("metrics lack loss:sum")
        print("sent order (seq_id, path):", tc.sent)
        print("http attempts:", json.dumps(sc.stats, sort_keys=True, default=str))
        print("future counters:", json.dumps(sc.counters, sort_keys=True))
    finally:
        sc.close()
    for f in failures:
        print("FAIL: " + f)
    print("OK" if not failures else "%d failure(s)" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(_smoke())
