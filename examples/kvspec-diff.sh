#!/usr/bin/env bash
# kvspec-diff.sh REPO BASE HEAD [COMPONENT...]: "unchanged behaviour" of an engine repository's
# HEAD revision against BASE, on the KV-cache bookkeeping kvspec models.
#
# For every component (default: those whose modelled files differ between BASE and HEAD) this
# runs `kvspec diff COMPONENT git:REPO@BASE git:REPO@HEAD` and prints one verdict line each.
# Exit 0: every component unchanged (or none touched); 1: a component changed behaviour (the
# counterexample is printed and saved under .kvspec/traces/); 2: could not run.
# Environment: KVSPEC_DIFF_ARGS, extra arguments for `kvspec diff` (default "--inputs
# well-formed": an engine's behaviour on bad input is compared too when left empty).
set -uo pipefail

if [ $# -lt 3 ]; then
    echo "usage: $0 REPO BASE HEAD [COMPONENT...]" >&2
    exit 2
fi
repo=$1 base=$2 head=$3
shift 3
extra=${KVSPEC_DIFF_ARGS---inputs well-formed}

# The files each component's tree is built from (kvspec/trees.py, the stand-in builders).
declare -A watched=(
    [infinilm-block-manager]="python/infinilm/llm/cache_manager.py python/infinilm/llm/prefix_cache.py"
    [infinilm-scheduler]="python/infinilm/llm/scheduler.py python/infinilm/llm/request.py python/infinilm/llm/cache_manager.py python/infinilm/llm/prefix_cache.py python/infinilm/llm/sampling_params.py"
    [vllm-arc]="vllm/v1/kv_offload"
    [vllm-lru]="vllm/v1/kv_offload"
    [vllm-prefix-cache]="vllm/v1/core vllm/v1/kv_cache_interface.py"
    [sglang-radix-cache]="python/sglang/srt/mem_cache"
)

if ! git -C "$repo" rev-parse --verify --quiet "$base^{commit}" >/dev/null ||
   ! git -C "$repo" rev-parse --verify --quiet "$head^{commit}" >/dev/null; then
    echo "kvspec-diff: $base or $head is not a revision of $repo" >&2
    exit 2
fi

components=("$@")
if [ ${#components[@]} -eq 0 ]; then
    for component in "${!watched[@]}"; do
        # shellcheck disable=SC2086  # the watched paths are words
        if [ -n "$(git -C "$repo" diff --name-only "$base" "$head" -- ${watched[$component]})" ]; then
            components+=("$component")
        fi
    done
fi
if [ ${#components[@]} -eq 0 ]; then
    echo "kvspec-diff: no modelled file changed between $base and $head"
    exit 0
fi

status=0
for component in $(printf '%s\n' "${components[@]}" | sort); do
    echo "== kvspec diff $component $base -> $head"
    # shellcheck disable=SC2086  # extra is a list of arguments
    kvspec diff "$component" "git:$repo@$base" "git:$repo@$head" $extra
    code=$?
    if [ $code -eq 2 ]; then
        exit 2
    fi
    if [ $code -ne 0 ]; then
        status=1
    fi
done
exit $status
