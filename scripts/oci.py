#!/usr/bin/env python3
"""Package the built filter as the two OCI image shapes that Istio's and Envoy Gateway's Wasm image
fetchers accept, in one OCI image layout, and optionally push both (`make oci`).

    .venv/bin/python scripts/oci.py                                 # make oci
    .venv/bin/python scripts/oci.py --push REGISTRY/REPO:TAG        # make oci PUSH=REGISTRY/REPO:TAG
    .venv/bin/python scripts/oci.py --push 127.0.0.1:5000/idem:dev --tls-verify=false

The layout is target/oci/idem (`--out DIR` puts it in DIR/idem), with two tags:

  oci     the Wasm OCI artifact ("oci" variant of the solo-io Wasm image spec, as `wasme push` made
          it): config and first layer runtime-config.json (application/vnd.module.wasm.config.v1+json),
          second layer the .wasm itself (application/vnd.module.wasm.content.layer.v1+wasm). The
          fetchers of Istio (pkg/wasm/imagefetcher.go) and Envoy Gateway (internal/wasm/imagefetcher.go)
          require exactly two layers, one of them of that content media type; the layer's digest is
          the sha256 of the .wasm.
  compat  a plain OCI image ("compat" variant): one application/vnd.oci.image.layer.v1.tar+gzip layer
          whose tar holds only plugin.wasm, and the manifest annotation
          module.wasm.image/variant=compat. For registries that refuse custom media types.

Built with tools, not by hand: umoci (Debian) builds the compat image; oras (PyPI, the pinned
oras-py of scripts/setup.sh) pushes the artifact to a throwaway docker-registry (Debian) on a free
127.0.0.1 port, and skopeo (Debian) copies it from there into the layout and pushes both tags with
--preserve-digests. Timestamps are fixed (SOURCE_DATE_EPOCH, default 0), so the same .wasm gives the
same manifest digests.

--push REGISTRY/REPO:TAG pushes `oci` to REGISTRY/REPO:TAG and `compat` to REGISTRY/REPO:TAG-compat
(credentials: `skopeo login REGISTRY` first). For each shape it prints the wasm's sha256, the layer
digest and the manifest digest; the manifest digest is what Istio's WasmPlugin and Envoy Gateway pin
(`url: oci://REGISTRY/REPO@sha256:<hex>`, or `sha256: <hex>`).
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WASM = Path(os.environ.get("IDEM_WASM", REPO / "target" / "wasm32-wasip1" / "release" / "idem_filter.wasm"))
OUT = REPO / "target" / "oci"
LAYOUT_NAME = "idem"
ORAS_VERSION = "0.2.43"  # keep in step with scripts/setup.sh

# Media types and annotations, as the fetchers and the spec name them.
WASM_CONFIG_TYPE = "application/vnd.module.wasm.config.v1+json"
WASM_CONTENT_TYPE = "application/vnd.module.wasm.content.layer.v1+wasm"
OCI_MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_TARGZ_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
DOCKER_MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
VARIANT_ANNOTATION = "module.wasm.image/variant"
TITLE_ANNOTATION = "org.opencontainers.image.title"
PLUGIN_FILE = "plugin.wasm"          # the compat layer's file (fixed by the spec and the fetchers)
FILTER_FILE = "filter.wasm"          # the oci variant's layer title (as wasme named it)
RUNTIME_CONFIG_FILE = "runtime-config.json"
ROOT_ID = "idem"                     # the root_id of examples/envoy.yaml (metadata only)

SETUP_HINT = "run `make setup` (or `bash scripts/setup.sh`)"
TOOLS = (("umoci", "umoci"), ("skopeo", "skopeo"), ("docker-registry", "docker-registry"))


class OciError(RuntimeError):
    """A tool is missing or a step failed; the message says which and what to do."""


def require_tools():
    """Raise OciError naming every missing tool, its package, and how to install it."""
    problems = []
    for binary, package in TOOLS:
        if shutil.which(binary) is None:
            problems.append("%s not found: %s (it installs the Debian package %s: apt-get install -y %s)"
                            % (binary, SETUP_HINT, package, package))
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            have = version("oras")
        except PackageNotFoundError:
            have = None
        if have != ORAS_VERSION:
            problems.append("the Python package oras==%s is %s in %s: %s (or .venv/bin/pip install oras==%s)"
                            % (ORAS_VERSION, "missing" if have is None else "at %s" % have, sys.prefix,
                               SETUP_HINT, ORAS_VERSION))
    except ImportError:  # pragma: no cover - Python < 3.8
        problems.append("Python >= 3.8 is needed")
    if problems:
        raise OciError("\n".join(problems))


def run(argv, **kw):
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise OciError("`%s` failed (exit %d):\n%s%s" % (" ".join(str(a) for a in argv), r.returncode,
                                                          r.stdout, r.stderr))
    return r.stdout


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """Debian's docker-registry (distribution 2.x) on a free 127.0.0.1 port, its filesystem storage
    and config in `workdir`; stopped (its process group) by stop() or at the end of a `with`."""

    def __init__(self, workdir, timeout=15.0):
        binary = shutil.which("docker-registry")
        if binary is None:
            raise OciError("docker-registry not found: %s (it installs the Debian package docker-registry: "
                           "apt-get install -y docker-registry)" % SETUP_HINT)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.host = "127.0.0.1:%d" % self.port
        self.config_path = self.workdir / "registry.yml"
        self.log_path = self.workdir / "registry.log"
        storage = self.workdir / "storage"
        storage.mkdir(exist_ok=True)
        # JSON strings are YAML strings: paths are quoted whatever they contain.
        self.config_path.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
            "storage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\n"
            "http:\n  addr: %s\n  secret: %s\n"
            % (json.dumps(str(storage)), json.dumps(self.host), json.dumps(secrets.token_hex(16))))
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([binary, "serve", str(self.config_path)], stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise OciError("docker-registry exited (%s) at start:\n%s" % (self.proc.returncode, self.log_tail()))
            try:
                with urllib.request.urlopen("http://%s/v2/" % self.host, timeout=1.0) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise OciError("docker-registry did not answer on %s within %.0f s:\n%s"
                               % (self.host, timeout, self.log_tail()))
            time.sleep(0.05)

    def log_tail(self, lines=20):
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# ---------------------------------------------------------------------------------------- layout

def read_layout(layout):
    """{tag: (manifest digest, manifest bytes)} of an OCI image layout, every digest re-hashed."""
    index = json.loads((layout / "index.json").read_text())
    out = {}
    for desc in index.get("manifests", []):
        tag = (desc.get("annotations") or {}).get("org.opencontainers.image.ref.name")
        data = blob(layout, desc["digest"])
        if len(data) != desc["size"]:
            raise OciError("%s: manifest %s is %d bytes, index says %d" % (layout, desc["digest"], len(data),
                                                                        desc["size"]))
        out[tag] = (desc["digest"], data)
    return out


def blob(layout, digest):
    algo, hexd = digest.split(":", 1)
    data = (layout / "blobs" / algo / hexd).read_bytes()
    if algo != "sha256" or sha256_hex(data) != hexd:
        raise OciError("%s: blob %s does not match its digest" % (layout, digest))
    return data


def tar_members(targz):
    """[(name, bytes)] of a tar+gzip layer, reading it strictly (a truncated tar is an error)."""
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(targz)), mode="r:") as tf:
        return [(m.name, tf.extractfile(m).read() if m.isfile() else None) for m in tf.getmembers()]


def expect(cond, what):
    if not cond:
        raise OciError(what)


def check_oci_variant(manifest, wasm):
    """The checks of Istio's extractOCIArtifactImage (and the spec): an OCI (not Docker) manifest,
    exactly two layers, one of them the raw .wasm with the wasm content media type."""
    wasm_digest = "sha256:" + sha256_hex(wasm)
    expect(manifest.get("mediaType") == OCI_MANIFEST_TYPE, "manifest media type %r" % manifest.get("mediaType"))
    expect(manifest["config"]["mediaType"] == WASM_CONFIG_TYPE, "config %r" % manifest["config"])
    layers = manifest["layers"]
    expect(len(layers) == 2, "the oci variant needs exactly two layers, has %d" % len(layers))
    expect([x["mediaType"] for x in layers] == [WASM_CONFIG_TYPE, WASM_CONTENT_TYPE], "layers %r" % layers)
    content = layers[1]
    expect(content["digest"] == wasm_digest and content["size"] == len(wasm),
           "the wasm layer is %s (%d bytes), the .wasm %s (%d bytes)"
           % (content["digest"], content["size"], wasm_digest, len(wasm)))
    return content


def check_compat_variant(manifest, layer_bytes, wasm):
    """The checks of Istio's extractOCIStandardImage (and the compat spec): one tar+gzip layer whose
    tar holds exactly plugin.wasm, the variant annotation on the manifest."""
    expect(manifest.get("mediaType", OCI_MANIFEST_TYPE) == OCI_MANIFEST_TYPE,
           "manifest media type %r" % manifest.get("mediaType"))
    expect(manifest["config"]["mediaType"] == OCI_CONFIG_TYPE, "config %r" % manifest["config"])
    expect((manifest.get("annotations") or {}).get(VARIANT_ANNOTATION) == "compat",
           "annotations %r" % manifest.get("annotations"))
    layers = manifest["layers"]
    expect(len(layers) == 1 and layers[0]["mediaType"] == OCI_LAYER_TARGZ_TYPE, "layers %r" % layers)
    members = tar_members(layer_bytes)
    expect([name for name, _ in members] == [PLUGIN_FILE], "the layer holds %r" % [n for n, _ in members])
    expect(members[0][1] == wasm, "plugin.wasm in the layer differs from the .wasm")
    return layers[0]


# ------------------------------------------------------------------------------------------ build

def abi_versions(wasm):
    """The proxy-wasm ABI versions the module exports (proxy_abi_version_0_2_1, ...)."""
    found = sorted(set(m.decode() for m in re.findall(rb"proxy_abi_version_[0-9]+_[0-9]+_[0-9]+", wasm)))
    if not found:
        raise OciError("the module exports no proxy_abi_version_* function: is it a proxy-wasm filter?")
    return found


def build_compat(layout, work, wasm, epoch):
    """umoci: an empty image, plugin.wasm added to its rootfs, repacked as one layer."""
    created = datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    image = "%s:compat" % layout
    rootless = ["--rootless"] if os.geteuid() != 0 else []
    bundle = work / "bundle"
    run(["umoci", "init", "--layout", layout])
    run(["umoci", "new", "--image", image])
    run(["umoci", "unpack"] + rootless + ["--image", image, bundle])
    rootfs = bundle / "rootfs"
    before = rootfs.stat()
    target = rootfs / PLUGIN_FILE
    target.write_bytes(wasm)
    target.chmod(0o644)
    os.utime(target, (epoch, epoch))
    os.utime(rootfs, ns=(before.st_atime_ns, before.st_mtime_ns))  # the layer holds plugin.wasm only
    # `umoci repack`, not `umoci insert`: insert in umoci < 0.4.8 leaves the layer's tar without its
    # end-of-archive blocks (opencontainers/umoci#436, fixed by #534), which GNU tar and Python reject.
    run(["umoci", "repack", "--history.created", created, "--history.created_by", "scripts/oci.py: plugin.wasm",
         "--image", image, bundle])
    run(["umoci", "config", "--image", image, "--no-history", "--created", created, "--architecture", "wasm",
         "--os", "wasip1", "--manifest.annotation", "%s=compat" % VARIANT_ANNOTATION])
    run(["umoci", "gc", "--layout", layout])
    shutil.rmtree(bundle)


def build_oci_variant(layout, work, wasm, runtime_config):
    """oras-py pushes the artifact (as `wasme push` did: config = runtime-config.json, layers =
    [runtime-config.json, filter.wasm]) to a throwaway loopback registry; skopeo copies it into the
    layout with its digests preserved."""
    import oras.provider  # the pinned PyPI oras (oras-py); checked by require_tools()

    stage = work / "stage"
    stage.mkdir()
    cfg = stage / RUNTIME_CONFIG_FILE
    cfg.write_bytes(runtime_config)
    mod = stage / FILTER_FILE
    mod.write_bytes(wasm)
    annotations = {"module.wasm.runtime/type": "envoy_proxy",  # as `wasme push` annotated it
                   "module.wasm.runtime/abi_version": ",".join(json.loads(runtime_config)["abiVersions"])}
    with Registry(work / "registry") as reg:
        ref = "%s/idem:oci" % reg.host
        client = oras.provider.Registry(hostname=reg.host, insecure=True)
        resp = client.push(
            ref,
            files=["%s:%s" % (cfg, WASM_CONFIG_TYPE), "%s:%s" % (mod, WASM_CONTENT_TYPE)],
            manifest_config="%s:%s" % (cfg, WASM_CONFIG_TYPE),
            manifest_annotations=annotations,
            disable_path_validation=True,
            quiet=True,
        )
        pushed = resp.headers.get("Docker-Content-Digest")
        digestfile = work / "oci.digest"
        run(["skopeo", "copy", "--quiet", "--preserve-digests", "--src-tls-verify=false",
             "--digestfile", digestfile, "docker://" + ref, "oci:%s:oci" % layout])
        copied = digestfile.read_text().strip()
        if pushed != copied:
            raise OciError("the artifact's manifest changed on its way into the layout: oras pushed %s, "
                           "skopeo wrote %s" % (pushed, copied))
    shutil.rmtree(stage)


def build(wasm_path=WASM, out=OUT):
    """Build both shapes into OUT/idem; return the description of each (see describe())."""
    wasm_path = Path(wasm_path)
    if not wasm_path.is_file():
        raise OciError("%s is missing: build it with `make build` (or `cargo build --release --target "
                       "wasm32-wasip1 -p idem-filter`)" % wasm_path)
    require_tools()
    wasm = wasm_path.read_bytes()
    if wasm[:4] != b"\0asm":
        raise OciError("%s is not a WebAssembly module" % wasm_path)
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    runtime_config = json.dumps({"type": "envoy_proxy", "abiVersions": abi_versions(wasm),
                                 "config": {"rootIds": [ROOT_ID]}}, separators=(",", ":")).encode()
    out = Path(out)
    layout = out / LAYOUT_NAME
    work = out / "work"
    for d in (layout, work):
        if d.exists():
            shutil.rmtree(d)
    work.mkdir(parents=True)
    # umoci first: it owns the layout it creates; skopeo then adds the artifact beside it.
    build_compat(layout, work, wasm, epoch)
    build_oci_variant(layout, work, wasm, runtime_config)
    shutil.rmtree(work)
    return describe(layout, wasm_path)


def describe(layout, wasm_path):
    """Verify both tags of the layout against the .wasm; {shape: {...digests...}}."""
    wasm = Path(wasm_path).read_bytes()
    tags = read_layout(layout)
    if set(tags) != {"oci", "compat"}:
        raise OciError("%s has tags %s, expected oci and compat" % (layout, sorted(tags)))
    result = {"wasm": {"path": str(wasm_path), "sha256": sha256_hex(wasm), "size": len(wasm)}, "layout": str(layout)}
    for tag, (digest, raw) in sorted(tags.items()):
        manifest = json.loads(raw)
        try:
            if tag == "oci":
                layer = check_oci_variant(manifest, wasm)
            else:
                layer = check_compat_variant(manifest, blob(layout, manifest["layers"][0]["digest"]), wasm)
        except (OciError, KeyError, IndexError, tarfile.TarError, OSError) as e:
            raise OciError("%s:%s is not the shape the Wasm image fetchers accept: %s" % (layout, tag, e))
        result[tag] = {"manifest": digest, "layer": layer["digest"], "layer_media_type": layer["mediaType"],
                       "layer_size": layer["size"]}
    return result


# ------------------------------------------------------------------------------------------- push

def split_ref(ref):
    """REGISTRY/REPO:TAG -> (REGISTRY/REPO, TAG); a tag is required, a digest is refused."""
    if "@" in ref:
        raise OciError("--push takes REGISTRY/REPO:TAG, not a digest: %s" % ref)
    name, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag or not name or "/" not in name:
        raise OciError("--push takes REGISTRY/REPO:TAG (e.g. ghcr.io/acme/idem:1.0.0), got %r" % ref)
    return name, tag


def push(layout, ref, tls_verify=True, work=None):
    """skopeo copy both tags, digests preserved: oci -> REF, compat -> REF-compat. {shape: (dest, digest)}."""
    name, tag = split_ref(ref)
    tls = [] if tls_verify else ["--dest-tls-verify=false"]
    pushed = {}
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        for shape, dest in (("oci", "%s:%s" % (name, tag)), ("compat", "%s:%s-compat" % (name, tag))):
            digestfile = Path(tmp) / shape
            run(["skopeo", "copy", "--quiet", "--preserve-digests"] + tls
                + ["--digestfile", digestfile, "oci:%s:%s" % (layout, shape), "docker://" + dest])
            pushed[shape] = (dest, digestfile.read_text().strip())
    return pushed


# ------------------------------------------------------------------------------------------- main

def print_result(result, pushed=None):
    w = result["wasm"]
    print("wasm    sha256:%s  %s (%d bytes)" % (w["sha256"], w["path"], w["size"]))
    for shape in ("oci", "compat"):
        r = result[shape]
        print("%-7s layout   %s:%s" % (shape, result["layout"], shape))
        print("%-7s layer    %s  %s (%d bytes%s)" % (shape, r["layer"], r["layer_media_type"], r["layer_size"],
                                                       "" if shape == "oci" else ", holds plugin.wasm"))
        print("%-7s manifest %s" % (shape, r["manifest"]))
        if pushed:
            dest, digest = pushed[shape]
            repo = dest.rpartition(":")[0]
            print("%-7s pushed   %s  pin: oci://%s@%s" % (shape, dest, repo, digest))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wasm", default=str(WASM), help="the filter module (default: %(default)s)")
    ap.add_argument("--out", default=str(OUT), help="where the layout goes, as OUT/idem (default: %(default)s)")
    ap.add_argument("--push", metavar="REGISTRY/REPO:TAG", help="push oci to TAG and compat to TAG-compat")
    ap.add_argument("--tls-verify", default="true", choices=["true", "false"],
                    help="false for a plain-http registry (default: true)")
    args = ap.parse_args(argv)
    try:
        if args.push:
            split_ref(args.push)  # refuse a bad reference before building
        result = build(args.wasm, args.out)
        pushed = push(Path(result["layout"]), args.push, args.tls_verify == "true") if args.push else None
        if pushed:
            for shape, (dest, digest) in pushed.items():
                if digest != result[shape]["manifest"]:
                    raise OciError("%s was pushed as %s, but the layout's manifest is %s"
                                   % (dest, digest, result[shape]["manifest"]))
    except OciError as e:
        print("oci: %s" % e, file=sys.stderr)
        return 1
    print_result(result, pushed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
