"""A newcomer's first hour: the curl lines the README shows and `make run` prints run as printed —
in a real shell, with real curl, against the stack `make run` starts — and each prints what its
`# →` comment says. The README's copy is the demo's, with the default addresses."""

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

import stack

sys.path.insert(0, str(stack.REPO / "scripts"))
import demo  # noqa: E402

MARK = "<!-- try-it: scripts/demo.py TRY_IT"


def readme_block():
    """The fenced block after the try-it marker in README.md."""
    text = (stack.REPO / "README.md").read_text()
    at = text.index(MARK)
    fence = text.index("```sh\n", at) + len("```sh\n")
    return text[fence:text.index("```", fence)]


def test_the_readme_shows_exactly_the_lines_make_run_prints():
    assert readme_block() == demo.try_it(**demo.README_ADDRESSES), (
        "README.md's try-it block is not scripts/demo.py's TRY_IT: copy demo.try_it(**README_ADDRESSES) into it")


EXPECT = re.compile(r"#\s*→\s*(.*)$")


def expectation(line):
    m = EXPECT.search(line)
    return m.group(1).strip() if m else None


def check(line, out, want):
    """What one line printed (curl -si: the status line, headers, body) against its comment."""
    if want.startswith("prints "):
        text = want[len("prints "):]
        assert text in out, "%s\nprinted:\n%s\nexpected it to contain %r" % (line, out[-2000:], text)
        return
    m = re.match(r"(\d{3})\s+(\S+)", want)
    assert m, "unreadable expectation %r in %s" % (want, line)
    status, what = int(m.group(1)), m.group(2)
    head, _, body = out.replace("\r\n", "\n").partition("\n\n")
    first = head.splitlines()[0] if head else ""
    got = re.match(r"HTTP/\S+ (\d{3})", first)
    assert got and int(got.group(1)) == status, "%s\nprinted:\n%s\nexpected status %d" % (line, out[:2000], status)
    headers = {h.split(":", 1)[0].strip().lower(): h.split(":", 1)[1].strip() for h in head.splitlines()[1:] if ":" in h}
    replayed = headers.get("idempotent-replayed") == "true"
    if what == "forwarded":
        # Answered by the demo service now (its JSON carries `n`, how often it ran), not replayed.
        assert not replayed and "n" in (try_json(body) or {}), "%s\nprinted:\n%s" % (line, out[:2000])
    elif what == "replayed":
        assert replayed, "%s\nprinted:\n%s\nexpected idempotent-replayed: true" % (line, out[:2000])
    else:
        assert (try_json(body) or {}).get("code") == what, "%s\nprinted:\n%s\nexpected code %s" % (
            line, out[:2000], what)


def try_json(body):
    try:
        return json.loads(body)
    except ValueError:
        return None


@pytest.fixture
def make_run(workdir):
    """The stack `make run` starts (scripts/demo.py --serve without the wait), on free or default ports."""
    d = demo.Demo()
    d.start()
    yield d
    d.stop()


def test_every_try_it_line_prints_what_its_comment_says(make_run, workdir):
    lines = demo.try_it(*make_run.try_it_addresses()).splitlines()
    checked = [i for i, l in enumerate(lines) if expectation(l)]
    assert len(checked) >= 12, lines
    # One shell runs them in order (the token variable carries over, the background request runs
    # while the next line is sent); each checked line's output goes to its own file.
    script = ["set -u"]
    for i, line in enumerate(lines):
        script.append("{ %s\n} > %s/out.%d 2>&1" % (line, workdir, i) if i in checked else line)
    script.append("wait")
    done = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True, timeout=120,
                          cwd=str(workdir))
    assert done.returncode == 0, done.stderr
    for i in checked:
        out = (workdir / ("out.%d" % i)).read_text()
        check(lines[i], out, expectation(lines[i]))
    # The business ran once per intended action: order-1 for alice and for bob, slow-1 once.
    calls = stack.request(make_run.upstream.port, "GET", "/__calls?key=order-1").json()["calls"]
    assert calls == 2, "order-1 ran %d times (alice once, bob once)" % calls


def test_make_run_serves_a_new_users_own_policy(workdir):
    """`make run POLICIES=dir`: a refund route of the user's own, keyed on a body field, on the
    bootstrap `idem-lint envoy` writes — forwarded once, replayed, and counted with its labels."""
    policies = workdir / "my-policies"
    policies.mkdir()
    (policies / "refunds.toml").write_text(
        '[[route]]\nname = "create-refund"\nmatch = { method = "POST", path = "/refunds" }\n\n'
        '[route.key]\nfrom = "body"\nname = "/refund_id"\n')
    d = demo.Demo(policies=[str(policies)])
    d.start()
    try:
        refund = "rf-" + uuid.uuid4().hex[:8]
        send = lambda: d.envoy.request("POST", "/refunds", body=json.dumps({"refund_id": refund, "amount": 5}),
                                       headers={"authorization": "Bearer alice", "content-type": "application/json"})
        first, again = send(), send()
        assert first.status == 200 and first.header("idempotent-replayed") is None, first
        assert again.status == 200 and again.header("idempotent-replayed") == "true", again
        assert again.body == first.body
        text = d.envoy.admin("/stats/prometheus").body.decode()
        assert 'idem_requests_total{route="create-refund",outcome="replayed"} 1' in text, text[:2000]
    finally:
        d.stop()


