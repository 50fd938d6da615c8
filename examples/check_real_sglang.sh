#!/usr/bin/env bash
# Check kvspec's SGLang radix-cache spec against a real SGLang release, on a CPU, without
# installing SGLang: download the wheel (no dependencies), build kvspec's CPU import tree from it
# (the release's own mem_cache files, verbatim, plus kvspec's stand-ins; docs/sglang.md §7), then
# check, fuzz, explore and audit the release's RadixCache and allocators, and run the wheel tests.
#
#   examples/check_real_sglang.sh [VERSION] [WORKDIR]      (defaults: 0.5.23, /tmp/kvspec-sglang)
#
# Needs kvspec installed with CPU torch (pip install -e '.[test]'). Exit status: non-zero when a
# check fails. The audit's robustness findings (bad input SGLang accepts) do not fail it.
set -euo pipefail
version="${1:-0.5.23}"
work="${2:-/tmp/kvspec-sglang}"
mkdir -p "$work"
wheel="$(ls "$work"/sglang-"$version"-*.whl 2>/dev/null | head -n 1 || true)"
if [ -z "$wheel" ]; then
    pip download "sglang==$version" --no-deps -d "$work"
    wheel="$(ls "$work"/sglang-"$version"-*.whl | head -n 1)"
fi
python -m kvspec.sglang_standins "$wheel" "$work/tree"
export PYTHONPATH="$work/tree${PYTHONPATH:+:$PYTHONPATH}"
kvspec check sglang-radix-cache --target sglang --inputs well-formed
for policy in lru fifo mru; do
    kvspec fuzz sglang-radix-cache --target sglang --inputs well-formed --variant "$policy" \
        --ops 50000 --seed 3
done
kvspec explore sglang-radix-cache --target sglang --inputs well-formed --variant lru \
    --requests 1 --pages 3
kvspec audit sglang-radix-cache --target sglang --budget 60
# UnifiedRadixCache (the server default), Python and Rust tree cores (needs msgspec: kvspec[sglang])
for target in sglang-unified sglang-unified-rust; do
    kvspec check sglang-radix-cache --target "$target" --inputs well-formed
    for policy in unified-lru unified-fifo unified-mru; do
        kvspec fuzz sglang-radix-cache --target "$target" --inputs well-formed --variant "$policy" \
            --ops 20000 --seed 3
    done
    kvspec explore sglang-radix-cache --target "$target" --inputs well-formed \
        --variant unified-lru --requests 1 --pages 3
done
KVSPEC_SGLANG_WHEEL="$wheel" python -m pytest -q -n 0 tests/test_sglang_radix_cache.py
