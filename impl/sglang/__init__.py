"""Production SGLang radix-cache bookkeeping: the spec's API and snapshots, a real tree."""
