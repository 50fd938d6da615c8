"""vLLM v1's ``KVCacheManager`` for one full-attention group, and on 0.34 with further
sliding-window and chunked-local groups through the hybrid coordinator — the executable spec.

Source of truth: docs/vllm.md §5.3 and docs/vllm-kv-cache-manager.md §2–§6 (releases 0.28.0 to
0.33.0); docs/vllm-hybrid-groups.md (0.34's groups). The manager owns a
:class:`~spec.vllm.block_pool.BlockPool` and one single-type manager per group
(``coordinator.single_type_managers``: ``req_to_blocks``, ``num_cached_block``), under upstream's
attribute names so that the same snapshot reader reads an upstream manager. The scheduler is *not*
here: callers set ``request.num_computed_tokens`` and ``request.status`` themselves and append
output tokens (docs/vllm-kv-cache-manager.md §5).

Variants (constructor keywords, defaults = 0.33.0; docs/vllm-kv-cache-manager.md §3):

* ``free_order``: ``"unhashed_first"`` (#42656, all six releases) or ``"classic"``;
* ``adopt_computed_tokens``: ``allocate_slots`` with no new and no external tokens but prefix hits
  to adopt is accepted (0.31+) instead of raising ``ValueError``;
* ``common_prefix_blocks``: ``"count"`` (up to 0.31: leading blocks shared by every request
  holding blocks), ``"deprecated"`` (0.32–0.33: ``[0]``) or ``"removed"`` (0.34: no such method;
  kvspec's checker does not call it);
* ``hit_length_cap``: ``get_computed_blocks(request, max_cache_hit_length)`` (0.33+);
* ``hit_length_clamp``: that bound is clamped to ``num_tokens - 1`` (0.34: an explicit bound can
  only lower the hit, so a bound past the prompt no longer lets the last token be a hit).

Quirks reproduced (upstream behaviour, named):

* *tracked-without-hash* — a request whose first step cached no full block has no
  ``num_cached_block`` entry, so its next ``allocate_slots`` takes the new-request path;
* *common-prefix-creates-entry* (``count``) — asking for the common prefix of an unknown request
  id adds an empty ``req_to_blocks`` entry (upstream's ``defaultdict``), which then counts as a
  request holding blocks;
* *clamp* — slots are never allocated past ``max_model_len`` (``min(…, max_model_len)``).

Where kvspec is stricter than upstream (bad input only, validated before any change;
docs/vllm-kv-cache-manager.md §6): negative counts, prefix hits whose token count is not
``len(blocks) * block_size``, hits for a request with computed tokens, and requests longer than
``max_model_len`` are ``InvalidArgument``; hits for a request that already holds blocks are
``RequestStateError`` (an ``AssertionError``, as upstream's own check).
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from spec.errors import InvalidArgument, RequestStateError
from spec.vllm.block_pool import (
    FREE_ORDERS,
    BlockHash,
    BlockPool,
    FreeOrder,
    KVCacheBlock,
    KVCacheEvent,
)
from spec.vllm.single_type_managers import (
    GROUP_KINDS,
    FullAttentionManager,
    LocalManager,
    MambaManager,
    cdiv,
    local_manager,
)

RELEASES: tuple[str, ...] = ("0.28", "0.29", "0.30", "0.31", "0.32", "0.33", "0.34")
VARIANTS: tuple[str, ...] = ("unhashed_first", "classic", *(f"r{r}" for r in RELEASES))
"""Named variants, the default first: #42656's free order with the newest release's API
(``unhashed_first`` = ``r0.33``), the pre-#42656 ``classic`` order, and each release."""

CommonPrefix = Literal["count", "deprecated", "removed"]


def variant_keywords(variant: str) -> dict[str, Any]:
    """The constructor keywords of ``variant`` (nothing for the default)."""
    if variant not in VARIANTS:
        raise InvalidArgument(f"unknown variant {variant!r}; choose one of {VARIANTS}")
    if variant == "classic":
        return {"free_order": "classic"}
    if not variant.startswith("r"):
        return {}
    minor = int(variant.split(".")[1])
    return {
        "adopt_computed_tokens": minor >= 31,
        "common_prefix_blocks": "count"
        if minor <= 31
        else ("deprecated" if minor <= 33 else "removed"),
        "hit_length_cap": minor >= 33,
        "hit_length_clamp": minor >= 34,
    }


