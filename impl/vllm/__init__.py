"""Production vLLM CPU-offload bookkeeping: the spec's API and snapshots, faster eviction."""
