"""Keys and answers where real senders put them, with the senders' own SDKs (tests/e2e/sdk/).

Through real Envoy on both stores, with the shipped provider policies of policies/: Alipay's
form-encoded notify signed by `alipay-sdk-python`, WeChat Pay v3's encrypted JSON from
`wechatpayv3` (re-encrypted and re-signed on every delivery), WeChat Pay v2's XML from `wechatpy`,
Stripe webhooks signed by Stripe's Node SDK and verified by its Python SDK, and Stripe's Node SDK
reading the gateway's own answers in Stripe's error envelope. Plus path keys, composite keys and
hostile input for every new key source. The merchant behind the gateway (sdk/merchant.py) checks
every notification with the provider's SDK and counts its business runs.
"""

import json
import re
import subprocess
import sys
import threading
import time
import uuid

import pytest

import stack
from conftest import new_key
from idemtest import assert_local, assert_replay_of, describe, wait_for

# The senders' shipped policies forward detached, which the native build refuses at load.
pytestmark = pytest.mark.wasm_only("forward = \"detached\" (the senders' shipped policies)")

sys.path.insert(0, str(stack.REPO / "tests" / "e2e" / "sdk"))

from merchant import Merchant  # noqa: E402

SDK_DIR = stack.REPO / "tests" / "e2e" / "sdk"
SHIPPED = ["alipay-notify", "wechatpay-v3-notify", "wechatpay-v2-notify", "stripe-webhook"]

TEST_POLICIES = """
# Stripe's API behind the gateway: the gateway's own answers in Stripe's error envelope, with
# Stripe-Should-Retry, so Stripe's SDK raises on them (and retries only what may succeed).
[[route]]
name = "charges"
match = { method = "POST", path = "/v1/charges" }

[route.key]
scope = []
fingerprint = ["method", "path", "body"]

[route.answers]
template = '{"error":{"type":"idempotency_error","code":"{{code}}","message":"{{message}}"}}'
headers = { "Stripe-Should-Retry" = "{{should_retry}}" }

# One payment per order: the order id in the path is the key, whatever the body says.
[[route]]
name = "order-pay"
match = { method = "POST", path = "/orders/{order_id}/pay" }

[route.key]
from = "path"
name = "order_id"
scope = ["header:authorization"]
fingerprint = ["method", "path"]

# Stripe's envelope on a route keyed from the JSON body: an answer whose message quotes what it
# read ("order_id") must still be JSON to the SDK (values escaped where they land).
[[route]]
name = "charges-by-body"
match = { method = "POST", path = "/v1/body-charges" }

[route.key]
from = "body"

name = "/metadata/order_id"
scope = []

[route.answers]
template = '{"error":{"type":"idempotency_error","code":"{{code}}","message":"{{message}}"}}'

# out_trade_no is unique per merchant: merchant id (path) + out_trade_no (body).
[[route]]
name = "merchant-orders"
match = { method = "POST", path = "/m/{mchid}/orders" }

[route.key]
parts = ["path:mchid", "body:/out_trade_no"]
scope = []
"""



def bundle(store, prefix):
    """The shipped provider policies plus this module's, on `store`."""
    text = "\n".join((stack.REPO / "policies" / ("%s.toml" % p)).read_text() for p in SHIPPED) + TEST_POLICIES
    if store == "shared":
        return text
    lines = []
    for line in text.splitlines():
        lines.append(line)
        if line.startswith("name = ") and lines[-2:-1] == ["[[route]]"]:
            lines.append('store = "redis"')
    return stack.redis_table(timeout="500ms", prefix=prefix) + "\n".join(lines) + "\n"


# Envoy's routes, from the policies (the providers' routes match their notify paths exactly; a
# template's routes by its prefix); a 30 s upstream timeout, as a merchant may be slow.
ROUTES = stack.routes_from_policy(bundle("shared", ""), timeout="30s")


@pytest.fixture(scope="module")
def merchant():
    m = Merchant()
    yield m
    m.stop()


PREFIX = "idem-senders-%s:" % uuid.uuid4().hex[:6]


@pytest.fixture(params=["shared", "redis"])
def gateway(request, module_gateway, merchant):
    """One gateway per store for the module: every test sends its own notifications and orders."""
    return module_gateway(request.param, bundle(request.param, PREFIX), ROUTES, upstream_port=merchant.port)


