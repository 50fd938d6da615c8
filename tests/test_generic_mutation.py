"""``kvspec mutants --generic`` (kvspec/generic_mutation.py): configuration, the oracle tests it
names, result parsing on a fixture, the SURVIVORS.md list, exit statuses, and one real run of
cosmic-ray on a tiny sample.

The real run needs cosmic-ray (an optional dependency: it is skipped without it) and starts
about six interpreters (the unmutated oracle, ``cosmic-ray init/exec/dump`` and one pytest per
mutant) on a trimmed oracle: 10-25 s on the 2-core machine. ``KVSPEC_SKIP_GENERIC_MUTATION=1``
skips it where even that is too slow.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest

from kvspec import generic_mutation as g

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- configuration
def test_every_impl_module_has_an_oracle() -> None:
    configured = {s.path for s in g.load_modules()}
    modules = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "impl").rglob("*.py")
        if p.name != "__init__.py"
    }
    assert modules <= configured, f"no oracle in modules.toml for {sorted(modules - configured)}"
    for s in g.load_modules():
        assert s.optional or (ROOT / s.path).is_file(), s.path


def test_oracle_tests_exist() -> None:
    """Every test a module's oracle names is a file, and every ``::name`` a test in it."""
    for s in g.load_modules():
        assert s.tests and "-x" in s.pytest_args, s.path
        for node in s.tests:
            file, _, name = node.partition("::")
            assert (ROOT / file).is_file(), node
            if name:
                tree = ast.parse((ROOT / file).read_text())
                names = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
                assert name in names, node


def test_cosmic_ray_config_is_toml_with_the_module_and_its_oracle() -> None:
    spec = g.ModuleSpec(
        "impl/infinilm/block_manager.py",
        ("tests/test_block_manager.py", "stateful_tests/generic_mutation/lockstep_oracle.py::t"),
        select="impl or not spec",
        timeout=42.0,
        pytest_args=("-x", "-q"),
    )
    config = tomllib.loads(g.cosmic_ray_config(spec, python="/usr/bin/python3"))["cosmic-ray"]
    assert config["module-path"] == "impl/infinilm/block_manager.py"
    assert config["timeout"] == 42.0 and config["distributor"]["name"] == "local"
    argv = shlex.split(config["test-command"])  # cosmic-ray splits it the same way
    assert argv == [
        "/usr/bin/python3", "-m", "pytest", "-x", "-q",
        "tests/test_block_manager.py", "stateful_tests/generic_mutation/lockstep_oracle.py::t",
        "-k", "impl or not spec",
    ]  # fmt: skip
    assert spec.slug == "impl-infinilm-block_manager"


def test_oracle_environment_puts_the_copy_first(tmp_path: Path) -> None:
    env = g.oracle_env(tmp_path)
    assert env["PYTHONPATH"] == str(tmp_path)
    assert env["HYPOTHESIS_PROFILE"] == "ci" and env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_copy_repo_takes_tracked_and_untracked_files_not_ignored(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "pkg").mkdir(parents=True)
    (src / ".gitignore").write_text("ignored.txt\n")
    (src / "pkg" / "tracked.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q"], cwd=src, check=True)
    subprocess.run(["git", "add", "."], cwd=src, check=True)
    (src / "pkg" / "untracked.py").write_text("y = 2\n")
    (src / "ignored.txt").write_text("no\n")
    g.copy_repo(src, dst)
    assert (dst / "pkg" / "tracked.py").read_text() == "x = 1\n"
    assert (dst / "pkg" / "untracked.py").is_file()
    assert not (dst / "ignored.txt").exists() and not (dst / ".git").exists()


# ----------------------------------------------------------------------------- parsing
def _line(job: str, op: str, row: int, result: dict | None) -> str:
    item = {
        "job_id": job,
        "mutations": [
            {
                "module_path": "impl/x.py",
                "operator_name": f"core/{op}",
                "occurrence": 0,
                "start_pos": [row, 4],
                "end_pos": [row, 5],
                "operator_args": {},
                "definition_name": "f",
            }
        ],
    }
    return json.dumps([item, result])


DIFF = (
    "--- mutation diff ---\n--- aimpl/x.py\n+++ bimpl/x.py\n@@ -3 +3 @@\n"
    "-    a = b | c\n+    a = b & c\n"
)


def _result(worker: str, output: str | None, test: str | None, diff: str | None = "") -> dict:
    return {"worker_outcome": worker, "output": output, "test_outcome": test, "diff": diff}


FIXTURE = [
    _line("1", "NumberReplacer", 1, _result("normal", "FAILED", "killed")),
    _line("2", "AddNot", 2, _result("normal", "timeout", "killed")),
    _line("3", "ReplaceBinaryOperator_BitOr_BitAnd", 3, _result("normal", "ok", "survived", DIFF)),
    _line("4", "AddNot", 4, _result("skipped", None, None, None)),
    _line("5", "AddNot", 5, _result("exception", "Traceback", "incompetent", None)),
    _line("6", "AddNot", 6, None),
    _line("7", "AddNot", 7, _result("skipped", "filtered: annotation", None, None)),
]


