"""Start and stop the real components idem runs with: the demo upstream, Envoy with the
idem filter, and a fast `direct_response` Envoy used as a benchmark upstream.

Stdlib only. Shared by tests/e2e (pytest), scripts/demo.py and scripts/bench.py.
Everything listens on 127.0.0.1 on ports picked at runtime, and every process started
here is stopped by `stop()` (its whole process group).

One module per component; every public name is re-exported here, so `import stack` (with
scripts/ on sys.path) and `stack.X` are all a caller needs:

    common        REPO, ENVOY, WASM, StackError, the setup and build hints
    http          the loopback HTTP client (request, Response), free ports
    procs         Proc (a child in its own process group), wait_until, work dirs, RSS
    upstream      Upstream: the demo upstream (examples/upstream.py)
    envoy_config  Envoy bootstrap configs: the idem filter, routes, listeners, clusters
    envoy         Envoy: the process, its admin; start_idem_envoy, start_fast_upstream, start_fleet
    redis         Redis, Webdis, redis_command, the policy `[redis]` table and Webdis cluster
    redis_cluster RedisCluster (six nodes), ClusterStore (Envoy redis_proxy + Webdis in front of it)
    wrk           run_wrk, parse_wrk, the Lua scripts
    examples      examples/*.yaml with their ports rewritten
"""

from .common import (ARTIFACT, BUILD_HINT, ENVOY, NATIVE, NATIVE_MODULE, REPO, SETUP_HINT, WASM, StackError,
                     shipped_policies)
from .envoy import Envoy, check_upstream_reuse, envoy_executable, require_envoy, require_wasm, start_fast_upstream, start_fleet, start_idem_envoy
from .envoy_config import (DEFAULT_ROUTES, ECHO, ECHO_PATH, ENABLE_IDEM, INTERNAL_LISTENER_EXTENSION, REENTRY,
                           cluster, direct_response_config, echo_cluster, echo_listener, echo_route, idem_config,
                           listener, reentry_cluster, reentry_listener, native_filter, route_entry, routes_from_policy, wasm_filter)
from .examples import (as_native, EXAMPLE_GRPC_SERVICE, EXAMPLE_GRPC_YAML, EXAMPLE_PORTS, EXAMPLE_REDIS_YAML, EXAMPLE_WASM,
                       EXAMPLE_YAML, example_config_text, example_grpc_config_text, example_redis_config_text,
                       rewrite_example)
from .http import DEFAULT_AUTH, Response, free_port, port_is_free, request
from .procs import Proc, make_workdir, rss_bytes, wait_until
from .redis import (EVICTS_LOG, TOKEN_SECRET, REDIS_ADMIN, REDIS_DEFAULT_USER_ACL, REDIS_PASSWORD, REDIS_SERVER, WEBDIS, WEBDIS_AUTH,
                    WEBDIS_JSON, Redis, RedisError, Webdis, redis_command, redis_table, require_redis,
                    webdis_cluster, webdis_config)
from .redis_cluster import (CLUSTER_ADMIN, CLUSTER_DIR, CLUSTER_IDEM_USER, CLUSTER_PASSWORD_ENV, ClusterStore,
                            RedisCluster, direct_cluster_lines, redis_proxy_config_text)
from .upstream import UPSTREAM_PY, Upstream
from .wrk import WRK, WRK_SCRIPTS, parse_wrk, require_wrk, run_wrk

__all__ = [
    # common
    "REPO", "ENVOY", "WASM", "SETUP_HINT", "BUILD_HINT", "StackError",
    # http
    "DEFAULT_AUTH", "Response", "request", "free_port", "port_is_free",
    # procs
    "Proc", "wait_until", "make_workdir", "rss_bytes",
    # upstream
    "UPSTREAM_PY", "Upstream",
    # envoy_config
    "DEFAULT_ROUTES", "ENABLE_IDEM", "wasm_filter", "route_entry", "routes_from_policy", "listener", "cluster", "idem_config",
    "INTERNAL_LISTENER_EXTENSION", "REENTRY", "reentry_listener", "reentry_cluster", "ECHO", "ECHO_PATH",
    "echo_route", "echo_listener", "echo_cluster",
    "direct_response_config",
    # envoy
    "Envoy", "check_upstream_reuse", "envoy_executable", "require_envoy", "require_wasm", "start_idem_envoy", "start_fast_upstream", "start_fleet",
    # redis
    "EVICTS_LOG", "TOKEN_SECRET", "REDIS_SERVER", "WEBDIS", "WEBDIS_JSON", "REDIS_PASSWORD", "WEBDIS_AUTH", "REDIS_DEFAULT_USER_ACL", "REDIS_ADMIN",
    "Redis", "RedisError", "redis_command", "require_redis", "Webdis", "webdis_config", "webdis_cluster",
    "redis_table",
    # redis_cluster
    "CLUSTER_DIR", "CLUSTER_ADMIN", "CLUSTER_IDEM_USER", "CLUSTER_PASSWORD_ENV", "RedisCluster", "ClusterStore",
    "direct_cluster_lines", "redis_proxy_config_text",
    # wrk
    "WRK", "WRK_SCRIPTS", "require_wrk", "parse_wrk", "run_wrk",
    # examples
    "EXAMPLE_YAML", "EXAMPLE_PORTS", "EXAMPLE_WASM", "EXAMPLE_REDIS_YAML", "EXAMPLE_GRPC_YAML",
    "as_native", "EXAMPLE_GRPC_SERVICE", "example_config_text", "example_redis_config_text", "example_grpc_config_text",
    "rewrite_example",
]