def further_groups(
    sliding_window: int, attention_groups: Sequence[tuple[str, int]], use_eagle: bool
) -> list[tuple[str, int]]:
    """The KV cache groups after full attention: a ``sliding_window`` (if > 0), then
    ``attention_groups``. Pre (``InvalidArgument``): sizes are ints >= 1 (``sliding_window``
    >= 0), kinds are known, no two groups are equal (upstream would merge them into one
    lookup group, which kvspec does not model), and chunked local attention runs without EAGLE
    (upstream asserts it at the first lookup)."""
    if not isinstance(sliding_window, int) or sliding_window < 0:
        raise InvalidArgument(f"sliding_window must be an int >= 0, got {sliding_window!r}")
    groups = [("sliding_window", sliding_window)] if sliding_window else []
    for entry in attention_groups:
        if not isinstance(entry, tuple | list) or len(entry) != 2:
            raise InvalidArgument(f"a KV cache group is (kind, tokens), got {entry!r}")
        kind, size = entry
        if kind not in GROUP_KINDS:
            raise InvalidArgument(
                f"unknown KV cache group kind {kind!r}; choose from {GROUP_KINDS}"
            )
        if not isinstance(size, int) or isinstance(size, bool) or size < (kind != "mamba"):
            raise InvalidArgument(f"the {kind} group needs an int size >= 1, got {size!r}")
        if kind == "mamba" and size:
            raise InvalidArgument(f"a mamba group has no span: its size is 0, got {size!r}")
        if (kind, size) in groups:
            raise InvalidArgument(f"two equal KV cache groups {(kind, size)} (not modelled)")
        if kind == "chunked_local" and use_eagle:
            raise InvalidArgument("chunked local attention does not support EAGLE")
        groups.append((kind, size))
    return groups


# ----------------------------------------------------------------------------- requests
class RequestStatus(enum.IntEnum):
    """The request states the manager reads (the watermark applies to WAITING and PREEMPTED)."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()


def hash_block_tokens(parent: BlockHash | None, tokens: Sequence[int]) -> BlockHash:
    """kvspec's block hash, chained like upstream's and the same in every process (no NONE_HASH
    seed): the readable token text of the prefix, ``b"1,2/3,4"``; past 96 bytes a digest of that
    text, ``b"#…"`` (so long prompts keep short hashes)."""
    text = ",".join(str(t) for t in tokens).encode()
    full = text if parent is None else parent + b"/" + text
    return (
        full
        if len(full) <= 96
        else b"#" + hashlib.blake2b(full, digest_size=12).hexdigest().encode()
    )


class Request:
    """The request fields the manager reads (upstream names). ``block_hashes`` holds the chained
    hash of every full block of ``all_token_ids`` and grows as output tokens are appended."""

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int], block_size: int) -> None:
        if not prompt_token_ids:
            raise InvalidArgument("a request needs at least one prompt token")
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.all_token_ids = list(prompt_token_ids)
        self.block_size = block_size
        self.block_hashes: list[BlockHash] = []
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_preemptions = 0
        self.skip_reading_prefix_cache = False
        self.num_in_flight_tokens = 0
        self.shared_prefix_boundary = 0
        self.lora_request = None
        self.mm_features: list[Any] = []
        self.session_id = None
        self.cache_salt = None
        self.prompt_embeds = None
        self._hash_new_full_blocks()

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        self.all_token_ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        self._hash_new_full_blocks()

    def _hash_new_full_blocks(self) -> None:
        bs = self.block_size
        while (len(self.block_hashes) + 1) * bs <= len(self.all_token_ids):
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else None
            tokens = self.all_token_ids[i * bs : (i + 1) * bs]
            self.block_hashes.append(hash_block_tokens(parent, tokens))


# ----------------------------------------------------------------------------- results
@dataclass
class KVCacheBlocks:
    """Blocks per KV-cache group (one group here): ``blocks[0]`` is the list (of spec or impl
    blocks: the type is the interface between the scheduler and either manager)."""

    blocks: tuple[Sequence[Any], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)


@dataclass
class KVCacheCoordinator:
    """Upstream's unitary coordinator, reduced to the attributes callers read."""

    block_pool: BlockPool
    single_type_managers: tuple[FullAttentionManager, ...]

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, num_computed_tokens)


