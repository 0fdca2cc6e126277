"""gRPC through the gateway: a real grpcio server behind real Envoy with idem, a real grpcio client,
both stores. A call's outcome is its grpc-status: a failed call (UNAVAILABLE) lets the retry run —
grpcio's own retryPolicy included; DEADLINE_EXCEEDED holds the key as an unknown outcome; a
completed call is replayed whole (message, status, trailing metadata) through the echo listener;
the gateway's own answers are gRPC answers with fitting codes, never UNKNOWN or INTERNAL; a
gzip-compressed repeat is the same request; a detached call succeeds; a client-streaming call
passes through unprotected and counted, never half-protected; an unknown outcome is reconciled by
the service's HTTP lookup (`[route.reconcile]`), its message becoming the gRPC reply.

The service (`shop.Orders/Create`) works on raw bytes (generic handlers, no generated stubs):
the request is `key=<business id>;...`, the answer `order:<business id>:<run number>`.
"""

import json
import threading
import time
import uuid
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import grpc
import pytest
from grpc_status import rpc_status

import stack
from conftest import envoy_from_yaml
from idemtest import counters, delta, wait_for


METHOD = "/shop.Orders/Create"
ROUTES = [
    {"name": "grpc", "match": {"prefix": "/shop.Orders/Create"}, "idem": True, "timeout": "30s"},
    {"name": "grpc-reconciled", "match": {"prefix": "/shop.Orders/CreateReconciled"}, "idem": True, "timeout": "30s"},
    {"name": "grpc-detached", "match": {"prefix": "/shop.Orders/CreateDetached"}, "idem": True, "timeout": "30s"},
    {"name": "grpc-request-id", "match": {"prefix": "/shop.Orders/GetOperation"}, "idem": True, "timeout": "30s"},
    {"name": "grpc-storage-control", "match": {"prefix": "/google.storage.control.v2.StorageControl/"}, "idem": True,
     "timeout": "30s"},
]


def policy(store, prefix):
    """The gRPC routes; on the native build without create-detached, which it refuses at load
    (test_native.py), so the other routes still run there."""
    text = _policy(store, prefix)
    if stack.ARTIFACT == "native":
        start = text.index('[[route]]\nname = "create-detached"')
        text = text[:start] + text[text.index("[[route]]", start + 1):]
    return text


def _policy(store, prefix):
    head = stack.redis_table(prefix=prefix) if store == "redis" else ""
    return head + """
[[route]]
name = "create-order"
match = {{ method = "POST", path = "/shop.Orders/Create" }}
store = "{store}"

[route.key]
scope = ["header:authorization"]

# AIP-155: the key is a field of the request message (here GetOperationRequest.name, field 1,
# nested: Operation.error.message would be proto:4.2), no metadata needed.
[[route]]
name = "get-operation"
match = {{ method = "POST", path = "/shop.Orders/GetOperation" }}
store = "{store}"

[route.key]
parts = ["proto:1"]
scope = ["header:authorization"]

# A Google generated client (google-cloud-storage-control): CreateFolderRequest.request_id, field 5,
# which the client fills with a UUID4 itself (AIP-4235) and keeps across its retries.
[[route]]
name = "create-folder"
match = {{ method = "POST", path = "/google.storage.control.v2.StorageControl/CreateFolder" }}
store = "{store}"

[route.key]
parts = ["proto:5"]
scope = ["header:authorization"]

[[route]]
name = "create-batch"
match = {{ method = "POST", path = "/shop.Orders/CreateBatch" }}
store = "{store}"

[[route]]
name = "create-detached"
match = {{ method = "POST", path = "/shop.Orders/CreateDetached" }}
store = "{store}"
forward = "detached"

[[route]]
name = "create-reconciled"
match = {{ method = "POST", path = "/shop.Orders/CreateReconciled" }}
store = "{store}"

[route.key]
scope = ["header:authorization"]

[route.reconcile]
lookup = "/orders/by-key/{{key}}"
cluster = "grpc_lookup"
timeout = "3s"

[[route]]
name = "create-reconciled-at-headers"
match = {{ method = "POST", path = "/shop.Orders/CreateReconciledAtHeaders" }}
store = "{store}"

[route.key]
scope = ["header:authorization"]
fingerprint = []

[route.reconcile]
lookup = "/orders/by-key/{{key}}"
cluster = "grpc_lookup"
timeout = "3s"
""".format(store=store)


