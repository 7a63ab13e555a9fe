"""How the host reaches a phone agent: one interface, two transports.

* :class:`UrlTransport` — an agent at a URL: the emulated phone on loopback, or a phone on the LAN (pairing token;
  prefer https off loopback).
* :class:`AdbTransport` — a phone on USB/Wi-Fi debugging: ``adb forward tcp:<local> tcp:<agent port>`` through
  ``adbutils``, so the host talks to ``http://127.0.0.1:<local>``; the forward is removed on close.

``transport_from_spec`` parses the one-string form the CLI and the ComfyUI node take: ``http://host:port``,
``adb``, ``adb:SERIAL``, ``adb@PORT`` or ``adb:SERIAL@PORT`` (PORT = the agent's port on the phone).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol
from urllib.parse import urlsplit

from sakura_core.http_serving import is_loopback

__all__ = [
    "DEFAULT_AGENT_PORT",
    "AdbTransport",
    "Transport",
    "TransportError",
    "UrlTransport",
    "list_adb_devices",
    "transport_from_spec",
]

logger = logging.getLogger(__name__)

DEFAULT_AGENT_PORT = 8765


class TransportError(RuntimeError):
    """The phone cannot be reached this way (names the transport and what to do)."""


class Transport(Protocol):
    """Opens a path to the agent and returns its base URL; ``close`` undoes whatever ``open`` set up."""

    kind: str

    def open(self) -> str: ...

    def close(self) -> None: ...

    def describe(self) -> dict: ...


class UrlTransport:
    """An agent reachable at ``url`` (``http(s)://host:port``)."""

    kind = "url"

    def __init__(self, url: str):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"agent URL must look like http://127.0.0.1:{DEFAULT_AGENT_PORT}, got {url!r}")
        if parts.path not in ("", "/") or parts.query:
            raise TransportError(f"agent URL {url!r}: give the base URL only (no path or query)")
        self.url = f"{parts.scheme}://{parts.netloc}"
        self.loopback = is_loopback(parts.hostname)
        if not self.loopback and parts.scheme == "http":
            logger.warning(
                "phone agent %s is off loopback over plain http: the pairing token and the image cross "
                "the LAN unencrypted; prefer adb forward or https",
                self.url,
            )

    def open(self) -> str:
        return self.url

    def close(self) -> None:
        pass

    def describe(self) -> dict:
        return {"transport": self.kind, "url": self.url, "loopback": self.loopback}

    def __enter__(self) -> str:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def _default_adb_client(host: str, port: int):
    try:
        import adbutils
    except ImportError as e:
        raise TransportError("the adb transport needs adbutils: pip install 'sakura-kv[phone]' (or adbutils)") from e
    return adbutils.AdbClient(host=host, port=port)


def list_adb_devices(client: Any | None = None, *, host: str = "127.0.0.1", port: int = 5037) -> list[dict]:
    """Devices the adb server knows: ``[{"serial", "state", "model", "transport_id"}]`` (offline ones too)."""
    client = client if client is not None else _default_adb_client(host, port)
    try:
        infos = client.list(extended=True)
    except Exception as e:  # noqa: BLE001 - adbutils raises its own errors and OSError; name the fix once
        raise TransportError(f"cannot list adb devices (is the adb server running? `adb start-server`): {e}") from e
    return [
        {
            "serial": info.serial,
            "state": info.state,
            "model": info.tags.get("model", ""),
            "transport_id": info.tags.get("transport_id"),
        }
        for info in infos
    ]


