"""``--target vllm`` for the GPU prefix cache: vLLM's own ``KVCacheManager`` with one
full-attention group, behind kvspec's constructor.

:data:`VllmKVCacheManager` is a subclass of the installed release's
``vllm.v1.core.kv_cache_manager.KVCacheManager``: every method kvspec calls and every attribute it
reads (``block_pool``, ``coordinator.single_type_managers[0]``, the free queue, the hash map, the
event queue, ``usage``) is upstream's own. The subclass only builds what upstream's constructor
needs from kvspec's arguments — a ``KVCacheConfig`` with one ``FullAttentionSpec`` group of
``block_size`` tokens (and, with ``sliding_window`` or ``attention_groups``, a
``SlidingWindowSpec`` or ``ChunkedLocalAttentionSpec`` group each, of the same block size),
``hash_block_size == scheduler_block_size == block_size``
(docs/vllm-kv-cache-manager.md §8) — passing only the keywords the release takes, and offers the
harness three hooks:

* ``kvspec_request(request_id, prompt, block_size)``: a request whose ``block_hashes`` are computed
  by the release's own hasher (``get_request_block_hasher`` over ``hash_block_tokens``, sha256,
  ``NONE_HASH`` from ``init_none_hash``) — with ``PYTHONHASHSEED`` fixed (``"0"`` unless already
  set) so that the digests are the same in every run and every process;
* ``kvspec_hash_label(digest)``: upstream's digest shown as kvspec's readable hash of the same
  prefix (a table filled as requests are hashed), so snapshots compare with the spec's;
* ``kvspec_status``: the release's ``RequestStatus``.

``kvspec_variant`` is the installed release (``rX.Y``, its version read without importing vLLM);
a version no variant models has ``kvspec_variant = None`` and ``kvspec_unknown`` (the one line the
CLI prints, naming the nearest modelled variant, ``kvspec_nearest``). The variant keywords kvspec passes are
accepted and ignored: the release decides. Without vLLM installed, build a CPU import tree from a
wheel with ``python -m kvspec.engines.vllm.vllm_standins`` and put it on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from collections.abc import Sequence
from typing import Any

from kvspec.engines.trees import PROCESS, Namespace
from kvspec.engines.vllm import vllm_adapter
from kvspec.targets import TargetError
from spec.vllm.kv_cache_manager import (
    RELEASES,
    Request,
    further_groups,
    hash_block_tokens,
    text_label,
)

UPSTREAM_MODULE = "vllm.v1.core.kv_cache_manager"
HASH_SEED = "0"
LABELS: dict[bytes, bytes] = {}  # upstream digest -> kvspec's hash of the same prefix


def installed_version(ns: Namespace = PROCESS) -> str:
    return vllm_adapter.installed_version(ns)


def release_variant(version: str) -> str | None:
    """``rX.Y`` of a release the prefix-cache spec models, ``None`` otherwise."""
    return vllm_adapter.release_variant(version, RELEASES)


def _import(name: str, ns: Namespace = PROCESS) -> Any:
    try:
        return ns.import_module(name)
    except Exception as exc:  # not installed, or a failure deeper in vLLM's import chain
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise TargetError(f"--target vllm needs an importable {name} ({reason})") from exc


def adapter_class(
    variant: str | None = None, ns: Namespace = PROCESS, version: str | None = None
) -> type:
    """The kvspec-constructed subclass of the release's ``KVCacheManager`` (in ``ns``)."""
    manager_mod = _import(UPSTREAM_MODULE, ns)
    utils = _import("vllm.v1.core.kv_cache_utils", ns)
    interface = _import("vllm.v1.kv_cache_interface", ns)
    status = _import("vllm.v1.request", ns).RequestStatus
    hash_fn = _import("vllm.utils.hashing", ns).get_hash_fn_by_name("sha256")
    logging.getLogger("vllm").setLevel(logging.ERROR)  # e.g. every refused prefix-cache reset
    os.environ.setdefault("PYTHONHASHSEED", HASH_SEED)  # NONE_HASH is derived from it
    utils.init_none_hash(hash_fn)
    upstream: type = manager_mod.KVCacheManager
    accepted = set(inspect.signature(upstream).parameters)
    torch = importlib.import_module("torch")

    def hasher(block_size: int) -> Any:
        return utils.get_request_block_hasher(block_size, hash_fn)

    class UpstreamHashedRequest(Request):
        """kvspec's request with the release's block hashes (and kvspec's, for the labels)."""

        @property
        def _all_token_ids(self) -> Any:  # what 0.34.0's block hasher reads
            return self.all_token_ids

        # 0.34.0 asks the request for its cache-hit bound: kvspec's requests are unbounded
        # (no skipped cache reads, no prompt scoring), so only the last token is recomputed
        prefix_cache_hit_limit = None

        def get_max_cache_hit_length(self, bound: int | None = None) -> int:
            last = self.num_tokens - 1
            return last if bound is None else min(last, bound)

        def _hash_new_full_blocks(self) -> None:
            own: list[bytes] = self.__dict__.setdefault("_own_hashes", [])
            new = hasher(self.block_size)(self)
            bs = self.block_size
            for digest in new:
                i = len(own)
                tokens = self.all_token_ids[i * bs : (i + 1) * bs]
                own.append(hash_block_tokens(own[-1] if own else None, tokens))
                LABELS[bytes(digest)] = own[-1]
            self.block_hashes.extend(new)

    class VllmKVCacheManager(upstream):  # type: ignore[misc]
        """vLLM's ``KVCacheManager`` with kvspec's constructor (one full-attention group)."""

        kvspec_variant = variant
        kvspec_version = version
        kvspec_unknown = (
            None if version is None else vllm_adapter.unknown_message(version, RELEASES)
        )
        kvspec_nearest = (
            None if version is None else vllm_adapter.nearest_variant(version, RELEASES)
        )
        kvspec_status = status
        kvspec_request = UpstreamHashedRequest

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
            sliding_window: int = 0,
            attention_groups: Sequence[tuple[str, int]] = (),
            **variant_keywords: Any,  # what kvspec expects; the installed release decides
        ) -> None:
            shape = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1}
            groups = [
                interface.KVCacheGroupSpec(
                    ["kvspec.layer"], interface.FullAttentionSpec(**shape, dtype=torch.float32)
                )
            ]
            # the hybrid coordinator: full attention, then each further group
            for g, (kind, size) in enumerate(
                further_groups(sliding_window, attention_groups, use_eagle), start=1
            ):
                if kind == "mamba":  # one 1-float state per block ("align": prefix caching)
                    spec = interface.MambaSpec(
                        block_size=block_size, shapes=((1,),), dtypes=(torch.float32,),
                        mamba_cache_mode="align",
                    )  # fmt: skip
                elif kind == "sliding_window":
                    spec = interface.SlidingWindowSpec(
                        **shape, dtype=torch.float32, sliding_window=size
                    )
                else:
                    spec = interface.ChunkedLocalAttentionSpec(
                        **shape, dtype=torch.float32, attention_chunk_size=size
                    )
                groups.append(interface.KVCacheGroupSpec([f"kvspec.group{g}"], spec))
            config = interface.KVCacheConfig(
                num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups
            )
            options = {
                "max_model_len": max_model_len,
                "scheduler_block_size": block_size,
                "hash_block_size": block_size,
                "enable_caching": enable_caching,
                "use_eagle": use_eagle,
                "enable_kv_cache_events": enable_kv_cache_events,
                "watermark": watermark,
            }
            super().__init__(config, **{k: v for k, v in options.items() if k in accepted})
            self.requested_variant = variant_keywords

        @staticmethod
        def kvspec_hash_label(digest: bytes) -> str:
            return text_label(LABELS.get(bytes(digest), bytes(digest)))

    VllmKVCacheManager.__qualname__ = f"VllmKVCacheManager[{upstream.__module__}]"
    return VllmKVCacheManager


def __getattr__(name: str) -> Any:
    """``kvspec.engines.vllm.vllm_prefix_adapter:VllmKVCacheManager`` (the target loader's
    ``vllm`` name) imports vLLM only when asked for, raising ``TargetError`` — not
    ``AttributeError`` — when it cannot."""
    if name == "VllmKVCacheManager":
        return target_class(name, PROCESS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def target_class(name: str, ns: Namespace) -> type:
    """The adapter over the vLLM of namespace ``ns`` (the target loader's ``vllm@SOURCE``)."""
    if name != "VllmKVCacheManager":
        raise TargetError(f"{__name__} has no target {name!r}")
    version = installed_version(ns)
    return adapter_class(release_variant(version), ns, version)
