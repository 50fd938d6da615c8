"""``kvspec mutants --corpus upstream``: bugs that really shipped, put back into real release code.

The kill matrix's planted bugs are kvspec's own subclasses of its impl. This corpus is the other
claim: each entry is a KV-bookkeeping bug that an engine fixed upstream (vLLM, SGLang), put back
into the *release tree* of a version kvspec supports as a small patch — kvspec's own minimal diff
against the release's files, ``kvspec/data/corpus/<engine>-<release>/<name>.patch`` — and run
through the same checkers as the kill matrix (``kvspec.kill_matrix``), with well-formed inputs
(real engine code does not validate its arguments, so a bad input proves nothing about the bug).

How a bug is run:

1. the release's CPU import tree is built from its wheel once (:func:`kvspec.engines.trees.tree_for`,
   cached); the wheel comes from ``$KVSPEC_VLLM_WHEEL`` / ``$KVSPEC_SGLANG_WHEEL`` or is fetched
   with ``pip download <engine>==<release> --no-deps`` into the tree cache;
2. the tree is copied and the patch applied with ``git apply`` (a patch that no longer applies is
   an error naming the file, never a silent pass);
3. the patched tree is loaded as a target (``ENGINE@TREE``, its own module namespace) and every
   chosen checker runs against it; the variant is the release's own (``r0.34`` …).

The unpatched release must conform (it does: docs/getting-started.md, "Real upstream code"); so
a divergence is the re-introduced bug. The registry is ``kvspec/data/corpus/upstream.toml``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec import components
from kvspec.engines import trees
from stateful_tests.checker import Mutant

DATA = Path(__file__).parent / "data" / "corpus"
REGISTRY = DATA / "upstream.toml"
README_START = "<!-- corpus:start -->"
README_END = "<!-- corpus:end -->"
WHEEL_ENV = {"vllm": "KVSPEC_VLLM_WHEEL", "sglang": "KVSPEC_SGLANG_WHEEL"}


class CorpusError(Exception):
    """A corpus that cannot run: an unknown bug, a release that cannot be had, a stale patch."""


@dataclass(frozen=True)
class RealBug:
    """One upstream bug: where it was fixed and how kvspec puts it back."""

    name: str
    component: str
    engine: str
    release: str
    upstream: str  # the fix: repository, pull request / issue ids
    files: tuple[str, ...]  # the upstream files the fix touched (and the patch edits)
    summary: str  # the bug's symptom and cause, in kvspec's words
    expected_check: str  # the check that should fire (documentation, not enforced)
    options: Mapping[str, Any] = field(default_factory=dict)  # checker options that reach it

    @property
    def patch(self) -> Path:
        return DATA / f"{self.engine}-{self.release}" / f"{self.name}.patch"


def load(registry: Path = REGISTRY) -> tuple[RealBug, ...]:
    """The corpus as registered (``CorpusError`` on a malformed entry or a missing patch)."""
    doc = tomllib.loads(registry.read_text())
    bugs = []
    for entry in doc.get("bug", []):
        try:
            bug = RealBug(
                name=entry["name"],
                component=entry["component"],
                engine=entry["engine"],
                release=entry["release"],
                upstream=entry["upstream"],
                files=tuple(entry["files"]),
                summary=entry["summary"],
                expected_check=entry["expected_check"],
                options=dict(entry.get("options", {})),
            )
        except KeyError as exc:
            raise CorpusError(f"{registry}: an entry lacks {exc}: {entry}") from None
        if bug.engine not in WHEEL_ENV:
            raise CorpusError(f"{bug.name}: unknown engine {bug.engine!r}")
        components.get(bug.component)  # ComponentError for an unknown one
        if not bug.patch.is_file():
            raise CorpusError(f"{bug.name}: no patch at {bug.patch}")
        bugs.append(bug)
    names = [b.name for b in bugs]
    doubles = sorted({n for n in names if names.count(n) > 1})
    if doubles:
        raise CorpusError(f"{registry}: names registered twice: {', '.join(doubles)}")
    return tuple(bugs)


def select(bugs: Sequence[RealBug], only: Sequence[str] | None) -> list[RealBug]:
    if not only:
        return list(bugs)
    known = {b.name: b for b in bugs}
    unknown = [n for n in only if n not in known]
    if unknown:
        raise CorpusError(
            f"no corpus bug named {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    return [known[n] for n in only]


# ----------------------------------------------------------------------------- release trees
def wheel(engine: str, release: str, note: Callable[[str], None] | None = None) -> Path:
    """The release wheel: ``$KVSPEC_<ENGINE>_WHEEL`` when it names that release, else one
    downloaded (``pip download --no-deps``) into the tree cache."""
    given = os.environ.get(WHEEL_ENV[engine])
    if given and f"-{release}-" in Path(given).name:
        path = Path(given)
        if not path.is_file():
            raise CorpusError(f"${WHEEL_ENV[engine]}={given} does not exist")
        return path
    into = trees.cache_dir() / "wheels"
    found = sorted(into.glob(f"{engine}-{release}-*.whl"))
    if found:
        return found[0]
    if note is not None:
        note(f"downloading {engine}=={release} (no dependencies) into {into}")
    into.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
    done = subprocess.run(
        [*pip, f"{engine}=={release}", "-d", str(into)],
        capture_output=True,
        text=True,
    )
    found = sorted(into.glob(f"{engine}-{release}-*.whl"))
    if done.returncode != 0 or not found:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise CorpusError(
            f"cannot get the {engine} {release} wheel ({last}); set ${WHEEL_ENV[engine]} to it"
        )
    return found[0]


def apply_patch(tree: Path, patch: Path) -> None:
    """Apply ``patch`` (paths ``a/…`` ``b/…`` relative to the tree) to ``tree`` in place."""
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}  # never a repository above
    done = subprocess.run(
        ["git", "apply", "--unidiff-zero", "--whitespace=nowarn", str(patch.resolve())],
        cwd=tree,
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise CorpusError(f"{patch.name} does not apply to {tree}: {done.stderr.strip()}")


@contextmanager
def patched_tree(bug: RealBug, base: Path) -> Iterator[Path]:
    """A copy of the release tree ``base`` with the bug's patch applied (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix=f"kvspec-corpus-{bug.name}-") as work:
        tree = Path(work) / "tree"
        shutil.copytree(base, tree, ignore=shutil.ignore_patterns("__pycache__"))
        apply_patch(tree, bug.patch)
        yield tree


