"""The tree's shape is tested: layers point down, no import cycles, one registry names the
components, files stay small, module names do not collide, and nothing points outside the
repository.

Layers (pyproject ``[tool.importlinter]``): ``spec <- impl <- stateful_tests <- proofs | gpu_smoke
<- kvspec``. import-linter (grimp) reads every import statement, function-local ones included, so a
cycle cannot hide behind an import inside a function. Test modules may import anything.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("spec", "impl", "stateful_tests", "proofs", "gpu_smoke", "kvspec")
REGISTRY = ROOT / "kvspec" / "components.py"
MAX_LINES = 800

grimp = pytest.importorskip("grimp")
pytest.importorskip("importlinter")


# a pytest module by another name: it may name components (as tests do) but follows the layers
ORACLE = "stateful_tests.generic_mutation.lockstep_oracle"


def _is_test_module(module: str) -> bool:
    leaf = module.rsplit(".", 1)[-1]
    return leaf.startswith("test_") or module == ORACLE


def python_files(root: Path = ROOT) -> Iterator[Path]:
    """Every tracked-looking Python file of the repository (no caches, no build output)."""
    skip = {".git", "build", "dist", ".kvspec", ".venv", "node_modules"}
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts)
        if parts & skip or any(p.endswith(".egg-info") or p.startswith(".") for p in parts):
            continue
        yield path


# ----------------------------------------------------------------------------- layers
def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter's verdict on the tree at ``root`` (its own pyproject contracts)."""
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
         "sys.exit(lint_imports_command())"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )  # fmt: skip


_CYCLES = """
import json, sys
import grimp
packages, skip = sys.argv[1].split(","), sys.argv[2]
graph = grimp.build_graph(*packages, cache_dir=None)
leaf = lambda m: m.rsplit(".", 1)[-1]
modules = {m for m in graph.modules if not leaf(m).startswith("test_") and m not in skip}
pairs = set()
for module in modules:
    for imported in graph.find_modules_directly_imported_by(module):
        if imported in modules and imported != module:
            if graph.chain_exists(importer=imported, imported=module):
                pairs.add(tuple(sorted((module, imported))))
print(json.dumps(sorted(pairs)))
"""


def import_cycles(root: Path) -> set[tuple[str, str]]:
    """Pairs of non-test modules of the tree at ``root`` that import each other, directly or
    through a chain (in a fresh interpreter: the tree's own packages, not this one's)."""
    result = subprocess.run(
        [sys.executable, "-c", _CYCLES, ",".join(PACKAGES), ""],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return {(a, b) for a, b in json.loads(result.stdout)}


def _copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    shutil.copy(ROOT / "pyproject.toml", root)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def test_layers_point_down() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("spec/errors.py", "kvspec.cli"),
        # the cosmic-ray oracle, a pytest module inside stateful_tests, is no exception
        ("stateful_tests/generic_mutation/lockstep_oracle.py", "kvspec.components"),
        ("impl/vllm/kv_cache_manager.py", "stateful_tests.checker"),
    ],
)
def test_a_planted_upward_import_breaks_the_layers(
    tmp_path: Path, module: str, imported: str
) -> None:
    root = _copy_tree(tmp_path)
    path = root / module
    # function-local, as the imports that used to hide cycles and the oracle's upward one were
    path.write_text(path.read_text() + f"\n\ndef _upward() -> None:\n    import {imported}\n")
    result = lint_imports(root)
    assert result.returncode != 0
    importer = module.removesuffix(".py").replace("/", ".")
    assert "BROKEN" in result.stdout and f"{importer} -> {imported}" in result.stdout


def test_no_module_is_exempt_from_the_layers() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert [rule for c in config["contracts"] for rule in c.get("ignore_imports", [])] == []


def test_the_oracle_uses_the_registry_record_of_each_component() -> None:
    """The cosmic-ray oracle cannot import the registry (it would point up): its own table of
    checker definitions and fixed options must be the registry's."""
    from kvspec import components
    from stateful_tests.generic_mutation import lockstep_oracle

    assert set(lockstep_oracle.COMPONENTS) == set(components.names())
    for name, (definition, options) in lockstep_oracle.COMPONENTS.items():
        comp = components.get(name)
        assert definition is comp.checker_def and options == dict(comp.fixed_options), name


def test_no_import_cycles() -> None:
    assert import_cycles(ROOT) == set()


def test_a_planted_cycle_is_found(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    output = root / "kvspec" / "output.py"
    output.write_text(output.read_text() + "\n\ndef _cycle() -> None:\n    import kvspec.cli\n")
    assert ("kvspec.cli", "kvspec.output") in import_cycles(root)


# ----------------------------------------------------------------------------- the registry
def component_names() -> tuple[str, ...]:
    from kvspec import components

    return components.names()


def test_no_module_outside_the_registry_names_a_component() -> None:
    """Tests may name components; code reads them from kvspec/components.py."""
    pattern = re.compile("|".join(re.escape(n) for n in component_names()))
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in python_files()
        if path != REGISTRY
        and path.relative_to(ROOT).parts[0] in PACKAGES
        and not _is_test_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


# ----------------------------------------------------------------------------- habits
def test_no_python_file_exceeds_the_line_limit() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in python_files()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def _alias_of(path: Path) -> str | None:
    """The new home a deprecated alias module forwards to (a ``# kvspec: deprecated alias of M``
    line), else ``None``."""
    found = re.search(r"^# kvspec: deprecated alias of ([\w.]+)$", path.read_text(), flags=re.M)
    return found.group(1) if found else None


def test_deprecated_aliases_only_forward_to_a_module_that_exists() -> None:
    import importlib

    aliases = {p: _alias_of(p) for p in python_files() if _alias_of(p)}
    assert aliases, "the moved python -m entry points keep an alias"
    for path, home in aliases.items():
        assert home is not None and importlib.import_module(home)
        code = [
            line
            for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith(("#", '"', "from __future__"))
        ]
        assert len(code) <= 12, f"{path} does more than forward"


def test_module_names_do_not_collide_across_layers() -> None:
    """One name, one module — except spec/ and impl/, which mirror each other on purpose."""
    seen: dict[str, list[str]] = {}
    for path in python_files():
        rel = path.relative_to(ROOT)
        if rel.parts[0] not in PACKAGES or path.name == "__init__.py" or _alias_of(path):
            continue
        mirror = rel.parts[0] in ("spec", "impl")
        key = "/".join(rel.parts[1:]) if mirror else path.name
        seen.setdefault(path.name, []).append("spec|impl/" + key if mirror else str(rel))
    collisions = {name: where for name, where in seen.items() if len(set(where)) > 1}
    assert collisions == {}


def test_nothing_points_outside_the_repository() -> None:
    """The repository stands alone: its docs/ carries what the code cites."""
    outside = re.compile(r"shared/(reference|DESIGN|STYLE)|\.\./shared")
    offenders = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if not path.is_file() or set(rel.parts) & {".git", "__pycache__", ".kvspec"}:
            continue
        if path.suffix not in (".py", ".md", ".toml", ".json", ".sh", ".txt", ".cfg") and (
            rel.parts[0] != ".ci"
        ):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if outside.search(line):
                offenders.append(f"{rel}:{n}")
    assert offenders == []
