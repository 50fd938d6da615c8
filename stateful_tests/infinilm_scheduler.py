"""Engine-loop lockstep checking of InfiniLM schedulers: harness, driver, machine, fuzzer.

An :class:`EngineHarness` wraps one scheduler with its own request objects and its own scripted
PD connector, and exposes the engine's events as methods with JSON-able arguments:
``add_request``, ``step`` (schedule, then a simulated model output — sampled tokens, EOS,
max_tokens, speculative verify-append and rollback — then ``complete_requests``), ``abort``,
``connector_events`` and a standalone ``can_accept_request``. Two harnesses (spec, target) are
driven through :class:`~stateful_tests.lockstep.Lockstep`, so every engine event compares the whole
``SchedulerOutput`` (ids in order, prefill flag, tables, slots, connector metadata), queue orders,
remote state, ``get_cache_stats()``, every request's bookkeeping and the block-manager snapshot.

Invariants after every event: the block-manager invariants; ``referenced_count_matches_live_pages``
against the scheduler's own holders (queued, remote-pending, parked and lost tables);
``reservation_counter_matches_scan``; ``pending_counter_matches_scan``;
``request_in_exactly_one_place``; ``no_leak_at_quiescence``. ``admission_soundness`` (a decode
step never runs out of pages when no draft tokens were used) is a question, not a contract: it is
checked only when asked (``soundness=True``).
"""

from __future__ import annotations

import importlib
import sys
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

from spec import invariants as inv
from spec.errors import OutOfBlocksError, exception_kind
from spec.infinilm.request import TERMINAL, InferenceRequest, RequestStatus, SamplingParams
from spec.infinilm.scheduler import (
    RESERVATIONS,
    KVConnectorOutput,
    ModelRunnerOutput,
    SchedulerOutput,
)
from spec.infinilm.scheduler import Scheduler as SpecScheduler
from spec.infinilm.snapshot import (
    SchedulerSnapshot,
    queue_items,
    read_block_manager,
    read_scheduler,
    request_row,
)
from stateful_tests.checker import SPEC, CheckerDef, Example, Operation, Options, Reference
from stateful_tests.fastpath import counts_hold, page_occurrences, placement_holds, state_holds
from stateful_tests.lockstep import Chooser, Lockstep, Verdicts
from stateful_tests.sealed import sealed


@dataclass(frozen=True)
class Config:
    num_blocks: int = 8
    block_size: int = 2
    max_batch_size: int = 2
    max_num_batched_tokens: int = 16
    prefix_caching: bool = True
    connector: bool = False
    mamba: bool = False
    speculation: bool = False
    reservation: str = "legacy"
    vocab: int = 2

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ScriptedConnector:
    """A PD connector test double whose answers the driver decides per request id. Its metadata
    is the hook calls it saw since the last ``build_connector_meta()`` (as an upstream connector
    builds its metadata from them), so comparing outputs compares the connector protocol too."""

    def __init__(self) -> None:
        self.plan: dict[str, tuple[int, bool, bool]] = {}  # id -> (external tokens, async, delay)
        self.seen: list[list[Any]] = []

    def get_num_new_matched_tokens(
        self, request: Any, num_local_computed_tokens: int
    ) -> tuple[int, bool]:
        external, is_async, _ = self.plan.get(request.request_id, (0, False, False))
        return external, is_async

    def update_state_after_alloc(
        self, request: Any, block_table: list[int], num_external_tokens: int, block_size: int
    ) -> None:
        self.seen.append(["alloc", request.request_id, list(block_table), num_external_tokens])

    def request_finished(
        self, request: Any, block_table: list[int], block_size: int
    ) -> tuple[bool, Any]:
        delay = self.plan.get(request.request_id, (0, False, False))[2]
        self.seen.append(["finished", request.request_id, list(block_table), delay])
        return delay, None

    def build_connector_meta(self) -> Any:
        meta, self.seen = self.seen, []
        return meta


