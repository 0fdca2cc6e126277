"""Envoy bootstrap configs as dicts (Envoy reads JSON as YAML): the idem Wasm filter, the routes
that enable it, loopback listeners and clusters, and the two complete configs the tests, demos and
bench run (idem in front of one cluster; a bare `direct_response` Envoy)."""

from .common import ARTIFACT, NATIVE, NATIVE_MODULE, WASM

# What the configs load unless told otherwise: the .wasm, or the native build's .so with
# IDEM_ARTIFACT=native. A config loads either by its path (`wasm_path=stack.NATIVE`).
DEFAULT_ARTIFACT = NATIVE if ARTIFACT == "native" else WASM


def native_filter(policy_toml, name="idem", disabled=True):
    """The HCM http_filters entry for idem's native build (an Envoy dynamic module): the same policy
    text, as the config's `filter_config`; `filter_name` is what the .wasm's plugin name is."""
    return {
        "name": name,
        "disabled": disabled,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
            "dynamic_module_config": {"name": NATIVE_MODULE},
            "filter_name": "idem",
            "filter_config": {"@type": "type.googleapis.com/google.protobuf.StringValue", "value": policy_toml},
        },
    }


def wasm_filter(policy_toml, wasm_path, name="idem", disabled=True):
    """The HCM http_filters entry for idem. Declared disabled; routes with a policy enable it. A `.so`
    path is the native build: its dynamic-module entry instead."""
    if str(wasm_path).endswith(".so"):
        return native_filter(policy_toml, name=name, disabled=disabled)
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


def routes_from_policy(policy_toml, envoy=None, after=(), **defaults):
    """The Envoy route table a policy needs, so a test writes its routes once (in the policy):
    each `[[route]]` with a `match.path` becomes an Envoy route of the same name with the filter
    on — exact for a plain path, a prefix up to a template's first `{` or `*` — and a token
    route's `issue_path` one named `<route>-issue`; exact ones first, so no prefix shadows them. `envoy[name]` is merged into a route's row (a `timeout`, or the
    `match` of a policy that matches by Envoy route name); `defaults` go into every row; the
    rows of `after` (a catch-all, say) follow."""
    import tomllib
    envoy = envoy or {}
    exact, prefixes, seen = [], [], set()
    for route in tomllib.loads(policy_toml).get("route", []):
        name = route["name"]
        row = {"name": name, "idem": True, **defaults}
        path = route.get("match", {}).get("path")
        if path is not None:
            cut = min([i for i in (path.find("{"), path.find("*")) if i >= 0], default=-1)
            row["match"] = {"path": path} if cut < 0 else {"prefix": path[:cut]}
        row.update(envoy.get(name, {}))
        if "match" not in row:
            raise ValueError("policy route %r matches no path: give its Envoy match in envoy[%r]" % (name, name))
        rows = [row]
        issue_path = route.get("token", {}).get("issue_path")
        if issue_path is not None:
            rows.append({"name": name + "-issue", "idem": True, **defaults, "match": {"path": issue_path}})
        for row in rows:
            key = tuple(sorted(row["match"].items()))
            if key not in seen:
                seen.add(key)
                (exact if "path" in row["match"] else prefixes).append(row)
    unknown = set(envoy) - {r["name"] for r in exact + prefixes}
    if unknown:
        raise ValueError("envoy options for routes the policy does not have: %s" % ", ".join(sorted(unknown)))
    return exact + prefixes + list(after)


def route_entry(spec, cluster="demo_upstream"):
    """An Envoy route from a test's table row: `name`, `match`, `idem` (enable the filter), and
    optionally `timeout`, `cluster`, `direct_response`, `route_options` (merged into `route`:
    rewrites, retry policy) and the route's `request_headers_to_add` / `_remove`."""
    r = {"name": spec["name"], "match": spec["match"]}
    if "direct_response" in spec:
        r["direct_response"] = spec["direct_response"]
    else:
        r["route"] = {"cluster": spec.get("cluster", cluster), "timeout": spec.get("timeout", "15s")}
        r["route"].update(spec.get("route_options", {}))
    for field in ("request_headers_to_add", "request_headers_to_remove"):
        if field in spec:
            r[field] = spec[field]
    if spec.get("idem"):
        r["typed_per_filter_config"] = ENABLE_IDEM
    return r


