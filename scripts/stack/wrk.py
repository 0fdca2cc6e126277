"""wrk, the load generator of the bench and the memory tests: run it, parse its report."""

import os
import re
import shutil
import subprocess

from .common import REPO, SETUP_HINT, StackError

WRK = shutil.which("wrk") or "/usr/bin/wrk"
WRK_SCRIPTS = REPO / "scripts" / "wrk"
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def require_wrk():
    if not (os.path.isfile(WRK) and os.access(WRK, os.X_OK)):
        raise StackError("wrk not found; %s (apt-get install -y wrk)" % SETUP_HINT)
    return WRK


def _ms(text):
    m = re.match(r"^([0-9.]+)(us|ms|s|m)$", text.strip())
    if not m:
        raise ValueError("unparsable wrk latency %r" % text)
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out):
    res = {"requests": 0, "rps": 0.0, "p50_ms": None, "p99_ms": None, "non_2xx": 0, "socket_errors": 0}
    m = re.search(r"^\s*(\d+) requests in", out, re.M)
    if m:
        res["requests"] = int(m.group(1))
    m = re.search(r"^Requests/sec:\s*([0-9.]+)", out, re.M)
    if m:
        res["rps"] = float(m.group(1))
    for pct, name in (("50", "p50_ms"), ("99", "p99_ms")):
        m = re.search(r"^\s*%s(?:\.000)?%%\s+(\S+)" % pct, out, re.M)
        if m:
            res[name] = _ms(m.group(1))
    m = re.search(r"Non-2xx or 3xx responses:\s*(\d+)", out)
    if m:
        res["non_2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["socket_errors"] = sum(int(x) for x in m.groups())
    return res


def run_wrk(port, path="/", script=None, script_args=(), duration=3.0, connections=16, threads=2, timeout_s=5):
    """Run wrk against 127.0.0.1:port and return parse_wrk() of its output (plus 'raw')."""
    argv = [require_wrk(), "-t%d" % threads, "-c%d" % connections, "-d%gs" % duration, "--latency",
            "--timeout", "%ds" % timeout_s]
    if script:
        argv += ["-s", str(script)]
    argv.append("http://127.0.0.1:%d%s" % (port, path))
    if script_args:
        argv += ["--"] + [str(a) for a in script_args]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + timeout_s + 30)
    if p.returncode != 0:
        raise StackError("wrk failed (%d): %s %s" % (p.returncode, p.stdout[-500:], p.stderr[-500:]))
    res = parse_wrk(p.stdout)
    res["raw"] = p.stdout
    return res
