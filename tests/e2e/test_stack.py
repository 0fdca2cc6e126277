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

