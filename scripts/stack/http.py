"""A minimal HTTP/1.1 client on loopback (one request per connection) and free-port helpers."""

import http.client
import json
import socket

# The caller identity test and demo clients send: policies scope keys by `Authorization` by default.
DEFAULT_AUTH = "Bearer e2e-client"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # list of (lower-case name, value)
        self.body = body

    def header(self, name, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def header_all(self, name):
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def code(self):
        j = self.json()
        return j.get("code") if isinstance(j, dict) else None

    def __repr__(self):
        body = self.body[:300]
        return "<%d %r %r>" % (self.status, dict(self.headers), body)


def request(port, method, path, headers=None, body=None, timeout=10.0):
    """One HTTP/1.1 request on a fresh connection. Returns Response; raises on socket errors/timeouts."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers = dict(headers or {})
        headers.setdefault("content-type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        # A Host the caller names replaces the connection's own.
        skip_host = any(name.lower() == "host" for name in (headers or {}))
        conn.putrequest(method, path, skip_host=skip_host, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, [(k.lower(), v) for k, v in resp.getheaders()], data)
    finally:
        conn.close()
