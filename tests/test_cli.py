"""The ``kvspec`` CLI contract (docs/design.md, "CLI contract"), exercised in-process.

Exit status 0 means everything checked holds, 1 a check failed (counterexample printed and saved),
2 could not run (said in one line on stderr). ``--json`` prints exactly one JSON document on stdout.
Traces go to ``.kvspec/traces/`` under the current directory, so every test that may write one runs
in its own ``tmp_path``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from kvspec import output
from kvspec.cli import main

BM = "infinilm-block-manager"
FUZZ_KEYS = {"component", "target", "ops", "seconds", "ops_per_second", "divergences"}
CHECK_KEYS = {"component", "target", "examples", "steps", "passed", "counterexample"}
STEP_KEYS = {"method", "args", "spec", "target"}


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``main(argv)``: (exit status, stdout, stderr)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """``main([*argv, "--json"])``; the whole of stdout must be exactly one JSON object."""
    rc, out, _ = run(capsys, *argv, "--json")
    document = json.loads(out)  # raises on anything besides one document ("Extra data")
    assert isinstance(document, dict)
    return rc, document


def one_line_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``argv``, expect exit status 2 with exactly one line on stderr; return that line."""
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err!r}"
    assert lines[0].startswith("kvspec: ")
    return lines[0]


