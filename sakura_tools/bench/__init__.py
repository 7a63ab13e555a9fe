"""Benchmarks (``sakura bench codec|e2e``): print a table, write JSON and plots. A leaf: only the CLI imports it."""

__all__: list[str] = []