class Service:
    """A grpcio server counting runs per business id; `slow[id]` seconds, `fail_first` ids answer
    UNAVAILABLE on their first run."""

    def __init__(self):
        self.runs = {}
        self.slow = {}
        self.fail_first = set()
        self.lock = threading.Lock()
        handlers = {"Create": grpc.unary_unary_rpc_method_handler(self.create),
                    "CreateDetached": grpc.unary_unary_rpc_method_handler(self.create),
                    "CreateReconciled": grpc.unary_unary_rpc_method_handler(self.create),
                    "CreateReconciledAtHeaders": grpc.unary_unary_rpc_method_handler(self.create),
                    "CreateBatch": grpc.stream_unary_rpc_method_handler(self.create_batch),
                    "GetOperation": grpc.unary_unary_rpc_method_handler(self.get_operation)}
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("shop.Orders", handlers),))
        folders = {"CreateFolder": grpc.unary_unary_rpc_method_handler(self.create_folder)}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("google.storage.control.v2.StorageControl", folders),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        # The service's HTTP lookup (`[route.reconcile]`), beside it: GET /orders/by-key/<business
        # id> answers the reply message of its first run (application/x-protobuf), 409 while that
        # run is still going, 404 before one.
        self.replies = {}
        self.running = set()
        self.says_absent = set()
        self.lookups = []
        service = self

        class Lookup(BaseHTTPRequestHandler):
            def do_GET(self):
                bid = unquote(self.path.rsplit("/", 1)[-1])
                with service.lock:
                    service.lookups.append((bid, self.headers.get("accept")))
                    reply = None if bid in service.says_absent else service.replies.get(bid)
                    running = bid in service.running and bid not in service.says_absent
                status, body = (200, reply) if reply is not None else ((409 if running else 404), b"")
                self.send_response(status)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.lookup_server = ThreadingHTTPServer(("127.0.0.1", 0), Lookup)
        self.lookup_port = self.lookup_server.server_address[1]
        threading.Thread(target=self.lookup_server.serve_forever, daemon=True).start()

    def create(self, request, context):
        fields = dict(p.split("=", 1) for p in request.decode().split(";") if "=" in p)
        bid = fields["key"]
        with self.lock:
            n = self.runs.get(bid, 0) + 1
            self.runs[bid] = n
            self.running.add(bid)
        try:
            time.sleep(self.slow.get(bid, 0))
        finally:
            with self.lock:
                self.running.discard(bid)
        if n == 1 and bid in self.fail_first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "backend warming up")
        context.set_trailing_metadata((("x-order-run", str(n)),))
        reply = ("order:%s:%d" % (bid, n)).encode()
        with self.lock:
            self.replies.setdefault(bid, reply)
        return reply

    def get_operation(self, request, context):
        """A generated message's request (google.longrunning GetOperationRequest): one run per name."""
        from google.longrunning import operations_pb2
        name = operations_pb2.GetOperationRequest.FromString(request).name
        with self.lock:
            n = self.runs.get(name, 0) + 1
            self.runs[name] = n
        return operations_pb2.Operation(name=name, done=True, metadata=None).SerializeToString()

    def create_folder(self, request, context):
        """Cloud Storage's CreateFolder, as its generated client sends it: one run per request_id;
        a folder id in `fail_first` is refused UNAVAILABLE once before any work, one in `slow`
        takes that long."""
        from google.cloud import storage_control_v2
        req = storage_control_v2.CreateFolderRequest.deserialize(request)
        rid, folder = req.request_id, req.folder_id
        if folder in self.fail_first:
            with self.lock:
                self.fail_first.discard(folder)
            context.abort(grpc.StatusCode.UNAVAILABLE, "backend warming up")
        with self.lock:
            n = self.runs.get(rid, 0) + 1
            self.runs[rid] = n
        time.sleep(self.slow.get(folder, 0))
        name = "%s/folders/%s" % (req.parent, folder)
        return storage_control_v2.Folder.serialize(storage_control_v2.Folder(name=name, metageneration=n))

    def create_batch(self, requests, context):
        """Client streaming: one run per call, over every message."""
        bodies = [r.decode() for r in requests]
        bid = bodies[0].split("=", 1)[1]
        with self.lock:
            n = self.runs.get(bid, 0) + 1
            self.runs[bid] = n
        return ("batch:%s:%d:%d" % (bid, len(bodies), n)).encode()

    def calls(self, bid):
        with self.lock:
            return self.runs.get(bid, 0)

    def stop(self):
        self.server.stop(0)
        self.lookup_server.shutdown()


