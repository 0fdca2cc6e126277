"""The Redis store: redis-server (password, ACL, no persistence) and Webdis in front of it, the
policy `[redis]` table and the Envoy cluster that point the filter at Webdis, and a minimal RESP
client for inspecting keys."""

import base64
import json
import os
import shutil
import socket
from pathlib import Path

from .common import REPO, SETUP_HINT, StackError
from .envoy_config import cluster
from .http import free_port, port_is_free, request
from .procs import Proc, next_seq, wait_until

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
WEBDIS = shutil.which("webdis") or "/usr/bin/webdis"
WEBDIS_JSON = REPO / "examples" / "webdis.json"
# The credentials of examples/webdis.json (loopback only; tests and demos reuse them).
REDIS_PASSWORD = "idem-redis-password"
WEBDIS_AUTH = "idem:idem-webdis-password"
# Redis ACL of the `default` user, the one Webdis authenticates as. Webdis' own ACL can only enable
# whole commands, and EVAL runs any command (`EVAL "return redis.call('FLUSHALL')" 0`); Redis checks
# the commands and keys a script calls against the calling user's ACL, so this limits everything
# that comes through Webdis to what the filter's commands and scripts use, on idem keys only.
# `+info`: the filter reads maxmemory_policy once at start (`INFO memory`) to warn when Redis evicts.
REDIS_DEFAULT_USER_ACL = ["~idem*", "resetchannels", "-@all", "+get", "+set", "+del", "+eval", "+pexpire", "+ping",
                          "+info", "+select", "+auth"]
# A separate user with every right, for tests and demos that inspect Redis (KEYS, PTTL, DBSIZE).
REDIS_ADMIN = ("idem-admin", "idem-admin-password")


def require_redis():
    for binary, pkg in ((REDIS_SERVER, "redis-server"), (WEBDIS, "webdis")):
        if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
            raise StackError("%s not found; %s (apt-get install -y %s)" % (pkg, SETUP_HINT, pkg))


class RedisError(Exception):
    pass


def redis_command(port, *args, password=REDIS_PASSWORD, user=None, timeout=3.0):
    """One Redis command over RESP (a minimal client for tests: inspect keys, TTLs). Returns the reply
    (bytes, int, list, None); raises RedisError on an error reply and OSError on socket errors."""
    def enc(*a):
        out = [b"*%d\r\n" % len(a)]
        for x in a:
            x = x if isinstance(x, bytes) else str(x).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(x), x))
        return b"".join(out)

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        f = s.makefile("rb")
        auth = (enc("AUTH", user, password) if user else enc("AUTH", password)) if password else b""
        payload = auth + enc(*args)
        s.sendall(payload)

        def read():
            line = f.readline()
            if not line:
                raise OSError("redis closed the connection")
            t, rest = line[:1], line[1:-2]
            if t == b"+":
                return rest
            if t == b"-":
                return RedisError(rest.decode(errors="replace"))
            if t == b":":
                return int(rest)
            if t == b"$":
                n = int(rest)
                if n < 0:
                    return None
                data = f.read(n + 2)
                return data[:-2]
            if t == b"*":
                n = int(rest)
                return None if n < 0 else [read() for _ in range(n)]
            raise OSError("unparsable redis reply %r" % line)

        if password:
            auth = read()
            if isinstance(auth, RedisError):
                raise auth
        reply = read()
        if isinstance(reply, RedisError):
            raise reply
        return reply


class Redis:
    """redis-server on loopback with a password and no persistence. `restart()` keeps the port.

    The `default` user (password `password`, the one Webdis uses) is limited by REDIS_DEFAULT_USER_ACL;
    `command()` runs as the REDIS_ADMIN user."""

    def __init__(self, workdir, port=None, password=REDIS_PASSWORD, extra_args=()):
        """`extra_args`: more of redis-server's options (a `--tls-port` beside the plain one, say)."""
        require_redis()
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.password = password
        self.extra_args = list(extra_args)
        self.proc = None
        self.start()

    def start(self, timeout=15.0):
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--daemonize", "no",
                "--user", "default", "on", ">" + self.password] + REDIS_DEFAULT_USER_ACL + [
                "--user", REDIS_ADMIN[0], "on", ">" + REDIS_ADMIN[1], "~*", "&*", "+@all"] + self.extra_args
        self.proc = Proc("redis", argv, self.workdir / ("redis-%d-%d.log" % (self.port, next_seq())))
        ok = wait_until(lambda: not self.proc.alive() or self.ping(), timeout, interval=0.05)
        if not ok or not self.proc.alive():
            tail = self.proc.log_tail()
            self.proc.stop()
            raise StackError("redis-server did not start on 127.0.0.1:%d:\n%s" % (self.port, tail))
        return self

    def ping(self):
        try:
            return redis_command(self.port, "PING", password=self.password) == b"PONG"
        except (OSError, RedisError):
            return False

    def command(self, *args):
        """A command as the admin user (every right)."""
        return redis_command(self.port, *args, user=REDIS_ADMIN[0], password=REDIS_ADMIN[1])

    def command_as_default(self, *args):
        """A command as the `default` user, the one Webdis uses."""
        return redis_command(self.port, *args, password=self.password)

    def restart(self):
        self.stop()
        wait_until(lambda: port_is_free(self.port), 10)
        return self.start()

    def stop(self):
        if self.proc is not None:
            self.proc.stop()