def _ids(queue: Any) -> tuple[str, ...]:
    return tuple(map(_REQUEST_ID, queue_items(queue)))


_REQUEST_ID = attrgetter("request_id")


class RequestTypes(NamedTuple):
    """The request model a scheduler target is driven with: its own classes, so that its status
    checks, enum comparisons and attributes are its own."""

    request: Callable[..., Any]
    status: Any  # the RequestStatus enum
    sampling: Callable[..., Any]


SPEC_REQUEST_TYPES = RequestTypes(InferenceRequest, RequestStatus, SamplingParams)


def request_types(scheduler_cls: Any, module: str | None = None) -> RequestTypes:
    """The request classes of a scheduler target: ``InferenceRequest`` and ``RequestStatus`` from
    ``module`` (default: the module the scheduler class is defined in, as upstream imports them
    there), ``SamplingParams`` from there or from the request class's own module; kvspec's for
    whatever is not found."""
    where = importlib.import_module(module) if module else sys.modules.get(scheduler_cls.__module__)
    request = getattr(where, "InferenceRequest", None) or InferenceRequest
    home = sys.modules.get(request.__module__)
    status = getattr(where, "RequestStatus", None) or getattr(home, "RequestStatus", RequestStatus)
    sampling = getattr(where, "SamplingParams", None) or getattr(home, "SamplingParams", None)
    return RequestTypes(request, status, sampling or SamplingParams)


