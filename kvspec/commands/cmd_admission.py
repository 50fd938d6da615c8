"""``kvspec admission``: the admission predictor over a manifest."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from kvspec.output import OUT, UsageError, emit, progress


def cmd_admission(args: argparse.Namespace) -> int:
    from kvspec.admission import ManifestError, load_manifest, simulate
    from spec.infinilm.scheduler import RESERVATIONS

    try:
        manifest = load_manifest(args.manifest)
    except ManifestError as exc:
        raise UsageError(str(exc)) from None
    variants: dict[str, Any] = {}
    with progress("admission", len(RESERVATIONS), not args.json) as update:
        for i, variant in enumerate(RESERVATIONS, 1):
            variants[variant] = simulate(manifest, variant)
            update(i)
    emit({"manifest": str(args.manifest), "variants": variants}, args.json)
    if not args.json:
        table = Table(
            title=f"admission prediction for {args.manifest} (B={manifest.block_size}, "
            f"N={manifest.num_blocks}, prefix caching "
            f"{'on' if manifest.enable_prefix_caching else 'off'})"
        )
        for column in ("variant", "wave", "running", "reserved", "usable", "admitted"):
            table.add_column(column, justify="right")
        for variant, result in variants.items():
            for record in result["waves"]:
                table.add_row(
                    variant,
                    str(record["wave"]),
                    f"{record['running_requests']} (wave {record['wave'] - 1}: "
                    f"{record['previous_wave_running']}/{len(manifest.waves[record['wave'] - 2])})",
                    str(record["running_reserved_blocks"]),
                    str(record["usable_blocks"]),
                    f"{record['admitted']}/{record['requests']}",
                )
        OUT.print(table)
        OUT.print(
            "running: requests in the running queue just before the wave's schedule() (of them, "
            "the previous wave's); reserved: their decode reservation in pages; usable: "
            "get_total_usable_blocks(); admitted: the wave's requests in that schedule()'s batch"
        )
    return 0


def add_parser(sub: Any) -> None:
    """The ``admission`` sub-command on ``sub`` (the sub-parsers of :func:`kvspec.cli.build_parser`)."""
    p = sub.add_parser(
        "admission",
        help="predict how many requests of each next wave the legacy, exact and tight "
        "reservations admit",
    )
    p.add_argument("manifest", help="MANIFEST.json (see kvspec/data/admission_manifest.json)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_admission)
