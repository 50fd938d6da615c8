"""``--target vllm`` across vLLM releases, on kvspec's own stand-ins (no vLLM code): the installed
release picks the variant, its API shape is bridged (0.30.0's chunk names, 0.31.0's required
request context, byte keys and rank LRU), a named variant overrides, an unknown release is exit 2.
The release variants themselves are checked spec against impl."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Collection
from typing import Any

import pytest

from impl.vllm.offload_manager import CPUOffloadingManager as ImplManager
from kvspec import components
from kvspec.cli import main
from kvspec.engines.vllm.vllm_adapter import decode, encode, release_variant
from spec.vllm.offload_manager import VARIANTS
from spec.vllm.releases import RELEASES, record_offers, release_keywords, select_store_keys
from stateful_tests.lockstep import Step


class ReqContext:
    """The stand-in of ``vllm.v1.kv_offload.base.ReqContext``."""

    def __init__(self, req_id: str) -> None:
        self.req_id = req_id


class _Status:
    def __init__(self, block: Any) -> None:
        self.chunk_id, self.ref_cnt = block.block_id, block.ref_cnt


class _Policy:
    """The impl's policy as a 0.30/0.31 upstream policy shows it: byte keys, ``chunk_id``,
    ``chunks``/``evictable_chunks`` (0.30) or ``chunks``/``_ranks`` (0.31, rank LRU)."""

    def __init__(self, policy: Any, ranks: bool) -> None:
        if hasattr(policy, "t1"):
            self.t1 = {encode(k): _Status(b) for k, b in policy.t1.items()}
            self.t2 = {encode(k): _Status(b) for k, b in policy.t2.items()}
            self.b1, self.b2 = [encode(k) for k in policy.b1], [encode(k) for k in policy.b2]
            self.target_t1_size = policy.target_t1_size
            return
        self.chunks = {encode(k): _Status(b) for k, b in policy.blocks.items()}
        if ranks:  # v1 order = ascending rank
            self._ranks = {encode(k): i for i, k in enumerate(policy.blocks)}
        else:
            self.evictable_chunks = [encode(k) for k in policy.evictable_blocks]


def chunk_shaped(release: str) -> type:
    """A manager with the API shape of ``release`` (0.30 or 0.31) and its behaviour (the impl in
    the release's variant): ``num_chunks``, ``_num_chunks``…, a required ``ReqContext`` (0.31) and
    byte keys."""

    class Manager:
        def __init__(
            self,
            num_chunks: int,
            cache_policy: str = "lru",
            cache_policy_module_path: str | None = None,
            enable_events: bool = False,
            store_threshold: int = 1,
            max_tracker_size: int = 64_000,
        ) -> None:
            features = release_keywords(cache_policy, release)
            self._m = ImplManager(
                num_chunks, cache_policy, enable_events, store_threshold, max_tracker_size,  # type: ignore[arg-type]
                **features,
            )  # fmt: skip

        def _keys(self, keys: Collection[Any], ctx: Any) -> list[Any]:
            if release >= "0.31" and not isinstance(ctx, ReqContext):
                raise AttributeError("'NoneType' object has no attribute 'get_state'")
            assert all(isinstance(k, bytes) for k in keys), keys
            return [decode(k) for k in keys]

        @property
        def _num_chunks(self) -> int:
            return self._m._num_blocks

        @property
        def _num_allocated_chunks(self) -> int:
            return self._m._num_allocated_blocks

        @property
        def _num_evictable_cache_chunks(self) -> int:
            return self._m._num_evictable_cache_blocks

        @property
        def _free_list(self) -> list[int]:
            return self._m._free_list

        @property
        def _policy(self) -> _Policy:
            return _Policy(self._m._policy, ranks=release >= "0.31")

        @property
        def events(self) -> Any:
            events = self._m.events
            if events is None:
                return None
            return [types.SimpleNamespace(keys=[encode(k) for k in e.keys], removed=e.removed)
                    for e in events]  # fmt: skip

        @property
        def counts(self) -> Any:
            counts = self._m.counts
            return None if counts is None else {encode(k): n for k, n in counts.items()}

        def lookup(self, key: bytes, req_context: Any) -> Any:
            return self._m.lookup(self._keys([key], req_context)[0])

        def touch(self, keys: Collection[bytes], req_context: Any) -> None:
            self._m.touch(self._keys(keys, req_context))

        def prepare_load(self, keys: Collection[bytes], req_context: Any) -> Any:
            return self._m.prepare_load(self._keys(keys, req_context))

        def complete_load(self, keys: Collection[bytes], req_context: Any) -> None:
            self._m.complete_load(self._keys(keys, req_context))

        def prepare_store(self, keys: Collection[bytes], req_context: Any) -> Any:
            out = self._m.prepare_store(self._keys(keys, req_context))
            if out is None:
                return None
            return types.SimpleNamespace(
                keys_to_store=[encode(k) for k in out.keys_to_store],
                store_spec=out.store_spec,
                evicted_keys=[encode(k) for k in out.evicted_keys],
            )

        def complete_store(
            self, keys: Collection[bytes], req_context: Any, success: bool = True
        ) -> None:
            self._m.complete_store(self._keys(keys, req_context), success=success)

        def reset_cache(self) -> None:
            self._m.reset_cache()

        def take_events(self) -> Any:
            for e in self._m.take_events():
                yield types.SimpleNamespace(keys=[encode(k) for k in e.keys], removed=e.removed)

    return Manager


def install(monkeypatch: pytest.MonkeyPatch, version: str, manager: type) -> None:
    """A ``vllm`` of ``version`` whose CPU offload manager is ``manager``."""
    for name in ("vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.cpu"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for name, attrs in (
        ("vllm._version", {"version": version}),
        ("vllm.v1.kv_offload.base", {"ReqContext": ReqContext}),
        ("vllm.v1.kv_offload.cpu.manager", {"CPUOffloadingManager": manager}),
    ):
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)


def fuzz(capsys: pytest.CaptureFixture[str], component: str, *extra: str) -> tuple[int, Any]:
    argv = ["fuzz", component, "--target", "vllm", "--ops", "4000", "--no-shrink", "--json"]
    rc = main([*argv, *extra])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("release", ["0.30", "0.31"])
@pytest.mark.parametrize("component", ["vllm-arc", "vllm-lru"])
def test_the_installed_release_picks_the_variant_and_its_api_is_bridged(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    release: str,
    component: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    install(monkeypatch, f"{release}.1", chunk_shaped(release))
    rc, doc = fuzz(capsys, component)
    assert rc == 0, doc["counterexample"]
    assert doc["variant"] == f"r{release}" and doc["divergences"] == 0


def test_a_named_variant_overrides_the_detected_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    install(monkeypatch, "0.31.0", chunk_shaped("0.31"))
    rc, doc = fuzz(capsys, "vllm-lru", "--variant", "r0.30")  # 0.31's LRU is v1, 0.30's v2
    assert rc == 1 and doc["variant"] == "r0.30"
    assert doc["counterexample"]["check"] == "lru_order_consistent"


def test_an_unsupported_release_is_exit_2_in_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    install(monkeypatch, "0.27.0", chunk_shaped("0.30"))
    assert main(["fuzz", "vllm-arc", "--target", "vllm", "--ops", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vLLM 0.27.0 is not a release" in err[0] and "r0.28" in err[0]


def test_release_names_and_keys() -> None:
    assert release_variant("0.33.0") == "r0.33" and release_variant("0.31.2+cu128") == "r0.31"
    assert decode(encode(-7)) == -7 and len(encode(3)) == 12 and encode(3)[-4:] == bytes(4)
    assert VARIANTS["arc"][-len(RELEASES) :] == tuple(f"r{r}" for r in RELEASES)
    assert release_keywords("lru", "0.31") == {
        "threshold_counting": "store_batch",
        "threshold_scope": "new_only",
        "lru": "v1",
    }


# ----------------------------------------------------------------------------- the features
def test_store_counting_modes() -> None:
    from collections import OrderedDict

    full: OrderedDict[Any, int] = OrderedDict([("a", 1), ("b", 1)])
    record_offers(full, ["c", "d"], 2, "store")  # per key: "c" pushes out "a", "d" pushes "b"...
    assert list(full.items()) == [("c", 1), ("d", 1)]
    batch: OrderedDict[Any, int] = OrderedDict([("a", 1), ("b", 1)])
    record_offers(batch, ["b", "c", "d"], 2, "store_batch")  # "b" stays; "c" replaces "a"
    assert list(batch.items()) == [("b", 2), ("c", 1)]  # no spare entry left for "d"
    counts = OrderedDict([("x", 2)])
    cached = {"x"}.__contains__
    assert select_store_keys(["x", "y"], counts, 2, cached, "all_inputs") == ([], {"x"}, 1)
    assert select_store_keys(["x", "y"], counts, 2, cached, "new_only") == ([], {"x", "y"}, 1)


@pytest.mark.parametrize("component", ["vllm-arc", "vllm-lru"])
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_release_variants_spec_against_impl(component: str, release: str) -> None:
    result = components.get(component).fuzz(ImplManager, "impl", 6_000, 1, variant=f"r{release}")
    assert result.passed, result.failure
    assert result.steps >= 6_000 and isinstance(Step, type)
