"""The fleet store on Redis Cluster: six redis-server processes (3 primaries, 3 replicas) made a
cluster with `redis-cli --cluster create`, Envoy's redis_proxy in front of them
(examples/redis-cluster/redis-proxy.yaml, ports rewritten), and Webdis pointed at the proxy
(examples/redis-cluster/webdis.json). The ACL is examples/redis-cluster/users.acl, as shipped."""

import os
import shutil
import signal
import subprocess
from pathlib import Path

from .common import REPO, StackError
from .envoy import Envoy
from .examples import rewrite_example
from .http import free_port
from .procs import Proc, next_seq, wait_until
from .redis import REDIS_SERVER, RedisError, Webdis, redis_command, require_redis

CLUSTER_DIR = REPO / "examples" / "redis-cluster"
CLUSTER_ACL = CLUSTER_DIR / "users.acl"
CLUSTER_PROXY_YAML = CLUSTER_DIR / "redis-proxy.yaml"
CLUSTER_WEBDIS_JSON = CLUSTER_DIR / "webdis.json"
# The admin user of users.acl (redis-cli, replication); the proxy's user is Envoy's, in redis-proxy.yaml.
CLUSTER_ADMIN = ("idem-admin", "idem-admin-password")
# users.acl's user for idem's commands: redis_proxy's, and the native build's with `[redis] direct`.
CLUSTER_IDEM_USER = ("idem-proxy", "idem-proxy-password")
CLUSTER_PASSWORD_ENV = "IDEM_CLUSTER_PASSWORD"
# The shipped proxy config's ports: listener, admin, and the three seed nodes.
PROXY_EXAMPLE_PORTS = {"listen": 6380, "admin": 9911, "seeds": (7001, 7002, 7003)}
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


class ClusterNode:
    """One redis-server in cluster mode: data port, cluster bus port, its own directory."""

    def __init__(self, workdir, node_timeout_ms):
        self.port, self.bus_port = free_port(), free_port()
        self.dir = Path(workdir) / ("redis-cluster-%d-%d" % (self.port, next_seq()))
        self.dir.mkdir(parents=True)
        self.node_timeout_ms = node_timeout_ms
        self.proc = None
        self.start()

    def start(self):
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-port", str(self.bus_port),
                "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(self.node_timeout_ms),
                "--save", "", "--appendonly", "no", "--dir", str(self.dir), "--daemonize", "no",
                "--aclfile", str(CLUSTER_ACL), "--masteruser", CLUSTER_ADMIN[0], "--masterauth", CLUSTER_ADMIN[1]]
        self.proc = Proc("redis-cluster-node", argv, self.dir / ("redis-%d.log" % next_seq()), cwd=str(self.dir))
        if not wait_until(lambda: not self.proc.alive() or self.ping(), 15, interval=0.05) or not self.proc.alive():
            tail = self.proc.log_tail()
            self.proc.stop()
            raise StackError("redis-server (cluster node) did not start on 127.0.0.1:%d:\n%s" % (self.port, tail))

    def command(self, *args, timeout=3.0):
        return redis_command(self.port, *args, user=CLUSTER_ADMIN[0], password=CLUSTER_ADMIN[1], timeout=timeout)

    def ping(self):
        try:
            return self.command("PING", timeout=1.0) == b"PONG"
        except (OSError, RedisError):
            return False

    def info(self, section):
        text = self.command("INFO", section).decode(errors="replace")
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def kill(self):
        """SIGKILL: no shutdown, no goodbye to the cluster, what a crash looks like."""
        self.proc.p.send_signal(signal.SIGKILL)
        self.proc.p.wait(timeout=5)
        self.proc.stop()

    def alive(self):
        return self.proc is not None and self.proc.alive()

    def stop(self):
        if self.proc is not None:
            self.proc.stop()


