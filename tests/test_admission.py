"""``kvspec admission``: the wave-by-wave admission predictor (kvspec/admission.py).

Every number asserted here is derived by hand in a comment from the reservation formulas of
docs/infinilm.md §7.1 (B = block size, P = prompt, M = max_tokens, g = generated tokens; a
running request with g = 1 holds ceil(P / B) pages):

* running, legacy: ceil((M - g) / B);
* running, exact:  ceil((P + M) / B) - len(table);
* running, tight:  ceil((P + M - 1) / B) - len(table);
* candidate (every variant): ceil((P - local + M) / B), local = 0 here;
* earlier admits of the same batch (every variant): ceil((P + M) / B) - len(table);
* admit iff running + candidate + earlier admits <= usable pages (read after each allocation).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvspec import output
from kvspec.admission import ManifestError, load_manifest, parse_manifest, predict
from kvspec.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "kvspec" / "data" / "admission_manifest.json"
VARIANT_KEYS = {
    "wave1_requests",
    "wave1_running",
    "wave1_finished",
    "running_reserved_blocks",
    "usable_blocks",
    "admitted",
    "waves",
}
WAVE_KEYS = {
    "wave",
    "requests",
    "waiting_ahead",
    "running_requests",
    "previous_wave_running",
    "previous_wave_finished",
    "running_reserved_blocks",
    "usable_blocks",
    "admitted",
}


def req(prompt_len: int, max_tokens: int) -> dict[str, int]:
    return {"prompt_len": prompt_len, "max_tokens": max_tokens}


# Wave 1 is reference §7.2's two running requests (R1: P=17, M=15; R2: P=1, M=32); wave 2 is five
# copies of its candidate C (P=5, M=11).
TINY: dict[str, Any] = {
    "block_size": 16,
    "num_blocks": 8,
    "enable_prefix_caching": False,
    "waves": [[req(17, 15), req(1, 32)], [req(5, 11)] * 5],
}


def figures(result: dict[str, Any]) -> tuple[int, int, int, int]:
    return (
        result["wave1_running"],
        result["running_reserved_blocks"],
        result["usable_blocks"],
        result["admitted"],
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def write(tmp_path: Path, document: Any, name: str = "m.json") -> Path:
    path = tmp_path / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


# ----------------------------------------------------------------------------- predictions
def test_tiny_manifest_matches_the_hand_computation() -> None:
    # Wave 1, empty pool of 8: R1 needs ceil(32/16) = 2 <= 8, admitted (table 2 pages, extra
    # ceil(32/16) - 2 = 0); R2 needs ceil(33/16) = 3 + 0 <= 6, admitted (table 1 page). One
    # engine step gives both g = 1; usable = 8 - 3 = 5 in every variant.
    # Running reservation:  legacy  R1 ceil(14/16) = 1, R2 ceil(31/16) = 2          -> 3
    #                       exact   R1 ceil(32/16) - 2 = 0, R2 ceil(33/16) - 1 = 2  -> 2
    #                       tight   R1 ceil(31/16) - 2 = 0, R2 ceil(32/16) - 1 = 1  -> 1
    # Each C needs ceil(16/16) = 1 page for itself, takes 1 page (usable drops by 1) and adds
    # ceil(16/16) - 1 = 0 to the batch's extra, so C number k (usable 5 - (k - 1)) is admitted
    # iff running + 1 <= 6 - k:
    #   legacy 4 <= 6 - k  -> k <= 2;  exact 3 <= 6 - k -> k <= 3;  tight 2 <= 6 - k -> k <= 4.
    result = predict(parse_manifest(TINY))
    assert figures(result["legacy"]) == (2, 3, 5, 2)
    assert figures(result["exact"]) == (2, 2, 5, 3)
    assert figures(result["tight"]) == (2, 1, 5, 4)


def test_example_manifest_legacy_admits_fewest() -> None:
    # kvspec/data/admission_manifest.json: B = 16, N = 64. Wave 1 (P, M) and, with g = 1,
    # pages ceil(P/16) | legacy ceil((M-1)/16) | exact ceil((P+M)/16) - pages | tight with P+M-1:
    #   (17,47) 2 | 3 | 4-2=2 | 4-2=2      (33,31) 3 | 2 | 4-3=1 | 4-3=1
    #   (49,15) 4 | 1 | 4-4=0 | 4-4=0      (20,60) 2 | 4 | 5-2=3 | 5-2=3
    #   (18,47) 2 | 3 | 5-2=3 | 4-2=2      (16,17) 1 | 1 | 3-1=2 | 2-1=1   (exact > legacy)
    #   (40,24) 3 | 2 | 4-3=1 | 4-3=1      (65,32) 5 | 2 | 7-5=2 | 6-5=1
    #   (33,63) 3 | 4 | 6-3=3 | 6-3=3      (81,31) 6 | 2 | 7-6=1 | 7-6=1
    # pages 31 -> usable 33; reservations legacy 24, exact 18, tight 15. (All of wave 1 fits in
    # one step: its own needs sum to 49 and the batch extras stay below the free pages.)
    # Wave 2 in order, own ceil((P+M)/16) | pages ceil(P/16) | extra own - pages:
    #   (31,33) 4|2|2   (15,17) 2|1|1   (40,24) 4|3|1   (16,16) 2|1|1   (24,40) 4|2|2
    #   (33,31) 4|3|1 ...
    # legacy: 24+4+0=28<=33 ok; 24+2+2=28<=31 ok; 24+4+3=31 > 30 stop          -> 2
    # exact:  22<=33; 22<=31; 18+4+3=25<=30; 18+2+4=24<=27; 18+4+5=27 > 26 stop  -> 4
    # tight:  19<=33; 19<=31; 22<=30; 21<=27; 15+4+5=24<=26; 15+4+7=26 > 24 stop -> 5
    result = predict(load_manifest(EXAMPLE))
    assert figures(result["legacy"]) == (10, 24, 33, 2)
    assert figures(result["exact"]) == (10, 18, 33, 4)
    assert figures(result["tight"]) == (10, 15, 33, 5)
    admitted = {variant: r["admitted"] for variant, r in result.items()}
    assert admitted["legacy"] <= admitted["exact"]
    assert admitted["legacy"] < admitted["tight"]


def test_running_requests_hold_exactly_their_first_token() -> None:
    # max_batch_size 1: wave 1 needs two prefill steps; R1 must not decode in the second (prefill
    # suppresses decode, and the predictor never runs a decode step), so the reservations are the
    # same as with an unbounded batch. Wave 2's one schedule() admits at most one request.
    result = predict(parse_manifest({**TINY, "max_batch_size": 1}))
    assert figures(result["legacy"]) == (2, 3, 5, 1)
    assert figures(result["exact"]) == (2, 2, 5, 1)
    assert figures(result["tight"]) == (2, 1, 5, 1)


def test_max_tokens_one_finishes_at_the_first_token() -> None:
    # (P=16, M=1): admitted, its first token reaches M, it finishes and its page is released
    # (unreferenced, so usable again): nothing is running and nothing is reserved.
    manifest = {
        "block_size": 16,
        "num_blocks": 4,
        "enable_prefix_caching": True,
        "waves": [[req(16, 1)], [req(16, 48)]],
    }
    for result in predict(parse_manifest(manifest)).values():
        assert result["wave1_running"] == 0
        assert result["wave1_finished"] == 1
        assert result["running_reserved_blocks"] == 0
        assert result["usable_blocks"] == 4
        assert result["admitted"] == 1  # ceil(64/16) = 4 <= 4


def test_a_wave_that_cannot_be_admitted_stops_filling() -> None:
    # Wave 1 of (P=64, M=64) on 6 pages: own ceil(128/16) = 8 > 6, never admitted. Filling stops at
    # the first schedule() that admits nothing; the request stays waiting, ahead of wave 2, and
    # (the deferred head goes to the tail and the loop breaks, reference §9.5) blocks it.
    manifest = {
        "block_size": 16,
        "num_blocks": 6,
        "enable_prefix_caching": False,
        "waves": [[req(64, 64)], [req(1, 1)]],
    }
    for result in predict(parse_manifest(manifest)).values():
        assert result["wave1_running"] == 0
        assert result["usable_blocks"] == 6
        assert result["waves"][0]["waiting_ahead"] == 1
        assert result["admitted"] == 0


def test_three_waves_report_one_record_per_later_wave() -> None:
    # TINY plus a third wave of one (P=1, M=1). After wave 2's schedule() (see the tiny test) the
    # rejected C goes to the waiting tail; one engine step gives the admitted Cs g = 1 (each
    # reserves 0 more pages in exact/tight: ceil(16/16) - 1 = 0, ceil(15/16) - 1 = 0; legacy
    # ceil(10/16) = 1). Filling then stops at once: the next C is rejected too
    #   legacy: 2 Cs running, reserved 3 + 2 = 5, usable 5 - 2 = 3, next C needs 5 + 1 > 3;
    #   exact:  3 Cs running, reserved 2,        usable 2,         next C needs 2 + 1 > 2;
    #   tight:  4 Cs running, reserved 1,        usable 1,         next C needs 1 + 1 > 1.
    # Wave 3 queues behind the waiting Cs (legacy 3, exact 2, tight 1), whose head is rejected
    # again, so no wave-3 request is admitted in any variant.
    manifest = {**TINY, "waves": [*TINY["waves"], [req(1, 1)]]}
    result = predict(parse_manifest(manifest))
    expected = {  # waiting_ahead, running_requests, previous_wave_running, reserved, usable
        "legacy": (3, 4, 2, 5, 3),
        "exact": (2, 5, 3, 2, 2),
        "tight": (1, 6, 4, 1, 1),
    }
    for variant, (ahead, running, previous, reserved, usable) in expected.items():
        waves = result[variant]["waves"]
        assert [w["wave"] for w in waves] == [2, 3]
        assert waves[0]["admitted"] == result[variant]["admitted"]  # the top level is wave 2
        third = waves[1]
        assert (
            third["waiting_ahead"],
            third["running_requests"],
            third["previous_wave_running"],
            third["running_reserved_blocks"],
            third["usable_blocks"],
            third["admitted"],
        ) == (ahead, running, previous, reserved, usable, 0)


def test_prediction_is_deterministic() -> None:
    manifest = load_manifest(EXAMPLE)
    assert predict(manifest) == predict(manifest)


# ----------------------------------------------------------------------------- CLI
def test_json_is_one_document_with_three_variants(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "admission", str(EXAMPLE), "--json")
    assert rc == 0
    document = json.loads(out)  # exactly one document: anything more is "Extra data"
    assert set(document["variants"]) == {"legacy", "exact", "tight"}
    for result in document["variants"].values():
        assert set(result) == VARIANT_KEYS
        assert all(isinstance(result[k], int) for k in VARIANT_KEYS - {"waves"})
        assert len(result["waves"]) == 1
        assert set(result["waves"][0]) == WAVE_KEYS
    assert document["variants"]["legacy"]["admitted"] == 2


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "admission", str(EXAMPLE))
    assert rc == 0
    for word in ("legacy", "exact", "tight", "admitted", "2/8", "4/8", "5/8"):
        assert word in out


BAD: list[Any] = [
    pytest.param({k: v for k, v in TINY.items() if k != "num_blocks"}, "num_blocks", id="missing"),
    pytest.param({**TINY, "block_size": 0}, "block_size", id="zero-block-size"),
    pytest.param({**TINY, "num_blocks": -8}, "num_blocks", id="negative-num-blocks"),
    pytest.param({**TINY, "block_size": "16"}, "block_size", id="string-block-size"),
    pytest.param({**TINY, "num_blocks": True}, "num_blocks", id="bool-num-blocks"),
    pytest.param({**TINY, "num_blocks": 8.0}, "num_blocks", id="float-num-blocks"),
    pytest.param({**TINY, "enable_prefix_caching": "no"}, "enable_prefix_caching", id="caching"),
    pytest.param({**TINY, "max_batch_size": 0}, "max_batch_size", id="zero-batch"),
    pytest.param({**TINY, "max_num_batched_tokens": -1}, "max_num_batched_tokens", id="budget"),
    pytest.param({**TINY, "waves": "many"}, "waves", id="waves-not-a-list"),
    pytest.param({**TINY, "waves": TINY["waves"][:1]}, "two waves", id="one-wave"),
    pytest.param({**TINY, "waves": [TINY["waves"][0], []]}, "waves[1]", id="empty-wave"),
    pytest.param({**TINY, "waves": [TINY["waves"][0], [5]]}, "waves[1][0]", id="request-not-obj"),
    pytest.param(
        {**TINY, "waves": [TINY["waves"][0], [req(0, 4)]]}, "prompt_len", id="prompt-len-0"
    ),
    pytest.param({**TINY, "waves": [TINY["waves"][0], [req(4, 0)]]}, "max_tokens", id="max-0"),
    pytest.param(
        {**TINY, "waves": [TINY["waves"][0], [{"prompt_len": 4}]]}, "max_tokens", id="no-max"
    ),
    pytest.param(
        {**TINY, "waves": [TINY["waves"][0], [{**req(4, 4), "prio": 1}]]}, "prio", id="req-key"
    ),
    pytest.param({**TINY, "blocksize": 16}, "blocksize", id="unknown-key"),
    pytest.param([TINY], "JSON object", id="not-an-object"),
    pytest.param("{not json", "not valid JSON", id="invalid-json"),
]


@pytest.mark.parametrize(("document", "needle"), BAD)
def test_bad_manifest_exits_2_with_one_line(
    document: Any,
    needle: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(output.ERR, "_width", 80)
    path = write(tmp_path, document)
    for extra in ([], ["--json"]):
        rc, out, err = run(capsys, "admission", str(path), *extra)
        assert rc == 2
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvspec: "), err
        assert needle in lines[0]


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unreadable_manifest_exits_2(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nope.json" if kind == "missing" else tmp_path
    rc, out, err = run(capsys, "admission", str(path), "--json")
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "cannot read manifest" in err


def test_manifest_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="prompt_len must be between 1"):
        parse_manifest({**TINY, "waves": [TINY["waves"][0], [req(0, 1)]]})
    assert issubclass(ManifestError, ValueError)
