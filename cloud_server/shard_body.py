"""Sending a shard's body (or one range of it): zero-copy ``sendfile`` from a real file, else a chunked copy read
on the store's own pool (object stores)."""

from __future__ import annotations

import asyncio
import logging
import os

from aiohttp import web

from .store_io import StoreIO

__all__ = ["send_body"]

logger = logging.getLogger(__name__)


async def send_body(
    request: web.Request, resp: web.StreamResponse, fobj, offset: int, count: int, chunk: int, store_io: StoreIO
) -> None:
    """Zero-copy ``sendfile`` when the shard is a real file, else a chunked copy (object stores).

    Fast path: with the transport's buffer empty (the headers went out), ``os.sendfile`` straight to the socket
    until the kernel would block; whatever is left goes through ``loop.sendfile``, which waits for writability.
    That is what ``loop.sendfile`` does itself, minus its per-call setup, which dominates for small shards.
    """
    loop = asyncio.get_running_loop()
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("connection lost before the body was sent")
    try:
        in_fd = fobj.fileno()
    except (AttributeError, OSError, ValueError):
        in_fd = None
    if in_fd is not None:
        sock = transport.get_extra_info("socket")
        plain = transport.get_extra_info("sslcontext") is None
        if sock is not None and plain and transport.get_write_buffer_size() == 0 and hasattr(os, "sendfile"):
            try:
                while count > 0:
                    sent = os.sendfile(sock.fileno(), in_fd, offset, count)
                    if sent == 0:
                        raise OSError(f"shard file ended {count} bytes early")
                    offset += sent
                    count -= sent
            except BlockingIOError:
                pass
            if count == 0:
                return
        if transport.is_closing():  # loop.sendfile would raise a RuntimeError for what is a client that left
            raise ConnectionResetError("the client closed the connection during the body")
        try:
            await loop.sendfile(transport, fobj, offset, count)
            return
        except NotImplementedError:
            logger.info("sendfile unavailable on this transport; falling back to copying shard bodies")

    def read_at(pos: int, n: int) -> bytes:
        fobj.seek(pos)
        return fobj.read(n)

    key = request.match_info["digest"]  # the store's per-object cap counts the chunks of this shard
    pos, end = offset, offset + count
    while pos < end:
        data = await store_io.run(key, read_at, pos, min(chunk, end - pos))
        if not data:
            raise OSError(f"shard file ended at byte {pos} of {end}")
        await resp.write(data)
        pos += len(data)
