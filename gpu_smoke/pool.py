"""The paged KV pool: one tensor per run, and NaN poison on every page the free list takes back.

Layout (layer-major): ``[layers, 2, pages, page_size, kv_heads, head_dim]``; ``[:, 0]`` holds keys,
``[:, 1]`` values. Slot ``s`` is token ``s % page_size`` of page ``s // page_size``, the numbering
the block manager's slot mappings use (docs/infinilm.md §3.2).

The pool starts as NaN and every page the block manager returns to its free list is set to NaN
again before anyone can reuse it. A correct engine never reads a slot it has not written in the
current tenancy of a page, so NaN never reaches a logit; a stale block-table entry, an unmasked
last-page tail or a page freed while still referenced makes the logits NaN (or wrong), and the
smoke sees it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class KVPool:
    """The KV tensor of one run, written at slots and read through block tables."""

    def __init__(
        self,
        *,
        layers: int,
        pages: int,
        page_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.page_size = page_size
        self.pages = pages
        shape = (layers, 2, pages, page_size, kv_heads, head_dim)
        self.kv = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.poisoned = 0  # pages set to NaN after the block manager returned them

    def keys(self, layer: int) -> torch.Tensor:
        """``[pages, page_size, kv_heads, head_dim]`` view of one layer's keys."""
        return self.kv[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        return self.kv[layer, 1]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``k``/``v`` (``[tokens, kv_heads, head_dim]``) at ``slots`` (``[tokens]``)."""
        flat = self.kv[layer].view(2, self.pages * self.page_size, *self.kv.shape[-2:])
        flat[0].index_copy_(0, slots, k.to(flat.dtype))
        flat[1].index_copy_(0, slots, v.to(flat.dtype))

    def poison(self, pages: Iterable[int]) -> None:
        ids = sorted(set(pages))
        if ids:
            index = torch.tensor(ids, dtype=torch.long, device=self.kv.device)
            self.kv.index_fill_(2, index, float("nan"))
            self.poisoned += len(ids)


class FreeListWatch:
    """Poisons the pages a block manager gives back, by diffing its free list around each call.

    Reads only the upstream attribute ``free_block_ids``, so any target with the InfiniLM API works.
    After a call, a page is poisoned when it is on the free list now and was not before (evicted by
    reclamation or released by a buggy ``free_blocks``), or when the call handed it out as a new page
    although it was not free before (evicted and reallocated inside the same call, e.g.
    ``allocate_slots`` → ``try_free_blocks`` → ``_allocate_block``). Every page that enters the free
    list is thus NaN before its next tenant writes it; pages never used are NaN from the start.
    """

    def __init__(self, block_manager: Any, pool: KVPool) -> None:
        self.bm = block_manager
        self.pool = pool
        self.free = set(block_manager.free_block_ids)
        self.ever_allocated: set[int] = set()
        self.pages_reused = 0  # allocations that got a page an earlier tenant had used
        self.evictions = 0  # pages taken back from the used set (each one poisoned)
        self.reclaiming_calls = 0  # block-manager calls during which pages were taken back

    def sync(self, new_pages: Iterable[int] = ()) -> None:
        """Call after every block-manager call; ``new_pages`` are the pages it allocated."""
        free_now = set(self.bm.free_block_ids)
        new = list(new_pages)
        taken_back = (free_now - self.free) | {p for p in new if p not in self.free}
        if taken_back:
            self.pool.poison(taken_back)
            self.evictions += len(taken_back)
            self.reclaiming_calls += 1
        for page in new:
            if page in self.ever_allocated:
                self.pages_reused += 1
            self.ever_allocated.add(page)
        self.free = free_now
