#!/usr/bin/env python3
"""idem walkthrough: start the demo upstream and Envoy with examples/envoy.yaml, show what the
filter does, print its counters, stop everything.

    python3 scripts/demo.py            # the walkthrough (`make demo`); exit 1 if a step misbehaves
    python3 scripts/demo.py --serve    # keep the stack up for manual curl until Ctrl-C (`make run`)
    python3 scripts/demo.py --serve --policies DIR_OR_FILE...   # your policies instead (`make run POLICIES=…`)

Ports: 10000 (gateway), 9901 (admin), 8080 (upstream) on 127.0.0.1 -- each replaced by a free
port only when busy. Needs .venv/bin/envoy (`make setup`) and the built filter (`make build`).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack  # noqa: E402

TTY = sys.stdout.isatty()

# The token-mode part of the walkthrough. Both example configs ship the `submit-form` token route;
# a config without it gets it added (the policy of policies/submit-form.toml). The demo always
# adds `demo-short-form`, a token route whose tokens live 2 s, so the walkthrough can show an
# expired token without waiting 10 minutes.
TOKEN_ROUTES_YAML = """\
              # Token mode (added by scripts/demo.py): the filter answers POST /api/idempotent/token ...
              - name: token-issue
                match: { path: /api/idempotent/token }
                route: { cluster: demo_upstream, timeout: 15s }
                typed_per_filter_config: *idem_on
              # ... and enforces the token on the form submission (policy "submit-form").
              - name: submit-form
                match: { path: /api/form/submit }
                route: { cluster: demo_upstream, timeout: 15s }
                typed_per_filter_config: *idem_on
"""
SHORT_ROUTES_YAML = """\
              # Demo only (added by scripts/demo.py): tokens that expire after 2 s.
              - name: demo-short-token
                match: { path: /api/demo/short-token }
                route: { cluster: demo_upstream, timeout: 15s }
                typed_per_filter_config: *idem_on
              - name: demo-short-form
                match: { path: /api/demo/short-form }
                route: { cluster: demo_upstream, timeout: 15s }
                typed_per_filter_config: *idem_on
"""
SHORT_POLICY = """
[[route]]
name = "demo-short-form"
match = { method = "POST", path = "/api/demo/short-form" }
mode = "token"
store = "%s"

[route.token]
issue_path = "/api/demo/short-token"
ttl = "2s"

