"""One vLLM-style KV-cache manager with its requests, driven by JSON-able scheduler calls.

A :class:`PrefixCacheHarness` plays vLLM's scheduler for one manager (docs/vllm.md §5.3 "how the
scheduler uses it", docs/vllm-kv-cache-manager.md §5): it owns that manager's request objects, turns
request ids and block ids into the manager's own objects, and returns plain values (block id
lists, ``None``, event rows) so that two harnesses — spec and target — can be compared call by call
and a trace replays. Its calls are of two kinds:

* **scheduler events** that also update the request as vLLM's scheduler does: ``schedule`` (a
  waiting request: ``get_computed_blocks`` then ``allocate_slots`` with the hits; a running one:
  ``allocate_slots`` for its next chunk or decode token; on success ``num_computed_tokens``
  advances and a request that computed all its tokens gets its next sampled token), ``preempt``
  (``free``, back to zero computed tokens), ``finish``, ``abort``, ``finish_deferred``
  (``pop_blocks_for_free``: the blocks stay referenced until ``free_blocks``);
* **raw manager calls** with explicit arguments (``allocate_slots``, ``get_computed_blocks``,
  ``free``, ``free_blocks``, ``evict_blocks``, ``reset_prefix_cache``, ``take_events``,
  ``get_num_common_prefix_blocks``), which change no request: the bad-input rules use them.

A target class may offer ``kvspec_request(request_id, prompt, block_size)`` (its own request
objects; default :class:`spec.vllm.kv_cache_manager.Request`) and ``kvspec_status`` (its
``RequestStatus`` enum); ``--target vllm`` does (upstream's hashing and enum).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from spec.vllm.kv_cache_manager import (
    Request,
    RequestStatus,
    read_prefix_cache,
    text_label,
    variant_keywords,
)


@dataclass(frozen=True)
class Config:
    """One manager's construction and the draw bounds of a run."""

    variant: str = "unhashed_first"
    num_blocks: int = 6
    block_size: int = 2
    max_model_len: int = 12
    vocab: int = 2
    max_requests: int = 3
    enable_caching: bool = True
    use_eagle: bool = False
    enable_kv_cache_events: bool = True
    watermark: float = 0.0
    # > 0: a second KV cache group, a sliding window of that many tokens (vLLM 0.34's hybrid
    # coordinator; docs/vllm-hybrid-groups.md)
    sliding_window: int = 0
    # further KV cache groups after that, ``(kind, tokens)``: ``("sliding_window", W)``,
    # ``("chunked_local", C)`` (more than one: the coordinator's fixed-point hit)
    attention_groups: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:  # from JSON the groups come as lists: keep it hashable
        object.__setattr__(
            self, "attention_groups", tuple((str(k), int(n)) for k, n in self.attention_groups)
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def features(self) -> dict[str, Any]:
        """The variant's feature values (the defaults filled in)."""
        return {
            "free_order": "unhashed_first",
            "adopt_computed_tokens": True,
            "common_prefix_blocks": "deprecated",
            "hit_length_cap": True,
            "hit_length_clamp": False,
            **variant_keywords(self.variant),
        }


def event_rows(events: Sequence[Any], label: Callable[[bytes], str] = text_label) -> list[Any]:
    """Events as comparable rows: ``["stored", hashes, parent, tokens, block_size]``,
    ``["removed", hashes]``, ``["AllBlocksCleared"]`` (hashes as labels)."""
    rows: list[Any] = []
    for e in events:
        kind = type(e).__name__
        group = getattr(e, "group_idx", 0) or 0  # a further KV cache group's event says so
        tag = [["group", group]] if group else []
        if kind == "BlockStored":
            parent = None if e.parent_block_hash is None else label(e.parent_block_hash)
            rows.append(["stored", [label(h) for h in e.block_hashes], parent,
                         list(e.token_ids), e.block_size, *tag])  # fmt: skip
        elif kind == "BlockRemoved":
            rows.append(["removed", [label(h) for h in e.block_hashes], *tag])
        else:
            rows.append([kind])
    return rows


class PrefixCacheHarness:
    """One manager (spec or target) and its requests, behind JSON-able calls."""

    def __init__(self, manager_cls: Callable[..., Any], config: Config) -> None:
        self.config = config
        self.m = manager_cls(
            config.num_blocks,
            config.block_size,
            config.max_model_len,
            enable_caching=config.enable_caching,
            use_eagle=config.use_eagle,
            enable_kv_cache_events=config.enable_kv_cache_events,
            watermark=config.watermark,
            **variant_keywords(config.variant),
            **({"sliding_window": config.sliding_window} if config.sliding_window else {}),
            **(
                {"attention_groups": tuple(map(tuple, config.attention_groups))}
                if config.attention_groups
                else {}
            ),
        )
        self.new_request: Callable[[str, list[int], int], Any] = getattr(
            manager_cls, "kvspec_request", Request
        )
        self.status: Any = getattr(manager_cls, "kvspec_status", RequestStatus)
        self.label: Callable[[bytes], str] = getattr(self.m, "kvspec_hash_label", text_label)
        self.requests: dict[str, Any] = {}

    # ------------------------------------------------------------ plumbing
    def _req(self, rid: str) -> Any:
        """The request ``rid`` (a throwaway one-token request for an id never added)."""
        req = self.requests.get(rid)
        return req if req is not None else self.new_request(rid, [0], self.config.block_size)

    def _blocks(self, ids: Sequence[int]) -> list[Any]:
        return [self.m.block_pool.blocks[i] for i in ids]

    @staticmethod
    def _ids(blocks: Any) -> Any:
        """Block ids of the first group's list; of every group's (a list of lists) when there
        are several."""
        if blocks is None:
            return None
        lists = [[int(b.block_id) for b in group] for group in blocks.blocks]
        return lists[0] if len(lists) == 1 else lists

    def _groups(self) -> int:
        return len(self.m.coordinator.single_type_managers)

    def _set(self, req: Any, status: str) -> None:
        req.status = self.status[status]

    # ------------------------------------------------------------ scheduler events
    def add_request(self, rid: str, prompt: list[int]) -> None:
        self.requests[rid] = self.new_request(rid, list(prompt), self.config.block_size)

    def schedule(
        self,
        rid: str,
        budget: int,
        next_token: int,
        lookahead: int = 0,
        external: int = 0,
        must_fit: bool = False,
        reserved: int = 0,
        cap: int | None = None,
    ) -> dict[str, Any] | None:
        """One scheduling step of a request: a waiting/preempted one looks up its prefix hits and
        is admitted with them (``external`` connector tokens after the hits); a running one gets
        its next chunk (prefill) or token (decode); ``budget`` caps the tokens computed. On
        success the request advances and, having computed all its tokens, is given
        ``next_token`` (the model's sample) unless it reached ``max_model_len``."""
        m, req = self.m, self.requests[rid]
        waiting = req.status in (self.status.WAITING, self.status.PREEMPTED)
        hits, hit_tokens = None, 0
        if waiting:
            found = m.get_computed_blocks(req) if cap is None else m.get_computed_blocks(req, cap)
            hits, hit_tokens = found[0], found[1]
        else:
            external = 0
        todo = req.num_tokens - req.num_computed_tokens - hit_tokens
        external = max(0, min(external, todo - 1))  # the connector loads prompt tokens only
        todo -= external
        num_new = max(0, min(budget, todo))
        out = m.allocate_slots(
            req,
            num_new,
            hit_tokens,
            hits,
            lookahead,
            external,
            False,
            0,
            must_fit,
            reserved,
        )
        if out is None:
            return None
        req.num_computed_tokens += hit_tokens + external + num_new
        self._set(req, "RUNNING")
        if req.num_computed_tokens == req.num_tokens < self.config.max_model_len:
            req.append_output_token_ids([next_token])
        return {"hits": self._ids(hits) or [], "new": self._ids(out)}

    def preempt(self, rid: str) -> None:
        req = self.requests[rid]
        self.m.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self._set(req, "PREEMPTED")

    def finish(self, rid: str) -> None:
        self.m.free(self.requests[rid])
        self._set(self.requests[rid], "FINISHED_STOPPED")

    def abort(self, rid: str) -> None:
        self.m.free(self.requests[rid])
        self._set(self.requests[rid], "FINISHED_ABORTED")

    def finish_deferred(self, rid: str) -> list[int]:
        """Finish a request whose blocks a KV connector still reads: the manager forgets them,
        the caller frees them later (``free_blocks``, reversed)."""
        blocks = self.m.pop_blocks_for_free(self.requests[rid])
        self._set(self.requests[rid], "FINISHED_STOPPED")
        return [int(b.block_id) for b in blocks]

    # ------------------------------------------------------------ raw manager calls
    def get_computed_blocks(self, rid: str, cap: int | None = None) -> list[Any]:
        req = self._req(rid)
        found = (
            self.m.get_computed_blocks(req) if cap is None else self.m.get_computed_blocks(req, cap)
        )
        if self._groups() > 1:  # the hybrid coordinator's shared-prefix boundary too
            return [self._ids(found[0]), found[1], found[2]]
        return [self._ids(found[0]), found[1]]

    def allocate_slots(
        self,
        rid: str,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        hit_ids: list[int] | None = None,
        lookahead: int = 0,
        external: int = 0,
        delay: bool = False,
        must_fit: bool = False,
        reserved: int = 0,
    ) -> Any:
        hits = None
        if hit_ids is not None:  # full attention's hits (the further groups' lists empty)
            hits = self.m.create_kv_cache_blocks(
                (self._blocks(hit_ids), *([] for _ in range(self._groups() - 1)))
            )
        out = self.m.allocate_slots(
            self._req(rid),
            num_new_tokens,
            num_new_computed_tokens,
            hits,
            lookahead,
            external,
            delay,
            0,
            must_fit,
            reserved,
        )
        return self._ids(out)

    def free(self, rid: str) -> None:
        self.m.free(self._req(rid))

    def free_blocks(self, ids: list[int]) -> None:
        self.m.block_pool.free_blocks(self._blocks(ids))

    def evict_blocks(self, ids: list[int]) -> None:
        self.m.evict_blocks(set(ids))

    def reset_prefix_cache(self) -> bool:
        return bool(self.m.reset_prefix_cache())

    def take_events(self) -> list[Any]:
        return event_rows(self.m.take_events(), self.label)

    def new_step_starts(self) -> None:
        self.m.new_step_starts()

    def get_num_common_prefix_blocks(self, rid: str) -> list[int]:
        return [int(n) for n in self.m.get_num_common_prefix_blocks(rid)]


def read(h: PrefixCacheHarness) -> Any:
    return read_prefix_cache(h.m)
