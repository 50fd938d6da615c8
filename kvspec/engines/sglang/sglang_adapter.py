"""``--target sglang`` / ``sglang-unified`` / ``sglang-unified-rust``: SGLang's own radix caches and
KV-slot allocators behind kvspec's plain API.

:data:`SglangRadixCache` builds, from kvspec's ``(size, page_size, eviction_policy)``, the installed
release's ``TokenToKVPoolAllocator`` (page size 1) or ``PagedTokenToKVPoolAllocator`` and a
``RadixCache(CacheInitParams(...))`` over it, and translates each plain call into upstream's:
token lists into ``RadixKey``/``int64`` tensors and parameter objects, tensors back into lists.
Node handles are upstream's own ``TreeNode`` objects. The snapshot reader reads the tree
(``tree``) through upstream's attribute names (docs/sglang.md §7).

:data:`SglangUnifiedRadixCache` and :data:`SglangUnifiedRustRadixCache` subclass it for
``UnifiedRadixCache`` (the 0.5.23 server default) with one ``FULL`` component, over the same
allocators, with the Python tree core (``tree_core_backend="python"``) or the Rust one
(``"rust"``, the release's default): node handles are upstream's ``NodeId`` integers, and ``tree``
is a read-only view of the core's nodes in ``RadixCache``'s attribute names (docs/sglang.md §8).

Determinism: ``RadixCache`` stamps nodes with ``time.monotonic()``, and leaves whose stamps tie
would be evicted in the iteration order of a set of node objects (by address). The adapter gives
``radix_cache``'s module a logical clock in place of ``time``: every reading is one tick later, so
no two stamps tie and a run is the same in every process. The unified cache's Python core needs
no clock of ours: it stamps nodes from a module-level counter of its own (docs/sglang.md §8.2).

Releases: the version is read from the installed distribution's metadata (``kvspec_version``);
0.5.x is supported, another release is a one-line ``TargetError``. Without SGLang installed, build
a CPU import tree from the wheel with ``python -m kvspec.engines.sglang.sglang_standins`` and put it on
``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.metadata
import itertools
import os
import re
import sys
import tempfile
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from kvspec.engines.trees import PROCESS, Namespace
from kvspec.targets import TargetError

SUPPORTED = ("0.5.",)


class LogicalClock:
    """A stand-in for the ``time`` module inside ``radix_cache``: one tick per reading."""

    def __init__(self) -> None:
        self._ticks = itertools.count(1)

    def monotonic(self) -> float:
        return float(next(self._ticks))

    def perf_counter(self) -> float:
        return 0.0

    def __deepcopy__(self, memo: dict[int, Any]) -> LogicalClock:
        return self  # shared by clones: later stamps stay later than every earlier one


def installed_version(ns: Namespace = PROCESS) -> str:
    try:
        return ns.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise TargetError(
            "--target sglang needs SGLang importable (or a CPU tree from "
            "python -m kvspec.engines.sglang.sglang_standins WHEEL DEST on PYTHONPATH)"
        ) from None


def _import(name: str, ns: Namespace = PROCESS) -> Any:
    try:
        return ns.import_module(name)
    except Exception as exc:  # not installed, or a failure deeper in SGLang's import chain
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise TargetError(f"--target sglang needs an importable {name} ({reason})") from exc


def listed(out: Any) -> list[int] | None:
    """A tensor of slots as a list (``None`` stays ``None``)."""
    return None if out is None else [int(x) for x in out.tolist()]


_BUILT: dict[tuple[Namespace, str], type] = {}


def adapter_class(ns: Namespace = PROCESS) -> type:
    """``SglangRadixCache`` over the release in ``ns`` (built once per namespace)."""
    if (ns, "radix") not in _BUILT:
        _BUILT[ns, "radix"] = _build_radix_adapter(ns)
    return _BUILT[ns, "radix"]


def unified_adapter_class(backend: str, ns: Namespace = PROCESS) -> type:
    """The ``UnifiedRadixCache`` adapter with tree core ``backend`` (``python`` or ``rust``)."""
    if (ns, backend) not in _BUILT:
        _BUILT[ns, backend] = _build_unified_adapter(adapter_class(ns), backend, ns)
    return _BUILT[ns, backend]


def _build_radix_adapter(ns: Namespace) -> type:
    version = installed_version(ns)
    if not version.startswith(SUPPORTED):
        raise TargetError(f"SGLang {version} is not supported by --target sglang (0.5.x is)")
    radix = _import("sglang.srt.mem_cache.radix_cache", ns)
    base = _import("sglang.srt.mem_cache.base_prefix_cache", ns)
    params_mod = _import("sglang.srt.mem_cache.cache_init_params", ns)
    alloc_mod = _import("sglang.srt.mem_cache.allocator", ns)
    torch = importlib.import_module("torch")
    clock = LogicalClock()
    radix.time = clock  # the module reads time.monotonic() at call time

    def tensor(values: Sequence[int]) -> Any:
        return torch.tensor(list(values), dtype=torch.int64)

    class AllocatorView:
        """Upstream's allocator with list arguments and results."""

        def __init__(self, upstream: Any) -> None:
            self.upstream = upstream
            self.page_size = int(upstream.page_size)
            self.size = int(upstream.size)

        @property
        def free_pages(self) -> Any:
            return self.upstream.free_pages

        def available_size(self) -> int:
            return int(self.upstream.available_size())

        def alloc(self, need_size: int) -> list[int] | None:
            return listed(self.upstream.alloc(need_size))

        def alloc_extend(self, prefix_len: int, seq_len: int, last_loc: int) -> list[int] | None:
            prefix, seq = tensor([prefix_len]), tensor([seq_len])
            return listed(
                self.upstream.alloc_extend(
                    prefix,
                    prefix.clone(),
                    seq,
                    seq.clone(),
                    tensor([last_loc]),
                    seq_len - prefix_len,
                )
            )

        def alloc_decode(self, seq_len: int, last_loc: int) -> list[int] | None:
            seq = tensor([seq_len])
            return listed(self.upstream.alloc_decode(seq, seq.clone(), tensor([last_loc])))

        def free(self, free_index: Sequence[int]) -> None:
            self.upstream.free(tensor(free_index))

        def free_segment(self, free_index: Sequence[int], start_pos: int) -> None:
            self.upstream.free_segment(tensor(free_index), start_pos=start_pos)

        def free_group_begin(self) -> None:
            self.upstream.free_group_begin()

        def free_group_end(self) -> None:
            self.upstream.free_group_end()

        # need_sort's staging and the open free group, read by the snapshot reader
        @property
        def staged_pages(self) -> Any:
            return getattr(self.upstream, "staged_pages", None)  # the paged allocator's

        @property
        def release_pages(self) -> Any:
            return self.upstream.release_pages  # the token allocator's (paged: None)

        @property
        def free_group(self) -> Any:
            return self.upstream.free_group

        @property
        def free_page_ids_group(self) -> Any:
            return getattr(self.upstream, "free_page_ids_group", None)

    class RowPool:
        """A one-row ``req_to_token`` pool: the request's row of slots, as upstream writes it."""

        def __init__(self, row: Sequence[int]) -> None:
            self.req_to_token = tensor(row).reshape(1, -1)

        def write(self, index: Any, values: Any) -> None:
            self.req_to_token[index] = values

    class KvRecord:
        """The request's KV record fields ``checkpoint`` reads (``req.kv``)."""

        def __init__(self, protected: int) -> None:
            self.req_pool_idx = 0
            self.cache_protected_len = protected
            self.cache_inserted_len = 0
            self.swa_evict_floor = 0

    class Request:
        """The request fields the caches' ``checkpoint`` reads: ``RadixCache``'s, and
        ``UnifiedRadixCache``'s (a running request of no streaming session, no priority)."""

        def __init__(self, tokens: Sequence[int], protected: int, lock: Any, prompt_len: int):
            self.full_untruncated_fill_ids = array("q", tokens)
            self.origin_input_ids = array("q", tokens[:prompt_len])
            self.kv = KvRecord(protected)
            self.extra_key = self.cache_salt = self.priority = None
            self.lock, self.last_node = lock, lock.node
            self.rid = "kvspec"
            self.session = self.session_id = self.kv_rotation_base = None

        def finished(self) -> bool:
            return False

    class SglangRadixCache:
        """SGLang's ``RadixCache`` over its allocator, with kvspec's plain API."""

        kvspec_version = version
        kvspec_variants = ("lru", "fifo", "mru")  # RadixCache's (the spec's unified-* are not)

        def __init__(
            self,
            size: int,
            page_size: int = 1,
            eviction_policy: str = "lru",
            need_sort: bool = False,
        ) -> None:
            if page_size == 1:
                upstream = alloc_mod.TokenToKVPoolAllocator(
                    size, torch.int64, "cpu", None, need_sort
                )
            else:
                upstream = alloc_mod.PagedTokenToKVPoolAllocator(
                    size, page_size, torch.int64, "cpu", None, need_sort
                )
            self.token_to_kv_pool_allocator = AllocatorView(upstream)
            self.page_size = page_size
            self.upstream = self._cache(
                params_mod.CacheInitParams(
                    disable=False,
                    req_to_token_pool=None,
                    token_to_kv_pool_allocator=upstream,
                    page_size=page_size,
                    eviction_policy=eviction_policy,
                )
            )

        def _cache(self, params: Any) -> Any:
            return radix.RadixCache(params)

        @property
        def tree(self) -> Any:
            """What the snapshot reader reads (``root_node``, sizes): the cache itself."""
            return self.upstream

        @staticmethod
        def _key(tokens: Sequence[int]) -> Any:
            return radix.RadixKey(array("q", tokens))

        def match_prefix(self, key: Sequence[int]) -> tuple[list[int], Any]:
            found = self.upstream.match_prefix(base.MatchPrefixParams(key=self._key(key)))
            node = found.last_device_node
            slots = listed(self.upstream.path_device_indices(node)) or []
            return slots[: found.device_prefix_len], node

        def _insert_params(self, key: Sequence[int], value: Sequence[int]) -> Any:
            return base.InsertParams(key=self._key(key), value=tensor(value))

        def insert(self, key: Sequence[int], value: Sequence[int]) -> int:
            return int(self.upstream.insert(self._insert_params(key, value)).prefix_len)

        def evict(self, num_tokens: int) -> int:
            params = base.EvictParams(num_tokens=num_tokens)
            return int(self.upstream.evict(params).num_tokens_evicted)

        def kvspec_checkpoint(
            self, tokens: Sequence[int], row: Sequence[int], protected: int, node: Any, prompt: int
        ) -> tuple[int, list[int], int, Any]:
            """Upstream's ``checkpoint(req, up_to=len(tokens))`` on a request record holding the
            lock on ``node``: (tokens already cached, the new row, ``cache_protected_len``, the
            new locked node)."""
            tree, found = self.upstream, []
            req = Request(tokens, protected, base.TreeLock(node, self._receipt(node)), prompt)
            tree.req_to_token_pool = pool = RowPool(row)
            upstream_insert = tree.insert

            def insert(params: Any) -> Any:  # the first insert's result: the cached length
                result = upstream_insert(params)
                found.append(int(result.prefix_len))
                self._inserted(params, result)
                return result

            tree.insert = insert
            try:
                tree.checkpoint(req, up_to=len(tokens))
            finally:
                del tree.insert
                tree.req_to_token_pool = None
            new_row = listed(pool.req_to_token[0]) or []
            self._keep(req.lock.node, req.lock.receipt)
            return (
                (found[0] if found else 0),
                new_row,
                int(req.kv.cache_protected_len),
                req.lock.node,
            )

        def _inserted(self, params: Any, result: Any) -> None:
            """Called with each insert ``checkpoint`` makes (the Rust adapter learns its node)."""

        def _receipt(self, node: Any) -> Any:
            """The lock receipt ``dec_lock_ref`` of ``node`` takes (none for ``RadixCache``)."""
            return base.DecLockRefParams()

        def _keep(self, node: Any, receipt: Any) -> None:
            pass

        def inc_lock_ref(self, node: Any) -> int:
            return int(self.upstream.inc_lock_ref(node).delta)

        def dec_lock_ref(self, node: Any) -> int:
            return int(self.upstream.dec_lock_ref(node).delta)

        def evictable_size(self) -> int:
            return int(self.upstream.evictable_size())

        def protected_size(self) -> int:
            return int(self.upstream.protected_size())

        def node_path(self, node: Any) -> tuple[int, ...]:
            parts = []
            while node.parent is not None:
                parts.append(tuple(int(t) for t in node.key.token_ids))
                node = node.parent
            return tuple(t for part in reversed(parts) for t in part)

    SglangRadixCache.__qualname__ = f"SglangRadixCache[sglang {version}]"
    return SglangRadixCache


