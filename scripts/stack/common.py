"""What every component module shares: the repository root, the Envoy binary and the built filter
(overridable with IDEM_ENVOY and IDEM_WASM), the error a component raises when it is missing or
does not start, and the hints such an error gives."""

import os
from pathlib import Path

# scripts/stack/common.py -> scripts/stack -> scripts -> the repository.
REPO = Path(__file__).resolve().parents[2]
ENVOY = Path(os.environ.get("IDEM_ENVOY", REPO / ".venv" / "bin" / "envoy"))
WASM = Path(os.environ.get("IDEM_WASM", REPO / "target" / "wasm32-wasip1" / "release" / "idem_filter.wasm"))

SETUP_HINT = "run `make setup` (or `scripts/setup.sh`) to install it"
BUILD_HINT = ("build it with `make build` (or `cargo build --release --target wasm32-wasip1 -p idem-filter`)")


class StackError(RuntimeError):
    """A component is missing or did not start; the message says which and why."""
