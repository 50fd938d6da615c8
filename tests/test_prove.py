"""``kvspec prove``: every z3 theorem meets its expectation, the proof model is the spec's, the
prover bites (planted bugs give counterexamples), and unknown/timeouts are failures."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import pytest
import z3

from kvspec import prove
from proofs import theorems, z3_admission, z3_arc, z3_arith, z3_counters
from proofs.z3_arith import PY, Z3
from proofs.z3_core import COUNTEREXAMPLE, FAILED, PROVED, Obligation, Theorem, check

ROOT = Path(__file__).resolve().parent.parent
JSON_KEYS = {"name", "expected", "status", "seconds", "detail"}
REQUEUE = "requeue after partial failure (no admission check)"
REACHABLE = "reachable decode OOM after the requeue"


def theorem_of(name: str, obligations: list[Obligation], expected: str = PROVED) -> Theorem:
    return Theorem(name, expected, lambda: obligations, timeout_ms=10_000)


# ----------------------------------------------------------------------------- the theorems
@pytest.mark.parametrize("name", list(theorems.THEOREMS))
def test_theorem_meets_its_expectation(name: str) -> None:
    th = theorems.THEOREMS[name]
    r = check(th)
    assert r.status == th.expected, r.detail
    assert r.seconds < th.timeout_ms / 1000


def test_catalogue_names_statements_and_expectations() -> None:
    required = {
        "ceil_div_subadditive",
        "ceil_div_step",
        "reservation_legacy_covers_need",
        "reservation_exact_covers_need",
        "reservation_tight_is_minimal",
        "reservation_tight_le_exact",
        "reservation_tight_le_legacy",
        "reservation_exact_le_legacy",
        "block_manager_counter_tracks_live_pages",
        "scheduler_reservation_counter_matches_scan",
        "offload_evictable_counter_matches_scan",
        "arc_lists_bounded",
        *(f"admission_sound_{v}" for v in z3_arith.VARIANTS),
        *(f"admission_sound_pd_requeue_{v}" for v in z3_arith.VARIANTS),
    }
    assert required <= set(theorems.THEOREMS)
    refuted = {n for n, t in theorems.THEOREMS.items() if t.expected == COUNTEREXAMPLE}
    assert refuted == {
        "reservation_exact_le_legacy",
        "reservation_legacy_le_exact",
        *(f"admission_sound_pd_requeue_{v}" for v in z3_arith.VARIANTS),
    }
    for th in theorems.THEOREMS.values():
        assert len(th.statement) > 40, th.name
        assert th.timeout_ms > 0


def test_exact_le_legacy_refutation_is_a_real_request() -> None:
    r = check(theorems.THEOREMS["reservation_exact_le_legacy"])
    values = r.models["exact <= legacy"]
    b, p, g, m = values["B"], values["P"], values["g"], values["M"]
    assert b >= 2 and 1 <= g < m
    from spec.infinilm.scheduler import exact_blocks, legacy_running_blocks, tight_blocks

    req = z3_arith.spec_request(p, g, m, b)
    assert exact_blocks(req, b) == legacy_running_blocks(req, b) + 1
    assert tight_blocks(req, b) <= legacy_running_blocks(req, b)
    assert (p + m - 1) % b == 0
    assert "spec functions on that request" in r.detail


# ----------------------------------------------------------------------------- model == spec
def test_formulas_match_the_spec_functions_on_a_grid() -> None:
    """The proofs' formulas (evaluated on ints with the same code) are the spec's, so a drift
    between proof model and spec fails here."""
    from spec.infinilm.scheduler import (
        exact_blocks,
        remote_reservation,
        running_reservation,
        tight_blocks,
    )

    checked = 0
    for b in range(1, 6):
        for p in range(1, 14):
            for m in range(1, 10):
                remote = z3_arith.spec_request(p, 0, m, b)
                assert len(remote.block_table) == z3_arith.remote_table(p, b, PY)
                for v in z3_arith.VARIANTS:
                    ours = z3_arith.remote_reservation(v, p, m, b, PY)
                    assert ours == remote_reservation(v, remote, b), (v, b, p, m)
                for g in range(1, m + 1):
                    req = z3_arith.spec_request(p, g, m, b)
                    t = len(req.block_table)
                    for v in z3_arith.VARIANTS:
                        ours = z3_arith.running_reservation(v, p, g, m, b, PY)
                        assert ours == running_reservation(v, req, b), (v, b, p, g, m)
                    assert z3_arith.need(p, m, t, b, PY) == tight_blocks(req, b)
                    assert z3_arith.exact(p, m, t, b, PY) == exact_blocks(req, b)
                    checked += 1
    assert checked > 2000


def test_z3_terms_evaluate_like_the_python_backend() -> None:
    P, g, M, B = z3.Ints("P g M B")
    terms = {
        v: (
            z3_arith.running_reservation(v, P, g, M, B, Z3),
            lambda p, gg, m, b, v=v: z3_arith.running_reservation(v, p, gg, m, b, PY),
        )
        for v in z3_arith.VARIANTS
    }
    for b, p, gg, m in [(1, 1, 1, 1), (3, 7, 2, 9), (4, 16, 1, 17), (16, 1, 16, 32), (5, 9, 4, 4)]:
        for term, py in terms.values():
            value = z3.simplify(
                z3.substitute(
                    term,
                    (P, z3.IntVal(p)),
                    (g, z3.IntVal(gg)),
                    (M, z3.IntVal(m)),
                    (B, z3.IntVal(b)),
                )
            )
            assert value.as_long() == py(p, gg, m, b)


@pytest.mark.parametrize("variant", z3_arith.VARIANTS)
def test_candidate_term_is_what_can_accept_request_checks(variant: str) -> None:
    from spec.infinilm.scheduler import Scheduler

    for b in (1, 3, 4):
        for p in range(1, 12):
            for m in (1, 2, 5):
                for k in range(0, (p - 1) // b + 1):
                    own = z3_arith.candidate_term(p, k, m, b, PY)
                    req = z3_arith.spec_request(p, 0, m, b, table=0)
                    fits = Scheduler(num_blocks=own, block_size=b, reservation=variant)
                    assert fits.can_accept_request(req, k * b)
                    if own > 1:
                        short = Scheduler(num_blocks=own - 1, block_size=b, reservation=variant)
                        assert not short.can_accept_request(req, k * b)


def test_decode_page_rule_is_append_slot() -> None:
    from impl.infinilm.block_manager import BlockManager

    for b in (1, 2, 3, 4):
        for p in range(1, 10):
            for g in range(1, 8):
                bm = BlockManager(64, b)
                allocated = bm.allocate_slots(p + g - 1, 0)
                assert allocated is not None
                table = allocated[0]
                assert len(table) == z3_arith.running_table(p, g, b, PY)
                before = len(table)
                bm.append_slot(table, p + g)
                page = (p + g - 1) % b == 0
                assert len(table) - before == int(page)
                assert len(table) == z3_arith.running_table(p, g + 1, b, PY)


def test_counter_deltas_are_the_impl_block_managers() -> None:
    """The transition table's deltas, evaluated at concrete ref counts, are what impl does."""
    from impl.infinilm.block_manager import BlockManager

    delta = {t.name: t.delta for t in z3_counters.BLOCK_MANAGER}

    def at(name: str, ref: int) -> int:
        return int(z3.simplify(z3.IntVal(0) + delta[name](z3.IntVal(ref))).as_long())

    bm = BlockManager(8, 2)
    c0 = bm.num_referenced
    table, _ = bm.allocate_slots(4, 0)  # two pages, each 0 -> 1
    assert bm.num_referenced - c0 == 2 * at("_allocate_block", 0)
    bm.publish_computed_blocks(table, [b"h0", b"h1"], 0, 4)
    assert bm.num_referenced - c0 == 2  # publish: 0
    for ref in (1, 2):  # pin a hit with ref 1 then 2
        before = bm.num_referenced
        bm.get_computed_blocks([b"h0"], 3)
        assert bm.num_referenced - before == at("get_computed_blocks pin", ref)
    for ref in (3, 2, 1):
        before = bm.num_referenced
        bm.free_blocks([table[0]])
        assert bm.num_referenced - before == at("free_blocks", ref)
    before = bm.num_referenced
    bm.get_computed_blocks([b"h0"], 3)  # a cached ref-0 page revived
    assert bm.num_referenced - before == at("get_computed_blocks pin", 0)
    spec_table, _ = bm.allocate_slots(3, 0)  # two fresh unhashed pages
    before = bm.num_referenced
    bm.truncate_blocks(spec_table, 1)
    assert bm.num_referenced - before == at("truncate_blocks discard", 1)
    bm.free_blocks([table[0], table[1], spec_table[0]])
    before = bm.num_referenced
    assert bm.try_free_blocks(8)  # evicts ref-0 pages only
    assert bm.num_referenced - before == at("_deallocate_block", 0) == 0


