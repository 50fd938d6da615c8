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

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from spec import invariants as inv
from spec.errors import OutOfBlocksError
from spec.infinilm.request import InferenceRequest, RequestStatus, SamplingParams
from spec.infinilm.scheduler import (
    RESERVATIONS,
    KVConnectorOutput,
    ModelRunnerOutput,
    SchedulerOutput,
    remote_reservation,
    running_reservation,
)
from spec.infinilm.scheduler import Scheduler as SpecScheduler
from spec.infinilm.snapshot import BlockManagerSnapshot, read_block_manager
from stateful_tests.lockstep import (
    Chooser,
    DataChooser,
    Divergence,
    Lockstep,
    RunResult,
    fuzz_episodes,
    run_machine,
    shrink_steps,
    trace_document,
)

COMPONENT = "infinilm-scheduler"


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
    """A PD connector test double whose answers the driver decides per request id."""

    def __init__(self) -> None:
        self.plan: dict[str, tuple[int, bool, bool]] = {}  # id -> (external tokens, async, delay)

    def get_num_new_matched_tokens(
        self, request: InferenceRequest, num_local_computed_tokens: int
    ) -> tuple[int, bool]:
        external, is_async, _ = self.plan.get(request.request_id, (0, False, False))
        return external, is_async

    def update_state_after_alloc(
        self,
        request: InferenceRequest,
        block_table: list[int],
        num_external_tokens: int,
        block_size: int,
    ) -> None:
        return None

    def request_finished(
        self, request: InferenceRequest, block_table: list[int], block_size: int
    ) -> tuple[bool, Any]:
        return self.plan.get(request.request_id, (0, False, False))[2], None

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> Any:
        return [r.request_id for r in scheduler_output.scheduled_requests]


class SchedulerSnapshot(NamedTuple):
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    remote: tuple[str, ...]
    finished_receiving: tuple[str, ...]
    failed_receiving: tuple[str, ...]
    pending_free_blocks: tuple[tuple[str, tuple[int, ...]], ...]
    pending_kv_decode_blocks: int
    cache_stats: tuple[tuple[str, int], ...]
    requests: tuple[tuple[Any, ...], ...]
    mamba: tuple[Any, ...]
    block_manager: BlockManagerSnapshot

    def differing_fields(self, other: SchedulerSnapshot) -> list[str]:
        return [name for name, a, b in zip(self._fields, self, other, strict=True) if a != b]


def _ids(queue: Any) -> tuple[str, ...]:
    return tuple(r.request_id for r in queue)


