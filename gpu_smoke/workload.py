"""A small serving engine whose every page decision comes from kvspec's production block manager.

The engine loop, one model forward per step (chunked prefill and decode mixed in one flat batch):

1. **admit** arrivals in order while a batch row is free: chain-hash the prompt's full pages, pin
   the cached prefix with ``get_computed_blocks(hashes, P - 1)`` (the scheduler's cap, reference
   §3.1), check ``get_total_usable_blocks()`` against the pages this request and the running ones
   will still need, then ``allocate_slots(P - hit, hit, cached_table)``; on refusal release the pins
   with ``free_blocks`` and wait. The request's row of the device block table is written.
2. **build the batch**: a prefilling request contributes its next chunk, at the slots
   ``allocate_slots`` returned; a decoding request feeds its last token at the slot of
   ``append_slot(table, L)``, which opens a new page at every page boundary (and reclaims when the
   free list is empty).
3. **forward** the stock Llama with ``paged_batch=`` (block tables, slot mapping, lengths).
4. **after**: a finished prefill publishes its prompt pages (``publish_computed_blocks``) and
   samples; a decode step samples and publishes any page it filled; a request with all its tokens
   releases its table (``free_blocks``) — the pages stay cached until pressure evicts them.

Every block-manager call is followed by :meth:`FreeListWatch.sync`, which poisons the pages that
came back to the free list. Later requests share prefixes with earlier ones, one continues an
earlier conversation (prompt = that request's prompt and answer, hitting its generated pages), and
the pool is small enough that reclamation evicts cached pages and freed pages are reused.

Planted bugs (:class:`Plant`): a stale block-table row (a new request inherits the previous
occupant's entries for its cached prefix), no last-page tail mask, and any block-manager class —
e.g. ``stateful_tests.mutants_infinilm.ReclaimEvictsReferencedPage``, which frees a page still referenced.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch

from gpu_smoke.attention import PagedBatch
from gpu_smoke.pool import FreeListWatch, KVPool

if TYPE_CHECKING:  # annotations only: the engine never needs transformers itself
    from transformers import LlamaForCausalLM
from impl.infinilm.block_manager import BlockManager
from spec.infinilm.prefix_cache import chain_hashes


@dataclass(frozen=True)
class RequestSpec:
    rid: int
    prompt: tuple[int, ...]  # own tokens (after the continued conversation, if any)
    max_new_tokens: int
    arrival: int  # engine step at which it arrives
    continues: int | None = None  # rid whose prompt + answer precede ``prompt``


@dataclass(frozen=True)
class WorkloadSpec:
    requests: tuple[RequestSpec, ...]
    num_pages: int
    page_size: int
    max_batch: int
    prefill_chunk: int

    def final_len(self, rid: int) -> int:
        """Tokens in the request's conversation once it has all its answer."""
        spec = self.requests[rid]
        head = self.final_len(spec.continues) if spec.continues is not None else 0
        return head + len(spec.prompt) + spec.max_new_tokens

    @property
    def max_pages(self) -> int:
        return max(math.ceil(self.final_len(r.rid) / self.page_size) for r in self.requests)


# (shared prefix, own tokens, new tokens, arrival step, continues) in pages of the workload
_SHAPE: tuple[tuple[str | None, float, float, int, int | None], ...] = (
    ("A", 0.75, 2.0, 0, None),
    ("B", 1.0, 1.75, 0, None),
    (None, 3.25, 2.5, 1, None),
    ("A", 0.5, 1.5, 3, None),
    ("B", 1.5, 2.0, 4, None),
    (None, 4.0, 2.0, 6, None),
    ("A", 1.25, 1.25, 8, None),
    (None, 0.5, 1.5, 10, 0),
    (None, 2.75, 3.0, 11, None),
    ("B", 0.25, 2.0, 12, None),
)
_PREFIX_PAGES = {"A": 2.5, "B": 2.25}


def make_workload(
    *, vocab: int, page_size: int, num_pages: int, max_batch: int = 4, seed: int = 0
) -> WorkloadSpec:
    """Ten requests over two shared prefixes, one continuation, staggered arrivals (seeded)."""
    rng = random.Random(seed)

    def tokens(pages: float) -> tuple[int, ...]:
        return tuple(rng.randrange(vocab) for _ in range(max(1, round(pages * page_size))))

    prefixes = {name: tokens(pages) for name, pages in _PREFIX_PAGES.items()}
    requests = []
    for rid, (prefix, own, new, arrival, continues) in enumerate(_SHAPE):
        prompt = (prefixes[prefix] if prefix else ()) + tokens(own)
        n_new = max(2, round(new * page_size) + rid % 2)
        requests.append(RequestSpec(rid, prompt, n_new, arrival, continues))
    return WorkloadSpec(tuple(requests), num_pages, page_size, max_batch, 2 * page_size)