def hcm(stat_prefix, routes, http_filters, route_config_name):
    """An HTTP connection manager routing `routes` through `http_filters` and the router."""
    return {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                     ".HttpConnectionManager",
            "stat_prefix": stat_prefix,
            "codec_type": "AUTO",
            # Route on the normalised path (RFC 3986 dot segments, `//`), as examples/envoy.yaml
            # does: an alias such as /api//order/create must not slip past a route's policy.
            "normalize_path": True,
            "merge_slashes": True,
            # HTTP/1 trailers (gRPC's status) are dropped unless enabled on both sides.
            "http_protocol_options": {"enable_trailers": True},
            "route_config": {"name": route_config_name, "virtual_hosts": [
                {"name": stat_prefix, "domains": ["*"], "routes": routes}]},
            "http_filters": list(http_filters) + [{
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            }],
        },
    }


def listener(name, port, routes, http_filters, stat_prefix=None):
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [hcm(stat_prefix or name, routes, http_filters, name + "_routes")]}],
    }


# Detached forwarding re-enters Envoy here (`[detached] via = "reentry"`, the filter's default): an
# internal listener (no socket: only the cluster below reaches it) whose connection manager has the
# same routes and the filters that come after idem — never idem itself, and not the filters before
# it, which the request has already passed. Its HCM keeps Envoy's defaults (no use_remote_address),
# so the request keeps the headers the outer listener gave it: the service sees what inline sees.
REENTRY = "idem_reentry"
INTERNAL_LISTENER_EXTENSION = {
    "name": "envoy.bootstrap.internal_listener",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.bootstrap.internal_listener.v3.InternalListener"},
}


def reentry_listener(routes, post_filters=()):
    return {"name": REENTRY, "internal_listener": {},
            "filter_chains": [{"filters": [hcm("reentry", routes, post_filters, "reentry_routes")]}]}


def internal_cluster(name):
    """A cluster whose endpoint is the internal listener `name`, over HTTP/2 (trailers — a gRPC
    call's status — cross it)."""
    return {
        "name": name,
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "envoy_internal_address": {"server_listener_name": name}}}}]}]},
        "circuit_breakers": {"thresholds": [{"max_connections": 4096, "max_pending_requests": 4096,
                                             "max_requests": 4096}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}},
    }


def reentry_cluster():
    return internal_cluster(REENTRY)


# gRPC replays go through the echo listener (`[grpc] replay = "echo"`, the filter's default): a local
# reply to a gRPC call can only be trailers-only, so the gateway sends the repeat on to
# ECHO_PATH with its stored answer in a replay slot, and idem with `role = "echo"` answers it
# there (the same VM, so the same shared data); the gateway adds the trailers to that answer.
ECHO = "idem_echo"
ECHO_PATH = "/.idem/replay"


def echo_route():
    """The route that sends replays to the echo, first in a virtual host (idem enabled, so the
    replaying stream keeps its filter on the new route)."""
    return {"name": "idem-echo", "match": {"prefix": ECHO_PATH}, "route": {"cluster": ECHO, "timeout": "15s"},
            "typed_per_filter_config": ENABLE_IDEM}


def echo_listener(wasm_path):
    echo = wasm_filter('role = "echo"\n', wasm_path, disabled=False)
    routes = [{"name": "echo", "match": {"prefix": "/"}, "direct_response": {"status": 404}}]
    listener = {"name": ECHO, "internal_listener": {},
                "filter_chains": [{"filters": [hcm("echo", routes, [echo], "echo_routes")]}]}
    # The echo reads nothing of a replay's body; a large replayed answer must fit its buffer.
    listener["per_connection_buffer_limit_bytes"] = 16 << 20
    return listener


def echo_cluster():
    return internal_cluster(ECHO)


