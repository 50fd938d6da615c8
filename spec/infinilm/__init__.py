"""Reference models of InfiniLM v0.2.9c's paged-KV bookkeeping (shared/reference/infinilm.md)."""