def _build_unified_adapter(radix_adapter: Any, backend: str, ns: Namespace) -> type:
    unified = _import("sglang.srt.mem_cache.unified_radix_cache", ns)
    component_type = _import("sglang.srt.mem_cache.unified_cache.component_type", ns)
    if backend == "rust":
        _import("sglang.srt.mem_cache.rust_tree_core.extension", ns)  # the .so, or a TargetError
    full = component_type.ComponentType.FULL

    class NodeView:
        """One node of the Python core in ``RadixCache``'s attribute names (read-only)."""

        __slots__ = ("node",)

        def __init__(self, node: Any) -> None:
            self.node = node

        @property
        def children(self) -> dict[Any, NodeView]:
            return {k: NodeView(c) for k, c in self.node.children.items()}

        @property
        def parent(self) -> NodeView | None:
            return None if self.node.parent is None else NodeView(self.node.parent)

        @property
        def key(self) -> Any:
            return self.node.key

        @property
        def value(self) -> Any:
            return self.node.component_data[full].value

        @property
        def lock_ref(self) -> int:
            return int(self.node.component_data[full].lock_ref)

        @property
        def last_access_time(self) -> float:
            return float(self.node.last_access_time)

        @property
        def creation_time(self) -> float:
            return float(self.node.creation_time)

    class TreeView:
        """The Python core's tree, as the snapshot reader reads a ``RadixCache``."""

        def __init__(self, cache: Any) -> None:
            self.cache = cache

        @property
        def root_node(self) -> NodeView:
            return NodeView(self.cache.tree_core.root_node)

        def evictable_size(self) -> int:
            return int(self.cache.evictable_size())

        def protected_size(self) -> int:
            return int(self.cache.protected_size())

    class SglangUnifiedRadixCache(radix_adapter):  # type: ignore[misc]
        """SGLang's ``UnifiedRadixCache`` (one ``FULL`` component, tree core ``backend``) over
        the same allocators, with kvspec's plain API; node handles are ``NodeId`` integers."""

        tree_core_backend = backend
        kvspec_variant = "unified-lru"  # checked against the spec's unified-* variants
        kvspec_variants = ("unified-lru", "unified-fifo", "unified-mru")

        def __init__(
            self,
            size: int,
            page_size: int = 1,
            eviction_policy: str = "unified-lru",
            need_sort: bool = False,
        ) -> None:
            self.receipts: dict[Any, Any] = {}  # node -> the receipt of its last lock
            super().__init__(size, page_size, eviction_policy.removeprefix("unified-"), need_sort)

        def _receipt(self, node: Any) -> Any:
            return self.receipts[node]

        def _keep(self, node: Any, receipt: Any) -> None:
            self.receipts[node] = receipt

        def _cache(self, params: Any) -> Any:
            params.tree_components = (full,)
            params.tree_core_backend = self.tree_core_backend
            cache = unified.UnifiedRadixCache(params)
            core = type(cache.tree_core).__name__
            wanted = "RustUnifiedTreeCore" if backend == "rust" else "UnifiedTreeCore"
            if core != wanted:  # upstream falls back to Python where Rust is unsupported
                raise TargetError(f"UnifiedRadixCache built a {core}, not the {backend} tree core")
            return cache

        @property
        def tree(self) -> Any:
            return TreeView(self.upstream)

        def _insert_params(self, key: Sequence[int], value: Sequence[int]) -> Any:
            """The unified insert frees the caller's duplicate slots itself, from
            ``prev_prefix_len`` on; kvspec's ``insert`` leaves them to the caller (as
            ``RadixCache.insert`` does), so it passes the key's length (upstream's own way of
            re-inserting a prompt without freeing, ``checkpoint_into_tree``)."""
            params = super()._insert_params(key, value)
            params.prev_prefix_len = len(params.key)
            return params

        def insert_result(
            self, key: Sequence[int], value: Sequence[int], prev_prefix_len: int | None = None
        ) -> tuple[int, Any]:
            """Upstream's insert with ``prev_prefix_len`` (``None``: free nothing)."""
            params = super()._insert_params(key, value)
            params.prev_prefix_len = len(params.key) if prev_prefix_len is None else prev_prefix_len
            result = self.upstream.insert(params)
            return int(result.prefix_len), result.last_device_node

        def path_slots(self, node: Any) -> list[int]:
            return listed(self.upstream.path_device_indices(node)) or []

        def inc_lock_ref(self, node: Any) -> int:
            """Upstream's ``delta`` counts the tokens that became protected; kvspec's (and
            ``RadixCache``'s) is the change of the evictable size: the same tokens, negated."""
            result = self.upstream.inc_lock_ref(node)
            self._keep(node, result.to_dec_params())
            return -int(result.delta)

        def dec_lock_ref(self, node: Any) -> int:
            """Upstream reports no ``delta`` here (``None``): the change of the evictable size is
            read off its counter. The receipt is the one the node's last lock returned (a
            ``FULL``-only lock's names just the node)."""
            before = int(self.evictable_size())
            self.upstream.dec_lock_ref(node, self._receipt(node))
            return int(self.evictable_size()) - before

        def node_path(self, node: Any) -> tuple[int, ...]:
            path: tuple[int, ...] = super().node_path(self.upstream.tree_core.node_by_id(node))
            return path

    if backend != "rust":
        SglangUnifiedRadixCache.__qualname__ = (
            f"SglangUnifiedRadixCache[sglang {radix_adapter.kvspec_version}]"
        )
        return SglangUnifiedRadixCache
    return _rust_adapter(SglangUnifiedRadixCache, full)


