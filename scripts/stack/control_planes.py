"""What Istio, Envoy Gateway and Higress make of the shipped examples (examples/istio/,
examples/envoy-gateway/, examples/higress/): the HTTP filter each control plane puts in Envoy's
listener (Wasm, or Envoy Gateway's dynamic module for the native build), written out the way its
translator does, so a real Envoy can run it here without a Kubernetes cluster.

Each function follows the control plane's documented translation (source named per function);
the code source is the local .wasm, as each one's agent or HTTP server ends up serving it, and the
native module is found by name in the stack's ENVOY_DYNAMIC_MODULES_SEARCH_PATH, as in the pod.
"""

import copy
import json
import re
from pathlib import Path

from .common import REPO, WASM, StackError
from .envoy_config import ENABLE_IDEM, STATS_CONFIG, cluster, listener

EXAMPLES = REPO / "examples"
WASM_TYPE = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
STRING_VALUE = "type.googleapis.com/google.protobuf.StringValue"


def load_yaml(path):
    try:
        import yaml  # PyYAML, installed into .venv by scripts/setup.sh
    except ImportError as e:
        raise StackError("PyYAML is missing from .venv; run `make setup`") from e
    return yaml.safe_load(Path(path).read_text())


def struct_json(value):
    """A YAML value as protojson prints the protobuf Struct made from it: integral numbers without
    a fraction, keys sorted, a space after `:` and `,` (protojson's output varies its spacing on
    purpose; the filter must not care)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))


def _local_code(wasm_path):
    return {"local": {"filename": str(wasm_path or WASM)}}


def istio_wasmplugin_filter(doc, wasm_path=None):
    """Istio's WasmPlugin -> Wasm filter (istio/istio pilot/pkg/model/extensions.go,
    convertToWasmPluginWrapper): name `<namespace>.<name>`, root_id = pluginName, pluginConfig as
    protojson in a StringValue, VM with runtime v8 and environment variables, no vm_id, no
    allow_on_headers_stop_iteration. failStrategy FAIL_CLOSE keeps the filter failing closed."""
    meta, spec = doc["metadata"], doc["spec"]
    name = "%s.%s" % (meta["namespace"], meta["name"])
    config = {
        "name": name,
        "root_id": spec.get("pluginName", ""),
        "vm_config": {"runtime": "envoy.wasm.runtime.v8", "code": _local_code(wasm_path),
                      "environment_variables": {"key_values": {"ISTIO_META_WASM_PLUGIN_RESOURCE_VERSION": "1"}}},
    }
    if spec.get("pluginConfig"):
        config["configuration"] = {"@type": STRING_VALUE, "value": struct_json(spec["pluginConfig"])}
    if spec.get("failStrategy", "FAIL_CLOSE") == "FAIL_CLOSE":
        config["failure_policy"] = "FAIL_CLOSED"
    return {"name": name, "typed_config": {"@type": WASM_TYPE, "config": config}}


def istio_envoyfilter_filter(doc, wasm_path=None):
    """Istio's EnvoyFilter with an EXTENSION_CONFIG ADD and an HTTP_FILTER INSERT_BEFORE the router
    (pilot/pkg/networking/core/envoyfilter): the filter named by the insert, with the added
    extension config as its typed config (ECDS delivers exactly that). The istio-agent fetches the
    oci:// code and rewrites it to a local file."""
    patches = doc["spec"]["configPatches"]
    added = {p["patch"]["value"]["name"]: p["patch"]["value"] for p in patches
             if p["applyTo"] == "EXTENSION_CONFIG" and p["patch"]["operation"] == "ADD"}
    inserts = [p["patch"]["value"] for p in patches
               if p["applyTo"] == "HTTP_FILTER" and p["patch"]["operation"] == "INSERT_BEFORE"]
    if len(inserts) != 1 or inserts[0]["name"] not in added:
        raise StackError("expected one HTTP_FILTER insert naming an EXTENSION_CONFIG added by the same EnvoyFilter")
    typed = copy.deepcopy(added[inserts[0]["name"]]["typed_config"])
    typed["config"]["vm_config"]["code"] = _local_code(wasm_path)
    return {"name": inserts[0]["name"], "typed_config": typed}


def envoy_gateway_filter(doc, wasm_path=None, index=0):
    """Envoy Gateway's EnvoyExtensionPolicy -> Wasm filter (envoyproxy/gateway
    internal/xds/translator/wasm.go, buildHCMWasmFilter / wasmConfig; the name from
    internal/gatewayapi irConfigNameForWasm): named
    `envoy.filters.http.wasm/envoyextensionpolicy/<ns>/<name>/wasm/<i>`, disabled on the listener
    and enabled on the policy's routes; vm_id = that IR name; config as raw JSON; fail_open."""
    meta, wasm = doc["metadata"], doc["spec"]["wasm"][index]
    ir_name = "envoyextensionpolicy/%s/%s/wasm/%d" % (meta["namespace"], meta["name"], index)
    config = {
        "name": wasm["name"],
        "vm_config": {"vm_id": ir_name, "runtime": "envoy.wasm.runtime.v8", "code": _local_code(wasm_path)},
        "configuration": {"@type": STRING_VALUE,
                          "value": json.dumps(wasm.get("config", {}), ensure_ascii=False, separators=(",", ":"))},
        "fail_open": bool(wasm.get("failOpen", False)),
    }
    if wasm.get("rootID") is not None:
        config["root_id"] = wasm["rootID"]
    return {"name": "envoy.filters.http.wasm/" + ir_name, "disabled": True,
            "typed_config": {"@type": WASM_TYPE, "config": config}}


DYNAMIC_MODULE_TYPE = "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"


