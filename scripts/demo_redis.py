#!/usr/bin/env python3
"""idem walkthrough on the Redis store (`make demo-redis`): the same steps as `make demo`, against
TWO Envoy processes (examples/envoy-redis.yaml) sharing one Redis through Webdis
(examples/webdis.json). Requests alternate between the Envoys, so every repeat lands on the other
one than the request before it: what holds, holds because of Redis. Prints every answer and both
Envoys' counters, stops everything, exits 1 if a step misbehaves.

    python3 scripts/demo_redis.py              # one Redis (`make demo-redis`)
    python3 scripts/demo_redis.py --cluster    # Redis Cluster (`make demo-redis CLUSTER=1`)
    python3 scripts/demo_redis.py --artifact native   # both Envoys on the native build
    python3 scripts/demo_redis.py --artifact mixed    # Envoy 1 .wasm, Envoy 2 native: a migration

`make demo-redis ARTIFACT=native|mixed` passes `--artifact`. The native build reads the same
records through the same Webdis, so in a mixed fleet every repeat crosses from one build to the
other.

With --cluster the store is a six-node Redis Cluster (3 primaries, 3 replicas, free ports) reached
through Envoy's redis_proxy and a Webdis per gateway (examples/redis-cluster/).
Ports on 127.0.0.1: Redis 6390, Webdis 7390, upstream 8080, Envoy 1 10000 (admin 9901),
Envoy 2 10001 (admin 9902) -- each replaced by a free port only when busy. Needs .venv/bin/envoy,
redis-server and webdis (`make setup`) and the built filter (`make build`).
"""

import argparse
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stack  # noqa: E402
from demo import Demo, bold, c, dim, report, with_token_routes  # noqa: E402

DEFAULT_PORTS = {"redis": 6390, "webdis": 7390, "upstream": 8080,
                 "listen1": 10000, "admin1": 9901, "listen2": 10001, "admin2": 9902}