CONTROL_OPS = 20_000


def control(component: str, engine: str, base: Path) -> str | None:
    """The unpatched release against the spec: ``CONTROL_OPS`` fuzzed well-formed calls. ``None``
    when it conforms, else why not (then a divergence of a patched copy would prove nothing)."""
    from kvspec.targets import load_target

    comp = components.get(component)
    _, cls = load_target(component, f"{engine}@{base}")
    variant = comp.target_variant(None, cls)
    r = comp.fuzz(cls, f"{engine}@{base}", CONTROL_OPS, 0, inputs="well-formed", variant=variant)
    if r.passed:
        return None
    check = r.failure.check if r.failure else "a divergence"
    return f"the unpatched release diverges from the spec ({check}): not a usable baseline"


def as_mutant(bug: RealBug, tree: Path) -> Mutant:
    """The patched release as a kill-matrix mutant: its class loaded from ``tree``, driven as the
    release's own variant, well-formed inputs."""
    from kvspec.targets import load_target

    comp = components.get(bug.component)
    _, cls = load_target(bug.component, f"{bug.engine}@{tree}")
    assert isinstance(cls, type)  # an engine target is its adapter class
    return Mutant(
        name=bug.name,
        origin=bug.upstream,
        cls=cls,
        expected_check=bug.expected_check,
        variant=comp.target_variant(None, cls),
        options=dict(bug.options),
        component=bug.component,
        inputs="well-formed",
    )


