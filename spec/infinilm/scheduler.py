"""InfiniLM v0.2.9c request ``Scheduler`` — the executable spec, with named reservation variants.

Source of truth: docs/infinilm.md §1.3–§1.5, §2, §5–§9. One ``schedule()`` call runs
the prefill phase, then (only if nothing was prefilled) the decode phase, then remote promotion —
each a method with its own Pre/Post: ``_prefill_phase`` (per waiting request ``_place_fresh``,
with ``_match_prefix`` and ``_attach_mamba_row``, or ``_place_requeued``; then
``_wait_for_remote`` or the batch), ``_decode_phase``, ``_promote_remote``.

Reservation variants (``reservation=``), where P = prompt length, g = generated tokens,
M = max_tokens, B = block size and ``table`` the request's block table:

* ``"legacy"`` (v0.2.9c): a running request reserves ``ceil((M - g) / B)`` fresh pages, a
  remote-pending request ``ceil(M / B)``;
* ``"exact"`` (the exact-reservation PR, ``cbdcd264``): both reserve
  ``max(ceil((P + M) / B) - len(table), 0)``;
* ``"tight"`` (kvspec's proposal, reference §7.1): both reserve the true remaining need
  ``max(ceil((P + M - 1) / B) - len(table), 0)`` — the last generated token's KV is never written.

The candidate's own term ``ceil((P - local + M) / B)`` and the current batch's prefill extra
``max(ceil((P + M) / B) - len(table), 0)`` are the same in every variant (reference §7.1).

The spec computes every reservation by scanning, as legacy does; the production scheduler keeps
counters. Legacy quirks reproduced on purpose (reference §9), each marked where it happens:
deferred head goes to the *tail* of the waiting queue (§9.5); any prefill suppresses the whole
decode phase (§9.6); the P−1 prefix-hit cap (§9.7); remote promotion ``break`` stops later
clean-ups (§9.9); cancel-after-failed-receive parks pages in ``pending_free_blocks`` without
clearing the failed id (§9.10); a partial-remote-failure requeue bypasses admission (§9.11);
remote-pending admissions ignore batch size and token budget (§9.12); the mamba allocation-failure
path leaves new pages cached (§9.13); decode OOM raises with the request already dequeued (§9.14).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from spec.errors import InvalidArgument
from spec.infinilm.block_manager import BlockManager, MambaCacheManager, ceil_div
from spec.infinilm.kernels import admits, scan_reservation
from spec.infinilm.request import InferenceRequest, RequestStatus

RESERVATIONS = ("legacy", "exact", "tight")

# Where the prefill phase put a waiting request: back to the waiting tail, into the remote-pending
# set (an asynchronous connector hit), or into this step's prefill batch.
Placement = Literal["deferred", "remote", "prefill"]


class KVConnector(Protocol):
    """The scheduler-side hooks of a PD-disaggregation connector (reference §5.3, §5.5, §5.6)."""

    def get_num_new_matched_tokens(
        self, request: InferenceRequest, num_local_computed_tokens: int
    ) -> tuple[int, bool]: ...

    def update_state_after_alloc(
        self,
        request: InferenceRequest,
        block_table: list[int],
        num_external_tokens: int,
        block_size: int,
    ) -> None: ...

    def request_finished(
        self, request: InferenceRequest, block_table: list[int], block_size: int
    ) -> tuple[bool, Any]: ...

    def build_connector_meta(self) -> Any:
        """The metadata the connector wants attached to the step's output (no arguments:
        upstream's base class builds it from what the other hooks told it since the last call)."""


@dataclass
class KVConnectorOutput:
    """Connector events reported by the model runner after a step (reference §5.6)."""

    finished_recving: set[str] = field(default_factory=set)
    finished_sending: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)


@dataclass
class ModelRunnerOutput:
    kv_connector_output: KVConnectorOutput | None = None