def post(env, path, body, headers=None, timeout=10.0, content_type="application/json"):
    h = {"content-type": content_type}
    h.update(headers or {})
    return env.request("POST", path, headers=h, body=body, timeout=timeout, anonymous=True)


# ------------------------------------------------------------------------------------ Alipay

ALIPAY_FORM = "application/x-www-form-urlencoded; charset=utf-8"


def test_an_alipay_notify_redelivered_with_a_new_sign_runs_once_and_every_delivery_gets_success(
        gateway, merchant):
    order = "T" + uuid.uuid4().hex[:12]
    notify_id, first_body = merchant.alipay.notify(order)
    answers = []
    bodies = [first_body]
    for delivery in range(3):
        if delivery:
            _, body = merchant.alipay.notify(order, notify_id=notify_id, delivery=delivery)
            bodies.append(body)
        answers.append(post(gateway, "/pay/alipay/notify", bodies[-1].encode(), content_type=ALIPAY_FORM))
    assert len(set(bodies)) == 3, "every delivery has its own notify_time and sign"
    for r in answers:
        assert (r.status, r.body) == (200, b"success"), describe(r)
    assert [r.header("idempotent-replayed") for r in answers] == [None, "true", "true"]
    assert merchant.calls(order) == 1
    assert merchant.rejected == 0, "every delivery was genuine (the merchant checked each signature)"


def test_an_alipay_answer_other_than_success_lets_the_next_delivery_run(gateway, merchant):
    order = "F" + uuid.uuid4().hex[:12]
    merchant.fail_first.add(order)
    notify_id, body = merchant.alipay.notify(order)
    r = post(gateway, "/pay/alipay/notify", body.encode(), content_type=ALIPAY_FORM)
    assert (r.status, r.body) == (200, b"fail"), describe(r)
    _, again = merchant.alipay.notify(order, notify_id=notify_id, delivery=1)
    r = post(gateway, "/pay/alipay/notify", again.encode(), content_type=ALIPAY_FORM)
    assert (r.status, r.body, r.header("idempotent-replayed")) == (200, b"success", None), describe(r)
    _, third = merchant.alipay.notify(order, notify_id=notify_id, delivery=2)
    r = post(gateway, "/pay/alipay/notify", third.encode(), content_type=ALIPAY_FORM)
    assert (r.body, r.header("idempotent-replayed")) == (b"success", "true"), describe(r)
    assert merchant.calls(order) == 2


def test_a_form_field_sent_twice_is_ambiguous(gateway, merchant):
    order = "D" + uuid.uuid4().hex[:12]
    _, body = merchant.alipay.notify(order)
    r = post(gateway, "/pay/alipay/notify", (body + "&notify_id=other").encode(), content_type=ALIPAY_FORM)
    j = assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")
    assert "notify_id more than once" in j["message"], describe(r)
    assert merchant.calls(order) == 0


# ------------------------------------------------------------------------- WeChat Pay API v3

def test_a_wechat_v3_notify_redelivered_while_a_slow_merchant_works_ends_in_success(gateway, merchant):
    order = "W" + uuid.uuid4().hex[:12]
    notify_id = str(uuid.uuid4())
    merchant.slow[order] = 3.0  # longer than the sender waits for the first delivery
    headers, body = merchant.wechat_v3.notify(order, notify_id)
    started = time.monotonic()
    with pytest.raises(OSError):  # WeChat gives up on the first delivery (here after 1 s)
        post(gateway, "/pay/wechat/v3/notify", body, headers=headers, timeout=1.0)
    wait_for(lambda: merchant.calls(order) == 1, 5, what="the first delivery to reach the merchant")
    # The re-delivery: re-encrypted (another nonce and ciphertext) and re-signed, while the
    # merchant still works: held until the merchant's answer exists, then given it.
    headers2, body2 = merchant.wechat_v3.notify(order, notify_id)
    assert json.loads(body2)["resource"]["ciphertext"] != json.loads(body)["resource"]["ciphertext"]
    r = post(gateway, "/pay/wechat/v3/notify", body2, headers=headers2, timeout=10.0)
    assert r.status == 200 and r.json() == {"code": "SUCCESS", "message": "成功"}, describe(r)
    assert r.header("idempotent-replayed") == "true", describe(r)
    assert time.monotonic() - started < 8
    # Later deliveries: the same SUCCESS at once.
    headers3, body3 = merchant.wechat_v3.notify(order, notify_id)
    assert_replay_of(post(gateway, "/pay/wechat/v3/notify", body3, headers=headers3), r)
    assert merchant.calls(order) == 1
    assert merchant.rejected == 0


