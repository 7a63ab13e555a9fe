"""``sakura phone run``: dispatch one edit to a phone agent, write the edited image, print the job report."""
# ruff: noqa: T201 - a CLI prints

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    from .client import TOKEN_ENV

    parser.add_argument("--agent", required=True, help="http://HOST:PORT, adb, adb:SERIAL or adb:SERIAL@PORT")
    parser.add_argument("--token", default=None, help=f"pairing token (default: ${TOKEN_ENV})")
    parser.add_argument("--cloud", required=True, help="SAKURA cloud server URL, as the phone reaches it")
    parser.add_argument("--cloud-token", default=None, help="read token of the cloud server, if it has one")
    parser.add_argument("--template", required=True, help="template id")
    parser.add_argument("--image", required=True, help="the user image (PNG/JPEG); it goes to the phone only")
    parser.add_argument("--prompt", required=True, help="edit prompt (goes to the phone only)")
    parser.add_argument("--out", required=True, help="where to write the edited image (PNG)")
    parser.add_argument("--policy", default="sakura", help="fetch policy (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bandwidth", default=None, help="link emulation on the phone: live or fixed:<Mbit/s>")
    parser.add_argument("--report", default=None, help="also write the full report (JSON) here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def _summary(report: dict) -> dict:
    """The report (``sakura_core.edit_report`` format) without its long parts: decisions, template and timeline."""
    drop = ("decisions", "template", "timeline_origin", "timeline")
    return {k: v for k, v in report.items() if k not in drop}


def run(args) -> int:
    from sakura_core.files import atomic_write_bytes, output_problem, png_bytes
    from sakura_core.images import open_image_file

    from .client import TOKEN_ENV, PhoneClient, PhoneError, PhoneJob
    from .transports import TransportError

    token = args.token or os.environ.get(TOKEN_ENV)
    if not token:
        print(f"sakura phone run: a pairing token is required (--token or ${TOKEN_ENV})", file=sys.stderr)
        return 2
    path = Path(args.image)
    if not path.is_file():
        print(f"sakura phone run: image {path} not found", file=sys.stderr)
        return 2
    try:
        image = open_image_file(path)
    except ValueError as e:  # not an image, past the pixel limit
        print(f"sakura phone run: {e}", file=sys.stderr)
        return 2
    for out in filter(None, (args.out, args.report)):  # said now, not after the edit
        problem = output_problem(out)
        if problem is not None:
            print(f"sakura phone run: {problem}", file=sys.stderr)
            return 1
    try:
        job = PhoneJob(
            cloud_url=args.cloud,
            template_id=args.template,
            prompt=args.prompt,
            steps=args.steps,
            seed=args.seed,
            policy=args.policy,
            bandwidth=args.bandwidth,
            cloud_token=args.cloud_token,
        )
    except ValueError as e:  # a prompt that is not text (a lone surrogate), a bad --bandwidth
        print(f"sakura phone run: {e}", file=sys.stderr)
        return 2

    def progress(event: dict) -> None:
        if not args.quiet and event["layer"] == event["layers"] - 1:
            print(f"  step {event['step'] + 1}/{event['steps']}", file=sys.stderr, flush=True)

    try:
        with PhoneClient.connect(args.agent, token) as client:
            edited, report = client.run_job(image, job, on_progress=progress)
    except (PhoneError, TransportError) as e:  # TransportError: no adb phone, no adb binary, a refused forward
        print(f"sakura phone run: {e}", file=sys.stderr)
        return 1
    out = Path(args.out)
    atomic_write_bytes(out, png_bytes(edited))  # whole or not at all (a full disk: sakura's one-line error)
    if args.report:
        atomic_write_bytes(args.report, json.dumps(report, indent=1, default=str).encode())
    print(json.dumps(_summary(report), indent=1, default=str))
    print(f"wrote {out}", file=sys.stderr)
    return 0
