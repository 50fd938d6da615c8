"""``--plot FILE.png`` on ``kvspec bench``, ``explore`` and ``soak``: real PNG files (signature,
size, dimensions read from the header and by decoding), what the bench figure marks, and exit 2
with the extra's name when matplotlib is missing."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from kvspec import plots
from kvspec.cli import main

pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path) -> tuple[int, int]:
    """``path`` is a PNG image: signature, IHDR chunk, and matplotlib decodes it to the size
    the header says. Returns (width, height)."""
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    width, height = struct.unpack(">II", data[16:24])
    assert 300 <= width <= 4000 and 200 <= height <= 4000
    from matplotlib import image

    pixels = image.imread(path)
    assert pixels.shape[:2] == (height, width)
    assert pixels.std() > 0.01  # something is drawn: not one flat colour
    return width, height


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main([*argv, "--json"])
    document = json.loads(capsys.readouterr().out)
    return rc, document


def test_bench_plot(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(capsys, "bench", "reclaim", "--quick", "--rounds", "7", "--plot", "b.png")
    assert rc == 0 and doc["plot"] == "b.png"
    assert_png(tmp_path / "b.png")
    points = plots.bench_points(doc["rows"])
    assert {p["size_key"] for p in points} == {"pages"}
    assert all(p["pr_ratio"] is not None for p in points)  # every reclaim case has the PR's figure
    notes = {p["note"] for p in points if p["size"] == 8192}
    assert "unreferenced=0, requested=1" in notes  # twins at one size are told apart


def test_bench_points_series_and_sizes() -> None:
    rows = [
        {"case": {"variant": "v2", "num_blocks": 1000, "stored": 500}, "ratio": 1.4},
        {"case": {"variant": "v2", "num_blocks": 5000, "stored": 2500}, "ratio": 1.3},
        {"case": {"variant": "v1", "num_blocks": 5000, "stored": 2500, "pr_ratio": 2.0},
         "ratio": 1.2},
    ]  # fmt: skip
    points = plots.bench_points(rows)
    assert [(p["size"], p["series"], p["note"], p["pr_ratio"]) for p in points] == [
        (1000, "v2", "", None),
        (5000, "v2", "", None),
        (5000, "v1", "", 2.0),
    ]


def test_explore_plot_draws_states_per_depth(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(capsys, "explore", "vllm-lru", "--plot", "out/e.png")
    assert rc == 0 and doc["plot"] == "out/e.png"
    assert_png(tmp_path / "out" / "e.png")
    assert sum(doc["states_per_depth"]) == doc["distinct_states"]
    for run in doc["runs"]:
        assert sum(run["states_per_depth"]) == run["distinct_states"]
        assert len(run["states_per_depth"]) == run["max_depth"] + 1


def test_soak_plot(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, doc = run_json(capsys, "soak", "vllm-lru", "--backend", "processes", "--workers", "2",
                       "--ops", "4000", "--chunk", "500", "--plot", "s.png")  # fmt: skip
    assert rc == 0 and doc["plot"] == "s.png"
    assert_png(tmp_path / "s.png")
    assert len(doc["timeline"]) == doc["tasks"] == 8


def test_rates_over_a_sliding_window() -> None:
    t, ops = [0.0, 1.0, 2.0, 3.0], [0, 100, 300, 600]
    assert plots.rates(t, ops, 1.0) == [0.0, 100.0, 200.0, 300.0]
    assert plots.rates(t, ops, 2.0) == [0.0, 100.0, 150.0, 250.0]


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "usable", "--quick", "--plot", "x.png"],
        ["explore", "vllm-lru", "--plot", "x.png"],
        ["soak", "vllm-lru", "--backend", "processes", "--plot", "x.png"],
    ],
)
def test_plot_without_matplotlib_exits_2_naming_the_extra(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert "kvspec[plot]" in err
    assert not (tmp_path / "x.png").exists()
