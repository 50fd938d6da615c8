"""``--plot FILE.png``: the figures of ``kvspec bench``, ``kvspec explore`` and ``kvspec soak``,
drawn from the command's own JSON document.

matplotlib is the optional extra ``kvspec[plot]``; without it a command given ``--plot`` stops
before doing any work, with exit status 2 and a one-line hint (:func:`require`). Figures are drawn
on matplotlib's Agg canvas (no display, no pyplot state), as PNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvspec.output import UsageError

EXTRA_HINT = "pip install 'kvspec[plot]'"
# bench case fields that are not a size: repetitions, the upstream figure, derived counts
_NOT_SIZES = {"calls", "pr_ratio", "target_t1_size", "evicted_t1", "evicted_t2"}


def require() -> None:
    """``UsageError`` (exit 2, one line) if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UsageError(f"--plot needs matplotlib: {EXTRA_HINT}") from None


def _figure(rows: int = 1) -> Any:
    require()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.2 if rows == 1 else 5.6), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: str | Path) -> Path:
    out = Path(path)
    if out.parent != Path():
        out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


# ----------------------------------------------------------------------------- bench
def bench_points(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One point per bench row: ``size`` (the case's first integer field), ``series`` (its text
    fields that differ between rows), ``note`` (its other integer fields that differ between rows
    of the same size and series), ``ratio`` and the upstream PR's ``pr_ratio`` (or ``None``)."""
    cases = [r["case"] for r in rows]
    varying = {k for k in {k for c in cases for k in c} if len({repr(c.get(k)) for c in cases}) > 1}
    points: list[dict[str, Any]] = []
    for row, case in zip(rows, cases, strict=True):
        ints = [k for k, v in case.items() if type(v) is int and k not in _NOT_SIZES]
        size_key = ints[0] if ints else None
        texts = [f"{case[k]}" for k, v in case.items() if isinstance(v, str) and k in varying]
        points.append(
            {
                "size_key": size_key or "case",
                "size": case[size_key] if size_key else len(points),
                "series": ", ".join(texts),
                "others": {k: case[k] for k in ints[1:]},
                "ratio": row["ratio"],
                "pr_ratio": case.get("pr_ratio"),
            }
        )
    for p in points:  # name what tells apart the points of one size in one series
        twins = [q for q in points if (q["size"], q["series"]) == (p["size"], p["series"])]
        differ = [k for k in p["others"] if len({q["others"].get(k) for q in twins}) > 1]
        p["note"] = ", ".join(f"{k}={p['others'][k]:,}" for k in differ)
    return points


def bench(document: Mapping[str, Any], path: str | Path) -> Path:
    """Ratio (baseline / impl) against the case's size, log scales; the upstream PR's measured
    ratio for the same case is a hollow marker joined to kvspec's point."""
    points = bench_points(document["rows"])
    fig = _figure()
    ax = fig.add_subplot()
    series = list(dict.fromkeys(p["series"] for p in points))
    colours = ["tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown"]
    pr_shown = False
    for n, name in enumerate(series):
        mine = sorted((p for p in points if p["series"] == name), key=lambda p: p["size"])
        colour = colours[n % len(colours)]
        ax.plot(
            [p["size"] for p in mine],
            [p["ratio"] for p in mine],
            "o",
            color=colour,
            label=f"kvspec impl{': ' + name if name else ''}",
        )
        for p in mine:
            if p["note"]:
                ax.annotate(
                    p["note"],
                    (p["size"], p["ratio"]),
                    textcoords="offset points",
                    xytext=(6, 3),
                    fontsize=7,
                )
            if p["pr_ratio"] is not None:
                ax.plot(
                    [p["size"], p["size"]], [p["pr_ratio"], p["ratio"]], ":", color="grey", lw=0.8
                )
                ax.plot(
                    p["size"],
                    p["pr_ratio"],
                    "D",
                    mfc="none",
                    color="tab:red",
                    label=None if pr_shown else "upstream PR measured",
                )
                pr_shown = True
    ax.axhline(1.0, color="black", lw=0.6, ls="--")
    sizes = sorted({p["size"] for p in points})
    ax.set_xscale("symlog" if sizes[0] <= 0 else "log")
    ax.set_xticks(sizes, [f"{s:,}" for s in sizes])
    ax.minorticks_off()
    ax.margins(x=0.25)  # room for the notes right of the largest size
    ax.set_yscale("log")
    ax.set_xlabel(points[0]["size_key"] if points else "size")
    ax.set_ylabel("ratio = baseline / impl (×)")
    ax.set_title(f"kvspec bench {document['suite']}: speed-up against size")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.25)
    return _save(fig, path)