# ------------------------------------------------------------------------- WeChat Pay API v2

def test_a_wechat_v2_refund_notify_keyed_on_its_encrypted_req_info_books_the_refund_once(gateway, merchant):
    refund_id = "50300" + uuid.uuid4().hex[:20]
    deliveries = [merchant.wechat_v2.refund_notify(refund_id, "R-" + refund_id[-8:], "4200" + refund_id[-16:])
                  for _ in range(3)]
    req_info = re.search(rb"<req_info><!\[CDATA\[(.*?)\]\]>", deliveries[0]).group(1)
    assert len(req_info) > 255, "longer than a key may be: %d bytes" % len(req_info)
    assert len({re.search(rb"<nonce_str>(.*?)</nonce_str>", d).group(1) for d in deliveries}) == 3
    answers = [post(gateway, "/pay/wechat/v2/refund-notify", d, content_type="text/xml") for d in deliveries]
    for r in answers:
        assert r.status == 200 and b"SUCCESS" in r.body, describe(r)
    assert merchant.calls(refund_id) == 1, "the refund was booked %d times" % merchant.calls(refund_id)


def test_a_wechat_v2_xml_notify_runs_once_per_merchant(gateway, merchant):
    txn = "4200" + uuid.uuid4().hex[:24]
    first = post(gateway, "/pay/wechat/v2/notify", merchant.wechat_v2.notify(txn, "O1"), content_type="text/xml")
    assert first.status == 200 and b"<return_code><![CDATA[SUCCESS]]>" in first.body, describe(first)
    again = post(gateway, "/pay/wechat/v2/notify", merchant.wechat_v2.notify(txn, "O1"), content_type="text/xml")
    assert_replay_of(again, first)
    assert merchant.calls(txn) == 1
    # The scope is the merchant id in the XML: another merchant's notification is its own.
    other = post(gateway, "/pay/wechat/v2/notify", merchant.wechat_v2.notify(txn, "O1", mch_id="10000200"),
                 content_type="text/xml")
    assert other.status == 200 and other.header("idempotent-replayed") is None, describe(other)
    assert merchant.calls(txn) == 2


def test_xml_bombs_and_entities_are_refused_never_expanded(gateway, merchant):
    txn = "4200" + uuid.uuid4().hex[:24]
    xml = merchant.wechat_v2.notify(txn, "O2").decode()
    bomb = ('<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;">]>'
            + xml.replace(txn, "&b;"))
    r = post(gateway, "/pay/wechat/v2/notify", bomb.encode(), content_type="text/xml")
    j = assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")
    assert "DTD" in j["message"], describe(r)
    external = xml.replace("<out_trade_no>", "<out_trade_no>&xxe;")
    r = post(gateway, "/pay/wechat/v2/notify", external.encode(), content_type="text/xml")
    assert "&xxe;" in assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")["message"], describe(r)
    assert merchant.calls(txn) == 0
    # The worker lives on.
    r = post(gateway, "/pay/wechat/v2/notify", xml.encode(), content_type="text/xml")
    assert r.status == 200 and b"SUCCESS" in r.body, describe(r)


# ----------------------------------------------------------------------------- Stripe webhooks

def test_a_stripe_webhook_redelivered_runs_once_and_other_data_is_refused(gateway, merchant):
    from providers import stripe_event, stripe_signature
    event = "evt_" + uuid.uuid4().hex[:24]
    payloads = [stripe_event(event, 500, pending_webhooks=n) for n in (2, 1)]
    answers = []
    for p in payloads:  # each delivery signed anew (a new t=), pending_webhooks counting down
        answers.append(post(gateway, "/webhooks/stripe", p.encode(), headers={"stripe-signature": stripe_signature(p)}))
    assert answers[0].status == 200 and answers[0].json()["id"] == event, describe(answers[0])
    assert_replay_of(answers[1], answers[0])
    assert merchant.calls(event) == 1
    other = stripe_event(event, 999)
    r = post(gateway, "/webhooks/stripe", other.encode(), headers={"stripe-signature": stripe_signature(other)})
    assert_local(r, 422, "IDEMPOTENCY_KEY_REUSED")
    assert merchant.calls(event) == 1


