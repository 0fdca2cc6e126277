"""From the spec to a gateway that is right the first time (issue 54), as a payments engineer
follows the README: an OpenAPI 3.0 refunds spec → `idem-lint policies` → `idem-lint envoy` → a
real Envoy. The provider's refund notification declares no security and sends no Authorization,
re-serializes its JSON between deliveries (members in another order, `500` then `500.0`): every
delivery is answered 2xx and the refund ran once. A create retried across a policy edit, applied
with `--update` (no restart), runs once. A policy file tuned by hand is kept while another one
regenerates."""

import os
import subprocess
import uuid
from pathlib import Path

import pytest

import stack
from conftest import envoy_from_yaml
from idemtest import describe, post, wait_for

IDEM_LINT = Path(os.environ.get("IDEM_LINT") or stack.REPO / "target" / "debug" / "idem-lint")

SPEC = """openapi: 3.0.3
info: { title: refunds, version: "1" }
components:
  securitySchemes:
    merchantToken: { type: http, scheme: bearer }
paths:
  /refunds:
    post:
      operationId: createRefund
      security: [{ merchantToken: [] }]
      description: |
        ### 幂等性说明
        - 是否幂等：是
        - 幂等键：Idempotency-Key（header）
        - 重复请求：409 DUPLICATE_REQUEST
        - 有效期：%(expiry)s
      parameters:
        - { name: Idempotency-Key, in: header, required: true, schema: { type: string } }
      responses:
        '200': { description: the refund }
        '400': { description: "IDEMPOTENCY_KEY_MISSING / IDEMPOTENCY_SCOPE_MISSING" }
        '409': { description: "DUPLICATE_REQUEST / REQUEST_IN_PROGRESS / IDEMPOTENCY_OUTCOME_UNKNOWN" }
        '422': { description: IDEMPOTENCY_KEY_REUSED }
  /refunds/{refund_id}/cancel:
    post:
      operationId: cancelRefund
      security: [{ merchantToken: [] }]
      description: |
        ### 幂等性说明
        - 是否幂等：是
        - 幂等键：refund_id（path）
        - 重复请求：409 DUPLICATE_REQUEST
      parameters:
        - { name: refund_id, in: path, required: true, schema: { type: string } }
      responses:
        '200': { description: cancelled }
        '400': { description: "IDEMPOTENCY_KEY_MISSING / IDEMPOTENCY_SCOPE_MISSING" }
        '409': { description: "DUPLICATE_REQUEST / REQUEST_IN_PROGRESS / IDEMPOTENCY_OUTCOME_UNKNOWN" }
        '422': { description: IDEMPOTENCY_KEY_REUSED }
  /refunds/notify:
    post:
      operationId: refundNotify
      summary: 退款结果通知
      security: []
      description: |
        ### 幂等性说明
        - 是否幂等：是
        - 幂等键：out_refund_no（body）
        - 重复请求：200 SUCCESS
      requestBody:
        content:
          application/json:
            schema:
              type: object
              properties:
                out_refund_no: { type: string }
                transaction_id: { type: string }
                amount: { type: number }
      responses:
        '200': { description: SUCCESS }
        '400': { description: IDEMPOTENCY_KEY_MISSING }
        '409': { description: "REQUEST_IN_PROGRESS / IDEMPOTENCY_OUTCOME_UNKNOWN" }
        '422': { description: IDEMPOTENCY_KEY_REUSED }
"""


# Under IDEM_ARTIFACT=native (make test's native pass) the generated bootstrap loads the native
# build (`idem-lint envoy --native`), and the same path from the spec must hold.
BUILD = ["--native", stack.NATIVE] if stack.ARTIFACT == "native" else []


def generated(r):
    """`idem-lint envoy`'s bootstrap, checked: natively it says where Envoy finds the module (the
    stack's Envoys are started with that directory as ENVOY_DYNAMIC_MODULES_SEARCH_PATH)."""
    assert r.returncode == 0, r.stderr
    if BUILD:
        assert "ENVOY_DYNAMIC_MODULES_SEARCH_PATH=%s " % stack.NATIVE.parent in r.stderr, r.stderr
    return r.stdout


