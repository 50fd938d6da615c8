"""The CrossHair checks behind ``kvspec crosshair``: one table, one runner, explicit budgets.

Three kinds of check, each run in a subprocess of its own that reports JSON: CrossHair's Python
API through :mod:`proofs.crosshair_runner` (``diff_behavior``; ``analyze_any`` + ``run_checkables``)
or the backend runner. No verdict is read from text a library prints for people.

* ``diffbehavior`` — CrossHair's ``diff_behavior(LEGACY, OPTIMISED)``: the optimised kernel behaves
  as the legacy one on every input CrossHair reaches. Pairs that need one signature go through the
  plain-data adapters of :mod:`proofs.crosshair_pairs`.
* ``contract`` — CrossHair's contract analysis (PEP 316): the ``pre:``/``post:`` contracts of the
  named kernels hold.
* ``backend`` — :mod:`proofs.crosshair_backend` on :mod:`proofs.crosshair_properties`, whose
  properties run on Hypothesis' CrossHair backend (``hypothesis-crosshair``); its verdicts are
  JSON, decided by what each property call raised, not by Hypothesis' printed report.

Verdicts. CrossHair is a search, so "found nothing" counts only when the search ran its whole
budget without an error: ``pass`` needs an empty list of behaviour differences (or every
postcondition ``confirmed``/``cannot_confirm``, or every property passing) and a report. A
difference, a violated postcondition or a failing property is ``fail``, with the example. A crash,
a wall-clock timeout, a vacuous precondition, a postcondition that raises, CrossHair noticing
nondeterminism — anything else — is ``inconclusive``, never a pass.

Budgets. ``budget`` is ``--max_uninteresting_iterations`` (diffbehavior, contract) or
``max_examples`` per property (backend); ``per_path_timeout`` is explicit too, and a generous
wall-clock ``timeout`` only guards against hangs. CrossHair seeds its search, so with the same
budget a run repeats itself (short of per-path timeouts under heavy load); a larger budget
explores a superset. Budgets are measured, not guessed: at CrossHair's default (5 uninteresting
iterations) diffbehavior misses five of the nine planted reclamation/admission/counter bugs below
and one of the four planted ARC bugs (the restarted iterator, which needs three victims; all four
are found from 10 on); at ``PLANTED_BUDGET`` (25) it finds all thirteen but one (the bound that
ignores free pages needs 30 on crosshair-tool 0.0.114, and runs at 35), and the real pairs run at
four times the largest budget of the planted variants of their kernel. ``--budget-scale``
multiplies budgets and timeouts.

Planted checks (``PLANTED``) run the same commands on the kernels of
:mod:`proofs.crosshair_mutants`; their ``expect`` is the finding, so a planted check passes when
CrossHair reports the planted difference and fails when the budget missed it.

Equivalent checks (``EQUIVALENT``) run a planted change that is *not* a bug (vLLM's "virtual T1
size decremented on T2 picks"): they pass when CrossHair finds no difference within the budget —
evidence of equivalence within that budget, never a proof.

Adding a kernel pair is one :class:`Check` in ``CHECKS`` and one per planted variant in
``PLANTED``; vLLM's ARC victim selection (``arc-*``) was added that way.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("diffbehavior", "contract", "backend")
PROPERTIES = "proofs/crosshair_properties.py"

__all__ = [
    "CHECKS",
    "EQUIVALENT",
    "PLANTED",
    "SMOKE_PLANTED",
    "VERIFY_PLANTED",
    "Check",
    "Outcome",
    "crosshair_available",
    "interpret",
    "kill_planted",
    "run",
    "run_check",
    "select",
]


@dataclass(frozen=True)
class Check:
    """One CrossHair run with its budget.

    ``targets``: diffbehavior — ``(legacy, optimised)`` qualified function names; contract — the
    functions whose contracts are checked; backend — FILE.py::property ids. ``expect``: ``"pass"`` for a
    real check; ``"found"`` for a planted one (the difference, violation or failing property must
    be reported). ``env``: extra environment for the subprocess (backend: the kernels under test).
    """

    name: str
    kind: str
    targets: tuple[str, ...]
    budget: int
    about: str
    expect: str = "pass"
    quick: bool = False  # part of ``kvspec verify``'s subset
    smoke: bool = False  # part of ``kvspec verify --quick``'s smaller subset (seconds each)
    per_path_timeout: float = 10.0
    timeout: float = 600.0  # wall-clock guard, seconds, at budget scale 1
    env: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"check {self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.expect not in ("pass", "found"):
            raise ValueError(f"check {self.name}: expect must be pass or found")
        if self.kind == "diffbehavior" and len(self.targets) != 2:
            raise ValueError(f"check {self.name}: diffbehavior compares exactly two functions")


@dataclass
class Outcome:
    name: str
    kind: str
    status: str  # pass | fail | inconclusive
    seconds: float
    detail: str
    expected: str = "pass"  # what a pass means: "pass" (nothing found) or "found" (planted)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "seconds": round(self.seconds, 2),
            "detail": self.detail,
            "expected": self.expected,
        }


_K = "impl.infinilm.kernels"
_S = "spec.infinilm.kernels"
_P = "proofs.crosshair_pairs"
_M = "proofs.crosshair_mutants"
_COUNTER = "reservation_counter_matches_scan"
_ADMISSIONS = "per_step_snapshot_admits_as_per_candidate_scan"
_RECLAIM = "bounded_reclaim_evicts_as_legacy"

CHECKS: tuple[Check, ...] = (
    # ---------------------------------------------------------------- legacy vs optimised kernels
    Check(
        "reclaim-bounded-vs-legacy",
        "diffbehavior",
        (f"{_P}.legacy_reclaim_on_pages", f"{_P}.try_free_blocks_on_pages"),
        budget=140,  # four times its planted variants' largest budget
        about="PR #578: the impl's try_free_blocks (bounded scan, inlined) evicts the pages "
        "legacy's full scan evicts",
        quick=True,
    ),
    Check(
        "admission-per-step-vs-per-candidate",
        "diffbehavior",
        (f"{_S}.per_candidate_admissions", f"{_K}.per_step_admissions"),
        budget=100,
        about="PR #579: one running-reservation snapshot per step, same admission decisions",
        quick=True,
        smoke=True,
    ),
    Check(
        "reservation-counter-vs-scan",
        "diffbehavior",
        (f"{_S}.reservations_by_scan", f"{_K}.reservations_by_counter"),
        budget=100,
        about="exact-reservation PR: the incremental counter equals the running-queue scan",
        quick=True,
        smoke=True,
    ),
    Check(
        "arc-one-pass-vs-rescan",
        "diffbehavior",
        (f"{_P}.arc_rescan_every_n", f"{_P}.arc_one_pass_every_n"),
        budget=100,
        about="vLLM PR #50992: one iterator per list picks the rescan's ARC victims, in order, "
        "for every n",
        quick=True,
    ),
    Check(
        "arc-one-pass-vs-rescan-t1-fallback",
        "diffbehavior",
        (f"{_P}.arc_rescan_every_n_with_fallback", f"{_P}.arc_one_pass_every_n_with_fallback"),
        budget=100,
        about="vLLM PR #55461: the T1 fallback on the same iterator picks the rescan's victims",
    ),
    # ---------------------------------------------------------------- contracts
    Check(
        "contract-bounded-reclaim",
        "contract",
        (f"{_P}.try_free_blocks_on_pages",),
        budget=50,
        about="impl try_free_blocks: a prefix of the candidates, >= 1 if any, all on failure, "
        "<= deficit",
    ),
    Check(
        "contract-per-step-admissions",
        "contract",
        (f"{_K}.per_step_admissions", f"{_K}.snapshot_due"),
        budget=50,
        about="one decision per check; a failed mamba pre-check never admits; snapshot once",
        quick=True,
        smoke=True,
    ),
    Check(
        "contract-reservation-counter",
        "contract",
        (f"{_K}.reservations_by_counter", f"{_K}.add_reservation", f"{_K}.remove_reservation"),
        budget=50,
        about="counter deltas keep it >= 0; one value per event",
        quick=True,
        smoke=True,
    ),
    Check(
        "contract-arc-one-pass",
        "contract",
        (
            f"{_P}.arc_one_pass_on_flags",
            f"{_P}.arc_one_pass_on_flags_with_fallback",
            "impl.vllm.arc.one_pass_victims",
        ),
        budget=50,
        about="one_pass_victims: n distinct eligible victims, LRU order per list; fails only if "
        "T2 (no fallback) or both lists (fallback, O6) run out",
        quick=True,
    ),
    Check(
        "contract-legacy-kernels",
        "contract",
        (
            f"{_P}.legacy_reclaim_on_pages",
            f"{_S}.scan_reservation",
            f"{_S}.admits",
            f"{_S}.per_candidate_admissions",
            f"{_S}.reservations_by_scan",
        ),
        budget=50,
        about="the legacy kernels' own contracts (what the optimised ones are compared with)",
    ),
    # ---------------------------------------------------------------- hypothesis-crosshair
    Check(
        "backend-reservation-properties",
        "backend",
        (f"{PROPERTIES}::test_{_COUNTER}", f"{PROPERTIES}::test_{_ADMISSIONS}"),
        budget=40,
        about="hypothesis properties (counter vs scan, snapshot vs per-check scan) on CrossHair",
        quick=True,
        smoke=True,
    ),
    Check(
        "backend-reclaim-property",
        "backend",
        (f"{PROPERTIES}::test_{_RECLAIM}",),
        budget=40,
        about="hypothesis property impl try_free_blocks == legacy reclaim on CrossHair",
    ),
)


def _planted(name: str, against: str, mutant: str, about: str, budget: int | None = None) -> Check:
    return Check(
        f"planted-{name}",
        "diffbehavior",
        (against, f"{_M}.{mutant}"),
        budget=PLANTED_BUDGET if budget is None else budget,
        about=about,
        expect="found",
    )


# The budget at which every planted variant is found (measured; CrossHair's default of 5 misses
# five of the nine). The real pairs run at four times it (test_real_budgets_dominate_planted).
PLANTED_BUDGET = 25
_RECLAIM_LEGACY = f"{_P}.legacy_reclaim_on_pages"
_ARC_RESCAN = f"{_P}.arc_rescan_every_n"
_ARC_RESCAN_FALLBACK = f"{_P}.arc_rescan_every_n_with_fallback"
PLANTED: tuple[Check, ...] = (
    _planted(
        "reclaim-without-quirk-a", _RECLAIM_LEGACY, "reclaim_without_quirk_a", "#578: no max(.., 1)"
    ),
    _planted("reclaim-off-by-one", _RECLAIM_LEGACY, "reclaim_off_by_one", "bound one page short"),
    _planted(
        "reclaim-limit-ignores-free",
        _RECLAIM_LEGACY,
        "reclaim_limit_ignores_free",
        "bound = required, not the deficit",
        # crosshair-tool 0.0.114 misses it at 25 (found from 30 on, measured 2026-12-07)
        budget=35,
    ),
    _planted(
        "reclaim-result-before-eviction",
        _RECLAIM_LEGACY,
        "reclaim_result_before_eviction",
        "capacity read before evicting",
    ),
    _planted(
        "reclaim-evicts-referenced",
        _RECLAIM_LEGACY,
        "reclaim_evicts_referenced",
        "#578: candidate filter ref <= 1",
    ),
    _planted(
        "reclaim-in-id-order",
        _RECLAIM_LEGACY,
        "reclaim_in_id_order",
        "§9.3: id order, not set order",
    ),
    _planted(
        "reclaim-method-one-page-path-widened",
        _RECLAIM_LEGACY,
        "reclaim_method_one_page_path_widened",
        "the impl method's one-page path taken two pages short",
    ),
    _planted(
        "reclaim-method-result-strict",
        _RECLAIM_LEGACY,
        "reclaim_method_result_strict",
        "the impl method's result tested with > for >=",
    ),
    _planted(
        "admission-hoists-extra",
        f"{_S}.per_candidate_admissions",
        "per_step_hoists_extra",
        "#579: the snapshot hoists the prefill extra too",
    ),
    _planted(
        "counter-skips-dequeue",
        f"{_S}.reservations_by_scan",
        "counter_skips_dequeue",
        "exact PR: no decrement on the decode dequeue",
    ),
    _planted(
        "counter-dequeues-tail",
        f"{_S}.reservations_by_scan",
        "counter_dequeues_tail",
        "decrement of the newest request, not the head",
    ),
    _planted(
        "arc-restart-after-t2-pick",
        _ARC_RESCAN,
        "arc_restart_after_t2_pick",
        "#50992 O5: T1 iterator restarted after a T2 pick",
    ),
    _planted(
        "arc-stop-iteration",
        _ARC_RESCAN,
        "arc_stop_iteration",
        "#50992 O5: next() without a default on an exhausted list",
    ),
    _planted(
        "arc-missing-t1-fallback",
        _ARC_RESCAN_FALLBACK,
        "arc_no_fallback_with_fallback",
        "#55461 O6: no T1 fallback once T2 runs out",
    ),
    _planted(
        "arc-fallback-restarts-t1",
        _ARC_RESCAN_FALLBACK,
        "arc_fallback_restarts_t1_with_fallback",
        "#55461 O5/O6: the fallback rescans T1 from the front",
    ),
    Check(
        "planted-contract-arc-restart-after-t2-pick",
        "contract",
        (f"{_M}.arc_restart_after_t2_pick_on_flags",),
        budget=50,  # contract-arc-one-pass's budget (found from 35 on; 25 misses it)
        about="the restarted T1 iterator under one_pass_victims' contract (duplicate victim)",
        expect="found",
    ),
    Check(
        "planted-contract-reclaim-one-short",
        "contract",
        (f"{_M}.reclaim_one_short_on_pages",),
        budget=PLANTED_BUDGET,
        about="the off-by-one bound under try_free_blocks' contract",
        expect="found",
    ),
    Check(
        "planted-backend-counter-dequeues-tail",
        "backend",
        (f"{PROPERTIES}::test_{_COUNTER}",),
        budget=40,
        about="the counter-vs-scan property on the tail-decrement counter",
        expect="found",
        env=(("KVSPEC_CROSSHAIR_COUNTER", f"{_M}:counter_dequeues_tail"),),
    ),
)

# Planted changes that are NOT bugs (the registry's equivalent mutants): a pass (no
# difference at the real pairs' budget, which finds every planted ARC bug at a quarter of it) is
# evidence of equivalence within the budget, not a proof; the proof is the argument in the
# variant's docstring. Run with ``--only 'equivalent-*'``; not part of the default run.
EQUIVALENT: tuple[Check, ...] = (
    Check(
        "equivalent-arc-decrement-on-t2-pick",
        "diffbehavior",
        (_ARC_RESCAN, f"{_M}.arc_decrement_on_t2_pick"),
        budget=100,
        about="EQUIVALENT (not a bug): virtual T1 size also decremented on T2 picks",
    ),
    Check(
        "equivalent-arc-decrement-on-t2-pick-t1-fallback",
        "diffbehavior",
        (_ARC_RESCAN_FALLBACK, f"{_M}.arc_decrement_on_t2_pick_with_fallback"),
        budget=100,
        about="EQUIVALENT (not a bug): the same, with the #55461 T1 fallback",
    ),
)

# ``kvspec verify`` runs the quick checks and these planted ones (one per kernel pair).
# the planted checks of ``kvspec verify --quick``: one per smoke kernel pair
SMOKE_PLANTED = ("planted-admission-hoists-extra", "planted-counter-skips-dequeue")
VERIFY_PLANTED = (
    "planted-reclaim-off-by-one",
    "planted-admission-hoists-extra",
    "planted-counter-skips-dequeue",
    "planted-arc-restart-after-t2-pick",
)

# The kill matrix (``kvspec mutants``): catalogue mutants whose bug is a kernel bug, and the planted
# kernel variant that carries it.
CATALOGUE_KERNELS = {
    "reclaim_evicts_referenced_page": "planted-reclaim-evicts-referenced",
    "reclaim_without_evict_one": "planted-reclaim-without-quirk-a",
    "reclaim_in_id_order": "planted-reclaim-in-id-order",
    "counter_not_decremented_on_dequeue": "planted-counter-skips-dequeue",
    "arc_iterator_restarted_after_t2_pick": "planted-arc-restart-after-t2-pick",
    "arc_stop_iteration_on_exhausted_list": "planted-arc-stop-iteration",
    "arc_missing_t1_fallback": "planted-arc-missing-t1-fallback",
    "arc_fallback_restarts_t1_iterator": "planted-arc-fallback-restarts-t1",
}


# ----------------------------------------------------------------------------- availability
def crosshair_available() -> bool:
    return importlib.util.find_spec("crosshair") is not None


def hypothesis_crosshair_available() -> bool:
    return importlib.util.find_spec("hypothesis_crosshair_provider") is not None


# ----------------------------------------------------------------------------- selection
def select(patterns: Sequence[str] | None, *, planted: bool = False) -> list[Check]:
    """The checks named by (or matching, ``fnmatch``) one of ``patterns``, in table order; every
    real check when None, plus the planted ones with ``planted``. A pattern may name a planted or
    an equivalent check directly. Raises ``ValueError`` naming a pattern that matches nothing."""
    pool = [*CHECKS, *PLANTED, *EQUIVALENT]
    if not patterns:
        return [*CHECKS, *(PLANTED if planted else ())]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(c.name, pattern) for c in pool):
            raise ValueError(f"no crosshair check named or matching {pattern!r}")
    return [c for c in pool if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]


# ----------------------------------------------------------------------------- commands
def scaled(check: Check, scale: float) -> tuple[int, float]:
    """The budget and the wall-clock timeout at ``scale``."""
    return max(1, round(check.budget * scale)), check.timeout * max(scale, 1.0)


def command(check: Check, scale: float = 1.0) -> list[str]:
    budget, _ = scaled(check, scale)
    if check.kind == "backend":
        return [sys.executable, "-m", "proofs.crosshair_backend", *check.targets]
    return [
        sys.executable,
        "-m",
        "proofs.crosshair_runner",
        check.kind,
        "--budget",
        str(budget),
        "--per-path-timeout",
        str(check.per_path_timeout),
        *check.targets,
    ]


def environment(check: Check, scale: float = 1.0) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    if check.kind == "backend":
        env["KVSPEC_CROSSHAIR_EXAMPLES"] = str(scaled(check, scale)[0])
    env.update(check.env)
    return env


# ----------------------------------------------------------------------------- verdicts
def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _compact(text: str, limit: int = 600) -> str:
    return " ".join(text.split())[:limit]


def _report(rc: int, out: str, err: str) -> dict[str, Any] | None:
    """The runner's JSON document (its last stdout line), or None when there is none."""
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def _diffbehavior(rc: int, out: str, err: str, targets: Sequence[str]) -> tuple[str, str]:
    """(finding, detail) with finding ``clean`` | ``found`` | ``inconclusive``, from the
    :mod:`proofs.crosshair_runner` report of CrossHair's ``diff_behavior``."""
    report = _report(rc, out, err)
    if report is None or "finding" not in report:
        return "inconclusive", f"crosshair runner exit {rc}, no report: {_last_line(err)}"
    if report.get("error"):
        return "inconclusive", f"crosshair could not compare: {_compact(report['error'], 300)}"
    if report["nondeterministic"]:
        return "inconclusive", "repeated executions did not behave deterministically"
    if report["finding"] == "clean":
        how = (
            "all paths exhausted"
            if report["exhausted"]
            else "budget spent (no difference in any explored path)"
        )
        return "clean", f"no difference in {report['iterations']} iterations; {how}"
    first = report["diffs"][0]
    names = [t.rpartition(".")[2] for t in targets]
    given = ", ".join(f"{k}={v}" for k, v in first["args"].items())
    return "found", _compact(
        f"difference: Given: ({given}), {names[0]} : {first['first']} {names[1]} : {first['second']}"
    )