def envoy_gateway_dynamic_module_filter(policy, proxy, index=0):
    """Envoy Gateway's EnvoyExtensionPolicy `dynamicModule` -> dynamic-module filter
    (envoyproxy/gateway internal/gatewayapi envoyextensionpolicy.go, buildDynamicModules, and
    internal/xds/translator/dynamicmodule.go, dynamicModuleConfig): the module must be in the
    EnvoyProxy's `dynamicModules` allowlist, else the policy is refused; the filter is named
    `envoy.filters.http.dynamic_modules/envoyextensionpolicy/<ns>/<name>/dynamic-module/<i>`,
    disabled on the listener and enabled on the policy's routes; the module is loaded by name
    (`libraryName`, else the entry's `name`), with the entry's doNotClose and loadGlobally;
    filter_name = `filterName` (empty when not set); config as raw JSON in a StringValue."""
    meta, dm = policy["metadata"], policy["spec"]["dynamicModule"][index]
    registry = {e["name"]: e for e in (proxy or {}).get("spec", {}).get("dynamicModules", [])}
    entry = registry.get(dm["name"])
    if entry is None:
        raise StackError("dynamic module %r is not registered in the EnvoyProxy dynamicModules allowlist" % dm["name"])
    ir_name = "envoyextensionpolicy/%s/%s/dynamic-module/%d" % (meta["namespace"], meta["name"], index)
    typed = {
        "@type": DYNAMIC_MODULE_TYPE,
        "dynamic_module_config": {"name": entry.get("libraryName") or entry["name"],
                                  "do_not_close": bool(entry.get("doNotClose", False)),
                                  "load_globally": bool(entry.get("loadGlobally", False))},
        "filter_name": dm.get("filterName", ""),
        "terminal_filter": bool(dm.get("terminalFilter", False)),
    }
    if dm.get("config") is not None:
        typed["filter_config"] = {"@type": STRING_VALUE,
                                  "value": json.dumps(dm["config"], ensure_ascii=False, separators=(",", ":"))}
    return {"name": "envoy.filters.http.dynamic_modules/" + ir_name, "disabled": True, "typed_config": typed}


_FILTER_BY_NAME = re.compile(r"^\.\.http_filters\[\?\(@\.name=='([^']+)'\)\]((?:\.\w+)*)$")


def apply_envoy_patch_policy(listener_cfg, doc):
    """Applies an EnvoyPatchPolicy's JSONPatch operations of the form Envoy Gateway documents for
    filters (`jsonPath: ..http_filters[?(@.name=='…')].a.b`, `op: add`, `path: /field`) to a
    listener. Raises when an operation matches nothing: a patch that silently misses is the
    failure this guards against."""
    for patch in doc["spec"]["jsonPatches"]:
        op = patch["operation"]
        m = _FILTER_BY_NAME.match(op.get("jsonPath", ""))
        if op["op"] != "add" or not m or not op["path"].startswith("/"):
            raise StackError("unsupported EnvoyPatchPolicy operation: %r" % op)
        hits = 0
        for chain in listener_cfg["filter_chains"]:
            for f in chain["filters"]:
                for hf in f.get("typed_config", {}).get("http_filters", []):
                    if hf.get("name") != m.group(1):
                        continue
                    target = hf
                    for part in m.group(2).split(".")[1:]:
                        target = target[part]
                    target[op["path"][1:]] = op["value"]
                    hits += 1
        if not hits:
            raise StackError("EnvoyPatchPolicy jsonPath matched no filter: %s" % op["jsonPath"])
    return listener_cfg


def higress_filter(doc, wasm_path=None):
    """Higress' WasmPlugin -> Wasm filter: Higress converts it into Istio's WasmPlugin (name
    `<namespace>.<name>`, root_id = pluginName), with pluginConfig = defaultConfig plus
    `_rules_` made of matchRules (`_match_route_` for ingress rules, `_match_domain_` for domains),
    as Higress' plugin documentation describes the configuration a plugin receives."""
    meta, spec = doc["metadata"], doc["spec"]
    plugin_config = dict(spec.get("defaultConfig") or {}) if not spec.get("defaultConfigDisable") else {}
    rules = []
    for rule in spec.get("matchRules") or []:
        r = dict(rule.get("config") or {})
        if rule.get("ingress"):
            r["_match_route_"] = list(rule["ingress"])
        if rule.get("domain"):
            r["_match_domain_"] = list(rule["domain"])
        rules.append(r)
    if rules:
        plugin_config["_rules_"] = rules
    istio_like = {"metadata": meta, "spec": {"pluginName": spec.get("pluginName", ""), "pluginConfig": plugin_config,
                                             "failStrategy": spec.get("failStrategy", "FAIL_CLOSE")}}
    return istio_wasmplugin_filter(istio_like, wasm_path)


def gateway_config(http_filter, *, listen_port, admin_port, upstream_port, routes, per_route_enable=None,
                   extra_clusters=()):
    """An Envoy bootstrap with one gateway listener running `http_filter`, routes to the upstream,
    and stats tags. `per_route_enable` (a filter name) enables a disabled filter on every route,
    as Envoy Gateway does for the routes of the targeted HTTPRoute."""
    route_entries = []
    for r in routes:
        entry = {"name": r["name"], "match": r["match"], "route": {"cluster": "demo_upstream", "timeout": "15s"}}
        if per_route_enable:
            entry["typed_per_filter_config"] = {per_route_enable: ENABLE_IDEM["idem"]}
        route_entries.append(entry)
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "stats_config": STATS_CONFIG,
        "static_resources": {
            "listeners": [listener("ingress", listen_port, route_entries, [http_filter])],
            "clusters": [cluster("demo_upstream", upstream_port)] + list(extra_clusters),
        },
    }
