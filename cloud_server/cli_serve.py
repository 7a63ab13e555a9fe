"""``sakura serve``: run the cloud server until SIGTERM/SIGINT, then shut down gracefully.

Prints ``serving http://HOST:PORT`` once it listens (with ``--port 0`` that line carries the port picked).
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from aiohttp import web

from sakura_core.http_serving import is_loopback

from .app import create_app
from .config import MODELS, ServerConfig
from .conn_guard import RefusalLog, capped_protocol_factory, connection_cap
from .precompute import add_device_arguments
from .state import STATE_KEY
from .store import StoreError
from .store_url import (
    S3_ENDPOINT_HELP,
    add_s3_limit_arguments,
    add_store_profile_argument,
    check_store_location,
    is_s3_url,
)

__all__ = ["add_arguments", "run", "serve"]

logger = logging.getLogger(__name__)

TOKEN_ENV = "SAKURA_TOKEN"
READ_TOKEN_ENV = "SAKURA_READ_TOKEN"


def add_arguments(parser) -> None:
    parser.add_argument("--store", required=True, help="store: a folder (created if missing) or s3://BUCKET/PREFIX")
    parser.add_argument("--s3-endpoint", default=None, help=S3_ENDPOINT_HELP)
    add_s3_limit_arguments(parser)
    parser.add_argument(
        "--store-threads",
        type=int,
        default=32,
        help="threads reading the store; one object holds at most 4 (default: %(default)s)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, loopback)")
    parser.add_argument("--port", type=int, default=8080, help="TCP port, 0 = any free port (default: %(default)s)")
    parser.add_argument(
        "--token", default=None, help=f"bearer token of the write path (default: ${TOKEN_ENV}; none = read-only)"
    )
    parser.add_argument(
        "--read-token", default=None, help=f"bearer token the read path requires (default: ${READ_TOKEN_ENV}; none)"
    )
    parser.add_argument(
        "--model",
        default="demo",
        help=f"served model: {', '.join(MODELS)}, a FLUX.2 [klein] pipeline folder's path, ComfyUI's single files as "
        "klein-files:diffusion_model=A,text_encoder=B,vae=C,tokenizer=DIR, or none (templates of any model, "
        "read-only) (default: %(default)s)",
    )
    parser.add_argument(
        "--phone-model",
        default=None,
        metavar="DIR",
        help="the phone page's model files (`sakura export --target web --out DIR`), served at "
        "/phone/model/ (default: none: the page lists templates but cannot edit)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="an origin (scheme://host[:port]) whose phone page may read templates, shards and the "
        "phone model across origins: the ComfyUI serving /sakura/phone, e.g. http://localhost:8188 "
        "(repeatable; default: none)",
    )
    add_device_arguments(parser, what="the write path's precompute jobs")
    parser.add_argument("--max-upload-mib", type=float, default=16.0, help="largest template upload (MiB)")
    parser.add_argument("--backlog", type=int, default=2048, help="listen backlog (default: %(default)s)")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0, help="seconds to drain on shutdown")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=15.0,
        help="seconds an idle connection (or an unfinished request head) is kept (default: %(default)s)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=4096,
        help="open connections at most, lowered below the fd limit (default: %(default)s)",
    )
    add_store_profile_argument(parser)  # what an uploaded template (POST /v1/templates) keeps


def config_from_args(args) -> ServerConfig:
    model = None if args.model == "none" else args.model
    check_store_location(args.store)
    return ServerConfig(
        store_dir=None if is_s3_url(args.store) else Path(args.store),
        store_url=args.store if is_s3_url(args.store) else None,
        s3_endpoint=args.s3_endpoint,
        s3_connect_timeout_s=args.s3_connect_timeout,
        s3_read_timeout_s=args.s3_read_timeout,
        s3_max_attempts=args.s3_attempts,
        store_threads=args.store_threads,
        store_threads_per_object=min(4, args.store_threads),
        device=args.device,
        dtype=args.dtype,
        host=args.host,
        port=args.port,
        write_token=args.token or os.environ.get(TOKEN_ENV) or None,
        read_token=args.read_token or os.environ.get(READ_TOKEN_ENV) or None,
        model=model,
        max_upload_bytes=int(args.max_upload_mib * 2**20),
        backlog=args.backlog,
        shutdown_timeout_s=args.shutdown_timeout,
        idle_timeout_s=args.idle_timeout,
        max_connections=args.max_connections,
        phone_model_dir=Path(args.phone_model) if args.phone_model else None,
        allowed_origins=tuple(args.allow_origin),
        store_profile=args.store_profile,
    )


async def serve(config: ServerConfig, *, ready=None) -> None:
    """Serve ``config`` until SIGTERM/SIGINT; ``ready(port, write_off)`` is called once listening (``write_off``:
    why the write path is off, e.g. no token or a read-only store; None when on). Connections are capped
    (``conn_guard``) and refusals logged one line per kind per interval."""
    app = create_app(config)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=config.shutdown_timeout_s, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    refusals = RefusalLog(config.refusal_log_interval_s)
    aiohttp_log = logging.getLogger("aiohttp.server")
    aiohttp_log.addFilter(refusals)
    loop.set_exception_handler(refusals.loop_exception_handler)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = None
    try:
        cap = connection_cap(config.max_connections)
        factory = capped_protocol_factory(runner.server, cap, refusals)
        server = await loop.create_server(factory, config.host, config.port, backlog=config.backlog)
        logger.info("at most %d connections, idle ones closed after %g s", cap, config.idle_timeout_s)
        if ready is not None:
            ready(server.sockets[0].getsockname()[1], app[STATE_KEY].write_off_reason)
        await stop.wait()
        logger.info("shutting down (draining for up to %.0f s)", config.shutdown_timeout_s)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if server is not None:
            server.close()  # no new connections; the runner drains the open ones
        await runner.cleanup()
        aiohttp_log.removeFilter(refusals)
        loop.set_exception_handler(None)


def run(args) -> int:
    try:
        config = config_from_args(args)
    except ValueError as e:
        print(f"sakura serve: {e}", file=sys.stderr)
        return 2
    if not is_loopback(config.host) and config.write_token is None and config.read_token is None:
        logger.warning("serving on %s without any token: anyone who can reach it can read every template", config.host)

    def ready(port: int, write_off: str | None) -> None:
        host = f"[{config.host}]" if ":" in config.host else config.host
        write = "on" if write_off is None else f"off ({write_off})"
        model = config.model or "none"
        print(f"serving http://{host}:{port} store={config.store_label} model={model} write={write}", flush=True)

    try:
        asyncio.run(serve(config, ready=ready))
    except StoreError as e:
        print(f"sakura serve: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # the model could not be loaded as asked (e.g. --device cuda without a GPU)
        print(f"sakura serve: {e}", file=sys.stderr)
        return 2
    print("sakura serve: stopped", flush=True)
    return 0
