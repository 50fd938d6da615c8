"""Lockstep checking of vLLM GPU prefix caches (``KVCacheManager`` + ``BlockPool``, one
full-attention group): the driver that plays vLLM's scheduler, its draws and its checker record.

Two :class:`~stateful_tests.vllm_prefix_harness.PrefixCacheHarness` (spec, target) get the same
calls; after each, the return values (block ids, hit lengths, ``None``), the exception kinds and the
snapshots (ref counts, hashes, the free queue head to tail and its counter, the hash map with its
duplicates, every request's blocks and cached count, pending events, usage) must be equal, and on
the target's own state: ``free_and_used_partition_pool``, ``free_counter_matches_queue``,
``prefix_index_consistent``, ``null_block_reserved``, ``cached_blocks_are_a_prefix``; against the
driver's ledger: ``referenced_count_matches_live_pages`` (requests' lists plus blocks popped for a
deferred free), ``block_hashes_match_content``, ``no_leak_at_quiescence``; per call:
``no_live_eviction`` (new blocks were free), ``atomic_failure`` (a failed allocation or a
rejected call changed nothing) and ``identical_eviction_order`` (the free queue order).

The driver is vLLM's scheduler in small (docs/vllm.md §5.3): requests arrive (prompts over a
2–3 token vocabulary, often extending an earlier prompt, lengths around block boundaries), are
admitted with their prefix hits (chunked prefill under a token budget, lookahead slots, external
connector tokens, ``full_sequence_must_fit``, ``reserved_blocks``, the watermark), decode, are
preempted, finish or are aborted, or finish with their blocks still read by a connector and freed
later (batched: a block shared by two of them is then freed twice in one call, #42571); the
connector evicts cached blocks; the prefix cache is reset. Bad inputs: freeing a request twice or
one never seen (no-ops), freeing deferred blocks twice, zero-token allocations, prefix hits for a
request that holds blocks or with a wrong token count, allocations past ``max_model_len``, unknown
block ids to evict.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields, replace
from functools import cache
from typing import Any, NamedTuple

from spec import invariants as inv
from spec.errors import InvalidArgument
from spec.vllm.kv_cache_manager import VARIANTS, KVCacheManager, PrefixCacheSnapshot, RequestStatus
from stateful_tests.checker import SPEC, CheckerDef, Example, Operation, Options, Reference
from stateful_tests.lockstep import Chooser, Divergence, Lockstep, Step, Verdicts
from stateful_tests.vllm_prefix_harness import Config, PrefixCacheHarness, read

SNAPSHOT_CHECKS = {
    "free_queue": "identical_eviction_order",
    "num_free_blocks": "free_counter_matches_queue",
    "cached": "prefix_index_consistent",
}
STATE_INVARIANTS: dict[str, Callable[[PrefixCacheSnapshot], str | None]] = {
    "free_and_used_partition_pool": inv.gpu_free_queue_partition,
    "free_counter_matches_queue": inv.free_counter_matches_queue,
    "prefix_index_consistent": inv.gpu_prefix_index_consistent,
    "null_block_reserved": inv.null_block_reserved,
    "cached_blocks_are_a_prefix": inv.cached_blocks_are_a_prefix,
}
LEDGER_INVARIANTS = (
    "referenced_count_matches_live_pages",
    "block_hashes_match_content",
    "no_leak_at_quiescence",
)
_ALLOCATING = ("schedule", "allocate_slots")
_WAITING = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


@cache
def _verdicts() -> Verdicts:
    return Verdicts()


def draw_config(c: Chooser, variant: str | None) -> Config:
    """Small pools (3–8 blocks) that fill up, blocks of 1–3 tokens, a 2–3 token vocabulary (equal
    blocks, duplicate cache entries), models a few blocks long; on 0.34, a sliding-window group
    in four runs of seven."""
    block_size = c.pick((1, 2, 2, 3))
    config = Config(
        variant=variant if variant is not None else c.pick(VARIANTS),
        num_blocks=c.pick((3, 4, 5, 6, 8, 4, 5)),
        block_size=block_size,
        max_model_len=block_size * c.int(2, 5) + c.int(0, 1),
        vocab=c.pick((2, 2, 3)),
        max_requests=c.int(2, 4),
        enable_caching=not c.chance(0.1),
        use_eagle=c.chance(0.15),
        enable_kv_cache_events=c.chance(0.7),
        watermark=0.2 if c.chance(0.15) else 0.0,
    )
    if config.variant != "r0.34":  # drawn last: the other variants' draws stay as they were
        return config
    # 0.34's hybrid coordinator: five runs in eight add a sliding-window group (windows of one
    # token, which caches nothing, up to two blocks and a token: a hit that keeps a block
    # after external tokens moved the window)
    window = c.pick((0, 0, 0, 1, 2, 3, 4, 5))
    if window >= 4:
        window = (window - 3) * block_size + 1
    config = replace(config, sliding_window=window)
    # then, in five runs of nine, one more group: chunked local attention (not with EAGLE),
    # after a window a wider second window (three groups: the fixed-point hit), or Mamba
    more = c.pick((0, 0, 0, 0, 1, 1, 2, 3, 3))
    if more == 3:
        return replace(config, attention_groups=(("mamba", 0),))
    if more == 1 and not config.use_eagle:
        return replace(config, attention_groups=(("chunked_local", c.int(1, 2 * block_size)),))
    if more == 2 and config.sliding_window:
        wider = config.sliding_window + c.int(1, block_size)
        return replace(config, attention_groups=(("sliding_window", wider),))
    return config


def prefixes(h: PrefixCacheHarness, rids: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Request id -> the labels of its block hashes (the content each cached block must have), for
    ``rids`` (default: every request of the harness)."""
    reqs = h.requests
    chosen = reqs if rids is None else [rid for rid in rids if rid in reqs]
    return {rid: [h.label(x) for x in reqs[rid].block_hashes] for rid in chosen}


