"""``kvspec mutants --generic``: a standard mutation-testing tool over ``impl/``, kvspec as the oracle.

The planted mutants (:mod:`kvspec.mutants`) are bugs that engines really had; this is the other
half: every small syntactic change a generic tool can make to the production code, each of which
kvspec's tests and lockstep checkers should notice. The tool is **cosmic-ray** (PyPI
``cosmic-ray``), run on a *copy* of the working tree (``git ls-files``: tracked and untracked, not
ignored) in a temporary folder, because it rewrites the module on disk for each mutant.

Why cosmic-ray and not mutmut (both tried on ``impl/infinilm/block_manager.py``, 2026-12):

* **The code under test is the production code with one edit.** cosmic-ray patches the file on
  disk and runs the oracle in a fresh interpreter. mutmut 3 rewrites every function of the module
  into a trampoline that dispatches on an environment variable to one of N mutated copies
  (``xǁBlockManagerǁtry_free_blocks__mutmut_7``); the planted-bug subclasses of
  ``stateful_tests/mutants.py``, the ``__slots__`` pages and anything that reads method identity
  then run against rewritten classes, and a survivor is reported against a function copy rather
  than a line of the real file.
* **One oracle per module.** cosmic-ray takes an explicit test command per session, so the
  block manager's mutants are judged by the block-manager tests and its lockstep fuzzer, the
  scheduler's by the scheduler's (``stateful_tests/generic_mutation/modules.toml``). mutmut picks
  tests by the coverage of one global stats run over one global test selection.
* **Resumable, inspectable sessions.** A cosmic-ray session is a SQLite file; ``--workdir`` keeps
  it and a second run continues the pending mutants. ``cosmic-ray dump`` is a documented JSON-lines
  format (parsed here); mutmut's results live in undocumented ``.meta`` files. A random sample is
  a plain "skipped" mark on the other work items (``--sample``), which mutmut has no notion of.
* **A richer operator set**: every binary/comparison operator is replaced by each alternative,
  numbers, ``and``/``or``, ``not``, ``break``/``continue``, zero-iteration loops (976 mutants of
  the block manager against mutmut's 495 on the same file).

The price is speed: mutmut forks a warm pytest per mutant (5.3 mutants/s on the block manager
with its unit tests as the only oracle, measured here), cosmic-ray starts an interpreter and
pytest per mutant: 1.5 s of overhead, about 4 s per mutant with the full oracle on this 2-core
machine. A full run over impl/ takes about two and a half hours, so it is not part of the
default CI run; ``--sample N`` gives a quick, seeded estimate, and ``--budget-per-module``
stops a module after a time (cosmic-ray runs pending mutants in random order, so what ran is a
random sample; ``--workdir`` resumes it later).

Mutants inside type annotations are filtered out before running (never evaluated, see
:data:`CONTEXT_RULES`); survivors inside exception messages or ``__repr__`` are explained by rule.
Survivors are listed, with a reason each, in ``stateful_tests/generic_mutation/SURVIVORS.md``
(equivalent mutants, and gaps closed by ``tests/test_generic_mutation_killers.py``). Exit status:
0 every survivor is explained there, 1 some survivor is not, 2 could not run (cosmic-ray missing,
unknown module, the unmutated oracle failing).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TOOL = "cosmic-ray"
ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = ROOT / "stateful_tests" / "generic_mutation"
MODULES_TOML = CONFIG_DIR / "modules.toml"
SURVIVORS_MD = CONFIG_DIR / "SURVIVORS.md"


class GenericMutationError(Exception):
    """Could not run (the CLI exits 2 with this one-line reason)."""


class ToolMissing(GenericMutationError):
    """cosmic-ray is not installed."""


# ----------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class ModuleSpec:
    """One impl module and its oracle (a row of ``modules.toml``)."""

    path: str
    tests: tuple[str, ...]
    select: str | None = None
    timeout: float = 60.0
    optional: bool = False
    pytest_args: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_]+", "-", self.path.removesuffix(".py")).strip("-")


def load_modules(path: Path = MODULES_TOML) -> list[ModuleSpec]:
    """The module table of ``modules.toml`` (``GenericMutationError`` if it is malformed)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise GenericMutationError(f"cannot read {path}: {exc}") from None
    defaults = data.get("defaults", {})
    specs = []
    for row in data.get("module", []):
        try:
            specs.append(
                ModuleSpec(
                    path=row["path"],
                    tests=tuple(row["tests"]),
                    select=row.get("select"),
                    timeout=float(row.get("timeout", defaults.get("timeout", 60.0))),
                    optional=bool(row.get("optional", False)),
                    pytest_args=tuple(row.get("pytest", defaults.get("pytest", ["-x", "-q"]))),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GenericMutationError(f"bad [[module]] row in {path}: {row!r} ({exc})") from None
    return specs


def test_command(spec: ModuleSpec, python: str = sys.executable) -> str:
    """The oracle: a pytest run (``-x``) of the module's tests, as cosmic-ray's test-command."""
    argv = [python, "-m", "pytest", *spec.pytest_args, *spec.tests]
    if spec.select:
        argv += ["-k", spec.select]
    return shlex.join(argv)


def cosmic_ray_config(spec: ModuleSpec, python: str = sys.executable) -> str:
    """The cosmic-ray session configuration (TOML) for one module; paths relative to the copy."""
    return "\n".join(
        [
            "[cosmic-ray]",
            f"module-path = {json.dumps(spec.path)}",
            f"timeout = {spec.timeout!r}",
            "excluded-modules = []",
            f"test-command = {json.dumps(test_command(spec, python))}",
            "",
            "[cosmic-ray.distributor]",
            'name = "local"',
            "",
        ]
    )


def oracle_env(repo: Path) -> dict[str, str]:
    """The environment of every oracle run: the copy first on the path (it must shadow the
    editable install of the original checkout), derandomized hypothesis, no bytecode files (a
    mutant that keeps the file's size within the same second must not reuse a stale ``.pyc``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(repo)
    env["HYPOTHESIS_PROFILE"] = "ci"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("PYTHONSTARTUP", None)
    return env


# ----------------------------------------------------------------------------- the copy
def copy_repo(src: Path, dst: Path) -> Path:
    """Copy the working tree of ``src`` (tracked and untracked files git does not ignore; every
    file but caches when ``src`` is not a git checkout) into ``dst``; returns ``dst``."""
    dst.mkdir(parents=True, exist_ok=True)
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=src,
            check=True,
            capture_output=True,
        ).stdout.split(b"\0")
        files = [src / os.fsdecode(f) for f in listed if f]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "__pycache__", ".hypothesis", ".pytest_cache", ".mypy_cache", ".kvspec"}
        files = [p for p in src.rglob("*") if p.is_file() and not skip & set(p.parts)]
    for f in files:
        if not f.is_file():  # deleted in the working tree but still tracked
            continue
        target = dst / f.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)
    return dst


# ----------------------------------------------------------------------------- results
@dataclass
class ModuleResult:
    module: str
    mutants: int = 0  # mutants run (sampled ones only, when sampling)
    total: int = 0  # mutants the tool generated for the module
    killed: int = 0  # a test of the oracle failed
    timeouts: int = 0  # the oracle ran past the timeout (counted as killed in the score)
    survived: int = 0
    incompetent: int = 0  # the tool could not run the mutant (not in the score)
    filtered: int = 0  # equivalent by construction (in a type annotation): not run
    pending: int = 0
    seconds: float = 0.0
    sampled: bool = False
    survivors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def score(self) -> float | None:
        judged = self.killed + self.timeouts + self.survived
        return round((self.killed + self.timeouts) / judged, 4) if judged else None

    def to_json(self) -> dict[str, Any]:
        return {
            "module": self.module,
            "mutants": self.mutants,
            "total_mutants": self.total,
            "sampled": self.sampled,
            "killed": self.killed,
            "survived": self.survived,
            "timeouts": self.timeouts,
            "incompetent": self.incompetent,
            "filtered": self.filtered,
            "pending": self.pending,
            "complete": not self.sampled and self.pending == 0,
            "score": self.score,
            "seconds": round(self.seconds, 1),
        }


def diff_lines(diff: str) -> tuple[str, str]:
    """The original and the mutated source line of a cosmic-ray diff (stripped)."""
    before = after = ""
    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("-") and not before:
            before = line[1:].strip()
        elif line.startswith("+") and not after:
            after = line[1:].strip()
    return before, after


def parse_dump(
    lines: Iterable[str], module: str | None = None, source: str | None = None
) -> ModuleResult:
    """Tally ``cosmic-ray dump`` output (JSON lines ``[work_item, result | null]``).

    Work items marked *skipped* are not mutants that ran: those whose output starts with
    ``filtered`` are equivalent by construction (``filtered``), the others were left out of a
    sample; *no-test* items are ignored; a *killed* result whose output is ``"timeout"`` is a
    timeout; *incompetent* results are counted apart and kept out of the score. With the
    module's ``source``, each survivor gets its ``context`` (see :data:`CONTEXT_RULES`).
    """
    result = ModuleResult(module or "")
    spans = contexts(source) if source is not None else []
    for raw in lines:
        if not raw.strip():
            continue
        item, outcome = json.loads(raw)
        (mutation,) = item["mutations"]
        if not result.module:
            result.module = mutation["module_path"]
        result.total += 1
        if outcome is None:
            result.pending += 1
            continue
        worker = outcome.get("worker_outcome")
        if worker == "skipped":
            if (outcome.get("output") or "").startswith(FILTERED):
                result.filtered += 1
            else:
                result.sampled = True
            continue
        if worker == "no-test":
            continue
        result.mutants += 1
        test = outcome.get("test_outcome")
        if worker != "normal" or test == "incompetent":
            result.incompetent += 1
        elif test == "survived":
            result.survived += 1
            before, after = diff_lines(outcome.get("diff") or "")
            result.survivors.append(
                {
                    "module": result.module,
                    "line": mutation["start_pos"][0],
                    "operator": mutation["operator_name"].removeprefix("core/"),
                    "function": mutation.get("definition_name"),
                    "context": context_of(spans, mutation["start_pos"]),
                    "before": before,
                    "after": after,
                    "diff": outcome.get("diff") or "",
                }
            )
        elif (outcome.get("output") or "").strip() == "timeout":
            result.timeouts += 1
        else:
            result.killed += 1
    result.survivors.sort(key=lambda s: (s["line"], s["operator"]))
    return result


# ----------------------------------------------------------------------------- contexts
# Where a mutation sits decides, for some places, that it cannot change behaviour kvspec checks:
#
# * ``annotation``: a type annotation. Every impl module starts with ``from __future__ import
#   annotations``, so annotations are strings that are never evaluated. These mutants are
#   equivalent by construction; they are filtered out before running (``filtered`` in the report).
# * ``message``: inside the message of a ``raise``/``assert``. Exceptions are part of the contract
#   by *kind* (docs/design.md; the lockstep compares kinds), not by message text. They run (an
#   expression in a message can itself raise), and a survivor there is explained by this rule.
# * ``repr``: inside ``__repr__`` (debug output, not an observable of the contract). Same.
CONTEXT_RULES = {
    "annotation": "inside a type annotation, never evaluated (from __future__ import annotations)",
    "message": "inside an exception/assertion message: exceptions are compared by kind, not text",
    "repr": "inside __repr__: debug output, not part of the snapshot or any return value",
}


def _span(node: ast.AST) -> tuple[tuple[int, int], tuple[int, int]] | None:
    end_line, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    if end_line is None or end_col is None:
        return None
    return (node.lineno, node.col_offset), (end_line, end_col)  # type: ignore[attr-defined]


def contexts(source: str) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """The annotation, message and ``__repr__`` spans of a module (1-based lines, 0-based cols)."""
    spans: list[tuple[str, tuple[int, int], tuple[int, int]]] = []

    def add(kind: str, node: ast.AST | None) -> None:
        span = _span(node) if node is not None else None
        if span is not None:
            spans.append((kind, *span))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            add("annotation", node.returns)
            if node.name == "__repr__":
                add("repr", node)
        elif isinstance(node, ast.arg | ast.AnnAssign):
            add("annotation", node.annotation)
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            for arg in node.exc.args:
                add("message", arg)
        elif isinstance(node, ast.Assert):
            add("message", node.msg)
    return spans


def context_of(
    spans: Sequence[tuple[str, tuple[int, int], tuple[int, int]]], start: Sequence[int]
) -> str | None:
    """The kind of the innermost span holding position ``start`` (``None``: ordinary code)."""
    pos = (int(start[0]), int(start[1]))
    inside = [(b, kind) for kind, b, e in spans if b <= pos < e]
    return max(inside)[1] if inside else None


# ----------------------------------------------------------------------------- SURVIVORS.md
_CELL = re.compile(r"(?<!\\)\|")


def _unmark(cell: str) -> str:
    cell = cell.strip().replace("\\|", "|")
    if len(cell) >= 2 and cell.startswith("`") and cell.endswith("`"):
        cell = cell[1:-1]
    return cell.strip()


def survivor_key(s: dict[str, Any]) -> tuple[str, str, str, str]:
    """What identifies a survivor across edits of the file: module, operator, the original and
    the mutated line (line numbers move; these do not)."""
    return (s["module"], s["operator"], " ".join(s["before"].split()), " ".join(s["after"].split()))


VERDICTS = ("equivalent", "killed")


def load_explained(path: Path = SURVIVORS_MD) -> dict[tuple[str, str, str, str], str]:
    """Explained survivors: rows ``| module | operator | `before` | `after` | verdict | reason |``
    of the markdown tables in ``SURVIVORS.md`` (``|`` inside code escaped as ``\\|``)."""
    explained: dict[tuple[str, str, str, str], str] = {}
    if not path.is_file():
        return explained
    for line in path.read_text().splitlines():
        if not line.startswith("|"):
            continue
        cells = [_unmark(c) for c in _CELL.split(line.strip().strip("|"))]
        if len(cells) < 5 or not cells[0].startswith("impl/"):
            continue
        module, operator, before, after, verdict = cells[:5]
        if verdict not in VERDICTS:  # another table (e.g. the run summary)
            continue
        key = (
            module,
            operator.removeprefix("core/"),
            " ".join(before.split()),
            " ".join(after.split()),
        )
        explained[key] = verdict
    return explained


def markdown_row(s: dict[str, Any], verdict: str = "?", reason: str = "") -> str:
    """A ``SURVIVORS.md`` row for a survivor (to paste and complete)."""

    def code(text: str) -> str:
        return "`" + text.replace("|", "\\|") + "`"

    return (
        f"| {s['module']} | {s['operator']} | {code(s['before'])} | {code(s['after'])} "
        f"| {verdict} | {reason} |"
    )


# ----------------------------------------------------------------------------- running
def tool_available() -> bool:
    return importlib.util.find_spec("cosmic_ray") is not None


def _cosmic_ray(*args: str) -> list[str]:
    return [sys.executable, "-m", "cosmic_ray.cli", *args]


def _niced(argv: list[str], nice: int) -> list[str]:
    return ["nice", "-n", str(nice), *argv] if nice and shutil.which("nice") else argv


def _mark_sample(session: Path, sample: int, seed: int) -> tuple[int, int]:
    """Keep a seeded random ``sample`` of the session's work items; mark the others skipped."""
    from cosmic_ray.work_db import WorkDB, use_db  # type: ignore[import-untyped]
    from cosmic_ray.work_item import WorkerOutcome, WorkResult  # type: ignore[import-untyped]

    with use_db(str(session), WorkDB.Mode.open) as db:
        items = sorted(
            db.pending_work_items,
            key=lambda w: (
                w.mutations[0].operator_name,
                w.mutations[0].occurrence,
                tuple(w.mutations[0].start_pos),
            ),
        )
        keep = {w.job_id for w in random.Random(seed).sample(items, min(sample, len(items)))}
        skip = [w.job_id for w in items if w.job_id not in keep]
        db.set_multiple_results(skip, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
        return len(keep), len(items)


FILTERED = "filtered:"


def _filter_annotations(session: Path, source: str) -> int:
    """Mark the pending mutants that sit in a type annotation as skipped (``filtered:``)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans = contexts(source)
    with use_db(str(session), WorkDB.Mode.open) as db:
        skip = [
            w.job_id
            for w in db.pending_work_items
            if context_of(spans, w.mutations[0].start_pos) == "annotation"
        ]
        if skip:
            db.set_multiple_results(
                skip,
                WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=f"{FILTERED} annotation"),
            )
        return len(skip)


def _count_results(session: Path) -> int:
    import sqlite3

    try:
        with sqlite3.connect(f"file:{session}?mode=ro", uri=True, timeout=1) as con:
            (n,) = con.execute(
                "select count(*) from work_results where worker_outcome != 'SKIPPED'"
            ).fetchone()
            return int(n)
    except sqlite3.Error:
        return 0


def run_module(
    spec: ModuleSpec,
    repo: Path,
    sessions: Path,
    *,
    sample: int | None = None,
    seed: int = 0,
    nice: int = 19,
    budget: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> ModuleResult:
    """Run (or resume) the cosmic-ray session of one module on the copy ``repo``.

    ``budget``: stop after that many seconds; cosmic-ray runs the pending mutants in random
    order, so the ones done are a random sample, and the rest stay ``pending`` for a later run
    with the same session folder."""
    sessions.mkdir(parents=True, exist_ok=True)
    config = sessions / f"{spec.slug}.toml"
    session = sessions / f"{spec.slug}.sqlite"
    env = oracle_env(repo)
    started = time.perf_counter()
    # cosmic-ray restores the module after each mutant; a run killed mid-mutant leaves it mutated,
    # so the first run keeps a pristine copy and every run starts from it
    pristine = sessions / f"{spec.slug}.py.orig"
    if not pristine.exists():
        shutil.copy2(repo / spec.path, pristine)
    shutil.copy2(pristine, repo / spec.path)
    config_text = cosmic_ray_config(spec)
    fresh = not session.exists() or not config.exists() or config.read_text() != config_text
    if fresh:
        session.unlink(missing_ok=True)
        config.write_text(config_text)
        # the unmutated oracle must pass, or every mutant would count as killed
        base = subprocess.run(
            _niced(shlex.split(test_command(spec)), nice),
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=spec.timeout * 3,
        )
        if base.returncode != 0:
            tail = " ".join((base.stdout + base.stderr).split()[-30:])
            raise GenericMutationError(
                f"the unmutated oracle of {spec.path} fails (exit {base.returncode}): {tail}"
            )
        subprocess.run(
            _cosmic_ray("init", str(config), str(session)),
            cwd=repo,
            env=env,
            check=True,
            capture_output=True,
        )
    source = pristine.read_text()
    _filter_annotations(session, source)
    if fresh and sample is not None:
        _mark_sample(session, sample, seed)
    total = sample
    if total is None:
        import sqlite3

        with sqlite3.connect(str(session)) as con:
            (total,) = con.execute("select count(*) from work_items").fetchone()
    proc = subprocess.Popen(
        _niced(_cosmic_ray("exec", str(config), str(session)), nice),
        cwd=repo,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: a budget stop ends it and its oracle
    )
    stopped = False
    try:
        while proc.poll() is None:
            if progress is not None:
                progress(spec.path, _count_results(session), int(total))
            if budget is not None and time.perf_counter() - started > budget:
                stopped = True
                break
            time.sleep(1.0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.copy2(pristine, repo / spec.path)  # a stopped mutant is not restored by the tool
    if proc.returncode != 0 and not stopped:
        raise GenericMutationError(
            f"cosmic-ray exec failed on {spec.path} (exit {proc.returncode})"
        )
    dump = subprocess.run(
        _cosmic_ray("dump", str(session)),
        cwd=repo,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result = parse_dump(dump.splitlines(), spec.path, source)
    result.seconds = time.perf_counter() - started
    return result


def run(
    modules: Sequence[str] | None = None,
    *,
    sample: int | None = None,
    seed: int = 0,
    workdir: Path | None = None,
    source: Path = ROOT,
    config: Path = MODULES_TOML,
    survivors_md: Path = SURVIVORS_MD,
    nice: int = 19,
    budget: float | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """The ``--json`` document: per-module tallies, the overall score, every survivor (with
    ``explained``: listed in ``SURVIVORS.md``)."""
    if not tool_available():
        raise ToolMissing("cosmic-ray is not installed (pip install cosmic-ray)")
    specs = load_modules(config)
    if modules:
        known = {s.path: s for s in specs}
        unknown = [m for m in modules if m not in known]
        if unknown:
            raise GenericMutationError(
                f"unknown module(s) {', '.join(unknown)}; configured: {', '.join(known)}"
            )
        specs = [known[m] for m in modules]
    if sample is not None and sample < 1:
        raise GenericMutationError(f"--sample must be >= 1, got {sample}")
    keep = workdir is not None
    work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="kvspec-cr-"))
    try:
        repo = work / "repo"
        if not (repo / "impl").is_dir():
            copy_repo(source, repo)
        chosen = []
        for s in specs:
            if (repo / s.path).is_file():
                chosen.append(s)
            elif not s.optional or modules:
                raise GenericMutationError(f"{s.path} does not exist in {source}")
        results = [
            run_module(
                s,
                repo,
                work / "sessions",
                sample=sample,
                seed=seed,
                nice=nice,
                budget=budget,
                progress=progress,
            )
            for s in chosen
        ]
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    explained = load_explained(survivors_md)
    survivors = []
    for r in results:
        for sv in r.survivors:
            survivors.append(
                {
                    "module": sv["module"],
                    "line": sv["line"],
                    "operator": sv["operator"],
                    "function": sv["function"],
                    "context": sv["context"],
                    "diff": sv["diff"],
                    "explained": sv["context"] in CONTEXT_RULES or survivor_key(sv) in explained,
                    "row": markdown_row(sv),
                }
            )
    killed = sum(r.killed + r.timeouts for r in results)
    judged = killed + sum(r.survived for r in results)
    return {
        "tool": TOOL,
        "modules": [r.to_json() for r in results],
        "score": round(killed / judged, 4) if judged else None,
        "survivors": survivors,
        "unexplained": sum(1 for s in survivors if not s["explained"]),
        "workdir": str(work) if keep else None,
    }


# ----------------------------------------------------------------------------- CLI
def cmd(args: argparse.Namespace) -> int:
    """``kvspec mutants --generic [--json] [--module PATH ...] [--sample N] [--seed S]
    [--workdir DIR]``: 0 every survivor explained in SURVIVORS.md, 1 some is not, 2 could not
    run."""
    as_json = bool(getattr(args, "json", False))
    modules = getattr(args, "module", None)
    if isinstance(modules, str):
        modules = [modules]
    workdir = getattr(args, "workdir", None)
    from kvspec.output import ERR as err
    from kvspec.output import OUT as out
    from kvspec.output import could_not_run

    last: dict[str, int] = {}

    def progress(module: str, done: int, total: int) -> None:
        if as_json or not err.is_terminal or last.get(module) == done:
            return
        last[module] = done
        err.print(f"{module}: {done}/{total} mutants", end="\r")

    try:
        doc = run(
            modules,
            sample=getattr(args, "sample", None),
            seed=getattr(args, "seed", None) or 0,
            workdir=Path(workdir) if workdir else None,
            budget=getattr(args, "budget_per_module", None),
            progress=progress,
        )
    except (GenericMutationError, subprocess.SubprocessError, OSError) as exc:
        return could_not_run(exc)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        from rich.table import Table

        table = Table(title=f"generic mutation testing ({TOOL})")
        for column in ("module", "mutants", "killed", "timeouts", "survived", "score", "seconds"):
            table.add_column(column, overflow="fold")
        for m in doc["modules"]:
            run_ = f"{m['mutants']}" + (f" of {m['total_mutants']}" if m["sampled"] else "")
            score = "-" if m["score"] is None else f"{m['score']:.1%}"
            table.add_row(
                m["module"], run_, str(m["killed"]), str(m["timeouts"]), str(m["survived"]),
                score, f"{m['seconds']:.0f}",
            )  # fmt: skip
        out.print(table)
        unexplained = [s for s in doc["survivors"] if not s["explained"]]
        out.print(
            f"score {doc['score']:.1%}; {len(doc['survivors'])} survivors, "
            f"{len(unexplained)} not explained in {SURVIVORS_MD.relative_to(ROOT)}"
            if doc["score"] is not None
            else "no mutant ran"
        )
        for s in unexplained:
            out.print(s["row"], markup=False)
    return 1 if doc["unexplained"] else 0
