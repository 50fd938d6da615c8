"""Build a CPU-only import tree of SGLang's radix cache and KV allocators from a release wheel.

``python -m kvspec.engines.sglang.sglang_standins WHEEL DEST`` copies the upstream files kvspec
checks — verbatim,
at run time, from the wheel you downloaded (``pip download sglang==0.5.23 --no-deps``) — into
``DEST/sglang/…`` and writes small import stand-ins of kvspec's own for everything else they
import (triton kernels, platform flags, metrics, KV events, runtime context, …), so that with
``PYTHONPATH=DEST`` the release's real ``RadixCache`` and allocators import with CPU torch only.
``kvspec … --target sglang`` then checks them (docs/sglang.md §7). When the release has them, the
tree also holds ``UnifiedRadixCache`` with its Python and Rust tree cores (the wheel's bundled
extension; ``msgspec`` must be installed): ``--target sglang-unified`` / ``sglang-unified-rust``
(docs/sglang.md §8). Nothing of upstream is ever part
of kvspec: the tree is written to ``DEST`` only.

The stand-ins provide only the names the copied modules use at import time or on the paths kvspec
drives (no KV events, no metrics, no triton); a name they lack fails loudly.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path

from kvspec.engines import standins_tree

# Upstream files copied verbatim.
VERBATIM: tuple[str, ...] = (
    "sglang/srt/mem_cache/radix_cache.py",
    "sglang/srt/mem_cache/base_prefix_cache.py",
    "sglang/srt/mem_cache/evict_policy.py",
    "sglang/srt/mem_cache/cache_init_params.py",
    "sglang/srt/mem_cache/allocator/__init__.py",
    "sglang/srt/mem_cache/allocator/base.py",
    "sglang/srt/mem_cache/allocator/token.py",
    "sglang/srt/mem_cache/allocator/paged.py",
    "sglang/srt/mem_cache/unified_cache/component_type.py",
)

# Upstream files copied verbatim for ``UnifiedRadixCache`` (``--target sglang-unified``,
# ``sglang-unified-rust``): the cache, its Python tree core and components, the Rust tree core's
# loader and adapter, and the modules they import that import cleanly on a CPU. All or none.
UNIFIED_VERBATIM: tuple[str, ...] = (
    "sglang/srt/mem_cache/unified_radix_cache.py",
    "sglang/srt/mem_cache/unified_cache/__init__.py",
    "sglang/srt/mem_cache/unified_cache/cache_action.py",
    "sglang/srt/mem_cache/unified_cache/components/__init__.py",
    "sglang/srt/mem_cache/unified_cache/components/base.py",
    "sglang/srt/mem_cache/unified_cache/components/full.py",
    "sglang/srt/mem_cache/unified_cache/components/mamba.py",
    "sglang/srt/mem_cache/unified_cache/components/swa.py",
    "sglang/srt/mem_cache/unified_cache/session_ref_tracker.py",
    "sglang/srt/mem_cache/unified_cache/storage_attachment.py",
    "sglang/srt/mem_cache/unified_cache/tree_core_registry.py",
    "sglang/srt/mem_cache/unified_cache/unified_cache_linker.py",
    "sglang/srt/mem_cache/unified_cache/unified_tree_core.py",
    "sglang/srt/mem_cache/unified_cache/unified_tree_core_interface.py",
    "sglang/srt/mem_cache/rust_tree_core/__init__.py",
    "sglang/srt/mem_cache/rust_tree_core/adapter.py",
    "sglang/srt/mem_cache/rust_tree_core/extension.py",
    "sglang/srt/mem_cache/buffer_mode/storage_existence_cache.py",
    "sglang/srt/mem_cache/allocator/page_interleave.py",
    "sglang/srt/mem_cache/hicache_storage.py",
    "sglang/srt/mem_cache/storage_prefetch.py",
    "sglang/srt/session/streaming_session.py",
    "sglang/srt/environ.py",
    "sglang/srt/distributed/communication_tags.py",
    "sglang/srt/rust_extensions/__init__.py",
    "sglang/srt/rust_extensions/loader.py",
    "sglang/srt/rust_extensions/torch_build.py",
    "sglang/srt/utils/poll_timer.py",
    "sglang/srt/utils/rank_consensus_checker.py",
)

# The Rust tree core's compiled extension (a platform wheel's only binary the target loads).
RUST_CORE = re.compile(r"sglang/srt/mem_cache/rust_tree_core/mem_cache\.[^/]+\.so")

_PACKAGES = (
    "sglang",
    "sglang/srt",
    "sglang/srt/mem_cache",
    "sglang/srt/mem_cache/unified_cache",
    "sglang/srt/observability",
    "sglang/srt/mem_cache/unified_cache/components",
    "sglang/srt/mem_cache/rust_tree_core",
    "sglang/srt/mem_cache/buffer_mode",
    "sglang/srt/mem_cache/hybrid_cache",
    "sglang/srt/session",
    "sglang/srt/distributed",
    "sglang/srt/disaggregation",
    "sglang/srt/managers",
    "sglang/kernels",
    "sglang/kernels/ops",
    "sglang/kernels/ops/memory",
)

STANDINS: dict[str, str] = {
    "sglang/srt/utils/__init__.py": '''"""kvspec stand-in: the helpers the allocators import."""
import os

from sglang.srt.utils.common import ceil_align, get_num_new_pages, is_npu


def get_bool_env_var(name, default="false"):
    return os.environ.get(name, default).lower() in ("true", "1")


def is_hip():
    return False


def next_power_of_2(n):
    return 1 << (max(int(n), 1) - 1).bit_length()


def assert_int64_array(values, name):
    assert getattr(values, "typecode", None) == "q", f"{name}: not an int64 array"


def get_device_module(device=None):
    import torch

    return torch.cpu
''',
    "sglang/srt/utils/common.py": '''"""kvspec stand-in: page arithmetic (kvspec's own code)."""


def ceil_align(x, a):
    return -(-x // a) * a


def is_npu():
    return False


def get_num_new_pages(seq_lens, page_size, prefix_lens=None, decode=False):
    """Pages a batch needs: ceil(seq/ps) - ceil(prefix/ps) summed; decode: seqs at a page's
    first position."""
    if prefix_lens is None or decode:
        return int((seq_lens % page_size == 1).sum().item())
    after = (seq_lens + page_size - 1) // page_size
    before = (prefix_lens + page_size - 1) // page_size
    return int((after - before).sum().item())
''',
    "sglang/srt/platforms/__init__.py": '''"""kvspec stand-in: a CPU platform without triton."""


class _Capabilities:
    supports_triton = False


class _Platform:
    capabilities = _Capabilities()


current_platform = _Platform()
''',
    "sglang/kernels/ops/memory/allocator.py": '''"""kvspec stand-in: triton kernels (unused on CPU)."""


def _not_here(*args, **kwargs):
    raise RuntimeError("kvspec's CPU stand-ins have no triton kernels")


class _Kernel:
    def __getitem__(self, grid):
        return _not_here


alloc_extend_kernel = alloc_decode_kernel = _Kernel()
''',
    "sglang/srt/mem_cache/memory_pool.py": '''"""kvspec stand-in: pool types (kvspec keeps its rows)."""


class ReqToTokenPool:
    pass


class KVCache:
    pass


class MHATokenToKVPool(KVCache):
    pass


class HybridReqToTokenPool(ReqToTokenPool):
    pass
''',
    "sglang/srt/mem_cache/events.py": '''"""kvspec stand-in: KV-cache events, off."""


class LoRANameTable:
    pass


class KvEventLoraNames(LoRANameTable):
    pass


class KVCacheEventRecorder:
    def __init__(self, enabled=False, **kwargs):
        if enabled:
            raise RuntimeError("kvspec's stand-in records no KV events")

    def record_all_cleared(self, *args, **kwargs):
        pass

    def record_store(self, *args, **kwargs):
        pass

    def record_remove(self, *args, **kwargs):
        pass

    def take_events(self):
        return []
''',
    "sglang/srt/mem_cache/utils.py": '''"""kvspec stand-in: eviction-policy factory, hash split."""
from sglang.srt.mem_cache import evict_policy as _p

_FACTORIES = {
    "lru": _p.LRUStrategy,
    "lfu": _p.LFUStrategy,
    "fifo": _p.FIFOStrategy,
    "mru": _p.MRUStrategy,
    "filo": _p.FILOStrategy,
    "priority": _p.PriorityStrategy,
}


def get_eviction_strategy(eviction_policy, config=None):
    try:
        factory = _FACTORIES[eviction_policy.lower()]
    except KeyError:
        raise ValueError(f"Unknown eviction policy: {eviction_policy}") from None
    return factory(**config) if config else factory()


def _no_hashes(*args, **kwargs):
    raise RuntimeError("kvspec's stand-in computes no storage hashes (HiCache storage is off)")


compute_node_hash_values = get_storage_hash_str = _no_hashes


def split_node_hash_value(child_hash_value, split_len, page_size):
    if child_hash_value is None:
        return None, None
    n = split_len // page_size
    return child_hash_value[:n], child_hash_value[n:]
''',
    "sglang/srt/observability/metrics_collector.py": '''"""kvspec stand-in: metrics, off."""
STAT_LOGGER_ROLE_RADIX_CACHE = "radix_cache"
STAT_LOGGER_ROLE_STORAGE = "storage"


class RadixCacheMetricsCollector:
    pass


class StorageMetrics:
    pass


class StorageMetricsCollector:
    pass


def radix_cache_metric_labels(*args, **kwargs):
    return {}


def resolve_collector_class(cls, *args, **kwargs):
    return cls
''',
    "sglang/srt/runtime_context.py": '''"""kvspec stand-in: the runtime context (one process, no metrics)."""


class _Context:
    extra_metric_labels = None
    speculative_algorithm = None
    strip_thinking_cache = False
    disaggregation_mode = "null"
    context_length = None
    hicache_host_memory_mode = "cache"
    hicache_storage_backend = None


def get_observability():
    return _Context()


def get_parallel():
    return _Context()


def get_serving():
    return _Context()


def get_spec():
    return _Context()


get_disagg = get_memory = get_model = get_exec = get_spec


def mamba_cache_chunk_size():
    raise RuntimeError("kvspec's stand-ins have no Mamba layers")


mamba_checkpoint_grid = mamba_cache_chunk_size
''',
    "sglang/srt/managers/schedule_batch.py": '''"""kvspec stand-in: a request's KV record."""
import dataclasses


@dataclasses.dataclass
class ReqKvInfo:
    req_pool_idx: object = None
    cache_protected_len: int = 0
    cache_inserted_len: int = 0
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    swa_evict_floor: int = 0
    max_evicted_seqlen: int = 0

    @property
    def holds_kv(self):
        return self.req_pool_idx is not None


class FINISH_ABORT:
    pass
''',
    "sglang/srt/managers/cache_controller.py": '''"""kvspec stand-in: HiCache (off)."""


class CacheOperation:
    pass


class HiCacheAck:
    pass
''',
    "sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py": '''"""kvspec stand-in."""


class HybridCacheController:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("kvspec's stand-ins have no HiCache")


class PPPrefetchDecision:
    pass


class PrefetchOperation:
    pass
''',
    "sglang/srt/mem_cache/buffer_mode/pipeline.py": '''"""kvspec stand-in: buffer mode (off)."""


class BufferModePipeline:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("kvspec's stand-ins have no host memory")


def validate_buffer_only_stack(*args, **kwargs):
    raise RuntimeError("kvspec's stand-ins have no host memory")
''',
    "sglang/srt/mem_cache/common.py": '''"""kvspec stand-in: two scheduler helpers."""
from typing import Any, NamedTuple


class RetractionBackup(NamedTuple):
    cpu_tensors: Any = None
    host_indices: Any = None
    pool_transfers: Any = None
    mamba_cpu: Any = None


def free_swa_out_of_window_slots(*args, **kwargs):
    raise RuntimeError("kvspec's stand-ins have no sliding-window layers")
''',
    "sglang/srt/mem_cache/swa_memory_pool.py": '''"""kvspec stand-in: the SWA pool type."""


class SWAKVPool:
    pass
''',
    "sglang/srt/disaggregation/kv_events.py": '''"""kvspec stand-in: KV-event types (events are off)."""
import enum


class StorageMedium(str, enum.Enum):
    GPU = "GPU"
    CPU = "CPU_PINNED"
    DISK = "DISK"
    EXTERNAL = "EXTERNAL"


class _Event:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("kvspec's stand-in records no KV events")


AllBlocksCleared = BlockRemoved = BlockStored = _Event


def kv_event_namespace_seed(*args, **kwargs):
    return None


def namespaced_block_hash(block_hash, *, namespace_seed=None):
    return block_hash
''',
}


def _wanted(name: str) -> bool:
    return (
        name in VERBATIM
        or name in UNIFIED_VERBATIM
        or RUST_CORE.fullmatch(name) is not None
        or name.endswith(".dist-info/METADATA")
    )


def _open(source: Path) -> dict[str, bytes]:
    """The files of a wheel (zip) or of an unpacked tree, by relative path."""
    if source.is_dir():
        found = {str(p.relative_to(source)): p for p in source.rglob("*") if p.is_file()}
        return {n: p.read_bytes() for n, p in found.items() if _wanted(n)}
    with zipfile.ZipFile(source) as wheel:
        return {n: wheel.read(n) for n in wheel.namelist() if _wanted(n)}


def version_of(files: dict[str, bytes]) -> str:
    return standins_tree.version_of(files, "sglang")


def build(source: Path, dest: Path) -> list[str]:
    """Write the tree; the upstream files copied (relative paths). The unified cache's files are
    copied when the release has all of them, its Rust core's extension when the wheel has one."""
    files = _open(source)
    version = version_of(files)
    missing = [rel for rel in VERBATIM if rel not in files]
    if missing:
        raise ValueError(f"the release lacks {', '.join(missing)}")
    copied = list(VERBATIM)
    if all(rel in files for rel in UNIFIED_VERBATIM):
        copied += UNIFIED_VERBATIM
        copied += sorted(n for n in files if RUST_CORE.fullmatch(n))
    shutil.rmtree(dest / "sglang", ignore_errors=True)
    standins_tree.write_files(dest, _PACKAGES, STANDINS, files, copied)
    (dest / "sglang" / "version.py").write_text(f'__version__ = "{version}"\n')
    standins_tree.write_dist_info(dest, "sglang", version)
    return copied


def main(argv: Sequence[str] | None = None) -> int:
    return standins_tree.cli(
        argv,
        dist="sglang",
        what="SGLang's radix caches",
        build=build,
        num_standins=len(STANDINS),
    )


if __name__ == "__main__":
    raise SystemExit(main())