class EngineHarness:
    """One scheduler, its requests and its connector, driven by JSON-able engine events."""

    def __init__(
        self,
        scheduler_cls: Callable[..., Any],
        config: Config,
        types: RequestTypes = SPEC_REQUEST_TYPES,
    ) -> None:
        self.config = config
        self.types = types
        self.connector = ScriptedConnector() if config.connector else None
        # the default (legacy) variant is asked for by not asking: upstream has no such keyword
        variant = (
            {} if config.reservation == RESERVATIONS[0] else {"reservation": config.reservation}
        )
        self.s = scheduler_cls(
            max_batch_size=config.max_batch_size,
            num_blocks=config.num_blocks,
            block_size=config.block_size,
            max_num_batched_tokens=config.max_num_batched_tokens,
            connector=self.connector,
            has_mamba_cache=config.mamba,
            num_mamba_cache_blocks=3 if config.mamba else None,
            enable_prefix_caching=config.prefix_caching,
            **variant,
        )
        self.requests: dict[str, Any] = {}
        self.lost: set[str] = set()  # dequeued by a step that raised (reference §9.14)
        self.decode_oom_without_drafts = False

    # ----------------------------------------------------------------- events
    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        max_tokens: int,
        multimodal: bool,
        external: int,
        is_async: bool,
        delay: bool,
    ) -> None:
        req = self.types.request(
            request_id,
            prompt_token_ids=prompt,
            sampling_params=self.types.sampling(max_tokens=max_tokens),
            has_multimodal_inputs=multimodal,
        )
        if self.connector is not None:
            self.connector.plan[request_id] = (external, is_async, delay)
        self.requests[request_id] = req
        self.s.add_request(req)

    def abort(self, request_id: str, status: str) -> bool:
        """A client abort, applied before the next schedule(): mark a live request terminal."""
        req = self.requests[request_id]
        if req.is_finished():
            return False
        mark = getattr(req, "mark_canceled" if status == "CANCELED" else "mark_timeout", None)
        if callable(mark):
            mark()
        else:
            req.status = self.types.status[status]
        return True

    def step(self, plan: list[list[Any]]) -> dict[str, Any] | None:
        """schedule(), a simulated model output per ``plan`` rows [id, token, eos, draft, accept],
        then complete_requests (reference §5.1)."""
        placed_before = self._placed()
        used_drafts = False
        out: SchedulerOutput | None = None
        try:
            out = self.s.schedule()
            if out is None:
                return None
            summary = {
                "ids": [r.request_id for r in out.scheduled_requests],
                "is_prefill": out.is_prefill,
                "tables": [list(r.block_table) for r in out.scheduled_requests],
                "slots": [list(r.slot_mapping) for r in out.scheduled_requests],
                "meta": out.kv_connector_metadata,
            }
            rows = {row[0]: row for row in plan}
            ops = out.speculative_cache_ops
            for req in out.scheduled_requests:
                self.s.commit_computed_tokens(req, req.get_total_length())
                if req.is_finished():
                    continue
                _, token, eos, draft, accept = rows.get(
                    req.request_id, [req.request_id, 0, False, 0, 0]
                )
                appended = 1
                if draft and not out.is_prefill and self.config.speculation:
                    assert ops is not None, "a decode step with speculation offers cache ops"
                    used_drafts = True
                    length = req.get_total_length()
                    table, _ = ops.append_verify_slots(list(req.block_table), length + 1, draft)
                    accepted = min(accept, draft)
                    req.block_table = ops.rollback_to_length(table, length + accepted)
                    req.num_blocks = len(req.block_table)
                    appended += accepted
                before = req.get_total_length()
                for i in range(appended):
                    req.append_generated_token_id(token)
                    max_tokens = req.sampling_params.max_tokens
                    length_reached = (
                        bool(max_tokens) and req.get_num_generated_tokens() >= max_tokens
                    )
                    if length_reached or (eos and i == appended - 1):
                        req.status = self.types.status.FINISHED
                    if req.is_finished():
                        break
                if appended > 1:
                    added = req.get_total_length() - before
                    self.s.commit_computed_tokens(req, before + min(added, appended - 1))
            self.s.complete_requests(out.scheduled_requests)
            return summary
        except Exception as exc:
            if exception_kind(exc) != "RuntimeError":  # upstream's out of pages is a RuntimeError
                raise
            if out is None:  # inside schedule(): the dequeued live requests are gone (§9.14)
                after = self._placed()
                self.lost |= {
                    rid for rid in placed_before - after if not self.requests[rid].is_finished()
                }
            else:  # in the model runner: the whole in-flight batch is never completed
                self.lost |= {r.request_id for r in out.scheduled_requests}
            if not used_drafts:
                self.decode_oom_without_drafts = True
            raise

    def connector_events(
        self,
        finished_recving: list[str],
        finished_sending: list[str],
        failed_recving: list[str],
        invalid_block_ids: list[int],
    ) -> None:
        self.s.update_from_output(
            ModelRunnerOutput(
                KVConnectorOutput(
                    set(finished_recving),
                    set(finished_sending),
                    set(failed_recving),
                    set(invalid_block_ids),
                )
            )
        )

    def can_accept_request(self, request_id: str, num_local_computed_tokens: int) -> bool:
        return bool(self.s.can_accept_request(self.requests[request_id], num_local_computed_tokens))

    # ----------------------------------------------------------------- observation
    def _placed(self) -> set[str]:
        s = self.s
        return {*_ids(s.waiting_queue), *_ids(s.running_queue), *s.remote_kv_requests}

    def snapshot(self) -> SchedulerSnapshot:
        return read_scheduler(self.s, self.requests)


def _queued(queue: Any) -> int:
    """A queue's length: kvspec's ``queue.Queue`` or upstream's ``janus.Queue`` (a baseline)."""
    return int(queue.qsize() if hasattr(queue, "qsize") else queue.sync_q.qsize())


# ----------------------------------------------------------------------------- reading
_TERMINAL_NAMES = frozenset(status.name for status in TERMINAL)
_TERMINAL = tuple(TERMINAL)


class _Rows:
    """One harness's request rows (sorted by id) and which of them are still read every event."""

    def __init__(self) -> None:
        self.order: list[str] = []  # request ids, sorted
        self.rows: list[tuple[Any, ...]] = []  # their rows, in that order
        self.open: set[str] = set()  # the ids whose rows are read every event (not sealed)


