"""SGLang: the radix-cache adapters (``sglang_adapter``: ``RadixCache`` and ``UnifiedRadixCache``,
Python and Rust cores) and the CPU import-tree builder (``sglang_standins``,
``python -m kvspec.engines.sglang.sglang_standins WHEEL DEST``)."""
