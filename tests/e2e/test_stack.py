"""The test harness' own helpers, where a mistake would make other tests pass for the wrong reason."""

import pytest

import stack

POLICY = """
[[route]]
name = "orders"
match = { method = "POST", path = "/o/{id}/pay" }

[[route]]
name = "create"
match = { method = "POST", path = "/o/create" }

[[route]]
name = "form"
match = { method = "POST", path = "/f/submit" }
mode = "token"

[route.token]
issue_path = "/f/token"

[[route]]
name = "by-name"
"""


def test_envoy_routes_come_from_the_policy_exact_paths_before_prefixes():
    routes = stack.routes_from_policy(POLICY, envoy={"by-name": {"match": {"path": "/n"}}, "create": {"timeout": "1s"}},
                                      after=[{"name": "rest", "match": {"prefix": "/"}, "idem": False}])
    assert [(r["name"], r["match"]) for r in routes] == [
        ("create", {"path": "/o/create"}),
        ("form", {"path": "/f/submit"}),
        ("form-issue", {"path": "/f/token"}),
        ("by-name", {"path": "/n"}),
        # A template is reached through its prefix, after every exact path it could shadow.
        ("orders", {"prefix": "/o/"}),
        ("rest", {"prefix": "/"}),
    ]
    assert all(r["idem"] for r in routes[:-1]) and routes[-1]["idem"] is False
    assert [r.get("timeout") for r in routes[:2]] == ["1s", None]


def test_a_policy_route_envoy_cannot_reach_is_an_error_not_a_missing_route():
    with pytest.raises(ValueError, match="by-name"):
        stack.routes_from_policy(POLICY)
    with pytest.raises(ValueError, match="typo"):
        stack.routes_from_policy(POLICY, envoy={"by-name": {"match": {"path": "/n"}}, "typo": {"timeout": "1s"}})


def test_a_held_request_needs_a_body_byte_to_hold_back():
    """`request(hold=…)` holds a body's last byte: with no body a barrier waiting in `hold` would
    wait for ever, so it is refused before anything is sent (port 9 is never connected to)."""
    from stack import http
    for body in (None, b"", ""):
        with pytest.raises(ValueError, match="needs a body"):
            http.request(9, "POST", "/", body=body, hold=lambda: None)


def test_a_frozen_webdis_answers_nothing_even_on_a_kept_connection(own_redis_stack):
    """`idemtest.freeze` returns once every thread is stopped. A bare `kill(SIGSTOP)` returns with
    the signal pending, and Webdis' thread that owns a kept connection still answered on it in
    10 to 13 of these 40 tries (tests then saw a claim answered that they thought frozen out)."""
    import base64
    import http.client
    from idemtest import freeze, thaw
    pid = own_redis_stack.webdis.proc.pid
    auth = {"authorization": "Basic " + base64.b64encode(stack.WEBDIS_AUTH.encode()).decode()}
    answered_frozen = 0
    for _ in range(40):
        conn = http.client.HTTPConnection("127.0.0.1", own_redis_stack.webdis.port, timeout=2)
        conn.request("POST", "/", body=b"SET/frozen-probe/1", headers=auth)  # a command our ACL allows
        first = conn.getresponse()
        assert first.status == 200 and b"SET" in first.read()  # the connection is kept, as Envoy's is
        conn.timeout = 0.05
        conn.sock.settimeout(0.05)
        freeze(pid)
        try:
            conn.request("POST", "/", body=b"SET/frozen-probe/2", headers=auth)
            conn.getresponse().read()
            answered_frozen += 1
        except OSError:
            pass
        finally:
            thaw(pid)
            conn.close()
    assert answered_frozen == 0
