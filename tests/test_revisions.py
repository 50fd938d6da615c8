"""Revision against revision (``--baseline``, ``kvspec diff``, ``--oracle invariants``) on engine
trees built from git revisions, each imported under its own module namespace.

The fixture is a small git repository shaped like InfiniLM (``python/infinilm/llm/…``) whose block
manager is kvspec's own impl (no engine code): revision ``first``; ``reworded``, the same
behaviour in other text; ``planted``, one planted line (a counter not decremented); ``broken``, a
module that does not import; ``old``, a revision without the files the tree needs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.engines import trees
from kvspec.targets import TargetError, load_target

BM = "infinilm-block-manager"

_PREFIX = '"""Fixture: a sibling module the block manager imports absolutely."""\nMARK = "{mark}"\n'
_MANAGER = '''"""Fixture: InfiniLM's block-manager module, kvspec's impl behind it."""
from infinilm.llm.prefix_cache import MARK
from impl.infinilm.block_manager import BlockManager as _Impl


class BlockManager(_Impl):
    mark = MARK
'''
# the planted line: truncate_blocks forgets to give the truncated pages back to the counter
_PLANTED = '''"""Fixture: one line changed."""
from infinilm.llm.prefix_cache import MARK
from stateful_tests.mutants_infinilm import BLOCK_MANAGER_MUTANTS

BlockManager = next(
    m.cls for m in BLOCK_MANAGER_MUTANTS if m.name == "counter_not_decremented_in_truncate"
)
'''


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def _commit(repo: Path, tag: str, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = repo / "python" / "infinilm" / "llm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", tag)
    _git(repo, "tag", tag)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("engine")
    _git(root, "init", "-q")
    _commit(root, "old", {"cache_manager.py": _MANAGER})  # no prefix_cache.py, no scheduler…
    rest = {f"{name}.py": "" for name in ("request", "sampling_params")}
    rest["scheduler.py"] = "from impl.infinilm.scheduler import Scheduler  # noqa: F401\n"
    _commit(root, "first", {"prefix_cache.py": _PREFIX.format(mark="first"), **rest})
    _commit(root, "reworded", {"prefix_cache.py": _PREFIX.format(mark="v1 again")})
    _commit(root, "planted", {"cache_manager.py": _PLANTED})
    _commit(root, "broken", {"cache_manager.py": "def broken(:\n"})
    return root


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVSPEC_TREE_CACHE", str(tmp_path / "trees"))


def test_two_revisions_import_side_by_side_under_their_own_namespaces(repo: Path) -> None:
    _, old = load_target(BM, f"git:{repo}@first")
    _, new = load_target(BM, f"infinilm@git:{repo}@reworded")
    assert (old.mark, new.mark) == ("first", "v1 again")  # type: ignore[attr-defined]  # each saw its own sibling module
    assert old.__module__ != new.__module__
    assert all(m.startswith("_kvspec_tree_") for m in (old.__module__, new.__module__))
    assert "infinilm" not in sys.modules  # nothing leaked under the engine's own name
    assert (
        trees.git_version(repo, "first")
        == "0+g"
        + subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=12", "first"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )  # no release tag: an unreleased version


def test_diff_of_equal_behaviour_is_unchanged(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["diff", BM, f"git:{repo}@first", f"git:{repo}@reworded", "--ops", "3000"]
    assert main([*args, "--explore-seconds", "5", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["unchanged"] is True
    assert [s["stage"] for s in document["stages"]] == ["check", "fuzz", "explore"]
    assert all(s["status"] == "pass" for s in document["stages"])
    assert document["baseline"] == f"git:{repo}@first"


def test_a_planted_line_is_caught_by_the_baseline_and_by_the_invariants(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["diff", BM, f"git:{repo}@first", f"git:{repo}@planted", "--stages", "fuzz", "--json"]
    assert main(args) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["unchanged"] is False
    cx = document["stages"][0]["counterexample"]
    assert cx["check"] == "referenced_count_matches_live_pages"
    assert "the baseline too" not in cx["detail"]  # the target alone breaks it
    trace = json.loads(Path(cx["trace_file"]).read_text())
    assert trace["oracle"] == {"kind": "baseline", "label": f"git:{repo}@first"}
    assert main(["replay", cx["trace_file"], "--json"]) == 1  # the baseline comes from the trace
    capsys.readouterr()
    fuzz = [
        "fuzz",
        BM,
        "--target",
        f"git:{repo}@planted",
        "--oracle",
        "invariants",
        "--ops",
        "3000",
    ]
    assert main([*fuzz, "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["oracle"] == "invariants"
    assert document["counterexample"]["check"] == "referenced_count_matches_live_pages"


@pytest.mark.parametrize(
    ("baseline", "says"),
    [
        ("impl.vllm.offload_manager:CPUOffloadingManager", "lacks the infinilm-block-manager API"),
        ("git:{repo}@broken", "importing infinilm.llm.cache_manager from git:"),
        ("git:{repo}@old", "lacks infinilm/llm/prefix_cache.py"),
        ("git:{repo}@no-such-tag", "rev-parse"),
        ("vllm@git:{repo}@first", "infinilm-block-manager has no vllm target"),
    ],
)
def test_bad_baselines_are_exit_2_in_one_line(
    repo: Path, baseline: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["fuzz", BM, "--baseline", baseline.format(repo=repo), "--ops", "10"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and says in err and err.startswith("kvspec: --baseline")


def test_oracle_arguments_that_contradict_are_exit_2() -> None:
    assert main(["check", BM, "--oracle", "baseline"]) == 2
    assert main(["check", BM, "--oracle", "invariants", "--baseline", "impl"]) == 2
    with pytest.raises(TargetError, match="no repository"):
        load_target(BM, "git:/nonexistent/repo@first")


def test_the_explorer_drives_a_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    mutant = "mutant:counter_not_decremented_in_truncate"
    assert main(["explore", BM, "--target", mutant, "--baseline", "impl", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["oracle"] == "baseline" and document["baseline"] == "impl"
    assert document["violations"][0]["replay"] == "reproduced"
    assert main(["explore", "vllm-lru", "--oracle", "invariants", "--json"]) == 0


SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "kvspec-diff.sh"


def _script(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KVSPEC_DIFF_ARGS": "--stages fuzz --ops 2000"}
    return subprocess.run(
        ["bash", str(SCRIPT), str(repo), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def test_the_ci_script_runs_the_touched_components_base_against_head(repo: Path) -> None:
    """examples/kvspec-diff.sh, as the GitHub workflow runs it: the components whose modelled
    files changed, each base -> head."""
    same = _script(repo, "first", "reworded")  # prefix_cache.py changed: both components
    assert same.returncode == 0, same.stdout + same.stderr
    assert "kvspec diff infinilm-block-manager first -> reworded" in same.stdout
    assert "kvspec diff infinilm-scheduler first -> reworded" in same.stdout
    assert " ".join(same.stdout.split()).count(": unchanged") == 2
    changed = _script(repo, "reworded", "planted", "infinilm-block-manager")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert "CHANGED" in changed.stdout
    assert _script(repo, "first", "no-such-rev").returncode == 2
    untouched = _script(repo, "first", "first")
    assert untouched.returncode == 0 and "no modelled file changed" in untouched.stdout


@pytest.mark.skipif(
    not os.environ.get("KVSPEC_SGLANG_WHEEL"), reason="KVSPEC_SGLANG_WHEEL (a real wheel) not set"
)
def test_two_trees_of_the_real_sglang_release_run_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The release's own RadixCache from its wheel (built into the cache) against the same code
    in a second tree (built by hand): two module namespaces of one engine, no difference."""
    from kvspec.engines.sglang import sglang_standins

    wheel = os.environ["KVSPEC_SGLANG_WHEEL"]
    other = tmp_path / "tree"
    sglang_standins.build(Path(wheel), other)
    _, new = load_target("sglang-radix-cache", f"sglang@{wheel}")
    _, old = load_target("sglang-radix-cache", f"sglang@{other}")
    assert new.__module__ != old.__module__ or new is not old
    args = ["diff", "sglang-radix-cache", f"sglang@{other}", f"sglang@{wheel}", "--ops", "1500"]
    assert main([*args, "--stages", "fuzz", "--inputs", "well-formed", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["unchanged"] is True
