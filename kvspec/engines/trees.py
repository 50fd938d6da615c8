"""Engine import trees: a release wheel, a directory or a git revision, each imported under its own
module namespace, so that two revisions of one engine run side by side in one process.

A *source* is ``git:REPO[@REV]`` (``REV`` defaults to ``HEAD``), a ``*.whl`` file, or a directory
(an import tree built earlier, or an engine checkout/unpacked wheel to build one from). Sources
other than an import tree are built into a cached CPU tree (``~/.cache/kvspec/trees``, or
``$KVSPEC_TREE_CACHE``) by the engine's builder — :mod:`kvspec.engines.vllm.vllm_standins`,
:mod:`kvspec.engines.sglang.sglang_standins`, or :func:`build_infinilm` — which copies the
modelled upstream files verbatim and writes kvspec's stand-ins for the rest.

Why one process with namespaces, not one subprocess per side: the lockstep drivers hand the same
request objects and node handles to both sides and compare exceptions and snapshots object by
object after every call; a side behind a pipe would need every argument and result pickled both
ways per call (measured in docs/targets.md, "Two trees in one process") and the explorer's exact
state copies would no longer be in reach. A namespace is cheap and keeps all of that.

How a namespace works: the tree's top-level packages (``vllm``, ``sglang``, ``infinilm``) are
imported as ``_kvspec_tree_N.vllm…``; every module of the tree gets its own ``__builtins__`` whose
``__import__`` sends absolute imports of those top-level names to the prefixed copy. Everything
else (torch, numpy, the standard library, kvspec) is shared, except that the tree's modules see
an ``importlib`` whose ``import_module`` is redirected the same way (vLLM's cache-policy factory
imports its policies by dotted name).
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import itertools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ENGINES = ("vllm", "sglang", "infinilm")
MARKER = "kvspec-tree.json"  # written into every tree this module builds


class TreeError(Exception):
    """A source that cannot be built or imported (the CLI exits 2 with this one line)."""


# ----------------------------------------------------------------------------- namespaces
class Namespace:
    """Where an adapter imports its engine from. This one is the process's own ``sys.path``
    (``PYTHONPATH=TREE``, or the engine installed)."""

    label = "installed"

    def import_module(self, name: str) -> Any:
        return importlib.import_module(name)

    def version(self, dist: str) -> str:
        """The distribution's version; ``importlib.metadata.PackageNotFoundError`` if none."""
        return importlib.metadata.version(dist)


PROCESS = Namespace()


class _TreeLoader(importlib.machinery.SourceFileLoader):
    """A source loader that gives each module of the tree the namespace's ``__builtins__``."""

    def __init__(self, fullname: str, path: str, builtins_: dict[str, Any]) -> None:
        super().__init__(fullname, path)
        self._builtins = builtins_

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = self._builtins
        super().exec_module(module)


class _TreeFinder(importlib.abc.MetaPathFinder):
    def __init__(self, tree: TreeNamespace) -> None:
        self.tree = tree

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.tree.prefix + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return spec  # a namespace package or an extension module: nothing to redirect
        assert spec.origin is not None
        spec.loader = _TreeLoader(fullname, spec.origin, self.tree.builtins)
        return spec