# ----------------------------------------------------------------------------- agreement
def _trace(variant: str) -> dict[str, Any]:
    path = ROOT / "stateful_tests" / "counterexamples" / f"admission_soundness_{variant}.json"
    trace: dict[str, Any] = json.loads(path.read_text())
    return trace


@pytest.mark.parametrize("variant", z3_arith.VARIANTS)
def test_pd_requeue_counterexample_agrees_with_the_lockstep_checker(variant: str) -> None:
    trace = _trace(variant)
    steps = trace["steps"]
    assert trace["failure"]["check"] == "admission_soundness"
    # the lockstep trace: a partial failure (failed receive, invalid pages), that request in a
    # later prefill batch (the §9.11 requeue), then a decode step that runs out of pages
    partial = [
        (i, rid)
        for i, s in enumerate(steps)
        if s["method"] == "connector_events" and s["args"][3]
        for rid in s["args"][2]
    ]
    assert partial
    i, rid = partial[-1]
    prefills = [
        j
        for j, s in enumerate(steps)
        if j > i
        and s["method"] == "step"
        and '"is_prefill": true' in s["spec"]
        and rid in json.loads(s["spec"])["ids"]
    ]
    assert prefills
    assert "OutOfBlocksError" in steps[-1]["spec"]

    # z3: the invariant breaks exactly at the requeue, and an execution reaches the OOM
    r = check(theorems.THEOREMS[f"admission_sound_pd_requeue_{variant}"])
    assert r.status == COUNTEREXAMPLE
    assert list(r.models) == [REQUEUE, REACHABLE]
    assert (
        r.models[REQUEUE]["need"] > r.models[REQUEUE]["usable"] - r.models[REQUEUE]["visible_need"]
    )
    # … and such an execution exists with the lockstep trace's pool and page size
    cfg = trace["config"]
    n, b = z3.Ints("N B")  # the execution's variables, by name
    pinned = z3_admission.requeue_oom_execution([n == cfg["num_blocks"], b == cfg["block_size"]])
    assert check(theorem_of("pinned", [pinned], COUNTEREXAMPLE)).status == COUNTEREXAMPLE


