"""The scheduler split into phases: spec predicates, the snapshot reader, spec vs impl in lockstep.

(a) the scheduler invariants of :mod:`spec.invariants` on small hand-built scenarios, each both
holding and failing with its exact detail text; (b) spec and impl schedulers side by side through
seeded random engine events, compared by :func:`spec.infinilm.snapshot.read_scheduler`; (c) the
impl reads no private state of spec objects and overrides only phases. Sections: docs/infinilm.md §5.
"""

from __future__ import annotations

import ast
import inspect
import random
import re
from pathlib import Path
from typing import Any

import pytest

from impl.infinilm import scheduler as impl_sched
from spec import invariants as inv
from spec.errors import OutOfBlocksError
from spec.infinilm import scheduler as spec_sched
from spec.infinilm.block_manager import BlockManager
from spec.infinilm.request import InferenceRequest, RequestStatus, SamplingParams
from spec.infinilm.scheduler import RESERVATIONS, KVConnectorOutput, ModelRunnerOutput
from spec.infinilm.snapshot import SchedulerSnapshot, read_block_manager, read_scheduler

ROOT = Path(__file__).resolve().parent.parent


class Connector:
    """Stateless PD connector double: ids starting with ``a`` hit ``P // 2`` tokens remotely and
    asynchronously; ids ending with ``d`` delay their release."""

    def get_num_new_matched_tokens(self, request: Any, num_local: int) -> tuple[int, bool]:
        if request.request_id.startswith("a"):
            return request.get_prompt_length() // 2, True
        return 0, False

    def update_state_after_alloc(self, request: Any, table: Any, external: int, size: int) -> None:
        return None

    def request_finished(self, request: Any, table: Any, size: int) -> tuple[bool, Any]:
        return request.request_id.endswith("d"), None

    def build_connector_meta(self) -> Any:
        return None


