"""A newcomer's first run: a regular install of the working tree into a new virtual environment,
without any extra, then ``kvspec verify --quick`` from an empty folder.

This is what the README's first command promises, checked the way a user meets it: nothing from
the development environment (pytest, torch, the source tree on ``sys.path``) can make a stage pass
that would fail on a plain install, and a stage that cannot run says which extra to install. It
takes a few minutes (the install, then the quick run); ``KVSPEC_SKIP_FRESH_INSTALL=1`` skips it
for a local run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from kvspec.generic_mutation import copy_repo

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    os.environ.get("KVSPEC_SKIP_FRESH_INSTALL") == "1", reason="KVSPEC_SKIP_FRESH_INSTALL=1"
)


def _clean_env() -> dict[str, str]:
    """The environment of a new shell: no path or venv of this test run leaks in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.pop("HYPOTHESIS_PROFILE", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def test_regular_install_runs_verify_quick_from_an_empty_folder(tmp_path: Path) -> None:
    source = copy_repo(ROOT, tmp_path / "source")  # a build writes build/ beside the sources
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = _clean_env()
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(source)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]

    empty = tmp_path / "elsewhere"
    empty.mkdir()
    where = subprocess.run(
        [str(python), "-c", "import kvspec, spec, pytest"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "No module named 'pytest'" in where.stderr  # a plain install: no test extra
    site = subprocess.run(
        [str(python), "-c", "import kvspec, spec; print(kvspec.__file__); print(spec.__file__)"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(Path(p).is_relative_to(env_dir) for p in site), site  # not the source tree
    ours = ("kvspec", "spec", "impl", "proofs", "stateful_tests", "gpu_smoke")
    (site_packages,) = (env_dir / "lib").glob("python*/site-packages")
    installed = [p for package in ours for p in (site_packages / package).rglob("test_*.py")]
    assert all((site_packages / package).is_dir() for package in ours)
    assert installed == []  # pytest modules live in tests/, outside the packages

    run = subprocess.run(
        [str(env_dir / "bin" / "kvspec"), "verify", "--quick", "--json"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert run.stdout.strip(), run.stderr[-3000:]
    doc = json.loads(run.stdout)
    failed = [s for s in doc["stages"] if s["status"] == "fail"]
    assert run.returncode == 0 and not failed, failed or run.stderr[-3000:]
    skipped = [s for s in doc["stages"] if s["status"] == "skip"]
    for stage in skipped:  # only what needs an extra may be skipped, and it names the extra
        assert "pip install 'kvspec[" in stage["summary"], stage
    assert [s["name"] for s in skipped] == ["gpu smoke (tiny, CPU)"]  # no torch in a plain install
    assert not (empty / ".kvspec").exists() or not any((empty / ".kvspec").rglob("*.json"))
    print(
        "verify --quick on a regular install:",
        f"{sum(s['seconds'] for s in doc['stages']):.0f} stage-seconds,",
        f"{sum(s['cpu_seconds'] for s in doc['stages']):.0f} CPU-s",
        file=sys.stderr,
    )
