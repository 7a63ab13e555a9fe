"""Train and evaluate the demo model on the generated template-editing task (:mod:`.edit_task`).

Training goes through :meth:`Flux2KVAdapter.forward_grad` with ``split_layer = num_layers``: the template tokens are
in the sequence in diffusers' KV "extract" mode (they attend only to themselves, modulated at the fixed reference
timestep), so the trained weights are exactly what the cached-KV path serves. Objective: rectified flow, as
:mod:`sakura_core.runtime.sampler` integrates it — ``x_t = (1 - t) x0 + t noise``, the model predicts the velocity
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

from .demo import DemoModel, DemoSpec, load_demo_model
from .edit_task import EDIT_PROMPT, EditTaskConfig, ImageBank, make_batch, make_pair, region_mask

__all__ = [
    "CHECKPOINT_FORMAT",
    "EVAL_SEED",
    "DemoTrainer",
    "TrainConfig",
    "default_checkpoint_dir",
    "evaluate",
    "gini",
    "psnr_db",
    "save_weights",
    "task_for",
    "template_importance",
]

logger = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "sakura-train-demo/1"
EVAL_SEED = 1_000_003  # held-out stream; training uses TrainConfig.seed (0 by default)


def default_checkpoint_dir() -> Path:
    """Checkpoints live outside the repository: ``$SAKURA_CACHE_DIR`` or ``~/.cache/sakura``, then ``train-demo``."""
    root = os.environ.get("SAKURA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "sakura")
    return Path(root) / "train-demo"


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

    def __post_init__(self) -> None:
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


def task_for(spec: DemoSpec) -> EditTaskConfig:
    """The task geometry that fits the model: same image size, regions aligned to its patches.

    Region sides span 5/16..10/16 of the image and the harmonisation ring 1/8 of it (20..40 px, ring 8 px at 64 px).
    """
    s, a = spec.image_size, spec.patch_size
    lo = max(a, (s * 5 // 16) // a * a)
    hi = max(lo, (s * 10 // 16) // a * a)
    return EditTaskConfig(image_size=s, align_px=a, region_min_px=lo, region_max_px=hi, ring_px=max(1, s // 8))


def _step_seed(seed: int, step: int) -> int:
    return int(np.random.SeedSequence([seed, step, 7]).generate_state(1, dtype=np.uint64)[0] >> 1)


def _pack(model: DemoModel, images: np.ndarray) -> torch.Tensor:
    """(B, S, S, 3) uint8 -> (B, tokens, 3*p*p), exactly ``DemoModel.pack_image`` per image."""
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

    def __init__(self, config: TrainConfig, spec: DemoSpec | None = None, bank: ImageBank | None = None):
        self.config = config
        self.model = load_demo_model(spec, weights=None)  # seeded random init
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

    def loss(self, batch: _Batch, t: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """Flow-matching loss: MSE between the predicted and true velocity ``noise - x0`` at times ``t`` (B,)."""
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
        ).sample
        return torch.nn.functional.mse_loss(pred, noise - batch.target)

    def draw(self, step: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's timesteps (B,) in [0, 1) and noise shaped like ``like`` — a function of (seed, step) only."""
        gen = torch.Generator().manual_seed(_step_seed(self.config.seed, step))
        t = torch.rand(like.shape[0], generator=gen)
        return t, torch.randn(like.shape, generator=gen)

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
        loss = self.loss(batch, t, noise)
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
        theirs, ours = meta["train_config"], asdict(self.config)
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

            total = cfg.total_steps if cfg.total_steps is not None else round(self.budget_s)
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


# ---- evaluation ---------------------------------------------------------------------------------------------
def psnr_db(a: np.ndarray, b: np.ndarray, cap_db: float = 100.0) -> float:
    """PSNR of two uint8 images in dB (capped at ``cap_db`` for identical images)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return cap_db if mse == 0 else min(cap_db, 10 * math.log10(255.0**2 / mse))


def _ssim(a: np.ndarray, b: np.ndarray) -> float:
    from skimage.metrics import structural_similarity

    return float(structural_similarity(a, b, channel_axis=-1, data_range=255))


def gini(values) -> float:
    """Gini coefficient of non-negative values: 0 = all equal, -> 1 = all mass on one element."""
    x = np.sort(np.asarray(values, dtype=np.float64).ravel())
    if x.size == 0 or np.any(x < 0):
        raise ValueError("gini needs a non-empty array of non-negative values")
    total = x.sum()
    if total == 0:
        return 0.0
    n = x.size
    return float((2 * np.sum(np.arange(1, n + 1) * x)) / (n * total) - (n + 1) / n)


def _qk_double(attn, kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-RoPE (q, k), each (B, txt + seq, heads, head_dim), as ``Flux2KVAttnProcessor`` computes them."""
    from diffusers.models.embeddings import apply_rotary_emb

    hs, enc = kwargs["hidden_states"], kwargs["encoder_hidden_states"]
    q = attn.norm_q(attn.to_q(hs).unflatten(-1, (-1, attn.head_dim)))
    k = attn.norm_k(attn.to_k(hs).unflatten(-1, (-1, attn.head_dim)))
    eq = attn.norm_added_q(attn.add_q_proj(enc).unflatten(-1, (-1, attn.head_dim)))
    ek = attn.norm_added_k(attn.add_k_proj(enc).unflatten(-1, (-1, attn.head_dim)))
    rope = kwargs["image_rotary_emb"]
    q = apply_rotary_emb(torch.cat([eq, q], dim=1), rope, sequence_dim=1)
    k = apply_rotary_emb(torch.cat([ek, k], dim=1), rope, sequence_dim=1)
    return q, k


