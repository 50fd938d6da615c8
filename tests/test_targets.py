"""The target loader: built-in names, mutants, modules and files (with sibling/relative imports)."""

from __future__ import annotations

from pathlib import Path

import pytest

from impl.infinilm.block_manager import BlockManager as ImplBlockManager
from kvspec.targets import TargetError, load_target
from spec.infinilm.block_manager import BlockManager as SpecBlockManager
from stateful_tests.mutants_infinilm import LifoFreeList

COMPONENT = "infinilm-block-manager"


def test_builtin_names_and_mutants_resolve() -> None:
    assert load_target(COMPONENT, None) == ("impl", ImplBlockManager)
    assert load_target(COMPONENT, "spec") == ("spec", SpecBlockManager)
    assert load_target(COMPONENT, "mutant:lifo_free_list")[1] is LifoFreeList
    label, cls = load_target(COMPONENT, "impl.infinilm.block_manager:BlockManager")
    assert cls is ImplBlockManager and label == "impl.infinilm.block_manager:BlockManager"


def test_file_target_resolves_relative_and_sibling_imports(tmp_path: Path) -> None:
    # the shape of an engine checkout: cache_manager.py next to prefix_cache.py, and a package
    # __init__ that must not run (upstream's loads native GPU libraries)
    (tmp_path / "__init__.py").write_text("raise ImportError('package init must not run')\n")
    (tmp_path / "prefix_cache.py").write_text('EMPTY_BLOCK_HASH = b""\n')
    (tmp_path / "helpers.py").write_text("PAGES = 1\n")
    (tmp_path / "cache_manager.py").write_text(
        "from .prefix_cache import EMPTY_BLOCK_HASH\n"
        "import helpers\n"
        "from impl.infinilm.block_manager import BlockManager as Base\n"
        "class BlockManager(Base):\n"
        "    pass\n"
    )
    label, cls = load_target(COMPONENT, f"{tmp_path}/cache_manager.py:BlockManager")
    assert issubclass(cls, ImplBlockManager)
    assert label.endswith("cache_manager.py:BlockManager")


@pytest.mark.parametrize(
    "target, message",
    [
        ("nosuch.module:X", "cannot import module"),
        ("impl.infinilm.block_manager:Nope", "has no attribute"),
        ("mutant:nope", "no mutant"),
        ("just-a-name", "must be impl, spec"),
        ("/does/not/exist.py:X", "does not exist"),
        ("spec.infinilm.block_manager:MambaCacheManager", "lacks the infinilm-block-manager API"),
    ],
)
def test_bad_targets_raise_target_error(target: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        load_target(COMPONENT, target)


def test_unknown_component_is_named() -> None:
    with pytest.raises(TargetError, match="infinilm-block-manager"):
        load_target("infinilm-shceduler", None)
