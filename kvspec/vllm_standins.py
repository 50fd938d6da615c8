"""Deprecated alias: ``python -m kvspec.vllm_standins`` moved to
``python -m kvspec.engines.vllm.vllm_standins`` (issue 27); this forwards there."""

# kvspec: deprecated alias of kvspec.engines.vllm.vllm_standins

from __future__ import annotations

import sys

from kvspec.engines.vllm.vllm_standins import *  # noqa: F403
from kvspec.engines.vllm.vllm_standins import main

if __name__ == "__main__":
    print(
        "kvspec: python -m kvspec.vllm_standins is deprecated; "
        "use python -m kvspec.engines.vllm.vllm_standins",
        file=sys.stderr,
    )
    sys.exit(main())