# ----------------------------------------------------------------------------- the manager
class KVCacheManager:
    """Prefix-cache bookkeeping for one full-attention KV-cache group (block 0 is the null
    block; ``num_blocks - 1`` blocks are usable)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        *,
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = False,
        watermark: float = 0.0,
        free_order: FreeOrder = "unhashed_first",
        adopt_computed_tokens: bool = True,
        common_prefix_blocks: CommonPrefix = "deprecated",
        hit_length_cap: bool = True,
        hit_length_clamp: bool = False,
        sliding_window: int = 0,
        attention_groups: Sequence[tuple[str, int]] = (),
    ) -> None:
        """Pre: positive sizes, ``watermark >= 0``, known variant values, valid groups
        (:func:`further_groups`; ``InvalidArgument``). ``sliding_window > 0`` adds a KV cache
        group, a sliding window of that many tokens with the same block size (vLLM 0.34's
        hybrid coordinator); ``attention_groups`` adds more after it, ``(kind, tokens)`` with
        the kinds of :data:`~spec.vllm.single_type_managers.GROUP_KINDS`."""
        if block_size < 1 or max_model_len < 1 or watermark < 0:
            raise InvalidArgument("block_size and max_model_len must be >= 1, watermark >= 0")
        further = further_groups(sliding_window, attention_groups, use_eagle)
        if free_order not in FREE_ORDERS or common_prefix_blocks not in (
            "count",
            "deprecated",
            "removed",
        ):
            raise InvalidArgument(f"unknown variant value {free_order!r}/{common_prefix_blocks!r}")
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.adopt_computed_tokens = adopt_computed_tokens
        self.common_prefix_blocks: CommonPrefix = common_prefix_blocks
        self.hit_length_clamp = hit_length_clamp
        self.hit_length_cap = hit_length_cap
        self.block_pool = BlockPool(
            num_blocks, enable_caching, block_size, enable_kv_cache_events, free_order
        )
        groups: list[FullAttentionManager] = [
            FullAttentionManager(self.block_pool, block_size, use_eagle)
        ]
        groups += [
            local_manager(kind, size, self.block_pool, block_size, use_eagle, g)
            for g, (kind, size) in enumerate(further, start=1)
        ]
        self.coordinator = KVCacheCoordinator(self.block_pool, tuple(groups))
        self.watermark_blocks = int(watermark * num_blocks)
        self.empty_kv_cache_blocks = KVCacheBlocks(((),) * len(groups))

    @property
    def _single(self) -> FullAttentionManager:
        return self.coordinator.single_type_managers[0]

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def create_kv_cache_blocks(self, blocks: tuple[Sequence[Any], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The cached blocks of the request's longest cached prefix, their token count, and 0 (no
        shared-prefix boundary with one group). The last token is always left to compute
        (``max_cache_hit_length`` defaults to ``num_tokens - 1``). No reference changes."""
        if max_cache_hit_length is not None:
            if not self.hit_length_cap:
                raise TypeError("get_computed_blocks() takes no max_cache_hit_length before 0.33")
            if max_cache_hit_length < 0:
                raise InvalidArgument(f"negative max_cache_hit_length {max_cache_hit_length}")
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        if self.hit_length_clamp:  # 0.34: an explicit bound only lowers the default one
            limit = min(limit, request.num_tokens - 1)
        if len(self.coordinator.single_type_managers) > 1:
            return self._hybrid_hit(request.block_hashes, limit)
        hits = self._single.find_longest_cache_hit(request.block_hashes, limit)
        return self.create_kv_cache_blocks((hits,)), len(hits) * self.block_size, 0

    def _hybrid_hit(
        self, block_hashes: Sequence[BlockHash], limit: int
    ) -> tuple[KVCacheBlocks, int, int]:
        """0.34's hybrid coordinator: full attention's hit first (looked up once: any shorter
        prefix of it is a hit too), then each further group in turn is asked for a hit no longer
        than the candidate so far and may shorten it; rounds repeat until one leaves the
        candidate unchanged (with one further group, one round). Full attention's list is cut
        to the result. With EAGLE a group looks one block further and drops one, once per
        candidate length (#32802: a group that shortens the candidate clears that). The third
        value, the shared-prefix boundary, is the longest single-group hit when longer than the
        result (else 0)."""
        full, *others = self.coordinator.single_type_managers
        bs, most = self.block_size, len(block_hashes) * self.block_size
        eagle = full.use_eagle
        full_hits = full.find_longest_cache_hit(
            block_hashes, min(limit + bs, most) if eagle else limit
        )
        length = longest = len(full_hits) * bs
        lists: list[list[KVCacheBlock]] = [full_hits] + [[] for _ in others]
        verified: set[int] = set()  # groups whose EAGLE drop holds at the candidate
        candidate = limit
        while True:
            for g, manager in enumerate(others, start=1):
                drop = manager.use_eagle and g not in verified
                # no margin for Mamba: its finder never drops, its hit would grow past L
                margin = drop and not isinstance(manager, MambaManager)
                ask = min(length + bs, most) if margin else length
                lists[g] = self._local(manager).local_hit(block_hashes, ask, drop)
                found = len(lists[g]) * bs
                if drop:
                    verified.add(g)
                elif found < length:
                    verified.clear()
                length = found
                longest = max(longest, length)
            if length >= candidate or len(others) == 1:
                break
            candidate = length
        del full_hits[cdiv(length, bs) :]
        boundary = longest if longest > length else 0
        return self.create_kv_cache_blocks(tuple(lists)), length, boundary

    @staticmethod
    def _local(manager: FullAttentionManager) -> LocalManager:
        assert hasattr(manager, "local_hit"), "groups after the first are local-attention groups"
        return manager  # type: ignore[return-value]

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Give the request slots for ``num_new_tokens`` (+ lookahead) after its computed tokens
        and the prefix hits ``new_computed_blocks`` (``num_new_computed_tokens`` tokens).

        Pre: something to do (``ValueError``), the stricter checks of the module docstring.
        Post: ``None`` and **no change** when the blocks needed (missing ones plus free hits,
        plus the watermark for a waiting request) exceed the free blocks minus
        ``reserved_blocks`` — checked before any hit is touched (#11565), except that with a
        sliding-window group the blocks wholly before its window are nulled and freed first,
        whatever the outcome; else the hits are
        touched and adopted, blocks for external tokens and then the new blocks are taken from
        the queue head, the full blocks up to the computed tokens are cached (unless delayed),
        and the new blocks are returned."""
        rid = request.request_id
        managers = self.coordinator.single_type_managers
        groups = (
            [list(g) for g in new_computed_blocks.blocks]
            if new_computed_blocks is not None
            else [[] for _ in managers]
        )
        if len(groups) != len(managers):
            raise InvalidArgument(f"{len(groups)} lists of hits for {len(managers)} groups")
        hits = groups[0]
        adopting = self.adopt_computed_tokens and num_new_computed_tokens > 0
        if num_new_tokens == 0 and num_external_computed_tokens == 0 and not adopting:
            raise InvalidArgument(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        self._validate(request, hits, num_new_tokens, num_new_computed_tokens,
                       num_lookahead_tokens, num_external_computed_tokens, reserved_blocks)  # fmt: skip
        pool = self.block_pool
        num_local = request.num_computed_tokens + num_new_computed_tokens
        num_external = num_external_computed_tokens
        total = min(num_local + num_external, self.max_model_len)
        waiting = request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        watermark = self.watermark_blocks if has_scheduled_reqs and waiting else 0

        def blocks_needed(slots: int, computed: int, main: int) -> int:
            return sum(
                m.get_num_blocks_to_allocate(rid, slots, g, computed, main)
                for m, g in zip(managers, groups, strict=True)
            )

        if full_sequence_must_fit:
            full = min(request.num_tokens, self.max_model_len)
            if blocks_needed(full, total, full) + watermark > pool.get_num_free_blocks():
                return None
        # blocks now wholly before a window are freed first, even if the step is refused
        self.coordinator.remove_skipped_blocks(rid, max(0, total - request.num_in_flight_tokens))
        num_main = total + num_new_tokens
        need_slots = min(num_main + num_lookahead_tokens, self.max_model_len)
        needed = blocks_needed(need_slots, num_local + num_external, num_main)
        if needed + watermark > pool.get_num_free_blocks() - reserved_blocks:
            return None
        fresh = not any(rid in m.num_cached_block for m in managers)
        if (any(groups) or num_external > 0) and fresh:
            for m, g in zip(managers, groups, strict=True):  # every group's hits touched first
                m.add_local_computed_blocks(rid, g, num_local + num_external)
            if num_external > 0:
                for m in managers:
                    m.allocate_external_computed_blocks(rid, num_local + num_external, num_external)
        new_blocks = tuple(m.allocate_new_blocks(rid, need_slots, num_main) for m in managers)
        if self.enable_caching and not delay_cache_blocks:
            upto = min(total + num_new_tokens, request.num_tokens)
            # several groups: each caches up to the hit alignment, a block (with EAGLE up to one
            # block past it, min(upto, aligned + block_size): all of upto, which is short of
            # that); only a Mamba group's reusable-state rule can tell the two apart
            aligned = upto // self.block_size * self.block_size
            for m in managers:
                whole = len(managers) == 1 or (m.use_eagle and aligned > 0)
                m.cache_blocks(request, upto if whole else aligned)
        return self.create_kv_cache_blocks(new_blocks)

    def _validate(
        self,
        request: Request,
        hits: Sequence[KVCacheBlock],
        *counts: int,
    ) -> None:
        """kvspec's stricter checks of ``allocate_slots`` (bad input only)."""
        if any(n < 0 for n in counts):
            raise InvalidArgument(f"negative token or block count among {counts}")
        if request.num_tokens > self.max_model_len:
            raise InvalidArgument(
                f"request {request.request_id} has {request.num_tokens} tokens, more than "
                f"max_model_len={self.max_model_len}"
            )
        rid, single = request.request_id, self._single
        if hits and (rid in single.num_cached_block or single.req_to_blocks.get(rid)):
            raise RequestStateError(f"prefix hits for request {rid}, which already holds blocks")
        if request.num_computed_tokens + counts[1] + counts[3] > request.num_tokens:
            raise InvalidArgument(
                f"computed ({request.num_computed_tokens}), hit ({counts[1]}) and external "
                f"({counts[3]}) tokens exceed the {request.num_tokens} tokens of the request"
            )
        if not hits:
            return
        if counts[1] != len(hits) * self.block_size:
            raise InvalidArgument(
                f"{counts[1]} computed tokens for {len(hits)} hit blocks of {self.block_size}"
            )
        if request.num_computed_tokens:
            raise InvalidArgument(
                f"prefix hits for request {rid}, which already has computed tokens"
            )

    def free(self, request: Request) -> None:
        """Post: the request's blocks are released tail first (its last block is evicted first),
        group by group, one ``free_blocks`` call each; a request holding nothing (unknown, or
        freed before) changes nothing."""
        for m in self.coordinator.single_type_managers:
            self.block_pool.free_blocks(reversed(m.pop_blocks_for_free(request.request_id)))

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        """The request's blocks (group after group, without leading null blocks), forgotten by
        the manager but still referenced: the caller frees them later
        (``block_pool.free_blocks``, reversed)."""
        return [
            b
            for m in self.coordinator.single_type_managers
            for b in m.pop_blocks_for_free(request.request_id)
        ]

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def new_step_starts(self) -> None:
        """A scheduler step begins: a Mamba group forgets the blocks cached in the last one."""
        for m in self.coordinator.single_type_managers:
            m.new_step_starts()

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """``[0]`` with caching off or in 0.32+; else the request's leading blocks shared by
        every request holding blocks (quirk *common-prefix-creates-entry*). Gone in 0.34."""
        if self.common_prefix_blocks == "removed":
            raise InvalidArgument("get_num_common_prefix_blocks() does not exist in 0.34")
        if self.common_prefix_blocks == "deprecated" or not self.enable_caching:
            return [0]
        return [self._single.get_num_common_prefix_blocks(running_request_id)]

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return self.create_kv_cache_blocks(
            tuple(
                m.req_to_blocks.get(request_id) or [] for m in self.coordinator.single_type_managers
            )
        )

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def take_events(self) -> list[KVCacheEvent]:
        return self.block_pool.take_events()


# ----------------------------------------------------------------------------- the snapshot
EventRow = tuple[Any, ...]


class PrefixCacheSnapshot(NamedTuple):
    """Every observable of a prefix-cache manager, hashable and comparable.

    Blocks by id: ``ref_cnts`` (the null block's shown as 0: upstream does not maintain it),
    ``block_hashes`` (readable labels, ``None`` = not cached), ``null_blocks``; the free queue
    head to tail and its counter; the map as ``(label, block ids in insertion order)`` sorted by
    label; ``req_to_blocks`` and ``num_cached_block`` sorted by request id (of the first KV cache
    group, full attention; ``groups``: the same of each further group); pending events (``None``
    when off) and ``usage``."""

    ref_cnts: tuple[int, ...]
    block_hashes: tuple[str | None, ...]
    null_blocks: tuple[int, ...]
    free_queue: tuple[int, ...]
    num_free_blocks: int
    cached: tuple[tuple[str, tuple[int, ...]], ...]
    req_to_blocks: tuple[tuple[str, tuple[int, ...]], ...]
    num_cached_block: tuple[tuple[str, int], ...]
    events: tuple[EventRow, ...] | None
    usage: float
    # the other KV cache groups' (1, 2, …) req_to_blocks and num_cached_block, the same way
    # (null blocks by id); () with one group
    groups: tuple[
        tuple[tuple[tuple[str, tuple[int, ...]], ...], tuple[tuple[str, int], ...]], ...
    ] = ()
    # each further group's kind (``GROUP_KINDS``; from its manager class, upstream's names)
    group_kinds: tuple[str, ...] = ()

    def differing_fields(self, other: PrefixCacheSnapshot) -> list[str]:
        return [name for name, a, b in zip(self._fields, self, other, strict=True) if a != b]


@functools.lru_cache(maxsize=1 << 16)
def text_label(block_hash: bytes) -> str:
    """kvspec's hashes are their token text; anything else shows as hex."""
    try:
        return block_hash.decode("ascii")
    except UnicodeDecodeError:
        return block_hash.hex()


def read_prefix_cache(manager: Any) -> PrefixCacheSnapshot:
    """Snapshot any object with upstream's ``KVCacheManager`` attribute names. Hashes are shown
    through ``manager.kvspec_hash_label`` when the target has one (``--target vllm`` translates
    upstream's digests back to kvspec's hashes), else as :func:`text_label`."""
    label = getattr(manager, "kvspec_hash_label", text_label)
    pool = manager.block_pool
    single, *others = manager.coordinator.single_type_managers

    def key_label(key: bytes | None) -> str | None:
        if key is None:
            return None
        group = int.from_bytes(key[-4:], "big")
        return str(label(key[:-4])) + (f"@{group}" if group else "")

    cached = []
    index = pool.cached_block_hash_to_block
    duplicates = getattr(index, "_dup_ids", {})  # 0.34: ids, not blocks, and duplicates apart
    for key, entry in index._cache.items():
        if isinstance(entry, int):
            ids = tuple(duplicates.get(key, (entry,)))
        else:
            ids = tuple(entry) if isinstance(entry, dict) else (entry.block_id,)
        cached.append((str(key_label(key)), ids))
    blocks = pool.blocks
    queue = pool.free_block_queue
    return PrefixCacheSnapshot(
        ref_cnts=tuple(0 if b.is_null else b.ref_cnt for b in blocks),
        block_hashes=tuple(key_label(b.block_hash) for b in blocks),
        null_blocks=tuple(b.block_id for b in blocks if b.is_null),
        free_queue=tuple(b.block_id for b in queue.get_all_free_blocks()),
        num_free_blocks=queue.num_free_blocks,
        cached=tuple(sorted(cached)),
        req_to_blocks=_tables(single),
        num_cached_block=tuple(sorted(single.num_cached_block.items())),
        events=tuple(_event_row(e, label) for e in pool.kv_event_queue)
        if pool.enable_kv_cache_events
        else None,
        usage=float(manager.usage),
        groups=tuple((_tables(m), tuple(sorted(m.num_cached_block.items()))) for m in others),
        group_kinds=tuple(_kind(m) for m in others),
    )


_KINDS = {
    "SlidingWindowManager": "sliding_window",
    "ChunkedLocalAttentionManager": "chunked_local",
    "MambaManager": "mamba",
}


def _kind(manager: Any) -> str:
    """A group manager's kind: the first class of its MRO with upstream's name (a planted
    subclass is its base's kind)."""
    return next((_KINDS[c.__name__] for c in type(manager).__mro__ if c.__name__ in _KINDS), "?")


def _tables(single: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(
        sorted((rid, tuple(b.block_id for b in bl)) for rid, bl in single.req_to_blocks.items())
    )


def _event_row(event: Any, label: Any) -> EventRow:
    kind = type(event).__name__
    if kind == "BlockStored":
        parent = event.parent_block_hash
        group = getattr(event, "group_idx", 0) or 0
        return (
            "stored",
            tuple(label(h) for h in event.block_hashes),
            None if parent is None else label(parent),
            tuple(event.token_ids),
            event.block_size,
            *((("group", group),) if group else ()),  # a further KV cache group's event
        )
    if kind == "BlockRemoved":
        group = getattr(event, "group_idx", 0) or 0
        return (
            "removed",
            tuple(label(h) for h in event.block_hashes),
            *((("group", group),) if group else ()),
        )
    return (kind,)