@pytest.fixture(scope="module")
def service():
    s = Service()
    yield s
    s.stop()


PREFIX = "idem-grpc-%s:" % uuid.uuid4().hex[:6]


@pytest.fixture(params=["shared", "redis"])
def gateway(request, module_gateway, service):
    """One gateway per store for the module: every test uses its own keys."""
    return module_gateway(request.param, policy(request.param, PREFIX), ROUTES, upstream_port=service.port,
                          upstream_http2=True, extra_clusters=[stack.cluster("grpc_lookup", service.lookup_port)])


def channel(env, retry=None, own_connection=False):
    options = []
    if own_connection:
        # grpcio shares one connection between channels to one target unless told not to.
        options.append(("grpc.use_local_subchannel_pool", 1))
    if retry:
        options.append(("grpc.service_config", json.dumps({"methodConfig": [{
            "name": [{"service": "shop.Orders"}], "retryPolicy": retry}]})))
    return grpc.insecure_channel("127.0.0.1:%d" % env.listen_port, options=options)


def call(env, key, body, method=METHOD, timeout=10, compression=None, retry=None, auth="Bearer grpc-client"):
    """One unary call: (message, trailing metadata) or the RpcError."""
    with channel(env, retry) as ch:
        stub = ch.unary_unary(method)
        try:
            msg, c = stub.with_call(body.encode(), timeout=timeout, compression=compression,
                                    metadata=(("idempotency-key", key), ("authorization", auth)))
            return msg, dict(c.trailing_metadata()), dict(c.initial_metadata())
        except grpc.RpcError as e:
            return e


def assert_code(e, code, idem_code):
    assert isinstance(e, grpc.RpcError), "expected %s, got an answer %r" % (code, e)
    assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
    assert e.details().startswith(idem_code + ": "), e.details()
    status = rpc_status.from_call(e)
    assert status is not None and status.code == code.value[0], status
    assert status.details[0].type_url == "type.googleapis.com/google.rpc.ErrorInfo", status


def test_a_repeat_gets_the_same_message_and_status_ok(gateway, service):
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    msg, trailing, _ = call(gateway, key, "key=%s;sku=A1" % bid)
    assert msg == ("order:%s:1" % bid).encode() and trailing.get("x-order-run") == "1", trailing
    again, trailing2, initial2 = call(gateway, key, "key=%s;sku=A1" % bid)
    assert again == msg, again
    assert trailing2.get("x-order-run") == "1", "the trailing metadata is replayed: %s" % trailing2
    assert initial2.get("idempotent-replayed") == "true", initial2
    assert service.calls(bid) == 1


