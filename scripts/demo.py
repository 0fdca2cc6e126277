#!/usr/bin/env python3
"""idem walkthrough: start the demo upstream and Envoy with examples/envoy.yaml, show what the
filter does, print its counters, stop everything.

    python3 scripts/demo.py            # the walkthrough (`make demo`); exit 1 if a step misbehaves
    python3 scripts/demo.py --serve    # keep the stack up for manual curl until Ctrl-C (`make run`)

Ports: 10000 (gateway), 9901 (admin), 8080 (upstream) on 127.0.0.1 -- each replaced by a free
port only when busy. Needs .venv/bin/envoy (`make setup`) and the built filter (`make build`).
"""

import argparse
import json
import signal
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


def c(code, text):
    return "\033[%sm%s\033[0m" % (code, text) if TTY else text


def bold(t):
    return c("1", t)


def dim(t):
    return c("2", t)


class Demo:
    def __init__(self):
        self.failures = []
        self.procs = []
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
        cfg.write_text(stack.example_config_text(ports["listen"], ports["admin"], ports["upstream"]))
        self.envoy = stack.Envoy(cfg, self.workdir, listen_port=ports["listen"], admin_port=ports["admin"],
                                 cwd=str(stack.REPO), name="envoy-demo")
        self.procs.append(self.envoy)
        self.envoy.wait_ready()
        self.gw = "http://127.0.0.1:%d" % self.envoy.listen_port
        print("%s gateway %s  admin http://127.0.0.1:%d  upstream http://127.0.0.1:%d" % (
            bold("stack up:"), self.gw, self.envoy.admin_port, self.upstream.port))
        print(dim("  envoy log: %s" % self.envoy.proc.log_path))

    def stop(self):
        for p in reversed(self.procs):
            try:
                p.stop()
            except Exception as e:  # keep stopping the others
                print("could not stop %s: %s" % (p, e), file=sys.stderr)
        self.procs = []

    # -- printing --------------------------------------------------------------
    def send(self, method, path, key=None, body=None, headers=None, show=True, timeout=15):
        h = {"content-type": "application/json"}
        if key is not None:
            h["Idempotency-Key"] = key
        h.update(headers or {})
        raw = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
        if show:
            extra = "".join("  %s: %s" % (k, v) for k, v in h.items() if k != "content-type")
            print("  %s %s %s%s  %s" % (c("36", "→"), method, path, extra, dim(raw.decode() if raw else "")))
        r = self.envoy.request(method, path, headers=h, body=raw, timeout=timeout)
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
        print("  %s 20 × POST %s  Idempotency-Key: %s  x-demo-delay-ms: 800" % (c("36", "→"), path, ckey))
        barrier = threading.Barrier(20)

        def one(_):
            barrier.wait(10)
            return self.envoy.request("POST", path, headers={"Idempotency-Key": ckey, "x-demo-delay-ms": "800",
                                                             "content-type": "application/json"},
                                      body=json.dumps(order).encode(), timeout=30)
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

        print("\n%s" % bold("idem counters (admin /stats):"))
        stats = self.envoy.stats("idem.")
        for name in sorted(stats):
            if stats[name]:
                print("  %-45s %d" % (name, stats[name]))
        self.check(stats.get("idem.create-order.replayed", 0) >= 1 and stats.get("idem.create-order.forwarded", 0) >= 1,
                   "counters are exported")
        print("\n%s" % bold("interception log lines (component wasm):"))
        lines = [l for l in self.envoy.log_text().splitlines() if "idem:" in l]
        for l in lines[-8:]:
            print("  " + dim(l[:200]))

    def serve(self):
        gw = self.gw
        admin = "http://127.0.0.1:%d" % self.envoy.admin_port
        print("""
Try it (another terminal):

  curl -si %(gw)s/api/order/create -H 'Idempotency-Key: order-1' -H 'content-type: application/json' \\
       -d '{"sku":"BOOK-42","qty":1}'                      # first: forwarded
  (run it again)                                           # replayed, idempotent-replayed: true
  curl -si %(gw)s/api/order/create -H 'Idempotency-Key: order-1' -d '{"sku":"BOOK-42","qty":5}'   # 422
  curl -si %(gw)s/api/order/create -d '{}'                 # 400 IDEMPOTENCY_KEY_MISSING
  curl -si %(gw)s/api/order/create -H 'Idempotency-Key: slow-1' -H 'x-demo-delay-ms: 5000' -d '{}' &
  curl -si %(gw)s/api/order/create -H 'Idempotency-Key: slow-1' -H 'x-demo-delay-ms: 5000' -d '{}'  # 409
  curl -si %(gw)s/api/pay/callback -d '{"transaction_id":"tx-1","status":"PAID"}'   # body-keyed
  curl -si %(gw)s/api/orders/7/pay -H 'Idempotency-Key: pay-7' -d '{}'             # path template
  curl -s  '%(admin)s/stats?filter=idem\\.'                 # counters (listed as wasmcustom.idem.*)
  curl -s  http://127.0.0.1:%(up)d/__calls                  # how often the upstream really ran

Upstream knobs (request headers): x-demo-delay-ms, x-demo-status, x-demo-fail-first, x-demo-set-cookie,
x-demo-body-bytes.  Envoy log: %(log)s

Press Ctrl-C to stop.""" % {"gw": gw, "admin": admin, "up": self.upstream.port, "log": self.envoy.proc.log_path})
        while True:
            for p in self.procs:
                if not p.proc.alive():
                    raise stack.StackError("%s exited:\n%s" % (p.proc.name, p.proc.log_tail()))
            time.sleep(1.0)


def main():
    ap = argparse.ArgumentParser(description="idem walkthrough")
    ap.add_argument("--serve", action="store_true", help="keep the stack up for manual curl until Ctrl-C")
    args = ap.parse_args()

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)  # also when started in the background (SIGINT ignored there)

    demo = Demo()
    try:
        demo.start()
        if args.serve:
            demo.serve()
        else:
            demo.walkthrough()
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
    if demo.failures:
        print("\n%s %d check(s) did not behave as expected:" % (c("31", "FAILED"), len(demo.failures)))
        for f in demo.failures:
            print("  - " + f)
        return 1
    print("\n%s every step behaved as expected; everything started was stopped." % c("32", "OK"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