class RequestQueue:
    """A FIFO queue with the ``janus.Queue().sync_q`` surface the scheduler uses."""

    def __init__(self) -> None:
        self._items: deque[InferenceRequest] = deque()

    @property
    def sync_q(self) -> RequestQueue:
        return self

    def put(self, item: InferenceRequest) -> None:
        self._items.append(item)

    def get_nowait(self) -> InferenceRequest | None:
        """The head, or ``None`` when empty (upstream catches ``queue.Empty`` and breaks)."""
        return self._items.popleft() if self._items else None

    def qsize(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def snapshot(self) -> tuple[InferenceRequest, ...]:
        """The queued requests, head first, as a tuple: a copy, so later puts and gets (and a
        caller's scan over it) leave each other alone. O(n), no queue operations."""
        return tuple(self._items)

    def __iter__(self) -> Iterator[InferenceRequest]:
        return iter(self.snapshot())


class SpeculativeCacheOps:
    """What the speculative runner may do to a request's pages during a step (reference §1.5)."""

    def __init__(self, block_manager: BlockManager) -> None:
        self.block_manager = block_manager

    def append_verify_slots(
        self, block_table: list[int], start_num_tokens: int, num_slots: int
    ) -> tuple[list[int], list[int]]:
        return self.block_manager.append_slots(block_table, start_num_tokens, num_slots)

    def rollback_to_length(self, block_table: Sequence[int], keep_num_tokens: int) -> list[int]:
        return self.block_manager.truncate_blocks(block_table, keep_num_tokens)


@dataclass
class SchedulerOutput:
    scheduled_requests: list[InferenceRequest]
    is_prefill: bool
    speculative_cache_ops: SpeculativeCacheOps | None = None
    kv_connector_metadata: Any = None

    @property
    def num_requests(self) -> int:
        return len(self.scheduled_requests)


# ---------------------------------------------------------------------------- reservation formulas
def legacy_running_blocks(req: InferenceRequest, block_size: int) -> int:
    """Legacy running reservation: ``ceil((M - g) / B)`` fresh pages (ignores last-page room)."""
    return ceil_div(req.sampling_params.max_tokens - req.get_num_generated_tokens(), block_size)


def exact_blocks(req: InferenceRequest, block_size: int) -> int:
    """``max(ceil((P + M) / B) - len(table), 0)`` (the exact-reservation PR's ``R_exact``)."""
    total = req.get_prompt_length() + req.sampling_params.max_tokens
    return max(ceil_div(total, block_size) - len(req.block_table), 0)


def tight_blocks(req: InferenceRequest, block_size: int) -> int:
    """The true remaining need ``max(ceil((P + M - 1) / B) - len(table), 0)`` (reference §7.1)."""
    total = req.get_prompt_length() + req.sampling_params.max_tokens - 1
    return max(ceil_div(total, block_size) - len(req.block_table), 0)


def running_reservation(variant: str, req: InferenceRequest, block_size: int) -> int:
    if variant == "legacy":
        return legacy_running_blocks(req, block_size)
    return exact_blocks(req, block_size) if variant == "exact" else tight_blocks(req, block_size)


def remote_reservation(variant: str, req: InferenceRequest, block_size: int) -> int:
    if variant == "legacy":
        return ceil_div(req.sampling_params.max_tokens, block_size)
    return exact_blocks(req, block_size) if variant == "exact" else tight_blocks(req, block_size)


def prefill_extra_blocks(req: InferenceRequest, block_size: int) -> int:
    """Decode headroom of a request admitted earlier in the same batch (every variant)."""
    return exact_blocks(req, block_size)


class Scheduler:
    """Waiting queue, running queue, remote-pending requests, the block and mamba managers."""

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
        if reservation not in RESERVATIONS:
            raise InvalidArgument(
                f"reservation must be one of {', '.join(RESERVATIONS)}, got {reservation!r}"
            )
        for name, value in (
            ("max_batch_size", max_batch_size),
            ("max_num_batched_tokens", max_num_batched_tokens),
        ):
            if not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
        self.reservation = reservation
        self.max_batch_size = max_batch_size
        self.block_size = block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.connector = connector
        self.has_mamba_cache = has_mamba_cache
        self.enable_prefix_caching = enable_prefix_caching
        self.cache_manager = block_manager or BlockManager(num_blocks, block_size)
        self.mamba_cache_manager = (
            MambaCacheManager(num_mamba_cache_blocks or max(2, num_blocks // 4))
            if has_mamba_cache
            else None
        )
        self.speculative_cache_ops = SpeculativeCacheOps(self.cache_manager)
        self.waiting_queue = RequestQueue()
        self.running_queue = RequestQueue()
        self.remote_kv_requests: dict[str, InferenceRequest] = {}
        self.finished_receiving_kv_req_ids: set[str] = set()
        self.failed_receiving_kv_req_ids: set[str] = set()
        self.pending_free_blocks: dict[str, list[int]] = {}
        self.pending_kv_decode_blocks = 0

    # ----------------------------------------------------------------- reservations
    def _running_required_blocks(self) -> int:
        """Σ over the running queue of the variant's running reservation.

        Legacy's scan (reference §5.4): dequeue and re-enqueue every running request once, so the
        queue order is unchanged (reference §8.2 invariant 12) at O(R) queue operations per call.
        """
        queue = self.running_queue.sync_q
        needs = []
        for _ in range(queue.qsize()):
            req = queue.get_nowait()
            assert req is not None
            needs.append(running_reservation(self.reservation, req, self.block_size))
            queue.put(req)
        return scan_reservation(needs)

    @property
    def num_reserved_decode_blocks(self) -> int:
        """The running queue's decode reservation (the exact PR's counter; here, a scan)."""
        return self._running_required_blocks()

    def _remote_blocks(self, req: InferenceRequest) -> int:
        return remote_reservation(self.reservation, req, self.block_size)

    def can_accept_request(
        self,
        req: InferenceRequest,
        num_local_computed_tokens: int,
        current_prefill_extra_blocks: int = 0,
        *,
        running_required_blocks: int | None = None,
    ) -> bool:
        """Admission (reference §5.4, §6, §7).

        True iff running reservations + the candidate's own ``ceil((P - local + M) / B)`` +
        remote-pending reservations + earlier admits' prefill extra fit in the usable pages
        (evaluated after the candidate's prefix pages were pinned). The mamba pre-check runs first.
        ``running_required_blocks`` (keyword-only, PR #579) is a value computed earlier in the same
        step; ``None`` scans.
        """
        mamba = self.mamba_cache_manager
        if mamba is not None and req.mamba_cache_index is None and not mamba.can_allocate():
            return False
        running = (
            self._running_required_blocks()
            if running_required_blocks is None
            else running_required_blocks
        )
        own = ceil_div(
            req.get_prompt_length() - num_local_computed_tokens + req.sampling_params.max_tokens,
            self.block_size,
        )
        return admits(
            running,
            own,
            self.pending_kv_decode_blocks,
            current_prefill_extra_blocks,
            self.cache_manager.get_total_usable_blocks(),
        )

    # ----------------------------------------------------------------- request entry
    def add_request(self, req: InferenceRequest) -> None:
        """Hash the prompt blocks (unless caching is off for it) and append to the waiting queue."""
        enabled = (
            self.enable_prefix_caching
            and not self.has_mamba_cache
            and not req.has_multimodal_inputs
        )
        req.initialize_block_hashes(self.block_size, enabled)
        req.status = RequestStatus.WAITING
        self.waiting_queue.sync_q.put(req)

    def _exceeds_token_budget(self, current: int, new_tokens: int, batch_len: int) -> bool:
        # the first request of a batch always passes
        return batch_len > 0 and current + new_tokens > self.max_num_batched_tokens

    # ----------------------------------------------------------------- schedule
    # One step is a short sequence of phases (reference §5.3). Each phase reads and writes the
    # scheduler's state only through the methods it names, so a production scheduler can override
    # one phase (a faster loop, a counter kept on the side) and inherit the others.
    def schedule(self) -> SchedulerOutput | None:
        """One scheduling step (reference §5.3): prefill phase; else decode phase + promotion.

        Pre: none (client aborts were applied to the requests before the call).
        Post: a prefill batch if any waiting request was admitted (quirk §9.6: then no request
        decodes); else a decode batch of running requests followed by promoted remote requests;
        else, with a connector, an empty batch (it still carries connector metadata); else
        ``None``.
        """
        batch = self._prefill_phase()
        if batch:  # quirk §9.6: any prefill suppresses the decode phase
            return self._output(batch, is_prefill=True)
        batch = self._decode_phase()
        if self.connector is not None:
            self._promote_remote(batch)
        if batch:
            return self._output(batch, is_prefill=False)
        if self.connector is not None:
            return self._output([], is_prefill=False)
        return None

    def _prefill_phase(self) -> list[InferenceRequest]:
        """Admit waiting requests, head first, into this step's prefill batch.

        Pre: none.
        Post: the batch lists the admitted requests in waiting order, each RUNNING with its pages;
        the loop stopped at a full batch, a spent token budget, an empty waiting queue or the first
        request that could not be placed — that one went to the waiting *tail* (quirk §9.5).
        Finished requests met on the way were completed; asynchronous remote hits left for the
        remote-pending set without counting toward the batch (quirk §9.12).
        """
        batch: list[InferenceRequest] = []
        tokens = 0  # the batch's new (uncached) prompt tokens
        extra = 0  # current_prefill_extra_blocks: the batch's decode headroom
        while len(batch) < self.max_batch_size and tokens < self.max_num_batched_tokens:
            req = self.waiting_queue.sync_q.get_nowait()
            if req is None:
                break
            if req.is_finished():
                self.complete_requests([req])
                continue
            if req.num_computed_tokens == 0:  # fresh (or fully failed remote) request
                placed = self._place_fresh(req, tokens, extra, len(batch))
            else:
                placed = self._place_requeued(req, tokens, len(batch))
            if placed == "deferred":
                self.waiting_queue.sync_q.put(req)  # quirk §9.5: the deferred head goes to the TAIL
                break
            if placed == "remote":
                self._wait_for_remote(req)
                continue
            extra += prefill_extra_blocks(req, self.block_size)
            batch.append(req)
            tokens += req.get_prompt_length() - req.num_local_cached_tokens
            req.status = RequestStatus.RUNNING
        return batch

    def _place_fresh(
        self, req: InferenceRequest, tokens: int, extra: int, batch_len: int
    ) -> Placement:
        """Find a fresh request its pages: prefix and connector hits, budget, admission, allocation.

        Pre: ``req`` was just dequeued, live, with ``num_computed_tokens == 0``; ``tokens``,
        ``extra`` and ``batch_len`` describe the prefill batch built so far in this step.
        Post: ``"deferred"`` when the token budget (skipped for an asynchronous hit), admission,
        allocation or the mamba row fails — then the lookup's pins are released and the request's
        fields are unchanged (quirk §9.13 aside: a failed mamba row leaves the new pages cached).
        Otherwise its table, slots and counters are set, the connector is told, and the answer is
        ``"remote"`` for an asynchronous connector hit, ``"prefill"`` for a local prefill.
        """
        bm, prompt = self.cache_manager, req.get_prompt_length()
        cached, local, external, is_async = self._match_prefix(req)
        computed = min(local + external, max(prompt - 1, 0))  # quirk §9.7: at most P - 1 tokens
        over_budget = not is_async and self._exceeds_token_budget(
            tokens, prompt - computed, batch_len
        )
        allocated = None
        if not over_budget and self.can_accept_request(req, local, extra):
            allocated = bm.allocate_slots(prompt - computed, computed, cached)
        if allocated is None:
            if local > 0:
                bm.free_blocks(cached)  # unpin the prefix hit
            return "deferred"
        table, slots = allocated
        if not self._attach_mamba_row(req, table):
            return "deferred"
        req.block_table, req.slot_mapping, req.num_blocks = table, slots, len(table)
        req.num_local_cached_tokens = local if is_async else computed
        req.num_cache_indexed_blocks = len(cached)
        req.num_computed_tokens = computed
        if self.connector is not None:
            self.connector.update_state_after_alloc(req, table, external, self.block_size)
        return "remote" if is_async else "prefill"

    def _match_prefix(self, req: InferenceRequest) -> tuple[list[int], int, int, bool]:
        """The prefix hits of a fresh request: ``(cached pages, local tokens, external, is_async)``.

        Pre: ``req`` is fresh. Post: with prefix caching on, the index's longest hit over at most
        ``P - 1`` prompt tokens (quirk §9.7), its pages PINNED; then the connector's external
        tokens and whether they arrive asynchronously. A model with a mamba cache has neither
        (reference §5.3): ``([], 0, 0, False)``, nothing pinned.
        """
        cached: list[int] = []
        local, external, is_async = 0, 0, False
        if self.has_mamba_cache:
            return cached, local, external, is_async
        if self.enable_prefix_caching:
            cached, local = self.cache_manager.get_computed_blocks(
                req.block_hashes, req.get_prompt_length() - 1
            )
        if self.connector is not None:
            external, is_async = self.connector.get_num_new_matched_tokens(req, local)
        return cached, local, external, is_async

    def _attach_mamba_row(self, req: InferenceRequest, table: list[int]) -> bool:
        """Give a request that was just allocated ``table`` its mamba state row, if it needs one.

        Pre: ``table`` is the request's fresh allocation. Post: ``True`` when there is no mamba
        cache, the request already has a row, or a row was allocated to it; ``False`` when no row
        was free — then ``table`` was released with ``free_blocks`` (quirk §9.13: its new pages
        stay in ``used`` with ref 0, cached).
        """
        mamba = self.mamba_cache_manager
        if mamba is None or req.mamba_cache_index is not None:
            return True
        req.mamba_cache_index = mamba.allocate()
        if req.mamba_cache_index is not None:
            return True
        self.cache_manager.free_blocks(table)  # quirk §9.13: new pages stay cached (ref 0)
        return False

    def _place_requeued(self, req: InferenceRequest, tokens: int, batch_len: int) -> Placement:
        """Quirk §9.11: a request re-queued after a partial remote failure bypasses admission.

        Pre: ``req`` was just dequeued, live, with ``num_computed_tokens > 0`` (it still holds its
        pages); ``tokens`` and ``batch_len`` describe the prefill batch so far.
        Post: ``"deferred"`` when its uncached tokens exceed the token budget, nothing changed;
        else its computed pages are published and the answer is ``"prefill"`` (no admission
        check, no allocation).
        """
        uncached = req.get_prompt_length() - req.num_local_cached_tokens
        if self._exceeds_token_budget(tokens, uncached, batch_len):
            return "deferred"
        self.commit_computed_tokens(req, req.num_computed_tokens)
        return "prefill"

    def _wait_for_remote(self, req: InferenceRequest) -> None:
        """Quirk §9.12: an asynchronous connector hit waits for its KV outside the batch.

        Pre: ``req`` holds the pages its remote KV will be written into.
        Post: ``req`` is WAITING_FOR_REMOTE_KVS, the last entry of ``remote_kv_requests``, and its
        remote reservation is added to ``pending_kv_decode_blocks``; the batch size and token
        budget are not charged.
        """
        req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        self.remote_kv_requests[req.request_id] = req
        self.pending_kv_decode_blocks += self._remote_blocks(req)

    def _decode_phase(self) -> list[InferenceRequest]:
        """One decode slot for each running request, head first, up to the batch size.

        Pre: nothing was prefilled in this step (quirk §9.6).
        Post: the batch lists the dequeued live requests in running order, each with one more
        slot (``slot_mapping`` is that slot) and ``num_local_cached_tokens == P + g - 1``;
        finished requests met on the way were completed. Quirk §9.14: when the pool runs out,
        ``append_slot`` raises OutOfBlocksError with the request already dequeued (it is lost).
        """
        bm = self.cache_manager
        batch: list[InferenceRequest] = []
        while len(batch) < self.max_batch_size:
            req = self.running_queue.sync_q.get_nowait()
            if req is None:
                break
            if req.is_finished():
                self.complete_requests([req])
                continue
            # quirk §9.14: raises OutOfBlocksError with the request already dequeued
            req.block_table, slot = bm.append_slot(req.block_table, req.get_total_length())
            req.slot_mapping = [slot]
            req.num_blocks = len(req.block_table)
            req.num_local_cached_tokens = req.get_total_length() - 1
            batch.append(req)
        return batch

    def _promote_remote(self, batch: list[InferenceRequest]) -> None:
        """Settle the remote-pending requests, in insertion order, after the decode phase.

        Pre: a connector is attached; ``batch`` is this step's decode batch.
        Post: finished remote requests were completed; failed receives left the remote state and
        went to the waiting tail (WAITING); finished receives left it and joined ``batch``
        (RUNNING) while the batch had room. Quirk §9.9: the first finished receive that does not
        fit stops the whole loop, so later remote requests are not even cleaned up this step.
        """
        for request_id in list(self.remote_kv_requests):  # insertion order
            req = self.remote_kv_requests[request_id]
            if req.is_finished():
                self.complete_requests([req])
                continue
            if request_id in self.failed_receiving_kv_req_ids:
                self.update_waiting_for_remote_kv(req)
                req.status = RequestStatus.WAITING
                self.waiting_queue.sync_q.put(req)
            elif request_id in self.finished_receiving_kv_req_ids:
                if len(batch) >= self.max_batch_size:
                    break  # quirk §9.9: stops the whole loop, later clean-ups included
                self.update_waiting_for_remote_kv(req)
                req.status = RequestStatus.RUNNING
                batch.append(req)

    def _output(self, batch: list[InferenceRequest], *, is_prefill: bool) -> SchedulerOutput:
        out = SchedulerOutput(batch, is_prefill, self.speculative_cache_ops)
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta()
        return out

    # ----------------------------------------------------------------- after a step
    def complete_requests(self, requests: Iterable[InferenceRequest]) -> None:
        """Release finished requests; re-enqueue the others at the running tail (reference §5.5).

        A finished request's pages are released, or parked in ``pending_free_blocks`` while a
        transfer may still touch them (connector ``delay``, or a remote request whose receive has
        not finished — quirk §9.10 when it had failed). ``block_table`` is not cleared.
        """
        for req in requests:
            if not req.is_finished():
                self.running_queue.sync_q.put(req)
                continue
            delay = False
            if self.connector is not None:
                delay = self.connector.request_finished(req, req.block_table, self.block_size)[0]
            request_id = req.request_id
            if request_id in self.remote_kv_requests:
                self.pending_kv_decode_blocks -= self._remote_blocks(req)
                del self.remote_kv_requests[request_id]
                if request_id in self.finished_receiving_kv_req_ids:
                    self.finished_receiving_kv_req_ids.discard(request_id)
                    self.failed_receiving_kv_req_ids.discard(request_id)
                else:
                    delay = True  # the transfer may still write into the pages
            if req.block_table and not delay:
                self.cache_manager.free_blocks(req.block_table)
            elif req.block_table:
                self.pending_free_blocks[request_id] = list(req.block_table)
            if self.mamba_cache_manager is not None:
                self.mamba_cache_manager.free(req.mamba_cache_index)
                req.mamba_cache_index = None

    def commit_computed_tokens(self, req: InferenceRequest, num_computed_tokens: int) -> None:
        """Deferred publication of the computed full pages (reference §5.7)."""
        if not self.enable_prefix_caching or self.has_mamba_cache:
            return
        target = min(
            num_computed_tokens // self.block_size, len(req.block_table), len(req.block_hashes)
        )
        if target == req.num_cache_indexed_blocks:
            return
        req.num_cache_indexed_blocks = self.cache_manager.publish_computed_blocks(
            req.block_table, req.block_hashes, req.num_cache_indexed_blocks, num_computed_tokens
        )

    def update_from_output(self, output: ModelRunnerOutput) -> None:
        """Act on connector events (reference §5.6 step order: received, sent, failed)."""
        events = output.kv_connector_output
        if self.connector is None or events is None:
            return
        for request_id in events.finished_recving:
            if request_id in self.pending_free_blocks:  # aborted while receiving: transfer done
                self.cache_manager.free_blocks(self.pending_free_blocks.pop(request_id))
            elif request_id in self.remote_kv_requests:
                self.finished_receiving_kv_req_ids.add(request_id)
        for request_id in events.finished_sending:
            self.cache_manager.free_blocks(self.pending_free_blocks.pop(request_id, []))
        for request_id in events.failed_recving:
            req = self.remote_kv_requests.get(request_id)
            if req is None:
                continue
            self.failed_receiving_kv_req_ids.add(request_id)
            if req.has_multimodal_inputs:
                req.num_computed_tokens = 0
                continue
            boundary = req.num_local_cached_tokens
            for index in range(req.num_cache_indexed_blocks, len(req.block_table)):
                if req.block_table[index] in events.invalid_block_ids:
                    boundary = min(req.num_computed_tokens, index * self.block_size)
                    break
            req.num_computed_tokens = boundary

    def update_waiting_for_remote_kv(self, req: InferenceRequest) -> None:
        """Leave the remote-pending state (reference §5.6)."""
        request_id = req.request_id
        del self.remote_kv_requests[request_id]
        self.pending_kv_decode_blocks -= self._remote_blocks(req)
        if request_id in self.failed_receiving_kv_req_ids:
            n = req.num_computed_tokens
            if n > 0:
                self.commit_computed_tokens(req, n)
                req.slot_mapping = self.cache_manager.update_blocks_slot(
                    req.block_table, n, req.get_prompt_length()
                )
                req.num_local_cached_tokens = n
            else:
                self.cache_manager.free_blocks(req.block_table)
                req.block_table, req.slot_mapping, req.num_local_cached_tokens = [], [], 0
            self.failed_receiving_kv_req_ids.discard(request_id)
        else:
            self.commit_computed_tokens(req, req.num_computed_tokens)
            req.num_local_cached_tokens = req.num_computed_tokens
        self.finished_receiving_kv_req_ids.discard(request_id)

    # ----------------------------------------------------------------- stats
    def get_cache_stats(self) -> dict[str, int]:
        """Pool statistics (reference §5.8); exact and tight add ``num_reserved_decode_blocks``."""
        bm = self.cache_manager
        stats = {
            "num_blocks": bm.num_blocks,
            "block_size": bm.block_size,
            "num_free_blocks": bm.get_num_free_blocks(),
            "usable_blocks": bm.get_total_usable_blocks(),
            "num_used_blocks": len(bm.used_block_ids),
        }
        if self.reservation != "legacy":  # the exact PR's key (tight reports it too)
            stats["num_reserved_decode_blocks"] = self.num_reserved_decode_blocks
        mamba = self.mamba_cache_manager
        if mamba is not None:  # upstream's keys; the total counts the reserved zero row too
            stats["num_mamba_cache_blocks"] = mamba.num_blocks
            stats["num_free_mamba_cache_blocks"] = len(mamba.free_block_ids)
            stats["num_used_mamba_cache_blocks"] = len(mamba.used_block_ids)
        return stats