def test_twenty_concurrent_duplicates_run_once_and_the_others_get_unavailable(gateway, service):
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    service.slow[bid] = 1.5
    barrier = threading.Barrier(20)

    def one(_):
        barrier.wait(10)
        return call(gateway, key, "key=%s" % bid, timeout=20)
    with futures.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(one, range(20)))
    answers = [r for r in results if not isinstance(r, grpc.RpcError)]
    errors = [r for r in results if isinstance(r, grpc.RpcError)]
    assert service.calls(bid) == 1
    assert len(answers) + len(errors) == 20
    assert answers and all(a[0] == ("order:%s:1" % bid).encode() for a in answers), answers
    for e in errors:
        assert_code(e, grpc.StatusCode.UNAVAILABLE, "REQUEST_IN_PROGRESS")
        assert dict(e.trailing_metadata()).get("grpc-retry-pushback-ms") == "1000"


@pytest.mark.parametrize("connections", [1, 48])
def test_two_hundred_concurrent_replays_each_get_the_stored_message_and_trailers(gateway, service, connections):
    # Each replay takes one echo slot of the gateway's pool (256): allocated, so none is lost to
    # another replay drawn into the same slot (they were, at random, 1-8 of 64).
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    first, trailing, _ = call(gateway, key, "key=%s;sku=A1" % bid)
    channels = [channel(gateway, own_connection=True) for _ in range(connections)]
    barrier = threading.Barrier(200)

    def one(i):
        stub = channels[i % connections].unary_unary(METHOD)
        barrier.wait(20)
        try:
            msg, c = stub.with_call(("key=%s;sku=A1" % bid).encode(), timeout=30,
                                    metadata=(("idempotency-key", key), ("authorization", "Bearer grpc-client")))
            return msg, dict(c.trailing_metadata()), dict(c.initial_metadata())
        except grpc.RpcError as e:
            return "%s: %s" % (e.code(), e.details())
    try:
        with futures.ThreadPoolExecutor(200) as pool:
            results = list(pool.map(one, range(200)))
    finally:
        for ch in channels:
            ch.close()
    lost = [r for r in results if isinstance(r, str)]
    assert not lost, "%d of 200 replays lost: %s" % (len(lost), lost[:5])
    wrong = [r for r in results if r[0] != first or r[1].get("x-order-run") != "1"
             or r[2].get("idempotent-replayed") != "true"]
    assert not wrong, "%d of 200 replays not the stored answer: %s" % (len(wrong), wrong[:3])
    assert service.calls(bid) == 1