@dataclass(frozen=True)
class Plant:
    """Planted bugs for the tests (all off = the correct engine)."""

    stale_table_row: bool = False
    tail_mask: bool = True
    block_manager: Callable[[int, int], Any] = BlockManager


def _referenced_page_freed() -> Plant:
    # the block-manager mutant from the bug-injection catalogue (reclaim takes pages held once)
    from stateful_tests.mutants_infinilm import ReclaimEvictsReferencedPage

    return Plant(block_manager=ReclaimEvictsReferencedPage)


PLANTS: dict[str, Callable[[], Plant]] = {
    "stale-table-entry": lambda: Plant(stale_table_row=True),
    "missing-tail-mask": lambda: Plant(tail_mask=False),
    "page-freed-while-referenced": _referenced_page_freed,
}


def plant(name: str | None) -> Plant:
    """A planted bug by name (``None``: the correct engine)."""
    return Plant() if name is None else PLANTS[name]()


@dataclass
class _Live:
    spec: RequestSpec
    prompt: list[int]
    row: int
    table: list[int]
    hit_pages: int
    prefill_slots: list[int]
    computed: int  # tokens whose K/V are in the pool
    published: int  # pages published to the prefix index
    generated: list[int] = field(default_factory=list)  # argmax of each step
    fed: list[int] = field(default_factory=list)  # the answer as fed back (argmax, or forced)
    logits: list[torch.Tensor] = field(default_factory=list)

    @property
    def prefilling(self) -> bool:
        return self.computed < len(self.prompt)

    def cached_tokens(self) -> list[int]:
        return self.prompt + self.fed[: self.computed - len(self.prompt)]


@dataclass
class PagedRun:
    """What the paged engine produced, per request id, and how the pool was used."""

    prompts: dict[int, list[int]]
    tokens: dict[int, list[int]]
    logits: dict[int, torch.Tensor]
    stats: dict[str, int]
    error: str | None = None


