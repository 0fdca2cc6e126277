#!/usr/bin/env python3
"""What a Redis Cluster failover costs idem: keys sent with retries (as an SDK does: the same key
again after a 503 or 409) across a `kill -9` of a primary, counted afterwards.

    .venv/bin/python scripts/failover.py [--clients 8] [--before 2] [--after 4]

Starts a six-node cluster (3 primaries, 3 replicas), one Envoy redis_proxy + Webdis per gateway
(`--artifact native`: none, the native build speaks to the cluster itself), two gateway Envoys with idem on the Redis store and the demo upstream, all on loopback; runs the
load; kills one primary; waits for its replica to be promoted; keeps the load going, then prints
the figures: keys, executions, double executions, 503s and 409s, the failover window, how long
after the kill the gateways served again. tests/e2e/test_redis_cluster.py runs the same function.
"""

import argparse
import json
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack  # noqa: E402

ROUTE = {"name": "fo-key", "match": {"path": "/fo/key"}, "idem": True}
# The figures' path and the policy of the route, on the Redis store through the cluster.
PATH = "/fo/key"


def policy(prefix, on_store_error="reject", timeout="500ms"):
    return stack.redis_table(timeout=timeout, on_store_error=on_store_error, prefix=prefix) + """
[[route]]
name = "fo-key"
match = { method = "POST", path = "/fo/key" }
store = "redis"

[route.key]
lock_ttl = "30s"
"""


def send(env, key, timeout=10.0):
    return env.request("POST", PATH, headers={"content-type": "application/json", "idempotency-key": key},
                       body={"sku": "A1", "qty": 1}, timeout=timeout)


class Client(threading.Thread):
    """Sends one key after another; each until a 200, the same key again after a 503, a 409 or a
    connection error (0.1 s later, on the other gateway), giving up after `give_up_s`."""

    def __init__(self, gateways, stop, give_up_s=30.0):
        super().__init__(daemon=True)
        self.gateways, self.stop, self.give_up_s = gateways, stop, give_up_s
        self.attempts = []   # (time, key, status or "error", code)
        self.keys = []       # (key, first attempt time, done time or None)

    def run(self):
        turn = 0
        while not self.stop.is_set():
            key = "fo-%s" % uuid.uuid4().hex
            first, done = time.monotonic(), None
            while time.monotonic() - first < self.give_up_s:
                env = self.gateways[turn % len(self.gateways)]
                turn += 1
                try:
                    r = send(env, key)
                    self.attempts.append((time.monotonic(), key, r.status, r.code))
                    if r.status == 200:
                        done = time.monotonic()
                        break
                except OSError as e:
                    self.attempts.append((time.monotonic(), key, "error", type(e).__name__))
                time.sleep(0.1)
            self.keys.append((key, first, done))


