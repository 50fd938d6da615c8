"""``--target vllm`` for the CPU offload components: vLLM's own offload manager behind kvspec's API.

The adapter constructs ``vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager`` (which builds its
own ``ARCCachePolicy`` / ``LRUCachePolicy`` from ``cache_policy``) and presents it with the
constructor, arguments, results and attribute names of
:class:`spec.vllm.offload_manager.CPUOffloadingManager`, bridging the API of every release from
0.28.0 to 0.33.0 (docs/vllm-releases.md §1.2):

* the block count goes positionally (``num_blocks`` up to 0.29.0, ``num_chunks`` from 0.30.0);
  other keywords only where the constructor takes them;
* every call that takes a request context gets a fresh ``ReqContext`` (an anonymous request that
  never finishes — 0.31.0+ keep per-request records in it and reject ``None``);
* kvspec's keys (ints) travel as upstream's offload keys — 8 key bytes and a 4-byte group index 0
  (0.31.0+ read the group) — and every key that comes back is decoded: results, events, the
  threshold tracker, the ARC lists, the LRU maps;
* the state kvspec reads is presented under the snapshot reader's names: the ``_chunks`` counters
  of 0.30.0+ as ``_num_blocks`` / ``_num_allocated_blocks`` / ``_num_evictable_cache_blocks``,
  ``chunk_id`` as ``block_id``, and 0.31.0+'s rank LRU as its cached keys in rank order (the v1
  view: every cached key, the eviction order among the idle ones);
* results become kvspec's values: ``LookupResult`` by name, block ids as a tuple of ints (upstream
  holds a numpy array).

The installed release decides the behaviour: :data:`VllmCPUOffloadingManager` carries
``kvspec_variant`` (``rX.Y``, read from the installed version), which ``kvspec`` uses unless
``--variant`` names another. A release no variant models (outside 0.28–0.33, or an unreleased
revision from ``git:``) gets ``kvspec_variant = None`` and ``kvspec_unknown``, a one-line message
naming the nearest modelled variant (``kvspec_nearest``): against the spec the CLI refuses it
(exit 2) unless ``--variant`` names one; ``--baseline`` and ``--oracle invariants`` run it.
The variant keywords kvspec passes (``arc_t1_fallback``, ``lru``, the release features) are
accepted and ignored: a mismatch between the named variant and the release shows as a divergence.

vLLM is optional: the class is resolved when the target loader asks for it, and if the module
cannot be imported (not installed, or its import chain fails without a GPU) the loader reports a
one-line :class:`~kvspec.targets.TargetError` (``kvspec`` exits 2).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import itertools
import re
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

from kvspec.engines.trees import PROCESS, Namespace
from kvspec.targets import TargetError
from spec.vllm import Key
from spec.vllm.offload_manager import (
    CPULoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    PrepareStoreOutput,
)
from spec.vllm.releases import RELEASES

UPSTREAM_MODULE = "vllm.v1.kv_offload.cpu.manager"
UPSTREAM_CLASS = "CPUOffloadingManager"
CONTEXT_MODULE = "vllm.v1.kv_offload.base"
_GROUP = (0).to_bytes(4, "big")


def load_upstream(ns: Namespace = PROCESS) -> type:
    """vLLM's ``CPUOffloadingManager`` class; ``TargetError`` with a one-line reason otherwise."""
    try:
        module = ns.import_module(UPSTREAM_MODULE)
    except Exception as exc:  # not installed, or a failure deeper in vLLM's import chain
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise TargetError(
            f"--target vllm needs an importable {UPSTREAM_MODULE} ({reason})"
        ) from exc
    cls = getattr(module, UPSTREAM_CLASS, None)
    if not isinstance(cls, type):
        raise TargetError(f"{UPSTREAM_MODULE} has no class {UPSTREAM_CLASS} (unsupported vLLM)")
    return cls


