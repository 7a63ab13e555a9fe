"""``sakura phone devices``: list adb devices (like ``adb devices``, this starts the adb server when none runs), or
with ``--agent`` show a phone agent's device info."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
import os
import sys

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    from .client import TOKEN_ENV

    parser.add_argument("--agent", default=None, help="show this agent's /v1/info instead (http://..., adb[:SERIAL])")
    parser.add_argument("--token", default=None, help=f"pairing token for --agent (default: ${TOKEN_ENV})")
    parser.add_argument("--adb-host", default="127.0.0.1", help="adb server host (default: %(default)s)")
    parser.add_argument("--adb-port", type=int, default=5037, help="adb server port (default: %(default)s)")


def run(args) -> int:
    from .client import TOKEN_ENV, PhoneClient, PhoneError
    from .transports import TransportError, list_adb_devices

    try:
        if args.agent:
            with PhoneClient.connect(args.agent, args.token or os.environ.get(TOKEN_ENV), check=False) as client:
                print(json.dumps({**client.describe(), "info": client.info()}, indent=1))
            return 0
        devices = list_adb_devices(host=args.adb_host, port=args.adb_port)
    except (PhoneError, TransportError) as e:
        print(f"sakura phone devices: {e}", file=sys.stderr)
        return 1
    if not devices:
        print("no adb devices (connect a phone with USB debugging on, or use the emulated agent: sakura phone-agent)")
        return 0
    for d in devices:
        print(f"{d['serial']:<24} {d['state']:<12} {d['model']}")
    return 0