def idem_admin_listener(wasm_path, port, secret):
    """The operator's listener for the shared store (`role = "admin"`, docs/unknown-outcomes.md):
    on loopback, its own port, the same plugin name and vm_id as the gateway (so the same shared
    data and namespace). Every request is answered by the filter; the route is never reached."""
    admin = wasm_filter('role = "admin"\n\n[admin]\nsecret = "%s"\n' % secret, wasm_path, disabled=False)
    routes = [{"name": "idem-admin", "match": {"prefix": "/"}, "direct_response": {"status": 404}}]
    return listener("idem_admin", port, routes, [admin])


def cluster(name, port, http2=False):
    protocol = {"http2_protocol_options": {}} if http2 else {"http_protocol_options": {"enable_trailers": True}}
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
            "socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]},
        # Tests fire 100+ concurrent requests; the default circuit breakers (1024) are fine but be explicit.
        # Retries (a sidecar's) are limited to 3 at once by default: a burst's retries would overflow.
        "circuit_breakers": {"thresholds": [{"max_connections": 4096, "max_pending_requests": 4096,
                                             "max_requests": 4096, "max_retries": 4096}]},
        "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": protocol}},
    }


def idem_config(*, listen_port, admin_port, upstream_port, policy_toml, routes=None, wasm_path=None,
                with_filter=True, extra_clusters=(), pre_filters=(), post_filters=(), upstream_http2=False,
                idem_admin=None):
    """A complete Envoy bootstrap (as a dict; Envoy reads JSON as YAML) with idem in front of one cluster,
    and the internal listener detached requests re-enter through. `pre_filters` run before idem (e.g.
    jwt_authn, whose verified claims a scope can name), `post_filters` after it (on both listeners).
    `idem_admin = (port, secret)` adds the operator's listener."""
    routes = DEFAULT_ROUTES if routes is None else routes
    filters = list(pre_filters) + ([wasm_filter(policy_toml, wasm_path or DEFAULT_ARTIFACT)] if with_filter else [])
    if not with_filter:
        routes = [dict(r, idem=False) for r in routes]
    entries = [route_entry(r) for r in routes]
    listeners = [listener("ingress", listen_port, ([echo_route()] if with_filter else []) + entries,
                          filters + list(post_filters)),
                 reentry_listener(entries, post_filters)]
    clusters = [cluster("demo_upstream", upstream_port, http2=upstream_http2), reentry_cluster()]
    if with_filter:
        listeners.append(echo_listener(wasm_path or DEFAULT_ARTIFACT))
        clusters.append(echo_cluster())
    if idem_admin:
        listeners.append(idem_admin_listener(wasm_path or DEFAULT_ARTIFACT, *idem_admin))
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "stats_config": STATS_CONFIG,
        "bootstrap_extensions": [INTERNAL_LISTENER_EXTENSION],
        "static_resources": {"listeners": listeners, "clusters": clusters + list(extra_clusters)},
    }


# Envoy's tag extraction for idem's counters (`route=.=<r>;.;outcome=.=<o>;.;idem_requests_total`):
# each regex's first group is cut from the name, its second is the tag's value, so Prometheus sees
# `idem_requests_total{route, outcome}`. The same block is in examples/envoy.yaml.
STATS_CONFIG = {"stats_tags": [
    {"tag_name": "route", "regex": r"(route=\.=(.+?);\.;)"},
    {"tag_name": "outcome", "regex": r"(outcome=\.=(.+?);\.;)"},
]}


# The benchmark upstream reads the whole request before it answers, as a real service does. Without
# it, a direct_response answers at the request's headers; the gateway's router then sees a complete
# response to an incomplete request and closes the upstream connection: every request paid a TCP
# connect and close (16 % of plain Envoy's CPU in `perf record`), which no gateway in front of a real
# service pays.
BUFFER_FILTER = {
    "name": "envoy.filters.http.buffer",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
                     "max_request_bytes": 1048576},
}


def direct_response_config(*, listen_port, admin_port, body='{"ok":true}'):
    """A bare Envoy answering every request itself: a benchmark upstream that is never the bottleneck."""
    routes = [{"name": "direct", "match": {"prefix": "/"},
               "direct_response": {"status": 200, "body": {"inline_string": body}},
               "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"}}]}]
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": [listener("fast", listen_port, routes, [BUFFER_FILTER])]},
    }