# ----------------------------------------------------------------------------- explore
def explore(document: Mapping[str, Any], path: str | Path) -> Path:
    """Distinct states first reached at each depth, one line per search (variant)."""
    fig = _figure()
    ax = fig.add_subplot()
    runs = document.get("runs") or [document]
    for run in runs:
        counts = run["states_per_depth"]
        label = run.get("variant") or document["component"]
        ax.plot(range(len(counts)), counts, "o-", ms=3, label=f"{label} ({sum(counts):,})")
    ax.set_yscale("log")
    ax.set_xlabel("depth (calls from the initial state)")
    ax.set_ylabel("new distinct states")
    complete = "complete" if document.get("complete") else "incomplete"
    ax.set_title(
        f"kvspec explore {document['component']} vs {document['target']}: "
        f"{document['distinct_states']:,} states, {complete}"
    )
    ax.legend(fontsize=8, ncol=2 if len(runs) > 4 else 1)
    ax.grid(True, which="both", alpha=0.25)
    return _save(fig, path)


# ----------------------------------------------------------------------------- soak
def rates(t: Sequence[float], ops: Sequence[int], window: float) -> list[float]:
    """Calls/s at each sample over the last ``window`` seconds (since the start, before that)."""
    out, j = [], 0
    for i in range(len(t)):
        while j + 1 < i and t[i] - t[j + 1] >= window:
            j += 1
        start = j if t[i] - t[j] >= window else 0
        out.append((ops[i] - ops[start]) / (t[i] - t[start]) if t[i] > t[start] else 0.0)
    return out


def soak(document: Mapping[str, Any], path: str | Path) -> Path:
    """Aggregate calls/s (over a sliding window, and the running average) and the number of
    distinct coverage keys, against wall time (samples: each finished task)."""
    fig = _figure(rows=2)
    top, bottom = fig.subplots(2, 1, sharex=True)
    timeline = [{"seconds": 0.0, "ops": 0, "coverage_keys": 0}, *document["timeline"]]
    t = [p["seconds"] for p in timeline]
    ops = [p["ops"] for p in timeline]
    # a window of two tasks' time per worker at least, so that it always holds several finishes
    task = t[-1] * document["workers"] / max(1, len(t) - 1)
    window = max(1.0, t[-1] / 20, 2 * task)
    top.plot(t[1:], rates(t, ops, window)[1:], "-", lw=1, label=f"over the last {window:.1f} s")
    top.plot(t[1:], [o / s for o, s in zip(ops[1:], t[1:], strict=True)], "--", label="average")
    top.set_ylabel("lockstep calls/s")
    top.set_ylim(bottom=0)
    top.legend(fontsize=8)
    top.grid(True, alpha=0.25)
    top.set_title(
        f"kvspec soak {document['component']} vs {document['target']}: "
        f"{document['ops']:,} calls, {document['workers']} workers ({document['backend']})"
    )
    bottom.step(t, [p["coverage_keys"] for p in timeline], where="post", color="tab:green")
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("distinct coverage keys")
    bottom.set_xlabel("seconds")
    bottom.grid(True, alpha=0.25)
    return _save(fig, path)
