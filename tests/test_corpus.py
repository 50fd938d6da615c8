"""The real-bug corpus (issue 26): its registry, the patch machinery, and — where the release
wheels are at hand ($KVSPEC_VLLM_WHEEL, $KVSPEC_SGLANG_WHEEL; .ci/run downloads both) — every
bug put back into its release tree and caught, with the unpatched release as the control."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from kvspec import components, corpus
from kvspec.cli import main
from kvspec.engines import trees

BUGS = corpus.load()


def test_the_registry_names_each_bug_once_with_its_patch_and_a_known_component() -> None:
    assert len(BUGS) >= 1
    assert len({b.name for b in BUGS}) == len(BUGS)
    for bug in BUGS:
        components.get(bug.component)
        assert bug.engine == components.get(bug.component).engine
        assert re.search(r"#\d+", bug.upstream), bug.upstream  # an upstream PR or issue id
        assert bug.summary and bug.expected_check


def test_each_patch_is_a_small_zero_context_diff_of_the_files_the_fix_touched() -> None:
    for bug in BUGS:
        text = bug.patch.read_text()
        edited = re.findall(r"^\+\+\+ b/(\S+)$", text, flags=re.M)
        assert edited and set(edited) <= set(bug.files), (bug.name, edited, bug.files)
        changed = [
            line
            for line in text.splitlines()
            if line[:1] in "+-" and not line.startswith(("+++", "---"))
        ]
        # kvspec's own minimal edit: no context lines, a handful of changed lines
        assert not [line for line in text.splitlines() if line.startswith(" ")], bug.name
        assert 0 < len(changed) <= 24, (bug.name, len(changed))


def test_a_patch_applies_to_a_tree_and_a_stale_one_is_an_error_naming_it(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("a = 1\nb = 2\n")
    patch = tmp_path / "fix.patch"
    patch.write_text(
        "diff --git a/pkg/mod.py b/pkg/mod.py\n--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        "@@ -2 +2 @@\n-b = 2\n+b = 3\n"
    )
    corpus.apply_patch(tree, patch)
    assert (tree / "pkg" / "mod.py").read_text() == "a = 1\nb = 3\n"
    with pytest.raises(corpus.CorpusError, match=r"fix\.patch does not apply"):
        corpus.apply_patch(tree, patch)  # the old line is gone now
    assert (tree / "pkg" / "mod.py").read_text() == "a = 1\nb = 3\n"


def test_unknown_names_and_missing_wheels_are_clear_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(corpus.CorpusError, match="no corpus bug named nope"):
        corpus.select(BUGS, ["nope"])
    monkeypatch.setenv("KVSPEC_VLLM_WHEEL", str(tmp_path / "vllm-0.34.0-x.whl"))
    with pytest.raises(corpus.CorpusError, match="does not exist"):
        corpus.wheel("vllm", "0.34.0")
    bad = tmp_path / "bad.toml"
    bad.write_text('[[bug]]\nname = "x"\n')
    with pytest.raises(corpus.CorpusError, match="lacks"):
        corpus.load(bad)


def test_cli_rejects_crosshair_and_unknown_bugs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["mutants", "--corpus", "upstream", "--checkers", "crosshair"]) == 2
    assert "unknown checker(s) for the corpus: crosshair" in capsys.readouterr().err
    assert main(["mutants", "--corpus", "upstream", "--only", "nope"]) == 2
    assert "no corpus bug named nope" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real releases
def _available(engine: str) -> bool:
    given = os.environ.get(corpus.WHEEL_ENV[engine], "")
    return bool(given) and Path(given).is_file()


def _needs(engine: str) -> pytest.MarkDecorator:
    env = corpus.WHEEL_ENV[engine]
    return pytest.mark.skipif(not _available(engine), reason=f"${env} (the release wheel) unset")


@pytest.mark.parametrize("engine", sorted(corpus.WHEEL_ENV))
def test_every_patch_applies_to_its_release_tree(engine: str) -> None:
    if not _available(engine):
        pytest.skip(f"${corpus.WHEEL_ENV[engine]} (the release wheel) unset")
    for bug in [b for b in BUGS if b.engine == engine]:
        base = trees.tree_for(engine, str(corpus.wheel(engine, bug.release)))
        with corpus.patched_tree(bug, base) as tree:
            for name in bug.files:
                assert (tree / name).read_text() != (base / name).read_text(), bug.name


@_needs("vllm")
def test_the_control_rejects_a_release_that_already_diverges() -> None:
    # the control is what makes a kill mean something: a patched tree fails it
    bug = corpus.select(BUGS, ["reserved_blocks_ignored"])[0]
    base = trees.tree_for("vllm", str(corpus.wheel("vllm", bug.release)))
    assert corpus.control(bug.component, "vllm", base) is None
    with corpus.patched_tree(bug, base) as tree:
        assert "unpatched release diverges" in (corpus.control(bug.component, "vllm", tree) or "")


@pytest.mark.parametrize("engine", sorted(corpus.WHEEL_ENV))
def test_every_corpus_bug_is_caught_in_its_release(
    engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """What CI runs (``--first-kill``): each bug caught by a checker within the default budget,
    each component's unpatched release conforming."""
    if not _available(engine):
        pytest.skip(f"${corpus.WHEEL_ENV[engine]} (the release wheel) unset")
    names = [b.name for b in BUGS if b.engine == engine]
    assert names, f"the corpus has no {engine} bug"
    started = time.perf_counter()
    status = main(["mutants", "--corpus", "upstream", "--first-kill", "--json", "--only", *names])
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"]["errors"] == {}, doc["summary"]["errors"]
    assert doc["summary"]["survivors"] == [], doc["summary"]["survivors"]
    assert doc["summary"]["killed"] == len(names)
    assert status == 0
    for row in doc["corpus"]:
        assert row["killed_by"], row["name"]
        assert row["attempts"][-1]["status"] == "killed"
    with capsys.disabled():
        print(
            f"\n{engine}: {len(names)} corpus bugs caught in {time.perf_counter() - started:.1f} s"
        )
