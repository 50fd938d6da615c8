"""Reference models of SGLang's radix prefix cache and its KV-slot allocators.

Source of truth: docs/sglang.md (SGLang 0.5.23). Modules:

* :mod:`spec.sglang.allocator` — ``TokenToKVPoolAllocator`` (page 1, FIFO reuse) and
  ``PagedTokenToKVPoolAllocator`` (LIFO page reuse), §1;
* :mod:`spec.sglang.radix_cache` — ``RadixCache`` as a dict of paths (§2–§4) and its snapshot.
"""
