#!/usr/bin/env python3
"""Demo upstream for idem: a tiny "business" service that counts its executions.

Stdlib only. Listens on loopback. Every request to a non-``/__`` path is one
*execution* of the business operation; the server counts executions per
``Idempotency-Key`` (or ``Repeatability-Request-ID``) header value (or ``?key=`` / ``?idempotency_key=`` query
parameter when there is no header) and per JSON body ``transaction_id``, so a
test can prove that a request ran exactly once behind the gateway.

Usage::

    python3 examples/upstream.py [--port 8080] [--host 127.0.0.1] [--verbose]
    UPSTREAM_PORT=8080 python3 examples/upstream.py

Behaviour is chosen per request by headers the client sends (Envoy forwards them):

    x-demo-delay-ms: 1500      sleep before answering (counted at arrival)
    x-demo-status: 503         answer with this status
    x-demo-body-bytes: 4096    pad the JSON answer with this many bytes
    x-demo-set-cookie: sid=1   add  Set-Cookie: sid=1  to the answer
    x-demo-fail-first: 1       the first execution for this key answers 500,
                               later ones answer normally
    x-demo-reset: 1            do the work, then drop the connection without answering
    x-demo-reset-before: 1     drop the connection before doing any work (nothing counted)
    x-demo-cut-body: 1         do the work, send 200 headers and half the body, then drop the connection
    x-demo-latin1: 1           add a Latin-1 (non-UTF-8) header: filename="r\xe9sum\xe9.pdf"
    x-demo-trailers: 1         answer chunked, with a trailer (grpc-status: 0)

Introspection (not counted as executions):

    GET  /__calls?key=K              -> {"calls": n}   executions with that key
    GET  /__calls?transaction_id=T   -> {"calls": n}   executions with that body id
    GET  /__calls?event=E            -> {"calls": n}   executions of CloudEvent E (its ce-id header)
    GET  /__calls                    -> {"total": n, "by_key": {...}, "by_transaction_id": {...}}
    GET  /__calls?lookups=K          -> {"calls": n}   lookups of key K (below)
    POST /__reset                    -> forget all counts

The system of record, as a gateway's reconcile lookup asks it (not counted as executions):

    GET  /orders/by-key/K[?delay_ms=N]  -> 200 and the answer key K's first execution gave,
                                           or 404 when key K never ran
    GET  /payments/by-transaction/T     -> the same by the JSON body's transaction_id
    GET  /orders/broken/K               -> 503 (a lookup that fails)
    GET  /events/by-id/E                -> 200 and the answer CloudEvent E's first execution gave,
                                           409 while it still runs, 404 when E never arrived
    GET  /events/by-txn/T               -> the same by the JSON body's transaction_id
    GET  /__health                   -> {"ok": true}

Answers are JSON such as ``{"order_id": "ord-7", "key": "K", "n": 1, ...}`` where
``n`` is the call number for this key, so a replayed answer is recognisable
(it carries the ``n`` of the first execution). ``/api/pay/callback`` answers
``{"code": "SUCCESS", ...}`` like a payment-callback endpoint would.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.total = 0
        self.by_key = {}
        self.by_txn = {}
        self.by_event = {}
        self.answers = {}
        self.lookups = {}
        # Executions that arrived and have not answered yet ("event:E", "txn:T").
        self.running = {}

    def record(self, key, txn, event=None):
        with self.lock:
            self.total += 1
            if event is not None:
                self.by_event[event] = self.by_event.get(event, 0) + 1
            n_key = n_txn = None
            if key is not None:
                n_key = self.by_key.get(key, 0) + 1
                self.by_key[key] = n_key
            if txn is not None:
                n_txn = self.by_txn.get(txn, 0) + 1
                self.by_txn[txn] = n_txn
            return self.total, n_key, n_txn


COUNTS = Counts()


def _int_header(headers, name, default=0):
    value = headers.get(name)
    if value is None:
        return default
    try:
        return int(value.strip())
    except ValueError:
        return default


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "idem-demo-upstream/1"
    verbose = False

    def log_message(self, fmt, *args):  # quiet unless --verbose
        if self.verbose:
            sys.stderr.write("upstream: " + (fmt % args) + "\n")

    # -- helpers -----------------------------------------------------------
    def _read_body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # trailers until empty line
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = _int_header(self.headers, "content-length", 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_json(self, status, obj, extra_headers=()):
        body = json.dumps(obj, separators=(",", ":")).encode()
        if status in (204, 304):
            body = b""  # header-only answers
        try:
            self.send_response(status)
            if body:
                self.send_header("content-type", "application/json")
            if status not in (204, 304):
                self.send_header("content-length", str(len(body)))
            for name, value in extra_headers:
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The gateway gave up on us (timeout / client gone). The work was done anyway.
            self.close_connection = True

    # -- dispatch ------------------------------------------------------------
    def _handle(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        body = self._read_body()
        if url.path == "/__health":
            return self._send_json(200, {"ok": True})
        if url.path == "/__calls":
            with COUNTS.lock:
                if "key" in query:
                    return self._send_json(200, {"calls": COUNTS.by_key.get(query["key"][0], 0)})
                if "lookups" in query:
                    return self._send_json(200, {"calls": COUNTS.lookups.get(query["lookups"][0], 0)})
                if "transaction_id" in query:
                    return self._send_json(200, {"calls": COUNTS.by_txn.get(query["transaction_id"][0], 0)})
                if "event" in query:
                    return self._send_json(200, {"calls": COUNTS.by_event.get(query["event"][0], 0)})
                return self._send_json(200, {"total": COUNTS.total, "by_key": dict(COUNTS.by_key),
                                             "by_transaction_id": dict(COUNTS.by_txn)})
        if url.path.startswith(("/orders/by-key/", "/orders/broken/", "/payments/by-transaction/", "/events/by-")):
            return self._lookup(url, query)
        if url.path == "/__reset":
            with COUNTS.lock:
                COUNTS.reset()
            return self._send_json(200, {"reset": True})
        return self._business(url, query, body)

    def _drop_connection(self):
        """Closes the connection without an answer (the gateway sees a reset)."""
        self.close_connection = True
        try:
            self.connection.shutdown(2)
        except OSError:
            pass

    def _lookup(self, url, query):
        raw = url.path.split("/", 3)[3]
        if "/" in raw or raw in ("", ".", ".."):
            # A key must arrive as one path segment: a gateway that let it through unencoded would
            # ask about another resource.
            return self._send_json(400, {"error": "the key is not one path segment", "path": url.path})
        key = unquote(raw)
        if url.path.startswith(("/payments/", "/events/by-txn/")):
            key = "txn:" + key
        elif url.path.startswith("/events/by-id/"):
            key = "event:" + key
        with COUNTS.lock:
            COUNTS.lookups[key] = COUNTS.lookups.get(key, 0) + 1
            found = COUNTS.answers.get(key)
            running = COUNTS.running.get(key, 0) > 0
        delay_ms = int(query.get("delay_ms", ["0"])[0])
        if delay_ms > 0:
            time.sleep(delay_ms / 1000.0)
        if url.path.startswith("/orders/broken/"):
            return self._send_json(503, {"error": "the order service is down (demo)"})
        if found is None and running and url.path.startswith("/events/"):
            return self._send_json(409, {"status": "running", "key": key})
        if found is None:
            return self._send_json(404, {"error": "no order for this key", "key": key})
        return self._send_json(200, found)

    def _business(self, url, query, body):
        # Azure's SDKs (OASIS Repeatable Requests) name the request by Repeatability-Request-ID.
        key = self.headers.get("idempotency-key") or self.headers.get("repeatability-request-id")
        if key is None:
            for name in ("key", "idempotency_key"):
                if name in query:
                    key = query[name][0]
                    break
        if self.headers.get("x-demo-reset-before"):
            return self._drop_connection()
        txn = None
        payload = None
        if body:
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
        if isinstance(payload, dict) and isinstance(payload.get("transaction_id"), (str, int)):
            txn = str(payload["transaction_id"])
        event = self.headers.get("ce-id")
        total, n_key, n_txn = COUNTS.record(key, txn, event)
        n = n_key if n_key is not None else (n_txn if n_txn is not None else total)
        # What a lookup answers 409 for while this execution runs.
        marks = ["event:" + event] if event is not None else []
        marks += ["txn:" + txn] if txn is not None else []
        with COUNTS.lock:
            for m in marks:
                COUNTS.running[m] = COUNTS.running.get(m, 0) + 1
        try:
            return self._execute(url, key, txn, event, total, n, body)
        finally:
            with COUNTS.lock:
                for m in marks:
                    COUNTS.running[m] -= 1

    def _execute(self, url, key, txn, event, total, n, body):
        delay_ms = _int_header(self.headers, "x-demo-delay-ms", 0)
        if delay_ms > 0:
            time.sleep(delay_ms / 1000.0)

        if self.headers.get("x-demo-reset"):
            if key is not None:
                with COUNTS.lock:  # the work is done: the system of record has the order
                    COUNTS.answers.setdefault(key, {"order_id": "ord-%d" % total, "key": key, "n": n,
                                                    "path": url.path})
            return self._drop_connection()

        # A created room is 201, as Azure's Rooms service answers (its client accepts nothing else).
        status = _int_header(self.headers, "x-demo-status", 201 if url.path == "/rooms" else 200)
        if self.headers.get("x-demo-fail-first") and n == 1:
            status = 500
        answer = {
            "order_id": "ord-%d" % total,
            "key": key,
            "n": n,
            "method": self.command,
            "path": url.path,
            "authorization": self.headers.get("authorization"),
            "body_bytes": len(body),
            "at": time.time(),
        }
        if txn is not None:
            answer["transaction_id"] = txn
        if url.path == "/rooms":
            # What Azure's Rooms client reads from a created room (CommunicationRoom).
            answer.update(id=answer["order_id"], createdAt="2026-12-06T00:00:00Z", validFrom="2026-12-06T00:00:00Z",
                          validUntil="2027-01-06T00:00:00Z", pstnDialOutEnabled=False)
        if url.path.endswith("/pay/callback"):
            answer = dict(code="SUCCESS", message="OK", **answer)
        if status >= 500:
            answer["error"] = "upstream failure (demo)"
        pad = _int_header(self.headers, "x-demo-body-bytes", 0)
        if pad > 0:
            answer["padding"] = "x" * pad
        if event is not None:
            answer["event"] = event
        if status < 300:
            with COUNTS.lock:
                if key is not None:
                    COUNTS.answers.setdefault(key, answer)
                if txn is not None:
                    COUNTS.answers.setdefault("txn:" + txn, answer)
                if event is not None:
                    COUNTS.answers.setdefault("event:" + event, answer)
        extra = [("x-order-id", answer["order_id"]), ("cache-control", "no-store")]
        cookie = self.headers.get("x-demo-set-cookie")
        if cookie:
            extra.append(("set-cookie", cookie))
        if self.headers.get("x-demo-latin1"):
            # http.server writes header values as Latin-1: these are the bytes r\xe9sum\xe9.
            extra.append(("content-disposition", 'attachment; filename="r\u00e9sum\u00e9.pdf"'))
        if self.headers.get("x-demo-trailers"):
            return self._send_chunked_with_trailer(status, answer, extra)
        if self.headers.get("x-demo-cut-body"):
            return self._send_cut(status, answer)
        self._send_json(status, answer, extra)

    def _send_cut(self, status, obj):
        """The headers promise the whole answer; half of it is sent, then the connection drops."""
        body = json.dumps(obj, separators=(",", ":")).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self._drop_connection()

    def _send_chunked_with_trailer(self, status, obj, extra_headers):
        body = json.dumps(obj, separators=(",", ":")).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("trailer", "grpc-status")
            for name, value in extra_headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n0\r\ngrpc-status: 0\r\n\r\n" % (len(body), body))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default=os.environ.get("UPSTREAM_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("UPSTREAM_PORT", "8080")))
    parser.add_argument("port_positional", nargs="?", type=int, help="port (same as --port)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    port = args.port_positional or args.port
    Handler.verbose = args.verbose
    server = Server((args.host, port), Handler)
    print("demo upstream listening on http://%s:%d" % (args.host, server.server_address[1]), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
