"""`make oci` round-trips through a registry: scripts/oci.py (what `make oci` runs) builds both image
shapes of the filter and pushes them to Debian's docker-registry on 127.0.0.1; they are pulled back
with other clients (skopeo into a fresh OCI layout, by digest; oras-py for the artifact) and checked
against what Istio's and Envoy Gateway's Wasm image fetchers require (istio/istio
pkg/wasm/imagefetcher.go, envoyproxy/gateway internal/wasm/imagefetcher.go):

  oci     exactly two layers; one application/vnd.module.wasm.content.layer.v1+wasm whose blob is
          the .wasm itself (digest = sha256 of the .wasm); the last layer not tar+gzip (the fetchers
          try the compat shape first)
  compat  one application/vnd.oci.image.layer.v1.tar+gzip layer whose tar holds exactly plugin.wasm,
          manifest annotation module.wasm.image/variant=compat, not a Docker manifest

and the manifest digests the script prints are the registry's Docker-Content-Digest (what Istio's
WasmPlugin `sha256` and the `@sha256:` of its url pin). A missing tool is a failure naming it.
"""

import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

import pytest

import oci
import stack

OCI_SCRIPT = stack.REPO / "scripts" / "oci.py"
ACCEPT = ", ".join([oci.OCI_MANIFEST_TYPE, oci.DOCKER_MANIFEST_TYPE])


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def run_script(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, str(OCI_SCRIPT), "--wasm", str(stack.WASM)] + [str(a) for a in args],
                          cwd=str(stack.REPO), capture_output=True, text=True, timeout=timeout, env=env)


def parse_output(stdout):
    """{"wasm": "sha256:..", ("oci", "layer"): "sha256:..", ("oci", "manifest"): .., ("oci", "pushed"): ref}."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"^wasm\s+(sha256:[0-9a-f]{64})\s", line)
        if m:
            out["wasm"] = m.group(1)
            continue
        m = re.match(r"^(oci|compat)\s+(layer|manifest|pushed)\s+(\S+)", line)
        if m:
            out[(m.group(1), m.group(2))] = m.group(3)
    return out


@pytest.fixture(scope="module")
def tools():
    """Fail (never skip) when umoci, skopeo, docker-registry or the pinned oras is missing."""
    try:
        oci.require_tools()
    except oci.OciError as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="module")
def registry(tools, tmp_path_factory):
    """Debian's docker-registry on a free 127.0.0.1 port, filesystem storage in a temp dir."""
    try:
        reg = oci.Registry(tmp_path_factory.mktemp("oci-registry"))
    except oci.OciError as e:
        pytest.fail(str(e), pytrace=False)
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def pushed(registry, tmp_path_factory):
    """`make oci PUSH=<loopback>/idem/filter:e2e` (the layout in a temp dir rather than target/oci)."""
    out = tmp_path_factory.mktemp("oci-out")
    ref = "%s/idem/filter:e2e" % registry.host
    r = run_script("--out", out, "--push", ref, "--tls-verify=false")
    assert r.returncode == 0, "scripts/oci.py failed (%d):\n%s\n%s\nregistry log:\n%s" % (
        r.returncode, r.stdout, r.stderr, registry.log_tail())
    printed = parse_output(r.stdout)
    for key in ("wasm", ("oci", "layer"), ("oci", "manifest"), ("oci", "pushed"),
                ("compat", "layer"), ("compat", "manifest"), ("compat", "pushed")):
        assert key in printed, "scripts/oci.py did not print %r:\n%s" % (key, r.stdout)
    return {"printed": printed, "stdout": r.stdout, "layout": out / "idem", "repo": "%s/idem/filter" % registry.host,
            "host": registry.host}


@pytest.fixture(scope="module")
def wasm():
    return stack.WASM.read_bytes()


def registry_manifest(host, repo_path, reference):
    """GET /v2/<repo>/manifests/<reference>: (Docker-Content-Digest, Content-Type, body)."""
    req = urllib.request.Request("http://%s/v2/%s/manifests/%s" % (host, repo_path, reference),
                                 headers={"Accept": ACCEPT})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers.get("Docker-Content-Digest"), r.headers.get("Content-Type"), r.read()