# CrossHair's message types (crosshair.statespace.MessageType values) by what they mean here
_HOLDS = ("confirmed", "cannot_confirm")
_VIOLATED = ("post_fail", "exec_err")


def _contract(rc: int, out: str, err: str, targets: Sequence[str]) -> tuple[str, str]:
    report = _report(rc, out, err)
    if report is None or "messages" not in report:
        error = report.get("error") if report else None
        return (
            "inconclusive",
            f"crosshair runner exit {rc}: {_compact(error or _last_line(err), 300)}",
        )
    if not report["checkables"]:
        return "inconclusive", "no contracts found in " + ", ".join(targets)
    messages = report["messages"]
    violations = [m for m in messages if m["state"] in _VIOLATED]
    if violations:
        m = violations[0]
        return "found", f"violation at {m['file']}:{m['line']}: " + _compact(m["message"])
    vacuous = [m for m in messages if m["state"] == "pre_unsat"]
    others = [m for m in messages if m["state"] not in (*_HOLDS, "pre_unsat")]
    if others:  # a postcondition that raised, a syntax or import error
        m = others[0]
        return "inconclusive", (
            f"a contract could not be evaluated ({m['state']} at {m['file']}:{m['line']}): "
            + _compact(m["message"])
        )
    if vacuous:
        return "inconclusive", (
            f"precondition never met at {vacuous[0]['file']}:{vacuous[0]['line']} (vacuous contract)"
        )
    if not messages:
        return "inconclusive", "no postcondition was reported"
    confirmed = sum(m["state"] == "confirmed" for m in messages)
    return "clean", (
        f"{len(messages)} postconditions of {len(targets)} functions hold: {confirmed} confirmed "
        f"over all paths, {len(messages) - confirmed} with no counterexample within the budget"
    )


