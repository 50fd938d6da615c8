"""The InfiniLM scheduler model of the explorer.

Engine events (admissions, steps with every simulated model output, aborts, PD-connector events)
over a spec harness and a target harness of ``stateful_tests.infinilm_scheduler`` (mirrors the
scheduler Driver). The snapshot leaves out request bookkeeping the future depends on, so the
state key adds it (:func:`_harness_extras`), with the hash tables of the schedulers' sets. The
target harness's reservation and pending counters are checked on every edge
(``check_harness``).
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections import deque
from collections.abc import Callable, Collection, Hashable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, ClassVar

from impl.infinilm.scheduler import Scheduler as ImplScheduler
from proofs.explorer.model_block_manager import _block_manager_cloner, _bm_tables, _table
from proofs.explorer.search import Edge, Model, check_ranges
from proofs.explorer.set_clone import _ATOMIC, clone, clone_set
from spec.infinilm.request import InferenceRequest, SamplingParams
from spec.infinilm.scheduler import RequestQueue, SpeculativeCacheOps
from spec.infinilm.scheduler import Scheduler as SpecScheduler
from stateful_tests import infinilm_scheduler as sched
from stateful_tests.lockstep import Check, Outcome
from stateful_tests.sealed import sealed


@dataclass(frozen=True)
class SchedulerBounds:
    """The small scope of the scheduler explorer (the engine-loop harness of
    ``stateful_tests.infinilm_scheduler``): a pool of ``pages`` pages of ``block_size`` tokens,
    batches of ``batch`` requests and ``budget`` tokens, at most ``requests`` requests over the
    whole run, prompts of 1..``prompt_tokens`` tokens from ``0..vocab-1``, ``max_tokens`` in
    1..``max_new``; a step's simulated output per scheduled request: EOS or not, the sampled token
    from ``0..gen_vocab-1`` (and draft/accept counts with ``speculation``). ``connector``: a
    scripted PD connector (external tokens none or all, async, delayed free) and its events.
    ``soundness``: also fail when a decode step runs out of pages without draft tokens."""

    variant: str = "legacy"
    pages: int = 4
    block_size: int = 2
    batch: int = 2
    budget: int = 8
    requests: int = 3
    prompt_tokens: int = 3
    max_new: int = 2
    vocab: int = 1
    gen_vocab: int = 1
    prefix_caching: bool = True
    connector: bool = False
    speculation: bool = False
    mamba: bool = False
    soundness: bool = False
    forget_finished: bool = True

    # each engine option the base leaves off (prefix caching off, a PD connector, draft tokens) on
    # a smaller pool and run, for the default variant, then the base for every variant
    SCOPES: ClassVar[dict[str, tuple[tuple[str, dict[str, Any]], ...]]] = {
        "default": (
            (
                "no-prefix-caching",
                {"prefix_caching": False, "requests": 2, "pages": 3, "variant": "legacy"},
            ),
            ("connector", {"connector": True, "pages": 3, "requests": 1, "variant": "legacy"}),
            ("speculation", {"speculation": True, "requests": 2, "pages": 3, "variant": "legacy"}),
            # four requests in one batch against a Mamba pool of three slots
            (
                "mamba",
                {
                    "mamba": True,
                    "requests": 4,
                    "batch": 4,
                    "pages": 3,
                    "prompt_tokens": 1,
                    "max_new": 1,
                    "variant": "legacy",
                },
            ),
            ("base", {}),
        ),
    }
    DIMENSIONS: ClassVar[tuple[str, ...]] = (
        "variant",
        "prefix_caching",
        "connector",
        "speculation",
        "mamba",
        "block_size",
    )

    HELP: ClassVar[dict[str, str]] = {
        "pages": "pages in the pool (at most 8)",
        "block_size": "tokens per page",
        "batch": "max batch size",
        "budget": "max batched tokens",
        "requests": "requests over the whole run (2 by default with --connector)",
        "prompt_tokens": "longest prompt",
        "max_new": "largest max_tokens",
        "vocab": "prompt token alphabet size",
        "gen_vocab": "sampled token alphabet size",
        "prefix_caching": "prefix caching",
        "connector": "a scripted PD connector and its events",
        "speculation": "draft tokens in decode steps",
        "mamba": "a Mamba state pool of 3 slots (has_mamba_cache; not with --connector)",
        "soundness": "also fail when a decode step runs out of pages without draft tokens",
        "forget_finished": (
            "finished requests no code can reach any more keyed by their id only (their "
            "prompt, max_tokens, output and final row no longer split states)"
        ),
    }

    @classmethod
    def create(cls, **values: Any) -> SchedulerBounds:
        """The bounds with ``values``; with a PD connector, 2 requests unless given (the connector
        multiplies every admission by 8 choices)."""
        if values.get("connector"):
            values.setdefault("requests", 2)
        return cls(**values)

    def validate(self) -> None:
        check_ranges(
            self,
            (
                ("pages", 1, 8),
                ("block_size", 1, 8),
                ("batch", 1, 8),
                ("budget", 1, 256),
                ("requests", 1, 6),
                ("prompt_tokens", 1, 16),
                ("max_new", 1, 16),
                ("vocab", 1, 4),
                ("gen_vocab", 1, 4),
            ),
        )
        if self.mamba and self.connector:
            raise ValueError("--mamba and --connector do not go together (as in the checkers)")


_RIDS = tuple(sys.intern(f"r{i}") for i in range(8))  # interned: set tables hold their addresses


_HARNESS_ATTRIBUTES = frozenset(
    {"config", "types", "connector", "s", "requests", "lost", "decode_oom_without_drafts"}
)


def _clone_plain(obj: Any, memo: dict[int, Any]) -> Any:
    """An object with a ``__dict__`` of atoms, lists of atoms and anything else (cloned)."""
    copied = memo[id(obj)] = object.__new__(type(obj))
    state = obj.__dict__.copy()
    for k, v in state.items():
        t = type(v)
        if t in _ATOMIC:
            continue
        if t is list and all(type(x) in _ATOMIC for x in v):
            state[k] = v.copy()
        else:
            state[k] = clone(v, memo)
    copied.__dict__.update(state)
    return copied


# kvspec's InferenceRequest: what each attribute holds (its constructor and methods keep it so)
_REQUEST_LISTS = frozenset(  # lists of ints or of hash bytes: a shallow copy is exact
    {
        "prompt_token_ids",
        "block_table",
        "slot_mapping",
        "_generated_token_ids",
        "_block_hashes",
        "_hash_tail",
    }
)
_REQUEST_ATTRIBUTES = _REQUEST_LISTS | {
    "request_id",
    "prompt_length",
    "sampling_params",  # a SamplingParams (one int): copied
    "status",
    "finish_reason",
    "num_blocks",
    "num_computed_tokens",
    "num_local_cached_tokens",
    "num_cache_indexed_blocks",
    "mamba_cache_index",
    "has_multimodal_inputs",
    "kv_transfer_params",  # None in the harness, cloned otherwise
    "_hash_config",  # a tuple of atoms: shared
}
_SCHEDULER_ATTRIBUTES = frozenset(
    {
        "reservation",
        "max_batch_size",
        "block_size",
        "max_num_batched_tokens",
        "connector",
        "has_mamba_cache",
        "enable_prefix_caching",
        "cache_manager",
        "mamba_cache_manager",
        "speculative_cache_ops",
        "waiting_queue",
        "running_queue",
        "remote_kv_requests",
        "finished_receiving_kv_req_ids",
        "failed_receiving_kv_req_ids",
        "pending_free_blocks",
        "pending_kv_decode_blocks",
        "_incremental",
        "_num_reserved",
    }
)


_SCHEDULERS = (SpecScheduler, ImplScheduler)


def _clone_request(r: Any, memo: dict[int, Any]) -> Any:
    """:func:`_clone_plain` for kvspec's own request class (its list attributes hold atoms)."""
    state = r.__dict__
    if type(r) is not InferenceRequest or not state.keys() <= _REQUEST_ATTRIBUTES:
        return _clone_plain(r, memo)
    state = state.copy()
    for name in _REQUEST_LISTS:
        state[name] = state[name].copy()
    params = state["sampling_params"]
    if type(params) is SamplingParams:
        copied_params = object.__new__(SamplingParams)
        copied_params.__dict__.update(params.__dict__)
        state["sampling_params"] = copied_params
    else:
        state["sampling_params"] = clone(params, memo)
    if state["kv_transfer_params"] is not None:
        state["kv_transfer_params"] = clone(state["kv_transfer_params"], memo)
    copied = memo[id(r)] = object.__new__(InferenceRequest)
    copied.__dict__ = state
    return copied


