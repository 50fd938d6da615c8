"""One SGLang-style radix cache with its requests, driven by JSON-able scheduler calls.

A :class:`RadixHarness` plays SGLang's scheduler for one cache (docs/sglang.md §5): it owns the
requests (tokens, the ``req_to_token`` row of slots, the tree-owned prefix length
``cache_protected_len`` and the locked node), turns request ids into the cache's node handles and
returns plain values, so that two harnesses — spec and target — can be compared call by call and a
trace replays. Scheduler events: ``admit`` (match capped at ``len-1``, lock, evict, allocate,
write the row), ``decode`` (one more token and slot), ``checkpoint`` (insert, free the duplicate
slots, re-match, repoint the row, move the lock), ``finish`` (checkpoint, free the row's tail,
unlock) and ``abort`` (free, unlock); ``group_begin`` / ``group_end`` open and close the
allocator's free group, as SGLang's scheduler does around processing a batch's results (the
checkpoints, finishes and aborts between them defer their frees, docs/sglang.md §1.4). Raw calls
with explicit arguments (``match``, ``evict``, ``free``, ``unlock_again``) change no request: the
bad-input rules use them (and ``group_begin`` with a group already open).

A target may offer ``kvspec_checkpoint(tokens, row, protected, node, prompt_len)`` returning
``(cached, row, protected, node)``: then ``checkpoint`` runs the target's own checkpoint code (for
``--target sglang``, SGLang's ``RadixCache.checkpoint`` on a request record) instead of the
harness's re-enactment of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from spec.sglang.radix_cache import RadixSnapshot, RequestRow, read_radix_cache


@dataclass(frozen=True)
class Config:
    """One cache's construction and the draw bounds of a run."""

    variant: str = "lru"  # the eviction policy
    size: int = 8  # KV slots (the reserved page 0 not counted)
    page_size: int = 1
    vocab: int = 2
    max_requests: int = 3
    max_len: int = 8
    need_sort: bool = False  # the allocator stages freed pages (PD disaggregation's setting)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Req:
    tokens: list[int]
    row: list[int]
    protected: int  # row[:protected] is tree-owned (cache_protected_len)
    node: Any  # the locked node's handle
    prompt_len: int = 0  # len(origin_input_ids): the tokens before the first decoded one