[route.duplicate]
status = 409
code = "DUPLICATE_REQUEST"
message = "请勿重复提交"
"""
# What `make run` prints and the README shows ("Protect your first route"), with the stack's
# addresses filled in: each line runs as printed in a shell, and its `# →` comment says what it
# prints (a status and code, `forwarded` or `replayed`, or `prints <text>`).
# tests/e2e/test_first_hour.py runs every line against the stack and checks the README's copy.
TRY_IT = """\
curl -si %(gw)s/api/order/create -H 'Authorization: Bearer alice' -H 'Idempotency-Key: order-1' -d '{"sku":"BOOK-42","qty":1}'  # → 200 forwarded
curl -si %(gw)s/api/order/create -H 'Authorization: Bearer alice' -H 'Idempotency-Key: order-1' -d '{"sku":"BOOK-42","qty":1}'  # → 200 replayed
curl -si %(gw)s/api/order/create -H 'Authorization: Bearer alice' -H 'Idempotency-Key: order-1' -d '{"sku":"BOOK-42","qty":5}'  # → 422 IDEMPOTENCY_KEY_REUSED
curl -si %(gw)s/api/order/create -H 'Authorization: Bearer bob' -H 'Idempotency-Key: order-1' -d '{"sku":"BOOK-42","qty":1}'  # → 200 forwarded (another caller)
curl -si %(gw)s/api/order/create -H 'Authorization: Bearer alice' -d '{}'  # → 400 IDEMPOTENCY_KEY_MISSING
curl -si %(gw)s/api/order/create -H 'Idempotency-Key: order-2' -d '{}'  # → 400 IDEMPOTENCY_SCOPE_MISSING
curl -s -o /dev/null %(gw)s/api/order/create -H 'Authorization: Bearer alice' -H 'Idempotency-Key: slow-1' -H 'x-demo-delay-ms: 3000' -d '{}' &
sleep 1; curl -si %(gw)s/api/order/create -H 'Authorization: Bearer alice' -H 'Idempotency-Key: slow-1' -H 'x-demo-delay-ms: 3000' -d '{}'  # → 409 REQUEST_IN_PROGRESS
curl -si %(gw)s/api/pay/callback -H 'content-type: application/json' -d '{"transaction_id":"tx-1","status":"PAID"}'  # → 200 forwarded
curl -si %(gw)s/api/pay/callback -H 'content-type: application/json' -d '{"status":"PAID","transaction_id":"tx-1"}'  # → 200 replayed
TOKEN=$(curl -s -X POST %(gw)s/api/idempotent/token -H 'Authorization: Bearer alice' | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
curl -si %(gw)s/api/form/submit -H 'Authorization: Bearer alice' -H "Idempotency-Token: $TOKEN" -d '{}'  # → 200 forwarded
curl -si %(gw)s/api/form/submit -H 'Authorization: Bearer alice' -H "Idempotency-Token: $TOKEN" -d '{}'  # → 409 DUPLICATE_REQUEST
curl -si %(gw)s/api/form/submit -H 'Authorization: Bearer alice' -H 'Idempotency-Token: made-up' -d '{}'  # → 400 IDEMPOTENCY_TOKEN_INVALID
curl -s %(admin)s/stats/prometheus | grep 'outcome="replayed"'  # → prints idem_requests_total{route="create-order",outcome="replayed"} 1
curl -s %(up)s/__calls  # → prints "total"
"""

# The addresses the README's copy shows (the demo's defaults).
README_ADDRESSES = {"gw": "localhost:10000", "admin": "localhost:9901", "up": "localhost:8080"}


def try_it(gw, admin, up):
    """TRY_IT with these addresses (host:port, no scheme)."""
    return TRY_IT % {"gw": gw, "admin": admin, "up": up}


PASSTHROUGH_MARK = "              # Everything else: no policy, the filter is not even invoked.\n"
ROUTER_MARK = "          - name: envoy.filters.http.router\n"
POLICY_INDENT = " " * 20


def with_token_routes(text, store="shared"):
    """An example Envoy config (text) with the demo's token routes and policies added: the routes
    before the ingress' catch-all, the policies at the end of its bundle (the first listener's
    router follows it; the re-entry listener has a router too)."""
    if text.count(PASSTHROUGH_MARK) != 1 or ROUTER_MARK not in text:
        raise stack.StackError("example config: expected one %r and a router" % PASSTHROUGH_MARK.strip())
    routes, policy = SHORT_ROUTES_YAML, SHORT_POLICY % store
    if "name: submit-form" not in text:
        routes = TOKEN_ROUTES_YAML + routes
        policy = "\n" + (stack.REPO / "policies" / "submit-form.toml").read_text() + policy
    text = text.replace(PASSTHROUGH_MARK, routes + PASSTHROUGH_MARK)
    block = "".join((POLICY_INDENT + line).rstrip() + "\n" for line in policy.splitlines())
    return text.replace(ROUTER_MARK, block + ROUTER_MARK, 1)


def c(code, text):
    return "\033[%sm%s\033[0m" % (code, text) if TTY else text


def bold(t):
    return c("1", t)


def dim(t):
    return c("2", t)


class Demo:
    def __init__(self, policies=None):
        # Policy files or directories to serve instead of examples/envoy.yaml: the bootstrap
        # `idem-lint envoy` writes for them (`make run POLICIES=…`).
        self.policies = policies
        self.failures = []
        self.procs = []
        self.envoys = []
        self._turn = 0
        self.workdir = stack.make_workdir("idem-demo-")

    # -- stack ---------------------------------------------------------------
    def start(self):
        stack.require_envoy()
        stack.require_wasm()
        ports = {}
        for name, default in stack.EXAMPLE_PORTS.items():
            ports[name] = default if stack.port_is_free(default) else stack.free_port()
            if ports[name] != default:
                print(dim("port %d (%s) is busy; using %d instead" % (default, name, ports[name])))
        self.upstream = stack.Upstream(self.workdir, port=ports["upstream"])
        self.procs.append(self.upstream)
        cfg = self.workdir / "envoy.yaml"
        if self.policies:
            cfg.write_text(self.policies_config(ports))
        else:
            text = with_token_routes(stack.example_config_text(ports["listen"], ports["admin"], ports["upstream"]))
            cfg.write_text(stack.as_native(text) if stack.ARTIFACT == "native" else text)
        self.envoy = stack.Envoy(cfg, self.workdir, listen_port=ports["listen"], admin_port=ports["admin"],
                                 cwd=str(stack.REPO), name="envoy-demo")
        self.procs.append(self.envoy)
        self.envoys = [self.envoy]
        self.envoy.wait_ready()
        self.gw = "http://127.0.0.1:%d" % self.envoy.listen_port
        print("%s gateway %s  admin http://127.0.0.1:%d  upstream http://127.0.0.1:%d" % (
            bold("stack up:"), self.gw, self.envoy.admin_port, self.upstream.port))
        print(dim("  envoy log: %s" % self.envoy.proc.log_path))
        if stack.ARTIFACT == "native":
            print(dim("  native build (%s): pay-callback forwards inline here, since the native build refuses "
                      "forward = \"detached\" (docs/deploy.md, \"The native build\")" % stack.NATIVE.name))

    def policies_config(self, ports, update=False):
        """`idem-lint envoy POLICIES --upstream <the demo upstream>`: what a user runs for theirs.
        `update`: rewrite only the listeners file the running Envoy watches (a policy edit,
        applied without a restart: the embedded store keeps its keys)."""
        lint = os.environ.get("IDEM_LINT") or str(stack.REPO / "target" / "debug" / "idem-lint")
        # `make run ARTIFACT=native`: the bootstrap loads the native build (the stack's Envoys are
        # given its directory as ENVOY_DYNAMIC_MODULES_SEARCH_PATH, as idem-lint says to).
        build = ["--native", str(stack.NATIVE)] if stack.ARTIFACT == "native" else ["--wasm", str(stack.WASM)]
        argv = [lint, "envoy", *self.policies, "--upstream", "127.0.0.1:%d" % ports["upstream"],
                "--listen", str(ports["listen"]), "--admin", str(ports["admin"]), *build,
                "--listeners", str(self.workdir / "idem-listeners.json")] + (["--update"] if update else [])
        done = subprocess.run(argv, capture_output=True, text=True, cwd=str(stack.REPO))
        if done.returncode != 0:
            raise stack.StackError("idem-lint envoy refused the policies:\n%s" % done.stderr.strip())
        print(dim("  envoy config from: %s" % " ".join(argv[1:])))
        self.ports = ports
        return done.stdout

    def policy_files(self):
        """The policy files served, and when each last changed."""
        out = {}
        for p in self.policies:
            path = Path(p)
            for f in sorted(path.glob("*.toml")) if path.is_dir() else [path]:
                try:
                    out[str(f)] = f.stat().st_mtime_ns
                except OSError:
                    pass
        return out

    def stop(self):
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception as e:  # keep stopping the others
                print("could not stop %s: %s" % (p, e), file=sys.stderr)
        self.procs = []

    # -- printing --------------------------------------------------------------
    def next_envoy(self):
        """The Envoy for the next request: with several (demo_redis.py), they take turns."""
        env = self.envoys[self._turn % len(self.envoys)]
        self._turn += 1
        return env

    def envoy_tag(self, env):
        return "" if len(self.envoys) < 2 else c("33", "[envoy %d] " % (self.envoys.index(env) + 1))

    def send(self, method, path, key=None, body=None, headers=None, show=True, timeout=15):
        # The caller's identity is sent, and shown: policies scope keys by Authorization.
        h = {"content-type": "application/json", "authorization": "Bearer alice"}
        if key is not None:
            h["Idempotency-Key"] = key
        h.update(headers or {})
        raw = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
        env = self.next_envoy()
        if show:
            extra = "".join("  %s: %s" % (k, v) for k, v in h.items() if k != "content-type")
            print("  %s %s%s %s%s  %s" % (c("36", "→"), self.envoy_tag(env), method, path, extra,
                                          dim(raw.decode() if raw else "")))
        r = env.request(method, path, headers=h, body=raw, timeout=timeout)
        if show:
            self.show(r)
        return r

    def show(self, r):
        j = r.json() or {}
        bits = ["%d" % r.status]
        if j.get("code"):
            bits.append("code=%s" % j["code"])
        for hname in ("idempotent-replayed", "retry-after", "x-order-id"):
            if r.header(hname):
                bits.append("%s: %s" % (hname, r.header(hname)))
        if "n" in j:
            bits.append("upstream call #%s" % j["n"])
        body = r.body.decode(errors="replace")
        print("  %s %s  %s" % (c("35", "←"), "  ".join(bits), dim(body[:160] + ("…" if len(body) > 160 else ""))))

    def check(self, ok, what):
        if ok:
            print("  %s %s" % (c("32", "✔"), what))
        else:
            print("  %s %s" % (c("31", "✘"), what))
            self.failures.append(what)
        return ok

    def step(self, n, title):
        print("\n%s %s" % (bold("%d." % n), bold(title)))

    # -- the walkthrough -----------------------------------------------------------
    def walkthrough(self):
        run = uuid.uuid4().hex[:6]
        key = "demo-%s-order-1" % run
        order = {"sku": "BOOK-42", "qty": 1}
        path = "/api/order/create"

        self.step(1, "First request: the key is claimed and the request goes upstream")
        self.first_request = (path, key, order)
        first = self.send("POST", path, key, order)
        self.check(first.status == 200 and (first.json() or {}).get("n") == 1
                   and first.header("idempotent-replayed") is None, "forwarded, upstream ran once")

        self.step(2, "Same key, same payload again: the stored answer is replayed")
        again = self.send("POST", path, key, order)
        self.check(again.status == first.status and again.body == first.body
                   and again.header("idempotent-replayed") == "true",
                   "identical status and body, with idempotent-replayed: true")
        self.check(self.upstream.calls(key) == 1, "upstream still ran once (calls=%d)" % self.upstream.calls(key))

        self.step(3, "20 concurrent duplicates of a new request (the upstream takes 800 ms)")
        ckey = "demo-%s-burst" % run
        print("  %s 20 × POST %s  authorization: Bearer alice  Idempotency-Key: %s  x-demo-delay-ms: 800%s" % (
            c("36", "→"), path, ckey, "  (alternating Envoys)" if len(self.envoys) > 1 else ""))
        barrier = threading.Barrier(20)

        def one(i):
            barrier.wait(10)
            h = {"Idempotency-Key": ckey, "x-demo-delay-ms": "800", "content-type": "application/json",
                 "authorization": "Bearer alice"}
            return self.envoys[i % len(self.envoys)].request("POST", path, headers=h, body=json.dumps(order).encode(),
                                                             timeout=30)
        with ThreadPoolExecutor(max_workers=20) as pool:
            answers = list(pool.map(one, range(20)))
        summary = Counter()
        for r in answers:
            if r.header("idempotent-replayed") == "true":
                summary["%d replayed" % r.status] += 1
            elif r.code:
                summary["%d %s" % (r.status, r.code)] += 1
            else:
                summary["%d from upstream" % r.status] += 1
        print("  %s %s" % (c("35", "←"), ", ".join("%d × %s" % (n, s) for s, n in sorted(summary.items()))))
        self.check(self.upstream.calls(ckey) == 1, "upstream executed exactly once (calls=%d)"
                   % self.upstream.calls(ckey))
        self.check(summary["200 from upstream"] == 1 and
                   summary["200 from upstream"] + summary["409 REQUEST_IN_PROGRESS"] + summary["200 replayed"] == 20,
                   "one forwarded; every other caller got 409 REQUEST_IN_PROGRESS or the replay")

        self.step(4, "Same key as step 1, different payload: the key was reused")
        r = self.send("POST", path, key, {"sku": "BOOK-42", "qty": 5})
        self.check(r.status == 422 and r.code == "IDEMPOTENCY_KEY_REUSED", "422 IDEMPOTENCY_KEY_REUSED")

        self.step(5, "No Idempotency-Key on a route that requires one")
        before = self.upstream.calls()["total"]
        r = self.send("POST", path, None, order)
        self.check(r.status == 400 and r.code == "IDEMPOTENCY_KEY_MISSING", "400 IDEMPOTENCY_KEY_MISSING")
        self.check(self.upstream.calls()["total"] == before, "nothing reached the upstream")

        self.step(6, "The upstream fails (500): the claim is released, so the client's retry runs")
        fkey = "demo-%s-flaky" % run
        r1 = self.send("POST", path, fkey, order, headers={"x-demo-fail-first": "1"})
        r2 = self.send("POST", path, fkey, order, headers={"x-demo-fail-first": "1"})
        r3 = self.send("POST", path, fkey, order, headers={"x-demo-fail-first": "1"})
        self.check(r1.status == 500, "first attempt answered 500 by the upstream")
        self.check(r2.status == 200 and r2.header("idempotent-replayed") is None, "the retry went through (200)")
        self.check(r3.header("idempotent-replayed") == "true" and r3.body == r2.body,
                   "and its success is what gets replayed")
        self.check(self.upstream.calls(fkey) == 2, "upstream ran twice: failure + retry (calls=%d)"
                   % self.upstream.calls(fkey))

        self.step(7, "Payment callback keyed by the body's transaction_id (provider retries re-serialized)")
        txn = "tx-%s" % run
        cb1 = self.send("POST", "/api/pay/callback", None, {"transaction_id": txn, "amount": 1999, "status": "PAID"})
        cb2 = self.send("POST", "/api/pay/callback", None, {"status": "PAID", "amount": 1999, "transaction_id": txn})
        self.check(cb1.status == 200 and (cb1.json() or {}).get("code") == "SUCCESS", "first callback processed")
        self.check(cb2.header("idempotent-replayed") == "true" and cb2.body == cb1.body,
                   "retry got the first SUCCESS reply replayed")

        self.token_flow(8)
        self.report()

    def token_flow(self, n):
        """Token mode: get a token, submit, double submit, expired token."""
        alice = {"authorization": "Bearer alice"}
        run = uuid.uuid4().hex[:6]
        self.step(n, "Token mode: the page asks the gateway for a single-use token")
        before = self.upstream.calls()["total"]
        t = self.send("POST", "/api/idempotent/token", headers=alice)
        token = (t.json() or {}).get("token", "")
        self.check(t.status == 200 and t.code == "TOKEN_ISSUED" and len(token) == 32,
                   "200 TOKEN_ISSUED with a 32-character token (128 random bits and a 64-bit signature)")
        self.check(self.upstream.calls()["total"] == before, "answered by the filter; the upstream never saw it")

        self.step(n + 1, "Submit the form with the token: forwarded once")
        form = {"title": "my post", "run": run}
        sub = self.send("POST", "/api/form/submit?key=form-%s" % run, body=form,
                        headers=dict(alice, **{"Idempotency-Token": token}))
        self.check(sub.status == 200 and (sub.json() or {}).get("n") == 1 and sub.header("idempotent-replayed") is None,
                   "forwarded, the upstream ran once")

        self.step(n + 2, "Double submit (the user clicks again): the token is used")
        dup = self.send("POST", "/api/form/submit?key=form-%s" % run, body=form,
                        headers=dict(alice, **{"Idempotency-Token": token}))
        j = dup.json() or {}
        self.check(dup.status == 409 and dup.code == "DUPLICATE_REQUEST" and j.get("message") == "请勿重复提交"
                   and "first_seen_at" in j, "409 DUPLICATE_REQUEST 请勿重复提交 (with first_seen_at)")
        self.check(self.upstream.calls("form-%s" % run) == 1, "the upstream still ran once (calls=%d)"
                   % self.upstream.calls("form-%s" % run))

        self.step(n + 3, "A token the gateway never issued (mistyped, made up): invalid, not a duplicate")
        bad = self.send("POST", "/api/form/submit?key=form-%s" % run, body=form,
                        headers=dict(alice, **{"Idempotency-Token": token[:-1] + ("A" if token[-1] != "A" else "B")}))
        self.check(bad.status == 400 and bad.code == "IDEMPOTENCY_TOKEN_INVALID", "400 IDEMPOTENCY_TOKEN_INVALID")

        self.step(n + 4, "An expired token (this demo route's tokens live 2 s)")
        t2 = self.send("POST", "/api/demo/short-token", headers=alice)
        short = (t2.json() or {}).get("token", "")
        self.check(t2.status == 200 and (t2.json() or {}).get("ttl_seconds") == 2, "token issued, ttl_seconds 2")
        print("  " + dim("(waiting 2.5 s)"))
        time.sleep(2.5)
        exp = self.send("POST", "/api/demo/short-form?key=short-%s" % run, body=form,
                        headers=dict(alice, **{"Idempotency-Token": short}))
        self.check(exp.status == 409 and exp.code == "DUPLICATE_REQUEST" and "first_seen_at" not in (exp.json() or {}),
                   "409 DUPLICATE_REQUEST, never used (no first_seen_at)")
        self.check(self.upstream.calls("short-%s" % run) == 0, "nothing reached the upstream")

    def restart_forgets(self):
        """The embedded store lives in the Envoy process: a restart forgets every key, and a
        client's retry after it runs again. What to do instead is printed."""
        print("\n%s %s" % (bold("Last."), bold("Envoy restarts: the embedded store forgets every key")))
        path, key, order = self.first_request
        old = self.envoy
        old.stop()
        env = stack.Envoy(old.config_path, self.workdir, listen_port=old.listen_port, admin_port=old.admin_port,
                          cwd=str(stack.REPO), name="envoy-demo")
        env.wait_ready()
        self.procs[self.procs.index(old)] = env
        self.envoys = [env]
        self.envoy = env
        again = self.send("POST", path, key, order)
        self.check(again.status == 200 and again.header("idempotent-replayed") is None
                   and self.upstream.calls(key) == 2, "step 1's request, retried after the restart, ran again")
        print("  " + dim("Apply policy edits without a restart: `idem-lint envoy … --update` (`make run POLICIES=…` "
                         "does it when you save); keys that must outlive restarts and be shared by replicas: "
                         "store = \"redis\" (`make demo-redis`)."))

    def report(self):
        for env in self.envoys:
            # As Prometheus sees them (the example's stats_tags make one labelled family).
            print("\n%s" % bold("idem counters %s(admin /stats/prometheus on :%d, non-zero):"
                                 % (self.envoy_tag(env), env.admin_port)))
            prom = env.admin("/stats/prometheus").body.decode(errors="replace")
            for line in prom.splitlines():
                # (the native build's families are prefixed by Envoy: envoy_dynamicmodulescustom_)
                family = line.removeprefix("envoy_dynamicmodulescustom_")
                if family.startswith(("idem_requests_total{", "idem_unmatched_total{")) and not line.endswith(" 0"):
                    print("  " + line)
        total = {}
        for env in self.envoys:
            for k, v in env.stats("idem.").items():
                total[k] = total.get(k, 0) + v
        self.check(total.get("idem.create-order.replayed", 0) >= 1 and total.get("idem.create-order.forwarded", 0) >= 1,
                   "key-mode counters are exported")
        self.check(total.get("idem.submit-form.token_issued", 0) >= 1 and
                   total.get("idem.submit-form.token_consumed", 0) >= 1 and
                   total.get("idem.submit-form.token_rejected", 0) >= 1, "token counters are exported")
        for env in self.envoys:
            component = "dynamic_modules" if stack.ARTIFACT == "native" else "wasm"
            print("\n%s" % bold("interception log lines %s(component %s):" % (self.envoy_tag(env), component)))
            lines = [l for l in env.log_text().splitlines() if "idem:" in l]
            for l in lines[-8:]:
                print("  " + dim(l[:200]))

    def try_it_addresses(self):
        """Gateway, admin and upstream as the try-it lines name them (README_ADDRESSES on the
        default ports)."""
        return ("localhost:%d" % self.envoy.listen_port, "localhost:%d" % self.envoy.admin_port,
                "localhost:%d" % self.upstream.port)

    def serve(self):
        if self.policies:
            print("\nYour policies on %s (the demo upstream answers every path; it counts executions per "
                  "Idempotency-Key at %s/__calls).\nCounters: curl -s localhost:%d/stats/prometheus | grep idem_"
                  % (self.gw, "http://127.0.0.1:%d" % self.upstream.port, self.envoy.admin_port))
        else:
            print("\nTry it (another terminal; each line prints what its comment says):\n")
            print(try_it(*self.try_it_addresses()))
        print("Upstream knobs (request headers): x-demo-delay-ms, x-demo-status, x-demo-fail-first, "
              "x-demo-set-cookie,\nx-demo-body-bytes.  Envoy log: %s\n\nPress Ctrl-C to stop." % self.envoy.proc.log_path)
        if self.policies:
            print("Edit a policy file: it is applied within a second, without a restart (the keys are kept).")
        seen = self.policy_files() if self.policies else {}
        while True:
            for p in self.procs:
                if not p.proc.alive():
                    raise stack.StackError("%s exited:\n%s" % (p.proc.name, p.proc.log_tail()))
            if self.policies and self.policy_files() != seen:
                seen = self.policy_files()
                try:
                    self.policies_config(self.ports, update=True)
                    print(bold("policies changed: applied (the keys are kept)"))
                except stack.StackError as e:
                    print("not applied, Envoy keeps the previous policies: %s" % e, file=sys.stderr)
            time.sleep(1.0)


