"""policies/bundle.schema.json (generated from the filter's policy types, filter/tests/schema.rs
keeps it current) accepts every bundle this repository ships — policies/, the bundles inside the
Envoy examples, the control-plane examples — and refuses what the filter refuses."""

import json
import tomllib

import jsonschema
import pytest

import stack
from stack import control_planes as cp

SCHEMA = json.loads((stack.REPO / "policies" / "bundle.schema.json").read_text())


def validator():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    return jsonschema.Draft202012Validator(SCHEMA)


def envoy_bundle(path):
    """The bundle embedded in an Envoy example (the idem filter's StringValue), as TOML."""
    config = cp.load_yaml(path)
    for listener in config["static_resources"]["listeners"]:
        for f in listener["filter_chains"][0]["filters"]:
            for hf in f["typed_config"].get("http_filters", []):
                if hf["name"] == "idem":
                    return tomllib.loads(hf["typed_config"]["config"]["configuration"]["value"])
    raise AssertionError("no idem filter in %s" % path)


def shipped_bundles():
    out = {str(p.relative_to(stack.REPO)): tomllib.loads(p.read_text())
           for p in (stack.REPO / f for f in stack.shipped_policies())}
    for name in ("envoy.yaml", "envoy-redis.yaml", "grpc/envoy.yaml"):
        out["examples/" + name] = envoy_bundle(cp.EXAMPLES / name)
    out["examples/istio/wasmplugin.yaml"] = cp.load_yaml(cp.EXAMPLES / "istio" / "wasmplugin.yaml")["spec"]["pluginConfig"]
    ef = cp.istio_envoyfilter_filter(cp.load_yaml(cp.EXAMPLES / "istio" / "envoyfilter.yaml"))
    out["examples/istio/envoyfilter.yaml"] = tomllib.loads(ef["typed_config"]["config"]["configuration"]["value"])
    eg = cp.load_yaml(cp.EXAMPLES / "envoy-gateway" / "extension-policy.yaml")
    out["examples/envoy-gateway/extension-policy.yaml"] = eg["spec"]["wasm"][0]["config"]
    egn = cp.load_yaml(cp.EXAMPLES / "envoy-gateway" / "native" / "extension-policy.yaml")
    out["examples/envoy-gateway/native/extension-policy.yaml"] = egn["spec"]["dynamicModule"][0]["config"]
    out["examples/higress/wasmplugin.yaml"] = cp.load_yaml(cp.EXAMPLES / "higress" / "wasmplugin.yaml")["spec"]["defaultConfig"]
    return out


def test_every_shipped_bundle_is_valid():
    v = validator()
    bundles = shipped_bundles()
    assert len(bundles) >= 10, sorted(bundles)
    for name, bundle in bundles.items():
        errors = sorted(v.iter_errors(bundle), key=str)
        assert not errors, "%s: %s" % (name, "; ".join("%s at %s" % (e.message, list(e.absolute_path))
                                                        for e in errors[:3]))


GOOD = {"route": [{"name": "a", "match": {"method": "POST", "path": "/a"}}]}
# Bundles the filter refuses (filter/tests/schema.rs checks that side, with the same file).
REFUSED = json.loads((stack.REPO / "filter" / "tests" / "fixtures" / "refused-bundles.json").read_text())
REFUSED.pop("_comment")


def test_the_good_bundle_is_valid():
    assert validator().is_valid(GOOD)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_schema_refuses_what_the_filter_refuses(case):
    assert not validator().is_valid(REFUSED[case]), "the schema accepts %s: %s" % (case, REFUSED[case])