class _Logged:
    """An allocator view that logs its mutating calls (the Rust adapter's replay, above)."""

    MUTATING = frozenset(
        {"alloc", "alloc_extend", "alloc_decode", "free", "free_segment", "free_group_begin",
         "free_group_end"}
    )  # fmt: skip

    def __init__(self, inner: Any, log: list[tuple[bool, str, Any]]) -> None:
        self.inner, self.log = inner, log

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "log"):  # not set yet (a copy under construction)
            raise AttributeError(name)
        found = getattr(self.inner, name)
        if name not in self.MUTATING:
            return found

        def call(*args: Any) -> Any:
            self.log.append((True, name, copy.deepcopy(args)))
            return found(*args)

        return call


class _RustNode:
    """One node of the Rust core, as read off its bindings (times are not exposed)."""

    def __init__(self, key: tuple[int, ...], value: list[int], lock_ref: int) -> None:
        self.children: dict[tuple[int, int], _RustNode] = {}
        self.key, self.value, self.lock_ref = key, value, lock_ref
        self.last_access_time = self.creation_time = 0.0


def _rust_adapter(unified_adapter: Any, full: Any) -> type:
    class RustTreeView:
        """The Rust core's tree in ``RadixCache``'s attribute names, built per read: the node ids
        the adapter has seen and their ancestors (``collect_path_info``: parent, path span), each
        node's slots (``get_component_device_value``) and lock count (``pretty_print``'s
        ``full_lock``); tokens from the keys the ids were returned for."""

        def __init__(self, adapter: Any) -> None:
            self.adapter = adapter
            binding = adapter.upstream.tree_core._binding
            rows: dict[int, tuple[int, int, int]] = {}  # id -> (parent, start, end)
            for node_id in sorted(adapter.seen):
                try:
                    (path,) = binding.collect_path_info([node_id])
                except KeyError:  # evicted: node ids are never reused
                    adapter.seen.discard(node_id)
                    continue
                for info in path:
                    rows[int(info[0])] = (int(info[1]), int(info[2]), int(info[3]))
            adapter.seen |= set(rows)  # ancestors too: one may be the last of its branch
            locks = adapter.lock_counts()
            self.root = _RustNode((), [], 1)
            nodes = {int(adapter.upstream.root_node_handle()): self.root}
            for node_id, (_, start, end) in sorted(rows.items(), key=lambda r: r[1][2]):
                path = adapter.paths[node_id]
                value = listed(binding.get_component_device_value(node_id, int(full))) or []
                nodes[node_id] = _RustNode(path[start:end], value, locks[node_id])
            for node_id, (parent, start, _) in sorted(rows.items()):
                nodes[parent].children[start, node_id] = nodes[node_id]

        @property
        def root_node(self) -> _RustNode:
            return self.root

        def evictable_size(self) -> int:
            return int(self.adapter.evictable_size())

        def protected_size(self) -> int:
            return int(self.adapter.protected_size())

    class SglangUnifiedRustRadixCache(unified_adapter):  # type: ignore[misc]
        """``UnifiedRadixCache`` over the Rust tree core. Its bindings expose no access or
        creation times: the snapshot comparison leaves their ranks out (``kvspec_unobserved``);
        their observable effect, the eviction order, is still compared (docs/sglang.md §8.4)."""

        kvspec_unobserved = ("access_rank", "created_rank")

        def __init__(
            self,
            size: int,
            page_size: int = 1,
            eviction_policy: str = "unified-lru",
            need_sort: bool = False,
        ) -> None:
            self.seen: set[int] = set()
            self.paths: dict[int, tuple[int, ...]] = {}
            self.made = (size, page_size, eviction_policy, need_sort)
            self.log: list[tuple[bool, str, Any]] = []  # (on the allocator?, method, arguments)
            super().__init__(size, page_size, eviction_policy, need_sort)
            root = int(self.upstream.root_node_handle())
            self.paths[root] = ()
            fields: dict[str, Any] = self.__dict__  # (the view's type lives in a closure)
            fields["token_to_kv_pool_allocator"] = _Logged(
                fields["token_to_kv_pool_allocator"], self.log
            )

        def __deepcopy__(self, memo: dict[int, Any]) -> Any:
            """The core's binding cannot be copied (the explorer copies states): a fresh cache
            replays every mutating call this one received. Node ids are numbered per core, in
            call order, so the copy's ids are this one's."""
            twin = type(self)(*self.made)
            for on_allocator, method, args in self.log:
                obj = twin.token_to_kv_pool_allocator if on_allocator else twin
                # a call that raised the first time raises again, with the same effect
                with contextlib.suppress(Exception):
                    getattr(obj, method)(*copy.deepcopy(args))
            memo[id(self)] = twin
            memo[id(self.token_to_kv_pool_allocator)] = twin.token_to_kv_pool_allocator
            return twin

        def _logged(self, method: str, *args: Any) -> None:
            self.log.append((False, method, copy.deepcopy(args)))

        def _learn(self, node_id: Any, key: Sequence[int]) -> Any:
            """Record the token paths of ``node_id`` and its ancestors, returned for ``key``
            (a node's path is the prefix of the key it was returned for, up to its end)."""
            node_id = int(node_id)
            (path,) = self.upstream.tree_core._binding.collect_path_info([node_id])
            tokens = tuple(int(t) for t in key)
            for info in path:
                self.paths.setdefault(int(info[0]), tokens[: int(info[3])])
                self.seen.add(int(info[0]))
            return node_id

        @property
        def tree(self) -> Any:
            return RustTreeView(self)

        def lock_counts(self) -> dict[int, int]:
            """``full_lock`` of every node, from the core's ``pretty_print`` (its only reader of
            lock counts), captured from file descriptor 1."""
            sys.stdout.flush()
            with tempfile.TemporaryFile() as out:
                saved = os.dup(1)
                os.dup2(out.fileno(), 1)
                try:
                    self.upstream.tree_core.pretty_print()
                finally:
                    os.dup2(saved, 1)
                    os.close(saved)
                out.seek(0)
                text = out.read().decode()
            return {int(i): int(n) for i, n in re.findall(r"\[(\d+)\] \d+ full_lock=(-?\d+)", text)}

        def match_prefix(self, key: Sequence[int]) -> tuple[list[int], Any]:
            self._logged("match_prefix", key)
            slots, node = super().match_prefix(key)
            return slots, self._learn(node, key)

        def insert_result(
            self, key: Sequence[int], value: Sequence[int], prev_prefix_len: int | None = None
        ) -> tuple[int, Any]:
            self._logged("insert_result", key, value, prev_prefix_len)
            matched, node = super().insert_result(key, value, prev_prefix_len)
            return matched, self._learn(node, key)

        def insert(self, key: Sequence[int], value: Sequence[int]) -> int:
            return self.insert_result(key, value)[0]

        def evict(self, num_tokens: int) -> int:
            self._logged("evict", num_tokens)
            return int(super().evict(num_tokens))

        def inc_lock_ref(self, node: Any) -> int:
            self._logged("inc_lock_ref", node)
            return int(super().inc_lock_ref(node))

        def dec_lock_ref(self, node: Any) -> int:
            self._logged("dec_lock_ref", node)
            return int(super().dec_lock_ref(node))

        def kvspec_checkpoint(
            self, tokens: Sequence[int], row: Sequence[int], protected: int, node: Any, prompt: int
        ) -> tuple[int, list[int], int, Any]:
            self._logged("kvspec_checkpoint", tokens, row, protected, node, prompt)
            out: tuple[int, list[int], int, Any] = super().kvspec_checkpoint(
                tokens, row, protected, node, prompt
            )
            return out

        def _inserted(self, params: Any, result: Any) -> None:
            self._learn(result.last_device_node, params.key.token_ids[: len(params.key)])

        def node_path(self, node: Any) -> tuple[int, ...]:
            return self.paths[int(node)]

    SglangUnifiedRustRadixCache.__qualname__ = (
        f"SglangUnifiedRustRadixCache[sglang {unified_adapter.kvspec_version}]"
    )
    return SglangUnifiedRustRadixCache


_NAMES: dict[str, Callable[[Namespace], type]] = {
    "SglangRadixCache": adapter_class,
    "SglangUnifiedRadixCache": lambda ns: unified_adapter_class("python", ns),
    "SglangUnifiedRustRadixCache": lambda ns: unified_adapter_class("rust", ns),
}


def target_class(name: str, ns: Namespace) -> type:
    """The adapter ``name`` over the SGLang of namespace ``ns`` (``sglang@SOURCE``)."""
    if name not in _NAMES:
        raise TargetError(f"{__name__} has no target {name!r}")
    return _NAMES[name](ns)


def __getattr__(name: str) -> Any:
    """``kvspec.engines.sglang.sglang_adapter:SglangRadixCache`` (the target loader's ``sglang`` name) and the
    unified ones import SGLang only when asked for, raising ``TargetError`` — not
    ``AttributeError`` — when it cannot."""
    if name in _NAMES:
        return _NAMES[name](PROCESS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