class SealedReader:
    """The snapshot reader of one driver's harnesses, which reads a request's row once it is
    sealed (:func:`stateful_tests.sealed.sealed`) instead of after every event.

    Why that reads the same snapshot: a sealed request is terminal and referenced only by its
    harness's ``requests`` dict (so are its lists and plain attribute objects; no weak
    reference), so neither scheduler can reach it. Only the harness can hand it out again: it
    looks requests up by the ids an event names (``abort``, ``can_accept_request``), and the
    driver unseals every id an event names (:meth:`unseal`) before the event; a ``step``
    touches only the requests the scheduler's output holds (reachable, so never sealed), and
    its plan names only live requests. A sealed row is therefore what it was when it was
    sealed. A row sealed on both sides with the same value is kept once, so the spec-vs-target
    comparison meets the same object."""

    def __init__(self) -> None:
        self._of: dict[EngineHarness, _Rows] = {}

    def __call__(self, h: EngineHarness) -> SchedulerSnapshot:
        return read_scheduler(h.s, h.requests, self.rows(h))

    def open_ids(self, h: EngineHarness) -> Collection[str]:
        """Ids of ``h``'s requests that are not sealed (every one, before ``h`` is read)."""
        r = self._of.get(h)
        return h.requests if r is None else r.open

    def rows(self, h: EngineHarness) -> tuple[tuple[Any, ...], ...]:
        """The ``requests`` field of ``h``'s snapshot: rows sorted by id (ids are only added)."""
        requests = h.requests
        r = self._of.get(h)
        if r is None:
            r = self._of[h] = _Rows()
        rows, order = r.rows, r.order
        if len(order) != len(requests):  # new requests (ids are only added): open, in place
            for rid in set(requests).difference(order):
                i = bisect_left(order, rid)
                order.insert(i, rid)
                rows.insert(i, ())
                r.open.add(rid)
        for rid in list(r.open):
            if rid not in requests:  # an id an event named that the harness does not hold
                r.open.discard(rid)
                continue
            i = bisect_left(order, rid)
            row = rows[i] = request_row(rid, requests[rid])
            if row[1] in _TERMINAL_NAMES and sealed(requests, rid):
                r.open.discard(rid)
                rows[i] = self._shared(h, rid, row)
        return tuple(rows)

    def _shared(self, h: EngineHarness, rid: str, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """``row``, or an equal sealed row of the other harness (one object for both)."""
        for other, r in self._of.items():
            if other is not h and rid not in r.open:
                i = bisect_left(r.order, rid)
                if i < len(r.order) and r.order[i] == rid and r.rows[i] == row:
                    return r.rows[i]
        return row

    def unseal(self, args: Any) -> None:
        """Read again, from now on, the requests whose ids occur in ``args`` (nested lists too)."""
        for a in args:
            if type(a) is str:
                for r in self._of.values():
                    r.open.add(a)  # (an id it does not hold is dropped at the next read)
            elif type(a) is list:
                self.unseal(a)


# ----------------------------------------------------------------------------- invariants
def state_invariants(snap: SchedulerSnapshot) -> str | None:
    """The block-manager state invariants on the scheduler's pool (``"name: problem"``)."""
    return inv.first_state_violation(snap.block_manager)


def _holders(snap: SchedulerSnapshot, lost: Collection[str]) -> list[tuple[int, ...]]:
    """``snap.holders(lost)``, its id -> table map built without a Python-level loop."""
    rows = snap.requests
    tables = dict(zip(map(_ROW_ID, rows), map(_ROW_TABLE, rows), strict=True))
    return [
        *map(tables.__getitem__, snap.placed()),
        *map(tables.__getitem__, sorted(lost)),
        *(t for _, t in snap.pending_free_blocks),
    ]


_ROW_ID, _ROW_TABLE = itemgetter(0), itemgetter(2)


# Pools on which the block-manager state invariants held: they read only that part of a snapshot.
VERDICTS = Verdicts(key=attrgetter("block_manager"))


def _bm_state_holds(snap: SchedulerSnapshot) -> bool:
    return state_holds(snap.block_manager)


def _placement(snap: SchedulerSnapshot, lost: Collection[str]) -> str | None:
    """``request_in_exactly_one_place``, remembered for the last (snapshot, lost) pair: the
    driver checks the spec's and the target's equal snapshots one after the other."""
    key = (snap, frozenset(lost))
    if _LAST_PLACEMENT[0] == key:
        remembered: str | None = _LAST_PLACEMENT[1]
        return remembered
    problem = None if placement_holds(snap, lost) else inv.request_in_exactly_one_place(snap, lost)
    _LAST_PLACEMENT[:] = [key, problem]
    return problem


_LAST_PLACEMENT: list[Any] = [None, None]


# The harness invariants, in checking order: each (harness, its snapshot now, soundness) -> problem.
def _check_placement(h: EngineHarness, snap: SchedulerSnapshot, soundness: bool) -> str | None:
    return _placement(snap, h.lost)


def _check_reservation(h: EngineHarness, snap: SchedulerSnapshot, soundness: bool) -> str | None:
    s = h.s
    if not hasattr(s, "num_reserved_decode_blocks"):  # a scheduler that keeps no counter
        return None
    return inv.reservation_counter_matches_scan(
        s.num_reserved_decode_blocks,
        queue_items(s.running_queue),
        h.config.reservation,
        h.config.block_size,
    )


def _check_pending(h: EngineHarness, snap: SchedulerSnapshot, soundness: bool) -> str | None:
    s = h.s
    return inv.pending_counter_matches_scan(
        s.pending_kv_decode_blocks,
        s.remote_kv_requests.values(),
        h.config.reservation,
        h.config.block_size,
    )


def _check_referenced(h: EngineHarness, snap: SchedulerSnapshot, soundness: bool) -> str | None:
    usable = h.s.cache_manager.get_total_usable_blocks()
    lost = frozenset(h.lost)
    remembered = _LAST_LEDGER
    if remembered[0] is snap and remembered[1] == lost:  # the other harness's equal snapshot
        holders, occurrences = remembered[2], remembered[3]
    else:
        holders = _holders(snap, lost)
        occurrences = page_occurrences(snap.block_manager.num_blocks, holders)
        _LAST_LEDGER[:] = [snap, lost, holders, occurrences]
    if occurrences is not None and counts_hold(snap.block_manager, usable, occurrences):
        return None
    return inv.referenced_count_matches_live_pages(snap.block_manager, usable, holders)


# The last snapshot's (snapshot, lost, holders, their page occurrences): the driver checks the
# spec's and the target's harness on one snapshot object, one after the other.
_LAST_LEDGER: list[Any] = [None, None, None, None]


def _check_leak(h: EngineHarness, snap: SchedulerSnapshot, soundness: bool) -> str | None:
    return inv.no_leak_at_quiescence(snap.block_manager) if snap.quiescent(h.lost) else None


def _check_soundness(h: EngineHarness, snap: SchedulerSnapshot, soundness: bool) -> str | None:
    if not soundness:
        return None
    return inv.admission_soundness(h.decode_oom_without_drafts, h.config.reservation)


HARNESS_CHECKS: tuple[
    tuple[str, Callable[[EngineHarness, SchedulerSnapshot, bool], str | None]], ...
]
HARNESS_CHECKS = (
    ("request_in_exactly_one_place", _check_placement),
    ("reservation_counter_matches_scan", _check_reservation),
    ("pending_counter_matches_scan", _check_pending),
    ("referenced_count_matches_live_pages", _check_referenced),
    ("no_leak_at_quiescence", _check_leak),
    ("admission_soundness", _check_soundness),
)


def harness_checks(
    h: EngineHarness, *, soundness: bool, snap: SchedulerSnapshot | None = None
) -> list[tuple[str, Callable[[], str | None]]]:
    """The invariants that need a harness's own objects, in checking order: (name, check).
    ``snap``: the harness's snapshot now, when the caller has just read it (read otherwise)."""
    now = read_scheduler(h.s, h.requests) if snap is None else snap
    return [(name, partial(check, h, now, soundness)) for name, check in HARNESS_CHECKS]


def check_harness(
    h: EngineHarness, *, soundness: bool, snap: SchedulerSnapshot | None = None
) -> tuple[str, str] | None:
    """``(name, detail)`` of the first broken harness invariant, or ``None`` (``snap`` as in
    :func:`harness_checks`)."""
    if snap is None:
        snap = read_scheduler(h.s, h.requests)
    for name, check in HARNESS_CHECKS:
        problem = check(h, snap, soundness)
        if problem:
            return name, problem
    return None


# ----------------------------------------------------------------------------- driver
class Driver:
    """Engine events over a spec harness and a target harness, in lockstep."""

    def __init__(
        self,
        target_cls: Callable[..., Any],
        config: Config,
        *,
        soundness: bool = False,
        request_module: str | None = None,
        reference: Reference = SPEC,
    ) -> None:
        """``request_module``: where the target's ``InferenceRequest`` and ``RequestStatus`` live
        (default: the target's own module, see :func:`request_types`); ``reference``: what the
        target is compared with (a baseline's request types are its own module's)."""
        self.config = config
        self.soundness = soundness
        target_types = request_types(target_cls, request_module)
        if reference.kind == "spec":
            self.spec_h = EngineHarness(SpecScheduler, config)
        elif reference.cls is None:  # the invariants oracle: a second instance of the target
            self.spec_h = EngineHarness(target_cls, config, target_types)
        else:
            self.spec_h = EngineHarness(reference.cls, config, request_types(reference.cls))
        self.target_h = EngineHarness(target_cls, config, target_types)
        self.reader = SealedReader()
        self.ls = Lockstep(
            self.spec_h,
            self.target_h,
            self.reader,
            state_invariants={"block_manager": state_invariants},
            validate_first=lambda method, exc: False,
            verdicts=VERDICTS,
            state_holds=_bm_state_holds,
            role=reference.role,
        )
        self.prompts: list[list[int]] = []
        self.next_id = 0
        self.coverage: Counter[str] = Counter()
        self._live: tuple[Any, list[str]] = (None, [])

    @property
    def steps(self) -> list[Any]:
        return self.ls.steps

    def live(self) -> list[str]:
        """The spec's unfinished requests, oldest first. Remembered per spec snapshot: statuses
        change only inside lockstep calls, and each call reads a new snapshot."""
        if self._live[0] is not self.ls.after:
            unsealed = self.reader.open_ids(self.spec_h)  # sealed ones are finished
            self._live = (
                self.ls.after,
                [  # (r.is_finished(), without Enum's Python-level hash)
                    rid
                    for rid, r in self.spec_h.requests.items()
                    if rid in unsealed and r.status not in _TERMINAL
                ],
            )
        return list(self._live[1])

    def waiting(self) -> list[str]:
        """The spec's waiting queue, head first (its snapshot's, read after the last call)."""
        return list(self.ls.after.waiting)

    def call(self, method: str, *args: Any) -> Any:
        if method != "step":  # (a step's plan only names live requests: none is sealed)
            self.reader.unseal(args)
        out = self.ls.call(method, *args)
        self.coverage[f"call:{method}"] += 1
        if out.raised is not None:
            self.coverage[f"raise:{method}:{type(out.raised).__name__}"] += 1
        # on the snapshots the lockstep call has just read and compared (not read again)
        problem = check_harness(self.target_h, soundness=self.soundness, snap=self.ls.target_after)
        if problem is None:
            problem = check_harness(self.spec_h, soundness=self.soundness, snap=self.ls.after)
            if problem is not None and self.ls.role != "spec":
                problem = (problem[0], f"{problem[1]} (on the {self.ls.role} side)")
        if problem is not None:
            raise self.ls.fail(*problem)
        self._paths(method, out)
        return out

    def check_invariant(self, name: str) -> None:
        """One named invariant on the target's state now (the machine's ``@invariant``s)."""
        if name in inv.STATE_INVARIANTS:
            problem = inv.STATE_INVARIANTS[name](read_block_manager(self.target_h.s.cache_manager))
        else:
            checks = dict(harness_checks(self.target_h, soundness=self.soundness))
            problem = checks[name]()
        if problem:
            raise self.ls.fail(name, problem)

    def replay_step(self, step: dict[str, Any]) -> None:
        self.call(step["method"], *step["args"])

    def _paths(self, method: str, out: Any) -> None:
        s = self.spec_h.s
        if method == "step" and out.raised is None and out.returned is not None:
            self.coverage[
                "path:prefill_step" if out.returned["is_prefill"] else "path:decode_step"
            ] += 1
        if isinstance(out.raised, OutOfBlocksError):
            self.coverage["path:decode_out_of_blocks"] += 1
        if s.remote_kv_requests:
            self.coverage["path:remote_pending"] += 1
        if s.pending_free_blocks:
            self.coverage["path:pending_free_blocks"] += 1
        if _queued(s.waiting_queue) and _queued(s.running_queue):
            self.coverage["path:waiting_and_running"] += 1
        if not s.cache_manager.free_block_ids:
            self.coverage["path:pool_full"] += 1
        if self.spec_h.lost:
            self.coverage["path:requests_lost_to_oom"] += 1

    # ----------------------------------------------------------------- events
    def add_request(self, c: Chooser) -> None:
        size = self.config.block_size
        if self.prompts and c.chance(0.3):
            prompt = list(c.pick(self.prompts))
        else:
            n = max(1, c.int(0, 4) * size + c.pick((-1, 0, 1)))
            prompt = []
            if self.prompts and c.chance(0.5):
                base = c.pick(self.prompts)
                prompt = list(base[: c.int(0, min(n, len(base)))])
            while len(prompt) < n:
                prompt.append(c.int(0, self.config.vocab - 1))
        self.prompts.append(prompt)
        max_tokens = max(1, c.int(0, 3) * size + c.pick((-1, 0, 1)))
        external, is_async, delay = 0, False, False
        if self.config.connector:
            external = c.int(0, len(prompt)) if c.chance(0.4) else 0
            is_async = c.chance(0.3)
            delay = c.chance(0.2)
        rid = f"r{self.next_id}"
        self.next_id += 1
        multimodal = c.chance(0.1)
        self.call("add_request", rid, prompt, max_tokens, multimodal, external, is_async, delay)

    def step(self, c: Chooser) -> None:
        plan = []
        for rid in self.live():
            draft = c.int(0, 3) if self.config.speculation and c.chance(0.3) else 0
            plan.append(
                [rid, c.int(0, self.config.vocab - 1), c.chance(0.15), draft, c.int(0, draft)]
            )
        self.call("step", plan)

    def abort(self, c: Chooser) -> None:
        self.call("abort", c.pick(self.live()), c.pick(("CANCELED", "TIMEOUT")))

    def connector_events(self, c: Chooser) -> None:
        s = self.spec_h.s
        remote = list(s.remote_kv_requests)
        parked = list(s.pending_free_blocks)
        finished = [r for r in remote + parked if c.chance(0.5)]
        failed = [r for r in remote if r not in finished and c.chance(0.3)]
        sending = [r for r in parked if c.chance(0.4)]
        if c.chance(0.2):
            sending.append("unknown-id")  # events for ids the scheduler does not know: ignored
        invalid: list[int] = []
        for rid in failed:
            table = self.spec_h.requests[rid].block_table
            if table and c.chance(0.5):
                invalid.append(c.pick(table))
        self.call("connector_events", finished, sending, failed, invalid)

    def can_accept_request(self, c: Chooser) -> None:
        self.call("can_accept_request", c.pick(self.waiting()), 0)


class Facts(NamedTuple):
    """What the operations' enabling conditions read, computed once per event (a tuple: the
    fuzzer remembers the enabled rows per distinct value)."""

    live: bool
    waiting: bool
    connector: bool

    @classmethod
    def of(cls, d: Driver) -> Facts:
        return tuple.__new__(cls, (bool(d.live()), bool(d.ls.after.waiting), d.config.connector))


OPERATIONS: tuple[Operation, ...] = (
    Operation("add_request", 6),
    Operation("step", 12),
    Operation("abort", 1, lambda f: f.live),
    Operation("connector_events", 3, lambda f: f.connector),
    Operation("can_accept_request", 1, lambda f: f.waiting),
)


def draw_config(c: Chooser, reservation: str | None, connector: bool | None = None) -> Config:
    connector = c.chance(0.4) if connector is None else connector
    mamba = not connector and c.chance(0.15)
    return Config(
        num_blocks=c.int(2, 12),
        block_size=c.int(1, 4),
        max_batch_size=c.int(1, 4),
        max_num_batched_tokens=c.pick((4, 8, 16, 64)),
        prefix_caching=c.chance(0.7),
        connector=connector,
        mamba=mamba,
        speculation=c.chance(0.3),
        reservation=reservation or c.pick(RESERVATIONS),
    )


def machine_config(c: Chooser, variant: str | None, options: Options) -> Config:
    """The hypothesis machine's engine: the ``connector`` option, when given, is not drawn."""
    return draw_config(c, variant, options.get("connector"))


def fuzz_config(c: Chooser, variant: str | None, options: Options) -> Config:
    """The fuzzer's engine: drawn in full, then the ``speculation``/``connector`` options given
    replace what was drawn (so a seed draws the same sequence with or without them)."""
    config = draw_config(c, variant)
    overrides = {k: options[k] for k in ("speculation", "connector") if options.get(k) is not None}
    return Config(**{**config.to_json(), **overrides}) if overrides else config


def simplify_step(step: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A ``step`` event's plan without one of its rows (a dropped row means "token 0, no EOS")."""
    if step["method"] != "step":
        return
    rows = list(step["args"][0])
    for i in range(len(rows)):
        yield {**step, "args": [rows[:i] + rows[i + 1 :]]}


CHECKER = CheckerDef(
    machine_name="SchedulerLockstep",
    driver=lambda target_cls, config, options, reference: Driver(
        target_cls,
        config,
        soundness=bool(options.get("soundness")),
        request_module=options.get("request_module"),
        reference=reference,
    ),
    config_type=Config,
    machine_config=machine_config,
    fuzz_config=fuzz_config,
    operations=OPERATIONS,
    facts=Facts.of,
    spec_cls=SpecScheduler,
    invariants=(
        *inv.STATE_INVARIANTS,
        "request_in_exactly_one_place",
        "reservation_counter_matches_scan",
        "pending_counter_matches_scan",
        "referenced_count_matches_live_pages",
        "no_leak_at_quiescence",
    ),
    episode_ops=200,
    options=("soundness", "connector", "speculation", "request_module"),
    spec_properties=frozenset({"admission_soundness"}),
    simplify=simplify_step,
    # a PD connector on a 4-page pool: remote-pending and parked requests, aborts, a full pool
    examples=(Example(93, steps=60, config={"connector": True, "mamba": False, "num_blocks": 4}),),
)