class RadixHarness:
    """One cache (spec or target) and its requests, behind JSON-able calls."""

    def __init__(self, cache_cls: Callable[..., Any], config: Config) -> None:
        self.config = config
        # the default policy is not passed: a class without the keyword is checked as ``lru``
        policy: dict[str, Any] = (
            {} if config.variant == "lru" else {"eviction_policy": config.variant}
        )
        if config.need_sort:  # likewise: a class without ``need_sort`` is checked without it
            policy["need_sort"] = True
        self.c = cache_cls(config.size, page_size=config.page_size, **policy)
        self.alloc = self.c.token_to_kv_pool_allocator
        self.requests: dict[str, Req] = {}
        # the request the last call finished -> the node it unlocked; any other call forgets it,
        # so a later unlock never meets a node evicted and re-created at the same path
        self.released: dict[str, Any] = {}

    # ------------------------------------------------------------ plumbing
    def _path(self, node: Any) -> list[int]:
        return list(self.c.node_path(node))

    def _room(self, tokens: int) -> None:
        """Evict so that ``tokens`` slots are free, as the scheduler does before allocating."""
        short = tokens - self.alloc.available_size()
        if short > 0:
            self.c.evict(short)

    def _free_tail(self, r: Req) -> None:
        tail = r.row[r.protected :]
        if tail:
            self.alloc.free_segment(tail, r.protected)

    # ------------------------------------------------------------ scheduler events
    def admit(self, rid: str, tokens: list[int]) -> dict[str, Any] | None:
        """Match the prompt's cached prefix (at most ``len-1`` tokens: the last one is always
        computed), lock it, make room and allocate the rest; ``None`` (lock dropped) when the
        pool cannot hold it."""
        self.released.clear()
        slots, node = self.c.match_prefix(tokens[: len(tokens) - 1])
        prefix = len(slots)
        self.c.inc_lock_ref(node)
        ps = self.config.page_size
        if ps == 1:
            self._room(len(tokens) - prefix)
            new = self.alloc.alloc(len(tokens) - prefix)
        else:
            pages = -(-len(tokens) // ps) - -(-prefix // ps)
            self._room(pages * ps)
            new = self.alloc.alloc_extend(prefix, len(tokens), slots[-1] if slots else -1)
        if new is None:
            self.c.dec_lock_ref(node)
            return None
        new = [int(s) for s in new]
        row = [int(s) for s in slots] + new
        self.requests[rid] = Req(list(tokens), row, prefix, node, len(tokens))
        return {"prefix": prefix, "node": self._path(node), "new": new}

    def decode(self, rid: str, token: int) -> int | None:
        """One sampled token: a slot for it (evicting first when none is free)."""
        self.released.clear()
        r, ps = self.requests[rid], self.config.page_size
        if ps == 1:
            self._room(1)
            new = self.alloc.alloc(1)
        else:
            if len(r.row) % ps == 0:
                self._room(ps)
            new = self.alloc.alloc_decode(len(r.row) + 1, r.row[-1])
        if new is None:
            return None
        r.tokens.append(token)
        r.row.append(int(new[0]))
        return int(new[0])

    def checkpoint(self, rid: str) -> dict[str, Any]:
        """SGLang's ``checkpoint``: insert the request's page-aligned tokens with its slots, then
        its prompt's (a split at the prompt boundary); free the slots the tree already had (its
        own copies of a prefix another request cached first); repoint the row at the tree's slots
        and move the lock to the new last node."""
        self.released.clear()
        r, ps = self.requests[rid], self.config.page_size
        own = getattr(self.c, "kvspec_checkpoint", None)
        if own is not None:  # the target runs its own checkpoint code on the request's record
            cached, r.row, r.protected, r.node = own(r.tokens, r.row, r.protected, r.node,
                                                     r.prompt_len)  # fmt: skip
            return {"cached": int(cached), "protected": r.protected}
        if self.config.variant.startswith("unified-"):
            return self._unified_checkpoint(r)
        cached = int(self.c.insert(r.tokens, r.row))
        # the prompt re-inserted: splits the new leaf at the prompt's last whole page, so that
        # eviction can drop the decoded part alone (only the topology changes)
        prompt = r.prompt_len // ps * ps
        if 0 < prompt < len(r.tokens) // ps * ps:
            self.c.insert(r.tokens[:prompt], r.row[:prompt])
        if cached > r.protected:
            self.alloc.free_segment(r.row[r.protected : cached], r.protected)
        key = r.tokens[: len(r.tokens) // ps * ps]
        slots, node = self.c.match_prefix(key)
        r.row[r.protected : len(slots)] = [int(s) for s in slots[r.protected :]]
        r.protected = len(slots)
        self.c.dec_lock_ref(r.node)
        self.c.inc_lock_ref(node)
        r.node = node
        return {"cached": cached, "protected": r.protected}

    def _unified_checkpoint(self, r: Req) -> dict[str, Any]:
        """``UnifiedRadixCache.checkpoint_into_tree`` (docs/sglang.md §8.3): the insert frees the
        request's duplicate slots itself (from ``cache_protected_len`` on, per tree node), the
        prompt is re-inserted freeing nothing, and the row is repointed at the path of the node
        the first insert ended on — no re-match."""
        ps = self.config.page_size
        cached, node = self.c.insert_result(r.tokens, r.row, r.protected)
        prompt = r.prompt_len // ps * ps
        if 0 < prompt < len(r.tokens) // ps * ps:
            self.c.insert_result(r.tokens[:prompt], r.row[:prompt], prompt)
        slots = [int(s) for s in self.c.path_slots(node)]
        r.row[r.protected : len(slots)] = slots[r.protected :]
        r.protected = len(slots)
        self.c.dec_lock_ref(r.node)
        self.c.inc_lock_ref(node)
        r.node = node
        return {"cached": int(cached), "protected": r.protected}

    def finish(self, rid: str) -> dict[str, Any]:
        """``release_kv_cache`` with a checkpoint: cache, free the rest of the row, unlock."""
        out = self.checkpoint(rid)
        r = self.requests.pop(rid)
        self._free_tail(r)
        self.c.dec_lock_ref(r.node)
        self.released = {rid: r.node}
        return out

    def abort(self, rid: str) -> None:
        """``release_kv_cache`` without a checkpoint: free the request's own slots, unlock."""
        r = self.requests.pop(rid)
        self._free_tail(r)
        self.c.dec_lock_ref(r.node)
        self.released = {rid: r.node}

    def group_begin(self) -> None:
        """``free_group_begin``: later frees wait for ``group_end`` (a group already open: the
        spec refuses, upstream asserts)."""
        self.alloc.free_group_begin()
        self.released.clear()  # (after: a rejected begin changes nothing)

    def group_end(self) -> None:
        """``free_group_end``: the group's deferred frees happen now (none open: nothing)."""
        self.released.clear()
        self.alloc.free_group_end()

    # ------------------------------------------------------------ raw calls
    def match(self, tokens: list[int]) -> list[Any]:
        self.released.clear()
        slots, node = self.c.match_prefix(tokens)
        return [len(slots), self._path(node)]

    def evict(self, num_tokens: int) -> int:
        self.released.clear()
        return int(self.c.evict(num_tokens))

    def free(self, slots: list[int]) -> None:
        self.alloc.free(slots)
        self.released.clear()  # (after: a rejected free changes nothing)

    def unlock_again(self, rid: str) -> int:
        """``dec_lock_ref`` of the node the request finished by the last call already unlocked
        (a double unlock)."""
        return int(self.c.dec_lock_ref(self.released[rid]))

    def available_size(self) -> int:
        return int(self.alloc.available_size())


def read(h: RadixHarness) -> RadixSnapshot:
    rows = tuple(
        RequestRow(
            rid, tuple(r.tokens), tuple(r.row), r.protected, h.c.node_path(r.node), r.prompt_len
        )
        for rid, r in h.requests.items()
    )
    return read_radix_cache(h.c)._replace(requests=rows)
