"""idem-lint where CI pipelines get their linters, each tried the way a user runs it: the wheel
(maturin, `bindings = "bin"`) installed into a fresh venv with no Rust on PATH; the pre-commit hook
of .pre-commit-hooks.yaml through PyPI's pre-commit (`try-repo`, offline); the GitHub Action's
command line; and the crates packaged as `cargo publish --dry-run` would publish them."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import stack

VENV_BIN = stack.REPO / ".venv" / "bin"
WHEELHOUSE = stack.REPO / ".venv" / "wheelhouse"
GOOD = stack.REPO / "examples" / "openapi.yaml"
BAD_SPEC = """\
openapi: 3.0.3
info: { title: shop, version: "1" }
paths:
  /orders:
    post:
      description: Creates an order.
      responses: { '201': { description: created } }
"""


# Every build here (the wheel, pre-commit's install, cargo publish's check) is about packaging,
# not speed. They share one target directory of their own and the dev profile, so the
# dependencies are compiled once for the three (about 80 s in a fresh clone; a release-like
# profile for two of them and the dev profile for the third compiled everything twice). Not
# target/ itself: idem-filter is a cdylib too, so its rlib has no hash in its name, and a packaged
# build (other features) would overwrite the workspace's `deps/libidem_filter.rlib` under
# cargo's nose. The release profile's LTO is what `make dist` ships; it changes nothing these
# tests look at.
PACKAGING_TARGET = stack.REPO / "target" / "packaging"
DEV_BUILD = {"CARGO_TARGET_DIR": str(PACKAGING_TARGET), "MATURIN_PEP517_ARGS": "--profile dev",
             # A packaged crate is a workspace of its own, without ours' [profile.dev].
             "CARGO_PROFILE_DEV_DEBUG": "line-tables-only"}


def run(argv, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 600)
    return subprocess.run([str(a) for a in argv], **kw)


def no_rust_env(venv):
    """PATH with the venv and the system, without ~/.cargo/bin: what a Java or Go team's CI has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CARGO", "RUSTUP", "VIRTUAL_ENV"))}
    env["PATH"] = "%s:/usr/local/bin:/usr/bin:/bin" % (venv / "bin")
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """`make dist`'s wheel, on the dev profile (see above), built into a fresh directory."""
    out = tmp_path_factory.mktemp("wheels")
    done = run([VENV_BIN / "maturin", "build", "--profile", "dev", "-o", out], cwd=stack.REPO, timeout=900,
               env=dict(os.environ, **DEV_BUILD))
    assert done.returncode == 0, done.stdout + done.stderr
    wheels = sorted(out.glob("idem_lint-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A new venv with only the wheel installed (no index, no Rust)."""
    venv = tmp_path_factory.mktemp("venv")
    assert run([sys.executable, "-m", "venv", venv]).returncode == 0
    done = run([venv / "bin" / "pip", "install", "--no-index", "--disable-pip-version-check", wheel],
               env=no_rust_env(venv))
    assert done.returncode == 0, done.stdout + done.stderr
    return venv


def test_the_wheel_runs_idem_lint_without_rust(installed, tmp_path):
    env = no_rust_env(installed)
    assert shutil.which("cargo", path=env["PATH"]) is None and shutil.which("rustc", path=env["PATH"]) is None
    exe = shutil.which("idem-lint", path=env["PATH"])
    assert exe == str(installed / "bin" / "idem-lint"), exe
    clean = run(["idem-lint", GOOD], env=env, cwd=tmp_path)
    assert (clean.returncode, clean.stdout.strip()) == (0, "idem-lint: no findings in 1 spec"), clean
    bad = tmp_path / "openapi.yaml"
    bad.write_text(BAD_SPEC)
    found = run(["idem-lint", "--color", "never", bad], env=env, cwd=tmp_path)
    assert found.returncode == 1, found
    assert "error[IDEM001]: POST /orders has no 幂等性说明" in found.stdout, found.stdout
    version = run(["idem-lint", "--version"], env=env)
    assert version.returncode == 0 and version.stdout.startswith("idem-lint "), version


def git(cwd, *args):
    done = run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t"] + list(args), cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_pre_commit_runs_the_hook_on_the_specs(tmp_path):
    """PyPI's pre-commit installs the hook from this repository (pyproject.toml: maturin builds the
    binary, offline from the wheelhouse) and runs it on a project's specs: the one without a
    幂等性说明 fails the commit, the documented one has no finding, the README is not a spec."""
    assert sorted(WHEELHOUSE.glob("maturin-*.whl")), "run `make setup` (scripts/setup.sh keeps the maturin wheel)"
    project = tmp_path / "project"
    (project / "api").mkdir(parents=True)
    (project / "api" / "openapi.yaml").write_text(BAD_SPEC)
    (project / "api" / "orders-openapi.yaml").write_text(GOOD.read_text())
    (project / "README.md").write_text("not a spec\n")
    git(project, "init", "-q")
    git(project, "add", ".")
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "pre-commit"), PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(WHEELHOUSE), **DEV_BUILD)
    done = run([VENV_BIN / "pre-commit", "try-repo", stack.REPO, "idem-lint", "--all-files", "--color", "never"],
               cwd=project, env=env, timeout=1200)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "idem-lint (幂等性说明)" in out and "Failed" in out, out
    assert "api/openapi.yaml" in out and "IDEM001" in out, out
    # Both specs were handed to the hook (its `files` pattern), the README was not.
    assert "1 error, 0 warnings in 2 specs" in out and "orders-openapi.yaml:" not in out, out