def test_parse_dump_tallies_each_outcome() -> None:
    r = g.parse_dump(FIXTURE)
    assert r.module == "impl/x.py" and r.total == 7 and r.sampled and r.filtered == 1
    tally = (r.mutants, r.killed, r.timeouts, r.survived, r.incompetent, r.pending)
    assert tally == (4, 1, 1, 1, 1, 1)
    assert r.score == round(2 / 3, 4)
    (s,) = r.survivors
    assert (s["line"], s["function"], s["context"]) == (3, "f", None)
    assert s["operator"] == "ReplaceBinaryOperator_BitOr_BitAnd"
    assert (s["before"], s["after"]) == ("a = b | c", "a = b & c")
    doc = r.to_json()
    assert set(doc) >= {"module", "mutants", "killed", "survived", "timeouts", "score", "seconds"}


def test_survivors_md_rows_round_trip_with_escaped_pipes(tmp_path: Path) -> None:
    (s,) = g.parse_dump(FIXTURE).survivors
    md = tmp_path / "SURVIVORS.md"
    header = "| module | operator | before | after | verdict | why |\n|---|---|---|---|---|---|\n"
    md.write_text("# survivors\n\n" + header + g.markdown_row(s, "equivalent", "disjoint") + "\n")
    assert g.load_explained(md) == {g.survivor_key(s): "equivalent"}
    assert g.load_explained(tmp_path / "missing.md") == {}


def test_the_shipped_survivors_list_parses() -> None:
    explained = g.load_explained()
    configured = {s.path for s in g.load_modules()}
    for module, operator, before, after in explained:
        assert module in configured and operator and before and after != before
    assert set(explained.values()) <= {"equivalent", "killed"}


# ----------------------------------------------------------------------------- exit statuses
def _args(**kw: object) -> argparse.Namespace:
    base = {"json": True, "module": None, "sample": None, "seed": 0, "workdir": None}
    return argparse.Namespace(**{**base, **kw})


def test_exit_2_when_cosmic_ray_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(g, "tool_available", lambda: False)
    assert g.cmd(_args()) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cosmic-ray" in err


@pytest.mark.parametrize(
    "kw",
    [{"module": ["impl/nope.py"]}, {"sample": 0, "module": ["impl/infinilm/block_manager.py"]}],
)
def test_exit_2_on_bad_arguments(
    kw: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(g, "tool_available", lambda: True)
    assert g.cmd(_args(**kw)) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ----------------------------------------------------------------------------- a real run
@pytest.mark.skipif(not g.tool_available(), reason="cosmic-ray is not installed")
@pytest.mark.skipif(
    os.environ.get("KVSPEC_SKIP_GENERIC_MUTATION") == "1", reason="KVSPEC_SKIP_GENERIC_MUTATION=1"
)
def test_real_run_on_a_sample_of_three_mutants(tmp_path: Path) -> None:
    """cosmic-ray mutates a copy, never the checkout; three sampled mutants are judged by a
    trimmed oracle (the block manager's unit tests); a survivor not in an empty list fails."""
    config = tmp_path / "modules.toml"
    config.write_text(
        '[[module]]\npath = "impl/infinilm/block_manager.py"\n'
        'tests = ["tests/test_block_manager.py"]\nselect = "impl"\ntimeout = 30.0\n'
        'pytest = ["-x", "-q", "-p", "no:cacheprovider", "-o", "addopts="]\n'
    )
    original = (ROOT / "impl/infinilm/block_manager.py").read_bytes()
    doc = g.run(
        ["impl/infinilm/block_manager.py"],
        sample=3,
        seed=7,
        workdir=tmp_path / "work",
        config=config,
        survivors_md=tmp_path / "none.md",
    )
    assert hashlib.sha256((ROOT / "impl/infinilm/block_manager.py").read_bytes()).digest() == (
        hashlib.sha256(original).digest()
    )
    (m,) = doc["modules"]
    assert doc["tool"] == "cosmic-ray" and m["sampled"] and m["total_mutants"] > 100
    assert m["mutants"] == 3 and m["killed"] + m["timeouts"] + m["survived"] == 3
    assert m["survived"] == len(doc["survivors"])
    # an empty SURVIVORS.md: only the syntactic rules (annotation, message, repr) explain one
    assert doc["unexplained"] == sum(1 for s in doc["survivors"] if s["context"] is None)
    # the session is resumable: a second run with the same workdir re-runs nothing
    again = g.run(
        ["impl/infinilm/block_manager.py"],
        sample=3,
        seed=7,
        workdir=tmp_path / "work",
        config=config,
        survivors_md=tmp_path / "none.md",
    )
    assert again["modules"][0]["mutants"] == 3 and again["modules"][0]["seconds"] < m["seconds"]


def test_cmd_prints_a_table_and_exits_1_on_an_unexplained_survivor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (s,) = g.parse_dump(FIXTURE).survivors
    doc = {
        "tool": "cosmic-ray",
        "modules": [{**g.parse_dump(FIXTURE).to_json(), "seconds": 1.0}],
        "score": 0.5,
        "survivors": [{**s, "explained": False, "row": g.markdown_row(s)}],
        "unexplained": 1,
        "workdir": None,
    }
    monkeypatch.setattr(g, "run", lambda *a, **k: doc)
    assert g.cmd(_args(json=False)) == 1
    out = capsys.readouterr().out
    assert "impl/x.py" in out and "1 not explained" in out and "`a = b & c`" in out
    assert g.cmd(_args(json=True)) == 1
    assert json.loads(capsys.readouterr().out)["unexplained"] == 1
    monkeypatch.setattr(g, "run", lambda *a, **k: {**doc, "unexplained": 0})
    assert g.cmd(_args(json=True)) == 0
