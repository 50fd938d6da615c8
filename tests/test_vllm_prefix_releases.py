"""``--target vllm`` for the GPU prefix cache and ``python -m kvspec.engines.vllm.vllm_standins``, without a
vLLM wheel: kvspec's own stand-ins of upstream's modules (an upstream-shaped ``KVCacheManager``
over the impl, upstream-style digests) show that the adapter builds the manager, hashes with a
fixed seed, labels digests as kvspec's hashes and picks the installed release; the stand-in
builder copies exactly its list of files from a wheel and its stand-ins import."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import pickle
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from impl.vllm.kv_cache_manager import KVCacheManager as ImplManager
from kvspec import components
from kvspec.cli import main
from kvspec.engines.vllm import vllm_prefix_adapter, vllm_standins
from kvspec.targets import TargetError

NAME = "vllm-prefix-cache"


# ----------------------------------------------------------------------------- upstream stand-ins
@dataclasses.dataclass(frozen=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any


@dataclasses.dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: FullAttentionSpec


@dataclasses.dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[Any]
    kv_cache_groups: list[KVCacheGroupSpec]


class RequestStatus(enum.IntEnum):
    WAITING = 1
    RUNNING = 2
    PREEMPTED = 3
    FINISHED_STOPPED = 4
    FINISHED_ABORTED = 5


class UpstreamShapedManager(ImplManager):
    """The impl behind upstream's constructor (a ``KVCacheConfig``, block sizes as keywords)."""

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        enable_caching: bool = True,
        use_eagle: bool = False,
        enable_kv_cache_events: bool = False,
        watermark: float = 0.0,
    ) -> None:
        assert scheduler_block_size == hash_block_size
        spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        super().__init__(
            kv_cache_config.num_blocks,
            spec.block_size,
            max_model_len,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            watermark=watermark,
        )


def _digest(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj)).digest()


