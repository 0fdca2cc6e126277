"""Callers who sign every request (issue 39): AWS SigV4 through botocore, both stores.

botocore signs each attempt anew (a new X-Amz-Date, a new Signature), so a scope on the whole
`Authorization` header makes every retry a new caller and the business runs again. The policies
here scope on the access key id inside it (`sigv4:access_key_id`), answer in the API's own
envelope with the API's own codes (`[route.answers.codes]`), and botocore reads them as AWS
errors: the reused token raises DynamoDB's `IdempotentParameterMismatchException`, an in-flight
duplicate is DynamoDB's `TransactionInProgressException`, which botocore retries until it gets
the first result.

The service is a small fake of the two AWS protocols botocore speaks here (EC2's query protocol
with `ClientToken`, DynamoDB's JSON protocol with `ClientRequestToken`), counting runs per access
key and token.
"""

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import boto3
import botocore.config
import botocore.exceptions
import pytest

import stack

# The native build refuses this module's policy at load.
pytestmark = pytest.mark.wasm_only("forward = \"detached\" (the module's policy)")

KEY_A, KEY_B = "AKIAAAAAAAAAAAAAAAAA", "AKIABBBBBBBBBBBBBBBB"
ACCESS_KEY = re.compile(r"Credential=([A-Z0-9]+)/")


class Aws:
    """EC2 RunInstances at /ec2 and DynamoDB TransactWriteItems at /ddb: each run counted by
    (access key, token); `slow[token]` seconds on a token's first run."""

    def __init__(self):
        self.runs = {}
        self.slow = {}
        self.instances = 0
        self.lock = threading.Lock()
        aws = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                m = ACCESS_KEY.search(self.headers.get("authorization", ""))
                who = m.group(1) if m else None
                if self.path.startswith("/ec2"):
                    form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                    n = aws.run(who, form.get("ClientToken"))
                    out = ('<RunInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">'
                           '<requestId>req-%d</requestId><reservationId>r-%d</reservationId><ownerId>1</ownerId>'
                           '<instancesSet><item><instanceId>i-%05d</instanceId></item></instancesSet>'
                           '</RunInstancesResponse>' % (n, n, n)).encode()
                    ctype = "text/xml"
                else:
                    req = json.loads(body)
                    n = aws.run(who, req.get("ClientRequestToken"))
                    out = json.dumps({"ConsumedCapacity": [{"TableName": "run-%d" % n}]}).encode()
                    ctype = "application/x-amz-json-1.0"
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def run(self, who, token):
        with self.lock:
            self.instances += 1
            n = self.instances
            k = (who, token)
            first = k not in self.runs
            self.runs[k] = self.runs.get(k, 0) + 1
        if first:
            time.sleep(self.slow.get(token, 0))
        return n

    def calls(self, who, token):
        with self.lock:
            return self.runs.get((who, token), 0)

    def stop(self):
        self.server.shutdown()


def policy(store, prefix):
    head = stack.redis_table(prefix=prefix) if store == "redis" else ""
    return head + """
[[route]]
name = "ec2-run-instances"
match = { method = "POST", path = "/ec2" }
store = "%(store)s"
# A client that times out cannot cancel the launch: its retry gets the launch's answer.
forward = "detached"

[route.key]
from = "form"
name = "ClientToken"
scope = ["sigv4:access_key_id"]
on_in_flight = "wait"
wait_timeout = "10s"

[route.answers]
format = "template"
content_type = "text/xml"
template = '<Response><Errors><Error><Code>{{code}}</Code><Message>{{message}}</Message></Error></Errors><RequestID>{{request_id}}</RequestID></Response>'

[route.answers.codes]
IDEMPOTENCY_KEY_REUSED = "IdempotentParameterMismatch"

[[route]]
name = "ddb-transact-write"
match = { method = "POST", path = "/ddb" }
store = "%(store)s"

[route.key]
from = "body"
name = "/ClientRequestToken"
scope = ["sigv4:access_key_id"]
remember = ["2xx"]

[route.answers]
format = "template"
content_type = "application/x-amz-json-1.0"
template = '{"__type":"com.amazonaws.dynamodb.v20120810#{{code}}","message":"{{message}}"}'

[route.answers.codes]
IDEMPOTENCY_KEY_REUSED = "IdempotentParameterMismatchException"
REQUEST_IN_PROGRESS = { code = "TransactionInProgressException", status = 400 }
""" % {"store": store}