class EngineHarness:
    """One scheduler, its requests and its connector, driven by JSON-able engine events."""

    def __init__(self, scheduler_cls: Callable[..., Any], config: Config) -> None:
        self.config = config
        self.connector = ScriptedConnector() if config.connector else None
        self.s = scheduler_cls(
            max_batch_size=config.max_batch_size,
            num_blocks=config.num_blocks,
            block_size=config.block_size,
            max_num_batched_tokens=config.max_num_batched_tokens,
            connector=self.connector,
            has_mamba_cache=config.mamba,
            num_mamba_cache_blocks=3 if config.mamba else None,
            enable_prefix_caching=config.prefix_caching,
            reservation=config.reservation,
        )
        self.requests: dict[str, InferenceRequest] = {}
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
        req = InferenceRequest(
            request_id, prompt, SamplingParams(max_tokens), has_multimodal_inputs=multimodal
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
        req.status = RequestStatus[status]
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
                        req.status = RequestStatus.FINISHED
                    if req.is_finished():
                        break
                if appended > 1:
                    added = req.get_total_length() - before
                    self.s.commit_computed_tokens(req, before + min(added, appended - 1))
            self.s.complete_requests(out.scheduled_requests)
            return summary
        except OutOfBlocksError:
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
        s = self.s
        mamba = s.mamba_cache_manager
        return SchedulerSnapshot(
            waiting=_ids(s.waiting_queue),
            running=_ids(s.running_queue),
            remote=tuple(s.remote_kv_requests),
            finished_receiving=tuple(sorted(s.finished_receiving_kv_req_ids)),
            failed_receiving=tuple(sorted(s.failed_receiving_kv_req_ids)),
            pending_free_blocks=tuple(
                sorted((k, tuple(v)) for k, v in s.pending_free_blocks.items())
            ),
            pending_kv_decode_blocks=s.pending_kv_decode_blocks,
            cache_stats=tuple(sorted(s.get_cache_stats().items())),
            requests=tuple(
                (
                    rid,
                    r.status.name,
                    tuple(r.block_table),
                    tuple(r.slot_mapping),
                    r.num_blocks,
                    r.num_computed_tokens,
                    r.num_local_cached_tokens,
                    r.num_cache_indexed_blocks,
                    r.mamba_cache_index,
                    r.get_num_generated_tokens(),
                )
                for rid, r in sorted(self.requests.items())
            ),
            mamba=(tuple(mamba.free_block_ids), tuple(mamba.used_block_ids)) if mamba else (),
            block_manager=read_block_manager(s.cache_manager),
        )


# ----------------------------------------------------------------------------- invariants
def _state_invariants(snap: SchedulerSnapshot) -> str | None:
    for name, predicate in inv.STATE_INVARIANTS.items():
        problem = predicate(snap.block_manager)
        if problem:
            return f"{name}: {problem}"
    return None


def check_harness(h: EngineHarness, *, soundness: bool) -> tuple[str, str] | None:
    """The invariants that need the target's own objects; ``(name, detail)`` of the first broken."""
    s, size, variant = h.s, h.config.block_size, h.config.reservation
    bm_snap = read_block_manager(s.cache_manager)
    places = [*_ids(s.waiting_queue), *_ids(s.running_queue), *s.remote_kv_requests]
    twice = sorted(rid for rid, n in Counter(places).items() if n > 1)
    nowhere = sorted(
        rid
        for rid, r in h.requests.items()
        if not r.is_finished() and rid not in places and rid not in h.lost
    )
    if twice or nowhere:
        return "request_in_exactly_one_place", f"in two places: {twice}; in none: {nowhere}"
    scan = sum(running_reservation(variant, r, size) for r in s.running_queue)
    if s.num_reserved_decode_blocks != scan:
        return (
            "reservation_counter_matches_scan",
            f"num_reserved_decode_blocks={s.num_reserved_decode_blocks} but the scan gives {scan}",
        )
    pending = sum(remote_reservation(variant, r, size) for r in s.remote_kv_requests.values())
    if s.pending_kv_decode_blocks != pending:
        return (
            "pending_counter_matches_scan",
            f"pending_kv_decode_blocks={s.pending_kv_decode_blocks} but the scan gives {pending}",
        )
    holders = [list(h.requests[rid].block_table) for rid in places]
    holders += [list(h.requests[rid].block_table) for rid in sorted(h.lost)]
    holders += [list(t) for t in s.pending_free_blocks.values()]
    problem = inv.referenced_count_matches_live_pages(
        bm_snap, s.cache_manager.get_total_usable_blocks(), holders
    )
    if problem:
        return "referenced_count_matches_live_pages", problem
    if not places and not s.pending_free_blocks and not h.lost:
        problem = inv.no_leak_at_quiescence(bm_snap)
        if problem:
            return "no_leak_at_quiescence", problem
    if soundness and h.decode_oom_without_drafts:
        return (
            "admission_soundness",
            f"a decode step ran out of pages with no draft tokens ({variant} reservation)",
        )
    return None


# ----------------------------------------------------------------------------- driver
class Driver:
    """Engine events over a spec harness and a target harness, in lockstep."""

    def __init__(
        self, target_cls: Callable[..., Any], config: Config, *, soundness: bool = False
    ) -> None:
        self.config = config
        self.soundness = soundness
        self.spec_h = EngineHarness(SpecScheduler, config)
        self.target_h = EngineHarness(target_cls, config)
        self.ls = Lockstep(
            self.spec_h,
            self.target_h,
            lambda h: h.snapshot(),
            state_invariants={"block_manager": _state_invariants},
            validate_first=lambda method, exc: False,
        )
        self.prompts: list[list[int]] = []
        self.next_id = 0
        self.coverage: Counter[str] = Counter()

    @property
    def steps(self) -> list[Any]:
        return self.ls.steps

    def live(self) -> list[str]:
        return [rid for rid, r in self.spec_h.requests.items() if not r.is_finished()]

    def waiting(self) -> list[str]:
        return list(_ids(self.spec_h.s.waiting_queue))

    def call(self, method: str, *args: Any) -> Any:
        out = self.ls.call(method, *args)
        self.coverage[f"call:{method}"] += 1
        if out.raised is not None:
            self.coverage[f"raise:{method}:{type(out.raised).__name__}"] += 1
        problem = check_harness(self.target_h, soundness=self.soundness)
        if problem is None:
            problem = check_harness(self.spec_h, soundness=self.soundness)
        if problem is not None:
            raise self.ls.fail(*problem)
        self._paths(method, out)
        return out

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
        if s.waiting_queue.qsize() and s.running_queue.qsize():
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


OPERATIONS: list[tuple[str, int, Callable[[Driver], bool]]] = [
    ("add_request", 6, lambda d: True),
    ("step", 12, lambda d: True),
    ("abort", 1, lambda d: bool(d.live())),
    ("connector_events", 3, lambda d: d.config.connector),
    ("can_accept_request", 1, lambda d: bool(d.waiting())),
]


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


# ----------------------------------------------------------------------------- runners
def _trace(target: str, config: Config, failure: Divergence) -> dict[str, Any]:
    return trace_document(COMPONENT, target, config.to_json(), failure.steps, failure)


def fuzz(
    target_cls: Callable[..., Any],
    target: str,
    ops: int,
    seed: int,
    *,
    reservation: str | None = None,
    soundness: bool = False,
    speculation: bool | None = None,
    connector: bool | None = None,
    episode_ops: int = 200,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Seeded engine-loop fuzzing over varied configurations until ``ops`` events."""
    overrides = {
        k: v for k, v in (("speculation", speculation), ("connector", connector)) if v is not None
    }

    def new_driver(c: Chooser) -> Driver:
        config = draw_config(c, reservation)
        if overrides:
            config = Config(**{**config.to_json(), **overrides})
        return Driver(target_cls, config, soundness=soundness)

    return fuzz_episodes(
        target,
        ops,
        random.Random(seed),
        new_driver=new_driver,
        operations=OPERATIONS,
        trace=lambda d, exc: _trace(target, d.config, exc),
        episode_ops=episode_ops,
        progress=progress,
    )


def make_machine(
    target_cls: Callable[..., Any],
    reservation: str | None,
    soundness: bool,
    connector: bool | None = None,
) -> type[RuleBasedStateMachine]:
    class SchedulerLockstep(RuleBasedStateMachine):
        drivers_started = 0
        steps_run = 0
        last_driver: Driver | None = None
        coverage: Counter[str] = Counter()  # noqa: RUF012 (per generated class)

        @initialize(data=st.data())
        def configure(self, data: st.DataObject) -> None:
            config = draw_config(DataChooser(data), reservation, connector)
            self.d = Driver(target_cls, config, soundness=soundness)
            cls = type(self)
            cls.drivers_started += 1
            cls.last_driver = self.d

        def _run(self, op: str, data: st.DataObject) -> None:
            before = len(self.d.steps)
            try:
                getattr(self.d, op)(DataChooser(data))
            finally:
                cls = type(self)
                cls.steps_run += len(self.d.steps) - before
                cls.coverage[f"rule:{op}"] += 1

        @rule(data=st.data())
        def add_request(self, data: st.DataObject) -> None:
            self._run("add_request", data)

        @rule(data=st.data())
        def step(self, data: st.DataObject) -> None:
            self._run("step", data)

        @precondition(lambda self: bool(self.d.live()))
        @rule(data=st.data())
        def abort(self, data: st.DataObject) -> None:
            self._run("abort", data)

        @precondition(lambda self: self.d.config.connector)
        @rule(data=st.data())
        def connector_events(self, data: st.DataObject) -> None:
            self._run("connector_events", data)

        @precondition(lambda self: bool(self.d.waiting()))
        @rule(data=st.data())
        def can_accept_request(self, data: st.DataObject) -> None:
            self._run("can_accept_request", data)

        def teardown(self) -> None:
            type(self).coverage.update(self.d.coverage)

    return SchedulerLockstep


def check(
    target_cls: Callable[..., Any],
    target: str,
    settings: Any,
    *,
    reservation: str | None = None,
    soundness: bool = False,
    connector: bool | None = None,
) -> RunResult:
    """Run the engine-loop lockstep machine under ``settings``."""
    return run_machine(
        make_machine(target_cls, reservation, soundness, connector),
        settings,
        target,
        lambda d, exc: _trace(target, d.config, exc),
    )


def replay(
    document: dict[str, Any],
    target_cls: Callable[..., Any],
    target: str,
    *,
    soundness: bool = False,
) -> RunResult:
    from stateful_tests.lockstep import decode

    config = Config(**document["config"])
    d = Driver(target_cls, config, soundness=soundness)
    started = time.perf_counter()
    try:
        for step in document["steps"]:
            d.call(step["method"], *decode(step["args"]))
    except Divergence as exc:
        return RunResult(
            target,
            False,
            1,
            len(exc.steps),
            time.perf_counter() - started,
            failure=exc,
            trace=_trace(target, config, exc),
        )
    return RunResult(target, True, 1, len(d.steps), time.perf_counter() - started)


def shrink_trace(
    document: dict[str, Any],
    target_cls: Callable[..., Any],
    target: str,
    *,
    soundness: bool = False,
    budget_seconds: float = 10.0,
) -> dict[str, Any]:
    """Delete events while the trace still fails the same check (and passes spec-vs-spec unless
    the failing check is a property of the spec itself, like ``admission_soundness``)."""
    check_name = (document.get("failure") or {}).get("check")
    deadline = time.perf_counter() + budget_seconds
    spec_property = check_name == "admission_soundness"

    def attempt(steps: list[dict[str, Any]]) -> dict[str, Any] | None:
        candidate = {**document, "steps": list(steps)}
        result = replay(candidate, target_cls, target, soundness=soundness)
        if result.passed or result.failure is None or result.failure.check != check_name:
            return None
        if not spec_property and not replay(candidate, SpecScheduler, "spec").passed:
            return None
        return result.trace

    best = shrink_steps(document, attempt, deadline)
    if best is document:  # the trace does not reproduce: nothing to simplify
        return document
    # then simplify step plans: drop rows one by one (a dropped row means "token 0, no EOS")
    for index, step in enumerate(best["steps"]):
        if step["method"] != "step" or time.perf_counter() >= deadline:
            continue
        rows = list(step["args"][0])
        for row in list(rows):
            trial = [r for r in rows if r is not row]
            steps = [*best["steps"][:index], {**step, "args": [trial]}, *best["steps"][index + 1 :]]
            smaller = attempt(steps)
            if smaller is not None:
                best, rows = smaller, trial
    return best
