"""InfiniLM's request model, as far as the scheduler reads it (docs/infinilm.md §1.4, §2).

The field names are upstream's so that a snapshot reader fits both. Hashing: one chained
``hash_block_tokens`` digest per *full* block of prompt + output (generated-token blocks are hashed
too, so they can be published as well).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from spec.errors import InvalidArgument
from spec.infinilm.prefix_cache import EMPTY_BLOCK_HASH, hash_block_tokens


class RequestStatus(Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    FINISHED = "finished"
    CANCELED = "canceled"
    TIMEOUT = "timeout"
    FAILED = "failed"


class FinishReason(Enum):
    """Why a request finished (upstream's values; the scheduler only logs it)."""

    EOS_TOKEN = "eos_token"
    STOP_STRING = "stop_string"
    STOP = "stop"
    LENGTH = "length"
    CANCELED = "canceled"
    TIMEOUT = "timeout"
    ERROR = "error"


TERMINAL = frozenset(
    {RequestStatus.FINISHED, RequestStatus.CANCELED, RequestStatus.TIMEOUT, RequestStatus.FAILED}
)


@dataclass
class SamplingParams:
    """Only ``max_tokens`` matters to the scheduler (M; upstream default 512)."""

    max_tokens: int = 512


class InferenceRequest:
    """One request: prompt, generated tokens, block table and prefix-hash state."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams | None = None,
        *,
        has_multimodal_inputs: bool = False,
        kv_transfer_params: dict[str, Any] | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.prompt_length = len(self.prompt_token_ids)
        self.sampling_params = sampling_params or SamplingParams()
        if not isinstance(self.sampling_params.max_tokens, int):
            raise InvalidArgument(
                f"max_tokens must be an int (reference §9.16), got "
                f"{self.sampling_params.max_tokens!r}"
            )
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.block_table: list[int] = []
        self.slot_mapping: list[int] = []
        self.num_blocks = 0
        self.num_computed_tokens = 0
        self.num_local_cached_tokens = 0
        self.num_cache_indexed_blocks = 0
        self.mamba_cache_index: int | None = None
        self.has_multimodal_inputs = has_multimodal_inputs
        self.kv_transfer_params = kv_transfer_params
        self._generated_token_ids: list[int] = []
        self._block_hashes: list[bytes] = []
        self._hash_tail: list[int] = []
        self._hash_config: tuple[int, bool] | None = None

    # ----------------------------------------------------------------- lengths
    def get_prompt_length(self) -> int:
        return self.prompt_length

    def get_num_generated_tokens(self) -> int:
        return len(self._generated_token_ids)

    def get_total_length(self) -> int:
        return self.prompt_length + len(self._generated_token_ids)

    def is_finished(self) -> bool:
        return self.status in TERMINAL

    # ----------------------------------------------------------------- terminal marks
    # What the engine (and a client abort) calls; upstream also stamps a finish time and an abort
    # flag for its output stream, which the scheduler never reads.
    def mark_finished(self, reason: FinishReason) -> None:
        """Post: ``FINISHED`` with ``reason``."""
        self.status, self.finish_reason = RequestStatus.FINISHED, reason

    def mark_failed(self, reason: FinishReason = FinishReason.ERROR) -> None:
        """Post: ``FAILED`` with ``reason``."""
        self.status, self.finish_reason = RequestStatus.FAILED, reason

    def mark_canceled(self) -> None:
        """Post: ``CANCELED`` (a client abort)."""
        self.status, self.finish_reason = RequestStatus.CANCELED, FinishReason.CANCELED

    def mark_timeout(self) -> None:
        """Post: ``TIMEOUT``."""
        self.status, self.finish_reason = RequestStatus.TIMEOUT, FinishReason.TIMEOUT

    # ----------------------------------------------------------------- hashing
    @property
    def block_hashes(self) -> tuple[bytes, ...]:
        """Read-only view of the chained hashes of every full block so far."""
        return tuple(self._block_hashes)

    def initialize_block_hashes(self, block_size: int, enabled: bool) -> None:
        """Hash every full prompt block (once; a different (B, enabled) later is an error)."""
        config = (block_size, enabled)
        if self._hash_config is not None:
            if self._hash_config != config:
                raise RuntimeError(
                    f"block hashes of {self.request_id} were initialised with {self._hash_config}, "
                    f"not {config}"
                )
            return
        self._hash_config = config
        if not enabled:
            return
        full = self.prompt_length // block_size * block_size
        parent = EMPTY_BLOCK_HASH
        for start in range(0, full, block_size):
            parent = hash_block_tokens(self.prompt_token_ids[start : start + block_size], parent)
            self._block_hashes.append(parent)
        self._hash_tail = self.prompt_token_ids[full:]

    def append_generated_token_id(self, token_id: int) -> None:
        """Record a sampled token; a block of ``B`` tail tokens becomes one more hash."""
        self._generated_token_ids.append(token_id)
        if self._hash_config is None or not self._hash_config[1]:
            return
        block_size = self._hash_config[0]
        self._hash_tail.append(token_id)
        if len(self._hash_tail) == block_size:
            parent = self._block_hashes[-1] if self._block_hashes else EMPTY_BLOCK_HASH
            self._block_hashes.append(hash_block_tokens(self._hash_tail, parent))
            self._hash_tail = []

    def __repr__(self) -> str:
        return (
            f"InferenceRequest({self.request_id!r}, P={self.prompt_length}, "
            f"g={self.get_num_generated_tokens()}, M={self.sampling_params.max_tokens}, "
            f"{self.status.name}, table={self.block_table})"
        )