def test_tight_lockstep_numbers_are_a_model_of_the_reachable_execution() -> None:
    trace = _trace("tight")
    adds = {s["args"][0]: s["args"] for s in trace["steps"] if s["method"] == "add_request"}
    (r0, r1) = ("r0", "r1")
    n, b, p0, m0, p1, m1 = z3.Ints("N B P0 M0 P1 M1")  # the execution's variables, by name
    cfg = trace["config"]
    pins = [
        n == cfg["num_blocks"],
        b == cfg["block_size"],
        p0 == len(adds[r0][1]),
        m0 == adds[r0][2],
        p1 == len(adds[r1][1]),
        m1 == adds[r1][2],
    ]
    r = check(theorem_of("pinned", [z3_admission.requeue_oom_execution(pins)], COUNTEREXAMPLE))
    assert r.status == COUNTEREXAMPLE
    assert r.models[REACHABLE]["usable at r0's decodes"] == 0


# ----------------------------------------------------------------------------- the prover bites
def _wrong_tight(P: Any, M: Any, T: Any, B: Any) -> Any:
    return Z3.maximum(Z3.ceil_div(P + M - 2, B) - T, 0)  # one token short


def test_a_wrong_tight_formula_is_not_minimal_cover() -> None:
    P, M, B = z3.Ints("P M B")
    T = z3_arith.remote_table(P, B)
    ob = Obligation(
        "wrong tight covers",
        z3_arith.remote_domain(B, P, M),
        z3_arith.least_cover(T, _wrong_tight(P, M, T, B), P, M, B),
        {"B": B, "P": P, "M": M},
    )
    r = check(theorem_of("wrong tight", [ob]))
    assert r.status == COUNTEREXAMPLE


