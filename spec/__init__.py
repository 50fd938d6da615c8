"""Executable reference models: simple, obviously correct, slow is fine."""