@pytest.fixture
def narrow_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pin the stderr console to 80 columns (a pipe, a CI log): the width must not decide whether a
    message takes one line, and pinning it keeps these tests independent of the terminal."""
    monkeypatch.setattr(output.ERR, "_width", 80)


def assert_counterexample(cx: Any) -> None:
    assert isinstance(cx, dict)
    assert isinstance(cx["check"], str) and cx["check"]
    assert isinstance(cx["detail"], str) and cx["detail"]
    assert isinstance(cx["steps"], list) and cx["steps"]
    for step in cx["steps"]:
        assert isinstance(step, dict)
        assert step.keys() >= STEP_KEYS
        assert isinstance(step["method"], str)
        assert isinstance(step["args"], list)


def write_subclass(path: Path, body: str) -> Path:
    path.write_text(
        "from impl.infinilm.block_manager import BlockManager\n\n\n"
        f"class Mine(BlockManager):\n{body}"
    )
    return path


# ----------------------------------------------------------------------------- fuzz
def test_fuzz_impl_passes(capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(capsys, "fuzz", BM, "--ops", "5000", "--seed", "3")
    assert rc == 0
    assert doc.keys() >= FUZZ_KEYS | {"counterexample"}
    assert doc["component"] == BM
    assert doc["target"] == "impl"
    assert doc["ops"] == 5000
    assert isinstance(doc["seconds"], int | float) and doc["seconds"] >= 0
    assert doc["ops_per_second"] is None or doc["ops_per_second"] > 0
    assert doc["divergences"] == 0
    assert doc["counterexample"] is None
    assert not (tmp_path / ".kvspec").exists()


def test_fuzz_mutant_fails_and_trace_replays(
    capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    monkeypatch.chdir(tmp_path)
    target = "mutant:lifo_free_list"
    rc, doc = run_json(capsys, "fuzz", BM, "--target", target, "--ops", "20000")
    assert rc == 1
    assert doc.keys() >= FUZZ_KEYS
    assert doc["target"] == target
    assert doc["divergences"] >= 1
    cx = doc["counterexample"]
    assert_counterexample(cx)
    trace = Path(cx["trace_file"])
    assert trace.is_file()
    assert json.loads(trace.read_text())["steps"] == cx["steps"]

    rc, replayed = run_json(capsys, "replay", str(trace))
    assert rc == 1
    assert replayed.keys() >= CHECK_KEYS
    assert replayed["target"] == target
    assert replayed["passed"] is False
    assert_counterexample(replayed["counterexample"])
    assert replayed["counterexample"]["check"] == cx["check"]

    rc, replayed = run_json(capsys, "replay", str(trace), "--target", "impl")
    assert rc == 0
    assert replayed["target"] == "impl"
    assert replayed["passed"] is True
    assert replayed["counterexample"] is None
    assert replayed["steps"] == len(cx["steps"])


def test_fuzz_failure_human_output(
    capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run(capsys, "fuzz", BM, "--target", "mutant:lifo_free_list", "--ops", "20000")
    assert rc == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    assert "trace saved to" in out
    assert "DIVERGENCE" in out
    (trace,) = (tmp_path / ".kvspec" / "traces").glob("*.json")
    steps = json.loads(trace.read_text())["steps"]
    # Table rows whose first cell is a step number (wrapped continuation rows leave it blank).
    numbers = [int(m[1]) for m in re.finditer(r"^[│|]\s*(\d+)\s+[│|]", out, re.MULTILINE)]
    assert numbers == list(range(1, len(steps) + 1))
    assert steps[0]["method"] in out


# ----------------------------------------------------------------------------- check
def test_check_spec_passes(capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(capsys, "check", BM, "--target", "spec", "--profile", "ci")
    assert rc == 0
    assert doc.keys() >= CHECK_KEYS
    assert doc["component"] == BM
    assert doc["target"] == "spec"
    assert doc["examples"] > 0
    assert doc["steps"] > 0
    assert doc["passed"] is True
    assert doc["counterexample"] is None


def test_check_mutant_fails(capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    target = "mutant:reclaim_evicts_referenced_page"
    rc, doc = run_json(capsys, "check", BM, "--target", target, "--shrink-seconds", "2")
    assert rc == 1
    assert doc.keys() >= CHECK_KEYS
    assert doc["target"] == target
    assert doc["passed"] is False
    assert doc["counterexample"] is not None
    assert_counterexample(doc["counterexample"])
    assert Path(doc["counterexample"]["trace_file"]).is_file()


# ----------------------------------------------------------------------------- FILE.py:CLASS
def test_file_target_unchanged_subclass_passes(
    capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_subclass(tmp_path / "mine.py", "    pass\n")
    target = f"{path}:Mine"
    rc, doc = run_json(capsys, "fuzz", BM, "--ops", "3000", "--target", target)
    assert rc == 0
    assert doc["target"] == target
    assert doc["ops"] == 3000
    assert doc["divergences"] == 0
    assert doc["counterexample"] is None


def test_file_target_planted_bug_fails(
    capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_subclass(
        tmp_path / "off_by_one.py",
        "    def get_num_free_blocks(self) -> int:\n"
        "        return super().get_num_free_blocks() + 1\n",
    )
    target = f"{path}:Mine"
    rc, doc = run_json(capsys, "fuzz", BM, "--ops", "3000", "--target", target)
    assert rc == 1
    assert doc["target"] == target
    assert doc["divergences"] >= 1
    assert_counterexample(doc["counterexample"])
    assert Path(doc["counterexample"]["trace_file"]).is_file()


# ----------------------------------------------------------------------------- bench
def test_bench_usable_quick(capsys: pytest.CaptureFixture[str], monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(capsys, "bench", "usable", "--quick", "--rounds", "7")
    assert rc == 0
    assert doc["suite"] == "usable"
    assert isinstance(doc["rows"], list) and doc["rows"]
    for row in doc["rows"]:
        assert isinstance(row["case"], dict) and row["case"]
        for key in ("baseline_us", "impl_us", "ratio"):
            assert isinstance(row[key], float), (key, row)
        assert row["ratio"] > 0


# ----------------------------------------------------------------------------- exit status 2
CANNOT_RUN = [
    pytest.param(["fuzz", "nosuch", "--ops", "10"], id="unknown-component"),
    pytest.param(["fuzz", BM, "--target", "no.such.module:X"], id="unknown-module"),
    pytest.param(["fuzz", BM, "--target", "impl.infinilm.block_manager:Nope"], id="missing-class"),
    pytest.param(["fuzz", BM, "--target", "mutant:nope"], id="unknown-mutant"),
    pytest.param(["fuzz", BM, "--ops", "0"], id="zero-ops"),
    pytest.param(["fuzz", BM, "--ops", "-5"], id="negative-ops"),
    pytest.param(["check", BM, "--profile", "warp"], id="unknown-profile"),
    pytest.param(["bench", "nosuch"], id="unknown-bench-suite"),
    pytest.param(["bench", "reclaim", "--rounds", "3"], id="bench-too-few-rounds"),
    pytest.param(["replay", "no-such-trace.json"], id="replay-missing-file"),
]


@pytest.mark.parametrize("argv", CANNOT_RUN)
def test_cannot_run_exits_2_with_one_line(
    argv: list[str], capsys, monkeypatch, tmp_path, narrow_stderr
) -> None:
    monkeypatch.chdir(tmp_path)
    one_line_error(capsys, *argv)
    assert not (tmp_path / ".kvspec").exists()


@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_cannot_run_prints_nothing_on_stdout_with_json(
    as_json: bool, capsys, monkeypatch, tmp_path
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "fuzz", BM, "--ops", "0", *(["--json"] if as_json else []))
    assert rc == 2
    assert out == ""
    assert "--ops" in err


def test_target_class_lacking_api(capsys, monkeypatch, tmp_path, narrow_stderr) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("class Thing:\n    pass\n")
    line = one_line_error(capsys, "fuzz", BM, "--ops", "10", "--target", f"{tmp_path}/bad.py:Thing")
    assert "missing" in line


def test_target_class_lacking_api_exits_2(capsys, monkeypatch, tmp_path) -> None:
    """The exit status and message of the case above, without the one-line requirement."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.py").write_text("class Thing:\n    pass\n")
    rc, out, err = run(capsys, "fuzz", BM, "--ops", "10", "--target", f"{tmp_path}/bad.py:Thing")
    assert rc == 2
    assert out == ""
    message = " ".join(err.split())
    assert "bad.py:Thing lacks the infinilm-block-manager API: missing allocate_slots" in message


def test_target_file_with_syntax_error(capsys, monkeypatch, tmp_path, narrow_stderr) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.py").write_text("class Mine(:\n    pass\n")
    one_line_error(capsys, "fuzz", BM, "--ops", "10", "--target", "broken.py:Mine")


NOT_A_TRACE = [
    pytest.param("this is not JSON\n", id="text"),
    pytest.param('{"hello": "world"}\n', id="json-object-without-format"),
    pytest.param("[1, 2, 3]\n", id="json-array"),
    pytest.param('{"format": "kvspec-trace/1"}\n', id="trace-format-without-fields"),
]


@pytest.mark.parametrize("text", NOT_A_TRACE)
def test_replay_of_a_file_that_is_not_a_trace(
    text: str, capsys, monkeypatch, tmp_path, narrow_stderr
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.json").write_text(text)
    line = one_line_error(capsys, "replay", "t.json")
    assert "trace" in line


# ----------------------------------------------------------------------------- verify
# The whole `kvspec verify --quick` runs end to end in tests/test_fresh_install.py (a regular
# install in a new virtual environment, from an empty folder); its exit status, JSON document and
# stages side by side are tested in tests/test_verify_output.py.