def skopeo_pull(src, dest_dir, tag):
    """skopeo copy a registry reference into a fresh OCI layout; (manifest, blob reader)."""
    r = subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", "--preserve-digests",
                        "docker://" + src, "oci:%s:%s" % (dest_dir, tag)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "skopeo copy %s failed: %s" % (src, r.stderr)
    index = json.loads((Path(dest_dir) / "index.json").read_text())
    [desc] = [d for d in index["manifests"] if d["annotations"]["org.opencontainers.image.ref.name"] == tag]

    def blob(digest):
        data = (Path(dest_dir) / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()
        assert sha256(data) == digest, "pulled blob %s does not hash to its digest" % digest
        return data

    raw = blob(desc["digest"])
    return desc["digest"], json.loads(raw), blob


# ------------------------------------------------------------------------------------------ tests

def test_printed_digests_are_the_wasm(pushed, wasm):
    p = pushed["printed"]
    assert p["wasm"] == sha256(wasm), "the printed sha256 is not the .wasm's"
    assert p[("oci", "layer")] == sha256(wasm), "the oci variant's wasm layer digest is not the .wasm's sha256"
    assert p[("compat", "layer")] != p[("oci", "layer")]  # the compat layer is the tar+gzip, not the module
    for shape in ("oci", "compat"):
        assert p[(shape, "manifest")] != p[(shape, "layer")]


@pytest.mark.parametrize("shape,tag", [("oci", "e2e"), ("compat", "e2e-compat")])
def test_printed_manifest_digest_is_the_registrys(pushed, shape, tag):
    digest, ctype, body = registry_manifest(pushed["host"], "idem/filter", tag)
    printed = pushed["printed"][(shape, "manifest")]
    assert digest == printed, "registry says %s for :%s, scripts/oci.py printed %s" % (digest, tag, printed)
    assert sha256(body) == printed
    assert ctype == oci.OCI_MANIFEST_TYPE, ctype
    assert pushed["printed"][(shape, "pushed")] == "%s:%s" % (pushed["repo"], tag)
    assert "pin: oci://%s@%s" % (pushed["repo"], printed) in pushed["stdout"]


def test_oci_variant_round_trip(pushed, wasm, tmp_path):
    digest = pushed["printed"][("oci", "manifest")]
    got, manifest, blob = skopeo_pull("%s@%s" % (pushed["repo"], digest), tmp_path / "pulled", "oci")
    assert got == digest
    assert manifest["mediaType"] == oci.OCI_MANIFEST_TYPE
    assert manifest["config"]["mediaType"] == "application/vnd.module.wasm.config.v1+json"
    layers = manifest["layers"]
    # Istio/Envoy Gateway extractOCIArtifactImage: exactly two layers, one of the wasm content type.
    assert [(x["mediaType"], x["annotations"]["org.opencontainers.image.title"]) for x in layers] == [
        ("application/vnd.module.wasm.config.v1+json", "runtime-config.json"),
        ("application/vnd.module.wasm.content.layer.v1+wasm", "filter.wasm"),
    ]
    # ... tried only after the compat shape failed, which looks at the last layer.
    assert layers[-1]["mediaType"] != "application/vnd.oci.image.layer.v1.tar+gzip"
    content = layers[1]
    assert content["digest"] == sha256(wasm) and content["size"] == len(wasm)
    assert blob(content["digest"]) == wasm, "the pulled wasm layer differs from the built .wasm"
    runtime = json.loads(blob(manifest["config"]["digest"]))
    assert runtime["type"] == "envoy_proxy"
    assert "proxy_abi_version_0_2_1" in runtime["abiVersions"]
    assert blob(layers[0]["digest"]) == blob(manifest["config"]["digest"])


def test_oci_variant_pulls_with_oras(pushed, wasm, tmp_path):
    """A second client: oras-py pulls the artifact by tag and writes its layers by title."""
    import oras.provider

    client = oras.provider.Registry(hostname=pushed["host"], insecure=True)
    files = client.pull(target="%s:e2e" % pushed["repo"], outdir=str(tmp_path))
    names = sorted(Path(f).name for f in files)
    assert names == ["filter.wasm", "runtime-config.json"], names
    assert (tmp_path / "filter.wasm").read_bytes() == wasm


def test_compat_variant_round_trip(pushed, wasm, tmp_path):
    digest = pushed["printed"][("compat", "manifest")]
    got, manifest, blob = skopeo_pull("%s@%s" % (pushed["repo"], digest), tmp_path / "pulled", "compat")
    assert got == digest
    # Not a Docker manifest: the fetchers then take the OCI path and try the compat shape first.
    assert manifest.get("mediaType", oci.OCI_MANIFEST_TYPE) == oci.OCI_MANIFEST_TYPE
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    assert manifest["annotations"] == {"module.wasm.image/variant": "compat"}
    layers = manifest["layers"]
    assert [x["mediaType"] for x in layers] == ["application/vnd.oci.image.layer.v1.tar+gzip"]
    assert layers[0]["digest"] == pushed["printed"][("compat", "layer")]
    # A strict tar read: members, their types, and the end-of-archive blocks (a truncated tar fails).
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layers[0]["digest"]))), mode="r:") as tf:
        members = tf.getmembers()
        assert [(m.name, m.isfile()) for m in members] == [("plugin.wasm", True)], [m.name for m in members]
        assert tf.extractfile(members[0]).read() == wasm, "plugin.wasm in the pulled layer differs from the .wasm"
    config = json.loads(blob(manifest["config"]["digest"]))
    assert config["rootfs"]["diff_ids"] == [sha256(gzip.decompress(blob(layers[0]["digest"])))]


def test_build_is_reproducible(pushed, tmp_path):
    """The same .wasm gives the same manifest digests: a pin can be checked by rebuilding."""
    r = run_script("--out", tmp_path)
    assert r.returncode == 0, r.stderr
    again = parse_output(r.stdout)
    for shape in ("oci", "compat"):
        for what in ("layer", "manifest"):
            assert again[(shape, what)] == pushed["printed"][(shape, what)], (shape, what, r.stdout)
    assert ("oci", "pushed") not in again


def test_missing_tools_fail_with_how_to_get_them(tmp_path, tools):
    r = run_script("--out", tmp_path, env={"PATH": str(tmp_path / "empty-bin"), "HOME": str(tmp_path)})
    assert r.returncode == 1
    for package in ("umoci", "skopeo", "docker-registry"):
        assert "%s not found" % package in r.stderr and "apt-get install -y %s" % package in r.stderr, r.stderr
    assert "make setup" in r.stderr
    assert not (tmp_path / "idem").exists()


def test_push_refuses_a_reference_without_tag(tmp_path, tools):
    r = run_script("--out", tmp_path, "--push", "127.0.0.1:5000/idem")
    assert r.returncode == 1 and "REGISTRY/REPO:TAG" in r.stderr, r.stderr
    assert not (tmp_path / "idem").exists()
