"""Will an edit fit on the phone? A memory estimate of one cached-KV edit against a device profile's budget.

The estimate counts what one NPU session (or, without an NPU, the app) must hold while the DiT runs:

* weights: ``params * profile.weight_bytes_per_param`` (w8a16 on the NPU: 1 byte per weight);
* template KV: ``layers * 2 * template_tokens * heads * head_dim * activation_bytes`` (single mode: every layer's
  K and V stay resident, one KV per layer serves every step; per-step mode: at most the running step's, freed layer
  by layer, plus what is prefetched for later steps, which the agent bounds by the room this estimate leaves under
  the budget: ``RuntimeConfig.prefetch_kv_bytes``);
* activations of the largest layer (layers run one after another, so one layer's working set is live at a time)::

      S = text_tokens + image_tokens, S_kv = S + template_tokens, D = heads * head_dim
      values = 2*S*D (residual in/out) + 3*S*D (q, k, v) + heads*S*S_kv (attention scores, materialised on the
               NPU) + 2*mlp_ratio*S*D (SwiGLU input) + S*D (attention output)

  times ``activation_bytes``.

It is an estimate for admission control (refuse what cannot fit, with the numbers), not an allocator trace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from sakura_core.runtime.profiles import DeviceProfile

__all__ = ["DiTGeometry", "JobMemory", "OverBudgetError", "check_budget", "estimate_job_memory"]


class OverBudgetError(ValueError):
    """A job's memory estimate is over the device's budget; ``memory`` holds the numbers."""

    def __init__(self, message: str, memory: JobMemory):
        super().__init__(message)
        self.memory = memory


@dataclass(frozen=True)
class DiTGeometry:
    """What the estimate needs to know about a DiT and one edit's token counts.

    Attributes:
        name: model name (for messages).
        params: parameter count.
        layers: transformer layers (double + single stream).
        heads: attention heads.
        head_dim: channels per head.
        image_tokens: request image tokens.
        template_tokens: template (reference) tokens.
        text_tokens: prompt tokens.
        mlp_ratio: MLP width / model width.
    """

    name: str
    params: int
    layers: int
    heads: int
    head_dim: int
    image_tokens: int
    template_tokens: int
    text_tokens: int
    mlp_ratio: float = 3.0

    def __post_init__(self) -> None:
        for field_name in ("params", "layers", "heads", "head_dim", "image_tokens"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"DiTGeometry.{field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.template_tokens < 0 or self.text_tokens < 0 or self.mlp_ratio <= 0:
            raise ValueError("DiTGeometry: template_tokens and text_tokens must be >= 0 and mlp_ratio > 0")

    @classmethod
    def of_demo(cls, model) -> DiTGeometry:
        """The geometry of an edit model (the demo ``EditModel`` or a latent ``LatentEditModel``, whose VAE and text
        encoder weights count too) editing at its own resolution."""
        a = model.adapter
        cfg = model.spec.transformer
        return cls(
            name=model.spec.name,
            params=sum(p.numel() for p in a.model.parameters()) + int(getattr(model, "component_params", 0)),
            layers=a.num_layers,
            heads=a.num_heads,
            head_dim=a.head_dim,
            image_tokens=model.spec.num_tokens,
            template_tokens=model.spec.num_tokens,
            text_tokens=model.spec.text_tokens,
            mlp_ratio=float(cfg.get("mlp_ratio", 3.0)),
        )


@dataclass(frozen=True)
class JobMemory:
    """Memory estimate of one edit (bytes) and the budget it was checked against."""

    weights_bytes: int
    kv_bytes: int
    activation_bytes: int
    budget_bytes: int
    budget_source: str

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.budget_bytes

    def to_json(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes, "fits": self.fits}


def estimate_job_memory(geometry: DiTGeometry, profile: DeviceProfile, budget_bytes: int | None = None) -> JobMemory:
    """The estimate of the module doc for ``geometry`` on ``profile``; ``budget_bytes`` overrides the profile's."""
    g = geometry
    act = profile.activation_bytes
    d = g.heads * g.head_dim
    s = g.text_tokens + g.image_tokens
    s_kv = s + g.template_tokens
    values = 2 * s * d + 3 * s * d + g.heads * s * s_kv + int(2 * g.mlp_ratio * s * d) + s * d
    if budget_bytes is None:
        budget, source = (
            profile.memory_budget_bytes,
            (f"{profile.name}: one NPU session" if profile.has_npu else f"{profile.name}: app memory share"),
        )
    else:
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes must be >= 1, got {budget_bytes}")
        budget, source = budget_bytes, "configured memory budget"
    return JobMemory(
        weights_bytes=g.params * profile.weight_bytes_per_param,
        kv_bytes=g.layers * 2 * g.template_tokens * d * act,
        activation_bytes=values * act,
        budget_bytes=budget,
        budget_source=source,
    )


def check_budget(
    geometry: DiTGeometry, profile: DeviceProfile, budget_bytes: int | None = None, template_tokens: int | None = None
) -> JobMemory:
    """The estimate, or :class:`OverBudgetError` with a message that gives every term and the budget;
    ``template_tokens``: the template's own token count (its manifest's grid) in place of the geometry's."""
    if template_tokens is not None:
        geometry = replace(geometry, template_tokens=template_tokens)
    mem = estimate_job_memory(geometry, profile, budget_bytes)
    if not mem.fits:
        mib = 2**20
        raise OverBudgetError(
            f"job needs about {mem.total_bytes / mib:.1f} MiB (weights {mem.weights_bytes / mib:.1f} + template KV "
            f"{mem.kv_bytes / mib:.1f} + activations {mem.activation_bytes / mib:.1f}) for {geometry.name}, over the "
            f"budget of {mem.budget_bytes / mib:.1f} MiB ({mem.budget_source}); use a smaller model or resolution, "
            "or a device with more memory",
            mem,
        )
    return mem
