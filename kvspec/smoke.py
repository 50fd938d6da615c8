"""``kvspec smoke``: a real transformer decoding through pages managed by kvspec's block manager.

The stock transformers Llama (seeded random weights) decodes a ten-request workload whose block
tables and slot mappings come from ``impl.infinilm.block_manager.BlockManager``; its KV cache lives
in one paged pool that is NaN-poisoned wherever the block manager gives pages back. The output must
equal transformers' own dense-cache greedy decoding (``gpu_smoke/``):

* CPU (default size ``tiny``): fp32 through the pure-torch gather path — exact tokens, logits within
  ``gpu_smoke.oracle.FP32_ATOL``.
* CUDA (default size ``full``): fp32 through the gather path and through the Triton paged decode
  kernel (exact tokens); bf16 through both, teacher-forced, against the fp32 oracle (error at most
  1.5× the dense bf16 path's; tokens equal where the top-1/top-2 margin is clear); then the attention
  micro-benchmark (Triton paged kernel vs dense SDPA on the same data, as a ratio).

The smoke also checks that the workload did what it is for: prefix hits, reclamation, reuse of freed
pages, decode across page boundaries. Exit status 0 pass, 1 a mismatch, 2 could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from kvspec.output import could_not_run, emit

SIZE_NAMES = ("tiny", "small", "full")
PLANT_NAMES = ("stale-table-entry", "missing-tail-mask", "page-freed-while-referenced")
PAGE_SIZE = {"tiny": 4, "small": 8, "full": 16}
NUM_PAGES = 20  # the workload's shape is in pages: this pool forces reclamation at every size


class SmokeUnavailable(Exception):
    """The smoke cannot run here (exit 2): missing dependency, no CUDA device, bad size."""


def _imports(device: str) -> None:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise SmokeUnavailable(
            f"smoke needs torch and transformers ({exc.name} is not installed; "
            "pip install 'kvspec[smoke]')"
        ) from None
    if device == "cuda":
        if not torch.cuda.is_available():
            raise SmokeUnavailable("--device cuda: torch sees no CUDA device")
        from gpu_smoke.triton_paged import HAVE_TRITON

        if not HAVE_TRITON:
            raise SmokeUnavailable("--device cuda needs triton for the paged decode kernel")
    elif device != "cpu":
        raise SmokeUnavailable(f"unknown device {device!r}; choose cpu or cuda")


def run_smoke(
    device: str = "cpu",
    size: str | None = None,
    progress: bool = False,
    *,
    plant: str | None = None,
    bench: bool = True,
    seed: int = 0,
    triton: bool | None = None,
    bf16: bool | None = None,
) -> dict[str, Any]:
    """Run the smoke; returns the JSON document (docs/design.md, ``kvspec smoke``).

    Raises :class:`SmokeUnavailable` when it cannot run. ``plant`` runs it with one planted bug
    (``PLANT_NAMES``): the document must then report a failure. ``triton`` (decode steps through
    the Triton kernel too) and ``bf16`` (the bf16 comparison) default to on for CUDA only; the
    tests turn them on for CPU (Triton's interpreter; bf16 through the gather path).
    """
    _imports(device)
    import torch

    threads = torch.get_num_threads()
    if device == "cpu":  # tiny matrices: one thread is fastest, and immune to a busy machine
        torch.set_num_threads(1)
    try:
        return _run(device, size, progress, plant, bench, seed, triton, bf16)
    finally:
        torch.set_num_threads(threads)


def _run(
    device: str,
    size: str | None,
    progress: bool,
    plant: str | None,
    bench: bool,
    seed: int,
    triton: bool | None,
    bf16: bool | None,
) -> dict[str, Any]:
    started = time.perf_counter()
    size = size or ("tiny" if device == "cpu" else "full")
    if size not in SIZE_NAMES:
        raise SmokeUnavailable(f"unknown size {size!r}; choose one of {', '.join(SIZE_NAMES)}")
    if plant is not None and plant not in PLANT_NAMES:
        raise SmokeUnavailable(f"unknown planted bug {plant!r}; choose one of {PLANT_NAMES}")

    import copy

    import torch

    from gpu_smoke import model as M
    from gpu_smoke import oracle
    from gpu_smoke import workload as W

    def log(message: str) -> None:
        if progress:
            print(f"smoke [{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr)

    log(f"building the {size} model on {device}")
    msize = M.SIZES[size]
    model = M.build_model(msize, seed=seed, device=device)
    params = sum(p.numel() for p in model.parameters())
    spec = W.make_workload(
        vocab=msize.vocab, page_size=PAGE_SIZE[size], num_pages=NUM_PAGES, seed=seed
    )
    max_new = {r.rid: r.max_new_tokens for r in spec.requests}
    planted = W.plant(plant)

    log("paged fp32, gather attention")
    paged = W.Engine(model, spec, backend="gather", planted=planted).run()
    log("dense fp32 oracle (transformers eager + DynamicCache)")
    dense = oracle.dense_reference(model, paged.prompts, max_new)
    runs: list[dict[str, Any]] = [
        {"name": "fp32 gather", **_outcome(paged), **oracle.compare_fp32(paged, dense)}
    ]
    use_triton = device == "cuda" if triton is None else triton
    use_bf16 = device == "cuda" if bf16 is None else bf16
    backends = ("gather", "triton") if use_triton else ("gather",)
    if use_triton:
        log("paged fp32, Triton decode kernel")
        tri = W.Engine(model, spec, backend="triton", planted=planted).run()
        runs.append({"name": "fp32 triton", **_outcome(tri), **oracle.compare_fp32(tri, dense)})
    bf16_result: dict[str, Any] | None = None
    if use_bf16:
        log("bf16: dense and paged, teacher-forced with the fp32 oracle's tokens")
        model16 = copy.deepcopy(model)
        # casts in place; typeshed's ``functools._Wrapped`` (``PreTrainedModel.to`` is
        # ``@wraps``-decorated) does not bind ``self`` on instance access, hence the ignore
        model16.to(torch.bfloat16)  # type: ignore[arg-type]
        forced = dense.tokens
        dense16 = oracle.dense_reference(model16, paged.prompts, max_new, forced)
        bf16_result = {}
        for backend in backends:
            run16 = W.Engine(model16, spec, backend=backend, planted=planted, forced=forced).run()
            result = oracle.compare_bf16(dense, dense16, run16)
            runs.append({"name": f"bf16 {backend}", **_outcome(run16), **result})
            bf16_result[backend] = runs[-1]
        del model16
    attention_bench: dict[str, Any] | None = None
    if device == "cuda" and bench:
        from gpu_smoke.attention_bench import attention_bench as bench_fn

        log("attention micro-benchmark (Triton paged vs dense SDPA)")
        del model
        torch.cuda.empty_cache()
        try:
            attention_bench = bench_fn(log=log)
        except Exception as exc:  # a timing failure is reported; it is not a correctness failure
            attention_bench = {"error": f"{type(exc).__name__}: {exc}"}

    stats = paged.stats
    checks = {
        "tokens_match": all(r["tokens_match"] for r in runs),
        "logits_within_tol": all(r["logits_within_tol"] for r in runs),
        "no_engine_error": all(r["error"] is None for r in runs),
        "all_requests_finished": all(r["requests_finished"] == len(spec.requests) for r in runs),
        "prefix_hits": stats["prefix_hit_pages"] > 0,
        "reclamation": stats["evictions"] > 0,
        "freed_pages_reused": stats["pages_reused"] > 0,
        "page_boundary_crossings": stats["page_boundary_crossings"] > 0,
    }
    errs = [r["max_abs_logit_err"] for r in runs if r["name"].startswith("fp32")]
    device_name = "cpu" if device == "cpu" else torch.cuda.get_device_name(0)
    log("done")
    return {
        "device": device,
        "device_name": device_name,
        "model": {**M.describe(size, msize, params), "seed": seed},
        "tokens_generated": sum(len(t) for t in paged.tokens.values()),
        "tokens_match": checks["tokens_match"],
        "max_abs_logit_err": None if any(e is None for e in errs) else max(errs),
        "pages_reused": stats["pages_reused"],
        "poisoned_pages": stats["poisoned_pages"],
        "attention_bench": attention_bench,
        "passed": all(checks.values()),
        "checks": checks,
        "planted_bug": plant,
        "bf16": bf16_result,
        "runs": runs,
        "workload": {
            "requests": len(spec.requests),
            "page_size": spec.page_size,
            "num_pages": spec.num_pages,
            "max_batch": spec.max_batch,
            "prefill_chunk": spec.prefill_chunk,
            **stats,
        },
        "versions": _versions(),
        "seconds": round(time.perf_counter() - started, 2),
    }


def _outcome(run: Any) -> dict[str, Any]:
    return {"error": run.error, "requests_finished": run.stats["requests_finished"]}


def _versions() -> dict[str, str | None]:
    import torch
    import transformers

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "triton": triton_version,
    }


# ----------------------------------------------------------------------------- CLI
def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``smoke`` to a ``kvspec`` subparsers object (``cmd_smoke`` is the handler)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "smoke",
        help="real paged decoding (transformers Llama) through impl block tables vs a dense oracle",
    )
    _arguments(p)
    p.set_defaults(func=cmd_smoke)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--size", choices=SIZE_NAMES, default=None, help="model size (cpu: tiny, cuda: full)"
    )
    p.add_argument("--plant", choices=PLANT_NAMES, default=None, help="run with a planted bug")
    p.add_argument("--no-bench", action="store_true", help="skip the CUDA attention benchmark")
    p.add_argument("--progress", action="store_true", help="progress lines on stderr")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "—" if value is None else str(value)


def _err(value: float | None, runs: list[dict[str, Any]]) -> str:
    if value is not None:
        return _fmt(value)
    return f"non-finite logits ({sum(r.get('nonfinite_logits', 0) for r in runs)})"


def _table(doc: dict[str, Any], write: Callable[[str], object]) -> None:
    model = doc["model"]
    rows = [
        ("device", f"{doc['device']} ({doc['device_name']})"),
        ("model", f"{model['name']}: {model['params']:,} params"),
        ("tokens generated", doc["tokens_generated"]),
        ("tokens match", doc["tokens_match"]),
        ("max |logit err| (fp32)", _err(doc["max_abs_logit_err"], doc["runs"])),
        ("pages reused", doc["pages_reused"]),
        ("pages poisoned", doc["poisoned_pages"]),
        ("prefix-hit pages", doc["workload"]["prefix_hit_pages"]),
        ("planted bug", doc["planted_bug"]),
    ]
    for run in doc["runs"]:
        if run["name"].startswith("bf16"):
            rows.append(
                (
                    run["name"],
                    f"err {_fmt(run['paged_bf16_err'])} vs dense bf16 {_fmt(run['dense_bf16_err'])}"
                    f" ({_fmt(run['err_ratio'])}×, ≤{run['allowed_ratio']}×); clear-margin tokens "
                    f"{run['clear_margin_matches']}/{run['clear_margin_tokens']}",
                )
            )
        else:
            err = _err(run["max_abs_logit_err"], [run])
            rows.append((run["name"], f"tokens match {run['tokens_match']}, max |logit err| {err}"))
        if run.get("first_divergence"):
            rows.append(("  first divergence", json.dumps(run["first_divergence"])))
        if run.get("error"):
            rows.append(("  engine error", run["error"]))
    bench = doc["attention_bench"]
    if bench and "error" in bench:
        rows.append(("attention bench", f"could not run: {bench['error']}"))
    elif bench:
        rows.append(
            (
                "attention bench",
                f"dense SDPA {bench['dense_sdpa_us']:.1f} µs, Triton paged "
                f"{_fmt(bench['paged_triton_us'])} µs ({_fmt(bench['paged_over_dense'])}×, goal "
                f"≤{bench['goal_paged_over_dense']}×), gather+SDPA {bench['gather_sdpa_us']:.1f} µs "
                f"({bench['gather_over_dense']:.2f}×)",
            )
        )
    failed = [name for name, ok in doc["checks"].items() if not ok]
    rows.append(("result", "PASS" if doc["passed"] else f"FAIL ({', '.join(failed)})"))
    rows.append(("seconds", doc["seconds"]))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        write(f"{name:<{width}}  {_fmt(value)}\n")


def cmd_smoke(args: argparse.Namespace) -> int:
    """``kvspec smoke``: 0 pass, 1 a mismatch (or a planted bug caught), 2 could not run."""
    try:
        doc = run_smoke(
            args.device,
            args.size,
            bool(args.progress) or (not args.json and sys.stderr.isatty()),
            plant=args.plant,
            bench=not args.no_bench,
        )
    except SmokeUnavailable as exc:
        return could_not_run(exc)
    if args.json:
        emit(doc, True, strict=True)
    else:
        _table(doc, sys.stdout.write)
    return 0 if doc["passed"] else 1


def verify_stage() -> tuple[str, str]:
    """For ``kvspec verify``: the tiny CPU smoke, ``("pass"|"fail"|"skip", summary)``.

    ``skip`` only when torch or transformers is not installed.
    """
    try:
        doc = run_smoke("cpu", "tiny", False, bench=False)
    except SmokeUnavailable as exc:
        return "skip", str(exc)
    summary = (
        f"tiny Llama fp32 on CPU: {doc['tokens_generated']} tokens "
        f"{'match' if doc['tokens_match'] else 'DIFFER'}, max |Δlogit| "
        f"{_fmt(doc['max_abs_logit_err'])}, {doc['pages_reused']} pages reused, "
        f"{doc['poisoned_pages']} poisoned, {doc['workload']['prefix_hit_pages']} prefix-hit pages"
    )
    if not doc["passed"]:
        failed = [name for name, ok in doc["checks"].items() if not ok]
        summary += f"; failed: {', '.join(failed)}"
    return ("pass" if doc["passed"] else "fail"), summary


def main(argv: list[str] | None = None) -> int:
    """``python -m kvspec.smoke``: the same command without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="kvspec smoke", description=__doc__.split("\n")[0])
    _arguments(parser)
    return cmd_smoke(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