def _backend(rc: int, out: str, err: str, targets: Sequence[str]) -> tuple[str, str]:
    """The runner's JSON verdicts (:mod:`proofs.crosshair_backend`), one per property."""
    report = _report(rc, out, err)
    results = report.get("results") if report else None
    if not isinstance(results, list):
        return "inconclusive", f"backend runner exit {rc}, no verdicts: {_last_line(err)}"
    if len(results) != len(targets):
        return "inconclusive", f"{len(results)} verdicts for {len(targets)} properties"
    falsified = [r for r in results if r["status"] == "falsified"]
    if falsified:
        return "found", "falsified: " + _compact(falsified[0]["detail"] or falsified[0]["target"])
    errors = [r for r in results if r["status"] != "passed"]
    if errors:
        return "inconclusive", f"{errors[0]['target'].rpartition('::')[2]}: {errors[0]['detail']}"
    return "clean", f"{len(results)} properties passed on the CrossHair backend"


def interpret(
    check: Check, rc: int, out: str, err: str, *, timed_out: bool = False
) -> tuple[str, str]:
    """The check's ``(status, detail)`` from a finished (or timed-out) subprocess."""
    if timed_out:
        finding, detail = "inconclusive", "timed out (wall clock) before the budget was spent"
    elif check.kind == "diffbehavior":
        finding, detail = _diffbehavior(rc, out, err, check.targets)
    elif check.kind == "contract":
        finding, detail = _contract(rc, out, err, check.targets)
    else:
        finding, detail = _backend(rc, out, err, check.targets)
    if finding == "inconclusive":
        return "inconclusive", detail
    if check.expect == "pass":
        return ("pass" if finding == "clean" else "fail"), detail
    if finding == "found":  # planted: the finding is the point
        return "pass", f"planted bug found — {detail}"
    return "fail", f"planted bug NOT found within the budget — {detail}"


