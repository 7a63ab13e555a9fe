"""Which cloud hosts the phone agent may fetch from: a job's ``cloud_url`` host is checked before any connection.

A job names the cloud; the agent then makes requests to it on the job's behalf. So the agent refuses, with a
``bad_job`` (400) that names the host and the setting:

* numeric hosts in an ambiguous form (``0x7f000001``, ``2130706433``, ``0177.0.0.1``, ``127.1``, ``127.0.0.1.``):
  the resolver reads them as addresses a reader does not see; an address is written as four decimal numbers;
* link-local (169.254.0.0/16, fe80::/10: cloud metadata services), multicast and unspecified (0.0.0.0/8, ``::``)
  addresses, and broadcast: never a cloud, no setting allows them;
* loopback and private (any non-global) addresses unless ``AgentConfig.allow_private_cloud``
  (``sakura phone-agent --allow-private-cloud``), which is on by default when the agent itself listens on loopback
  (the emulated phone beside its cloud).

A host name is resolved first (``getaddrinfo``) and every address it resolves to must pass; the agent then connects
only to those checked addresses (:class:`sakura_core.fetch.client.ShardClient`'s ``addresses``), so a second answer
of the resolver cannot send it elsewhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

__all__ = ["PRIVATE_CLOUD_SETTING", "CloudHostRefused", "Resolve", "check_cloud_host", "refusal_of", "system_resolve"]

#: How a refusal names the setting that allows loopback and private clouds.
PRIVATE_CLOUD_SETTING = "--allow-private-cloud (AgentConfig.allow_private_cloud)"

#: ``(host, port) -> addresses``: the resolver (injectable in tests).
Resolve = Callable[[str, int], Awaitable[list[str]]]

_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_ALWAYS = ("unspecified", "link-local", "multicast", "broadcast")


class CloudHostRefused(ValueError):
    """The job's cloud host is not one this agent fetches from; the message names the host and the setting."""


async def system_resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (``getaddrinfo`` on the event loop's executor), for TCP."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _embedded_v4(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped ``::ffff:a.b.c.d``, 6to4, NAT64 ``64:ff9b::/96``), if any."""
    if ip.version != 6:
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def refusal_of(address: str) -> str | None:
    """The class of ``address`` that makes it no cloud (``"link-local"``, ``"multicast"``, ``"unspecified"``,
    ``"broadcast"``: always refused; ``"loopback"``, ``"private"``: refused unless allowed), or None (global)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope id does not change the class
    inner = _embedded_v4(ip)
    if inner is not None:
        return refusal_of(str(inner))
    if ip.is_unspecified or ip in _THIS_NETWORK:
        return "unspecified"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip == ipaddress.IPv4Address("255.255.255.255"):
        return "broadcast"
    if ip.is_loopback:
        return "loopback"
    if not ip.is_global:
        return "private"
    return None


def _literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address when it is one; raises :class:`CloudHostRefused` for a numeric host in any form but
    four decimal numbers (or IPv6 in brackets)."""
    if ":" in host:
        try:
            return ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError as e:
            raise CloudHostRefused(f"cloud_url host {host[:80]!r} is not an IPv6 address") from e
    last = host.removesuffix(".").rsplit(".", 1)[-1]
    if not _NUMERIC_LABEL.fullmatch(last):
        return None  # a name: resolved next
    try:
        ip = ipaddress.IPv4Address(host)  # four decimal numbers, no leading zeros, no trailing dot
    except ValueError:
        ip = None
    if ip is None or str(ip) != host:
        raise CloudHostRefused(
            f"cloud_url host {host[:80]!r} is a numeric address in an ambiguous form (integer, octal, hex, short or "
            "with a trailing dot); write the address as four decimal numbers (e.g. 192.0.2.10) or use the host's name"
        )
    return ip


def _refuse(host: str, address: str, literal: bool, allow_private: bool) -> None:
    kind = refusal_of(address)
    if kind is None or (kind in ("loopback", "private") and allow_private):
        return
    what = f"cloud_url host {host[:80]!r}" + ("" if literal else f" resolves to {address}, which")
    if kind in _ALWAYS:
        raise CloudHostRefused(f"{what} is a {kind} address: never a SAKURA cloud, and no setting allows it")
    raise CloudHostRefused(
        f"{what} is a {kind} address; this agent fetches from loopback or private clouds only with "
        f"{PRIVATE_CLOUD_SETTING}, on by default when the agent itself listens on loopback"
    )


async def check_cloud_host(url: str, *, allow_private: bool, resolve: Resolve = system_resolve) -> tuple[str, ...]:
    """The addresses the agent may connect to for the cloud at ``url`` (a checked ``cloud_url``); raises
    :class:`CloudHostRefused` naming the host and the setting, before any connection to the host. A name's
    resolution failing raises ``OSError`` (``socket.gaierror``) from ``resolve``."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    ip = _literal(host)
    if ip is not None:
        _refuse(host, str(ip), True, allow_private)
        return (host,)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = await resolve(host, port)
    if not addresses:
        raise OSError(f"cloud_url host {host[:80]!r} resolves to no address")
    for address in addresses:
        _refuse(host, address, False, allow_private)
    return tuple(addresses)