def assert_runs_the_build(env):
    """The Envoy runs the build this pass tests: natively the module logs its load under
    `dynamic_modules`, and there is no Wasm VM."""
    log = env.log_text()
    loaded = [l for l in log.splitlines() if "idem: plugin" in l and "loaded" in l]
    assert loaded, env.log_tail(20)
    assert all(("[dynamic_modules]" in l) == bool(BUILD) for l in loaded), loaded


def lint(*args):
    assert IDEM_LINT.is_file(), "%s is missing: build it with `cargo build -p idem-lint`" % IDEM_LINT
    return subprocess.run([str(IDEM_LINT), *map(str, args)], capture_output=True, text=True, timeout=60)


# The generated notification policy forwards detached (its provider is answered at once), which the
# native build refuses with the reason, `idem-lint envoy --native` included
# (lint/tests/policies.rs): natively, the receiver's path below is the one from a spec.
@pytest.mark.wasm_only('forward = "detached" (the generated callback policy)')
def test_a_refunds_spec_becomes_a_gateway_that_is_right_the_first_time(workdir, upstream, tmp_path):
    spec, policies, listeners = tmp_path / "refunds.yaml", tmp_path / "policies", tmp_path / "listeners.json"
    spec.write_text(SPEC % {"expiry": "24h"})
    made = lint("policies", spec, "-o", policies)
    assert made.returncode == 0, made.stdout + made.stderr
    checked = lint(spec, "--policies", policies)
    assert checked.returncode == 0 and "no findings" in checked.stdout, checked.stdout

    envoy_args = ["envoy", policies, "--upstream", "127.0.0.1:%d" % upstream.port, "--listeners", listeners, *BUILD]

    def bootstrap(lp, ap):
        return generated(lint(*envoy_args, "--listen", lp, "--admin", ap))
    with envoy_from_yaml(workdir, "envoy-refunds", bootstrap) as env:
        assert_runs_the_build(env)
        # The provider: no Authorization, its JSON re-serialized between deliveries.
        refund = "rf-" + uuid.uuid4().hex[:10]
        deliveries = [
            '{"out_refund_no":"%s","transaction_id":"%s","amount":500}' % (refund, refund),
            '{"amount":500.0,"transaction_id":"%s","out_refund_no":"%s"}' % (refund, refund),
            '{"transaction_id":"%s","out_refund_no":"%s","amount":5e2}' % (refund, refund),
        ]
        answers = [env.request("POST", "/refunds/notify", body=d, anonymous=True,
                               headers={"content-type": "application/json"}) for d in deliveries]
        assert all(200 <= a.status < 300 for a in answers), [describe(a) for a in answers]
        assert [a.header("idempotent-replayed") for a in answers] == [None, "true", "true"], \
            [describe(a) for a in answers]
        assert upstream.calls(transaction_id=refund) == 1, "the refund notification ran once"

        # The merchant creates a refund; the spec changes; the edit is applied without a restart.
        key = "create-" + uuid.uuid4().hex[:10]
        first = post(env, "/refunds", key, auth="Bearer merchant-7")
        assert first.status == 200 and first.header("idempotent-replayed") is None, describe(first)
        # Meanwhile someone tunes the cancel policy by hand: it is theirs from now on.
        cancel = policies / "cancel-refund.toml"
        tuned = cancel.read_text().replace('name = "refund_id"', 'name = "refund_id"\nlock_ttl = "10s"')
        assert tuned != cancel.read_text()
        cancel.write_text(tuned)
        spec.write_text(SPEC % {"expiry": "48h"})
        again = lint("policies", spec, "-o", policies)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "updated   %s" % (policies / "create-refund.toml") in again.stdout, again.stdout
        assert "kept      %s" % cancel in again.stdout, again.stdout
        assert "would have changed" in again.stderr and '- lock_ttl = "10s"' in again.stderr, again.stderr
        assert cancel.read_text() == tuned
        assert 'ttl = "48h"' in (policies / "create-refund.toml").read_text()
        before = env.stats("listener_manager.").get("listener_manager.lds.update_success", 0)
        update = lint(*envoy_args, "--listen", env.listen_port, "--admin", env.admin_port, "--update")
        assert update.returncode == 0, update.stderr
        wait_for(lambda: env.stats("listener_manager.").get("listener_manager.lds.update_success", 0) > before, 10,
                 what="Envoy to load the edited policies")
        # The spec documents a repeat's answer as 409 DUPLICATE_REQUEST: that is what it gets.
        retry = post(env, "/refunds", key, auth="Bearer merchant-7")
        assert (retry.status, retry.code) == (409, "DUPLICATE_REQUEST"), describe(retry)
        assert upstream.calls(key) == 1, "the create retried across the policy edit ran once"
        counts = env.stats("idem.refund-notify.")
        assert counts.get("idem.refund-notify.replayed") == 2, counts


