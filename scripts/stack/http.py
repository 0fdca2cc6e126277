"""A minimal HTTP/1.1 client on loopback (one request per connection) and free-port helpers."""

import http.client
import json
import os
import random
import socket

# The caller identity test and demo clients send: policies scope keys by `Authorization` by default.
DEFAULT_AUTH = "Bearer e2e-client"


# Listening ports come from below Linux's ephemeral range (32768-60999, where the kernel also
# picks every outgoing connection's source port: a port taken with bind(0) and released could be
# reused by a connection before Envoy binds it — "Address already in use", seen under load), and
# each pytest-xdist worker takes its own slice of it, so two workers never pick the same port.
_PORT_RANGE = (20000, 32000)
_next_port = [0]


def _port_slice():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    size = (_PORT_RANGE[1] - _PORT_RANGE[0]) // max(count, 4)
    start = _PORT_RANGE[0] + (index % max(count, 4)) * size
    return start, size


def free_port():
    """A port nobody listens on now, from this process' slice (see _PORT_RANGE)."""
    start, size = _port_slice()
    if not _next_port[0]:
        _next_port[0] = random.randrange(size)
    for _ in range(size):
        port = start + _next_port[0] % size
        _next_port[0] += 1
        if port_is_free(port):
            return port
    raise OSError("no free port in %d-%d" % (start, start + size))


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


def request(port, method, path, headers=None, body=None, timeout=10.0, hold=None):
    """One HTTP/1.1 request on a fresh connection. Returns Response; raises on socket errors/timeouts.

    `hold`: called once the headers and all of the body but its last byte are sent, before that
    byte (requests released together by a barrier there reach Envoy's filter, which acts once a
    body is whole, within a millisecond or so of each other, however loaded the machine)."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers = dict(headers or {})
        headers.setdefault("content-type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    if hold is not None and not body:
        # Nothing to hold back: a barrier waiting on `hold` would wait for ever.
        raise ValueError("request(hold=...) needs a body: its last byte is what is held back")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        # A Host the caller names replaces the connection's own.
        skip_host = any(name.lower() == "host" for name in (headers or {}))
        conn.putrequest(method, path, skip_host=skip_host, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("content-length", str(len(body)))
        if hold is not None:
            conn.endheaders(body[:-1])
            hold()
            conn.send(body[-1:])
        else:
            conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, [(k.lower(), v) for k, v in resp.getheaders()], data)
    finally:
        conn.close()
