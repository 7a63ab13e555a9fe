"""SAKURA cloud server: template catalog, manifests and immutable KV shards over HTTP."""

__all__ = []