class Driver:
    """The scheduler over a spec harness and a target harness, with the ledger of deferred frees."""

    def __init__(
        self, target_cls: Callable[..., Any], config: Config, reference: Reference = SPEC
    ) -> None:
        """``reference``: what the target is compared with (the spec unless it says otherwise)."""
        self.config = config
        self.spec_h = PrefixCacheHarness(reference.cls_for(KVCacheManager, target_cls), config)
        self.target_h = PrefixCacheHarness(target_cls, config)
        self.ls = Lockstep(
            self.spec_h,
            self.target_h,
            read,
            state_invariants=STATE_INVARIANTS,
            validate_first=lambda method, exc: True,  # every raising call changes nothing
            snapshot_checks=SNAPSHOT_CHECKS,
            verdicts=_verdicts(),
            role=reference.role,
        )
        self.features = config.features()
        self.mamba = any(kind == "mamba" for kind, _ in config.attention_groups)
        self.deferred: list[list[int]] = []  # popped, not yet freed (allocation order)
        self.freed: list[list[int]] = []  # deferred lists already freed (for double frees)
        self.prompts: list[list[int]] = []
        self.next_id = 0
        self.coverage: Counter[str] = Counter()

    # ------------------------------------------------------------ plumbing
    @property
    def steps(self) -> list[Step]:
        return self.ls.steps

    def call(self, method: str, *args: Any) -> Any:
        """Lockstep call, then the per-call and ledger invariants; the spec's outcome."""
        before = self.ls.after
        try:
            out = self.ls.call(method, *args)
        except Divergence as exc:
            raise self._explain(exc, method, before) from None
        after = self.ls.after
        self._track(method, args, out)
        problem = self._call_checks(method, before, after, out.returned, out.raised)
        if problem is None:
            problem = self._ledger_checks(self.ls.target_after, self.target_h)
        if problem is not None:
            raise self.ls.fail(*problem)
        self._paths(method, args, before, after, out)
        return out

    def _call_checks(
        self, method: str, before: Any, after: Any, returned: Any, raised: Any
    ) -> tuple[str, str] | None:
        if method in _ALLOCATING and raised is None:
            if returned is None:
                problem = inv.gpu_refusal_changes_nothing(before, after)
                return None if problem is None else ("atomic_failure", f"{method}: {problem}")
            new = returned["new"] if isinstance(returned, dict) else returned
            problem = inv.gpu_no_live_eviction(before, after, inv.flat_ids(new or []))
            if problem:
                return "no_live_eviction", problem
        return None

    def _ledger_checks(self, snap: Any, h: PrefixCacheHarness) -> tuple[str, str] | None:
        problem = inv.gpu_ref_counts_match_holders(snap, self.deferred)
        if problem:
            return "referenced_count_matches_live_pages", problem
        holding = {rid for _, tables, _ in inv.group_tables(snap) for rid, ids in tables if ids}
        problem = inv.block_hashes_match_content(snap, prefixes(self.spec_h, holding))
        if problem:
            return "block_hashes_match_content", problem
        if not holding and not self.deferred and not snap.req_to_blocks:
            problem = inv.gpu_no_leak_at_quiescence(snap)
            if problem:
                return "no_leak_at_quiescence", problem
            self.coverage["path:quiescent"] += 1
        return None

    def check_invariant(self, name: str) -> None:
        """One named invariant on the target's state now (the machine's ``@invariant``s)."""
        snap = read(self.target_h)
        if name in STATE_INVARIANTS:
            problem = STATE_INVARIANTS[name](snap)
            if problem:
                raise self.ls.fail(name, problem)
            return
        found = self._ledger_checks(snap, self.target_h)
        if found is not None and found[0] == name:
            raise self.ls.fail(*found)

    def replay_step(self, step: dict[str, Any]) -> None:
        self.call(step["method"], *step["args"])

    def _explain(self, exc: Divergence, method: str, before: Any) -> Divergence:
        """Name a divergence after the first invariant the target breaks on its own state."""
        if exc.check not in ("snapshot", "return_value", "exception", *SNAPSHOT_CHECKS.values()):
            return exc
        step = exc.steps[-1] if exc.steps else None
        if exc.check == "exception" and (step is None or step.spec.raised is None):
            return exc  # the target crashed: that is the finding, not the state it left
        try:
            snap = read(self.target_h)
        except Exception:  # a target that no longer reads
            return exc
        checks: list[tuple[str, str | None]] = []
        if step is not None and step.spec.raised is not None:
            checks.append(("atomic_failure", inv.atomic_failure(before, snap)))
        failed = step is not None and step.spec.returned is None and step.target.returned is None
        if failed and method in _ALLOCATING and step is not None and step.spec.raised is None:
            checks.append(("atomic_failure", inv.atomic_failure(before, snap)))
        checks += [(name, p(snap)) for name, p in STATE_INVARIANTS.items()]
        if step is not None and step.spec.raised is None:
            self._track(method, step.args, step.spec)  # the ledger as the spec's call left it
        ledger = self._ledger_checks(snap, self.target_h)
        if ledger is not None:
            checks.append(ledger)
        for name, problem in checks:
            if problem:
                return Divergence(name, f"{problem} [{exc.check}: {exc.detail}]", exc.steps)
        return exc

    def _track(self, method: str, args: Sequence[Any], out: Any) -> None:
        """Keep the deferred-free ledger and the prompt list in step with a (replayed) call."""
        if out.raised is not None:
            return
        if method == "finish_deferred" and out.returned:
            self.deferred.append(list(out.returned))
        elif method == "free_blocks":  # the freed ids are deferred lists, each reversed
            ids, at = list(args[0]), 0
            while at < len(ids):
                fits = [t for t in self.deferred if ids[at : at + len(t)] == t[::-1]]
                if not fits:
                    break
                table = max(fits, key=len)
                self.deferred.remove(table)
                self.freed.append(table)
                at += len(table)
        elif method == "add_request":
            self.prompts.append(list(args[1]))
            self.next_id += 1

    # ------------------------------------------------------------ coverage
    def _paths(self, method: str, args: Sequence[Any], before: Any, after: Any, out: Any) -> None:
        cov = self.coverage
        cov[f"call:{method}"] += 1
        if out.raised is not None:
            cov[f"raise:{method}:{type(out.raised).__name__}"] += 1
            return
        r = out.returned
        if method in _ALLOCATING and r is None:
            cov["path:allocation_refused"] += 1
        if method == "schedule" and r is not None:
            if r["hits"]:
                cov["path:prefix_hit"] += 1
                if any(b in before.free_queue for b in r["hits"]):
                    cov["path:hit_on_free_block"] += 1
            if args[1] == 0:
                cov["path:adopted_hits_only"] += 1
            if len(args) > 3 and args[3]:  # lookahead slots: past the cap they are clamped
                req = self.spec_h.requests.get(args[0])
                if req and req.num_tokens + args[3] > self.config.max_model_len:
                    cov["path:lookahead_clamped"] += 1
        if any(len(ids) > 1 for _, ids in after.cached):
            cov["path:duplicate_cache_entries"] += 1
        if len(after.cached) < len(before.cached) and method in _ALLOCATING:
            cov["path:evicted_cached_block"] += 1
        if method in ("preempt", "finish", "abort", "free_blocks"):
            head = after.free_queue[:1]
            if head and after.block_hashes[head[0]] is None and head != before.free_queue[:1]:
                cov["path:unhashed_freed_to_head"] += 1
        if method == "free_blocks" and len(set(args[0])) < len(args[0]):
            cov["path:block_freed_twice_in_one_call"] += 1
        if method == "reset_prefix_cache":
            cov["path:reset_done" if r else "path:reset_refused"] += 1
        if method == "get_num_common_prefix_blocks" and r and r[0]:
            cov["path:common_prefix"] += 1
        if not after.free_queue:
            cov["path:pool_full"] += 1

    # ------------------------------------------------------------ views of the spec's requests
    def _requests(self, *states: RequestStatus) -> list[str]:
        return [rid for rid, r in self.spec_h.requests.items() if r.status in states]

    def waiting(self) -> list[str]:
        return [r for r in self._requests(*_WAITING) if self._fits(r)]

    def _fits(self, rid: str) -> bool:
        return bool(self.spec_h.requests[rid].num_tokens <= self.config.max_model_len)

    def running(self) -> list[str]:
        """Running requests with something left to compute."""
        reqs = self.spec_h.requests
        return [
            rid
            for rid in self._requests(RequestStatus.RUNNING)
            if reqs[rid].num_computed_tokens < reqs[rid].num_tokens
        ]

    def holders(self) -> list[str]:
        return self._requests(RequestStatus.RUNNING)

    def live(self) -> list[str]:
        return self._requests(RequestStatus.RUNNING, *_WAITING)

    def finished(self) -> list[str]:
        return self._requests(RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_ABORTED)

    # ------------------------------------------------------------ draws
    def draw_prompt(self, c: Chooser) -> list[int]:
        """Lengths around block boundaries; often an earlier prompt's first blocks extended."""
        bs, top = self.config.block_size, self.config.max_model_len - 1
        length = min(top, max(1, c.pick((bs - 1, bs, bs + 1, 2 * bs, 2 * bs + 1, 3 * bs, 1))))
        prompt: list[int] = []
        if self.prompts and c.chance(0.6):
            base = c.pick(self.prompts)
            prompt = base[: c.pick((len(base), bs, 2 * bs, len(base) - 1, bs + 1))]
        while len(prompt) < length:
            prompt.append(c.int(0, self.config.vocab - 1))
        return prompt[:top]

    def draw_lookahead(self, c: Chooser, rid: str) -> int:
        """Lookahead (speculative) slots, mostly none; some within a block, some that take the
        request to ``max_model_len`` or one past it, where the needed slots are clamped."""
        bs = self.config.block_size
        room: int = self.config.max_model_len - self.spec_h.requests[rid].num_tokens
        if 0 <= room <= 2 * bs and c.chance(0.3):  # near the cap: at it or one past it
            return max(1, room + c.int(0, 1))
        return c.int(1, bs) if c.chance(0.15) else 0

    def draw_budget(self, c: Chooser) -> int:
        bs = self.config.block_size
        return c.pick((1, bs, bs + 1, 2 * bs, 64, 64, 64))

    def _token(self, c: Chooser) -> int:
        return c.int(0, self.config.vocab - 1)

    # ------------------------------------------------------------ operations (simple first)
    def take_events(self, c: Chooser) -> None:
        self.call("take_events")

    def get_computed_blocks(self, c: Chooser) -> None:
        rid = c.pick(self.live())
        if self.features["hit_length_cap"] and c.chance(0.3):
            self.call("get_computed_blocks", rid, c.int(0, self.config.max_model_len))
        else:
            self.call("get_computed_blocks", rid)

    def get_num_common_prefix_blocks(self, c: Chooser) -> None:
        self.call("get_num_common_prefix_blocks", c.pick(self.holders()))

    def add_request(self, c: Chooser) -> None:
        prompt = self.draw_prompt(c)
        self.call("add_request", f"r{self.next_id}", prompt)

    def schedule_waiting(self, c: Chooser) -> None:
        """Admit a waiting or preempted request with its prefix hits (a chunk of its prefill)."""
        rid = c.pick(self.waiting())
        budget = self.draw_budget(c)
        if self.features["adopt_computed_tokens"] and c.chance(0.1):
            budget = 0  # adopt the hits only (0.31+)
        extra: list[Any] = [
            c.int(1, self.config.block_size) if c.chance(0.15) else 0,  # lookahead
            # external (none with a Mamba group: 0.34 then takes more blocks than it counted,
            # ValueError after a partial change; docs/vllm-hybrid-groups.md §2.2)
            c.int(1, self.config.block_size + 1) if c.chance(0.15) and not self.mamba else 0,
            c.chance(0.2),  # full_sequence_must_fit
            c.int(1, 2) if c.chance(0.15) else 0,  # reserved
        ]
        if self.features["hit_length_cap"] and c.chance(0.1):
            extra.append(c.int(0, self.config.max_model_len))
        self.call("schedule", rid, budget, self._token(c), *extra)

    def schedule_running(self, c: Chooser) -> None:
        """The next chunk or decode token of a running request; when the pool is full, preempt
        the last running request (vLLM's FCFS policy) and try once more."""
        rid = c.pick(self.running())
        lookahead = self.draw_lookahead(c, rid)
        budget, token = self.draw_budget(c), self._token(c)
        out = self.call("schedule", rid, budget, token, lookahead)
        if out.returned is None and out.raised is None and c.chance(0.7):
            victim = self.holders()[-1]
            self.call("preempt", victim)
            if victim != rid:
                self.call("schedule", rid, budget, token, lookahead)

    def preempt(self, c: Chooser) -> None:
        self.call("preempt", c.pick(self.holders()))

    def finish(self, c: Chooser) -> None:
        reqs = self.spec_h.requests
        done = [r for r in self.holders() if reqs[r].num_computed_tokens >= reqs[r].num_tokens]
        self.call("finish", c.pick(done or self.holders()))

    def abort(self, c: Chooser) -> None:
        self.call("abort", c.pick(self.live()))

    def finish_deferred(self, c: Chooser) -> None:
        self.call("finish_deferred", c.pick(self.holders()))

    def free_deferred(self, c: Chooser) -> None:
        """The connector is done reading: free one deferred list (reversed), or two in one call."""
        pairs = [(a, b) for i, a in enumerate(self.deferred) for b in self.deferred[i + 1 :]]
        sharing = [p for p in pairs if set(p[0]) & set(p[1])]
        chosen: list[list[int]]
        if sharing and c.chance(0.6):  # a block shared by both is freed twice in one call
            chosen = list(c.pick(sharing))
        elif pairs and c.chance(0.3):
            chosen = list(c.pick(pairs))
        else:
            chosen = [c.pick(self.deferred)]
        ids = [b for table in chosen for b in reversed(table)]
        self.call("free_blocks", ids)

    def evict_blocks(self, c: Chooser) -> None:
        """The connector reports failed loads: cached blocks (held or free), sometimes others."""
        hashed = [b for b, h in enumerate(self.ls.after.block_hashes) if h is not None]
        ids = [c.pick(hashed) for _ in range(c.int(1, 2))] if hashed else []
        if not ids or c.chance(0.3):
            ids.append(c.int(0, self.config.num_blocks - 1))
        self.call("evict_blocks", ids)

    def reset_prefix_cache(self, c: Chooser) -> None:
        self.call("reset_prefix_cache")

    def new_step(self, c: Chooser) -> None:
        """The scheduler starts a step (``new_step_starts``; with a Mamba group only)."""
        self.call("new_step_starts")

    # ------------------------------------------------------------ bad inputs
    def bad_free_twice(self, c: Chooser) -> None:
        """``free`` of a finished request or of an id never seen: nothing changes."""
        self.call("free", c.pick([*self.finished(), "unknown"]))

    def bad_double_free(self, c: Chooser) -> None:
        """A deferred list freed a second time (some block is free now): rejected."""
        refs = self.ls.after.ref_cnts  # the null block (a Mamba list's padding) shows 0: not free
        table = c.pick([t for t in self.freed if any(refs[b] == 0 and b for b in t)])
        if c.chance(0.5):  # only the blocks that are free now
            table = [b for b in table if refs[b] == 0 and b]
        self.call("free_blocks", list(reversed(table)))

    def bad_zero_tokens(self, c: Chooser) -> None:
        self.call("allocate_slots", c.pick(self.live()), 0)

    def bad_newer_api(self, c: Chooser) -> None:
        """A call only newer releases take: adopting hits without new tokens (0.31+, else
        ``ValueError``) or a hit-length cap (0.33+, else ``TypeError``)."""
        f = self.features
        adopt_now = f["hit_length_cap"] or c.chance(0.5)
        if not f["adopt_computed_tokens"] and adopt_now and self.waiting():
            self.call("schedule", c.pick(self.waiting()), 0, self._token(c))
            return
        if not f["hit_length_cap"] and self.live():
            self.call("get_computed_blocks", c.pick(self.live()), c.int(0, 4))

    def bad_hits_for_holder(self, c: Chooser) -> None:
        """Prefix hits for a request that already holds blocks (upstream asserts)."""
        rid = c.pick(self.holders())
        hits = self.spec_h.m.get_computed_blocks(self.spec_h.requests[rid])[0].blocks[0]
        ids = [b.block_id for b in hits] or [c.int(1, self.config.num_blocks - 1)]
        self.call("allocate_slots", rid, 1, len(ids) * self.config.block_size, ids)

    def bad_hit_token_count(self, c: Chooser) -> None:
        """Prefix hits whose token count is not ``len(hits) * block_size``."""
        rid = c.pick(self.waiting())
        hits = self.spec_h.m.get_computed_blocks(self.spec_h.requests[rid])[0].blocks[0]
        ids = [b.block_id for b in hits] or [c.int(1, self.config.num_blocks - 1)]
        wrong = len(ids) * self.config.block_size + c.pick(
            (-1, 1, -len(ids) * self.config.block_size)
        )
        self.call("allocate_slots", rid, 1, wrong, ids)

    def bad_past_max_model_len(self, c: Chooser) -> None:
        """Slots past ``max_model_len`` for a running request (clamped), or a request longer than
        ``max_model_len`` (rejected), added, allocated and aborted."""
        top = self.config.max_model_len
        if self.holders() and c.chance(0.5):
            self.call("allocate_slots", c.pick(self.holders()), top + c.int(1, 3))
            return
        rid = f"r{self.next_id}"
        prompt = [self._token(c) for _ in range(top + c.int(1, 2))]
        self.call("add_request", rid, prompt)
        self.call("allocate_slots", rid, len(prompt))
        self.call("abort", rid)

    def bad_evict_unknown(self, c: Chooser) -> None:
        n = self.config.num_blocks
        self.call("evict_blocks", [c.int(0, n - 1), c.pick((n, n + 1, -1))])