class TreeNamespace(Namespace):
    """The engine tree at ``root`` under the module prefix ``_kvspec_tree_N``."""

    _counter = itertools.count(1)

    def __init__(self, root: Path, label: str) -> None:
        self.root = root.resolve()
        self.label = label
        self.prefix = f"_kvspec_tree_{next(self._counter)}"
        self.tops = {
            p.name for p in self.root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
        }
        if not self.tops:
            raise TreeError(f"{root} holds no Python package to import")
        package = types.ModuleType(self.prefix, f"kvspec import tree {label}")
        package.__path__ = [str(self.root)]
        sys.modules[self.prefix] = package
        # the engine's own warnings on kvspec's paths (a deferred admission, a refused reset) are
        # expected outcomes, already compared; they would bury the report
        logging.getLogger(self.prefix).setLevel(logging.ERROR)
        self.builtins = dict(vars(builtins))
        self.builtins["__import__"] = self._import
        # upstream's lazy registries (vLLM's cache-policy factory) import by dotted name: the
        # tree's modules see an ``importlib`` whose import_module is the namespace's
        self.importlib = types.ModuleType("importlib", importlib.__doc__)
        self.importlib.__dict__.update(vars(importlib))
        self.importlib.import_module = self._import_module  # type: ignore[attr-defined]
        sys.meta_path.insert(0, _TreeFinder(self))

    def _import(
        self,
        name: str,
        globals: dict[str, Any] | None = None,
        locals: dict[str, Any] | None = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> Any:
        if level == 0 and name == "importlib":
            return self.importlib
        if level == 0 and name.partition(".")[0] in self.tops:
            module = builtins.__import__(f"{self.prefix}.{name}", globals, locals, fromlist, 0)
            if fromlist:
                return module
            return sys.modules[f"{self.prefix}.{name.partition('.')[0]}"]
        return builtins.__import__(name, globals, locals, fromlist, level)

    def _import_module(self, name: str, package: str | None = None) -> Any:
        if name.startswith("."):
            return importlib.import_module(name, package)
        return self.import_module(name)

    def import_module(self, name: str) -> Any:
        if name.partition(".")[0] not in self.tops:
            return importlib.import_module(name)
        return importlib.import_module(f"{self.prefix}.{name}")

    def version(self, dist: str) -> str:
        for found in importlib.metadata.distributions(path=[str(self.root)]):
            if (found.metadata["Name"] or "").lower() == dist.lower():
                return found.version
        raise importlib.metadata.PackageNotFoundError(dist)


_NAMESPACES: dict[Path, TreeNamespace] = {}


def namespace(root: Path, label: str) -> TreeNamespace:
    """The namespace of the tree at ``root`` (one per tree and process)."""
    key = root.resolve()
    if key not in _NAMESPACES:
        _NAMESPACES[key] = TreeNamespace(key, label)
    return _NAMESPACES[key]


# ----------------------------------------------------------------------------- sources
def is_source(text: str) -> bool:
    """Whether a ``--target`` text names a source (rather than ``MOD:CLASS``, ``FILE.py:CLASS``
    or a built-in name)."""
    if text.startswith("git:") or text.endswith(".whl"):
        return True
    return ":" not in text and ("/" in text or text.startswith(".")) and Path(text).is_dir()


def cache_dir() -> Path:
    return Path(os.environ.get("KVSPEC_TREE_CACHE") or Path.home() / ".cache" / "kvspec" / "trees")


def _git(repo: Path, *args: str) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        )
    except FileNotFoundError:
        raise TreeError("git is not installed") from None
    except subprocess.CalledProcessError as exc:
        reason = " ".join((exc.stderr or exc.stdout or "").split())
        raise TreeError(f"git {' '.join(args)} in {repo} failed: {reason}") from None
    return done.stdout.strip()


def git_version(repo: Path, rev: str) -> str:
    """A PEP 440 version for ``rev``: the tag's on a release tag (``v0.34.0`` -> ``0.34.0``),
    else the nearest tag's with ``+g<sha>`` and the distance (an unreleased revision: no
    modelled variant claims it)."""
    found = None
    for pattern in ("v[0-9]*", "[0-9]*"):  # release tags only, not a branch-like tag
        try:
            described = _git(repo, "describe", "--tags", "--long", "--match", pattern, rev)
        except TreeError:
            continue
        found = re.fullmatch(r"v?(\d+(?:\.\d+)*)(\S*)-(\d+)-g([0-9a-f]+)", described)
        if found is not None:
            break
    if found is None:
        return "0+g" + _git(repo, "rev-parse", "--short=12", rev)
    release, _suffix, distance, sha = found.groups()
    return release if distance == "0" else f"{release}+{distance}.g{sha}"


# The files each engine's builder reads from a checkout, relative to the repository root, and
# where they sit in the tree's source layout (a wheel's).
_LAYOUT: dict[str, tuple[str, str]] = {
    # engine: (repository folder to export, its prefix to strip)
    "vllm": ("vllm", ""),
    "sglang": ("python/sglang", "python/"),
    "infinilm": ("python/infinilm", "python/"),
}


def _export_git(repo: Path, rev: str, engine: str, into: Path) -> str:
    """``git archive`` the engine's package folder at ``rev`` into ``into`` (wheel layout) and
    write its dist-info; the version written."""
    folder, strip = _LAYOUT[engine]
    commit = _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
    archive = into / "src.tar"
    try:
        with archive.open("wb") as out:
            subprocess.run(
                ["git", "-C", str(repo), "archive", "--format=tar", commit, "--", folder],
                stdout=out,
                stderr=subprocess.PIPE,
                check=True,
            )
    except subprocess.CalledProcessError as exc:
        reason = " ".join(exc.stderr.decode(errors="replace").split())
        raise TreeError(f"{repo}@{rev} has no {folder}/ ({reason})") from None
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(strip):
                continue
            data = tar.extractfile(member)
            assert data is not None
            dest = into / member.name.removeprefix(strip)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data.read())
    archive.unlink()
    version = git_version(repo, commit)
    info = into / f"{engine}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {engine}\nVersion: {version}\n")
    return version


INFINILM_FILES = ("cache_manager", "prefix_cache", "scheduler", "request", "sampling_params")


