"""Lockstep checking of InfiniLM block managers: the driver, the hypothesis machine, the fuzzer.

One :class:`Driver` holds the generator's model of who holds which pages (request tables, prefix
pins) and knows the operation alphabet; each operation draws its arguments from a
:class:`Chooser`, calls the spec and the target in lockstep (:class:`~stateful_tests.lockstep.Lockstep`)
and then checks the ledger invariants. The hypothesis machine draws through ``st.data()`` (depth
and shrinking), the fuzzer through a seeded ``random.Random`` (volume); both use the same code.

Draws are biased where bugs live: prompt lengths n·B−1, n·B, n·B+1; prompts that share a prefix
with earlier ones (over a two-token vocabulary, so equal blocks and duplicate-hash pages are
common); small pools that fill up; reclaim counts around the free-deque length.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from operator import attrgetter
from typing import Any, NamedTuple

from spec import invariants as inv
from spec.errors import OutOfBlocksError
from spec.infinilm.block_manager import BlockManager as SpecBlockManager
from spec.infinilm.prefix_cache import EMPTY_BLOCK_HASH, chain_hashes
from spec.infinilm.snapshot import BlockManagerSnapshot, read_block_manager
from stateful_tests.checker import SPEC, CheckerDef, Example, Operation, Options, Reference
from stateful_tests.fastpath import counts_hold, page_occurrences, state_holds
from stateful_tests.lockstep import Chooser, Lockstep, Step, Verdicts

# Operations that validate their input before changing anything: when they raise, the snapshot must
# not change. Reclamation inside allocate/append is not validation: OutOfBlocksError keeps evictions
# (reference §8.3), and free_blocks decrements entry by entry.
_VALIDATE_FIRST = {
    "allocate_slots",
    "append_slot",
    "append_slots",
    "truncate_blocks",
    "publish_computed_blocks",
    "try_free_blocks",
    "can_allocate",
    "update_blocks_slot",
    "get_computed_blocks",
}


def validate_first(method: str, exc: BaseException) -> bool:
    return method in _VALIDATE_FIRST and not isinstance(exc, OutOfBlocksError)


# Block-manager states on which every STATE_INVARIANTS predicate held (shared by all drivers).
VERDICTS = Verdicts()

SNAPSHOT_CHECKS = {
    "free_block_ids": "identical_eviction_order",
    "used_block_ids": "identical_eviction_order",
    "ref_counts": "referenced_count_matches_live_pages",
    "hash_to_block_ids": "prefix_index_consistent",
    "hashes": "prefix_index_consistent",
}


_CALL: dict[str, str] = {}  # method -> its coverage key (built once, not per call)

# The snapshot fields each spec operation can change, read from spec/infinilm/block_manager.py:
# the queries assign nothing, and a prefix lookup and a release only move ref counts. Every
# other operation is read in full (most may allocate or evict). The target is read in full
# after every call regardless.
SPEC_WRITES: dict[str, tuple[str, ...]] = {
    "get_num_free_blocks": (),
    "get_total_usable_blocks": (),
    "can_allocate": (),
    "update_blocks_slot": (),
    "get_computed_blocks": ("ref_counts",),
    "free_blocks": ("ref_counts",),
}
_REF = attrgetter("ref_count")
_new = tuple.__new__


@lru_cache(maxsize=65_536)
def _chain_hashes(tokens: tuple[int, ...], block_size: int) -> list[bytes]:
    """``chain_hashes``, remembered across drivers (a pure function; prompts repeat across
    episodes of the same block size). Callers copy the list."""
    return chain_hashes(list(tokens), block_size)


def read_spec(
    spec: SpecBlockManager, method: str, before: BlockManagerSnapshot
) -> BlockManagerSnapshot:
    """The spec's snapshot after ``method``: ``before`` with the fields it can change
    (:data:`SPEC_WRITES`) read again, its other fields kept (the same objects)."""
    writes = SPEC_WRITES.get(method)
    if writes is None:
        return read_block_manager(spec)
    if not writes:
        return before
    n, size, free, used, _, hashes, index = before  # writes == ("ref_counts",)
    refs = tuple(map(_REF, spec.blocks))
    return _new(BlockManagerSnapshot, (n, size, free, used, refs, hashes, index))


@dataclass(frozen=True)
class Config:
    """Pool shape and draw bounds of one run."""

    num_blocks: int = 8
    block_size: int = 2
    vocab: int = 2
    max_prompt_pages: int = 4

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class Holder:
    """A live owner of page references: a request's block table or a prefix pin."""

    kind: str  # "request" | "pin"
    table: tuple[int, ...]  # replaced, never changed in place (ledgers share it)
    tokens: list[int] = field(default_factory=list)
    length: int = 0  # tokens whose slots exist (the request's KV length)
    indexed: int = 0  # leading pages already published