class RedisCluster:
    """`primaries` primaries with one replica each, on loopback, created with redis-cli."""

    def __init__(self, workdir, primaries=3, node_timeout_ms=1000):
        require_redis()
        if not Path(REDIS_CLI).is_file():
            raise StackError("redis-cli not found (apt-get install -y redis-tools)")
        self.nodes = []
        try:
            for _ in range(primaries * 2):
                self.nodes.append(ClusterNode(workdir, node_timeout_ms))
            self._create()
        except Exception:
            self.stop()
            raise

    def _create(self):
        argv = [REDIS_CLI, "--user", CLUSTER_ADMIN[0], "-a", CLUSTER_ADMIN[1], "--no-auth-warning",
                "--cluster", "create"] + ["127.0.0.1:%d" % n.port for n in self.nodes] + [
                "--cluster-replicas", "1", "--cluster-yes"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise StackError("redis-cli --cluster create failed:\n%s%s" % (done.stdout, done.stderr))
        if not wait_until(self.healthy, 30, interval=0.1):
            raise StackError("the Redis cluster did not become healthy:\n%s" % self.describe())

    def by_port(self, port):
        return next(n for n in self.nodes if n.port == port)

    def topology(self):
        """CLUSTER NODES as seen by a live node: [{port, id, role, master_id, slots, failed}]."""
        for node in self.nodes:
            if not node.alive():
                continue
            try:
                text = node.command("CLUSTER", "NODES").decode()
            except (OSError, RedisError):
                continue
            out = []
            for line in text.splitlines():
                f = line.split()
                flags = f[2].split(",")
                out.append({"id": f[0], "port": int(f[1].split("@")[0].rsplit(":", 1)[1]),
                            "role": "primary" if "master" in flags else "replica",
                            "master_id": None if f[3] == "-" else f[3], "slots": f[8:],
                            "failed": "fail" in flags or "fail?" in flags or f[7] != "connected"})
            return out
        raise StackError("no live node answers CLUSTER NODES")

    def primaries(self):
        """The ports of the live primaries that own slots."""
        return sorted(n["port"] for n in self.topology() if n["role"] == "primary" and n["slots"] and not n["failed"])

    def replica_of(self, primary_port):
        topo = self.topology()
        pid = next(n["id"] for n in topo if n["port"] == primary_port)
        return next(n["port"] for n in topo if n["master_id"] == pid)

    def healthy(self):
        """Every live node says cluster_state:ok, every live replica's link to its primary is up,
        and three primaries with slots are alive."""
        try:
            for node in self.nodes:
                if not node.alive():
                    continue
                if node.command("CLUSTER", "INFO").decode().find("cluster_state:ok") < 0:
                    return False
                repl = node.info("replication")
                if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                    return False
            return len(self.primaries()) == len(self.nodes) // 2
        except (OSError, RedisError, StackError):
            return False

    def keys_by_primary(self, pattern):
        """{primary port: [keys matching pattern]} over the live primaries."""
        return {p: sorted(self.by_port(p).command("KEYS", pattern) or []) for p in self.primaries()}

    def describe(self):
        try:
            return "\n".join(str(n) for n in self.topology())
        except StackError as e:
            return str(e)

    def log_tails(self, lines=10):
        return "\n".join("--- redis node %d ---\n%s" % (n.port, n.proc.log_tail(lines)) for n in self.nodes)

    def stop(self):
        for node in self.nodes:
            node.stop()


def redis_proxy_config_text(listen_port, admin_port, seed_ports):
    """examples/redis-cluster/redis-proxy.yaml with its listener, admin and seed-node ports rewritten."""
    ports = {PROXY_EXAMPLE_PORTS["listen"]: listen_port, PROXY_EXAMPLE_PORTS["admin"]: admin_port}
    ports.update(zip(PROXY_EXAMPLE_PORTS["seeds"], seed_ports))
    return rewrite_example(CLUSTER_PROXY_YAML, ports)


class ClusterStore:
    """What a gateway host runs to reach the cluster: Envoy's redis_proxy and a Webdis in front of
    it, both on loopback. `webdis.port` is what the gateway's `webdis` cluster points at."""

    def __init__(self, workdir, cluster, name="redis-proxy"):
        self.workdir = Path(workdir)
        listen, admin = free_port(), free_port()
        config = self.workdir / ("%s-%d.yaml" % (name, next_seq()))
        config.write_text(redis_proxy_config_text(listen, admin, [n.port for n in cluster.nodes[:3]]))
        self.proxy = Envoy(config, self.workdir, listen_port=listen, admin_port=admin, concurrency=1, name=name)
        self.webdis = None
        try:
            self.proxy.wait_ready(60)
            # Ready once the proxy has discovered the cluster: a write through Webdis succeeds.
            self.webdis = Webdis(self.workdir, listen, template=CLUSTER_WEBDIS_JSON)
        except Exception:
            self.stop()
            raise

    def stop(self):
        if self.webdis is not None:
            self.webdis.stop()
        self.proxy.stop()

    def log_tails(self):
        return "--- redis proxy (Envoy) ---\n%s\n--- webdis ---\n%s" % (
            self.proxy.log_tail(20), self.webdis.proc.log_tail(20) if self.webdis else "")


__all__ = ["CLUSTER_DIR", "CLUSTER_ACL", "CLUSTER_PROXY_YAML", "CLUSTER_WEBDIS_JSON",
           "CLUSTER_ADMIN", "CLUSTER_IDEM_USER", "CLUSTER_PASSWORD_ENV", "direct_cluster_lines", "ClusterNode", "RedisCluster", "ClusterStore", "redis_proxy_config_text"]


def direct_cluster_lines(cluster):
    """`[redis]` lines for the native build to speak to `cluster` itself: every primary as a seed
    node, users.acl's idem user, its password in this process' environment (which the Envoys
    started from it inherit)."""
    os.environ.setdefault(CLUSTER_PASSWORD_ENV, CLUSTER_IDEM_USER[1])
    seeds = ",".join("127.0.0.1:%d" % port for port in cluster.primaries())
    return ['direct = "%s"' % seeds, 'user = "%s"' % CLUSTER_IDEM_USER[0], 'password_env = "%s"' % CLUSTER_PASSWORD_ENV]
