"""Child processes: each in its own process group with its output in a log file, and all of them
stopped when the Python process ends (the safety net behind every component's `stop()`)."""

import atexit
import itertools
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from .common import StackError

_LIVE = set()
_SEQ = itertools.count(1)


def next_seq():
    """A number unique in this Python process, to keep log and config file names apart."""
    return next(_SEQ)


@atexit.register
def _stop_leftovers():
    """Safety net: never leave a child running when the Python process ends."""
    for proc in list(_LIVE):
        try:
            proc.stop(timeout=2.0)
        except Exception:
            pass


class Proc:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, name, argv, log_path, cwd=None, env=None):
        self.name = name
        self.argv = argv
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "wb")
        self.p = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  cwd=cwd, env=env, start_new_session=True)
        _LIVE.add(self)

    @property
    def pid(self):
        return self.p.pid

    def alive(self):
        return self.p.poll() is None

    def log_tail(self, lines=40):
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout=5.0):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait(timeout=timeout)
        self._log.close()
        _LIVE.discard(self)


def wait_until(predicate, timeout, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def rss_bytes(pid):
    """Resident set size of a process (from /proc), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise StackError("no VmRSS for pid %d" % pid)


def make_workdir(prefix="idem-"):
    return Path(tempfile.mkdtemp(prefix=prefix))
