"""``sakura traces synth``: write the synthetic development traces (random walks, on/off links with outages)."""

from __future__ import annotations

from pathlib import Path

from .synth import development_set, write_pensieve

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, help="folder to write the traces into (created; existing files kept)")
    parser.add_argument("--seed", type=int, default=100, help="first seed (default %(default)s: the development set)")


def run(args) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"sakura traces synth: --out {out} is a file; give a folder")
    out.mkdir(parents=True, exist_ok=True)
    traces = development_set(args.seed)
    for t in traces:
        write_pensieve(t, out / f"{t.name}.log")
    print(f"wrote {len(traces)} traces to {out} (seed {args.seed}); run them with: sakura bench e2e --mode sim "
          f"--traces {out} ...")  # fmt: skip
    return 0
