"""Production InfiniLM scheduler: the spec's decisions, variant by variant, with cheap admission.

* ``legacy``: the running queue's reservation is scanned at most once per ``schedule()`` and only
  when a candidate reaches the admission check (PR #579); ``can_accept_request`` takes it through
  the keyword-only ``running_required_blocks``. Equivalent because the running queue is not
  touched during the prefill loop and no running request's g changes within a step.
* ``exact`` / ``tight``: ``num_reserved_decode_blocks`` is an incremental counter (the
  exact-reservation PR): ``+= R(req)`` when ``complete_requests`` re-enqueues a request at the
  running tail, ``-= R(req)`` as soon as the decode loop dequeues one (before its ``is_finished``
  check). A request's table does not change while it sits in the queue, so the counter always
  equals the scan (``reservation_counter_matches_scan``) and admission is O(1).

The subclass overrides only the spec phases it optimises and inherits the rest (``schedule``,
``_promote_remote``, ``_place_requeued``, ``_attach_mamba_row``, ``_wait_for_remote``):
``_prefill_phase`` (the loop, with #579's per-step snapshot and the per-request helpers inlined),
``_decode_phase`` (the loop, inlined, with the counter's decrement), ``can_accept_request`` (the
counter: O(1)), ``complete_requests`` (the counter's increment) and ``_running_required_blocks``
(the scan, inlined). It reads spec objects only through their public methods.

The pure cores (the snapshot decision, the counter's deltas) are :mod:`impl.infinilm.kernels`,
shown equal to the legacy scans of :mod:`spec.infinilm.kernels` by ``kvspec crosshair``.
"""

from __future__ import annotations

from collections.abc import Iterable

from impl.infinilm.block_manager import BlockManager
from impl.infinilm.kernels import add_reservation, remove_reservation, snapshot_due
from spec.infinilm.kernels import admits, scan_reservation
from spec.infinilm.request import TERMINAL, InferenceRequest, RequestStatus
from spec.infinilm.scheduler import (
    RESERVATIONS,
    KVConnector,
    KVConnectorOutput,
    ModelRunnerOutput,
    RequestQueue,
    SchedulerOutput,
    SpeculativeCacheOps,
    running_reservation,
)
from spec.infinilm.scheduler import Scheduler as SpecScheduler

__all__ = [
    "RESERVATIONS",
    "KVConnectorOutput",
    "ModelRunnerOutput",
    "RequestQueue",
    "Scheduler",
    "SchedulerOutput",
    "SpeculativeCacheOps",
]


# A tuple, not the spec's frozenset: membership by identity, without Enum's Python-level __hash__
# (measured ~5% of a prefill step in `kvspec bench schedule`).
_TERMINAL = tuple(TERMINAL)