class RedisDemo(Demo):
    def __init__(self, cluster=False, artifact="wasm"):
        super().__init__()
        self.cluster = None
        self.webdis_ports = []
        self.use_cluster = cluster
        # Which build each Envoy loads: both the same, or (mixed) Envoy 1 the .wasm, Envoy 2 native.
        self.artifacts = {"wasm": ("wasm", "wasm"), "native": ("native", "native"),
                          "mixed": ("wasm", "native")}[artifact]

    def start_store(self, ports):
        """One Redis behind one Webdis, or (--cluster) a six-node Redis Cluster with Envoy's
        redis_proxy and a Webdis in front of it for each gateway Envoy."""
        if not self.use_cluster:
            self.redis = stack.Redis(self.workdir, port=ports["redis"])
            self.procs.append(self.redis)
            self.webdis = stack.Webdis(self.workdir, self.redis.port, port=ports["webdis"])
            self.procs.append(self.webdis)
            self.webdis_ports = [self.webdis.port, self.webdis.port]
            return "one Redis 127.0.0.1:%d behind Webdis 127.0.0.1:%d" % (self.redis.port, self.webdis.port)
        print(dim("starting a Redis Cluster: 3 primaries, 3 replicas (examples/redis-cluster/) ..."))
        self.cluster = stack.RedisCluster(self.workdir)
        self.procs.append(self.cluster)
        for i in (1, 2):
            store = stack.ClusterStore(self.workdir, self.cluster, name="redis-proxy%d" % i)
            self.procs.append(store)
            self.webdis_ports.append(store.webdis.port)
        return "Redis Cluster (primaries %s) through Envoy redis_proxy, Webdis %s" % (
            ", ".join(str(p) for p in self.cluster.primaries()), " / ".join(str(p) for p in self.webdis_ports))

    def start(self):
        stack.require_envoy()
        stack.require_wasm()
        stack.require_redis()
        ports = {}
        for name, default in DEFAULT_PORTS.items():
            ports[name] = default if stack.port_is_free(default) else stack.free_port()
            if ports[name] != default:
                print(dim("port %d (%s) is busy; using %d instead" % (default, name, ports[name])))
        store = self.start_store(ports)
        self.upstream = stack.Upstream(self.workdir, port=ports["upstream"])
        self.procs.append(self.upstream)
        for i in (1, 2):
            cfg = self.workdir / ("envoy-redis-%d.yaml" % i)
            text = stack.example_redis_config_text(ports["listen%d" % i], ports["admin%d" % i], self.upstream.port,
                                                   self.webdis_ports[i - 1])
            text = with_token_routes(text, store="redis")
            if self.artifacts[i - 1] == "native":
                text = stack.as_native(text)
            cfg.write_text(text)
            env = stack.Envoy(cfg, self.workdir, listen_port=ports["listen%d" % i], admin_port=ports["admin%d" % i],
                              cwd=str(stack.REPO), name="envoy-redis-%d" % i)
            self.procs.append(env)
            self.envoys.append(env)
        for env in self.envoys:
            env.wait_ready()
        self.envoy = self.envoys[0]
        self.gw = "http://127.0.0.1:%d" % self.envoy.listen_port
        print("%s Envoy 1 http://127.0.0.1:%d (admin %d, %s), Envoy 2 http://127.0.0.1:%d (admin %d, %s)" % (
            bold("stack up:"), self.envoys[0].listen_port, self.envoys[0].admin_port, self.artifacts[0],
            self.envoys[1].listen_port, self.envoys[1].admin_port, self.artifacts[1]))
        print("          %s; upstream http://127.0.0.1:%d" % (store, self.upstream.port))
        for env in self.envoys:
            print(dim("  envoy log: %s" % env.proc.log_path))

    def report(self):
        super().report()
        if self.cluster is not None:
            by_primary = self.cluster.keys_by_primary("idem:*")
            print("\n%s %s" % (bold("keys per primary:"), ", ".join("%d: %d" % kv for kv in
                                                                  ((p, len(ks)) for p, ks in by_primary.items()))))
            keys = [k for ks in by_primary.values() for k in ks]
        else:
            keys = self.redis.command("KEYS", "idem:*") or []
        kinds = {}
        for k in keys:
            kind = k.decode().split(":")[1] if k.count(b":") >= 2 else "?"
            kinds[kind] = kinds.get(kind, 0) + 1
        print("\n%s %s" % (bold("Redis keys:"), ", ".join("%d × idem:%s:…" % (n, k) for k, n in sorted(kinds.items()))))
        self.check(kinds.get("k", 0) >= 1 and kinds.get("t", 0) >= 1,
                   "claims (idem:k:…) and tokens (idem:t:…) live in Redis, shared by both Envoys")


def main():
    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)

    ap = argparse.ArgumentParser(description="idem walkthrough on two Envoys sharing Redis")
    ap.add_argument("--cluster", action="store_true", help="a Redis Cluster through Envoy's redis_proxy")
    ap.add_argument("--artifact", choices=["wasm", "native", "mixed"], default="wasm",
                    help="the build each Envoy loads (mixed: Envoy 1 the .wasm, Envoy 2 the native build)")
    args = ap.parse_args()
    cluster = args.cluster
    demo = RedisDemo(cluster=cluster, artifact=args.artifact)
    try:
        demo.start()
        demo.walkthrough()
    except KeyboardInterrupt:
        print("\nstopping")
        return 130
    except stack.StackError as e:
        print("\n%s %s" % (c("31", "error:"), e), file=sys.stderr)
        return 2
    except Exception as e:
        tails = "\n".join(env.log_tail() for env in demo.envoys)
        print("\n%s %r\n%s" % (c("31", "demo crashed:"), e, tails), file=sys.stderr)
        return 1
    finally:
        demo.stop()
    return report(demo.failures, "every step behaved as expected on two Envoys (%s) sharing %s; everything started "
                  "was stopped." % (" and ".join(demo.artifacts), "a Redis Cluster" if cluster else "one Redis"))


if __name__ == "__main__":
    sys.exit(main())