def webdis_config(http_port, redis_port, template=WEBDIS_JSON):
    """examples/webdis.json with its two ports rewritten (same ACL, credentials, logging)."""
    cfg = json.loads(Path(template).read_text())
    cfg["http_port"] = http_port
    cfg["redis_port"] = redis_port
    return cfg


class Webdis:
    """webdis (examples/webdis.json or `template`, ports rewritten) in front of a Redis. `start()` after `stop()`
    brings it back on the same port."""

    def __init__(self, workdir, redis_port, port=None, template=WEBDIS_JSON):
        require_redis()
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.redis_port = redis_port
        self.config_path = self.workdir / ("webdis-%d.json" % self.port)
        self.config_path.write_text(json.dumps(webdis_config(self.port, redis_port, template), indent=1))
        self.proc = None
        self.start()

    def start(self, timeout=15.0):
        wait_until(lambda: port_is_free(self.port), 10)
        self.proc = Proc("webdis", [WEBDIS, str(self.config_path)],
                         self.workdir / ("webdis-%d-%d.log" % (self.port, next_seq())), cwd=str(self.workdir))
        ok = wait_until(lambda: not self.proc.alive() or self.ready(), timeout, interval=0.05)
        if not ok or not self.proc.alive():
            tail = self.proc.log_tail()
            self.proc.stop()
            raise StackError("webdis did not start on 127.0.0.1:%d:\n%s" % (self.port, tail))
        return self

    def call(self, command_path, auth=WEBDIS_AUTH, method="GET", body=None, timeout=3.0):
        """A request straight to Webdis, e.g. call("/SET/k/v") or call("/", method="POST", body="SET/k/v")."""
        headers = {}
        if auth:
            headers["authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
        return request(self.port, method, command_path, headers, body, timeout)

    def ready(self):
        """Webdis answers and reaches Redis (an authorised SET through the ACL)."""
        try:
            r = self.call("/SET/idem-webdis-ready/1/PX/1000")
        except OSError:
            return False
        return r.status == 200 and (r.json() or {}).get("SET") == [True, "OK"]

    def stop(self):
        if self.proc is not None:
            self.proc.stop()

    def alive(self):
        return self.proc is not None and self.proc.alive()


def webdis_cluster(port, name="webdis"):
    c = cluster(name, port)
    c["connect_timeout"] = "0.5s"
    return c


# The filter's warning when Redis may evict its keys (filter/src/lifecycle/eviction.rs, EVICTS_LOG).
EVICTS_LOG = "idem: Redis may evict idem's keys when its memory is full"
# The fleet's token signing secret in tests and demos (`[tokens] secret`, at least 32 characters).
TOKEN_SECRET = "idem-test-token-secret-0123456789abcdef"


# The variable `[redis] password_env` names in the tables `redis_table(direct_port=…)` writes.
DIRECT_PASSWORD_ENV = "IDEM_REDIS_PASSWORD"


def redis_table(timeout="500ms", on_store_error="reject", prefix="idem:", cluster_name="webdis",
                basic_auth=WEBDIS_AUTH, direct_port=None):
    """The `[redis]` table of a policy bundle, for the Webdis cluster added by `webdis_cluster`, and the
    `[tokens]` secret every Envoy of a fleet shares (token routes on Redis need it). `direct_port`:
    also `direct` (the native build then speaks RESP to that Redis itself), its password in this
    process' environment, which the Envoys started from it inherit."""
    lines = ["[redis]", 'cluster = "%s"' % cluster_name, 'authority = "webdis"',
             'timeout = "%s"' % timeout, 'prefix = "%s"' % prefix, 'on_store_error = "%s"' % on_store_error]
    if direct_port is not None:
        lines += ['direct = "127.0.0.1:%d"' % direct_port, 'password_env = "%s"' % DIRECT_PASSWORD_ENV]
        os.environ.setdefault(DIRECT_PASSWORD_ENV, REDIS_PASSWORD)
    if basic_auth:
        lines.insert(3, 'basic_auth = "%s"' % basic_auth)
    lines += ["", "[tokens]", 'secret = "%s"' % TOKEN_SECRET]
    return "\n".join(lines) + "\n"
