"""Production InfiniLM bookkeeping."""