# ----------------------------------------------------------------------------- runs
@dataclass
class Outcome:
    bug: RealBug
    row: Any  # kill_matrix.Row, or None when the bug could not run
    error: str | None = None

    def cells(self, checkers: Sequence[str]) -> dict[str, str]:
        """Checker -> its table cell (the error in the first column when the bug did not run)."""
        from kvspec.kill_matrix import _cell

        if self.row is None:
            return {checkers[0]: f"error: {self.error}"}
        return {a.checker: _cell(a) for a in self.row.attempts}

    def to_json(self) -> dict[str, Any]:
        b = self.bug
        doc: dict[str, Any] = {
            "name": b.name,
            "component": b.component,
            "engine": b.engine,
            "release": b.release,
            "upstream": b.upstream,
            "files": list(b.files),
            "summary": b.summary,
            "expected_check": b.expected_check,
        }
        if self.row is not None:
            row = self.row.to_json()
            doc.update({k: row[k] for k in ("killed_by", "seconds_to_kill", "repro_steps")})
            doc["attempts"] = row["attempts"]
        doc["error"] = self.error
        return doc


def run(
    bugs: Sequence[RealBug],
    checkers: Sequence[str],
    budget: float,
    *,
    first_kill: bool = False,
    progress: Callable[[int, str], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> list[Outcome]:
    """Every bug through ``checkers`` (each within ``budget`` seconds; ``first_kill``: stop a
    bug's checkers at the first that kills it). Each component's unpatched release runs first
    (:func:`control`). A release that cannot be had, an unpatched release that diverges, or a
    patch that no longer applies, is that bug's ``error`` (never a kill)."""
    from kvspec import kill_matrix

    bases: dict[tuple[str, str], Path | CorpusError] = {}
    controls: dict[tuple[str, str, str], str | None] = {}
    out: list[Outcome] = []
    for i, bug in enumerate(bugs):
        key = (bug.engine, bug.release)
        if key not in bases:
            try:
                bases[key] = trees.tree_for(bug.engine, str(wheel(*key, note=note)))
            except (CorpusError, trees.TreeError) as exc:
                bases[key] = CorpusError(str(exc))
        base = bases[key]
        if isinstance(base, CorpusError):
            out.append(Outcome(bug, None, str(base)))
            continue
        ctl = (bug.component, *key)
        if ctl not in controls:  # once per component and release
            if progress is not None:
                progress(i, f"{bug.component} {bug.release} unpatched (control)")
            controls[ctl] = control(bug.component, bug.engine, base)
        if controls[ctl] is not None:
            out.append(Outcome(bug, None, controls[ctl]))
            continue
        try:
            with patched_tree(bug, base) as tree:
                mutant = as_mutant(bug, tree)
                attempts = []
                for name in checkers:
                    if progress is not None:
                        progress(i, f"{bug.name}: {name}")
                    try:
                        attempt = kill_matrix.CHECKERS[name](mutant, budget)
                    except Exception as exc:  # reported, never counted as a kill
                        attempt = kill_matrix.Attempt(
                            name, "error", check=f"{type(exc).__name__}: {exc}"
                        )
                    attempts.append(attempt)
                    if first_kill and attempt.killed:
                        break
                out.append(Outcome(bug, kill_matrix.Row(mutant, attempts)))
        except CorpusError as exc:
            out.append(Outcome(bug, None, str(exc)))
    if progress is not None:
        progress(len(bugs), "done")
    return out


def summary(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    ran = [o for o in outcomes if o.row is not None]
    killed = [o for o in ran if o.row.killed_by]
    return {
        "bugs": len(outcomes),
        "ran": len(ran),
        "killed": len(killed),
        "survivors": [o.bug.name for o in ran if not o.row.killed_by],
        "errors": {o.bug.name: o.error for o in outcomes if o.error},
    }


def markdown(outcomes: Sequence[Outcome], checkers: Sequence[str], budget: float) -> str:
    """The corpus table (what ``--update-readme`` writes between the corpus markers)."""
    lines = [
        f"Budget {budget:g} s per checker per bug, well-formed inputs; ✓ = killed (seconds to "
        "kill, shortest repro), — = survived, n/a = checker does not apply.",
        "",
        "| bug | release | upstream fix | component | " + " | ".join(checkers) + " |",
        "|---|---|---|---|" + "---|" * len(checkers),
    ]
    for o in outcomes:
        b, cells = o.bug, o.cells(checkers)
        lines.append(
            f"| `{b.name}` | {b.engine} {b.release} | {b.upstream} | {b.component} | "
            + " | ".join(cells.get(c, "") for c in checkers)
            + " |"
        )
    s = summary(outcomes)
    lines += ["", f"{s['killed']}/{s['bugs']} caught."]
    return "\n".join(lines)