def _qk_single(attn, kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Post-RoPE (q, k) of a single-stream block, as ``Flux2KVParallelSelfAttnProcessor`` computes them."""
    from diffusers.models.embeddings import apply_rotary_emb

    proj = attn.to_qkv_mlp_proj(kwargs["hidden_states"])
    qkv_dim = 3 * attn.inner_dim
    local_qkv = proj.shape[-1] * qkv_dim // (qkv_dim + attn.mlp_hidden_dim * attn.mlp_mult_factor)
    q, k, _ = proj[..., :local_qkv].chunk(3, dim=-1)
    q = attn.norm_q(q.unflatten(-1, (-1, attn.head_dim)))
    k = attn.norm_k(k.unflatten(-1, (-1, attn.head_dim)))
    rope = kwargs["image_rotary_emb"]
    return apply_rotary_emb(q, rope, sequence_dim=1), apply_rotary_emb(k, rope, sequence_dim=1)


@torch.no_grad()
def template_importance(
    model: DemoModel, template: np.ndarray, user: np.ndarray, target: np.ndarray, times=(0.3, 0.6, 0.9), seed: int = 0
) -> tuple[np.ndarray, float]:
    """Attention mass the request queries put on each template token, per layer and head.

    Probe requests: the target noised to each of ``times`` (seeded noise), with the user image and the edit prompt.
    For every layer, the request image queries' softmax over all keys (text, template, request) is recomputed from
    the block's inputs exactly as the KV processors compute it, and averaged over queries and probes.

    Returns (importance (layers, heads, template_tokens), template_share = mean total mass on template tokens). The
    recomputed template keys are checked against the KV the forward extracted (a mismatch raises).
    """
    adapter = model.adapter
    grid, n_ref = model.spec.grid, model.spec.num_tokens
    L, n_txt = adapter.num_layers, model.spec.text_tokens
    ref = model.template_tokens(template)
    u, x0 = model.pack_image(user), model.pack_image(target)
    txt = model.encode_prompt(EDIT_PROMPT)
    gen = torch.Generator().manual_seed(seed)
    acc = torch.zeros(L, adapter.num_heads, n_ref, dtype=torch.float64)  # (layers, heads, ref tokens)
    keys: dict[int, torch.Tensor] = {}

    def make_hook(layer: int, double: bool):
        def hook(module, args, kwargs):
            q, k = (_qk_double if double else _qk_single)(module, kwargs)  # (B, N, H, D)
            # double blocks: [txt, ref, img] after the text is prepended; single blocks: the same order
            keys[layer] = k[:, n_txt : n_txt + n_ref]
            q_img = q[:, n_txt + n_ref :]  # request queries (B, n_img, H, D)
            scores = torch.einsum("bqhd,bkhd->bhqk", q_img.float(), k.float()) / math.sqrt(q.shape[-1])
            probs = scores.softmax(dim=-1)[..., n_txt : n_txt + n_ref]  # (B, H, n_img, n_ref)
            acc[layer] += probs.mean(dim=(0, 2)).double()

        return hook

    blocks = [b.attn for b in adapter.model.transformer_blocks] + [
        b.attn for b in adapter.model.single_transformer_blocks
    ]
    handles = [
        attn.register_forward_pre_hook(make_hook(i, i < adapter.num_double), with_kwargs=True)
        for i, attn in enumerate(blocks)
    ]
    try:
        for t_val in times:
            noise = torch.randn(x0.shape, generator=gen)
            x_t = (1 - t_val) * x0 + t_val * noise
            result = adapter.forward(
                model.request_tokens(x_t, u),
                txt,
                torch.full((1,), float(t_val)),
                img_grid=grid,
                ref_tokens=ref,
                ref_grid=grid,
                split_layer=L,
            )
            for layer, (k_ext, _) in enumerate(result.extracted):
                err = float((keys[layer][:1] - k_ext).abs().max())
                if err > 1e-4 * max(1.0, float(k_ext.abs().max())):
                    raise RuntimeError(
                        f"importance probe: recomputed template keys of layer {layer} differ from the extracted KV "
                        f"by {err:.3g}; the diffusers attention processors changed — update _qk_double/_qk_single"
                    )
    finally:
        for h in handles:
            h.remove()
    imp = (acc / len(times)).numpy()
    return imp, float(imp.sum(axis=-1).mean())


def evaluate(
    model: DemoModel,
    bank: ImageBank | None = None,
    *,
    pairs: int = 32,
    seed: int = EVAL_SEED,
    steps: int = 8,
    probes: int = 4,
    reference_model: DemoModel | None = None,
    on_pair: Callable[[int], None] | None = None,
) -> dict:
    """Held-out evaluation of the KV edit path against the ground truth and trivial baselines.

    Each pair: the template's KV is extracted (server side), the edit runs with all template KV injected
    (``split_layer=0``, the phone path), ``steps`` Euler steps, noise seed = pair index.
    Baselines: return the template; return the user image; paste the user content into the region without
    recolouring (the ideal output of a model that composites but does not harmonise).
    ``importance_gini``: Gini of template-token importance (mean over layers, heads, probe times) per probe template,
    averaged over the first ``probes`` pairs; with ``reference_model`` (e.g. the random init) the same statistic
    for it is reported alongside.
    """
    from ..runtime.edit import run_edit

    if pairs < 1 or steps < 1 or probes < 0:
        raise ValueError(f"pairs and steps must be >= 1 and probes >= 0, got {pairs}, {steps}, {probes}")
    bank = bank or ImageBank.load()
    task = task_for(model.spec)
    rows = {k: {"psnr": [], "ssim": []} for k in ("model", "template", "user_image", "naive_composite")}
    inside, outside = [], []
    for i in range(pairs):
        p = make_pair(bank, task, seed, i)
        kv = model.adapter.extract_template_kv(model.template_tokens(p.template), model.spec.grid)
        out = run_edit(model, p.user, EDIT_PROMPT, steps=steps, seed=i, split_layer=0, kv_source=kv).image
        mask = region_mask(p.box, task.image_size)
        naive = np.where(mask[..., None], p.user, p.scene)
        for name, img in (
            ("model", out),
            ("template", p.template),
            ("user_image", p.user),
            ("naive_composite", naive),
        ):
            rows[name]["psnr"].append(psnr_db(img, p.target))
            rows[name]["ssim"].append(_ssim(img, p.target))
        inside.append(psnr_db(out[mask], p.target[mask]))
        outside.append(psnr_db(out[~mask], p.target[~mask]))
        if on_pair is not None:
            on_pair(i)

    def importance_stats(m: DemoModel) -> dict:
        ginis, layer_ginis, top10, share = [], [], [], []
        for i in range(probes):
            p = make_pair(bank, task, seed, i)
            imp, tshare = template_importance(m, p.template, p.user, p.target, seed=i)  # (L, H, n_ref)
            per_token = imp.mean(axis=(0, 1))
            ginis.append(gini(per_token))
            layer_ginis.append([gini(imp[layer].mean(axis=0)) for layer in range(imp.shape[0])])
            k = max(1, per_token.size // 10)
            top10.append(float(np.sort(per_token)[-k:].sum() / per_token.sum()))
            share.append(tshare)
        return {
            "gini": float(np.mean(ginis)),
            "gini_per_layer": np.mean(layer_ginis, axis=0).round(4).tolist(),
            "top10pct_mass": float(np.mean(top10)),
            "template_share": float(np.mean(share)),
        }

    result = {
        "psnr_db": float(np.mean(rows["model"]["psnr"])),
        "ssim": float(np.mean(rows["model"]["ssim"])),
        "baselines": {
            name: {"psnr_db": float(np.mean(rows[name]["psnr"])), "ssim": float(np.mean(rows[name]["ssim"]))}
            for name in ("template", "user_image", "naive_composite")
        },
        "region_psnr_db": {"inside": float(np.mean(inside)), "outside": float(np.mean(outside))},
        "importance_gini": None,
        "settings": {
            "pairs": pairs,
            "seed": seed,
            "steps": steps,
            "probes": probes,
            "prompt": EDIT_PROMPT,
            "path": "template KV extracted, then injected at every layer (split_layer=0)",
        },
        "model": {"name": model.spec.name, "id": model.model_id, "weights": model.weights_source},
    }
    if probes:
        stats = importance_stats(model)
        result["importance_gini"] = stats["gini"]
        result["importance"] = stats
        if reference_model is not None:
            result["importance_reference"] = {
                "weights": reference_model.weights_source,
                **importance_stats(reference_model),
            }
    return result
