"""Production implementations: the spec's public API, fast."""