class Driver:
    """The operation alphabet over one spec/target pair, with the ledger of live holders."""

    def __init__(
        self,
        target_factory: Callable[[int, int], Any],
        config: Config,
        reference: Reference = SPEC,
    ) -> None:
        """``reference``: what the target is compared with (the spec unless it says otherwise:
        a baseline class, or a second instance of the target for the invariants oracle)."""
        self.config = config
        spec_cls = reference.cls_for(SpecBlockManager, target_factory)
        self.spec = spec_cls(config.num_blocks, config.block_size)
        self.target = target_factory(config.num_blocks, config.block_size)
        # the reference's own counter is checked too where it is not kvspec's spec
        self._counted = (self.target,) if reference.kind == "spec" else (self.target, self.spec)
        self.ls = Lockstep(
            self.spec,
            self.target,
            read_block_manager,
            state_invariants=inv.STATE_INVARIANTS,
            validate_first=validate_first,
            snapshot_checks=SNAPSHOT_CHECKS,
            verdicts=VERDICTS,
            state_holds=state_holds,
            # (reading only what the spec's own code can change: for the spec alone)
            spec_reader=read_spec if reference.kind == "spec" else None,
            role=reference.role,
        )
        self.holders: list[Holder] = []
        self.released: list[list[int]] = []
        self.prompts: list[list[int]] = []
        self.ledger_valid = True
        self.coverage: Counter[str] = Counter()
        self._hashes: dict[tuple[int, ...], list[bytes]] = {}
        self._ledger: tuple[tuple[int, ...], ...] = ()
        self._occurrences: tuple[int, ...] | None = (0,) * config.num_blocks

    # ------------------------------------------------------------ plumbing
    @property
    def steps(self) -> list[Step]:
        return self.ls.steps

    def requests(self) -> list[Holder]:
        return [h for h in self.holders if h.kind == "request"]

    def decodable(self) -> list[Holder]:
        """Requests whose table holds exactly ceil(L/B) pages (no pending draft pages)."""
        size = self.config.block_size
        return [h for h in self.requests() if len(h.table) == -(-h.length // size)]

    def call(self, method: str, *args: Any) -> Any:
        """Lockstep call, coverage bookkeeping, ledger invariants; the spec's raw outcome."""
        free_before = self.ls.after.free_block_ids
        out = self.ls.call(method, *args)
        snap = self.ls.after
        cov = self.coverage
        cov[_CALL.get(method) or _CALL.setdefault(method, f"call:{method}")] += 1
        raised, returned = out.raised, out.returned
        if raised is not None:
            cov[f"raise:{method}:{type(raised).__name__}"] += 1
        free = snap.free_block_ids
        if free != free_before and method != "truncate_blocks":
            before = set(free_before)
            if any(p not in before for p in free):  # a page became free: an eviction
                cov["path:eviction"] += 1
                if method == "try_free_blocks" and len(free_before) >= args[0]:
                    cov["path:quirk_a_evict_one"] += 1
                if returned is None and raised is None and method == "allocate_slots":
                    cov["path:quirk_b_failed_reclaim_evicts"] += 1
                if method == "try_free_blocks" and returned is False:
                    cov["path:quirk_b_failed_reclaim_evicts"] += 1
        if method == "allocate_slots" and raised is None and returned is None:
            cov["path:allocate_returns_none"] += 1
        if isinstance(raised, OutOfBlocksError):
            cov["path:out_of_blocks"] += 1
        if not free:
            cov["path:pool_full"] += 1
        # more hashed pages than hashes (the index is consistent: checked by the call)
        if len(snap.hash_to_block_ids) < len(snap.hashes) - snap.hashes.count(EMPTY_BLOCK_HASH):
            cov["path:duplicate_hash_pages"] += 1
        if method == "get_computed_blocks" and returned and returned[0]:
            cov["path:prefix_hit"] += 1
        return out

    def after_call(self) -> None:
        """Record the ledger in the last step and check the invariants that need it.

        The ledger is the holders' tables (tuples, never changed in place), so an unchanged one
        is the same tuples: it is recorded by reference and its page occurrences are counted
        once, not once per call."""
        tables = tuple([h.table for h in self.holders])
        if tables != self._ledger:
            self._ledger = tables
            self._occurrences = page_occurrences(self.config.num_blocks, tables)
        self.ls.steps[-1].holders = self._ledger if self.ledger_valid else None
        self.check_ledger(self._ledger)

    def check_ledger(self, tables: Sequence[Sequence[int]]) -> None:
        """``referenced_count_matches_live_pages`` (the target's usable counter, every call),
        ``no_live_eviction`` and ``no_leak_at_quiescence`` against the ledger ``tables``.

        A verdict-preserving fast path first (:func:`counts_hold`); the predicates themselves
        run when it does not confirm, so a failure is always theirs, with their message."""
        snap = self.ls.after
        confirmed = True
        for side in self._counted:
            confirmed &= self._counted_holds(snap, side.get_total_usable_blocks(), tables)
        if confirmed or not self.ledger_valid:
            return
        problem = inv.no_live_eviction(snap, tables)
        if problem:
            raise self.ls.fail("no_live_eviction", self.ls.both(problem))
        if not tables:
            self.coverage["path:quiescence_checked"] += 1
            problem = inv.no_leak_at_quiescence(snap)
            if problem:
                raise self.ls.fail("no_leak_at_quiescence", self.ls.both(problem))

    def _counted_holds(
        self, snap: BlockManagerSnapshot, usable: int, tables: Sequence[Sequence[int]]
    ) -> bool:
        """``referenced_count_matches_live_pages`` for one side's usable counter: ``True`` where
        the fast path confirms ``no_live_eviction`` with it, ``False`` where the predicate ran
        (and held)."""
        if self.ledger_valid and tables:
            occurrences = (
                self._occurrences
                if tables is self._ledger
                else page_occurrences(self.config.num_blocks, tables)
            )
            if occurrences is not None and counts_hold(snap, usable, occurrences):
                return True
        problem = inv.referenced_count_matches_live_pages(
            snap, usable, tables if self.ledger_valid else None
        )
        if problem:
            raise self.ls.fail("referenced_count_matches_live_pages", problem)
        return False

    def check_invariant(self, name: str) -> None:
        """One named invariant on the target's state now (the machine's ``@invariant``s)."""
        if name == "referenced_count_matches_live_pages":
            self.check_ledger([list(h.table) for h in self.holders])
            return
        problem = inv.STATE_INVARIANTS[name](read_block_manager(self.target))
        if problem:
            raise self.ls.fail(name, problem)

    def replay_step(self, step: dict[str, Any]) -> None:
        """Re-run one trace step; the ledger invariants against the holders it recorded (none
        recorded: only the checks that need no ledger)."""
        self.call(step["method"], *step["args"])
        holders = step.get("holders")
        usable = self.target.get_total_usable_blocks()
        for name, problem in (
            (
                "referenced_count_matches_live_pages",
                inv.referenced_count_matches_live_pages(self.ls.after, usable, holders),
            ),
            ("no_live_eviction", inv.no_live_eviction(self.ls.after, holders or [])),
            (
                "no_leak_at_quiescence",
                inv.no_leak_at_quiescence(self.ls.after) if holders == [] else None,
            ),
        ):
            if problem:
                raise self.ls.fail(name, problem)

    def expect_rejected(self, out: Any) -> None:
        """A bad-input call that the spec accepted would desynchronise the ledger: stop using it."""
        if out.raised is None:
            self.ledger_valid = False
            self.coverage[f"path:bad_input_accepted:{self.steps[-1].method}"] += 1

    # ------------------------------------------------------------ draws
    def draw_length(self, c: Chooser) -> int:
        size = self.config.block_size
        pages = c.int(0, self.config.max_prompt_pages)
        if c.chance(0.7):
            return max(1, pages * size + c.pick((-1, 0, 1)))
        return max(1, pages * size + c.int(0, size - 1))

    def draw_prompt(self, c: Chooser) -> list[int]:
        """A new prompt; often an earlier prompt again (repeated system prompts: with the P-1 cap,
        a block-aligned repeat recomputes its last block, the usual source of duplicate hashes)."""
        if self.prompts and c.chance(0.3):
            return list(c.pick(self.prompts))
        return self.draw_tokens(c, self.draw_length(c))

    def draw_tokens(self, c: Chooser, n: int) -> list[int]:
        tokens: list[int] = []
        if self.prompts and c.chance(0.6):
            base = c.pick(self.prompts)
            tokens = list(base[: c.int(0, min(n, len(base)))])
        while len(tokens) < n:
            tokens.append(c.int(0, self.config.vocab - 1))
        return tokens

    def draw_count(self, c: Chooser) -> int:
        n, free = self.config.num_blocks, len(self.ls.after.free_block_ids)
        return c.pick((0, 1, 2, free, free + 1, n, n + 1, c.int(0, n + 2)))

    def hashes(self, tokens: list[int]) -> list[bytes]:
        """The prefix hashes of ``tokens`` (remembered: prompts repeat, and a pure function)."""
        key = tuple(tokens)
        found = self._hashes.get(key)
        if found is None:
            found = self._hashes[key] = _chain_hashes(key, self.config.block_size)
        return list(found)

    # ------------------------------------------------------------ operations (simple first)
    def capacity_query(self, c: Chooser) -> None:
        method = c.pick(("get_num_free_blocks", "get_total_usable_blocks", "can_allocate"))
        if method == "can_allocate":
            self.call(method, self.draw_count(c))
        else:
            self.call(method)
        self.after_call()

    def try_free_blocks(self, c: Chooser) -> None:
        self.call("try_free_blocks", self.draw_count(c))
        self.after_call()

    def allocate_slots(self, c: Chooser) -> None:
        """Admit a request without prefix lookup; sometimes with remote-computed tokens."""
        tokens = self.draw_prompt(c)
        p = len(tokens)
        computed = c.int(0, p - 1) if c.chance(0.2) else 0
        out = self.call("allocate_slots", p - computed, computed)
        if out.raised is None and out.returned is not None:
            self.holders.append(Holder("request", tuple(out.returned[0]), tokens, p, 0))
            self.prompts.append(tokens)
            self.after_call()
            if c.chance(0.5):  # prefill done: publish now (else later, by its own rule)
                self._publish(self.holders[-1])
            return
        self.after_call()

    def allocate_slots_with_prefix(self, c: Chooser) -> None:
        """The scheduler's admission: pin the cached prefix (P-1 cap), allocate, unpin on failure."""
        tokens = self.draw_prompt(c)
        p = len(tokens)
        hashes = self.hashes(tokens)
        cap = p - 1 if c.chance(0.9) else c.int(0, p + self.config.block_size)
        out = self.call("get_computed_blocks", hashes, cap)
        cached, hit = out.returned
        pin = Holder("pin", tuple(cached))
        if cached:
            self.holders.append(pin)
        self.after_call()
        computed = hit + (c.int(0, max(0, p - 1 - hit)) if c.chance(0.2) else 0)
        out = self.call("allocate_slots", max(p - computed, 0), computed, list(cached))
        if cached:
            self.holders.remove(pin)
        if out.raised is None and out.returned is not None:
            self.holders.append(
                Holder("request", tuple(out.returned[0]), tokens, max(p, computed), len(cached))
            )
            self.prompts.append(tokens)
            self.after_call()
            if c.chance(0.5):
                self._publish(self.holders[-1])
        elif out.raised is None:
            if cached:
                self.holders.append(pin)
                self.after_call()
                self.call("free_blocks", list(cached))
                self.holders.remove(pin)
            self.after_call()
        else:
            self.after_call()

    def get_computed_blocks(self, c: Chooser) -> None:
        """A standalone pin of a known prompt's cached prefix (released later like a table)."""
        if not self.prompts:
            return
        tokens = c.pick(self.prompts)
        out = self.call("get_computed_blocks", self.hashes(tokens), c.int(0, len(tokens) + 1))
        if out.returned[0]:
            self.holders.append(Holder("pin", tuple(out.returned[0])))
        self.after_call()

    def publish_computed_blocks(self, c: Chooser) -> None:
        self._publish(c.pick(self.requests()))

    def _publish(self, h: Holder) -> None:
        """The scheduler's deferred publication: every computed full page from ``indexed`` on."""
        hashes = self.hashes(h.tokens[: h.length])
        out = self.call("publish_computed_blocks", list(h.table), hashes, h.indexed, h.length)
        if out.raised is None:
            h.indexed = out.returned
        self.after_call()

    def append_slot(self, c: Chooser) -> None:
        """Decode one token: L = length + 1."""
        h = c.pick(self.decodable())
        out = self.call("append_slot", list(h.table), h.length + 1)
        if out.raised is None:
            h.table = tuple(out.returned[0])
            h.length += 1
            h.tokens = [*h.tokens, c.int(0, self.config.vocab - 1)][: h.length]
        self.after_call()

    def append_slots(self, c: Chooser) -> None:
        """Provisional slots for the next token plus drafts (start = L + 1)."""
        h = c.pick(self.decodable())
        out = self.call(
            "append_slots", list(h.table), h.length + 1, c.int(0, 2 * self.config.block_size)
        )
        if out.raised is None:
            h.table = tuple(out.returned[0])
        self.after_call()

    def truncate_blocks(self, c: Chooser) -> None:
        """Roll back (or accept drafts up) to ``keep`` tokens."""
        h = c.pick(self.requests())
        size = self.config.block_size
        capacity = len(h.table) * size
        keep = c.pick(
            (h.length, h.length + 1, capacity, c.int(1, max(1, capacity)), h.length - size)
        )
        keep = max(1, min(keep, capacity)) if capacity else 1
        out = self.call("truncate_blocks", list(h.table), keep)
        if out.raised is None:
            h.table = tuple(out.returned)
            while len(h.tokens) < keep:
                h.tokens.append(c.int(0, self.config.vocab - 1))
            h.tokens = h.tokens[:keep]
            h.length = keep
            h.indexed = min(h.indexed, len(h.table))
        self.after_call()

    def update_blocks_slot(self, c: Chooser) -> None:
        h = c.pick(self.requests())
        a = c.int(0, h.length)
        self.call("update_blocks_slot", list(h.table), a, c.int(a, h.length))
        self.after_call()

    def free_blocks(self, c: Chooser) -> None:
        """Release a request table or a pin."""
        h = c.pick(self.holders)
        out = self.call("free_blocks", list(h.table))
        if out.raised is None:
            self.holders.remove(h)
            self.released.append(list(h.table))
        self.after_call()

    def release_all(self, c: Chooser) -> None:
        """Every holder releases; the ledger is then empty, so quiescence is checked."""
        for h in list(self.holders):
            out = self.call("free_blocks", list(h.table))
            if out.raised is None:
                self.holders.remove(h)
                self.released.append(list(h.table))
            self.after_call()

    # ------------------------------------------------------------ bad inputs
    def bad_double_free(self, c: Chooser) -> None:
        """Release a table again; only when its last page (checked first) is unreferenced, so the
        legacy per-page assert fires before any decrement."""
        candidates = [t for t in self.released if t and self.spec.blocks[t[-1]].ref_count == 0]
        if not candidates:
            return
        self.expect_rejected(self.call("free_blocks", list(c.pick(candidates))))
        self.after_call()

    def bad_page_id(self, c: Chooser) -> None:
        """Unknown or out-of-range page ids where an operation reads page metadata, and a free
        page where a used one is required."""
        n, size = self.config.num_blocks, self.config.block_size
        bad = c.pick((n, n + 7, -1, -n))
        table = list(c.pick(self.holders).table) if self.holders and c.chance(0.5) else []
        kind = c.int(0, 3)
        if kind == 0:  # the bad id is released first (reversed order): nothing changes
            out = self.call("free_blocks", [*table, bad])
        elif kind == 2 and table:  # the bad id is a discarded page of a rollback
            out = self.call("truncate_blocks", [*table, bad], len(table) * size)
        elif kind == 3 and self.ls.after.free_block_ids:  # publishing a page nobody holds
            free_page = c.pick(self.ls.after.free_block_ids)
            out = self.call("publish_computed_blocks", [free_page], [b"\x01" * 16], 0, size)
        else:
            out = self.call("publish_computed_blocks", [bad], [b"\x01" * 16], 0, size)
        self.expect_rejected(out)
        self.after_call()

    def bad_counts(self, c: Chooser) -> None:
        """Negative counts and impossible lengths."""
        size = self.config.block_size
        table = list(c.pick(self.holders).table) if self.holders else []
        choice = c.int(0, 7)
        if choice == 0:
            out = self.call("allocate_slots", -1 - c.int(0, 3), 0)
        elif choice == 1:
            out = self.call("allocate_slots", 1, -1)
        elif choice == 2:
            out = self.call("try_free_blocks", -1)
        elif choice == 3:
            out = self.call("can_allocate", -1 - c.int(0, 3))
        elif choice == 4:
            out = self.call("append_slots", table, 1, -1)
        elif choice == 5:
            out = self.call("append_slot", table, 0)
        elif choice == 6:
            out = self.call("update_blocks_slot", table, 0, len(table) * size + 1 + c.int(0, size))
        else:
            out = self.call("truncate_blocks", table, c.pick((0, len(table) * size + 1)))
        self.expect_rejected(out)
        self.after_call()

    def bad_table_length(self, c: Chooser) -> None:
        """A table whose length does not match the token count the call states."""
        h = c.pick(self.requests())
        size = self.config.block_size
        if c.chance(0.5) and h.table:
            # a cached table longer than the computed tokens it claims: always rejected
            self.expect_rejected(
                self.call("allocate_slots", 1, len(h.table) * size - 1, list(h.table))
            )
        else:
            start = max(1, h.length + 1 + c.pick((size, -size, 2 * size)))
            out = self.call("append_slots", list(h.table), start, 1)
            if out.raised is None:  # the drawn start happened to fit: the pages are the request's
                h.table = tuple(out.returned[0])
        self.after_call()

    def bad_duplicate_ids(self, c: Chooser) -> None:
        """Duplicate page ids in a truncated range or a published range."""
        h = c.pick(self.requests())
        size = self.config.block_size
        page = h.table[-1]
        if c.chance(0.5):
            out = self.call("truncate_blocks", [*h.table, page], len(h.table) * size)
        else:
            out = self.call(
                "publish_computed_blocks", [page, page], [b"\x01" * 16, b"\x02" * 16], 0, 2 * size
            )
        self.expect_rejected(out)
        self.after_call()

    def bad_republish(self, c: Chooser) -> None:
        """Publish a request's pages again from block 0 once some are published."""
        h = c.pick([r for r in self.requests() if r.indexed > 0])
        out = self.call(
            "publish_computed_blocks", list(h.table), self.hashes(h.tokens[: h.length]), 0, h.length
        )
        self.expect_rejected(out)
        self.after_call()


# What the operations' enabling conditions read, computed once per step.
class Facts(NamedTuple):
    prompts: bool
    requests: bool
    decodable: bool
    holders: bool
    released: bool
    indexed: bool

    @classmethod
    def of(cls, d: Driver) -> Facts:
        requests = decodable = indexed = False
        size = d.config.block_size
        for h in d.holders:  # d.requests() and d.decodable() in one pass
            if h.kind == "request":
                requests = True
                decodable = decodable or len(h.table) == -(-h.length // size)
                indexed = indexed or h.indexed > 0
        return tuple.__new__(  # (NamedTuple's own constructor is Python-level)
            cls,
            (bool(d.prompts), requests, decodable, bool(d.holders), bool(d.released), indexed),
        )


OPERATIONS: tuple[Operation, ...] = (
    Operation("capacity_query", 4),
    Operation("try_free_blocks", 4),
    Operation("allocate_slots", 10),
    Operation("allocate_slots_with_prefix", 14),
    Operation("get_computed_blocks", 3, lambda f: f.prompts),
    Operation("publish_computed_blocks", 10, lambda f: f.requests),
    Operation("append_slot", 14, lambda f: f.decodable),
    Operation("append_slots", 5, lambda f: f.decodable),
    Operation("truncate_blocks", 5, lambda f: f.requests),
    Operation("update_blocks_slot", 2, lambda f: f.requests),
    Operation("free_blocks", 12, lambda f: f.holders),
    Operation("release_all", 1, lambda f: f.holders),
    Operation("bad_double_free", 2, lambda f: f.released, bad=True),
    Operation("bad_page_id", 1, bad=True),
    Operation("bad_counts", 1, bad=True),
    Operation("bad_table_length", 1, lambda f: f.requests, bad=True),
    Operation("bad_duplicate_ids", 1, lambda f: f.requests, bad=True),
    Operation("bad_republish", 1, lambda f: f.indexed, bad=True),
)


def machine_config(c: Chooser, variant: str | None, options: Options) -> Config:
    """The hypothesis machine's pool: 1-8 pages of 1-4 tokens over a two-token vocabulary."""
    return Config(num_blocks=c.int(1, 8), block_size=c.int(1, 4), vocab=2)


def fuzz_config(c: Chooser, variant: str | None, options: Options) -> Config:
    """The fuzzer's pools: varied shapes, small ones (that fill up) most often."""
    return Config(
        num_blocks=c.pick((1, 2, 3, 4, 5, 6, 8, 12, 16)),
        block_size=c.pick((1, 2, 3, 4, 8)),
        vocab=c.pick((2, 2, 3)),
        max_prompt_pages=c.pick((2, 4, 6)),
    )


CHECKER = CheckerDef(
    machine_name="BlockManagerLockstep",
    driver=lambda target_cls, config, options, reference: Driver(target_cls, config, reference),
    config_type=Config,
    machine_config=machine_config,
    fuzz_config=fuzz_config,
    operations=OPERATIONS,
    facts=Facts.of,
    spec_cls=SpecBlockManager,
    invariants=(
        "free_and_used_partition_pool",
        "free_pages_unreferenced",
        "prefix_index_consistent",
        "referenced_count_matches_live_pages",
    ),
    episode_ops=400,
    # a 4-page pool filled and reclaimed: every rule, every REQUIRED path of the tests
    examples=(Example(165, steps=120, config={"num_blocks": 4, "block_size": 2}),),
)
