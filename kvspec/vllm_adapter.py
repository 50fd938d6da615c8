"""``--target vllm`` for the CPU offload components: vLLM's own offload manager behind kvspec's API.

The adapter constructs ``vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager`` (which builds its
own ``ARCCachePolicy`` / ``LRUCachePolicy`` from ``cache_policy``) and presents it with the
constructor and results of :class:`spec.vllm.offload_manager.CPUOffloadingManager`:

* ``req_context`` is passed as ``None`` where upstream's methods take it (#47744 onward; LRU and ARC
  ignore it), and omitted where they do not;
* results become kvspec's values: ``LookupResult`` by name, block ids as a tuple of ints (upstream
  holds a numpy array), events as kvspec ``OffloadingEvent``s;
* every other attribute (``_num_blocks``, ``_free_list``, ``_policy`` with ``t1``/``t2``/``b1``/
  ``b2``/``target_t1_size`` or ``blocks``/``evictable_blocks``, ``events``, ``counts``,
  ``_num_evictable_cache_blocks``) is read from the upstream object, so the snapshot is upstream's.

Variants are upstream's version, not a switch: ``arc_t1_fallback`` and ``lru`` are accepted and
ignored, so ``--variant`` names the behaviour the installed vLLM is *expected* to have (#55461
fallback or not; LRU v1 before #46216, v2 after) and a mismatch shows up as a divergence.

vLLM is optional: the class is resolved when the target loader asks for it, and if the module
cannot be imported (not installed, or its import chain fails without a GPU) the loader reports a
one-line :class:`~kvspec.targets.TargetError` (``kvspec`` exits 2).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Collection, Iterator
from typing import Any

from kvspec.targets import TargetError
from spec.vllm import Key
from spec.vllm.offload_manager import (
    CPULoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    PrepareStoreOutput,
)

UPSTREAM_MODULE = "vllm.v1.kv_offload.cpu.manager"
UPSTREAM_CLASS = "CPUOffloadingManager"


def load_upstream() -> type:
    """vLLM's ``CPUOffloadingManager`` class; ``TargetError`` with a one-line reason otherwise."""
    try:
        module = importlib.import_module(UPSTREAM_MODULE)
    except Exception as exc:  # not installed, or a failure deeper in vLLM's import chain
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise TargetError(
            f"--target vllm needs an importable {UPSTREAM_MODULE} ({reason})"
        ) from exc
    cls = getattr(module, UPSTREAM_CLASS, None)
    if not isinstance(cls, type):
        raise TargetError(f"{UPSTREAM_MODULE} has no class {UPSTREAM_CLASS} (unsupported vLLM)")
    return cls


def _takes_context(method: Callable[..., Any]) -> bool:
    try:
        return "req_context" in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def adapter_class(upstream: type) -> type:
    """A kvspec-API class over the upstream manager class ``upstream``."""
    with_context = {
        name: _takes_context(getattr(upstream, name))
        for name in (
            "lookup",
            "prepare_load",
            "complete_load",
            "prepare_store",
            "complete_store",
            "touch",
        )
    }
    accepted = set(inspect.signature(upstream).parameters)

    class VllmCPUOffloadingManager:
        """vLLM's ``CPUOffloadingManager`` with kvspec's constructor and result types."""

        def __init__(
            self,
            num_blocks: int,
            cache_policy: str = "lru",
            enable_events: bool = False,
            store_threshold: int = 1,
            max_tracker_size: int = 64_000,
            *,
            arc_t1_fallback: bool = False,
            lru: str = "v2",
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
            self.requested_variant = {"arc_t1_fallback": arc_t1_fallback, "lru": lru}

        def __getattr__(self, name: str) -> Any:  # upstream attributes, for the snapshot reader
            manager = self.__dict__.get("_manager")
            if manager is None:
                raise AttributeError(name)
            return getattr(manager, name)

        def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
            if with_context[method]:
                kwargs["req_context"] = None
            return getattr(self._manager, method)(*args, **kwargs)

        def lookup(self, key: Key, req_context: object = None) -> LookupResult:
            result = self._call("lookup", key)
            name = getattr(result, "name", None)
            if isinstance(name, str) and name in LookupResult.__members__:
                return LookupResult[name]
            return result  # type: ignore[no-any-return]  # an older vLLM's own value, compared as is

        def prepare_load(
            self, keys: Collection[Key], req_context: object = None
        ) -> CPULoadStoreSpec:
            spec = self._call("prepare_load", keys)
            return CPULoadStoreSpec(tuple(int(b) for b in spec.block_ids))

        def complete_load(self, keys: Collection[Key], req_context: object = None) -> None:
            self._call("complete_load", keys)

        def touch(self, keys: Collection[Key], req_context: object = None) -> None:
            self._call("touch", keys)

        def prepare_store(
            self, keys: Collection[Key], req_context: object = None
        ) -> PrepareStoreOutput | None:
            out = self._call("prepare_store", keys)
            if out is None:
                return None
            return PrepareStoreOutput(
                keys_to_store=list(out.keys_to_store),
                store_spec=CPULoadStoreSpec(tuple(int(b) for b in out.store_spec.block_ids)),
                evicted_keys=list(out.evicted_keys),
            )

        def complete_store(
            self, keys: Collection[Key], req_context: object = None, success: bool = True
        ) -> None:
            self._call("complete_store", keys, success=success)

        def reset_cache(self) -> None:
            self._manager.reset_cache()

        def take_events(self) -> Iterator[OffloadingEvent]:
            for event in self._manager.take_events():
                medium = getattr(event, "medium", "CPU")
                yield OffloadingEvent(
                    keys=list(event.keys),
                    medium=str(getattr(medium, "name", medium)),
                    removed=bool(event.removed),
                )

    VllmCPUOffloadingManager.__qualname__ = f"VllmCPUOffloadingManager[{upstream.__module__}]"
    return VllmCPUOffloadingManager


def __getattr__(name: str) -> Any:
    """``kvspec.vllm_adapter:VllmCPUOffloadingManager`` (the target loader's ``vllm`` name) imports
    vLLM only when asked for, raising ``TargetError`` — not ``AttributeError`` — when it cannot."""
    if name == "VllmCPUOffloadingManager":
        return adapter_class(load_upstream())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
