"""Azure's Repeatable Requests (OASIS) through real Envoy, with a real Azure SDK client.

The client is azure-communication-rooms 1.2.0 from PyPI: `RoomsClient.create_room` puts a
`Repeatability-Request-ID` (a uuid1) and a `Repeatability-First-Sent` on the request itself, and
azure-core's RetryPolicy sends the same request again, headers unchanged, on 500/503/504 (for a
POST; a timed-out POST is retried only when the caller adds POST to `retry_on_methods`). The
caller authenticates with a bearer token (an Entra ID credential), the gateway scopes keys on it.

- the service fails once (500): the SDK's retry runs it, its answer says `accepted`, and a
  later repeat of the same request gets that answer replayed, never a third execution;
- the service does the work and its connection dies (Envoy answers 503): the SDK's retry meets
  the unknown outcome and gets 409 `rejected`: one execution, a clear error;
- the service is slower than the SDK's timeout, on a detached route: the retry gets the first
  execution's answer: one execution;
- a First-Sent outside the window or a pair half sent never reaches the service (412 / 400).

Both stores for the first two; the echo of every answer is read from the wire.
"""

import email.utils
import time
import urllib.parse
import uuid

import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import HttpResponseError
from azure.communication.rooms import RoomsClient

import stack
from idemtest import counters, describe, wait_for

PREFIX = "idem-rr-%s:" % uuid.uuid4().hex[:6]


def policy(store, forward="inline"):
    head = stack.redis_table(timeout="1s", prefix=PREFIX) if store == "redis" else ""
    return head + """
[[route]]
name = "rooms-create"
match = {{ method = "POST", path = "/rooms" }}
store = "{store}"
forward = "{forward}"

[route.key]
protocol = "repeatable-requests"
ttl = "10m"
scope = ["header:authorization"]
on_in_flight = "wait"
wait_timeout = "5s"
unknown_outcome_hold = "1h"
""".format(store=store, forward=forward)


ROUTES = stack.routes_from_policy(policy("shared"), after=[{"name": "passthrough", "match": {"prefix": "/"},
                                                             "idem": False}])


@pytest.fixture(params=["shared", "redis"])
def gateway(request, make_gateway):
    return make_gateway(request.param, policy(request.param), ROUTES)


class Token:
    """An Entra ID credential as azure-core uses it: one bearer token, kept across retries."""

    def __init__(self, token):
        self.token = token

    def get_token(self, *scopes, **kwargs):
        return AccessToken(self.token, int(time.time()) + 3600)


def rooms(env, token, **kw):
    # A fast backoff: the retry comes at once, as the first retry of azure-core does anyway.
    return RoomsClient("http://127.0.0.1:%d" % env.listen_port, Token(token), retry_backoff_factor=0.1, **kw)


class Wire:
    """azure-core's raw_response_hook: every attempt's status, Repeatability-Result and replay
    mark, and the request as it was sent (to send it again by hand)."""

    def __init__(self):
        self.attempts = []
        self.request_ids = set()
        self.sent = None

    def __call__(self, response):
        http, req = response.http_response, response.http_request
        self.request_ids.add(req.headers.get("Repeatability-Request-ID"))
        self.attempts.append((http.status_code, http.headers.get("repeatability-result"),
                              http.headers.get("idempotent-replayed")))
        url = urllib.parse.urlsplit(req.url)
        names = ("Repeatability-Request-ID", "Repeatability-First-Sent", "Authorization", "Content-Type")
        self.sent = (url.path + "?" + url.query, {n: req.headers[n] for n in names}, req.body)

    def send_again(self, env, **changed):
        """The last request again, by hand, with some headers changed."""
        path, headers, body = self.sent
        return env.request("POST", path, headers=dict(headers, **changed), body=body, timeout=10)


def create(env, token, wire, demo=None, **per_call):
    # `headers` reach the wire beside the SDK's own (create_room adds the repeatability pair);
    # azure-core takes its retry and transport options per call too.
    return rooms(env, token).create_room(enforce_https=False, headers=dict(demo or {}), raw_response_hook=wire,
                                         **per_call)


def executions(upstream, request_id):
    return upstream.calls(key=request_id)


def http_date(offset_s=0):
    return email.utils.formatdate(time.time() + offset_s, usegmt=True)


def caller():
    return "tenant-%s" % uuid.uuid4().hex[:8]