def _utils_module() -> types.ModuleType:
    utils = types.ModuleType("vllm.v1.core.kv_cache_utils")

    def init_none_hash(hash_fn: Any) -> None:
        utils.NONE_HASH = hash_fn(os.environ["PYTHONHASHSEED"])

    def get_request_block_hasher(block_size: int, hash_fn: Any) -> Any:
        def hasher(request: Any) -> list[bytes]:
            out: list[bytes] = []
            parent = request.block_hashes[-1] if request.block_hashes else None
            start = len(request.block_hashes) * block_size
            while start + block_size <= request.num_tokens:
                tokens = tuple(request.all_token_ids[start : start + block_size])
                parent = hash_fn((parent or utils.NONE_HASH, tokens, None))
                out.append(parent)
                start += block_size
            return out

        return hasher

    utils.init_none_hash = init_none_hash  # type: ignore[attr-defined]
    utils.get_request_block_hasher = get_request_block_hasher  # type: ignore[attr-defined]
    return utils


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The modules the adapter imports, as kvspec's stand-ins; release 0.33.1 installed (the
    impl's defaults are 0.33's behaviour)."""
    modules = {
        "vllm.v1.core.kv_cache_manager": {"KVCacheManager": UpstreamShapedManager},
        "vllm.v1.kv_cache_interface": {
            "FullAttentionSpec": FullAttentionSpec,
            "KVCacheGroupSpec": KVCacheGroupSpec,
            "KVCacheConfig": KVCacheConfig,
        },
        "vllm.v1.request": {"RequestStatus": RequestStatus},
        "vllm.utils.hashing": {"get_hash_fn_by_name": lambda name: _digest},
    }
    for name, attributes in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attributes)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_utils", _utils_module())
    monkeypatch.setattr(vllm_prefix_adapter, "installed_version", lambda ns=None: "0.33.1")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    yield


def test_adapter_builds_the_release_manager_and_labels_its_digests(upstream: None) -> None:
    cls = vllm_prefix_adapter.VllmKVCacheManager
    assert cls.kvspec_variant == "r0.33" and issubclass(cls, UpstreamShapedManager)
    assert os.environ["PYTHONHASHSEED"] == vllm_prefix_adapter.HASH_SEED
    m = cls(5, 2, 16, free_order="classic")  # variant keywords are accepted and ignored
    req = cls.kvspec_request("r", [1, 2, 3, 4, 5], 2)
    assert len(req.block_hashes) == 2 and all(len(h) == 32 for h in req.block_hashes)
    assert [m.kvspec_hash_label(h) for h in req.block_hashes] == ["1,2", "1,2/3,4"]
    hits, n, _ = m.get_computed_blocks(req)
    assert m.allocate_slots(req, 5, n, hits) is not None
    from spec.vllm.kv_cache_manager import read_prefix_cache

    assert read_prefix_cache(m).block_hashes[1:3] == ("1,2", "1,2/3,4")


def test_cli_fuzzes_and_checks_the_installed_release(
    upstream: None, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["fuzz", NAME, "--target", "vllm", "--inputs", "well-formed", "--ops", "3000",
               "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["variant"] == "r0.33" and doc["divergences"] == 0


def test_the_release_variant_is_what_a_neighbouring_variant_is_not(upstream: None) -> None:
    """The stand-in release behaves as 0.33: checked as ``r0.31`` it diverges once the checker
    asks for the common-prefix count 0.31 still computes."""
    comp = components.get(NAME)
    cls = vllm_prefix_adapter.VllmKVCacheManager
    assert comp.target_variant(None, cls) == "r0.33"
    result = comp.fuzz(cls, "vllm", 20_000, 0, variant="r0.31", inputs="well-formed")
    assert not result.passed and result.failure is not None
    assert result.failure.check == "return_value"


def test_an_unknown_release_is_one_line_against_the_spec_and_runs_against_a_baseline(
    upstream: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A release newer than every variant, or an unreleased revision (past a release tag): never
    checked as another release without saying so."""
    for version, nearest in (("0.99.0", "r0.34"), ("0.33.0+12.gabc1234", "r0.33")):
        monkeypatch.setattr(vllm_prefix_adapter, "installed_version", lambda ns=None, v=version: v)
        assert main(["check", NAME, "--target", "vllm", "--inputs", "well-formed"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert f"vLLM {version} is not a release kvspec's spec models" in err
        assert f"nearest modelled variant {nearest}" in err and "--oracle invariants" in err
    code = main(
        ["fuzz", NAME, "--target", "vllm", "--baseline", "impl", "--ops", "300", "--inputs",
         "well-formed", "--variant", "r0.33"]
    )  # fmt: skip
    assert code == 0
    assert main(["fuzz", NAME, "--target", "vllm", "--oracle", "invariants", "--ops", "300"]) == 0
    assert "driven as r0.33, compared with its invariants only" in " ".join(
        capsys.readouterr().err.split()
    )


def test_unsupported_release_and_missing_vllm_are_one_line_errors(
    upstream: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vllm_prefix_adapter, "installed_version", lambda ns=None: "0.27.1")
    cls = vllm_prefix_adapter.VllmKVCacheManager
    assert cls.kvspec_variant is None and cls.kvspec_nearest == "r0.28"
    monkeypatch.setattr(vllm_prefix_adapter, "installed_version", lambda ns=None: "0.33.0")
    monkeypatch.delitem(sys.modules, "vllm.v1.core.kv_cache_manager")
    monkeypatch.setitem(sys.modules, "vllm.v1.core.kv_cache_manager", None)  # type: ignore[arg-type]
    with pytest.raises(TargetError, match=r"importable vllm\.v1\.core\.kv_cache_manager"):
        _ = vllm_prefix_adapter.VllmKVCacheManager


# ----------------------------------------------------------------------------- the stand-in tree
def _fake_wheel(path: Path, version: str) -> Path:
    """A wheel-shaped zip: every file the builder copies (tiny fakes), one it must not copy, and
    the version metadata."""
    wheel = path / f"vllm-{version}-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for rel in vllm_standins.VERBATIM:
            if rel != "vllm/v1/core/kv_cache_manager.py":
                z.writestr(rel, f"UPSTREAM = {rel!r}\n")
        z.writestr("vllm/v1/core/kv_cache_manager.py",
                   "from vllm.logger import init_logger\nfrom vllm.v1.request import "
                   "RequestStatus\nfrom vllm.distributed.kv_events import BlockStored\n"
                   "from vllm.utils.hashing import sha256\nfrom vllm import envs\n"
                   "LOGGER = init_logger(__name__)\n")  # fmt: skip
        z.writestr("vllm/engine/llm_engine.py", "raise ImportError('never copied')\n")
        z.writestr(f"vllm-{version}.dist-info/METADATA", f"Name: vllm\nVersion: {version}\n")
    return wheel


def test_standins_copy_the_listed_files_and_import_on_a_cpu(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path, "0.33.0")
    dest = tmp_path / "tree"
    assert vllm_standins.main([str(wheel), str(dest)]) == 0
    copied = {str(p.relative_to(dest)) for p in dest.rglob("*.py")}
    assert set(vllm_standins.VERBATIM) <= copied
    assert "vllm/engine/llm_engine.py" not in copied
    assert (dest / "vllm/v1/core/block_pool.py").read_text().startswith("UPSTREAM")
    probe = (
        "import importlib.metadata, vllm.v1.core.kv_cache_manager as m, vllm.envs as e;"
        "print(importlib.metadata.version('vllm'), m.RequestStatus.PREEMPTED.name,"
        " e.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, m.BlockStored(block_hashes=[b'x']).block_hashes)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(dest)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.33.0", "PREEMPTED", "False", "[b'x']"]


def test_standins_refuse_a_source_without_a_version(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/v1/core/block_pool.py", "")
    assert vllm_standins.main([str(wheel), str(tmp_path / "tree")]) == 2
