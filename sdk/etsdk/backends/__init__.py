"""Backends that ship inside the core distribution (registered through its own entry point)."""
