"""SAKURA Android bridge: phone agent, host dispatch client and transports, device profiles, NPU export.

Host side (what the ComfyUI Phone Device node uses)::

    from android_bridge import PhoneClient
    client = PhoneClient.connect("http://127.0.0.1:8765", token="...")  # or "adb", "adb:SERIAL@8765"
    image, report = client.run_job(user_image, cloud_url=..., template_id=..., prompt=..., on_progress=...)

Names are imported lazily, so ``import android_bridge`` stays cheap (no torch until a name that needs it is used).
"""

from __future__ import annotations

import importlib

__all__ = [
    "PHONE_DIT",
    "PROFILES",
    "AdbTransport",
    "AgentConfig",
    "DeviceProfile",
    "DiTGeometry",
    "JobMemory",
    "OverBudgetError",
    "PhoneClient",
    "PhoneDiT",
    "PhoneError",
    "PhoneJob",
    "PhoneJobCancelled",
    "PhoneJobFailed",
    "Transport",
    "TransportError",
    "UrlTransport",
    "WireError",
    "check_budget",
    "create_app",
    "decode_job_body",
    "encode_job_body",
    "estimate_job_memory",
    "get_profile",
    "list_adb_devices",
    "transport_from_spec",
]

_WHERE = {
    "PHONE_DIT": "sakura_core.runtime.profiles",
    "PROFILES": "sakura_core.runtime.profiles",
    "DeviceProfile": "sakura_core.runtime.profiles",
    "PhoneDiT": "sakura_core.runtime.profiles",
    "get_profile": "sakura_core.runtime.profiles",
    "AgentConfig": "android_bridge.agent",
    "create_app": "android_bridge.agent",
    "DiTGeometry": "android_bridge.budget",
    "JobMemory": "android_bridge.budget",
    "OverBudgetError": "android_bridge.budget",
    "check_budget": "android_bridge.budget",
    "estimate_job_memory": "android_bridge.budget",
    "PhoneClient": "android_bridge.client",
    "PhoneError": "android_bridge.client",
    "PhoneJob": "android_bridge.client",
    "PhoneJobCancelled": "android_bridge.client",
    "PhoneJobFailed": "android_bridge.client",
    "AdbTransport": "android_bridge.transports",
    "Transport": "android_bridge.transports",
    "TransportError": "android_bridge.transports",
    "UrlTransport": "android_bridge.transports",
    "list_adb_devices": "android_bridge.transports",
    "transport_from_spec": "android_bridge.transports",
    "WireError": "android_bridge.wire",
    "decode_job_body": "android_bridge.wire",
    "encode_job_body": "android_bridge.wire",
}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'android_bridge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