class Engine:
    def __init__(
        self,
        model: LlamaForCausalLM,
        workload: WorkloadSpec,
        *,
        backend: str = "gather",
        planted: Plant | None = None,
        forced: dict[int, list[int]] | None = None,
    ) -> None:
        self.model = model
        self.w = workload
        self.backend = backend
        self.plant = planted or Plant()
        self.forced = forced
        cfg = model.config
        self.device = model.device
        self.bm = self.plant.block_manager(workload.num_pages, workload.page_size)
        self.pool = KVPool(
            layers=cfg.num_hidden_layers,
            pages=workload.num_pages,
            page_size=workload.page_size,
            # LlamaConfig types these ``int | None``; its __post_init__ replaces the None defaults
            kv_heads=cast(int, cfg.num_key_value_heads),
            head_dim=cast(int, cfg.head_dim),
            dtype=model.dtype,
            device=self.device,
        )
        self.watch = FreeListWatch(self.bm, self.pool)
        # the device block table, one row per batch slot; rows are reused, never cleared
        self.tables = torch.zeros(
            workload.max_batch, workload.max_pages, dtype=torch.int32, device=self.device
        )
        self.free_rows = list(range(workload.max_batch))
        self.waiting = sorted(workload.requests, key=lambda r: (r.arrival, r.rid))
        self.running: list[_Live] = []
        self.done: dict[int, _Live] = {}
        self.stats = dict.fromkeys(
            (
                "steps",
                "forward_tokens",
                "decode_only_steps",
                "triton_decode_steps",
                "prefix_hit_pages",
                "page_boundary_crossings",
                "admission_waits",
                "requests_finished",
                "max_running",
            ),
            0,
        )

    # ------------------------------------------------------------------ block manager, watched
    def _pages(self, n_tokens: int) -> int:
        return -(-n_tokens // self.w.page_size)

    def _final_written(self, r: _Live) -> int:
        return len(r.prompt) + r.spec.max_new_tokens - 1  # the last token is sampled, not fed

    def _prompt(self, spec: RequestSpec) -> list[int] | None:
        if spec.continues is None:
            return list(spec.prompt)
        head = self.done.get(spec.continues)
        if head is None:
            return None  # the conversation it continues has not finished yet
        return head.prompt + head.fed + list(spec.prompt)

    def _admit(self, step: int) -> None:
        while self.waiting and self.waiting[0].arrival <= step and self.free_rows:
            spec = self.waiting[0]
            prompt = self._prompt(spec)
            if prompt is None:
                return
            size = self.w.page_size
            hashes = chain_hashes(prompt, size)
            cached, hit = self.bm.get_computed_blocks(hashes, len(prompt) - 1)
            self.watch.sync()
            need = self._pages(len(prompt) + spec.max_new_tokens - 1) - len(cached)
            reserve = sum(self._pages(self._final_written(r)) - len(r.table) for r in self.running)
            if self.bm.get_total_usable_blocks() < need + reserve:
                self.bm.free_blocks(cached)
                self.watch.sync()
                self.stats["admission_waits"] += 1
                return
            allocated = self.bm.allocate_slots(len(prompt) - hit, hit, cached)
            if allocated is None:
                self.watch.sync()
                self.bm.free_blocks(cached)
                self.watch.sync()
                self.stats["admission_waits"] += 1
                return
            table, slots = allocated
            self.watch.sync(table[len(cached) :])
            self.waiting.pop(0)
            row = self.free_rows.pop(0)
            first = len(cached) if self.plant.stale_table_row else 0  # bug: prefix entries kept
            self.tables[row, first : len(table)] = torch.tensor(table[first:], dtype=torch.int32)
            self.running.append(
                _Live(spec, prompt, row, table, len(cached), slots, hit, len(cached))
            )
            self.stats["prefix_hit_pages"] += len(cached)
            self.stats["max_running"] = max(self.stats["max_running"], len(self.running))

    # ------------------------------------------------------------------ one step
    def _step(self) -> None:
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        for r in self.running:
            if r.prefilling:
                start = r.computed
                n = min(self.w.prefill_chunk, len(r.prompt) - start)
                tokens += r.prompt[start : start + n]
                offset = start - r.hit_pages * self.w.page_size
                slots += r.prefill_slots[offset : offset + n]
            else:
                start, n = r.computed, 1
                tokens.append(r.fed[-1])
                before = len(r.table)
                _, slot = self.bm.append_slot(r.table, start + 1)
                self.watch.sync(r.table[before:])
                if len(r.table) > before:
                    self.stats["page_boundary_crossings"] += 1
                    self.tables[r.row, before] = r.table[before]
                slots.append(slot)
            positions += range(start, start + n)
            query_lens.append(n)
            context_lens.append(start + n)
        device = self.device
        rows = torch.tensor([r.row for r in self.running], dtype=torch.long, device=device)
        meta = PagedBatch(
            pool=self.pool,
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
            block_tables=self.tables.index_select(0, rows),
            query_lens=query_lens,
            context_lens=context_lens,
            backend=self.backend,
            tail_mask=self.plant.tail_mask,
        )
        last = torch.tensor(
            [sum(query_lens[: i + 1]) - 1 for i in range(len(query_lens))], device=device
        )
        out = self.model(
            input_ids=torch.tensor([tokens], dtype=torch.long, device=device),
            position_ids=torch.tensor([positions], dtype=torch.long, device=device),
            use_cache=False,
            logits_to_keep=last,
            paged_batch=meta,
        )
        logits = out.logits[0].float()
        self.stats["steps"] += 1
        self.stats["forward_tokens"] += len(tokens)
        self.stats["decode_only_steps"] += int(meta.decode_only)
        self.stats["triton_decode_steps"] += int(meta.decode_only and self.backend == "triton")
        for i, (r, n) in enumerate(zip(list(self.running), query_lens, strict=True)):
            r.computed += n
            if r.prefilling:
                continue
            self._publish(r)
            r.logits.append(logits[i])
            r.generated.append(int(logits[i].argmax()))
            k = len(r.generated) - 1
            r.fed.append(self.forced[r.spec.rid][k] if self.forced else r.generated[-1])
            if len(r.generated) == r.spec.max_new_tokens:
                self._finish(r)

    def _publish(self, r: _Live) -> None:
        if r.computed // self.w.page_size > r.published:
            hashes = chain_hashes(r.cached_tokens(), self.w.page_size)
            r.published = self.bm.publish_computed_blocks(r.table, hashes, r.published, r.computed)
            self.watch.sync()

    def _finish(self, r: _Live) -> None:
        self.bm.free_blocks(r.table)
        self.watch.sync()
        self.running.remove(r)
        self.free_rows.append(r.row)
        self.free_rows.sort()
        self.done[r.spec.rid] = r
        self.stats["requests_finished"] += 1

    # ------------------------------------------------------------------ the loop
    @torch.inference_mode()
    def run(self) -> PagedRun:
        error = None
        step = 0
        limit = 4 * sum(self.w.final_len(r.rid) for r in self.w.requests)
        try:
            while self.waiting or self.running:
                if step > limit:
                    raise RuntimeError(f"engine stalled after {step} steps")
                self._admit(step)
                if self.running:
                    self._step()
                step += 1
        except Exception as exc:  # a block-manager error ends the run; the report says which
            error = f"{type(exc).__name__}: {exc}"
        lives = {**{r.spec.rid: r for r in self.running}, **self.done}
        vocab = self.model.config.vocab_size
        stats = {
            **self.stats,
            "pages_reused": self.watch.pages_reused,
            "poisoned_pages": self.pool.poisoned,
            "evictions": self.watch.evictions,
            "reclaiming_calls": self.watch.reclaiming_calls,
        }
        return PagedRun(
            prompts={rid: r.prompt for rid, r in lives.items()},
            tokens={rid: r.generated for rid, r in lives.items()},
            logits={
                rid: torch.stack(r.logits) if r.logits else torch.empty(0, vocab)
                for rid, r in lives.items()
            },
            stats=stats,
            error=error,
        )