def _clone_scheduler(s: Any, connector: Any, memo: dict[int, Any]) -> Any:
    """The scheduler of a harness whose requests and block manager are in ``memo`` already,
    field by field — for kvspec's own schedulers in the harness's shape; ``None`` otherwise."""
    state = s.__dict__
    ops, bm = state.get("speculative_cache_ops"), state.get("cache_manager")
    queues = (state.get("waiting_queue"), state.get("running_queue"))
    if (
        not isinstance(s, _SCHEDULERS)
        or not state.keys() <= _SCHEDULER_ATTRIBUTES
        or id(bm) not in memo
        or type(ops) is not SpeculativeCacheOps
        or ops.__dict__.keys() != {"block_manager"}
        or ops.block_manager is not bm
        or state.get("mamba_cache_manager") is not None
        or state.get("connector") is not connector
        or any(type(q) is not RequestQueue or q.__dict__.keys() != {"_items"} for q in queues)
    ):
        return None
    state = state.copy()
    new = object.__new__
    copied_bm = state["cache_manager"] = memo[id(bm)]
    copied_ops = state["speculative_cache_ops"] = new(SpeculativeCacheOps)
    copied_ops.block_manager = copied_bm
    try:
        for name, queue in zip(("waiting_queue", "running_queue"), queues, strict=True):
            copied_queue = state[name] = new(RequestQueue)
            copied_queue._items = deque([memo[id(r)] for r in queue._items])
        state["remote_kv_requests"] = {
            k: memo[id(r)] for k, r in state["remote_kv_requests"].items()
        }
    except KeyError:  # a request the harness does not list: the generic clone keeps it
        return None
    state["finished_receiving_kv_req_ids"] = clone_set(state["finished_receiving_kv_req_ids"])
    state["failed_receiving_kv_req_ids"] = clone_set(state["failed_receiving_kv_req_ids"])
    state["pending_free_blocks"] = clone(state["pending_free_blocks"], memo)
    if connector is not None:
        state["connector"] = memo[id(connector)]
    copied = new(type(s))
    copied.__dict__ = state
    return copied