def action_steps():
    action = yaml.safe_load((stack.REPO / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    assert set(action["inputs"]) == {"specs", "policies", "version", "args"}
    return action["runs"]["steps"]


def test_the_action_installs_idem_lint_and_annotates_findings(wheel, tmp_path):
    """The action's two steps as GitHub runs them (bash, inputs through the environment), with PyPI
    replaced by the wheel (pip's find-links) in a fresh venv."""
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", venv]).returncode == 0
    env = no_rust_env(venv)
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheel.parent))
    bad = tmp_path / "openapi.yaml"
    bad.write_text(BAD_SPEC)
    inputs = {"specs": str(bad), "policies": "", "version": "", "args": "--color never"}
    codes = []
    for step in action_steps():
        assert step["shell"] == "bash" and "${{" not in step["run"], "inputs must come through env: %r" % step
        step_env = dict(env)
        for name, value in step.get("env", {}).items():
            m = re.fullmatch(r"\$\{\{ inputs\.(\w+) \}\}", value)
            assert m, "an env value that is not one input: %r" % value
            step_env[name] = inputs[m.group(1)]
        done = run(["bash", "-e", "-c", step["run"]], env=step_env, cwd=tmp_path)
        codes.append(done.returncode)
        last = done
    assert codes[0] == 0, codes
    assert codes[1] == 1, last
    assert last.stdout.startswith("::error file=%s,line=" % bad), last.stdout
    assert "IDEM001" in last.stdout


def test_the_crates_package_for_crates_io():
    """`cargo publish --dry-run` of both crates (idem-lint depends on idem-filter by version)."""
    cargo = shutil.which("cargo") or str(os.path.expanduser("~/.cargo/bin/cargo"))
    target = PACKAGING_TARGET
    # The packaged idem-filter is served to idem-lint from a local registry under one version:
    # cargo takes registry sources as immutable and would reuse the copy an earlier run extracted
    # (into CARGO_HOME) or built. Only those are cleared: the local registry's build of idem-filter
    # (its dep-info lists no source file, as for every registry crate; a workspace or packaged
    # build's lists `src/…`), never the workspace's builds or crates.io's sources.
    cargo_home = Path(os.environ.get("CARGO_HOME", os.path.expanduser("~/.cargo")))
    stale = list(target.glob("package"))
    stale += [p for p in target.glob("debug/.fingerprint/idem-filter-*")
              if (p / "dep-lib-idem_filter").is_file() and b".rs" not in (p / "dep-lib-idem_filter").read_bytes()]
    stale += [p for p in cargo_home.glob("registry/src/*/idem-filter-*") if not p.parent.name.startswith("index.")]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    done = run([cargo, "publish", "--dry-run", "--allow-dirty", "-p", "idem-filter", "-p", "idem-lint"],
               cwd=stack.REPO, timeout=900, env=dict(os.environ, **DEV_BUILD))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Packaging idem-lint" in done.stderr and "aborting upload due to dry run" in done.stderr, done.stderr