# ------------------------------------------------------------- Stripe's SDK reads our answers

def stripe_charge(env, key, amount, max_retries=0):
    r = subprocess.run(["node", str(SDK_DIR / "stripe_client.mjs"), "--port", str(env.listen_port), "--key", key,
                        "--amount", str(amount), "--max-retries", str(max_retries)],
                       capture_output=True, text=True, timeout=60, cwd=str(SDK_DIR))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_stripes_sdk_raises_on_the_gateways_409_and_422_in_its_envelope(gateway, merchant):
    key = new_key("stripe")
    first = stripe_charge(gateway, key, 100)
    assert first["ok"] and first["charge"]["id"].startswith("ch_"), first
    again = stripe_charge(gateway, key, 100)
    assert again["ok"] and again["charge"]["id"] == first["charge"]["id"] and again["replayed"] == "true", again
    # The same key for another charge: an error the SDK raises, not a charge without an id.
    reused = stripe_charge(gateway, key, 200)
    assert (reused["ok"], reused["status"], reused["code"]) == (False, 422, "IDEMPOTENCY_KEY_REUSED"), reused
    assert reused["rawType"] == "idempotency_error" and reused["shouldRetry"] == "false", reused
    assert merchant.calls(key) == 1
    # While the first charge of a key is still at the service: a 409 the SDK raises, marked
    # retryable; with retries on, Stripe's SDK comes back and gets the first charge.
    # The first charge is held at the service until the test lets it go: a fixed duration raced
    # the SDK's own start (a Node process, 3 s on a loaded machine), so the "busy" call could
    # arrive after the first charge had finished.
    slow_key = new_key("stripe-slow")
    release = merchant.holds[slow_key] = threading.Event()
    box = {}
    t = threading.Thread(target=lambda: box.update(first=stripe_charge(gateway, slow_key, 300)))
    t.start()
    try:
        wait_for(lambda: merchant.calls(slow_key) == 1, 10, what="the first charge to reach the service")
        busy = stripe_charge(gateway, slow_key, 300)
        assert (busy["ok"], busy["status"], busy["code"]) == (False, 409, "REQUEST_IN_PROGRESS"), busy
        assert busy["shouldRetry"] == "true", busy
        # The first charge finishes a second into the retrying call: its retries meet the 409
        # (Retry-After: 1) until the answer is stored, then get it.
        threading.Timer(1.0, release.set).start()
        retried = stripe_charge(gateway, slow_key, 300, max_retries=5)
    finally:
        release.set()
        t.join(30)
    assert box["first"]["ok"], box
    assert retried["ok"] and retried["charge"]["id"] == box["first"]["charge"]["id"], retried
    assert merchant.calls(slow_key) == 1


def test_stripes_envelope_stays_json_when_the_message_quotes_the_request(gateway):
    """A message with quotes in it (the member named twice, as the key reader quotes it) lands in
    the envelope escaped: the SDK's JSON parser reads the code and the message whole. Without the
    template's escaping the envelope is not JSON."""
    body = b'{"metadata":{"order_id":"o-1","order_id":"o-2"},"amount":100}'
    r = gateway.request("POST", "/v1/body-charges", headers={"content-type": "application/json"}, body=body)
    assert r.status == 400, describe(r)
    envelope = json.loads(r.body)["error"]
    assert envelope["code"] == "IDEMPOTENCY_KEY_INVALID", envelope
    assert '"order_id"' in envelope["message"] and "twice" in envelope["message"], envelope


def test_without_the_envelope_stripes_sdk_takes_a_422_for_a_charge(make_envoy, merchant):
    """Why the envelope matters (and that the test above can fail): our default JSON shape is a
    resolved call without a charge id to Stripe's SDK."""
    plain = TEST_POLICIES.split("[route.answers]")[0]
    env = make_envoy(plain, ROUTES, upstream_port=merchant.port)
    key = new_key("plain")
    assert stripe_charge(env, key, 100)["ok"]
    misread = stripe_charge(env, key, 200)
    assert misread["ok"] and "id" not in misread["charge"], misread
    assert misread["charge"]["code"] == "IDEMPOTENCY_KEY_REUSED", misread


# --------------------------------------------------------------------- path and composite keys