def test_a_failed_first_attempt_runs_again_and_a_later_repeat_is_replayed_accepted(gateway, upstream):
    wire = Wire()
    room = create(gateway, caller(), wire, demo={"x-demo-fail-first": "1"})
    (request_id,) = wire.request_ids
    assert [a[0] for a in wire.attempts] == [500, 201], wire.attempts
    assert wire.attempts[-1][1:] == ("accepted", None), "the first execution's own answer: %s" % wire.attempts
    assert executions(upstream, request_id) == 2, "the 500 released the id; the SDK's retry ran it once"
    # The same request again (a process that restarted and sent it again): the answer, replayed.
    again = wire.send_again(gateway)
    assert again.status == 201 and again.header("repeatability-result") == "accepted", describe(again)
    assert again.header("idempotent-replayed") == "true" and again.json()["id"] == room.id, describe(again)
    assert executions(upstream, request_id) == 2
    # Another caller with the same id is another request: its own execution, never this answer.
    other = wire.send_again(gateway, Authorization="Bearer " + caller())
    assert other.status == 201 and other.header("idempotent-replayed") is None, describe(other)
    assert other.json()["id"] != room.id and executions(upstream, request_id) == 3


def test_work_done_then_a_503_gets_the_sdk_retry_a_409_rejected_and_runs_once(gateway, upstream):
    wire = Wire()
    with pytest.raises(HttpResponseError) as raised:
        create(gateway, caller(), wire, demo={"x-demo-reset": "1"})
    (request_id,) = wire.request_ids
    statuses = [a[0] for a in wire.attempts]
    # Envoy's 503 (the service's connection died after the work), then the SDK's retries of it.
    assert statuses[0] == 503 and statuses[-1] == 409 and raised.value.status_code == 409, wire.attempts
    # Envoy's own 503 is left unmarked (the service's answer was lost, nobody accepted anything);
    # the gateway's refusal says rejected.
    assert wire.attempts[0][1] is None and wire.attempts[-1][1] == "rejected", wire.attempts
    assert "IDEMPOTENCY_OUTCOME_UNKNOWN" in str(raised.value), raised.value
    assert executions(upstream, request_id) == 1, "the business ran twice: %s" % wire.attempts


@pytest.fixture
def detached_gateway(make_envoy):
    return make_envoy(policy("shared", forward="detached"), ROUTES)


@pytest.mark.wasm_only("forward = \"detached\"")
def test_a_service_slower_than_the_sdk_timeout_runs_once_and_the_retry_gets_its_answer(detached_gateway, upstream):
    wire = Wire()
    # azure-core retries a POST that timed out only when asked to: the repeatability headers are
    # what makes that safe, and behind this route it is.
    room = create(detached_gateway, caller(), wire, demo={"x-demo-delay-ms": "1500"}, read_timeout=1,
                  retry_on_methods=["POST"])
    (request_id,) = wire.request_ids
    assert wire.attempts[-1] == (201, "accepted", "true"), "the retry got the first execution's answer: %s" % (
        wire.attempts,)
    assert room.id and executions(upstream, request_id) == 1
    time.sleep(2.0)  # a second execution would have started by now
    assert executions(upstream, request_id) == 1


def test_a_first_sent_outside_the_window_or_half_a_pair_never_reaches_the_service(make_envoy, upstream):
    env = make_envoy(policy("shared"), ROUTES)
    request_id = str(uuid.uuid4())
    base = {"Repeatability-Request-ID": request_id, "Authorization": "Bearer " + caller()}
    cases = [
        (dict(base, **{"Repeatability-First-Sent": http_date(-11 * 60)}), 412, "REPEATABILITY_FIRST_SENT_OUTSIDE_WINDOW"),
        (dict(base, **{"Repeatability-First-Sent": http_date(10 * 60)}), 412, "REPEATABILITY_FIRST_SENT_OUTSIDE_WINDOW"),
        (base, 400, "IDEMPOTENCY_KEY_INVALID"),
        (dict(base, **{"Repeatability-First-Sent": "yesterday"}), 400, "IDEMPOTENCY_KEY_INVALID"),
    ]
    for headers, status, code in cases:
        r = env.request("POST", "/rooms", headers=headers, body=b"{}")
        assert (r.status, r.code) == (status, code), describe(r)
        assert r.header("repeatability-result") == "rejected", describe(r)
    assert executions(upstream, request_id) == 0
    # Without either header it is an ordinary request: forwarded, nothing remembered or marked.
    for _ in range(2):
        r = env.request("POST", "/rooms", headers={"Authorization": base["Authorization"]}, body=b"{}")
        assert r.status == 201 and r.header("repeatability-result") is None, describe(r)
    wait_for(lambda: counters(env, "rooms-create").get("no_key") == 2, 5, what="two requests counted no_key")