def build_infinilm(source: Path, dest: Path) -> list[str]:
    """InfiniLM's CPU tree: its five ``infinilm/llm`` bookkeeping modules verbatim, empty package
    inits in place of InfiniLM's own (which load the native engine). The modules need ``janus``,
    ``xxhash`` and ``numpy`` installed."""
    llm = source / "infinilm" / "llm"
    copied = []
    missing = [f"infinilm/llm/{f}.py" for f in INFINILM_FILES if not (llm / f"{f}.py").is_file()]
    if missing:
        raise ValueError(f"the revision lacks {', '.join(missing)}")
    shutil.rmtree(dest / "infinilm", ignore_errors=True)
    (dest / "infinilm" / "llm").mkdir(parents=True)
    for init in ("infinilm", "infinilm/llm"):
        (dest / init / "__init__.py").write_text('"""kvspec stand-in package."""\n')
    for name in INFINILM_FILES:
        rel = f"infinilm/llm/{name}.py"
        shutil.copyfile(source / rel, dest / rel)
        copied.append(rel)
    metadata = next(source.glob("infinilm-*.dist-info/METADATA"), None)
    version = "0"
    if metadata is not None:
        found = re.search(r"^Version: (\S+)", metadata.read_text(), re.M)
        version = found.group(1) if found else version
    from kvspec.engines import standins_tree

    standins_tree.write_dist_info(dest, "infinilm", version)
    return copied


def _builder(engine: str) -> Callable[[Path, Path], list[str]]:
    if engine == "vllm":
        from kvspec.engines.vllm import vllm_standins

        return vllm_standins.build
    if engine == "sglang":
        from kvspec.engines.sglang import sglang_standins

        return sglang_standins.build
    if engine == "infinilm":
        return build_infinilm
    raise TreeError(f"no tree builder for engine {engine!r} (known: {', '.join(ENGINES)})")


def _builder_stamp(engine: str) -> str:
    """A hash of the builder's own code: a cached tree is rebuilt when kvspec's stand-ins change."""
    digest = hashlib.sha256()
    for module in (sys.modules[_builder(engine).__module__], sys.modules[__name__]):
        digest.update(Path(str(module.__file__)).read_bytes())
    return digest.hexdigest()[:12]


def _is_tree(folder: Path, engine: str) -> bool:
    return (folder / MARKER).is_file() or (
        (folder / engine / "__init__.py").is_file() and any(folder.glob(f"{engine}-*.dist-info"))
    )


def _cached_build(engine: str, identity: str, make: Callable[[Path], None]) -> Path:
    key = hashlib.sha256(f"{engine}\0{identity}\0{_builder_stamp(engine)}".encode()).hexdigest()
    dest = cache_dir() / f"{engine}-{key[:16]}"
    if (dest / MARKER).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{engine}-", dir=dest.parent))
    try:
        make(staging)
        (staging / MARKER).write_text(json.dumps({"engine": engine, "source": identity}) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def tree_for(engine: str, source: str) -> Path:
    """The import tree of ``engine`` at ``source`` (built and cached when needed)."""
    build = _builder(engine)

    def from_folder(folder: Path) -> Callable[[Path], None]:
        def make(dest: Path) -> None:
            try:
                build(folder, dest)
            except (OSError, ValueError, zipfile.BadZipFile) as exc:
                raise TreeError(f"cannot build the {engine} tree of {source}: {exc}") from None

        return make

    if source.startswith("git:"):
        spec = source.removeprefix("git:")
        repo_text, sep, rev = spec.rpartition("@")
        if not sep:
            repo_text, rev = spec, "HEAD"
        repo = Path(repo_text or ".").expanduser()
        if not repo.exists():
            raise TreeError(f"{source}: no repository at {repo}")
        commit = _git(repo, "rev-parse", "--verify", f"{rev or 'HEAD'}^{{commit}}")

        def make_git(dest: Path) -> None:
            with tempfile.TemporaryDirectory(prefix="kvspec-src-") as work:
                _export_git(repo, commit, engine, Path(work))
                from_folder(Path(work))(dest)

        return _cached_build(engine, f"git {repo.resolve()} {commit}", make_git)
    path = Path(source).expanduser()
    if not path.exists():
        raise TreeError(f"{source} does not exist")
    if path.is_dir():
        if _is_tree(path, engine):
            return path
        for folder, strip in (_LAYOUT[engine],):
            if strip and (path / folder).is_dir():
                path = path / strip.rstrip("/")  # a checkout: its python/ folder is the layout
        stat = path.stat()
        return _cached_build(engine, f"dir {path.resolve()} {stat.st_mtime_ns}", from_folder(path))
    stat = path.stat()
    identity = f"file {path.resolve()} {stat.st_size} {stat.st_mtime_ns}"
    if engine == "infinilm" or not zipfile.is_zipfile(path):
        raise TreeError(f"{source} is not a {engine} wheel")
    return _cached_build(engine, identity, from_folder(path))


def source_namespace(engine: str, source: str) -> TreeNamespace:
    """The namespace holding ``engine`` at ``source``."""
    root = tree_for(engine, source)
    return namespace(root, f"{engine}@{source}")