SENDER_SPEC = """openapi: 3.1.0
info: { title: payments (the sender), version: "1" }
paths: {}
webhooks:
  paymentSucceeded:
    post:
      description: |
        A payment succeeded.

        ### 幂等性说明
        - 幂等键：transaction_id（body）
        - 投递：至少一次（未收到 2xx 会重投，同一事件的 transaction_id 不变）
        - 有效期：%(expiry)s
      parameters:
        - { name: webhook-signature, in: header, required: true, schema: { type: string } }
      requestBody:
        content:
          application/json:
            schema: { type: object, properties: { transaction_id: { type: string }, amount: { type: number } } }
      responses: { '200': { description: received } }
"""


def test_a_senders_webhook_spec_becomes_the_receivers_gateway(workdir, upstream, tmp_path):
    """The sender documents its webhook (IDEM013 clean); its receiver generates its own gateway
    policy from that spec (`idem-lint policies --receiver`), points it at its path, and every
    redelivery — re-signed, re-serialised, one after a failure — is handled as the spec says."""
    spec, policies, listeners = tmp_path / "payments.yaml", tmp_path / "receiver", tmp_path / "listeners.json"
    spec.write_text(SENDER_SPEC % {"expiry": "2d"})
    checked = lint(spec)
    assert checked.returncode == 0 and "no findings" in checked.stdout, checked.stdout
    # The receiver's own path, which the sender's spec cannot know, given on the command line.
    made = lint("policies", "--receiver", spec, "--path", "payment-succeeded=/hooks/payments", "-o", policies)
    assert made.returncode == 0, made.stdout + made.stderr
    policy = policies / "payment-succeeded.toml"
    text = policy.read_text()
    assert 'name = "/transaction_id"' in text and 'ttl = "2d"' in text and '"/hooks/payments"' in text, text
    again = lint("policies", "--receiver", spec, "--path", "payment-succeeded=/hooks/payments", "-o", policies)
    assert again.returncode == 0 and again.stdout.startswith("unchanged "), again.stdout

    def bootstrap(lp, ap):
        return generated(lint("envoy", policies, "--upstream", "127.0.0.1:%d" % upstream.port, "--listeners",
                              listeners, "--listen", lp, "--admin", ap, *BUILD))
    with envoy_from_yaml(workdir, "envoy-receiver", bootstrap) as env:
        assert_runs_the_build(env)
        def deliver(body, signature, fail=False):
            headers = {"content-type": "application/json", "webhook-signature": signature}
            if fail:
                headers["x-demo-fail-first"] = "1"
            return env.request("POST", "/hooks/payments", body=body, anonymous=True, headers=headers)
        txn = "pay-" + uuid.uuid4().hex[:10]
        first = deliver('{"transaction_id":"%s","amount":500}' % txn, "v1,sig-a", fail=True)
        assert first.status == 500, describe(first)  # the receiver failed: the id is released
        bodies = ['{"amount":500.0,"transaction_id":"%s"}', '{"transaction_id":"%s","amount":5e2}',
                  '{"transaction_id": "%s", "amount": 500}']
        answers = [deliver(b % txn, "v1,sig-%d" % i) for i, b in enumerate(bodies)]
        assert [a.status for a in answers] == [200, 200, 200], [describe(a) for a in answers]
        assert [a.header("idempotent-replayed") for a in answers] == [None, "true", "true"], \
            [describe(a) for a in answers]
        assert upstream.calls(transaction_id=txn) == 2, "once failed, once handled, never again"