def test_an_under_reserving_variant_is_unsound() -> None:
    def running(P: Any, g: Any, M: Any, B: Any) -> Any:
        return _wrong_tight(P, M, z3_arith.running_table(P, g, B), B)

    def remote(P: Any, M: Any, B: Any) -> Any:
        return _wrong_tight(P, M, z3_arith.remote_table(P, B), B)

    res = z3_admission.Reservations(running, remote)
    r = check(theorem_of("under-reserving", z3_admission.soundness_obligations(res)))
    assert r.status == COUNTEREXAMPLE
    assert "in flight -> running" in r.models or "prefill batch -> running" in r.models


def test_a_remote_reservation_of_zero_is_unsound_with_a_connector() -> None:
    base = z3_admission.variant_reservations("tight")
    res = z3_admission.Reservations(base.running, lambda P, M, B: 0)
    obligations = z3_admission.soundness_obligations(res, connector="full-failures")
    r = check(theorem_of("no remote reservation", obligations))
    assert r.status == COUNTEREXAMPLE
    assert "admit (async, to pending)" in r.models


def _replace(transitions: Any, name: str, **changes: Any) -> tuple[Any, ...]:
    from dataclasses import replace

    assert any(t.name == name for t in transitions)
    return tuple(replace(t, **changes) if t.name == name else t for t in transitions)


@pytest.mark.parametrize(
    ("transition", "delta"),
    [
        ("_deallocate_block", lambda r: -1),  # counter decremented again on eviction
        ("truncate_blocks discard", lambda r: 0),  # counter not decremented in truncate
        ("get_computed_blocks pin", lambda r: 0),  # prefix pin not counting a revived page
        ("free_blocks", lambda r: -1),  # every release decrements
    ],
)
def test_planted_block_manager_counter_bugs_are_refuted(transition: str, delta: Any) -> None:
    planted = _replace(z3_counters.BLOCK_MANAGER, transition, delta=delta)
    r = check(theorem_of("planted", z3_counters.block_manager_obligations(planted)))
    assert r.status == COUNTEREXAMPLE
    assert list(r.models) == [transition]


def test_planted_scheduler_counter_bugs_are_refuted() -> None:
    good = z3_counters.reservation_counter("tight")
    skip_finished = z3_counters.ReservationCounter(
        good.scan,
        good.on_enqueue,
        lambda P, M, T, B, finished: z3.If(finished, 0, good.scan(P, M, T, B)),
    )
    exact = z3_counters.reservation_counter("exact")
    exact_formula = z3_counters.ReservationCounter(good.scan, exact.on_enqueue, exact.on_dequeue)
    for planted in (skip_finished, exact_formula):
        r = check(theorem_of("planted", z3_counters.reservation_counter_obligations(planted)))
        assert r.status == COUNTEREXAMPLE


@pytest.mark.parametrize(
    ("transition", "delta"),
    [("complete_store failure", lambda c, r: -1), ("evict victim", lambda c, r: 0)],
)
def test_planted_offload_counter_bugs_are_refuted(transition: str, delta: Any) -> None:
    planted = _replace(z3_counters.OFFLOAD, transition, delta=delta)
    r = check(theorem_of("planted", z3_counters.offload_obligations(planted)))
    assert r.status == COUNTEREXAMPLE
    assert list(r.models) == [transition]


@pytest.mark.parametrize(
    ("options", "refuted"),
    [
        ({"trim_ghosts": False}, "prepare_store evicting"),
        ({"clamp_target": False}, "touch: B1 ghost hit"),
    ],
)
def test_planted_arc_bugs_are_refuted(options: dict[str, bool], refuted: str) -> None:
    r = check(theorem_of("planted", z3_arc.arc_obligations(**options)))
    assert r.status == COUNTEREXAMPLE
    assert refuted in r.models


