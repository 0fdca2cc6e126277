"""What every component module shares: the repository root, the Envoy binary and the built filter
(overridable with IDEM_ENVOY and IDEM_WASM), the error a component raises when it is missing or
does not start, and the hints such an error gives."""

import os
from pathlib import Path

# scripts/stack/common.py -> scripts/stack -> scripts -> the repository.
REPO = Path(__file__).resolve().parents[2]
ENVOY = Path(os.environ.get("IDEM_ENVOY", REPO / ".venv" / "bin" / "envoy"))
WASM = Path(os.environ.get("IDEM_WASM", REPO / "target" / "wasm32-wasip1" / "release" / "idem_filter.wasm"))
# The native build (an Envoy dynamic module): Envoy finds lib<name>.so in
# ENVOY_DYNAMIC_MODULES_SEARCH_PATH, which every Envoy the stack starts is given.
NATIVE_MODULE = "idem_native"
NATIVE = Path(os.environ.get("IDEM_NATIVE", REPO / "target" / "native" / ("lib%s.so" % NATIVE_MODULE)))
# Which artifact the configs load: `wasm` (the default) or `native` (`make test` runs the guarantee
# suites on both; `make demo ARTIFACT=native`).
ARTIFACT = os.environ.get("IDEM_ARTIFACT", "wasm")
if ARTIFACT not in ("wasm", "native"):
    raise SystemExit("IDEM_ARTIFACT must be `wasm` or `native`, not %r" % ARTIFACT)

SETUP_HINT = "run `make setup` (or `scripts/setup.sh`) to install it"
BUILD_HINT = ("build it with `make build` (or `cargo build --release --target wasm32-wasip1 -p idem-filter`, "
              "and `cargo build --profile native -p idem-native` for the native module)")


def shipped_policies():
    """The policy files the project ships (tracked by git), relative to the repository: a user's own
    policy saved in policies/ while trying idem is not one of them, and no test about the shipped
    ones reads it. Without git (an unpacked archive), every policies/*.toml."""
    import subprocess
    try:
        out = subprocess.run(["git", "ls-files", "policies/*.toml"], cwd=str(REPO), capture_output=True, text=True,
                             timeout=30)
        tracked = sorted(l for l in out.stdout.splitlines() if l.strip()) if out.returncode == 0 else []
    except OSError:
        tracked = []
    return tracked or sorted("policies/" + p.name for p in (REPO / "policies").glob("*.toml"))


class StackError(RuntimeError):
    """A component is missing or did not start; the message says which and why."""