def measure_failover(cluster, gateways, upstream, clients=8, before_s=2.0, after_s=4.0):
    """Run the load, kill a primary `before_s` into it, keep it going `after_s` past the promotion;
    return the figures (a dict)."""
    stop = threading.Event()
    threads = [Client(gateways, stop) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(before_s)
    victim = cluster.primaries()[0]
    heir = cluster.replica_of(victim)
    t_kill = time.monotonic()
    cluster.by_port(victim).kill()
    promoted = stack.wait_until(lambda: heir in cluster.primaries() and cluster.healthy(), 30, interval=0.05)
    t_promoted = time.monotonic()
    time.sleep(after_s)
    stop.set()
    for t in threads:
        t.join(60)
    attempts = sorted(a for t in threads for a in t.attempts)
    keys = [k for t in threads for k in t.keys]
    # Completions written before the kill survive it: repeat those keys, on the other gateway too.
    settled = [k for k, _, done in keys if done is not None and done < t_kill - 0.5][:100]
    repeats = [send(gateways[i % len(gateways)], k) for i, k in enumerate(settled)]
    executions = {k: upstream.calls(k) for k, _, _ in keys}
    answers = Counter("%s %s" % (s, c or "") if s != 200 else "200" for _, _, s, c in attempts)
    failed = [a for a in attempts if a[2] != 200]
    after_kill_ok = [a for a in attempts if a[0] > t_kill and a[2] == 200]
    last_failure = max((a[0] for a in failed), default=None)
    served_again = min((a[0] for a in after_kill_ok if last_failure is None or a[0] > last_failure), default=None)
    latency = sorted(done - first for _, first, done in keys if done is not None)
    return {
        "killed_primary": victim, "promoted_replica": heir, "promoted": promoted,
        "promotion_s": round(t_promoted - t_kill, 2),
        "keys": len(keys), "keys_completed": sum(1 for _, _, d in keys if d is not None),
        "keys_executed": sum(1 for n in executions.values() if n >= 1),
        "double_executions": sum(1 for n in executions.values() if n > 1),
        "not_executed_but_completed": sum(1 for k, _, d in keys if d is not None and executions[k] == 0),
        "repeated_before_kill_keys": len(settled),
        "repeats_replayed": sum(1 for r in repeats if r.status == 200 and r.header("idempotent-replayed") == "true"),
        "attempts": len(attempts), "answers": dict(sorted(answers.items())),
        "failover_window_s": round(last_failure - min(a[0] for a in failed), 2) if failed else 0.0,
        "served_again_after_kill_s": round(served_again - t_kill, 2) if served_again else None,
        "key_latency_p50_s": round(latency[len(latency) // 2], 3) if latency else None,
        "key_latency_max_s": round(latency[-1], 3) if latency else None,
        "run_s": round(time.monotonic() - t0, 1),
        "unexpected": [(s, c) for _, _, s, c in failed
                       if (s, c) not in ((503, "IDEMPOTENCY_STORE_UNAVAILABLE"), (409, "REQUEST_IN_PROGRESS"))][:10],
    }


def start_cluster_fleet(workdir, upstream_port, policy_toml, routes, n=2, concurrency=2, artifacts=None):
    """The cluster and n gateway Envoys. Returns (cluster, stores, gateways); the caller stops
    them (stop_all). `artifacts`: each gateway's build, `wasm` or `native` (default: the stack's,
    IDEM_ARTIFACT). A `.wasm` gateway reaches the cluster through its own redis_proxy + Webdis (a
    store); a native one speaks to the cluster's nodes itself (`[redis] direct`, no Webdis)."""
    cluster = stack.RedisCluster(workdir)
    try:
        stores, gateways = start_gateways(workdir, cluster, upstream_port, policy_toml, routes,
                                          artifacts or [stack.ARTIFACT] * n, concurrency)
    except Exception:
        cluster.stop()
        raise
    return cluster, stores, gateways


def start_gateways(workdir, cluster, upstream_port, policy_toml, routes, artifacts, concurrency=2):
    """A gateway Envoy per build in `artifacts` on `cluster`: (stores, gateways)."""
    # The bundle names both ways; each build reads its own (a fleet of both shares the records).
    bundle = policy_toml.replace("[redis]\n", "[redis]\n" + "\n".join(stack.direct_cluster_lines(cluster)) + "\n", 1)
    stores, gateways = [], []
    try:
        for i, artifact in enumerate(artifacts):
            extra = []
            if artifact == "wasm":
                stores.append(stack.ClusterStore(workdir, cluster, name="redis-proxy%d" % (i + 1)))
                extra = [stack.webdis_cluster(stores[-1].webdis.port)]
            gateways.append(stack.start_idem_envoy(
                workdir, upstream_port, bundle, routes=routes, concurrency=concurrency, extra_clusters=extra,
                name="envoy-cluster%d" % (i + 1), wasm_path=stack.NATIVE if artifact == "native" else stack.WASM))
    except Exception:
        stop_all(None, stores, gateways)
        raise
    return stores, gateways


def stop_all(cluster, stores, gateways):
    for g in gateways:
        g.stop()
    for s in stores:
        s.stop()
    if cluster is not None:
        cluster.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    ap.add_argument("--before", type=float, default=2.0, help="seconds of load before the kill (default 2)")
    ap.add_argument("--after", type=float, default=4.0, help="seconds of load after the promotion (default 4)")
    ap.add_argument("--artifact", choices=("wasm", "native"), default=stack.ARTIFACT,
                    help="the gateways' build: `wasm` (through redis_proxy + Webdis, the default) or `native` "
                         "(speaking to the cluster itself, [redis] direct)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args()
    stack.require_envoy()
    workdir = stack.make_workdir("idem-failover-")
    upstream = stack.Upstream(workdir)
    prefix = "idem-fo-%s:" % uuid.uuid4().hex[:6]
    cluster, stores, gateways = start_cluster_fleet(workdir, upstream.port, policy(prefix), [ROUTE],
                                                    artifacts=[args.artifact] * 2)
    try:
        figures = measure_failover(cluster, gateways, upstream, args.clients, args.before, args.after)
    finally:
        stop_all(cluster, stores, gateways)
        upstream.stop()
    if args.json:
        print(json.dumps(figures))
    else:
        for k, v in figures.items():
            print("%-28s %s" % (k, v))
    return 0 if figures["double_executions"] == 0 and not figures["unexpected"] else 1


if __name__ == "__main__":
    sys.exit(main())
