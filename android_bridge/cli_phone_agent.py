"""``sakura phone-agent``: run the (emulated) phone agent until SIGTERM/SIGINT.

Prints ``phone agent listening on http://HOST:PORT ...`` once it listens (with ``--port 0`` that line carries the
port picked). The pairing token comes from ``--token`` or ``$SAKURA_PHONE_TOKEN``.
"""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from aiohttp import web

from sakura_core.models.loading import add_device_arguments
from sakura_core.runtime.profiles import PROFILES

from .agent import AgentConfig, create_app
from .client import TOKEN_ENV

__all__ = ["add_arguments", "run", "serve"]

logger = logging.getLogger(__name__)


def add_arguments(parser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s, loopback)")
    parser.add_argument(
        "--allow-lan", action="store_true", help="permit a non-loopback --host (needs a token of >= 16 characters)"
    )
    parser.add_argument(
        "--allow-private-cloud",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let a job's cloud be a loopback or private address (its host resolved first); default: "
        "only when --host is loopback. Link-local, multicast and 0.0.0.0 are always refused",
    )
    parser.add_argument("--port", type=int, default=8765, help="TCP port, 0 = any free port (default: %(default)s)")
    parser.add_argument("--profile", default="snapdragon-8-elite-npu", help=f"device profile: {', '.join(PROFILES)}")
    parser.add_argument("--token", default=None, help=f"pairing token (default: ${TOKEN_ENV})")
    parser.add_argument("--queue", type=int, default=2, help="jobs that may wait behind the running one")
    parser.add_argument(
        "--memory-budget-mib",
        type=float,
        default=None,
        help="memory one edit may use (MiB); default: the profile's (NPU session or app share)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads for the emulated phone")
    parser.add_argument("--weights", default="auto", help="demo model weights: auto, none (random init) or a path")
    parser.add_argument(
        "--model",
        default="demo",
        help="demo, the path of a diffusers FLUX.2 [klein] pipeline folder (model_index.json), or "
        "klein-files:diffusion_model=A,text_encoder=B,vae=C,tokenizer=DIR (ComfyUI's single files)",
    )
    add_device_arguments(parser, what="the emulated phone")
    parser.add_argument("--job-timeout", type=float, default=600.0, help="seconds before a running job is cancelled")
    parser.add_argument("--no-simulation", action="store_true", help="do not add the simulated phone latency")
    parser.add_argument(
        "--backend",
        choices=("torch", "qnn"),
        default="torch",
        help="what runs the model's blocks: torch (reference) or qnn (onnxruntime-qnn HTP, CPU "
        "fallback disabled; EMULATED on x86) (default: %(default)s)",
    )
    parser.add_argument(
        "--qnn-cache",
        default=None,
        help="QNN context-binary cache root (default: $SAKURA_QNN_CACHE or ~/.cache/sakura/qnn)",
    )


async def serve(config: AgentConfig, *, ready=None) -> None:
    """Serve until SIGTERM/SIGINT; ``ready(port)`` is called once listening."""
    from sakura_core.http_serving import bound_port

    app = create_app(config)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        if ready is not None:
            ready(bound_port(runner))
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()


def run(args) -> int:
    import torch

    try:
        config = AgentConfig(
            token=args.token or os.environ.get(TOKEN_ENV, ""),
            profile=args.profile,
            host=args.host,
            allow_lan=args.allow_lan,
            allow_private_cloud=args.allow_private_cloud,
            port=args.port,
            queue_size=args.queue,
            memory_budget_bytes=None if args.memory_budget_mib is None else int(args.memory_budget_mib * 2**20),
            job_timeout_s=args.job_timeout,
            simulate_phone=not args.no_simulation,
            weights=args.weights,
            backend=args.backend,
            qnn_cache_dir=args.qnn_cache,
            model=args.model,
            device=args.device,
            dtype=args.dtype,
        )
    except ValueError as e:
        print(f"sakura phone-agent: {e}", file=sys.stderr)
        return 2
    if args.threads < 1:
        print(f"sakura phone-agent: --threads must be >= 1, got {args.threads}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)

    def ready(port: int) -> None:
        host = f"[{config.host}]" if ":" in config.host else config.host
        htp = " on the EMULATED HTP" if config.backend == "qnn" else ""
        print(
            f"phone agent listening on http://{host}:{port} profile={config.profile} backend={config.backend}{htp} "
            "(emulated)",
            flush=True,
        )

    asyncio.run(serve(config, ready=ready))
    print("sakura phone-agent: stopped", flush=True)
    return 0