def test_an_order_is_paid_once_whatever_the_body(gateway, merchant):
    order = "A-" + uuid.uuid4().hex[:8]
    first = post(gateway, "/orders/%s/pay" % order, {"amount": 100, "channel": "alipay"},
                 headers={"authorization": "Bearer u1"})
    assert first.status == 200 and first.json()["order"] == order, describe(first)
    again = post(gateway, "/orders/%s/pay" % order, {"amount": 100, "channel": "wechat"},
                 headers={"authorization": "Bearer u1"})
    assert_replay_of(again, first)
    other = post(gateway, "/orders/%s-2/pay" % order, {"amount": 100}, headers={"authorization": "Bearer u1"})
    assert other.status == 200 and other.header("idempotent-replayed") is None, describe(other)
    assert merchant.calls("order:" + order) == 1


def test_a_composite_key_keeps_each_merchants_trade_numbers_apart(gateway, merchant):
    trade = "OT" + uuid.uuid4().hex[:10]
    a = post(gateway, "/m/1900000109/orders", {"out_trade_no": trade, "amount": 1})
    b = post(gateway, "/m/1900000110/orders", {"out_trade_no": trade, "amount": 1})
    assert (a.status, b.status) == (201, 201) and b.header("idempotent-replayed") is None, describe(b)
    assert_replay_of(post(gateway, "/m/1900000109/orders", {"out_trade_no": trade, "amount": 1}), a)
    assert merchant.calls("1900000109/" + trade) == 1 and merchant.calls("1900000110/" + trade) == 1
    # Parts whose text slides across the boundary are two keys: merchant 19000001 with trade
    # 09…, and merchant 1900000109 with trade … (joined without a separator they are one text).
    slide_a = post(gateway, "/m/19000001/orders", {"out_trade_no": "09" + trade, "amount": 1})
    slide_b = post(gateway, "/m/1900000109/orders", {"out_trade_no": trade, "amount": 1})
    assert slide_a.status == 201 and slide_a.header("idempotent-replayed") is None, describe(slide_a)
    assert slide_b.header("idempotent-replayed") == "true", "the earlier order is replayed: %s" % describe(slide_b)
    assert merchant.calls("19000001/09" + trade) == 1 and merchant.calls("1900000109/" + trade) == 1
    # %2f and %2F are one path (RFC 3986 §6.2.2.1): one key and one fingerprint, so the repeat is
    # the same order, replayed (it was one key and two fingerprints: a 422).
    lower = post(gateway, "/m/19%2f00/orders", {"out_trade_no": trade, "amount": 1})
    upper = post(gateway, "/m/19%2F00/orders", {"out_trade_no": trade, "amount": 1})
    assert lower.status == 201, describe(lower)
    assert_replay_of(upper, lower)
    assert merchant.calls("19%2f00/" + trade) == 1 and merchant.calls("19%2F00/" + trade) == 0
    # A separator smuggled into a part (percent-encoded in the path) is refused, never joined.
    r = post(gateway, "/m/1900%1F000109/orders", {"out_trade_no": trade, "amount": 1})
    j = assert_local(r, 400, "IDEMPOTENCY_KEY_INVALID")
    assert "path:mchid" in j["message"] and "control" in j["message"], describe(r)


def test_a_lowercase_http2_method_is_the_policys_method(gateway, merchant):
    """HTTP/2 lets a client send `:method: post`; frameworks run the POST handler for it.

    With a body: the replay is decided at the headers (the route's fingerprint is method + path)
    and waits for the body's end before it is sent, so curl reads it (sent at once, Envoy then
    ended the stream with RST_STREAM(NO_ERROR), which curl 7.88 reports as error 92).
    """
    order = "H2-" + uuid.uuid4().hex[:8]
    url = "http://127.0.0.1:%d/orders/%s/pay" % (gateway.listen_port, order)
    out = []
    for _ in range(2):
        r = subprocess.run(["curl", "-sS", "-i", "--http2-prior-knowledge", "-X", "post", url, "-H",
                            "authorization: Bearer u1", "-H", "content-type: application/json",
                            "--data-binary", '{"amount": 100, "note": "%s"}' % ("x" * 4096)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, "curl exit %d: %s" % (r.returncode, r.stderr)
        out.append("%s\n(curl exit %d: %s)" % (r.stdout, r.returncode, r.stderr.strip()))
    assert out[0].startswith("HTTP/2 200"), out[0]
    assert "idempotent-replayed: true" in out[1].lower(), out[1]
    assert merchant.calls("order:" + order) == 1
