"""Detached forwarding keeps the route's contract: through the internal listener it re-enters
(`[detached] via = "reentry"`, the default; scripts/stack/envoy_config.py builds it as the README's
deploy section says), a detached request reaches the service exactly as the inline one does —
prefix_rewrite, regex_rewrite, host_rewrite_literal, the route's request_headers_to_add/remove, a
header-mutation filter after idem — and `x-envoy-internal` reaches it on neither path. Also: an
answer whose body was cut is an unknown outcome on Redis too, never a tombstone.
"""

import http.client
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import stack
from conftest import new_key
from idemtest import assert_outcome_unknown, assert_replay_of, describe, post, wait_for

HEADER_MUTATION = {
    "name": "envoy.filters.http.header_mutation",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
        "mutations": {"request_mutations": [
            {"append": {"header": {"key": "x-mutated", "value": "by-filter"}}},
            {"remove": "x-strip-me"},
        ]},
    },
}

ROUTES = [
    {"name": "prefix", "match": {"prefix": "/de/"}, "idem": True,
     "route_options": {"prefix_rewrite": "/svc/", "host_rewrite_literal": "svc.internal"},
     "request_headers_to_add": [{"header": {"key": "x-route-added", "value": "yes"}}],
     "request_headers_to_remove": ["x-user-role"]},
    {"name": "regex", "match": {"prefix": "/re/"}, "idem": True,
     "route_options": {"regex_rewrite": {"pattern": {"regex": "^/re/(.*)$"}, "substitution": "/svc/regex/\\1"}}},
]


def policy(forward):
    return """
[[route]]
name = "prefix"
match = {{ method = "POST", path = "/de/order" }}
forward = "{f}"

[[route]]
name = "regex"
match = {{ method = "POST", path = "/re/{{anything}}" }}
forward = "{f}"
""".format(f=forward)


class Recorder:
    """An upstream that records every request it gets (method, path, headers, body)."""

    def __init__(self):
        self.seen = []
        rec = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                rec.seen.append({"method": self.command, "path": self.path, "body": body,
                                 "headers": [(k.lower(), v) for k, v in self.headers.items()]})
                out = json.dumps({"ok": True, "n": len(rec.seen)}).encode()
                self.send_response(201)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def request_with(self, marker):
        hits = [r for r in self.seen if ("x-test-id", marker) in r["headers"]]
        assert len(hits) == 1, "expected one request marked %s, got %d" % (marker, len(hits))
        return hits[0]


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.stop()


# Headers that belong to one hop and are rebuilt on the next, never the route's contract.
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def seen_as(r):
    headers = sorted((n, v) for n, v in r["headers"] if n not in HOP)
    return {"method": r["method"], "path": r["path"], "headers": headers, "body": r["body"]}


@pytest.mark.parametrize("path", ["/de/order?x=1&y=2", "/re/pay?q=z"])
def test_a_detached_request_reaches_the_service_as_the_inline_one(make_envoy, recorder, path):
    inline = make_envoy(policy("inline"), ROUTES, upstream_port=recorder.port, post_filters=[HEADER_MUTATION])
    detached = make_envoy(policy("detached"), ROUTES, upstream_port=recorder.port, post_filters=[HEADER_MUTATION])
    key = new_key("contract")
    # One Host for both Envoys (their ports differ), as one client would send it to either.
    headers = {"host": "api.example.com", "x-user-role": "admin", "x-strip-me": "secret",
               "x-request-id": str(uuid.uuid4()), "x-client": "c1", "user-agent": "contract-test/1.0"}
    body = {"sku": "A1", "qty": 2, "note": "Grüße"}
    for env, marker in ((inline, "inline"), (detached, "detached")):
        r = post(env, path, key, body=body, headers=dict(headers, **{"x-test-id": marker}))
        assert r.status == 201, describe(r)
    # Each took its path: the detached one re-entered Envoy through the internal listener.
    reentered = [env.stats("cluster.idem_reentry.").get("cluster.idem_reentry.upstream_rq_total", 0)
                 for env in (inline, detached)]
    assert reentered == [0, 1], reentered
    a, b = seen_as(recorder.request_with("inline")), seen_as(recorder.request_with("detached"))
    a["headers"] = [h for h in a["headers"] if h[0] != "x-test-id"]
    b["headers"] = [h for h in b["headers"] if h[0] != "x-test-id"]
    assert a == b, "inline and detached differ:\n inline:   %s\n detached: %s" % (a, b)
    names = dict(a["headers"])
    # The route's contract, on both: rewritten path and host, added and removed headers, the
    # filter after idem ran; a header the route strips never reaches the service.
    assert a["path"].startswith("/svc/"), a
    assert "x-strip-me" not in names and names.get("x-mutated") == "by-filter", names
    assert "x-envoy-internal" not in names, names
    if path.startswith("/de/"):
        assert (names.get("host"), names.get("x-route-added")) == ("svc.internal", "yes"), names
        assert "x-user-role" not in names, names


def test_a_client_forging_envoy_internal_headers_is_protected_as_any(make_envoy, recorder):
    """There is no re-entry marker a client could send: the internal listener has no socket, and
    idem is not in its chain. A client claiming to be internal is keyed like any other."""
    env = make_envoy(policy("detached"), ROUTES, upstream_port=recorder.port)
    key = new_key("forged")
    forged = {"x-envoy-internal": "true", "x-forwarded-for": "10.0.0.1", "x-idem-reentry": "1",
              "x-test-id": "forged"}
    first = post(env, "/de/order", key, headers=forged)
    assert first.status == 201, describe(first)
    assert_replay_of(post(env, "/de/order", key, headers=dict(forged, **{"x-test-id": "forged-2"})), first)
    assert len(recorder.seen) == 1
    assert "x-envoy-internal" not in dict(recorder.seen[0]["headers"])


# ---------------------------------------------------------------- a body cut mid-way, on Redis

def test_an_answer_whose_body_was_cut_is_an_unknown_outcome_on_redis(make_fleet, redis_stack, upstream):
    prefix = "idem-cut-%s:" % uuid.uuid4().hex[:6]
    routes = [{"name": "cut", "match": {"path": "/cut"}, "idem": True}]
    bundle = stack.redis_table(prefix=prefix) + """
[[route]]
name = "cut"
match = { method = "POST", path = "/cut" }
store = "redis"
"""
    a, b = make_fleet(bundle, routes, redis_stack.webdis.port, n=2)
    key = new_key("cut")
    try:
        post(a, "/cut", key, headers={"x-demo-cut-body": "1"})
    except (OSError, http.client.HTTPException):
        pass  # the client sees the connection drop mid-body
    wait_for(lambda: "idem: unknown_outcome " in a.log_text(), 10, what="the reconciliation line")
    for env in (a, b):
        assert_outcome_unknown(post(env, "/cut", key))
    lines = [json.loads(l.split("idem: unknown_outcome ", 1)[1]) for l in a.log_text().splitlines()
             if "idem: unknown_outcome " in l]
    mine = [l for l in lines if l["key_prefix"] == key[:8] + "…"]
    assert len(mine) == 1 and mine[0]["cause"] == "body_cut" and mine[0]["store"] == "redis", lines
    assert (redis_stack.redis.command("GET", mine[0]["store_key"]) or b"").startswith(b"U|"), mine
    assert upstream.calls(key) == 1
