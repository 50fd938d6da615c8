"""What a regular install (``pip install .``, a wheel) carries: the data ``kvspec verify`` reads,
and no pytest modules inside the installed packages."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

from kvspec import admission

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _packaged(path: Path) -> bool:
    """Is ``path`` matched by a ``tool.setuptools.package-data`` pattern of its package?"""
    for package, patterns in PYPROJECT["tool"]["setuptools"]["package-data"].items():
        base = ROOT / package.replace(".", "/")
        if base in path.parents:
            rel = path.relative_to(base).as_posix()
            if any(fnmatch.fnmatchcase(rel, p) for p in patterns):
                return True
    return False


def test_the_data_verify_reads_is_package_data() -> None:
    assert admission.EXAMPLE_MANIFEST.is_file() and _packaged(admission.EXAMPLE_MANIFEST)
    kept = sorted(admission._kept_counterexamples().glob("admission_soundness_*.json"))
    assert len(kept) == 3 and all(_packaged(p) for p in kept)


def test_no_pytest_module_is_installed_with_a_package() -> None:
    """setuptools installs every module of a package; pytest modules belong in tests/."""
    installed = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    roots = {pattern.rstrip("*") for pattern in installed}
    found = [p.relative_to(ROOT).as_posix() for r in roots for p in (ROOT / r).rglob("test_*.py")]
    assert found == []