class AdbTransport:
    """``adb forward`` from a free local port to the agent's port on the phone.

    Args:
        serial: device serial; None = the only attached device (error when there are several).
        remote_port: the agent's port on the phone.
        client: an ``adbutils.AdbClient`` (or a stand-in with ``list(extended=)`` and ``device(serial)``; the
            device needs ``serial``, ``forward_port(remote)`` and ``forward_remove(local, raise_non_found=)``).
    """

    kind = "adb"

    def __init__(
        self,
        serial: str | None = None,
        remote_port: int = DEFAULT_AGENT_PORT,
        client: Any | None = None,
        *,
        adb_host: str = "127.0.0.1",
        adb_port: int = 5037,
    ):
        if not 0 < remote_port < 65536:
            raise TransportError(f"agent port on the phone must be in 1..65535, got {remote_port}")
        self.serial = serial
        self.remote_port = remote_port
        self._client = client
        self._adb = (adb_host, adb_port)
        self._device = None
        self.local_port: int | None = None

    @property
    def client(self):
        if self._client is None:
            self._client = _default_adb_client(*self._adb)
        return self._client

    def _pick_device(self):
        devices = list_adb_devices(self.client)
        ready = [d for d in devices if d["state"] == "device"]
        if self.serial is not None:
            match = [d for d in devices if d["serial"] == self.serial]
            if not match:
                known = ", ".join(d["serial"] for d in devices) or "none"
                raise TransportError(f"no adb device {self.serial!r} (attached: {known})")
            if match[0]["state"] != "device":
                raise TransportError(
                    f"adb device {self.serial!r} is {match[0]['state']}; unlock it and accept USB debugging"
                )
            return self.client.device(self.serial)
        if not ready:
            raise TransportError("no adb device attached and ready (check `adb devices`; accept USB debugging)")
        if len(ready) > 1:
            raise TransportError(
                f"{len(ready)} adb devices attached ({', '.join(d['serial'] for d in ready)}); pick one: adb:SERIAL"
            )
        self.serial = ready[0]["serial"]
        return self.client.device(self.serial)

    def open(self) -> str:
        if self.local_port is not None:
            return f"http://127.0.0.1:{self.local_port}"
        device = self._pick_device()
        try:
            local = int(device.forward_port(self.remote_port))
        except Exception as e:  # noqa: BLE001 - adbutils errors vary by version; report with the device
            raise TransportError(f"adb forward to {self.serial}:{self.remote_port} failed: {e}") from e
        self._device, self.local_port = device, local
        logger.info("adb forward tcp:%d -> %s tcp:%d", local, self.serial, self.remote_port)
        return f"http://127.0.0.1:{local}"

    def close(self) -> None:
        if self._device is not None and self.local_port is not None:
            try:
                self._device.forward_remove(f"tcp:{self.local_port}", raise_non_found=False)
            except Exception as e:  # noqa: BLE001 - closing must not mask the caller's result; log it
                logger.warning("could not remove adb forward tcp:%d on %s: %s", self.local_port, self.serial, e)
        self._device, self.local_port = None, None

    def describe(self) -> dict:
        return {
            "transport": self.kind,
            "serial": self.serial,
            "remote_port": self.remote_port,
            "local_port": self.local_port,
        }

    def __enter__(self) -> str:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def transport_from_spec(spec: str, *, adb_client: Any | None = None) -> UrlTransport | AdbTransport:
    """``http(s)://host:port`` -> URL transport; ``adb``, ``adb:SERIAL``, ``adb@PORT`` or ``adb:SERIAL@PORT`` -> adb
    transport (``@PORT`` = the agent's port on the phone; serials may contain ``:``, e.g. ``adb:10.0.0.5:5555``)."""
    if not isinstance(spec, str) or not spec.strip():
        raise TransportError("phone spec is empty: give http://127.0.0.1:PORT or adb[:SERIAL][@PORT]")
    spec = spec.strip()
    if spec.startswith(("http://", "https://")):
        return UrlTransport(spec)
    if spec == "adb" or spec.startswith(("adb:", "adb@")):
        rest, _, port = spec[3:].partition("@")
        serial = rest[1:] if rest.startswith(":") else rest
        try:
            remote = int(port) if port else DEFAULT_AGENT_PORT
        except ValueError as e:
            raise TransportError(f"phone spec {spec!r}: port {port!r} is not a number") from e
        return AdbTransport(serial or None, remote, adb_client)
    raise TransportError(f"phone spec {spec!r}: use http://HOST:PORT (loopback/LAN) or adb[:SERIAL][@PORT]")
