"""Fixtures of the tools' tests: the demo model, its template and KV, as the sakura_core tests have them (the same
fixture functions, one instance per session in each of the two folders)."""

from ..sakura_core.conftest import demo_kv, demo_model, demo_template, published_fp16

__all__ = ["demo_kv", "demo_model", "demo_template", "published_fp16"]
