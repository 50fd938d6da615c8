"""What the import-tree builders (``kvspec.engines.vllm.vllm_standins``,
``kvspec.engines.sglang.sglang_standins``) share:
reading a release's version, writing the stand-in packages and files, the dist-info that
``importlib.metadata`` reads the version from, and the command line."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path


def version_of(files: Mapping[str, bytes], dist: str) -> str:
    """The ``Version:`` of the first ``*.dist-info/METADATA`` among ``files``."""
    for name, data in files.items():
        if name.endswith(".dist-info/METADATA"):
            found = re.search(rb"^Version: (\S+)", data, re.M)
            if found:
                return found.group(1).decode()
    raise ValueError(f"no {dist}-*.dist-info/METADATA in the source: cannot tell the release")


def write_files(
    dest: Path,
    packages: Iterable[str],
    standins: Mapping[str, str],
    files: Mapping[str, bytes],
    copied: Iterable[str],
) -> None:
    """Empty stand-in packages, kvspec's stand-in modules, then the upstream files verbatim."""
    dest.mkdir(parents=True, exist_ok=True)
    for package in packages:
        (dest / package).mkdir(parents=True, exist_ok=True)
        (dest / package / "__init__.py").write_text('"""kvspec stand-in package."""\n')
    for rel, text in standins.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    for rel in copied:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(files[rel])


def write_dist_info(dest: Path, dist: str, version: str) -> None:
    """A minimal ``DIST-VERSION.dist-info`` (any earlier one removed): the installed version the
    adapters detect through ``importlib.metadata``."""
    for old in dest.glob(f"{dist}-*.dist-info"):
        shutil.rmtree(old)
    info = dest / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")


def cli(
    argv: Sequence[str] | None,
    *,
    dist: str,
    what: str,
    build: Callable[[Path, Path], list[str]],
    num_standins: int,
) -> int:
    """``python -m kvspec.engines.DIST.DIST_standins SOURCE DEST``: 0 built, 2 (one line on
    stderr) if not."""
    prog = f"kvspec.engines.{dist}.{dist}_standins"
    parser = argparse.ArgumentParser(
        prog=f"python -m {prog}",
        description=f"Build a CPU-only import tree of {what} from a release wheel.",
    )
    parser.add_argument("source", type=Path, help=f"{dist}-X.Y.Z-*.whl, or an unpacked wheel")
    parser.add_argument("dest", type=Path, help="directory to write (use it as PYTHONPATH)")
    args = parser.parse_args(argv)
    try:
        copied = build(args.source, args.dest)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    print(f"{args.dest}: {len(copied)} upstream files, {num_standins} stand-ins")
    return 0
