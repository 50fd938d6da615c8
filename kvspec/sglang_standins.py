"""Deprecated alias: ``python -m kvspec.sglang_standins`` moved to
``python -m kvspec.engines.sglang.sglang_standins`` (issue 27); this forwards there."""

# kvspec: deprecated alias of kvspec.engines.sglang.sglang_standins

from __future__ import annotations

import sys

from kvspec.engines.sglang.sglang_standins import *  # noqa: F403
from kvspec.engines.sglang.sglang_standins import main

if __name__ == "__main__":
    print(
        "kvspec: python -m kvspec.sglang_standins is deprecated; "
        "use python -m kvspec.engines.sglang.sglang_standins",
        file=sys.stderr,
    )
    sys.exit(main())
