"""100 000 distinct keys through a small store leave Envoy's memory bounded by the capacity."""

import time
import uuid

import pytest

import stack
from conftest import new_key
from idemtest import assert_replay_of, counters, describe, post, wait_idle

BUCKETS, ENTRIES, MAX_RESPONSE = 64, 8, 1024
POLICY = """
[shared]
buckets = %d
entries_per_bucket = %d
max_response_bytes = %d

[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
""" % (BUCKETS, ENTRIES, MAX_RESPONSE)

# policies/README.md: memory <= buckets x entries x (56 + max_response_bytes + headers).
HEADERS_ALLOWANCE = 1024
CAPACITY_BYTES = BUCKETS * ENTRIES * (56 + MAX_RESPONSE + HEADERS_ALLOWANCE)
# What else may move between the two measurements (allocator caches, stats, connection buffers).
SLACK_ALLOCATED = 4 << 20
# RSS also sees the Wasm VMs' linear memory (one VM per worker), which /memory does not.
SLACK_RSS = 16 << 20
TIME_CAP_S = 150  # the whole test stops by itself


@pytest.fixture
def fast_upstream(workdir):
    try:
        env = stack.start_fast_upstream(workdir)
    except stack.StackError as e:
        pytest.fail(str(e), pytrace=False)
    yield env
    env.stop()


def test_100k_distinct_keys_keep_memory_bounded(make_envoy, fast_upstream):
    stack.require_wrk()
    env = make_envoy(POLICY, upstream_port=fast_upstream.listen_port)
    script = stack.WRK_SCRIPTS / "unique_keys.lua"
    run_id = uuid.uuid4().hex[:8]
    started = time.monotonic()
    sent = {"n": 0, "non_2xx": 0, "chunks": 0}

    def send_until(target):
        while sent["n"] < target:
            assert time.monotonic() - started < TIME_CAP_S, (
                "only %d distinct keys sent in %ds (wanted %d)" % (sent["n"], TIME_CAP_S, target))
            assert env.proc.alive(), "Envoy died:\n%s" % env.log_tail()
            sent["chunks"] += 1
            res = stack.run_wrk(env.listen_port, "/api/order/create", script,
                                ["/api/order/create", "%s-%d" % (run_id, sent["chunks"])],
                                duration=2, connections=16, threads=2)
            sent["n"] += res["requests"]
            sent["non_2xx"] += res["non_2xx"]

    def measure():
        wait_idle(env)  # measured with nothing in flight (wrk's last requests, store callouts)
        return env.memory()["allocated"], stack.rss_bytes(env.proc.pid)

    send_until(20_000)
    alloc_20k, rss_20k = measure()
    n_20k = sent["n"]
    send_until(100_000)
    alloc_100k, rss_100k = measure()

    c = counters(env, "create-order")
    report = ("keys sent %d -> %d (non-2xx %d); allocated %d -> %d (+%d); RSS %d -> %d (+%d); capacity bound %d; "
              "counters %s" % (n_20k, sent["n"], sent["non_2xx"], alloc_20k, alloc_100k, alloc_100k - alloc_20k,
                               rss_20k, rss_100k, rss_100k - rss_20k, CAPACITY_BYTES, c))
    print(report)
    # The keys really went through the filter and were stored (not rejected wholesale).
    assert c.get("forwarded", 0) >= 0.95 * sent["n"], report
    assert sent["non_2xx"] <= 0.05 * sent["n"], report
    assert alloc_100k - alloc_20k <= CAPACITY_BYTES + SLACK_ALLOCATED, "allocated memory grew: " + report
    assert rss_100k - rss_20k <= CAPACITY_BYTES + SLACK_RSS, "RSS grew: " + report
    # The store still works after the churn.
    key = new_key()
    first = post(env, "/api/order/create", key)
    assert first.status == 200, describe(first)
    assert_replay_of(post(env, "/api/order/create", key), first)
