"""``sakura train demo-model``: train the demo editing model on the generated task and write its weights.

Periodic checkpoints go outside the repository (``--ckpt-dir``, default ``~/.cache/sakura/train-demo``);
``--resume CKPT`` continues one exactly. The learning-rate schedule runs over ``--steps`` steps, or, without
``--steps``, over the ``--minutes`` time budget of the first run (so a slower shared machine means fewer steps, not a
schedule cut off at a high learning rate). A run also stops after ``--minutes`` of this session and always writes the
current weights to ``--out``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    from .train import TrainConfig, default_checkpoint_dir

    d = TrainConfig()
    parser.add_argument("--minutes", type=float, default=None, help="wall-clock budget of this run in minutes")
    parser.add_argument(
        "--out",
        required=True,
        help="final weights (.safetensors); the packaged path is sakura_core/models/weights/demo_model.safetensors",
    )
    parser.add_argument("--resume", default=None, help="continue from this checkpoint")
    parser.add_argument(
        "--steps", type=int, default=None, help="schedule length in steps (default: the --minutes time budget)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=d.batch_size, help="examples per step (default: %(default)s)"
    )
    parser.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default: %(default)s)")
    parser.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="default: %(default)s")
    parser.add_argument("--seed", type=int, default=d.seed, help="data and noise seed (default: %(default)s)")
    parser.add_argument("--save-every", type=int, default=d.save_every, help="checkpoint period in steps")
    parser.add_argument("--log-every", type=int, default=d.log_every, help="log period in steps")
    parser.add_argument("--ckpt-dir", default=None, help=f"checkpoint folder (default: {default_checkpoint_dir()})")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's choice; on a shared CPU use 1: 2 threads ran 2x slower here)",
    )
    parser.add_argument("--no-progress", action="store_true", help="log lines only, no progress bar")
    parser.add_argument(
        "--per-step-frac",
        type=float,
        default=d.per_step_frac,
        help="share of examples trained in per-step KV mode (template at the step's t; default: %(default)s)",
    )
    parser.add_argument("--init-weights", default=None, help="fine-tune from these weights (default: random init)")


def run(args) -> int:
    from .train import DemoTrainer, TrainConfig, save_weights

    if args.minutes is None and args.steps is None and args.resume is None:
        raise SystemExit("sakura train demo-model: give --minutes (time budget) and/or --steps (schedule length)")
    if args.minutes is not None and args.minutes <= 0:
        raise SystemExit(f"sakura train demo-model: --minutes must be > 0, got {args.minutes}")
    if args.threads is not None:
        if args.threads < 1:
            raise SystemExit(f"sakura train demo-model: --threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    try:
        config = TrainConfig(
            seed=args.seed,
            batch_size=args.batch_size,
            lr=args.lr,
            warmup_steps=args.warmup_steps,
            total_steps=args.steps,
            save_every=args.save_every,
            log_every=args.log_every,
            per_step_frac=args.per_step_frac,
            init_weights=args.init_weights,
        )
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"sakura train demo-model: {e}") from e
    t0 = time.perf_counter()
    trainer = DemoTrainer(config)
    if args.resume:
        trainer.load_checkpoint(args.resume)
        print(f"resumed {args.resume} at step {trainer.step} ({trainer.progress():.1%} of the schedule)")
    params = sum(p.numel() for p in trainer.transformer.parameters())
    print(
        f"training {trainer.spec.name}: {params / 1e6:.2f}M parameters, {trainer.model.adapter.num_layers} layers, "
        f"batch {config.batch_size}, lr {config.lr}, {torch.get_num_threads()} threads"
    )
    summary = trainer.run(
        max_seconds=None if args.minutes is None else args.minutes * 60,
        checkpoint_dir=args.ckpt_dir,
        progress=not args.no_progress,
    )
    out = save_weights(trainer, args.out, summary)
    summary["weights"] = str(out)
    summary["weights_bytes"] = Path(out).stat().st_size
    summary["command_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(summary, indent=2))
    if not summary["finished"]:
        print(f"stopped before the end of the schedule: continue with --resume {summary['checkpoint']}")
    return 0
