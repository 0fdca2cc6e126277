"""Scenario server used to check py_client.py / node_client.mjs by hand (see README.md).

Usage: python scenario_server.py PORT. Each path keeps its own request counter, so give every
run its own suffix (/sleep-409-200/py1, /sleep-409-200/node1, ...).

POST /sleep-409-200[?sleep=S&ra=N]  1st: sleep S (default 3) then 200; 2nd: 409 Retry-After N (default 2); 3rd+: 200
POST /409-noretry                  always 409 + x-should-retry: false
POST /409-ra/<N>/...               1st: 409 Retry-After N, then 200
POST /409-ms/<MS>/...              1st: 409 retry-after-ms MS, then 200
POST /409-raw/...?v=VALUE          1st: 409 Retry-After VALUE (verbatim), then 200
POST /500s                         always 500 (no Retry-After): shows the backoff
POST /text                         200 text/plain
POST /badjson                      200 application/json with a body that is not JSON
GET  /_log                         arrival log
"""
import json, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit, parse_qs

LOCK = threading.Lock()
COUNTS: dict = {}
LOG: list = []
T0 = time.monotonic()

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def send(self, status, obj, headers=(), ctype="application/json"):
        data = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
        try:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            for k, v in headers: self.send_header(k, v)
            self.end_headers(); self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
    def do_GET(self):
        self.send(200, LOG)
    def do_POST(self):
        u = urlsplit(self.path); q = {k: v[0] for k, v in parse_qs(u.query).items()}
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with LOCK:
            COUNTS[u.path] = n = COUNTS.get(u.path, 0) + 1
            LOG.append({"t": round(time.monotonic() - T0, 3), "path": u.path, "n": n,
                        "key": self.headers.get("idempotency-key"),
                        "retry_count": self.headers.get("x-stainless-retry-count"),
                        "stainless_timeout": self.headers.get("x-stainless-timeout"),
                        "body": body.decode()})
        p = u.path
        ok = {"id": "order_1", "n": n, "unexpected": {"shape": [1, 2]}}
        if p.startswith("/sleep-409-200"):
            if n == 1:
                time.sleep(float(q.get("sleep", 3))); return self.send(200, ok)
            if n == 2:
                return self.send(409, {"error": "in progress"}, [("retry-after", q.get("ra", "2"))])
            return self.send(200, ok)
        if p.startswith("/409-noretry"):
            return self.send(409, {"error": "conflict"}, [("retry-after", "1"), ("x-should-retry", "false")])
        if p.startswith("/409-ra/"):
            if n == 1: return self.send(409, {"error": "in progress"}, [("retry-after", p.split("/")[2])])
            return self.send(200, ok)
        if p.startswith("/409-ms/"):
            if n == 1: return self.send(409, {"error": "in progress"}, [("retry-after-ms", p.split("/")[2])])
            return self.send(200, ok)
        if p.startswith("/409-raw/"):
            if n == 1: return self.send(409, {"error": "in progress"}, [("retry-after", q.get("v", ""))])
            return self.send(200, ok)
        if p.startswith("/500s"):
            return self.send(500, {"error": "boom"})
        if p.startswith("/badjson"):
            return self.send(200, "not json{", ctype="application/json")
        if p.startswith("/text"):
            return self.send(200, "plain text answer", ctype="text/plain")
        self.send(404, {"error": "no scenario"})

if __name__ == "__main__":
    s = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
    s.daemon_threads = True
    s.serve_forever()
