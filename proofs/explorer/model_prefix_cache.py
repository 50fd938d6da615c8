"""The vLLM GPU prefix-cache model of the explorer (``KVCacheManager`` + ``BlockPool``).

Scheduler events over a spec harness and a target harness of
:mod:`stateful_tests.vllm_prefix_harness` (the calls the prefix-cache checker's traces use, so a
counterexample replays there): requests arrive with every prompt of a small alphabet, are
admitted with their prefix hits under every token budget, decode every sampled token, are
preempted, finish, are aborted, or finish with their blocks freed later (alone or two lists in one
call); the connector evicts each cached block; the prefix cache is reset; bad inputs are freeing an
unknown request, a zero-token allocation, an unknown block id and a deferred list freed twice.
The generator model (:class:`Gen`) is the scheduler's side: each live request's tokens, computed
tokens and status, the deferred lists and the last freed one; the snapshot plus it is the state.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from impl.vllm.block_pool import KVCacheBlock as ImplBlock
from impl.vllm.kv_cache_manager import KVCacheManager as ImplManager
from proofs.explorer.search import Edge, Model, check_ranges, rejected, with_take_events
from proofs.explorer.set_clone import clone
from spec import invariants as inv
from spec.vllm.block_pool import KVCacheBlock as SpecBlock
from spec.vllm.kv_cache_manager import KVCacheManager, Request
from stateful_tests import vllm_prefix_cache as checker
from stateful_tests.lockstep import Check, Outcome
from stateful_tests.vllm_prefix_harness import Config, PrefixCacheHarness, read


@dataclass(frozen=True)
class PrefixCacheBounds:
    """The small scope: a pool of ``blocks`` blocks (the null block included) of ``block_size``
    tokens, ``max_model_len`` tokens per request, at most ``requests`` requests over the whole run
    with prompts of 1..``prompt_tokens`` tokens from ``0..vocab-1``, sampled tokens from
    ``0..gen_vocab-1``; token budgets 1 and unlimited (and 0, adopting hits only); admissions with
    ``full_sequence_must_fit`` and with one reserved block. ``caching``: the manager's
    ``enable_caching``; ``lookahead``: schedule steps also reserve that many lookahead (speculative)
    slots (0: none); ``eagle``: ``use_eagle``; ``watermark``: a watermark of one block;
    ``events``: ``enable_kv_cache_events`` and ``take_events`` (at most ``search.MAX_EVENTS`` rows
    pending: beyond that only read-only calls and ``take_events`` are offered); ``external``:
    admissions also take that many connector-loaded (external) tokens after the prefix hits
    (0: none; the harness clamps them to the prompt's uncomputed tokens less one); ``window``:
    a second KV cache group, a sliding window of that many tokens (0.34's hybrid coordinator;
    0: one full-attention group); ``chunk``: a further group after that, chunked local attention
    in chunks of that many tokens (0: none; not with EAGLE); ``mamba``: a Mamba group after
    those (0.34's "align" mode) and the scheduler's step boundary (``new_step_starts``; not
    with external tokens, which 0.34 then overdraws)."""

    variant: str = "unhashed_first"
    blocks: int = 3
    block_size: int = 1
    max_model_len: int = 3
    requests: int = 2
    prompt_tokens: int = 1
    vocab: int = 2
    gen_vocab: int = 1
    bad_inputs: bool = True
    caching: bool = True
    lookahead: int = 0
    eagle: bool = False
    watermark: bool = False
    events: bool = False
    external: int = 0
    window: int = 0
    chunk: int = 0
    mamba: bool = False

    # The default scope is a small product: caching off and lookahead slots at the length cap (one
    # variant each: the option, not the variant, is what they add), then the base for every
    # variant; small configurations first, so a deadline-bound run reaches each. ``variant`` pins
    # a configuration to one variant when several are explored.
    SCOPES: ClassVar[dict[str, tuple[tuple[str, dict[str, Any]], ...]]] = {
        "default": (
            ("caching-off", {"caching": False, "variant": "unhashed_first"}),
            (
                "lookahead",
                {
                    "lookahead": 1,
                    "blocks": 4,
                    "max_model_len": 3,
                    "requests": 1,
                    "variant": "unhashed_first",
                },
            ),
            # EAGLE's dropped last hit block, and an admission watermark of one block
            # (one token value: every prompt is a prefix hit of an earlier one)
            (
                "eagle-watermark",
                {"eagle": True, "watermark": True, "vocab": 1, "variant": "unhashed_first"},
            ),
            # the pool's KV cache events and take_events (one request: events multiply the states)
            ("events", {"events": True, "requests": 1, "variant": "unhashed_first"}),
            # connector-loaded tokens at admission (two-token prompts: the last one is computed
            # locally, so one external token is the most a prompt can take)
            (
                "external",
                {
                    "external": 1,
                    "prompt_tokens": 2,
                    "max_model_len": 3,
                    "requests": 1,
                    "blocks": 4,
                    "variant": "unhashed_first",
                },
            ),
            # 0.34's hybrid coordinator: full attention and a two-token sliding window, one
            # request (808 states; five blocks and a one-token prompt: 38,955 states, 22 s)
            (
                "window",
                {
                    "window": 2,
                    "blocks": 4,
                    "max_model_len": 3,
                    "prompt_tokens": 2,
                    "vocab": 1,
                    "requests": 1,
                    "variant": "r0.34",
                },
            ),
            # a chunked-local group after full attention, in chunks of two tokens (808 states)
            # and of one (3,274: the one-token chunks free every block behind the next token)
            (
                "chunk",
                {
                    "chunk": 2,
                    "blocks": 4,
                    "max_model_len": 3,
                    "prompt_tokens": 2,
                    "vocab": 1,
                    "requests": 1,
                    "variant": "r0.34",
                },
            ),
            (
                "chunk-one-token",
                {
                    "chunk": 1,
                    "blocks": 4,
                    "max_model_len": 3,
                    "prompt_tokens": 2,
                    "vocab": 1,
                    "requests": 1,
                    "variant": "r0.34",
                },
            ),
            # a Mamba group: one state block per step (2,843 states; two requests, which reach
            # a hit cached in the same step: 142,797 states, 143 s)
            (
                "mamba",
                {
                    "mamba": True,
                    "blocks": 4,
                    "max_model_len": 3,
                    "prompt_tokens": 2,
                    "vocab": 1,
                    "requests": 1,
                    "variant": "r0.34",
                },
            ),
            ("base", {}),
        ),
    }
    DIMENSIONS: ClassVar[tuple[str, ...]] = (
        "variant",
        "caching",
        "lookahead",
        "eagle",
        "watermark",
        "events",
        "external",
        "window",
        "chunk",
        "mamba",
        "block_size",
    )

    HELP: ClassVar[dict[str, str]] = {
        "caching": "enable_caching (prefix caching on)",
        "lookahead": "lookahead (speculative) slots a schedule step may also reserve",
        "eagle": "use_eagle (the last block of a prefix hit is dropped)",
        "watermark": "an admission watermark of one block (waiting requests keep it free)",
        "events": "enable_kv_cache_events and take_events (at most two event rows pending)",
        "external": "connector-loaded (external) tokens an admission may also take",
        "window": "a sliding-window KV cache group of that many tokens (0.34's hybrid manager)",
        "chunk": "a chunked-local KV cache group, chunks of that many tokens (not with EAGLE)",
        "mamba": "a Mamba KV cache group and the scheduler's step boundary (not with --external)",
        "blocks": "blocks in the pool, the null block included",
        "block_size": "tokens per block",
        "max_model_len": "tokens per request at most",
        "requests": "requests over the whole run",
        "prompt_tokens": "longest prompt",
        "vocab": "prompt token alphabet size",
        "gen_vocab": "sampled token alphabet size",
        "bad_inputs": "the rejected-input alphabet",
    }

    def validate(self) -> None:
        check_ranges(
            self,
            (
                ("blocks", 2, 8),
                ("block_size", 1, 4),
                ("max_model_len", 2, 12),
                ("requests", 1, 5),
                ("prompt_tokens", 1, 8),
                ("vocab", 1, 3),
                ("gen_vocab", 1, 3),
                ("lookahead", 0, 4),
                ("external", 0, 4),
                ("window", 0, 8),
                ("chunk", 0, 8),
            ),
        )
        if self.mamba and self.external:
            raise ValueError("--mamba with --external: 0.34 overdraws the pool (ValueError)")
        if self.chunk and self.eagle:
            raise ValueError(
                "chunked local attention does not support EAGLE (--chunk with --eagle)"
            )
        if self.prompt_tokens >= self.max_model_len:
            raise ValueError("prompt-tokens must be below max-model-len")


class Req(NamedTuple):
    rid: str
    tokens: tuple[int, ...]
    computed: int
    status: str  # WAITING | RUNNING | PREEMPTED


class Gen(NamedTuple):
    """The scheduler's side of a state."""

    reqs: tuple[Req, ...]
    deferred: tuple[tuple[int, ...], ...]
    freed: tuple[int, ...]  # the last deferred list freed (for a double free)
    added: int


class PrefixCacheModel(Model):
    """Scheduler events over a spec harness and a target harness."""

    # every method of the alphabet (docs/targets.md), for the report of those never reached
    operations = (
        "abort",
        "add_request",
        "allocate_slots",
        "evict_blocks",
        "finish",
        "finish_deferred",
        "free",
        "free_blocks",
        "get_computed_blocks",
        "get_num_common_prefix_blocks",
        "preempt",
        "new_step_starts",
        "reset_prefix_cache",
        "schedule",
        "take_events",
    )

    def __init__(
        self,
        component: str,
        target_cls: Callable[..., Any],
        target: str,
        bounds: PrefixCacheBounds,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(component, target_cls, target, bounds, options)
        self.checker = checker.CHECKER
        self.spec_cls = KVCacheManager
        self.reader = read
        self.snapshot_checks = checker.SNAPSHOT_CHECKS
        self.state_invariants = checker.STATE_INVARIANTS
        b = bounds
        self.config = Config(
            variant=b.variant,
            num_blocks=b.blocks,
            block_size=b.block_size,
            max_model_len=b.max_model_len,
            vocab=b.vocab,
            max_requests=b.requests,
            enable_kv_cache_events=b.events,
            enable_caching=b.caching,
            use_eagle=b.eagle,
            # int(watermark * num_blocks) blocks are kept: 1.5 / blocks gives exactly one
            watermark=1.5 / b.blocks if b.watermark else 0.0,
            sliding_window=b.window,
            attention_groups=(
                *((("chunked_local", b.chunk),) if b.chunk else ()),
                *((("mamba", 0),) if b.mamba else ()),
            ),
        )
        # 0.34 removed the method: a real release has no attribute to call
        self.common_prefix = self.config.features()["common_prefix_blocks"] != "removed"
        self.prompts = [
            p
            for n in range(1, b.prompt_tokens + 1)
            for p in itertools.product(range(b.vocab), repeat=n)
        ]

    def clone(self, obj: Any) -> Any:
        return _clone_harness(obj)

    def initial(self) -> tuple[Any, Any, Any]:
        return (
            PrefixCacheHarness(self.spec_cls, self.config),
            PrefixCacheHarness(self.target_cls, self.config),
            Gen((), (), (), 0),
        )

    def validate_first(self, method: str, exc: BaseException) -> bool:
        return True

    def trace_config(self) -> dict[str, Any]:
        return self.config.to_json()

    def key(self, snap: Any, gen: Any, spec: Any, target: Any) -> Hashable:
        return (snap, gen)

    def pair_key(self, snap: Any, spec: Any, target: Any) -> Hashable:
        """The manager's snapshot and the harness's requests (they are part of the objects)."""
        return (snap, *(_request_key(r) for r in (spec.requests.values() if spec else ())))

    # ------------------------------------------------------------ the generator model
    def _scheduled(
        self, gen: Gen, req: Req, budget: int, token: int, external: int = 0
    ) -> Callable[[Gen, Any], Gen]:
        bs, top = self.b.block_size, self.b.max_model_len

        # the engine passes the state's generator model, which is ``gen``: edges are built per
        # state here, never shared
        def then(_state_gen: Gen, returned: Any) -> Gen:
            if returned is None:
                return gen
            found = returned["hits"]
            if found and isinstance(found[0], list):  # one list per group: full attention's
                found = found[0]
            hit = len(found) * bs
            todo = len(req.tokens) - req.computed - hit
            loaded = max(0, min(external, todo - 1))  # the harness's clamp
            computed = req.computed + hit + loaded + max(0, min(budget, todo - loaded))
            tokens = req.tokens
            if computed == len(tokens) < top:
                tokens = (*tokens, token)
            return _with(gen, req._replace(tokens=tokens, computed=computed, status="RUNNING"))

        return then

    def edges(self, snap: Any, gen: Any, spec: Callable[[], Any]) -> list[Edge]:
        b, g = self.b, gen
        out: list[Edge] = []
        add = out.append
        for r in g.reqs:
            add(Edge("get_computed_blocks", (r.rid,), readonly=True))
        if g.added < b.requests:
            rid = f"r{g.added}"
            for p in self.prompts:
                add(
                    Edge("add_request", (rid, list(p)), _then(_added, g, Req(rid, p, 0, "WAITING")))
                )
        for r in g.reqs:
            work = r.computed < len(r.tokens)
            waiting = r.status != "RUNNING"
            budgets = (1, 64, 0) if waiting else ((1, 64) if work else ())
            for budget in budgets:
                for token in range(b.gen_vocab if budget else 1):
                    then = self._scheduled(g, r, budget, token)
                    add(Edge("schedule", (r.rid, budget, token), then))
                    if b.lookahead and budget:
                        add(Edge("schedule", (r.rid, budget, token, b.lookahead), then))
            if waiting and b.external:  # connector-loaded tokens after the hits
                for budget in (1, 64):
                    then = self._scheduled(g, r, budget, 0, b.external)
                    add(Edge("schedule", (r.rid, budget, 0, 0, b.external), then))
            if waiting:  # a first chunk whose whole sequence must fit; one block kept back
                add(Edge("schedule", (r.rid, 1, 0, 0, 0, True, 0), self._scheduled(g, r, 1, 0)))
                add(Edge("schedule", (r.rid, 64, 0, 0, 0, False, 1), self._scheduled(g, r, 64, 0)))
            if r.status == "RUNNING":
                if self.common_prefix:
                    add(Edge("get_num_common_prefix_blocks", (r.rid,), readonly=True))
                preempted = r._replace(computed=0, status="PREEMPTED")
                add(Edge("preempt", (r.rid,), _then(_with, g, preempted)))
                add(Edge("finish", (r.rid,), _then(_without, g, r)))
                add(Edge("finish_deferred", (r.rid,), _then(_deferred, g, r)))
            else:
                add(Edge("abort", (r.rid,), _then(_without, g, r)))
        for i, table in enumerate(g.deferred):
            add(Edge("free_blocks", (list(table[::-1]),), _then(_freed, g, (i,))))
            for j in range(i + 1, len(g.deferred)):
                both = [*table[::-1], *g.deferred[j][::-1]]
                add(Edge("free_blocks", (both,), _then(_freed, g, (i, j))))
        for block, h in enumerate(snap.block_hashes):
            if h is not None:
                add(Edge("evict_blocks", ([block],)))
        add(Edge("reset_prefix_cache", ()))
        if b.mamba:
            add(Edge("new_step_starts", ()))
        if b.bad_inputs:
            add(Edge("free", ("unknown",), readonly=True))
            for r in g.reqs[:1]:
                add(rejected("allocate_slots", (r.rid, 0)))
            add(rejected("evict_blocks", ([b.blocks],)))
            stale = [x for x in g.freed if snap.ref_cnts[x] == 0 and x]  # not the null block
            if stale:
                add(rejected("free_blocks", (stale[::-1],)))
        return with_take_events(out, snap.events)

    def edge_checks(
        self, edge: Edge, before: Any, snap: Any, spec_out: Outcome, target: Any, gen: Any
    ) -> Check | None:
        if edge.method in ("schedule", "allocate_slots") and spec_out.raised is None:
            returned = spec_out.returned
            if returned is None:
                problem = inv.gpu_refusal_changes_nothing(before, snap)
                return None if problem is None else ("atomic_failure", problem)
            new = returned["new"] if isinstance(returned, dict) else returned
            problem = inv.gpu_no_live_eviction(before, snap, inv.flat_ids(new or []))
            if problem:
                return "no_live_eviction", problem
        return None

    def state_checks(self, snap: Any, gen: Any, spec: Any, target: Any) -> Check | None:
        deferred = [list(t) for t in gen.deferred]
        problem = inv.gpu_ref_counts_match_holders(snap, deferred)
        if problem:
            return "referenced_count_matches_live_pages", problem
        problem = inv.block_hashes_match_content(snap, checker.prefixes(spec))
        if problem:
            return "block_hashes_match_content", problem
        held = any(ids for _, tables, _ in inv.group_tables(snap) for _, ids in tables)
        if not snap.req_to_blocks and not deferred and not held:
            problem = inv.gpu_no_leak_at_quiescence(snap)
            if problem:
                return "no_leak_at_quiescence", problem
        return None


def _then(step: Callable[..., Gen], gen: Gen, arg: Any) -> Callable[[Gen, Any], Gen]:
    """An edge's ``then(state's gen, returned)``: ``step(gen, arg)``, or ``step(gen, arg,
    returned)`` for one that reads the call's result (``_deferred``). Edges are built per state,
    so the state's generator model is ``gen``."""
    if step is _deferred:
        return lambda _state_gen, returned: _deferred(gen, arg, returned)
    return lambda _state_gen, returned: step(gen, arg)


def _request_key(r: Any) -> tuple[Any, ...]:
    return (r.request_id, tuple(r.all_token_ids), r.num_computed_tokens, r.status.name)


def _with(gen: Gen, req: Req) -> Gen:
    return gen._replace(reqs=tuple(req if r.rid == req.rid else r for r in gen.reqs))


def _without(gen: Gen, req: Req) -> Gen:
    return gen._replace(reqs=tuple(r for r in gen.reqs if r.rid != req.rid))


def _added(gen: Gen, req: Req) -> Gen:
    return gen._replace(reqs=(*gen.reqs, req), added=gen.added + 1)


def _deferred(gen: Gen, req: Req, ids: Any) -> Gen:
    gen = _without(gen, req)
    return gen._replace(deferred=(*gen.deferred, tuple(ids))) if ids else gen


def _freed(gen: Gen, which: tuple[int, ...]) -> Gen:
    last = gen.deferred[which[-1]]
    kept = tuple(t for i, t in enumerate(gen.deferred) if i not in which)
    return gen._replace(deferred=kept, freed=last)


# ----------------------------------------------------------------------------- fast exact clones
_MANAGERS = (KVCacheManager, ImplManager)


def _clone_harness(h: Any) -> Any:
    """An exact clone of a harness around kvspec's own managers (spec or impl): every block
    copied once, every structure rebuilt over the copies (free-queue links remapped); any other
    shape (an upstream manager) by the generic :func:`clone`."""
    m = h.m if type(h) is PrefixCacheHarness else None
    if m is None or type(m) not in _MANAGERS:
        return clone(h, _shared_config(m))
    new = object.__new__
    pool = m.block_pool
    queue = pool.free_block_queue
    kind = type(pool.blocks[0])
    every = list(pool.blocks)
    if kind is ImplBlock:
        every += [queue.fake_free_list_head, queue.fake_free_list_tail]
    elif kind is not SpecBlock:
        return clone(h)
    bmap: dict[int, Any] = {}
    for b in every:
        c = bmap[id(b)] = new(kind)
        c.block_id, c.ref_cnt, c._block_hash, c.is_null = (
            b.block_id,
            b.ref_cnt,
            b._block_hash,
            b.is_null,
        )
    if kind is ImplBlock:
        for b in every:
            c, prev, nxt = bmap[id(b)], b.prev_free_block, b.next_free_block
            c.prev_free_block = None if prev is None else bmap[id(prev)]
            c.next_free_block = None if nxt is None else bmap[id(nxt)]
    n_pool = new(type(pool))
    state = pool.__dict__.copy()
    state["blocks"] = [bmap[id(b)] for b in pool.blocks]
    state["null_block"] = bmap[id(pool.null_block)]
    state["kv_event_queue"] = pool.kv_event_queue.copy()  # events are immutable
    n_queue = new(type(queue))
    n_queue.__dict__.update(queue.__dict__)
    if kind is ImplBlock:
        n_queue.fake_free_list_head = bmap[id(queue.fake_free_list_head)]
        n_queue.fake_free_list_tail = bmap[id(queue.fake_free_list_tail)]
    else:
        n_queue.blocks = [bmap[id(b)] for b in queue.blocks]
    state["free_block_queue"] = n_queue
    table = pool.cached_block_hash_to_block
    n_table = new(type(table))
    n_table._cache = {
        k: ({i: bmap[id(b)] for i, b in v.items()} if type(v) is dict else bmap[id(v)])
        for k, v in table._cache.items()
    }
    state["cached_block_hash_to_block"] = n_table
    n_pool.__dict__.update(state)
    singles = []
    for single in m.coordinator.single_type_managers:  # every KV cache group's manager
        n_single = new(type(single))
        n_single.__dict__.update(single.__dict__)
        n_single.block_pool = n_pool
        n_single.req_to_blocks = {
            r: [bmap[id(b)] for b in bl] for r, bl in single.req_to_blocks.items()
        }
        for name in _containers(single):
            setattr(n_single, name, getattr(single, name).copy())
        if "null_block" in single.__dict__:  # the impl's window manager keeps its own reference
            n_single.null_block = bmap[id(single.null_block)]
        singles.append(n_single)
    n_m = new(type(m))
    n_m.__dict__.update(m.__dict__)
    n_m.block_pool = n_pool
    n_m.coordinator = type(m.coordinator)(n_pool, tuple(singles))
    if "_single" in m.__dict__:
        n_m._single = singles[0]
    if m.__dict__.get("_locals"):  # the impl's further groups
        n_m._locals = tuple(singles[1:])
    n_h = new(PrefixCacheHarness)
    n_h.__dict__.update(h.__dict__)
    n_h.m = n_m
    n_h.requests = {rid: _clone_request(r) for rid, r in h.requests.items()}
    return n_h


_CONTAINERS: dict[type, tuple[str, ...]] = {}


def _containers(manager: Any) -> tuple[str, ...]:
    """A manager class's own containers besides ``req_to_blocks`` (found once per class: its
    ``__init__`` makes them all): ``num_cached_block``, a Mamba group's bookkeeping. They hold
    ids, counts and hashes, never blocks (tests/test_vllm_hybrid_groups.py checks every group
    kind), so a shallow copy is a clone."""
    names = _CONTAINERS.get(type(manager))
    if names is None:
        names = _CONTAINERS[type(manager)] = tuple(
            name
            for name, value in manager.__dict__.items()
            if name != "req_to_blocks" and type(value) in (dict, set)
        )
    return names


def _shared_config(m: Any) -> dict[int, Any]:
    """A clone memo that shares an upstream manager's KV-cache configuration (immutable; its
    specs hold torch dtypes, which cannot be copied field by field)."""
    memo: dict[int, Any] = {}
    config = getattr(m, "kv_cache_config", None)
    if config is not None:
        memo[id(config)] = config
        for group in getattr(config, "kv_cache_groups", ()):
            memo[id(group)] = group
            memo[id(group.kv_cache_spec)] = group.kv_cache_spec
    return memo


def _clone_request(r: Any) -> Any:
    if type(r) is not Request:
        return clone(r)
    c = object.__new__(Request)
    state = r.__dict__.copy()
    for k in ("prompt_token_ids", "all_token_ids", "block_hashes", "mm_features"):
        state[k] = state[k].copy()
    c.__dict__.update(state)
    return c