class Facts(NamedTuple):
    """What the enabled-operation predicates read, computed once per step."""

    room: bool
    live: bool
    waiting: bool
    running: bool
    holders: bool
    deferred: bool
    refreeable: bool
    hashed: bool
    older_api: bool  # the variant lacks an API of a newer release
    common_prefix: bool  # the release has get_num_common_prefix_blocks (not 0.34)
    mamba: bool  # a Mamba group: the scheduler's steps are observable (new_step_starts)

    @classmethod
    def of(cls, d: Driver) -> Facts:
        s = d.ls.after
        live = d.live()
        return cls(
            len(live) < d.config.max_requests,
            bool(live),
            bool(d.waiting()),
            bool(d.running()),
            bool(d.holders()),
            bool(d.deferred),
            any(any(s.ref_cnts[b] == 0 and b for b in t) for t in d.freed),
            any(h is not None for h in s.block_hashes),
            not (d.features["adopt_computed_tokens"] and d.features["hit_length_cap"]),
            d.features["common_prefix_blocks"] != "removed",
            any(kind == "mamba" for kind, _ in d.config.attention_groups),
        )


OPERATIONS: tuple[Operation, ...] = (
    Operation("take_events", 2),
    Operation("get_computed_blocks", 2, lambda f: f.live),
    Operation("get_num_common_prefix_blocks", 1, lambda f: f.holders and f.common_prefix),
    Operation("add_request", 6, lambda f: f.room),
    Operation("schedule_waiting", 10, lambda f: f.waiting),
    Operation("schedule_running", 14, lambda f: f.running),
    Operation("preempt", 2, lambda f: f.holders),
    Operation("finish", 4, lambda f: f.holders),
    Operation("abort", 2, lambda f: f.live),
    Operation("finish_deferred", 2, lambda f: f.holders),
    Operation("free_deferred", 4, lambda f: f.deferred),
    Operation("evict_blocks", 2),
    Operation("reset_prefix_cache", 1),
    Operation("new_step", 6, lambda f: f.mamba),
    Operation("bad_free_twice", 1, bad=True),
    Operation("bad_double_free", 1, lambda f: f.refreeable, bad=True),
    Operation("bad_zero_tokens", 1, lambda f: f.live, bad=True),
    Operation("bad_newer_api", 1, lambda f: f.older_api and f.live, bad=True),
    Operation("bad_hits_for_holder", 1, lambda f: f.holders, bad=True),
    Operation("bad_hit_token_count", 1, lambda f: f.waiting, bad=True),
    Operation("bad_past_max_model_len", 1, bad=True),
    Operation("bad_evict_unknown", 1, bad=True),
)


