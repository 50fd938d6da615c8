"""Reference models of InfiniLM v0.2.9c's paged-KV bookkeeping (docs/infinilm.md)."""
