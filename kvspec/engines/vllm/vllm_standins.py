"""Build a CPU-only import tree of vLLM's KV-cache modules from a downloaded release wheel.

``python -m kvspec.engines.vllm.vllm_standins WHEEL DEST`` copies the upstream files kvspec checks — verbatim,
at run time, from the wheel you downloaded (``pip download vllm==0.33.0 --no-deps``) — into
``DEST/vllm/…`` and writes small import stand-ins of kvspec's own for everything else they import
(config, logger, envs, platform, metrics, request, events, …), so that with ``PYTHONPATH=DEST``
the release's real ``KVCacheManager`` / ``BlockPool`` and ``CPUOffloadingManager`` import in seconds
on a machine without a GPU, with CPU torch and numpy only. ``kvspec … --target vllm`` then checks
them (docs/vllm-kv-cache-manager.md §8, docs/vllm-releases.md §12). Nothing of upstream is ever part
of kvspec: the tree is written to ``DEST`` only.

The stand-ins provide only names the copied modules use at import time or on the paths kvspec
drives (one full-attention group, no multimodal, no LoRA, no metrics); a name they lack fails
loudly. Releases 0.28.0 to 0.34.0 are supported; another release may need a stand-in touched
(docs/vllm-releases.md, "The next release").
"""

from __future__ import annotations

import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path

from kvspec.engines import standins_tree

# Upstream files copied verbatim (when the release has them).
VERBATIM: tuple[str, ...] = (
    "vllm/v1/__init__.py",
    "vllm/v1/core/__init__.py",
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/core/kv_cache_metrics.py",
    "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/core/kv_cache_coordinator.py",
    "vllm/v1/core/kv_cache_manager.py",
    "vllm/v1/kv_cache_interface.py",
    "vllm/v1/kv_cache_spec_registry.py",
    "vllm/v1/kv_cache_layout.py",
    "vllm/v1/hisparse/block_pool.py",
    "vllm/utils/math_utils.py",
    # 0.34.0: block_pool / single_type_kv_cache_manager untrack long lists from the cyclic GC,
    # kv_cache_utils slices token buffers (all three import only the standard library, numpy,
    # typing_extensions and the envs / logger stand-ins)
    "vllm/utils/gc_utils.py",
    "vllm/utils/collection_utils.py",
    "vllm/v1/token_buffer.py",
    # the CPU offload manager and its policies (--target vllm for the offload components)
    "vllm/v1/kv_offload/__init__.py",
    "vllm/v1/kv_offload/base.py",
    "vllm/v1/kv_offload/config.py",
    "vllm/v1/kv_offload/cpu/__init__.py",
    "vllm/v1/kv_offload/cpu/common.py",
    "vllm/v1/kv_offload/cpu/manager.py",
    "vllm/v1/kv_offload/cpu/policies/__init__.py",
    "vllm/v1/kv_offload/cpu/policies/base.py",
    "vllm/v1/kv_offload/cpu/policies/arc.py",
    "vllm/v1/kv_offload/cpu/policies/lru.py",
    "vllm/v1/kv_offload/cpu/policies/factory.py",
    "vllm/v1/metrics/cache_hit_source.py",
)

_PACKAGES = (
    "vllm",
    "vllm/config",
    "vllm/distributed",
    "vllm/utils",
    "vllm/platforms",
    "vllm/multimodal",
    "vllm/v1/metrics",
    "vllm/v1/attention",
    "vllm/v1/attention/backends",
    "vllm/v1/hisparse",
    "vllm/distributed/kv_transfer",
    "vllm/distributed/kv_transfer/kv_connector",
    "vllm/distributed/kv_transfer/kv_connector/v1",
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading",
)