# ----------------------------------------------------------------------------- never a pass
def test_a_hard_query_with_a_tiny_budget_is_failed() -> None:
    x, y, w = z3.Ints("x y w")
    fermat = Obligation("no cubes", [x >= 1, y >= 1, w >= 1], x * x * x + y * y * y != w * w * w)
    r = check(Theorem("fermat", PROVED, lambda: [fermat], timeout_ms=50))
    assert r.status == FAILED
    assert not r.passed
    assert "unknown" in r.detail or "timeout" in r.detail


def test_unknown_is_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(z3.Solver, "check", lambda self, *a: z3.unknown)
    monkeypatch.setattr(z3.Solver, "reason_unknown", lambda self: "mocked")
    for name in ("ceil_div_step", "reservation_exact_le_legacy"):
        r = check(theorems.THEOREMS[name])
        assert r.status == FAILED and "unknown" in r.detail and "mocked" in r.detail


def test_a_spent_budget_is_failed() -> None:
    def slow() -> list[Obligation]:
        time.sleep(0.01)
        return [Obligation("trivial", [], z3.BoolVal(True))]

    r = check(Theorem("slow", PROVED, slow, timeout_ms=1))
    assert r.status == FAILED and "timeout" in r.detail


def test_vacuous_premises_and_broken_builders_are_failed() -> None:
    x = z3.Int("x")
    vacuous = Obligation("contradiction", [x > 1, x < 0], x == 42)
    assert check(theorem_of("vacuous", [vacuous])).status == FAILED

    def broken() -> list[Obligation]:
        raise RuntimeError("boom")

    r = check(Theorem("broken", PROVED, broken))
    assert r.status == FAILED and "boom" in r.detail


# ----------------------------------------------------------------------------- CLI
def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="kvspec")
    prove.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    rc: int = args.func(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["prove", "--json", "--only", "reservation_*", "arc_lists_bounded"], capsys)
    assert rc == 0
    document = json.loads(out)
    assert set(document) == {"theorems"}
    rows = document["theorems"]
    assert [r["name"] for r in rows] == [
        n for n in theorems.THEOREMS if n.startswith("reservation_") or n == "arc_lists_bounded"
    ]
    for row in rows:
        assert set(row) == JSON_KEYS
        assert row["status"] == row["expected"]
        assert isinstance(row["seconds"], float)
    exact = next(r for r in rows if r["name"] == "reservation_exact_le_legacy")
    assert exact["status"] == "counterexample" and "exact=" in exact["detail"]


def test_cli_table_and_counterexamples(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(["prove", "--only", "reservation_exact_le_legacy", "ceil_div_*"], capsys)
    assert rc == 0
    assert "kvspec prove" in out and "ceil_div_step" in out
    assert "counterexample to exact <= legacy" in out
    assert "theorems as expected" in out


def test_cli_exit_1_when_a_theorem_misses_its_expectation(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    flipped = replace(theorems.THEOREMS["ceil_div_bounds"], expected=COUNTEREXAMPLE)
    monkeypatch.setitem(theorems.THEOREMS, "ceil_div_bounds", flipped)
    rc, out, _ = _run(["prove", "--json", "--only", "ceil_div_bounds"], capsys)
    assert rc == 1
    row = json.loads(out)["theorems"][0]
    assert row["expected"] == "counterexample" and row["status"] == "proved"


def test_cli_timeout_override_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        ["prove", "--json", "--only", "ceil_div_shift", "--timeout-ms", "5000"], capsys
    )
    assert rc == 0 and json.loads(out)["theorems"][0]["status"] == "proved"
    for argv in (["prove", "--only", "no_such_theorem"], ["prove", "--timeout-ms", "0"]):
        rc, out, err = _run(argv, capsys)
        assert rc == 2 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvspec: ")


def test_cli_main_routes_prove_when_registered(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec import cli

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    if "prove" not in commands:
        pytest.skip("kvspec/cli.py does not register `prove` yet")
    rc = cli.main(["prove", "--json", "--only", "ceil_div_bounds"])
    out, _ = capsys.readouterr()
    assert rc == 0 and json.loads(out)["theorems"][0]["status"] == "proved"


def test_verify_stage_passes() -> None:
    status, summary = prove.verify_stage()
    assert status == "pass", summary
    assert f"{len(theorems.THEOREMS)} theorems as expected" in summary
    assert "reservation_exact_le_legacy" in summary