ROUTES = stack.routes_from_policy(policy("shared", ""))


@pytest.fixture(scope="module")
def aws():
    a = Aws()
    yield a
    a.stop()


PREFIX = "idem-sigv4-%s:" % uuid.uuid4().hex[:6]


@pytest.fixture(params=["shared", "redis"])
def gateway(request, module_gateway, aws):
    """One gateway per store for the module: every test uses its own ids."""
    return module_gateway(request.param, policy(request.param, PREFIX), ROUTES, upstream_port=aws.port)


def client(env, service, key, read_timeout=10, attempts=10):
    cfg = botocore.config.Config(read_timeout=read_timeout, connect_timeout=2,
                                 retries={"mode": "standard", "max_attempts": attempts})
    path = "/ec2" if service == "ec2" else "/ddb"
    return boto3.client(service, endpoint_url="http://127.0.0.1:%d%s" % (env.listen_port, path),
                        region_name="us-east-1", aws_access_key_id=key, aws_secret_access_key="s3cr3t",
                        config=cfg)


def run_instances(c, token, image="ami-12345678"):
    r = c.run_instances(ImageId=image, MinCount=1, MaxCount=1, ClientToken=token)
    return r["Instances"][0]["InstanceId"]


def transact(c, token, value="1"):
    return c.transact_write_items(ClientRequestToken=token, TransactItems=[
        {"Put": {"TableName": "orders", "Item": {"id": {"S": token}, "v": {"N": value}}}}])


def test_a_timeout_and_botocores_retry_launch_once(gateway, aws):
    token = "launch-" + uuid.uuid4().hex
    aws.slow[token] = 1.8
    # The first attempt times out after 1 s; botocore signs the retry anew and sends it again.
    instance = run_instances(client(gateway, "ec2", KEY_A, read_timeout=1, attempts=5), token)
    assert aws.calls(KEY_A, token) == 1, "launched %d times" % aws.calls(KEY_A, token)
    # Later retries, signed anew again, get the same instance.
    assert run_instances(client(gateway, "ec2", KEY_A), token) == instance
    assert aws.calls(KEY_A, token) == 1


def test_two_access_keys_with_the_same_token_are_two_callers(gateway, aws):
    token = "shared-token-" + uuid.uuid4().hex
    a = run_instances(client(gateway, "ec2", KEY_A), token)
    b = run_instances(client(gateway, "ec2", KEY_B), token)
    assert a != b
    assert aws.calls(KEY_A, token) == 1 and aws.calls(KEY_B, token) == 1


def test_a_reused_token_raises_the_apis_own_exception(gateway, aws):
    token = "reuse-" + uuid.uuid4().hex
    ddb = client(gateway, "dynamodb", KEY_A)
    transact(ddb, token, "1")
    with pytest.raises(ddb.exceptions.IdempotentParameterMismatchException):
        transact(ddb, token, "2")
    ec2 = client(gateway, "ec2", KEY_A)
    run_instances(ec2, token)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        run_instances(ec2, token, image="ami-87654321")
    assert e.value.response["Error"]["Code"] == "IdempotentParameterMismatch"
    assert re.fullmatch(r"[0-9a-f-]{36}", e.value.response["ResponseMetadata"]["RequestId"]), \
        "{{request_id}} is Envoy's x-request-id: %s" % e.value.response["ResponseMetadata"]
    assert aws.calls(KEY_A, token) == 2, "one transaction and one launch"


def test_an_in_flight_duplicate_is_retried_by_botocore_and_ends_with_the_first_result(gateway, aws):
    token = "inflight-" + uuid.uuid4().hex
    aws.slow[token] = 1.5
    first = {}
    t = threading.Thread(target=lambda: first.update(r=transact(client(gateway, "dynamodb", KEY_A), token)))
    t.start()
    time.sleep(0.3)
    # TransactionInProgressException (400): botocore backs off and retries, then gets the replay.
    second = transact(client(gateway, "dynamodb", KEY_A), token)
    t.join()
    assert second["ConsumedCapacity"] == first["r"]["ConsumedCapacity"], (first, second)
    assert aws.calls(KEY_A, token) == 1