def engine(cls: Any = spec_sched.Scheduler, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    defaults = {"num_blocks": 8, "block_size": 2, "max_batch_size": 4}
    return cls(**{**defaults, **kwargs}), {}


def add(s: Any, requests: dict[str, Any], rid: str, prompt: int, max_tokens: int) -> Any:
    req = InferenceRequest(rid, [7] * prompt, SamplingParams(max_tokens))
    requests[rid] = req
    s.add_request(req)
    return req


def finish_step(s: Any, out: Any) -> None:
    """The model output of an engine step: one token each, then complete_requests."""
    for req in out.scheduled_requests:
        req.append_generated_token_id(0)
        if req.get_num_generated_tokens() >= req.sampling_params.max_tokens:
            req.status = RequestStatus.FINISHED
    s.complete_requests(out.scheduled_requests)


# ----------------------------------------------------------------------------- (a) predicates
def test_request_in_exactly_one_place() -> None:
    s, requests = engine()
    add(s, requests, "a", 3, 4)
    assert inv.request_in_exactly_one_place(read_scheduler(s, requests)) is None
    out = s.schedule()  # "a" is in flight: in the batch, in no queue
    assert inv.request_in_exactly_one_place(read_scheduler(s, requests)) == (
        "in two places: []; in none: ['a']"
    )
    assert inv.request_in_exactly_one_place(read_scheduler(s, requests), {"a"}) is None  # lost
    finish_step(s, out)
    assert inv.request_in_exactly_one_place(read_scheduler(s, requests)) is None
    s.waiting_queue.put(requests["a"])
    assert inv.request_in_exactly_one_place(read_scheduler(s, requests)) == (
        "in two places: ['a']; in none: []"
    )


@pytest.mark.parametrize(("variant", "scan"), [("legacy", 2), ("exact", 2), ("tight", 1)])
def test_reservation_counter_matches_scan(variant: str, scan: int) -> None:
    # P = 3, M = 4, B = 2, g = 1, a 2-page table: legacy ceil(3/2), exact ceil(7/2) - 2,
    # tight ceil(6/2) - 2
    s, requests = engine(impl_sched.Scheduler, reservation=variant)
    add(s, requests, "a", 3, 4)
    finish_step(s, s.schedule())
    assert s.num_reserved_decode_blocks == scan
    ok = inv.reservation_counter_matches_scan(
        s.num_reserved_decode_blocks, s.running_queue, variant, 2
    )
    assert ok is None
    assert inv.reservation_counter_matches_scan(5, s.running_queue, variant, 2) == (
        f"num_reserved_decode_blocks=5 but the scan gives {scan}"
    )


def test_pending_counter_matches_scan() -> None:
    s, requests = engine(connector=Connector())
    add(s, requests, "a1", 4, 4)  # asynchronous remote hit: pending ceil(M / B) = 2 (legacy)
    assert s.schedule() is not None
    remote = s.remote_kv_requests.values()
    assert s.pending_kv_decode_blocks == 2
    assert inv.pending_counter_matches_scan(2, remote, "legacy", 2) is None
    assert inv.pending_counter_matches_scan(1, remote, "legacy", 2) == (
        "pending_kv_decode_blocks=1 but the scan gives 2"
    )
    assert inv.pending_counter_matches_scan(0, (), "tight", 2) is None


def test_referenced_count_matches_live_pages_over_the_schedulers_holders() -> None:
    s, requests = engine()
    add(s, requests, "a", 3, 4)
    s.schedule()  # "a" holds pages 0, 1 but sits in no queue
    snap = read_scheduler(s, requests)
    usable = s.cache_manager.get_total_usable_blocks()
    assert inv.referenced_count_matches_live_pages(snap.block_manager, usable, snap.holders()) == (
        "ref_count != live occurrences (page: (ref, occurrences)): {0: (1, 0), 1: (1, 0)}"
    )
    assert snap.holders({"a"}) == [(0, 1)]  # a lost request's table still holds its pages
    held = snap.holders({"a"})
    assert inv.referenced_count_matches_live_pages(snap.block_manager, usable, held) is None
    parked = snap._replace(pending_free_blocks=(("a", (0, 1)),))  # parked pages hold too
    assert parked.holders() == [(0, 1)]
    assert inv.referenced_count_matches_live_pages(snap.block_manager, usable + 1) == (
        "usable=7 but N - referenced = 8 - 2"
    )


def test_holders_placed_and_quiescent() -> None:
    s, requests = engine(max_batch_size=1)
    add(s, requests, "a", 3, 1)
    add(s, requests, "b", 1, 2)
    finish_step(s, s.schedule())  # "a" prefilled and finished; "b" still waiting
    snap = read_scheduler(s, requests)
    assert snap.placed() == ("b",) and snap.holders() == [()]
    assert not snap.quiescent()
    finish_step(s, s.schedule())
    finish_step(s, s.schedule())
    snap = read_scheduler(s, requests)
    assert snap.placed() == () and snap.quiescent() and not snap.quiescent({"x"})
    assert inv.no_leak_at_quiescence(snap.block_manager) is None


def test_no_leak_at_quiescence() -> None:
    bm = BlockManager(4, 2)
    bm.allocate_slots(3)  # pages 0, 1 referenced by a table nobody holds
    assert inv.no_leak_at_quiescence(read_block_manager(bm)) == (
        "pages [0, 1] are still referenced at quiescence"
    )


def test_admission_soundness() -> None:
    assert inv.admission_soundness(False, "legacy") is None
    assert inv.admission_soundness(True, "tight") == (
        "a decode step ran out of pages with no draft tokens (tight reservation)"
    )


def test_first_state_violation() -> None:
    bm = BlockManager(4, 2)
    snap = read_block_manager(bm)
    assert inv.first_state_violation(snap) is None
    broken = snap._replace(free_block_ids=(0, 0, 1, 2, 3))
    assert inv.first_state_violation(broken) == (
        "free_and_used_partition_pool: pages [0] appear twice on the free deque"
    )


def test_read_scheduler_fields_and_differing_fields() -> None:
    s, requests = engine(has_mamba_cache=True, reservation="exact")
    add(s, requests, "a", 3, 4)
    out = s.schedule()
    snap = read_scheduler(s, requests)
    assert snap.requests == (("a", "RUNNING", (0, 1), (0, 1, 2), 2, 0, 0, 0, 1, 0),)
    assert snap.mamba == ((), (1,))
    assert dict(snap.cache_stats)["num_reserved_decode_blocks"] == 0  # "a" is in flight
    finish_step(s, out)
    after = read_scheduler(s, requests)
    assert snap.differing_fields(after) == ["running", "cache_stats", "requests"]
    assert isinstance(after, SchedulerSnapshot) and after.running == ("a",)


def test_invariant_names_cover_every_check_name() -> None:
    """Every check name the checkers, proofs and mutant catalogue report is in INVARIANT_NAMES
    (or is one of lockstep's outcome comparisons), and each name has a predicate."""
    comparisons = {
        "exception",
        "return_value",
        "argument_mutation",
        "snapshot",
        "hang",
        "deterministic",  # a target and a copy of itself differ (--oracle invariants)
        "block_manager",
    }
    names = set(inv.INVARIANT_NAMES)
    assert len(names) == len(inv.INVARIANT_NAMES)
    for name in names - {"no_live_eviction"}:
        assert callable(getattr(inv, name)), name
    assert callable(inv.offload_no_live_eviction) and callable(inv.no_live_eviction)
    used: set[str] = set()
    for path in [
        ROOT / "spec" / "invariants.py",
        *ROOT.glob("stateful_tests/**/*.py"),
        *ROOT.glob("proofs/**/*.py"),
    ]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            used |= _check_names(node)
    assert used, "no check names found"
    assert used - comparisons <= names, sorted(used - comparisons - names)


def _check_names(node: ast.AST) -> set[str]:
    def strings(n: ast.AST | None) -> list[str]:
        return [n.value] if isinstance(n, ast.Constant) and isinstance(n.value, str) else []

    found: list[str] = []
    call = isinstance(node, ast.Call)
    if call and isinstance(node.func, ast.Attribute) and node.func.attr == "fail" and node.args:
        found += strings(node.args[0])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Mutant":
        # expected_check: the argument after the mutant class (a CamelCase name), or the keyword
        classes = [
            i
            for i, a in enumerate(node.args)
            if isinstance(a, ast.Name) and a.id[0].isupper() and not a.id.isupper()
        ]
        if classes and classes[0] + 1 < len(node.args):
            found += strings(node.args[classes[0] + 1])
        found += [s for k in node.keywords if k.arg == "expected_check" for s in strings(k.value)]
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    value = getattr(node, "value", None)
    for t in targets:
        name = t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")
        if name == "SNAPSHOT_CHECKS" and isinstance(value, ast.Dict):
            found += [s for v in value.values for s in strings(v)]
        if name in ("STATE_INVARIANTS", "state_invariants") and isinstance(
            value, ast.Tuple | ast.Dict
        ):
            elts = value.elts if isinstance(value, ast.Tuple) else value.keys
            found += [s for e in elts for s in strings(e)]
    return {n for n in found if re.fullmatch(r"[a-z_]+", n)}


# ----------------------------------------------------------------------------- (b) lockstep
def _engine_event(rng: random.Random, spec: Any, spec_reqs: dict[str, Any], n: int) -> tuple:
    live = sorted(r for r, q in spec_reqs.items() if not q.is_finished())
    roll = rng.random()
    if roll < 0.3 or not spec_reqs:
        prefix = rng.choice(("a", "b", "bd"))
        return ("add", f"{prefix[0]}{n}{prefix[1:]}", rng.randint(1, 7), rng.randint(1, 5))
    if roll < 0.4 and live:
        return ("abort", rng.choice(live))
    if roll < 0.6 and spec.connector is not None:
        remote, parked = sorted(spec.remote_kv_requests), sorted(spec.pending_free_blocks)
        done = [r for r in remote + parked if rng.random() < 0.5]
        failed = [r for r in remote if r not in done and rng.random() < 0.3]
        return ("events", done, [r for r in parked if rng.random() < 0.5], failed)
    return ("step", [rng.random() < 0.15 for _ in range(8)])


def _apply(s: Any, requests: dict[str, Any], lost: set[str], event: tuple) -> Any:
    kind = event[0]
    if kind == "add":
        add(s, requests, event[1], event[2], event[3])
        return None
    if kind == "abort":
        requests[event[1]].status = RequestStatus.CANCELED
        return None
    if kind == "events":
        events = KVConnectorOutput(set(event[1]), set(event[2]), set(event[3]))
        s.update_from_output(ModelRunnerOutput(events))
        return None
    placed = {r.request_id for r in (*s.waiting_queue, *s.running_queue)}
    try:
        out = s.schedule()
    except OutOfBlocksError:  # §9.14: the dequeued live requests are lost
        left = {r.request_id for r in (*s.waiting_queue, *s.running_queue)}
        lost |= {r for r in placed - left if not requests[r].is_finished()}
        return "OutOfBlocksError"
    if out is None:
        return None
    for req, eos in zip(out.scheduled_requests, event[1], strict=False):
        s.commit_computed_tokens(req, req.get_total_length())
        if req.is_finished():
            continue
        req.append_generated_token_id(len(req.block_table) % 3)
        if eos or req.get_num_generated_tokens() >= req.sampling_params.max_tokens:
            req.status = RequestStatus.FINISHED
    s.complete_requests(out.scheduled_requests)
    return (
        [r.request_id for r in out.scheduled_requests],
        out.is_prefill,
        out.kv_connector_metadata,
    )


CONFIGS = [
    {"reservation": variant, **extra}
    for variant in RESERVATIONS
    for extra in (
        {},
        {"connector": True, "num_blocks": 24},
        {"has_mamba_cache": True, "num_mamba_cache_blocks": 3},
        {"enable_prefix_caching": False, "max_num_batched_tokens": 8},
    )
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_spec_and_impl_agree_step_by_step(config: dict[str, Any]) -> None:
    sides = []
    for cls in (spec_sched.Scheduler, impl_sched.Scheduler):
        kwargs = {**config, "connector": Connector() if config.get("connector") else None}
        base = {"num_blocks": 8, "block_size": 2, "max_batch_size": 2}
        sides.append((cls(**{**base, **kwargs}), {}, set()))
    rng = random.Random(str(config))
    for n in range(300):
        event = _engine_event(rng, sides[0][0], sides[0][1], n)
        spec_out, impl_out = (_apply(s, reqs, lost, event) for s, reqs, lost in sides)
        assert spec_out == impl_out, (n, event)
        spec_snap, impl_snap = (read_scheduler(s, reqs) for s, reqs, _ in sides)
        assert spec_snap == impl_snap, (n, event, spec_snap.differing_fields(impl_snap))
        impl, _, lost = sides[1]
        variant, size = config["reservation"], impl.block_size
        assert inv.request_in_exactly_one_place(impl_snap, lost) is None
        counter = impl.num_reserved_decode_blocks
        assert (
            inv.reservation_counter_matches_scan(counter, impl.running_queue, variant, size) is None
        )
        remote = impl.remote_kv_requests.values()
        assert (
            inv.pending_counter_matches_scan(impl.pending_kv_decode_blocks, remote, variant, size)
            is None
        )
        usable = impl.cache_manager.get_total_usable_blocks()
        holders = impl_snap.holders(lost)
        assert (
            inv.referenced_count_matches_live_pages(impl_snap.block_manager, usable, holders)
            is None
        )


# ----------------------------------------------------------------------------- (c) structure
def test_impl_reads_no_private_state_of_spec_objects() -> None:
    source = inspect.getsource(impl_sched)
    assert "_items" not in source
    tree = ast.parse(source)
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    own |= {
        t.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Assign | ast.AnnAssign)
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute)
    }
    phases = {n for n, v in vars(spec_sched.Scheduler).items() if callable(v)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if node.attr.startswith("__"):
                continue
            # only the scheduler itself: its own state, or a phase method of the spec class
            assert isinstance(node.value, ast.Name) and node.value.id == "self", node.attr
            assert node.attr in own or node.attr in phases, node.attr


def test_impl_overrides_phases_not_schedule() -> None:
    own = set(vars(impl_sched.Scheduler))
    assert "schedule" not in own and "_promote_remote" not in own
    assert {"_prefill_phase", "_decode_phase"} <= own


def test_schedule_reads_as_phases() -> None:
    lines = inspect.getsource(spec_sched.Scheduler.schedule).split('"""')[-1].strip().splitlines()
    assert len(lines) <= 12
    for name in ("_prefill_phase", "_decode_phase", "_promote_remote"):
        assert f"self.{name}(" in "\n".join(lines)
    for name in (
        "schedule",
        "_prefill_phase",
        "_place_fresh",
        "_match_prefix",
        "_attach_mamba_row",
        "_place_requeued",
        "_wait_for_remote",
        "_decode_phase",
        "_promote_remote",
    ):
        doc = inspect.getdoc(getattr(spec_sched.Scheduler, name)) or ""
        assert "Pre:" in doc and "Post:" in doc, name


def test_request_queue_snapshot_is_an_ordered_copy() -> None:
    q = spec_sched.RequestQueue()
    a, b = InferenceRequest("a", [1]), InferenceRequest("b", [1])
    q.put(a)
    q.put(b)
    items = q.snapshot()
    assert items == (a, b) and tuple(q) == items
    assert q.get_nowait() is a and items == (a, b) and q.snapshot() == (b,)
