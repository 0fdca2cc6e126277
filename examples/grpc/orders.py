#!/usr/bin/env python3
"""The demo gRPC service behind examples/grpc/envoy.yaml, and a client for it (grpcio).

    .venv/bin/python examples/grpc/orders.py --port 50051            # serve shop.Orders
    .venv/bin/python examples/grpc/orders.py --call 127.0.0.1:10000   # call it through the gateway

`shop.Orders/Create` works on raw bytes (generic handlers, no generated stubs, so no protoc): the
request is any bytes, the answer `order-<n>` where n counts the service's runs, with the trailing
metadata `x-order-run: <n>`. A request starting with `fail-once:` answers UNAVAILABLE on its first
run, as a service warming up does.

`--call` sends one message twice with one `idempotency-key` and prints both answers: the second
is the first replayed (same message, same trailing metadata, `idempotent-replayed: true`), and the
service ran once.
"""

import argparse
import sys
import threading
import uuid
from concurrent import futures

import grpc


class Orders:
    def __init__(self):
        self.runs = 0
        self.failed = set()
        self.lock = threading.Lock()

    def create(self, request, context):
        with self.lock:
            self.runs += 1
            n = self.runs
            fail = request.startswith(b"fail-once:") and request not in self.failed
            self.failed.add(request)
        if fail:
            context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
        context.set_trailing_metadata((("x-order-run", str(n)),))
        return b"order-%d" % n


def serve(port):
    orders = Orders()
    handlers = {"Create": grpc.unary_unary_rpc_method_handler(orders.create)}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("shop.Orders", handlers),))
    bound = server.add_insecure_port("127.0.0.1:%d" % port)
    server.start()
    print("shop.Orders on 127.0.0.1:%d" % bound, flush=True)
    server.wait_for_termination()


def call(target, key, message):
    with grpc.insecure_channel(target) as channel:
        create = channel.unary_unary("/shop.Orders/Create")
        for attempt in (1, 2):
            try:
                answer, c = create.with_call(message, timeout=10, metadata=(
                    ("idempotency-key", key), ("authorization", "Bearer demo-client")))
            except grpc.RpcError as e:
                print("call %d: %s %s" % (attempt, e.code().name, e.details()))
                continue
            initial, trailing = dict(c.initial_metadata()), dict(c.trailing_metadata())
            print("call %d: %s x-order-run=%s idempotent-replayed=%s" % (
                attempt, answer.decode(), trailing.get("x-order-run"), initial.get("idempotent-replayed", "-")))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=50051, help="serve shop.Orders on this loopback port")
    ap.add_argument("--call", metavar="HOST:PORT", help="call shop.Orders/Create twice with one key instead")
    ap.add_argument("--key", default=None, help="the idempotency key (default: a new one)")
    ap.add_argument("--message", default="sku=A1;qty=1", help="the request bytes")
    args = ap.parse_args()
    if args.call:
        call(args.call, args.key or "demo-" + uuid.uuid4().hex, args.message.encode())
    else:
        serve(args.port)


if __name__ == "__main__":
    sys.exit(main())