# ----------------------------------------------------------------------------- running
def run_check(check: Check, scale: float = 1.0) -> Outcome:
    """Run one check as a subprocess and judge its output."""
    started = time.perf_counter()
    if not crosshair_available():
        return Outcome(
            check.name,
            check.kind,
            "inconclusive",
            0.0,
            "crosshair-tool is not installed",
            check.expect,
        )
    if check.kind == "backend" and not hypothesis_crosshair_available():
        return Outcome(
            check.name,
            check.kind,
            "inconclusive",
            0.0,
            "hypothesis-crosshair is not installed (pip install hypothesis-crosshair)",
            check.expect,
        )
    _, timeout = scaled(check, scale)
    try:
        proc = subprocess.run(
            command(check, scale),
            cwd=ROOT,
            env=environment(check, scale),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        status, detail = interpret(check, proc.returncode, proc.stdout, proc.stderr)
    except subprocess.TimeoutExpired:
        status, detail = interpret(check, -1, "", "", timed_out=True)
    budget, _ = scaled(check, scale)
    unit = "examples per property" if check.kind == "backend" else "uninteresting iterations"
    detail = f"{detail} [budget {budget} {unit}]"
    return Outcome(
        check.name, check.kind, status, time.perf_counter() - started, detail, check.expect
    )


def run(
    checks: Iterable[Check],
    scale: float = 1.0,
    on_result: Callable[[Outcome], None] | None = None,
    on_start: Callable[[Check], None] | None = None,
    jobs: int = 1,
) -> list[Outcome]:
    """Run ``checks``; their outcomes in the same order. ``jobs`` > 1 keeps that many CrossHair
    subprocesses going at once (each check is its own process with its own budget, so the
    verdicts do not depend on ``jobs``; ``on_result`` is then called in completion order)."""
    chosen = list(checks)

    def one(check: Check) -> Outcome:
        if on_start is not None:
            on_start(check)
        outcome = run_check(check, scale)
        if on_result is not None:
            on_result(outcome)
        return outcome

    if jobs <= 1:
        return [one(check) for check in chosen]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads only wait on subprocesses
        return list(pool.map(one, chosen))


def kill_planted(mutant_name: str, budget: float) -> tuple[str, float, str] | None:
    """The kill matrix's ``crosshair`` checker: run the planted kernel variant that carries the
    catalogue mutant's bug under a wall-clock ``budget`` in seconds; ``(verdict, seconds, kind)``
    with verdict ``killed``, ``survived`` or ``error``, or ``None`` when the mutant's bug is not a
    pure-kernel bug (or CrossHair is not installed)."""
    name = CATALOGUE_KERNELS.get(mutant_name)
    if name is None or not crosshair_available():
        return None
    check = next(c for c in PLANTED if c.name == name)
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            command(check),
            cwd=ROOT,
            env=environment(check),
            capture_output=True,
            text=True,
            timeout=budget,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "survived", time.perf_counter() - started, check.kind
    seconds = time.perf_counter() - started
    status, _ = interpret(check, proc.returncode, proc.stdout, proc.stderr)
    return {"pass": "killed", "fail": "survived"}.get(status, "error"), seconds, check.kind
