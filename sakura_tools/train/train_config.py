"""The demo model's training settings (:class:`TrainConfig`, validated on construction) and where checkpoints live
(:func:`default_checkpoint_dir`); :mod:`.train` runs them (and re-exports both)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sakura_core.files import cache_root

__all__ = ["TrainConfig", "default_checkpoint_dir"]


def default_checkpoint_dir() -> Path:
    """Checkpoints live outside the repository: ``$SAKURA_CACHE_DIR`` or ``~/.cache/sakura``, then ``train-demo``."""
    return cache_root() / "train-demo"


@dataclass(frozen=True)
class TrainConfig:
    """Training settings.

    Attributes:
        seed: data stream and noise seed.
        batch_size: examples per step.
        lr: peak AdamW learning rate (after ``warmup_steps`` of linear warm-up; then cosine decay).
        min_lr_frac: final learning rate as a fraction of ``lr``.
        warmup_steps: linear warm-up steps.
        total_steps: length of the schedule in steps (fully deterministic), or ``None``: the cosine decay follows
            the fraction of the time budget used (``DemoTrainer.run(max_seconds=...)``), so a slower shared machine
            shortens the run instead of cutting it off at a high learning rate. Resuming a checkpoint restores its
            state exactly either way; only the step-count schedule makes a resumed run step-for-step identical to
            an uninterrupted one.
        weight_decay: AdamW weight decay.
        grad_clip: max global gradient norm.
        save_every: checkpoint every this many steps.
        log_every: log line every this many steps.
        keep_checkpoints: how many periodic checkpoints to keep.
        per_step_frac: fraction of examples whose template tokens are modulated with the example's own time ``t``
            (``per-step`` KV mode); the others use the fixed reference time (``single`` mode). 0 = single only.
        init_weights: start from these weights (a fine-tune) instead of the seeded random init.
    """

    seed: int = 0
    batch_size: int = 8
    lr: float = 2e-3
    min_lr_frac: float = 0.05
    warmup_steps: int = 100
    total_steps: int | None = None
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    save_every: int = 250
    log_every: int = 50
    keep_checkpoints: int = 2
    per_step_frac: float = 0.0
    init_weights: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.per_step_frac <= 1.0:
            raise ValueError(f"per_step_frac must be in [0, 1] (share of per-step examples), got {self.per_step_frac}")
        if self.init_weights is not None and not Path(self.init_weights).is_file():
            raise FileNotFoundError(f"init_weights {self.init_weights} not found; pass an existing .safetensors")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_frac <= 1:
            raise ValueError(f"min_lr_frac must be in [0, 1], got {self.min_lr_frac}")
        if self.total_steps is not None and self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1 or None (schedule by time budget), got {self.total_steps}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("save_every", "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
