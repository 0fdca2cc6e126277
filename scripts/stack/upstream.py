"""The demo upstream (examples/upstream.py), which counts how often it ran each key."""

import sys
import urllib.parse
from pathlib import Path

from .common import REPO, StackError
from .http import free_port, request
from .procs import Proc, wait_until

UPSTREAM_PY = REPO / "examples" / "upstream.py"


class Upstream:
    """examples/upstream.py on a free loopback port."""

    def __init__(self, workdir, port=None):
        self.port = port or free_port()
        self.proc = Proc("upstream", [sys.executable, str(UPSTREAM_PY), "--port", str(self.port)],
                         Path(workdir) / ("upstream-%d.log" % self.port))
        ok = wait_until(lambda: not self.proc.alive() or _upstream_ready(self.port), 15)
        if not ok or not self.proc.alive():
            tail = self.proc.log_tail()
            self.proc.stop()
            raise StackError("demo upstream did not start on 127.0.0.1:%d:\n%s" % (self.port, tail))

    def calls(self, key=None, transaction_id=None, event=None):
        if key is not None:
            q = "?key=" + urllib.parse.quote(key, safe="")
        elif transaction_id is not None:
            q = "?transaction_id=" + urllib.parse.quote(transaction_id, safe="")
        elif event is not None:
            q = "?event=" + urllib.parse.quote(event, safe="")
        else:
            return request(self.port, "GET", "/__calls").json()
        return request(self.port, "GET", "/__calls" + q).json()["calls"]

    def lookups(self, key):
        """How many times a gateway looked key `key` up (`GET /orders/by-key/<key>`)."""
        q = "?lookups=" + urllib.parse.quote(key, safe="")
        return request(self.port, "GET", "/__calls" + q).json()["calls"]

    def reset(self):
        request(self.port, "POST", "/__reset")

    def stop(self):
        self.proc.stop()


def _upstream_ready(port):
    try:
        return request(port, "GET", "/__health", timeout=1.0).status == 200
    except OSError:
        return False