def installed_version(ns: Namespace = PROCESS) -> str:
    """The installed vLLM's version: its distribution metadata (imports nothing), else
    ``vllm._version.version`` (a source checkout or a copied package)."""
    try:
        return ns.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return str(ns.import_module("vllm._version").version)
    except Exception as exc:
        raise TargetError(f"cannot tell the installed vLLM's version ({exc})") from exc


def release_variant(version: str, releases: Collection[str] = tuple(RELEASES)) -> str | None:
    """``"0.31.2"`` -> ``"r0.31"``; ``None`` for a version no variant models (another release,
    or an unreleased revision such as ``0.33.0+12.gabc`` from ``git:``)."""
    if UNRELEASED.search(version):
        return None
    release = ".".join(version.split("+")[0].split(".")[:2])
    return f"r{release}" if release in releases else None


UNRELEASED = re.compile(
    r"\+\d+\.g[0-9a-f]+$"
)  # kvspec.engines.trees.git_version past a release tag


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split(".") if p.isdigit())


def nearest_variant(version: str, releases: Collection[str] = tuple(RELEASES)) -> str:
    """The modelled release closest below ``version`` (the oldest if it is older than all)."""
    wanted = _release_key(".".join(version.split("+")[0].split(".")[:2]))
    below = [r for r in releases if _release_key(r) <= wanted]
    return f"r{(below or list(releases))[-1 if below else 0]}"


def unknown_message(version: str, releases: Collection[str] = tuple(RELEASES)) -> str | None:
    """``None`` for a modelled release, else the one line the CLI prints."""
    if release_variant(version, releases) is not None:
        return None
    modelled = f"{next(iter(releases))}–{list(releases)[-1]}"
    return (
        f"vLLM {version} is not a release kvspec's spec models (modelled: {modelled}); "
        f"nearest modelled variant {nearest_variant(version, releases)}"
    )


# ----------------------------------------------------------------------------- keys
def encode(key: Key) -> Any:
    """kvspec's int key as an upstream offload key: 8 big-endian bytes, then group index 0."""
    if isinstance(key, int):
        return key.to_bytes(8, "big", signed=True) + _GROUP
    return key


def decode(key: Any) -> Key:
    """The inverse of :func:`encode` (other keys unchanged)."""
    if isinstance(key, bytes | bytearray) and len(key) == 12 and key[8:] == _GROUP:
        return int.from_bytes(key[:8], "big", signed=True)
    return key  # type: ignore[no-any-return]


@dataclass(frozen=True)
class BlockView:
    """An upstream ``BlockStatus`` / ``ChunkStatus`` under the reader's names (a live view)."""

    source: Any

    @property
    def block_id(self) -> int:
        status = self.source
        return int(getattr(status, "block_id", getattr(status, "chunk_id", -1)))

    @property
    def ref_cnt(self) -> int:
        return int(self.source.ref_cnt)


def _entries(mapping: Any) -> OrderedDict[Key, BlockView]:
    return OrderedDict((decode(k), BlockView(v)) for k, v in mapping.items())


def _keys(mapping: Any) -> OrderedDict[Key, None]:
    return OrderedDict((decode(k), None) for k in mapping)


class ARCView:
    """An upstream ARC policy's lists, decoded (read by ``read_arc_policy``)."""

    def __init__(self, policy: Any) -> None:
        self.t1, self.t2 = _entries(policy.t1), _entries(policy.t2)
        self.b1, self.b2 = _keys(policy.b1), _keys(policy.b2)
        self.target_t1_size = policy.target_t1_size


class LRUView:
    """An upstream LRU policy, decoded (read by ``read_lru_policy``): ``blocks`` (``chunks`` from
    0.30.0) and ``evictable_blocks`` (``evictable_chunks``); from 0.31.0 the cached keys in rank
    order and no evictable list, which the reader takes as the v1 order."""

    def __init__(self, policy: Any) -> None:
        cached = getattr(policy, "chunks", None)
        if cached is None:
            cached = policy.blocks
        ranks = getattr(policy, "_ranks", None)
        if ranks is not None:
            order = sorted(cached, key=lambda k: (ranks[k], k))
            self.blocks = OrderedDict((decode(k), BlockView(cached[k])) for k in order)
            return
        self.blocks = _entries(cached)
        evictable = getattr(policy, "evictable_chunks", None)
        if evictable is None:
            evictable = getattr(policy, "evictable_blocks", None)
        if evictable is not None:
            self.evictable_blocks = _keys(evictable)