def first_route_section():
    text = (stack.REPO / "README.md").read_text()
    at = text.index("## Protect your first route")
    return text[at:text.index("\n## ", at + 3)]


def fenced(section, lang):
    """The fenced `lang` blocks of a README section, without their list indentation."""
    blocks = re.findall(r"^( *)```%s\n(.*?)^ *```" % lang, section, re.S | re.M)
    return ["".join(l[len(indent):] + "\n" for l in body.splitlines()) for indent, body in blocks]


def test_protect_your_first_route_runs_as_printed(workdir, upstream):
    """The README's "Protect your first route", as printed: step 1's policy, step 2's `idem-lint
    bundle` and step 3's `idem-lint envoy … && envoy -c` in a shell (idem-lint from the build on
    PATH, the addresses moved to free ports); the Envoy it starts forwards the first order and
    replays the repeat."""
    lint = Path(os.environ.get("IDEM_LINT") or stack.REPO / "target" / "debug" / "idem-lint")
    assert lint.is_file(), "%s is missing: build it with `cargo build -p idem-lint`" % lint
    section = first_route_section()
    (policy,) = fenced(section, "toml")
    assert "policies/create-order.toml" in section
    shipped = tomllib.loads((stack.REPO / "policies" / "create-order.toml").read_text())["route"][0]
    shown = tomllib.loads(policy)["route"][0]
    for field in ("name", "match"):
        assert shown[field] == shipped[field], field
    for field, value in shown["key"].items():
        assert shipped["key"][field] == value, "README's [route.key] %s is not policies/create-order.toml's" % field
    (workdir / "policies").mkdir()
    (workdir / "policies" / "create-order.toml").write_text(policy)
    # Outside the repository: only Envoy's .venv is at hand (the README runs .venv/bin/envoy); the
    # filter is found where idem-lint was built, and the bootstrap names it by absolute path.
    (workdir / ".venv").symlink_to(stack.REPO / ".venv")
    bundle = re.search(r"`(idem-lint bundle [^`]*)`", section).group(1)
    (run,) = [b for b in fenced(section, "sh") if "idem-lint envoy" in b]
    listen, admin = stack.free_port(), stack.free_port()
    run = run.strip().replace("127.0.0.1:8080", "127.0.0.1:%d --listen %d --admin %d" % (upstream.port, listen, admin))
    env = dict(os.environ, PATH="%s:%s" % (lint.parent, os.environ["PATH"]))
    done = subprocess.run(["bash", "-c", bundle], cwd=str(workdir), env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "create-order" in (workdir / "idem-filter.yaml").read_text(), done.stderr
    gateway = subprocess.Popen(["bash", "-c", "exec > envoy.log 2>&1; " + run], cwd=str(workdir), env=env,
                               start_new_session=True)
    try:
        def live():
            try:
                return stack.request(admin, "GET", "/ready", timeout=2).status == 200
            except OSError:
                return False
        # Envoy binds its listeners before its workers accept: ready is what its admin says.
        stack.wait_until(lambda: gateway.poll() is not None or live(), 60, interval=0.2)
        assert gateway.poll() is None and live(), (workdir / "envoy.log").read_text()[-3000:]
        key = "readme-" + uuid.uuid4().hex[:8]
        send = lambda: stack.request(listen, "POST", "/api/order/create", body={"sku": "BOOK-42", "qty": 1},
                                     headers={"authorization": "Bearer alice", "idempotency-key": key})
        first = send()
        assert first.status == 200 and first.header("idempotent-replayed") is None, first
        again = send()
        assert again.status == 200 and again.header("idempotent-replayed") == "true", again
        assert upstream.calls(key) == 1
        # Envoy flushes its access log every 10 s, and on shutdown.
        os.killpg(gateway.pid, signal.SIGTERM)
        line = "\"POST /api/order/create\" 200 idem_route=create-order idem_outcome=replayed"
        stack.wait_until(lambda: line in (workdir / "envoy.log").read_text(), 20)
        log = (workdir / "envoy.log").read_text()
        assert line in log, "the bootstrap logs each request with idem's decision:\n" + log[-2000:]
    finally:
        if gateway.poll() is None:
            os.killpg(gateway.pid, 9)
            gateway.wait(10)


DOCS = ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md", "CHANGELOG.md", "policies/README.md",
        "tests/e2e/README.md", "lint/README.md", "lint/POLICIES.md"] + sorted(
    str(p.relative_to(stack.REPO)) for p in (stack.REPO / "docs").glob("*.md"))


def anchors(path):
    """GitHub's heading anchors of a Markdown file."""
    out = set()
    inside = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        if not inside and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_link_between_the_docs_resolves():
    """The README was split into docs/: every relative link (and #anchor) still lands."""
    broken = []
    for doc in DOCS:
        path = stack.REPO / doc
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append("%s: %s (no such file)" % (doc, target))
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append("%s: %s (no such heading)" % (doc, target))
    assert not broken, "\n".join(broken)
    assert len((stack.REPO / "README.md").read_text().splitlines()) <= 200, "the README is a first read"