STANDINS: dict[str, str] = {
    "vllm/envs.py": '''"""kvspec stand-in: the environment variables read, at their defaults."""
import os

_DEFAULTS = {
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": False,
    "VLLM_PREFIX_CACHE_RETENTION_INTERVAL": None,
}


def __getattr__(name):
    if name in _DEFAULTS:
        return _DEFAULTS[name]
    raise AttributeError(f"kvspec's vllm.envs stand-in has no {name} (add it to _DEFAULTS)")
''',
    "vllm/logger.py": '''"""kvspec stand-in: loggers with vLLM's *_once methods."""
import logging


class _Logger(logging.LoggerAdapter):
    def warning_once(self, msg, *args, **kwargs):
        self.warning(msg, *args)

    def info_once(self, msg, *args, **kwargs):
        self.info(msg, *args)

    def debug_once(self, msg, *args, **kwargs):
        self.debug(msg, *args)


def init_logger(name):
    return _Logger(logging.getLogger(name if name.startswith("vllm") else f"vllm.{name}"), {})
''',
    "vllm/config/__init__.py": '''"""kvspec stand-in: configuration types, used in annotations only."""


class VllmConfig:
    pass


def get_current_vllm_config_or_none():
    return None
''',
    "vllm/distributed/kv_events.py": '''"""kvspec stand-in: KV-cache events (keyword fields)."""
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"


class KVCacheEvent:
    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"{type(self).__name__}({self.__dict__})"


class BlockStored(KVCacheEvent):
    pass


class BlockRemoved(KVCacheEvent):
    pass


class AllBlocksCleared(KVCacheEvent):
    pass
''',
    "vllm/utils/hashing.py": '''"""kvspec stand-in: hash functions (hashlib over pickle; kvspec
compares what they hash, not the digests)."""
import hashlib
import pickle


def sha256(obj):
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj):
    return sha256(obj)


def xxhash(obj):
    return hashlib.blake2b(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()[:16]


def xxhash_cbor(obj):
    return xxhash(obj)


def get_hash_fn_by_name(name):
    return {"sha256": sha256, "sha256_cbor": sha256_cbor, "xxhash": xxhash,
            "xxhash_cbor": xxhash_cbor}[name]
''',
    "vllm/utils/mem_utils.py": '''"""kvspec stand-in."""


def format_gib(b):
    return f"{b / (1 << 30):.2f}"
''',
    "vllm/utils/torch_utils.py": '''"""kvspec stand-in."""
import torch


def get_dtype_size(dtype):
    return torch.tensor([], dtype=dtype).element_size()
''',
    "vllm/utils/import_utils.py": '''"""kvspec stand-in."""
import importlib


def resolve_obj_by_qualname(qualname):
    module, _, name = qualname.rpartition(".")
    return getattr(importlib.import_module(module), name)
''',
    "vllm/platforms/__init__.py": '''"""kvspec stand-in: no platform (nothing here runs on a device)."""


class _NoPlatform:
    def register_custom_kv_cache_specs(self, vllm_config):
        """A device platform's own KV-cache spec types: none on a CPU."""

    def __getattr__(self, name):
        raise RuntimeError(f"kvspec's CPU stand-ins have no platform ({name})")


current_platform = _NoPlatform()
''',
    "vllm/multimodal/utils.py": '''"""kvspec stand-in: requests kvspec drives have no multimodal features."""


def get_mm_features_in_window(mm_features, start, end):
    raise RuntimeError("kvspec's stand-ins have no multimodal features")
''',
    "vllm/v1/utils.py": '''"""kvspec stand-in."""


def tensor_data(tensor):
    return tensor.flatten().contiguous().view(-1).numpy().tobytes()
''',
    "vllm/distributed/kv_transfer/kv_connector/v1/offloading/metrics.py": '''"""kvspec stand-in: the
offload connector's statistics record (only the manager's get_stats builds one; kvspec never asks)."""


class OffloadingConnectorStats:
    def __init__(self):
        self.data = {}

    def set_gauge(self, name, value):
        self.data[name] = value

    def observe_histogram(self, name, value):
        self.data.setdefault(name, []).append(value)

    def increase_counter(self, name, value=1):
        self.data[name] = self.data.get(name, 0) + value
''',
    "vllm/v1/kv_hints.py": '''"""kvspec stand-in: the hints a ReqContext may carry (none sent)."""


class KvHintsEnvelope:
    pass
''',
    "vllm/v1/metrics/stats.py": '''"""kvspec stand-in: statistics records (stats are off)."""
from dataclasses import dataclass, field


@dataclass
class PrefixCacheStats:
    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens, num_hits, preempted=False):
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits


@dataclass
class KVCacheEvictionEvent:
    lifetime_seconds: float = 0.0
    idle_seconds: float = 0.0
    reuse_gaps_seconds: tuple = field(default_factory=tuple)


class PrefillStats:
    pass
''',
    "vllm/v1/attention/backends/registry.py": '''"""kvspec stand-in: Mamba backend names."""
import enum


class MambaAttentionBackendEnum(enum.Enum):
    MAMBA1 = "mamba1"
    MAMBA2 = "mamba2"
    SHORT_CONV = "short_conv"
    LINEAR = "linear"
    GDN_ATTN = "gdn_attn"
''',
    "vllm/v1/hisparse/layout.py": '''"""kvspec stand-in: HiSparse layouts (0.30-0.32 import them
for config building, which kvspec does not do)."""


def _not_here(*args, **kwargs):
    raise RuntimeError("kvspec's CPU stand-ins do not build HiSparse layouts")


get_hisparse_gpu_memory_usage = get_hisparse_host_pool_bytes = _not_here
get_hisparse_kv_cache_config = get_hisparse_kv_cache_groups = _not_here
''',
    "vllm/v1/request.py": '''"""kvspec stand-in: the request type (kvspec's driver builds its
own request objects) and the status enum the manager compares with."""
import enum


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()


class Request:
    pass
''',
}


def _open(source: Path) -> dict[str, bytes]:
    """The files of a wheel (zip) or of an unpacked tree, by relative path."""
    if source.is_dir():
        return {str(p.relative_to(source)): p.read_bytes() for p in source.rglob("*.py")} | {
            str(p.relative_to(source)): p.read_bytes() for p in source.glob("*.dist-info/METADATA")
        }
    with zipfile.ZipFile(source) as wheel:
        wanted = [n for n in wheel.namelist() if n in VERBATIM or n.endswith(".dist-info/METADATA")]
        return {n: wheel.read(n) for n in wanted}


def version_of(files: dict[str, bytes]) -> str:
    return standins_tree.version_of(files, "vllm")


def build(source: Path, dest: Path) -> list[str]:
    """Write the tree; the upstream files copied (relative paths)."""
    files = _open(source)
    version = version_of(files)
    if dest.exists():
        shutil.rmtree(dest / "vllm", ignore_errors=True)
    copied = [rel for rel in VERBATIM if rel in files]
    standins_tree.write_files(dest, _PACKAGES, STANDINS, files, copied)
    (dest / "vllm" / "_version.py").write_text(f'__version__ = version = "{version}"\n')
    standins_tree.write_dist_info(dest, "vllm", version)
    return copied


def main(argv: Sequence[str] | None = None) -> int:
    return standins_tree.cli(
        argv,
        dist="vllm",
        what="vLLM's KV-cache modules",
        build=build,
        num_standins=len(STANDINS),
    )


if __name__ == "__main__":
    raise SystemExit(main())