def _takes_context(method: Callable[..., Any]) -> bool:
    try:
        return "req_context" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _context_factory(ns: Namespace = PROCESS) -> Callable[[], Any]:
    """Fresh upstream request contexts (``None`` where the release has no ``ReqContext``)."""
    try:
        context = ns.import_module(CONTEXT_MODULE).ReqContext
    except (ImportError, AttributeError):
        return lambda: None
    counter = itertools.count()
    return lambda: context(req_id=f"kvspec-{next(counter)}")


# what every release has (0.34.0 dropped touch(): the checkers leave it out for r0.34)
_DRIVEN = ("lookup", "prepare_load", "complete_load", "prepare_store", "complete_store")


def adapter_class(
    upstream: type,
    variant: str | None = None,
    ns: Namespace = PROCESS,
    version: str | None = None,
) -> type:
    """A kvspec-API class over the upstream manager class ``upstream``; ``variant`` is the
    kvspec variant of the release (``None``: no variant models ``version``)."""
    missing = [name for name in _DRIVEN if not callable(getattr(upstream, name, None))]
    if missing:
        raise TargetError(
            f"vLLM {version or '?'}'s {upstream.__name__} lacks {', '.join(missing)}: an API "
            "kvspec's offload adapter does not bridge (it bridges 0.28–0.34)"
        )
    with_context = {
        name: hasattr(upstream, name) and _takes_context(getattr(upstream, name))
        for name in (
            "lookup",
            "prepare_load",
            "complete_load",
            "prepare_store",
            "complete_store",
            "touch",
        )
    }
    accepted = set(list(inspect.signature(upstream).parameters)[1:])  # the first is the count
    new_context = _context_factory(ns)

    class VllmCPUOffloadingManager:
        """vLLM's ``CPUOffloadingManager`` with kvspec's constructor, keys and result types."""

        kvspec_variant = variant
        kvspec_version = version
        kvspec_unknown = None if version is None else unknown_message(version)
        kvspec_nearest = None if version is None else nearest_variant(version)

        def __init__(
            self,
            num_blocks: int,
            cache_policy: str = "lru",
            enable_events: bool = False,
            store_threshold: int = 1,
            max_tracker_size: int = 64_000,
            **variant_keywords: Any,  # what kvspec expects; the installed release decides
        ) -> None:
            options = {
                "cache_policy": cache_policy,
                "enable_events": enable_events,
                "store_threshold": store_threshold,
                "max_tracker_size": max_tracker_size,
            }
            self._manager = upstream(
                num_blocks, **{k: v for k, v in options.items() if k in accepted}
            )
            self.requested_variant = variant_keywords

        # ------------------------------------------------------------ the state kvspec reads
        def _first(self, *names: str) -> Any:
            for name in names:
                if hasattr(self._manager, name):
                    return getattr(self._manager, name)
            raise AttributeError(f"{type(self._manager).__name__} has none of {names}")

        @property
        def _num_blocks(self) -> int:
            return int(self._first("_num_blocks", "_num_chunks"))

        @property
        def _num_allocated_blocks(self) -> int:
            return int(self._first("_num_allocated_blocks", "_num_allocated_chunks"))

        @property
        def _num_evictable_cache_blocks(self) -> int:
            return int(self._first("_num_evictable_cache_blocks", "_num_evictable_cache_chunks"))

        @property
        def _free_list(self) -> list[int]:
            return [int(i) for i in self._manager._free_list]

        @property
        def _policy(self) -> Any:
            policy = self._manager._policy
            return ARCView(policy) if hasattr(policy, "t1") else LRUView(policy)

        @property
        def events(self) -> list[OffloadingEvent] | None:
            events = self._manager.events
            return None if events is None else [self._event(e) for e in events]

        @property
        def counts(self) -> OrderedDict[Key, int] | None:
            counts = self._manager.counts
            return (
                None if counts is None else OrderedDict((decode(k), n) for k, n in counts.items())
            )

        def __getattr__(self, name: str) -> Any:  # anything else, from upstream
            manager = self.__dict__.get("_manager")
            if manager is None:
                raise AttributeError(name)
            return getattr(manager, name)

        # ------------------------------------------------------------ the calls
        def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
            if with_context[method]:
                kwargs["req_context"] = new_context()
            return getattr(self._manager, method)(*args, **kwargs)

        @staticmethod
        def _event(event: Any) -> OffloadingEvent:
            medium = getattr(event, "medium", "CPU")
            return OffloadingEvent(
                keys=[decode(k) for k in event.keys],
                medium=str(getattr(medium, "name", medium)),
                removed=bool(event.removed),
                metadata_only=bool(getattr(event, "metadata_only", False)),
            )

        def lookup(self, key: Key, req_context: object = None) -> LookupResult:
            result = self._call("lookup", encode(key))
            name = getattr(result, "name", None)
            if isinstance(name, str) and name in LookupResult.__members__:
                return LookupResult[name]
            return result  # type: ignore[no-any-return]  # an older vLLM's own value, compared as is

        def prepare_load(
            self, keys: Collection[Key], req_context: object = None
        ) -> CPULoadStoreSpec:
            spec = self._call("prepare_load", [encode(k) for k in keys])
            return CPULoadStoreSpec(tuple(int(b) for b in spec.block_ids))

        def complete_load(self, keys: Collection[Key], req_context: object = None) -> None:
            self._call("complete_load", [encode(k) for k in keys])

        def touch(self, keys: Collection[Key], req_context: object = None) -> None:
            self._call("touch", [encode(k) for k in keys])

        def prepare_store(
            self, keys: Collection[Key], req_context: object = None
        ) -> PrepareStoreOutput | None:
            out = self._call("prepare_store", [encode(k) for k in keys])
            if out is None:
                return None
            return PrepareStoreOutput(
                keys_to_store=[decode(k) for k in out.keys_to_store],
                store_spec=CPULoadStoreSpec(tuple(int(b) for b in out.store_spec.block_ids)),
                evicted_keys=[decode(k) for k in out.evicted_keys],
            )

        def complete_store(
            self, keys: Collection[Key], req_context: object = None, success: bool = True
        ) -> None:
            self._call("complete_store", [encode(k) for k in keys], success=success)

        def reset_cache(self) -> None:
            self._manager.reset_cache()

        def take_events(self) -> Iterator[OffloadingEvent]:
            for event in self._manager.take_events():
                yield self._event(event)

    VllmCPUOffloadingManager.__qualname__ = f"VllmCPUOffloadingManager[{upstream.__module__}]"
    return VllmCPUOffloadingManager


def __getattr__(name: str) -> Any:
    """``kvspec.engines.vllm.vllm_adapter:VllmCPUOffloadingManager`` (the target loader's ``vllm``
    name) imports vLLM only when asked for, raising ``TargetError`` — not ``AttributeError`` —
    when it cannot."""
    if name == "VllmCPUOffloadingManager":
        return target_class(name, PROCESS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def target_class(name: str, ns: Namespace) -> type:
    """The adapter over the vLLM of namespace ``ns`` (the target loader's ``vllm@SOURCE``)."""
    if name != "VllmCPUOffloadingManager":
        raise TargetError(f"{__name__} has no target {name!r}")
    upstream = load_upstream(ns)
    version = installed_version(ns)
    return adapter_class(upstream, release_variant(version), ns, version)
