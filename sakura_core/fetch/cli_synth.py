"""``sakura traces synth``: write the synthetic development traces (random walks, on/off links with outages; with
``--set slow`` the slow-link set: 3G-like walks and Oboe-like segment links, one folder per class)."""

from __future__ import annotations

import json
from pathlib import Path

from .synth import development_set, slow_set, write_pensieve
from .trace_classes import CLASSES_FILE

__all__ = ["add_arguments", "run"]

# the slow set's folders and the class each is reported as (trace_classes.json in --out)
_SLOW_FOLDERS = {"3G": "3g-like", "broadband": "oboe-like"}


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, help="folder to write the traces into (created; existing files kept)")
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="first seed (default: 100 for --set dev, 300 for --set slow: the development sets)",
    )
    parser.add_argument(
        "--set",
        dest="which",
        choices=("dev", "slow"),
        default="dev",
        help="dev: random walks and on/off links (default); slow: 3G-like walks (3g-like/, class 3G) "
        "and Oboe-like links (oboe-like/, class broadband), with a trace_classes.json",
    )


def run(args) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"sakura traces synth: --out {out} is a file; give a folder")
    out.mkdir(parents=True, exist_ok=True)
    which = getattr(args, "which", "dev")
    seed = args.seed if args.seed is not None else (300 if which == "slow" else 100)
    if which == "slow":
        n = 0
        for cls, traces in slow_set(seed).items():
            folder = out / _SLOW_FOLDERS[cls]
            folder.mkdir(exist_ok=True)
            for t in traces:
                write_pensieve(t, folder / f"{t.name}.log")
            n += len(traces)
        classes = {f"{folder}/*": cls for cls, folder in _SLOW_FOLDERS.items()}
        (out / CLASSES_FILE).write_text(json.dumps(classes, indent=1) + "\n")
    else:
        traces = development_set(seed)
        for t in traces:
            write_pensieve(t, out / f"{t.name}.log")
        n = len(traces)
    print(
        f"wrote {n} traces to {out} (set {which}, seed {seed}); run them with: sakura bench e2e --mode sim "
        f"--traces {out} ..."
    )
    return 0