def test_the_same_key_with_another_message_is_failed_precondition(gateway, service):
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    call(gateway, key, "key=%s;qty=1" % bid)
    e = call(gateway, key, "key=%s;qty=9" % bid)
    assert_code(e, grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED")
    assert service.calls(bid) == 1
    # Without the key: INVALID_ARGUMENT; without the caller's identity: UNAUTHENTICATED.
    with channel(gateway) as ch:
        with pytest.raises(grpc.RpcError) as missing:
            ch.unary_unary(METHOD)(b"key=x", metadata=(("authorization", "Bearer a"),), timeout=5)
    assert_code(missing.value, grpc.StatusCode.INVALID_ARGUMENT, "IDEMPOTENCY_KEY_MISSING")
    with channel(gateway) as ch:
        with pytest.raises(grpc.RpcError) as anonymous:
            ch.unary_unary(METHOD)(b"key=x", metadata=(("idempotency-key", "k"),), timeout=5)
    assert_code(anonymous.value, grpc.StatusCode.UNAUTHENTICATED, "IDEMPOTENCY_SCOPE_MISSING")


def test_a_first_call_failing_unavailable_lets_grpcios_retry_policy_succeed(gateway, service):
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    service.fail_first.add(bid)
    retry = {"maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "0.5s", "backoffMultiplier": 2,
             "retryableStatusCodes": ["UNAVAILABLE"]}
    msg, trailing, _ = call(gateway, key, "key=%s" % bid, retry=retry)
    assert msg == ("order:%s:2" % bid).encode(), msg
    assert service.calls(bid) == 2
    # The second run is the one remembered.
    again = call(gateway, key, "key=%s" % bid)
    assert again[0] == msg, again


def test_an_upstream_deadline_exceeded_holds_the_key_as_unknown(gateway, service):
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    service.slow[bid] = 2.0
    e = call(gateway, key, "key=%s" % bid, timeout=1.0)
    assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
    wait_for(lambda: "idem: unknown_outcome " in gateway.log_text(), 10, what="the reconciliation line")
    time.sleep(1.5)  # a duration: the service finishes its (first and only) run meanwhile
    again = call(gateway, key, "key=%s" % bid)
    assert_code(again, grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_OUTCOME_UNKNOWN")
    assert service.calls(bid) == 1
    lines = [json.loads(l.split("idem: unknown_outcome ", 1)[1]) for l in gateway.log_text().splitlines()
             if "idem: unknown_outcome " in l]
    assert [l["route"] for l in lines if l["key_prefix"] == key[:8] + "…"] == ["create-order"], lines


def held(gateway, key, route="create-reconciled"):
    """Waits until the key is held as an unknown outcome (on Redis its write lands after the log
    line that reports it)."""
    line = "idem: held route=%s key=%s…" % (route, key[:8])
    wait_for(lambda: line in gateway.log_text(), 10, what=line)


def test_an_unknown_outcome_is_reconciled_by_the_services_http_lookup(gateway, service):
    """`[route.reconcile]` on a gRPC route: the lookup is an HTTP route beside the service that
    answers the reply message; the repeat gets it as a gRPC reply (status OK), the service ran
    once, a third call is a plain replay. A service that says the call never ran lets it run."""
    bid = "rc-" + uuid.uuid4().hex[:8]
    service.slow[bid] = 2.0
    method = "/shop.Orders/CreateReconciled"
    e = call(gateway, bid, "key=%s" % bid, method=method, timeout=1.0)
    assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
    wait_for(lambda: service.calls(bid) == 1 and bid in service.replies, 5, what="the first run to finish")
    held(gateway, bid)
    got = call(gateway, bid, "key=%s" % bid, method=method)
    assert not isinstance(got, grpc.RpcError), "%s %s" % (got.code(), got.details())
    msg, _, initial = got
    assert msg == ("order:%s:1" % bid).encode()
    assert initial.get("idempotent-replayed") == "true" and initial.get("idempotency-reconciled") == "true", initial
    third = call(gateway, bid, "key=%s" % bid, method=method)
    assert not isinstance(third, grpc.RpcError) and third[0] == msg and "idempotency-reconciled" not in third[2]
    assert service.calls(bid) == 1
    assert [a for b, a in service.lookups if b == bid] == ["application/x-protobuf, application/grpc"]

    absent = "rc-" + uuid.uuid4().hex[:8]
    service.slow[absent] = 2.0
    service.says_absent.add(absent)
    e = call(gateway, absent, "key=%s" % absent, method=method, timeout=1.0)
    assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
    wait_for(lambda: service.calls(absent) == 1, 5, what="the first run")
    held(gateway, absent)
    service.slow[absent] = 0
    ran = call(gateway, absent, "key=%s" % absent, method=method)
    assert not isinstance(ran, grpc.RpcError) and ran[0] == ("order:%s:2" % absent).encode(), ran
    assert "idempotent-replayed" not in ran[2]


def test_a_gzip_compressed_repeat_is_the_same_request(gateway, service):
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    body = "key=%s;note=%s" % (bid, "x" * 400)
    first = call(gateway, key, body)
    again = call(gateway, key, body, compression=grpc.Compression.Gzip)
    assert again[0] == first[0] and again[2].get("idempotent-replayed") == "true", again
    assert service.calls(bid) == 1


@pytest.mark.wasm_only("forward = \"detached\"")
def test_a_detached_grpc_call_succeeds_and_its_repeat_is_replayed(gateway, service):
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    msg, trailing, _ = call(gateway, key, "key=%s" % bid, method="/shop.Orders/CreateDetached")
    assert msg == ("order:%s:1" % bid).encode() and trailing.get("x-order-run") == "1", trailing
    again = call(gateway, key, "key=%s" % bid, method="/shop.Orders/CreateDetached")
    assert again[0] == msg and again[2].get("idempotent-replayed") == "true", again
    assert service.calls(bid) == 1


def test_a_client_streaming_call_passes_through_unprotected_and_counted(gateway, service):
    """More than one request message: not held until the half-close, not fingerprinted in part,
    not claimed — passed on, counted `unprotected`, the warning logged once per worker."""
    key, bid = "k-" + uuid.uuid4().hex, "b-" + uuid.uuid4().hex[:8]
    before = counters(gateway, "create-batch")
    md = (("idempotency-key", key), ("authorization", "Bearer grpc-client"))
    with channel(gateway) as ch:
        stub = ch.stream_unary("/shop.Orders/CreateBatch")
        first = stub(iter([("key=%s" % bid).encode(), b"line=2", b"line=3"]), metadata=md, timeout=10)
        again = stub(iter([("key=%s" % bid).encode(), b"line=2", b"line=3"]), metadata=md, timeout=10)
    assert first == ("batch:%s:3:1" % bid).encode(), first
    assert again == ("batch:%s:3:2" % bid).encode(), "a streaming call is not replayed: %r" % again
    assert delta(before, counters(gateway, "create-batch")) == {"unprotected": 2}
    # Once per worker (two workers here), not once per call.
    assert 1 <= gateway.log_text().count("streaming calls pass through unprotected") <= 2


def test_example_grpc_yaml_runs(workdir):
    """examples/grpc/envoy.yaml and examples/grpc/orders.py as shipped (only ports and the .wasm
    path rewritten): the client's repeat is replayed whole, a first run failing UNAVAILABLE is
    released, and the --call mode prints what the README shows."""
    import subprocess
    import sys
    port = stack.free_port()
    service = stack.Proc("orders", [sys.executable, str(stack.EXAMPLE_GRPC_SERVICE), "--port", str(port)],
                         workdir / ("orders-%d.log" % port))
    example = lambda lp, ap: stack.example_grpc_config_text(lp, ap, port, stack.WASM)  # noqa: E731
    try:
        wait_for(lambda: "shop.Orders on" in service.log_text(), 15, what="the example service")
        with envoy_from_yaml(workdir, "envoy-example-grpc", example) as env:
            lp = env.listen_port
            key = "k-" + uuid.uuid4().hex
            msg, trailing, _ = call(env, key, "sku=A1")
            again, trailing2, initial2 = call(env, key, "sku=A1")
            assert (again, trailing2.get("x-order-run"), initial2.get("idempotent-replayed")) == (
                msg, trailing.get("x-order-run"), "true"), (msg, trailing, again, trailing2, initial2)
            # A run failing UNAVAILABLE is not remembered: the retry runs and its answer is kept.
            key2 = "k-" + uuid.uuid4().hex
            e = call(env, key2, "fail-once:" + key2)
            assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAVAILABLE, e
            ok = call(env, key2, "fail-once:" + key2)
            assert ok[0].startswith(b"order-") and call(env, key2, "fail-once:" + key2)[0] == ok[0]
            # Straight to the echo path without a token: nothing to replay.
            with channel(env) as ch:
                with pytest.raises(grpc.RpcError) as direct:
                    ch.unary_unary("/.idem/replay")(b"x", timeout=5)
            assert direct.value.code() != grpc.StatusCode.OK
            out = subprocess.run([sys.executable, str(stack.EXAMPLE_GRPC_SERVICE), "--call", "127.0.0.1:%d" % lp],
                                 capture_output=True, text=True, timeout=60)
            lines = out.stdout.splitlines()
            assert out.returncode == 0 and len(lines) == 2, out
            assert lines[0].endswith("idempotent-replayed=-") and lines[1].endswith("idempotent-replayed=true"), lines
            assert lines[0].split()[2] == lines[1].split()[2], "the same order: %s" % lines
            assert counters(env, "grpc-create-order").get("replayed") == 3
    finally:
        service.stop()


def test_a_repeat_decided_at_its_metadata_and_answered_from_the_lookup_never_runs_again(gateway, service):
    """With `fingerprint = []` the decision is made at the call's metadata, its message still to
    come — the path on which a repeat answered from the lookup also went upstream (issue 53). The
    first call's deadline passes while the service runs it; a repeat while it runs gets
    FAILED_PRECONDITION (the lookup says 409), one after it ran gets its reply; one the service
    never ran runs once. The service ran each business id exactly once."""
    method = "/shop.Orders/CreateReconciledAtHeaders"
    bid = "rh-" + uuid.uuid4().hex[:8]
    service.slow[bid] = 3.0
    t0 = time.monotonic()
    e = call(gateway, bid, "key=%s" % bid, method=method, timeout=1.0)
    assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
    held(gateway, bid, route="create-reconciled-at-headers")
    time.sleep(max(0.0, 1.8 - (time.monotonic() - t0)))  # a duration: the first run is still going
    running = call(gateway, bid, "key=%s" % bid, method=method)
    assert_code(running, grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_OUTCOME_UNKNOWN")
    assert service.calls(bid) == 1, "the repeat answered FAILED_PRECONDITION also ran"
    wait_for(lambda: bid in service.replies, 5, what="the first run to finish")
    got = call(gateway, bid, "key=%s" % bid, method=method)
    assert not isinstance(got, grpc.RpcError), "%s %s" % (got.code(), got.details())
    assert got[0] == ("order:%s:1" % bid).encode() and got[2].get("idempotency-reconciled") == "true", got
    time.sleep(0.3)
    assert service.calls(bid) == 1, "the repeat answered from the lookup also ran"
    assert len([b for b, _ in service.lookups if b == bid]) == 2

    absent = "rh-" + uuid.uuid4().hex[:8]
    service.slow[absent] = 2.0
    service.says_absent.add(absent)
    e = call(gateway, absent, "key=%s" % absent, method=method, timeout=1.0)
    assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED, e
    held(gateway, absent, route="create-reconciled-at-headers")
    wait_for(lambda: absent not in service.running, 5, what="the first run to finish")
    service.slow[absent] = 0
    ran = call(gateway, absent, "key=%s" % absent, method=method)
    assert not isinstance(ran, grpc.RpcError) and ran[0] == ("order:%s:2" % absent).encode(), ran
    time.sleep(0.3)
    assert service.calls(absent) == 2, "the first run and the repeat the lookup let through, nothing else"


def test_a_key_read_from_the_request_message_runs_the_call_once(gateway, service):
    """AIP-155: the client puts the request id in the message (a generated protobuf class here,
    google.longrunning's GetOperationRequest, its field 1) and retries with the same message; no
    metadata carries a key. A compressed message is refused with the reason, not guessed at."""
    from google.longrunning import operations_pb2
    rid = "op-" + uuid.uuid4().hex
    message = operations_pb2.GetOperationRequest(name=rid).SerializeToString()

    def send():
        with channel(gateway) as ch:
            stub = ch.unary_unary("/shop.Orders/GetOperation")
            reply, c = stub.with_call(message, timeout=10, metadata=(("authorization", "Bearer grpc-client"),))
            return reply, dict(c.initial_metadata())
    first, _ = send()
    again, initial = send()
    assert operations_pb2.Operation.FromString(first).name == rid
    assert again == first and initial.get("idempotent-replayed") == "true", initial
    assert service.calls(rid) == 1
    # The same message gzip-compressed, framed by hand (grpcio leaves a small message uncompressed
    # whatever it is asked), over HTTP/2 as a gRPC client sends it.
    import gzip
    import httpx
    packed = gzip.compress(message)
    frame = b"\x01" + len(packed).to_bytes(4, "big") + packed
    with httpx.Client(http1=False, http2=True, timeout=10) as client:
        r = client.post("http://127.0.0.1:%d/shop.Orders/GetOperation" % gateway.listen_port, content=frame,
                        headers={"content-type": "application/grpc", "te": "trailers", "grpc-encoding": "gzip",
                                 "authorization": "Bearer grpc-client"})
    status, details = r.headers.get("grpc-status"), unquote(r.headers.get("grpc-message", ""))
    assert status == "3", (r.status_code, dict(r.headers))  # INVALID_ARGUMENT, trailers-only
    assert details.startswith("IDEMPOTENCY_KEY_INVALID: ") and "compressed" in details and "proto:1" in details, details
    assert service.calls(rid) == 1


def storage_control(env):
    """Google's generated Cloud Storage control client, on an insecure channel to the gateway."""
    from google.cloud import storage_control_v2
    from google.cloud.storage_control_v2.services.storage_control.transports import StorageControlGrpcTransport
    # A channel of our own carries no Google credentials: the caller is the authorization metadata.
    transport = StorageControlGrpcTransport(channel=channel(env))
    return storage_control_v2.StorageControlClient(transport=transport)


def folder_request(folder):
    from google.cloud import storage_control_v2
    return storage_control_v2.CreateFolderRequest(parent="projects/_/buckets/idem-test", folder_id=folder)


AUTH = (("authorization", "Bearer grpc-client"),)


def test_a_google_clients_own_request_id_survives_its_retry_and_a_second_call(gateway, service):
    """google-cloud-storage-control fills CreateFolderRequest.request_id (field 5) with a UUID4 on
    the caller's request object and retries UNAVAILABLE with it: the service refuses the first
    attempt, the client's retry runs once, and the application calling again with the same
    request object gets that folder back, not a second one."""
    client, folder = storage_control(gateway), "f-" + uuid.uuid4().hex[:10]
    service.fail_first.add(folder)
    req = folder_request(folder)
    made = client.create_folder(request=req, metadata=AUTH)
    rid = req.request_id
    assert uuid.UUID(rid).version == 4, "the client filled request_id itself: %r" % rid
    assert made.name.endswith("/folders/" + folder) and made.metageneration == 1, made
    assert service.calls(rid) == 1 and folder not in service.fail_first, "refused once, then run once"
    again = client.create_folder(request=req, metadata=AUTH)
    assert again == made and req.request_id == rid
    assert service.calls(rid) == 1


def test_a_google_client_that_gives_up_on_a_slow_call_gets_a_clear_error_and_it_runs_once(gateway, service):
    """The call outlives its deadline (the client's DEADLINE_EXCEEDED is not retried); the
    application calls again with the same request: FAILED_PRECONDITION, outcome unknown — the
    folder was created once, never twice."""
    from google.api_core import exceptions
    client, folder = storage_control(gateway), "f-" + uuid.uuid4().hex[:10]
    service.slow[folder] = 1.5
    req = folder_request(folder)
    with pytest.raises(exceptions.DeadlineExceeded):
        client.create_folder(request=req, metadata=AUTH, timeout=0.5)
    with pytest.raises(exceptions.FailedPrecondition) as again:
        client.create_folder(request=req, metadata=AUTH, timeout=5)
    assert "IDEMPOTENCY_OUTCOME_UNKNOWN" in str(again.value), again.value
    wait_for(lambda: service.calls(req.request_id) == 1, 5, what="the first run")
    time.sleep(1.6)  # the first run ends; a second one would have started by now
    assert service.calls(req.request_id) == 1