def main():
    ap = argparse.ArgumentParser(description="idem walkthrough")
    ap.add_argument("--serve", action="store_true", help="keep the stack up for manual curl until Ctrl-C")
    ap.add_argument("--policies", nargs="+", metavar="DIR_OR_FILE",
                    help="with --serve: run these policies (the bootstrap `idem-lint envoy` writes) instead of "
                         "examples/envoy.yaml")
    args = ap.parse_args()
    if args.policies and not args.serve:
        ap.error("--policies goes with --serve (the walkthrough runs the shipped policies)")

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)  # also when started in the background (SIGINT ignored there)

    demo = Demo(policies=args.policies)
    try:
        demo.start()
        if args.serve:
            demo.serve()
        else:
            demo.walkthrough()
            demo.restart_forgets()
    except KeyboardInterrupt:
        print("\nstopping")
        return 0 if args.serve else 130
    except stack.StackError as e:
        print("\n%s %s" % (c("31", "error:"), e), file=sys.stderr)
        return 2
    except Exception as e:
        tail = demo.envoy.log_tail() if getattr(demo, "envoy", None) else ""
        print("\n%s %r\n%s" % (c("31", "demo crashed:"), e, tail), file=sys.stderr)
        return 1
    finally:
        demo.stop()
    return report(demo.failures, "every step behaved as expected; everything started was stopped.")


def report(failures, ok_message):
    """The walkthrough's verdict: exit status 1 when any step misbehaved."""
    if failures:
        print("\n%s %d check(s) did not behave as expected:" % (c("31", "FAILED"), len(failures)))
        for f in failures:
            print("  - " + f)
        return 1
    print("\n%s %s" % (c("32", "OK"), ok_message))
    return 0


if __name__ == "__main__":
    sys.exit(main())