def machine_config(c: Chooser, variant: str | None, options: Options) -> Config:
    """A drawn configuration; ``options`` fix some of its fields (the corpus entries that need
    EAGLE or given KV cache groups). Fixing either group field fixes both (the other at its
    default), and EAGLE leaves out a drawn chunked-local group (the two do not combine)."""
    config = draw_config(c, variant)
    unknown = set(options) - set(config.to_json())
    if unknown:
        raise InvalidArgument(f"unknown prefix-cache options {sorted(unknown)}")
    fixed = dict(options)
    if "sliding_window" in fixed or "attention_groups" in fixed:
        fixed.setdefault("sliding_window", 0)
        fixed.setdefault("attention_groups", ())
    elif fixed.get("use_eagle"):
        fixed["attention_groups"] = tuple(
            g for g in config.attention_groups if g[0] != "chunked_local"
        )
    return replace(config, **fixed) if fixed else config


CHECKER = CheckerDef(
    machine_name="PrefixCacheLockstep",
    driver=lambda target_cls, config, options, reference: Driver(target_cls, config, reference),
    config_type=Config,
    machine_config=machine_config,
    fuzz_config=machine_config,
    # configuration fields a run may fix (the corpus entries that need EAGLE or further groups)
    options=tuple(f.name for f in fields(Config) if f.name != "variant"),
    operations=OPERATIONS,
    facts=Facts.of,
    spec_cls=KVCacheManager,
    invariants=(*STATE_INVARIANTS, *LEDGER_INVARIANTS),
    episode_ops=200,
    # a shared block freed twice in one batched deferred free (#42571), duplicate cache entries,
    # prefix hits on free blocks
    examples=(
        Example(
            23,
            steps=200,
            config={
                "num_blocks": 6,
                "block_size": 2,
                "max_model_len": 8,
                "vocab": 2,
                "max_requests": 4,
            },
            variants=("unhashed_first",),
        ),
        # caching off, and lookahead slots at the length cap: the options the planted option
        # bugs need (issue 30), reached whatever hypothesis' generator draws
        Example(
            1,
            steps=150,
            config={
                "num_blocks": 5,
                "block_size": 2,
                "max_model_len": 6,
                "vocab": 2,
                "max_requests": 3,
                "enable_caching": False,
            },
            variants=("unhashed_first",),
        ),
        # up to 0.31: the common-prefix count with a holder that has no cached count,
        # full_sequence_must_fit refusing, an event parent after its block was evicted
        Example(
            24,
            steps=200,
            config={
                "num_blocks": 5,
                "block_size": 2,
                "max_model_len": 8,
                "vocab": 2,
                "max_requests": 3,
                "enable_kv_cache_events": True,
                "enable_caching": True,
            },
            variants=("r0.31",),
        ),
        # 0.34 with a sliding-window group (issue 26): blocks leaving the window, null-padded
        # window hits, a window run broken by a miss, whatever hypothesis' generator draws
        Example(
            10,
            steps=200,
            config={
                "num_blocks": 7,
                "block_size": 2,
                "max_model_len": 8,
                "vocab": 2,
                "max_requests": 3,
                "sliding_window": 3,
            },
            variants=("r0.34",),
        ),
        # 0.34 with a chunked-local group, and with two windows and a chunk (three further
        # groups: the coordinator's fixed-point hit)
        Example(
            11,
            steps=200,
            config={
                "num_blocks": 7,
                "block_size": 2,
                "max_model_len": 8,
                "vocab": 2,
                "max_requests": 3,
                "use_eagle": False,
                "attention_groups": (("chunked_local", 4),),
            },
            variants=("r0.34",),
        ),
        Example(
            12,
            steps=200,
            config={
                "num_blocks": 9,
                "block_size": 1,
                "max_model_len": 6,
                "vocab": 2,
                "max_requests": 3,
                "sliding_window": 2,
                "use_eagle": False,
                "attention_groups": (("sliding_window", 3), ("chunked_local", 2)),
            },
            variants=("r0.34",),
        ),
    ),
)
