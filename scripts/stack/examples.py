"""The shipped example configs (examples/envoy.yaml, examples/envoy-redis.yaml, examples/grpc/envoy.yaml)
with their ports and
optionally their .wasm path rewritten, so the very files users start can run on free loopback ports."""

from .common import NATIVE_MODULE, REPO, StackError

EXAMPLE_YAML = REPO / "examples" / "envoy.yaml"
EXAMPLE_PORTS = {"listen": 10000, "admin": 9901, "upstream": 8080}
EXAMPLE_WASM = "target/wasm32-wasip1/release/idem_filter.wasm"
EXAMPLE_REDIS_YAML = REPO / "examples" / "envoy-redis.yaml"
EXAMPLE_GRPC_YAML = REPO / "examples" / "grpc" / "envoy.yaml"
EXAMPLE_GRPC_SERVICE = REPO / "examples" / "grpc" / "orders.py"


def rewrite_example(path, ports, wasm_path=None):
    """An example Envoy config with its ports ({old: new}, each present exactly once) and
    optionally its .wasm path (every filter that loads it) rewritten."""
    text = path.read_text()
    name = str(path.relative_to(REPO))
    for old, new in ports.items():
        needle = "port_value: %d }" % old
        if text.count(needle) != 1:
            raise StackError("%s: expected exactly one `%s`" % (name, needle))
        text = text.replace(needle, "port_value: %d }" % new)
    if wasm_path is not None:
        if text.count("filename: " + EXAMPLE_WASM) < 1:
            raise StackError("%s: expected `filename: %s`" % (name, EXAMPLE_WASM))
        text = text.replace("filename: " + EXAMPLE_WASM, "filename: %s" % wasm_path)
    return text


def example_config_text(listen_port=10000, admin_port=9901, upstream_port=8080, wasm_path=None):
    """examples/envoy.yaml with its three ports (and optionally the .wasm path) rewritten."""
    return rewrite_example(EXAMPLE_YAML, {10000: listen_port, 9901: admin_port, 8080: upstream_port}, wasm_path)


def example_redis_config_text(listen_port, admin_port, upstream_port, webdis_port, wasm_path=None):
    """examples/envoy-redis.yaml with its four ports (and optionally the .wasm path) rewritten."""
    ports = {10000: listen_port, 9901: admin_port, 8080: upstream_port, 7390: webdis_port}
    return rewrite_example(EXAMPLE_REDIS_YAML, ports, wasm_path)


def example_grpc_config_text(listen_port, admin_port, upstream_port, wasm_path=None):
    """examples/grpc/envoy.yaml with its three ports (and optionally the .wasm path) rewritten."""
    return rewrite_example(EXAMPLE_GRPC_YAML, {10000: listen_port, 9901: admin_port, 50051: upstream_port}, wasm_path)


WASM_TYPE = '"@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm'


def as_native(text):
    """An example config with each idem Wasm filter swapped for the native build's dynamic module
    (docs/deploy.md): the same policy text (the `value: |` block), `filter_name` idem, except that a
    `forward = "detached"` route forwards inline, which the native build refuses (docs/deploy.md).
    What `make demo ARTIFACT=native` runs."""
    text = text.replace('forward = "detached"', 'forward = "inline"  # native build: detached is .wasm only')
    lines = text.splitlines(keepends=True)
    out, i, swapped = [], 0, 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == WASM_TYPE:
            indent = " " * (len(line) - len(line.lstrip()))
            end = next((j for j in range(i, len(lines)) if lines[j].strip() == "value: |"), None)
            if end is None:
                raise StackError("example config: a Wasm filter with no `value: |` policy block")
            out += [indent + '"@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3'
                    '.DynamicModuleFilter\n',
                    indent + "dynamic_module_config: { name: %s }\n" % NATIVE_MODULE,
                    indent + "filter_name: idem\n",
                    indent + "filter_config:\n",
                    indent + '  "@type": type.googleapis.com/google.protobuf.StringValue\n',
                    indent + "  value: |\n"]
            i, swapped = end + 1, swapped + 1
            continue
        out.append(line)
        i += 1
    if not swapped:
        raise StackError("example config: no idem Wasm filter to swap for the native build")
    return "".join(out)
