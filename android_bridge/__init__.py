"""SAKURA Android bridge: phone agent, host dispatch client, device profiles, NPU export."""

__all__ = []