class Scheduler(SpecScheduler):
    """Drop-in replacement for :class:`spec.infinilm.scheduler.Scheduler`."""

    def __init__(
        self,
        max_batch_size: int = 16,
        num_blocks: int = 512,
        block_size: int = 256,
        max_num_batched_tokens: int = 1024,
        connector: KVConnector | None = None,
        has_mamba_cache: bool = False,
        num_mamba_cache_blocks: int | None = None,
        enable_prefix_caching: bool = True,
        *,
        reservation: str = "legacy",
        block_manager: BlockManager | None = None,
    ) -> None:
        super().__init__(
            max_batch_size,
            num_blocks,
            block_size,
            max_num_batched_tokens,
            connector,
            has_mamba_cache,
            num_mamba_cache_blocks,
            enable_prefix_caching,
            reservation=reservation,
            block_manager=block_manager or BlockManager(num_blocks, block_size),  # type: ignore[arg-type]
        )
        self._incremental = reservation != "legacy"
        self._num_reserved = 0  # Σ R(r) over the running queue (exact / tight only)

    def _running_required_blocks(self) -> int:
        # The scan itself, inlined (no per-request helper calls): it runs once per step on legacy.
        size = self.block_size
        if self._incremental:
            return scan_reservation(
                running_reservation(self.reservation, r, size) for r in self.running_queue
            )
        return scan_reservation(
            [
                (r.sampling_params.max_tokens - r.get_num_generated_tokens() + size - 1) // size
                for r in self.running_queue.snapshot()
            ]
        )

    @property
    def num_reserved_decode_blocks(self) -> int:
        # relies on reservation_counter_matches_scan (exact / tight); legacy has no counter
        return self._num_reserved if self._incremental else self._running_required_blocks()

    def can_accept_request(
        self,
        req: InferenceRequest,
        num_local_computed_tokens: int,
        current_prefill_extra_blocks: int = 0,
        *,
        running_required_blocks: int | None = None,
    ) -> bool:
        mamba = self.mamba_cache_manager
        if mamba is not None and req.mamba_cache_index is None and not mamba.can_allocate():
            return False
        if self._incremental:
            running = self._num_reserved
        elif running_required_blocks is None:
            running = self._running_required_blocks()
        else:
            running = running_required_blocks
        size = self.block_size
        own = req.prompt_length - num_local_computed_tokens + req.sampling_params.max_tokens
        return admits(
            running,
            (own + size - 1) // size,  # ceil_div, inlined
            self.pending_kv_decode_blocks,
            current_prefill_extra_blocks,
            self.cache_manager.get_total_usable_blocks(),
        )

    def _reserve(self, req: InferenceRequest) -> None:
        """A request joins the running queue: its decode reservation joins the counter."""
        self._num_reserved = add_reservation(
            self._num_reserved, running_reservation(self.reservation, req, self.block_size)
        )

    def _unreserve(self, req: InferenceRequest) -> None:
        """A request leaves the running queue (decode dequeue): its reservation leaves."""
        self._num_reserved = remove_reservation(
            self._num_reserved, running_reservation(self.reservation, req, self.block_size)
        )

    def complete_requests(self, requests: Iterable[InferenceRequest]) -> None:
        for req in requests:
            if req.is_finished():
                super().complete_requests((req,))
            else:
                self.running_queue.put(req)
                if self._incremental:
                    self._reserve(req)

    def _prefill_phase(self) -> list[InferenceRequest]:
        # The spec's phase, with the hot per-request helpers inlined (_place_fresh, _match_prefix,
        # _exceeds_token_budget, prefill_extra_blocks); the cold paths (_place_requeued,
        # _attach_mamba_row, _wait_for_remote) are the spec's. PR #579 on legacy: the running
        # reservation is scanned lazily, at most once per step (relies on: the running queue is
        # not touched during the prefill loop and no running request's g changes within a step).
        bm, size = self.cache_manager, self.block_size
        waiting, mamba, connector = self.waiting_queue, self.mamba_cache_manager, self.connector
        budget, max_batch = self.max_num_batched_tokens, self.max_batch_size
        has_mamba = self.has_mamba_cache
        lookup = self.enable_prefix_caching and not has_mamba
        incremental = self._incremental
        batch: list[InferenceRequest] = []
        tokens = extra = 0
        running_required: int | None = None  # PR #579: computed lazily, at most once per step
        get_waiting, allocate = waiting.get_nowait, bm.allocate_slots
        while len(batch) < max_batch and tokens < budget:
            req = get_waiting()
            if req is None:
                break
            if req.status in _TERMINAL:
                self.complete_requests((req,))
                continue
            prompt, max_tokens = req.prompt_length, req.sampling_params.max_tokens
            if req.num_computed_tokens:  # quirk §9.11, the spec's phase
                if self._place_requeued(req, tokens, len(batch)) == "deferred":
                    waiting.put(req)
                    break
            else:
                cached: list[int] = []
                local = external = 0
                is_async = False
                if lookup:
                    cached, local = bm.get_computed_blocks(req.block_hashes, prompt - 1)
                if connector is not None and not has_mamba:
                    external, is_async = connector.get_num_new_matched_tokens(req, local)
                computed = local + external  # min(local + external, max(prompt - 1, 0)):
                if computed > prompt - 1:
                    computed = prompt - 1 if prompt > 0 else 0
                # _exceeds_token_budget, inlined
                rejected = not is_async and bool(batch) and tokens + prompt - computed > budget
                if not rejected:  # the admission check is a call: an engine's hook point
                    # (snapshot_due is False once the snapshot is taken: asked only before)
                    if (
                        not incremental
                        and running_required is None
                        and snapshot_due(
                            running_required,
                            mamba is None
                            or req.mamba_cache_index is not None
                            or mamba.can_allocate(),
                        )
                    ):
                        running_required = self._running_required_blocks()
                    rejected = not self.can_accept_request(
                        req, local, extra, running_required_blocks=running_required
                    )
                allocated = None if rejected else allocate(prompt - computed, computed, cached)
                if allocated is None:
                    if local > 0:
                        bm.free_blocks(cached)
                    waiting.put(req)
                    break
                table, slots = allocated
                if mamba is not None and not self._attach_mamba_row(req, table):
                    waiting.put(req)
                    break
                req.block_table, req.slot_mapping, req.num_blocks = table, slots, len(table)
                req.num_local_cached_tokens = local if is_async else computed
                req.num_cache_indexed_blocks = len(cached)
                req.num_computed_tokens = computed
                if connector is not None:
                    connector.update_state_after_alloc(req, table, external, size)
                if is_async:
                    self._wait_for_remote(req)
                    continue
            # prefill_extra_blocks(req, size), inlined
            headroom = (prompt + max_tokens + size - 1) // size - len(req.block_table)
            if headroom > 0:
                extra += headroom
            batch.append(req)
            tokens += prompt - req.num_local_cached_tokens
            req.status = RequestStatus.RUNNING
        return batch

    def _decode_phase(self) -> list[InferenceRequest]:
        # The spec's phase, inlined (it runs once per running request per step), plus the exact
        # PR's counter: a dequeued request's reservation leaves the counter at once, before its
        # is_finished check; complete_requests puts it back on re-enqueue.
        bm, running, max_batch = self.cache_manager, self.running_queue, self.max_batch_size
        incremental = self._incremental
        batch: list[InferenceRequest] = []
        while len(batch) < max_batch:
            req = running.get_nowait()
            if req is None:
                break
            if incremental:
                self._unreserve(req)
            if req.is_finished():
                self.complete_requests((req,))
                continue
            total = req.get_total_length()
            req.block_table, slot = bm.append_slot(req.block_table, total)  # quirk §9.14
            req.slot_mapping = [slot]
            req.num_blocks = len(req.block_table)
            req.num_local_cached_tokens = total - 1
            batch.append(req)
        return batch
