"""Train and evaluate the demo model on the generated template-editing task (:mod:`.edit_task`).

Training goes through :meth:`Flux2KVAdapter.forward_grad` with ``split_layer = num_layers``: the template tokens are
in the sequence in diffusers' KV "extract" mode (they attend only to themselves, modulated at the fixed reference
timestep), so the trained weights are exactly what the cached-KV path serves. Objective: rectified flow, as
:mod:`sakura_core.runtime.schedule` integrates it — ``x_t = (1 - t) x0 + t noise``, the model predicts the velocity
``noise - x0`` of the target tokens, conditioned on the user image (channel-concatenated) and the template (KV).

Determinism: example ``j`` of step ``s`` is ``make_pair(seed, s * batch + j)``; the step's timesteps and noise come
from a generator seeded with ``(seed, s)``. A checkpoint (safetensors: weights + optimizer state, JSON metadata — no
pickle) restores the exact state; with a step-count schedule (``total_steps``) the resumed run is then bit-identical
to an uninterrupted one on the same machine and thread count. With the time-budget schedule the learning rate
follows wall time (so a slower, shared CPU shortens the run instead of cutting it off at a high learning rate), and
only the restored state is exact.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from sakura_core.demo.edit_task import EDIT_PROMPT, ImageBank, make_batch, task_for
from sakura_core.models.edit_model import EditModel, ModelSpec, load_demo_model

from .train_config import TrainConfig, default_checkpoint_dir

__all__ = [
    "CHECKPOINT_FORMAT",
    "EVAL_SEED",
    "DemoTrainer",
    "TrainConfig",
    "default_checkpoint_dir",
    "save_weights",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "sakura-train-demo/1"
EVAL_SEED = 1_000_003  # held-out stream; training uses TrainConfig.seed (0 by default)


def _step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step, 7]).generate_state(1, dtype=np.uint64)[0] >> 1)


def _pack(model: EditModel, images: np.ndarray) -> torch.Tensor:
    """(B, S, S, 3) uint8 -> (B, tokens, 3*p*p), exactly ``EditModel.pack_image`` per image."""
    return torch.cat([model.pack_image(img) for img in images], dim=0)


@dataclass
class _Batch:
    template: torch.Tensor  # (B, tokens, in_channels) template tokens (patch + zeros)
    user: torch.Tensor  # (B, tokens, 3*p*p)
    target: torch.Tensor  # (B, tokens, 3*p*p)


@dataclass
class _History:
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, mean loss over the log window)
    elapsed_s: float = 0.0  # training wall time over all sessions


class DemoTrainer:
    """Owns the model, the optimizer and the step counter of one training run.

    Args:
        config: training settings.
        spec: model geometry and transformer config (default: the packaged ``demo_model.json``).
        bank: source images (loaded when omitted).
    """

    def __init__(self, config: TrainConfig, spec: ModelSpec | None = None, bank: ImageBank | None = None):
        self.config = config
        self.model = load_demo_model(spec, weights=config.init_weights)  # None = seeded random init
        self.spec = self.model.spec
        self.task = task_for(self.spec)
        self.bank = bank or ImageBank.load()
        self.transformer = self.model.adapter.model.train()
        self.optimizer = torch.optim.AdamW(
            self.transformer.parameters(), lr=config.lr, betas=(0.9, 0.99), weight_decay=config.weight_decay
        )
        self.step = 0
        self.budget_s: float | None = None  # time budget of a time-scheduled run (set by the first run())
        self.history = _History()
        self._txt = self.model.encode_prompt(EDIT_PROMPT)  # (1, text_tokens, joint_dim)

    # ---- data and loss ------------------------------------------------------------------------------------
    def batch(self, step: int) -> _Batch:
        b = self.config.batch_size
        template, user, target = make_batch(self.bank, self.task, self.config.seed, range(step * b, (step + 1) * b))
        t_tok = _pack(self.model, template)
        return _Batch(
            torch.cat([t_tok, torch.zeros_like(t_tok)], dim=-1), _pack(self.model, user), _pack(self.model, target)
        )

    def loss(
        self, batch: _Batch, t: torch.Tensor, noise: torch.Tensor, ref_t: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Flow-matching loss: MSE between the predicted and true velocity ``noise - x0`` at times ``t`` (B,).

        ``ref_t`` (B,): the template tokens' modulation time per example (``None``: the fixed reference time).
        """
        tb = t.view(-1, 1, 1)
        x_t = (1 - tb) * batch.target + tb * noise
        adapter = self.model.adapter
        pred = adapter.forward_grad(
            self.model.request_tokens(x_t, batch.user),
            self._txt.expand(batch.user.shape[0], -1, -1),
            t,
            img_grid=self.spec.grid,
            ref_tokens=batch.template,
            ref_grid=self.spec.grid,
            split_layer=adapter.num_layers,
            ref_timestep=ref_t,
        ).sample
        return torch.nn.functional.mse_loss(pred, noise - batch.target)

    def draw(self, step: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's timesteps (B,) in [0, 1) and noise shaped like ``like`` — a function of (seed, step) only."""
        gen = torch.Generator().manual_seed(_step_seed(self.config.seed, step))
        t = torch.rand(like.shape[0], generator=gen)
        return t, torch.randn(like.shape, generator=gen)

    def ref_times(self, step: int, t: torch.Tensor) -> torch.Tensor | None:
        """Per-example template time (B,): ``t`` itself (per-step mode) with probability ``per_step_frac``, else the
        fixed reference time (single mode); ``None`` when training single mode only. A function of (seed, step)."""
        if self.config.per_step_frac == 0.0:
            return None
        gen = torch.Generator().manual_seed(_step_seed(self.config.seed, step) ^ 0x5EED)
        per_step = torch.rand(t.shape[0], generator=gen) < self.config.per_step_frac
        return torch.where(per_step, t, torch.full_like(t, self.model.adapter.ref_fixed_timestep))

    def progress(self) -> float:
        """Fraction of the schedule done: steps / total_steps, or elapsed / budget for a time-budget schedule."""
        if self.config.total_steps is not None:
            return min(1.0, self.step / self.config.total_steps)
        if not self.budget_s:
            return 0.0
        return min(1.0, self.history.elapsed_s / self.budget_s)

    def lr_now(self) -> float:
        """Linear warm-up over ``warmup_steps`` steps, times a cosine from ``lr`` to ``min_lr_frac * lr``."""
        cfg = self.config
        warm = min(1.0, (self.step + 1) / cfg.warmup_steps) if cfg.warmup_steps else 1.0
        cos = 0.5 * (1 + math.cos(math.pi * self.progress()))
        return cfg.lr * warm * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * cos)

    def train_step(self) -> float:
        """One optimizer step on batch ``self.step``; returns its loss."""
        batch = self.batch(self.step)
        t, noise = self.draw(self.step, batch.target)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_now()
        loss = self.loss(batch, t, noise, self.ref_times(self.step, t))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.transformer.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.step += 1
        return float(loss.detach())

    # ---- checkpoints --------------------------------------------------------------------------------------
    def save_checkpoint(self, path: str | Path) -> Path:
        """Weights + AdamW state as safetensors; step, schedule, settings and loss history in its JSON metadata."""
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {f"model.{k}": v.detach().contiguous() for k, v in self.transformer.state_dict().items()}
        opt_state = self.optimizer.state_dict()
        for idx, state in opt_state["state"].items():
            for key, value in state.items():
                tensors[f"optim.{idx}.{key}"] = torch.as_tensor(value).detach().contiguous()
        groups = [{k: v for k, v in g.items()} for g in opt_state["param_groups"]]
        meta = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "budget_s": self.budget_s,
            "train_config": asdict(self.config),
            "spec": asdict(self.spec),
            "param_groups": groups,
            "history": {"losses": self.history.losses, "elapsed_s": self.history.elapsed_s},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        save_file(tensors, str(tmp), metadata={"json": json.dumps(meta)})
        os.replace(tmp, path)
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint written by :meth:`save_checkpoint` for the same model config and settings."""
        from safetensors import safe_open

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint {path} not found")
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get("json")
            if raw is None:
                raise ValueError(f"{path} is not a {CHECKPOINT_FORMAT} checkpoint (no metadata); pass a training ckpt")
            meta = json.loads(raw)
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no items()
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: checkpoint format {meta.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
        if meta["spec"]["transformer"] != self.spec.transformer:
            raise ValueError(
                f"{path} was trained with another transformer config ({meta['spec']['transformer']}); "
                "restore that demo_model.json or start a fresh run"
            )
        ours = asdict(self.config)
        theirs = {
            **{k: v for k, v in asdict(TrainConfig()).items() if k not in meta["train_config"]},
            **meta["train_config"],
        }
        if theirs != ours:
            diff = {k: (theirs.get(k), ours.get(k)) for k in ours if theirs.get(k) != ours.get(k)}
            raise ValueError(f"{path}: training settings differ from the checkpoint's (ckpt, now): {diff}")
        model_state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
        self.transformer.load_state_dict(model_state, strict=True)
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            if key.startswith("optim."):
                _, idx, name = key.split(".", 2)
                state.setdefault(int(idx), {})[name] = value
        self.optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        self.step = int(meta["step"])
        self.budget_s = meta["budget_s"]
        self.history = _History([tuple(x) for x in meta["history"]["losses"]], float(meta["history"]["elapsed_s"]))

    # ---- the loop -----------------------------------------------------------------------------------------
    def run(
        self,
        *,
        max_seconds: float | None = None,
        checkpoint_dir: str | Path | None = None,
        progress: bool = True,
        on_log: Callable[[dict], None] | None = None,
    ) -> dict:
        """Train to the end of the schedule, or until ``max_seconds`` of wall time in this session.

        A time-budget schedule (``total_steps=None``) takes its budget from the first ``run`` (``max_seconds``,
        stored in checkpoints); a resumed run continues it. Checkpoints every ``save_every`` steps and at the end.
        Returns a summary (steps, wall time, last loss, last checkpoint, finished).
        """
        cfg = self.config
        if cfg.total_steps is None and self.budget_s is None:
            if max_seconds is None:
                raise ValueError("give TrainConfig.total_steps or a time budget (max_seconds)")
            self.budget_s = float(max_seconds)
        ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir()
        start = time.perf_counter()
        start_elapsed = self.history.elapsed_s
        window: list[float] = []
        last_ckpt: Path | None = None
        bar = None
        if progress:
            from tqdm.auto import tqdm

            total = cfg.total_steps
            if total is None:
                assert self.budget_s is not None  # set above when the run has no step count
                total = round(self.budget_s)
            bar = tqdm(total=total, unit="step" if cfg.total_steps else "s", dynamic_ncols=True)
        try:
            while self.progress() < 1.0:
                lr = self.lr_now()
                loss = self.train_step()
                window.append(loss)
                now = time.perf_counter()
                self.history.elapsed_s = start_elapsed + (now - start)
                if bar is not None:
                    bar.n = self.step if cfg.total_steps is not None else min(bar.total, round(self.history.elapsed_s))
                    bar.set_postfix(step=self.step, loss=f"{loss:.4f}", lr=f"{lr:.2e}", refresh=False)
                    bar.refresh()
                if self.step % cfg.log_every == 0 or self.progress() >= 1.0:
                    self._log_window(window, lr, on_log)
                if self.step % cfg.save_every == 0:
                    last_ckpt = self._periodic_checkpoint(ckpt_dir)
                if max_seconds is not None and now - start >= max_seconds and self.progress() < 1.0:
                    logger.info(
                        "session budget %.0f s used at step %d: stopping (--resume continues)", max_seconds, self.step
                    )
                    break
        finally:
            if bar is not None:
                bar.close()
        if window:
            self.history.losses.append((self.step, float(np.mean(window))))
        if last_ckpt is None or not last_ckpt.name.endswith(f"{self.step:07d}.safetensors"):
            last_ckpt = self._periodic_checkpoint(ckpt_dir)
        return {
            "steps": self.step,
            "finished": self.progress() >= 1.0,
            "session_s": round(time.perf_counter() - start, 1),
            "elapsed_s": round(self.history.elapsed_s, 1),
            "last_loss": self.history.losses[-1][1] if self.history.losses else None,
            "checkpoint": str(last_ckpt),
        }

    def _log_window(self, window: list[float], lr: float, on_log: Callable[[dict], None] | None) -> None:
        """Record the mean loss of ``window`` (then empty it) in the history, the log and ``on_log``."""
        mean = float(np.mean(window))
        self.history.losses.append((self.step, mean))
        window.clear()
        record = {
            "step": self.step,
            "progress": round(self.progress(), 4),
            "loss": mean,
            "lr": lr,
            "elapsed_s": round(self.history.elapsed_s, 1),
        }
        logger.info(
            "step %d (%.1f%%) loss %.5f lr %.2e %.1f s",
            self.step,
            100 * record["progress"],
            mean,
            lr,
            record["elapsed_s"],
        )
        if on_log is not None:
            on_log(record)

    def _periodic_checkpoint(self, ckpt_dir: Path) -> Path:
        path = self.save_checkpoint(ckpt_dir / f"ckpt-{self.step:07d}.safetensors")
        old = sorted(ckpt_dir.glob("ckpt-*.safetensors"))[: -self.config.keep_checkpoints]
        for stale in old:
            stale.unlink(missing_ok=True)
        logger.debug("checkpoint %s", path)
        return path

    def record(self, summary: dict | None = None) -> dict:
        """What to store with the final weights: settings, schedule, loss history."""
        return {
            "format": "sakura-demo-weights/1",
            "train_config": asdict(self.config),
            "task": asdict(self.task),
            "prompt": EDIT_PROMPT,
            "steps": self.step,
            "budget_s": self.budget_s,
            "elapsed_s": round(self.history.elapsed_s, 1),
            "torch_threads": torch.get_num_threads(),
            "losses": self.history.losses,
            **({"summary": summary} if summary else {}),
        }


def save_weights(trainer: DemoTrainer, path: str | Path, summary: dict | None = None) -> Path:
    """Final fp32 transformer weights as safetensors (what ``load_demo_model`` reads), the record as metadata."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous() for k, v in trainer.transformer.state_dict().items()}
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"training": json.dumps(trainer.record(summary))})
    os.replace(tmp, path)
    return path