class SchedulerModel(Model):
    """Engine events over a spec harness and a target harness (mirrors the scheduler Driver)."""

    # every method of the alphabet (docs/targets.md), for the report of those never reached
    operations = (
        "abort",
        "add_request",
        "can_accept_request",
        "connector_events",
        "step",
    )

    def clone(self, obj: Any) -> Any:
        """The generic exact :func:`clone`, unrolled for a harness: its frozen config and request
        types shared, requests copied flat, the block manager by its own cloner, the rest (queues,
        connector, id sets) by :func:`clone` with one memo, so every alias is kept."""
        h = obj
        if type(h) is not self.sched.EngineHarness or not h.__dict__.keys() <= _HARNESS_ATTRIBUTES:
            return clone(h)
        memo: dict[int, Any] = {}
        state = h.__dict__.copy()
        known = self._gone.get(h, frozenset())
        requests = state["requests"] = {}
        for rid, r in h.requests.items():
            # a forgotten request never changes again (forgotten()): shared, not copied
            requests[rid] = memo[id(r)] = r if rid in known else _clone_request(r, memo)
        state["lost"] = clone_set(h.lost)
        s = h.s
        bm = s.cache_manager
        fast = self._bm_fast.get(type(bm))
        if fast is None:
            fast = self._bm_fast[type(bm)] = _block_manager_cloner(type(bm))
        if fast is not False and hasattr(bm, "__dict__"):
            memo[id(bm)] = fast(bm)
        state["connector"] = clone(h.connector, memo)
        state["s"] = _clone_scheduler(s, h.connector, memo) or clone(s, memo)
        copied = object.__new__(type(h))
        copied.__dict__ = state
        if known:  # (what was unreachable in h is unreachable in the copy, which shares it)
            self._gone[copied] = known
        return copied

    def __getstate__(self) -> dict[str, Any]:
        """The model for another interpreter (a Ray worker): the findings about this process's
        harness objects stay here (a weak mapping cannot be pickled, and its keys are objects
        of this process), the other side starts with none."""
        state = self.__dict__.copy()
        state["_gone"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__["_gone"] = weakref.WeakKeyDictionary()

    def forgotten(self, h: Any) -> frozenset[str]:
        """:func:`_forgotten`, each request tested until it is found forgotten: from then on it
        stays so in ``h`` and in every exact copy of it (:meth:`clone` hands the finding on), since
        nothing can reach it to change that — the alphabet never names a finished request, and the
        harness hands out only the requests an event names (:func:`_harness_extras`)."""
        known = self._gone.get(h, frozenset())
        found = _forgotten(h, known)
        if not found:
            return known
        now = self._gone[h] = known | found
        return now

    def __init__(
        self,
        component: str,
        target_cls: Callable[..., Any],
        target: str,
        bounds: SchedulerBounds,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(component, target_cls, target, bounds, options)
        self.checker = sched.CHECKER
        self.sched = sched
        self.spec_cls = SpecScheduler
        self.reader = lambda h: h.snapshot()
        self.state_invariants = {"block_manager": sched.state_invariants}
        self.config = sched.Config(
            num_blocks=bounds.pages,
            block_size=bounds.block_size,
            max_batch_size=bounds.batch,
            max_num_batched_tokens=bounds.budget,
            prefix_caching=bounds.prefix_caching,
            connector=bounds.connector,
            mamba=bounds.mamba,
            speculation=bounds.speculation,
            reservation=bounds.variant,
            vocab=bounds.vocab,
        )
        self._bm_fast: dict[type, Any] = {}
        # harness -> the requests found forgotten in it (see forgotten())
        self._gone: weakref.WeakKeyDictionary[Any, frozenset[str]] = weakref.WeakKeyDictionary()
        self.prompts = [
            list(p)
            for n in range(1, bounds.prompt_tokens + 1)
            for p in itertools.product(range(bounds.vocab), repeat=n)
        ]

    def initial(self) -> tuple[Any, Any, Any]:
        h = self.sched.EngineHarness
        return h(self.spec_cls, self.config), h(self.target_cls, self.config), ()

    def trace_config(self) -> dict[str, Any]:
        return self.config.to_json()

    def replay_options(self) -> dict[str, Any]:
        return {**self.options, "soundness": self.b.soundness or None}

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        if not self.b.forget_finished:
            return (snap, _harness_extras(spec), _harness_extras(target))
        gone_spec, gone_target = self.forgotten(spec), self.forgotten(target)
        return (
            _frozen_rows_collapsed(snap, gone_spec & gone_target),
            _harness_extras(spec, gone_spec),
            _harness_extras(target, gone_target),
        )

    def reductions(self) -> dict[str, bool]:
        return {"forget_finished": self.b.forget_finished}

    def route(self, snap: Any, spec: Any, target: Any) -> Hashable:
        # the snapshot as the key holds it: forgotten rows cut to their ids (one pair is reached
        # with other final rows of a forgotten request, so the raw snapshot would split it)
        held: Hashable = self.key(snap, (), spec, target)[0]  # type: ignore[index]
        return held

    def observable(self, snap: Any, gen: Any) -> Hashable:
        return snap  # type: ignore[no-any-return]

    # ------------------------------------------------------------ the alphabet
    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        b = self.b
        out: list[Edge] = []
        add = out.append
        statuses = {r[0]: r[1] for r in snap.requests}
        live = [rid for rid, status in statuses.items() if status not in _TERMINAL_NAMES]
        for rid in snap.waiting:
            add(Edge("can_accept_request", (rid, 0), readonly=True))
        for plan in self._plans(spec, live):
            add(Edge("step", (plan,)))
        if len(statuses) < b.requests:
            rid = _RIDS[len(statuses)]
            connector = (
                [(e, a, d) for e in (0, -1) for a in (False, True) for d in (False, True)]
                if b.connector
                else [(0, False, False)]
            )
            for prompt in self.prompts:
                for max_tokens in range(1, b.max_new + 1):
                    for external, is_async, delay in connector:
                        ext = len(prompt) if external < 0 else external
                        add(
                            Edge(
                                "add_request",
                                (rid, prompt, max_tokens, False, ext, is_async, delay),
                            )
                        )
        for rid in live:
            for status in ("CANCELED", "TIMEOUT"):
                add(Edge("abort", (rid, status)))
        if b.connector:
            for events in self._connector_events(snap):
                add(Edge("connector_events", events))
        return out

    def _plans(self, spec: Callable[[], Any], live: list[str]) -> list[list[list[Any]]]:
        """Every simulated model output for the requests the spec would schedule now."""
        b = self.b
        probe = spec()
        try:
            out = probe.s.schedule()
        except Exception:  # the step will raise before any output: one call covers it
            return [[]]
        if out is None:
            return [[]]
        rows_per_request = []
        for req in out.scheduled_requests:
            rows = []
            for token in range(b.gen_vocab):
                for eos in (False, True):
                    drafts = range(3) if b.speculation and not out.is_prefill else range(1)
                    for draft in drafts:
                        for accept in range(draft + 1):
                            rows.append([req.request_id, token, eos, draft, accept])
            rows_per_request.append(rows)
        return [list(rows) for rows in itertools.product(*rows_per_request)]

    def _connector_events(self, snap: Any) -> list[tuple[Any, ...]]:
        """Per remote-pending request: nothing, finished, failed, failed with its first page
        invalid; per parked table: nothing, received, sent; plus events for an unknown id."""
        tables = {r[0]: r[2] for r in snap.requests}
        remote = list(snap.remote)
        parked = [rid for rid, _ in snap.pending_free_blocks]
        choices: list[list[tuple[str, str]]] = [
            [(rid, c) for c in ("none", "finished", "failed", "invalid")] for rid in remote
        ] + [[(rid, c) for c in ("none", "recv", "sent")] for rid in parked]
        out: list[tuple[Any, ...]] = []
        for combo in itertools.product(*choices):
            finished = [rid for rid, c in combo if c in ("finished", "recv")]
            failed = [rid for rid, c in combo if c in ("failed", "invalid")]
            sent = [rid for rid, c in combo if c == "sent"]
            invalid = [tables[rid][0] for rid, c in combo if c == "invalid" and tables[rid]]
            if finished or failed or sent:
                out.append((finished, sent, failed, invalid))
        out.append(([], ["unknown-id"], [], []))
        return out

    # ------------------------------------------------------------ harness invariants
    def edge_checks(
        self, edge: Edge, before: Any, snap: Any, spec_out: Outcome, target: Any, gen: Any
    ) -> Check | None:
        # ``snap`` is the spec's snapshot after the call, which the target's equals by now: it is
        # not read again (a read-only batch that lets a difference through to here is re-decided
        # on the exact path by its final comparison)
        return self.sched.check_harness(target, soundness=self.b.soundness, snap=snap)

    def state_checks(self, snap: Any, gen: Any, spec: Any, target: Any) -> Check | None:
        return self.sched.check_harness(spec, soundness=self.b.soundness, snap=snap)


_TERMINAL_NAMES = frozenset({"FINISHED", "CANCELED", "TIMEOUT", "FAILED"})


def _forgotten(h: Any, known: Collection[str] = ()) -> set[str]:
    """The ids of ``h``'s finished requests that only its ``requests`` dict refers to (and not
    lost: a lost request is live to the harness), leaving out the ``known`` ones (not tested)."""
    out: set[str] = set()
    requests, lost = h.requests, h.lost
    for rid in list(requests):
        if rid in known or rid in lost or not sealed(requests, rid):  # (sealed first: no
            # extra reference to the request yet)
            continue
        status = getattr(requests[rid], "status", None)
        if getattr(status, "name", None) in _TERMINAL_NAMES:
            out.add(rid)
    return out


def _frozen_rows_collapsed(snap: Any, gone: AbstractSet[str]) -> Any:
    """``snap`` with the row of each request forgotten on both sides (``gone``) cut down to its id
    — unless the snapshot names the id anywhere else (a queue, the connector's id sets, a parked
    table), where the row stays whole.

    Why nothing is lost: a forgotten request is finished and unreachable on both sides
    (:func:`_forgotten`), so its row is the same on both sides now and can never change again —
    every later spec-vs-target comparison of it passes. What else reads a row: the alphabet
    (only whether it is finished, and how many requests there are: both kept, the id stays), the
    placement invariant (only whether it is finished and where its id is placed: an id named
    elsewhere keeps its row) and the page ledger (placed, lost and parked tables only; a
    forgotten request is none of them). So two states that differ only in such rows (a finished
    request's status, output length or stale table) have the same future verdicts."""
    if not gone:
        return snap
    named = {
        *snap.waiting,
        *snap.running,
        *snap.remote,
        *snap.finished_receiving,
        *snap.failed_receiving,
        *(rid for rid, _ in snap.pending_free_blocks),
    }
    frozen = gone - named
    if not frozen:
        return snap
    return snap._replace(
        requests=tuple([(row[0],) if row[0] in frozen else row for row in snap.requests])
    )


def _harness_extras(h: Any, gone: Collection[str] = ()) -> tuple[Any, ...]:
    """What the scheduler snapshot leaves out but the future depends on: each request's prompt,
    max_tokens, multimodal flag and generated tokens, the connector's plan, requests lost to an
    out-of-pages step, and the hash tables of the sets (eviction order, id sets).

    ``gone``: the requests :func:`_forgotten` found (with ``forget_finished``). A finished
    request that nothing but the harness's ``requests`` dict refers to
    (:func:`~stateful_tests.sealed.sealed`: no scheduler queue, table or id set can reach it) is
    keyed by its id alone (its snapshot row: :func:`_frozen_rows_collapsed`). Nothing reads the
    rest again: the alphabet names live requests only (aborts, admission queries, step plans),
    the harness hands a request out only for those events (an abort of a finished request
    returns False after reading its status), and the harness invariants read the snapshot, the
    lost set and the schedulers' own queues. So two states that differ only in a finished
    request's prompt, budget or output have the same future on both sides."""
    s = h.s
    requests = h.requests
    rows: list[tuple[Any, ...]] = []
    for rid in sorted(requests):
        if rid in gone:
            rows.append((rid,))
            continue
        r = requests[rid]
        rows.append(
            (
                rid,
                tuple(r.prompt_token_ids),
                r.sampling_params.max_tokens,
                r.has_multimodal_inputs,
                tuple(r._generated_token_ids),
            )
        )
    requests = tuple(rows)
    plan = tuple(sorted(h.connector.plan.items())) if h.connector is not None else ()
    bm = s.cache_manager
    sets = (
        _bm_tables(bm),
        _table(s.finished_receiving_kv_req_ids),
        _table(s.failed_receiving_kv_req_ids),
    )
    return (requests, plan, tuple(sorted(h.lost)), h.decode_oom_without_drafts, sets)
