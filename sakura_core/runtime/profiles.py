"""Device profiles: how long the phone takes per transformer layer, with and without the template tokens.

The phone-class DiT modelled here: 24 layers, width 1024 (16 heads x 64), a 512x512 edit = 1024 image tokens
(8x VAE, 2x2 patches) + 128 text tokens, one 512x512 template = 1024 reference tokens, 4 denoising steps (a
step-distilled model like FLUX.2 [klein]); fp16 template KV = 24 x 2 x 1024 x 1024 x 2 B = 96 MiB.

Per-layer costs keep the ratios measured on this project's CPUs for a Flux-architecture model (shared/NOTES.md:
full step with reference tokens 3.45 s, step with cached reference KV 1.73 s, step without reference 1.64 s,
template-only pass 1.44 s), scaled to the published NPU step time:
* Snapdragon 8 Elite NPU: w8a16 512^2 diffusion step ~62 ms (Qualcomm AI Hub / published SD figures, NOTES.md);
  VAE decode 150-200 ms (we charge 0.175 s + 0.05 s encode of the user image).
* Snapdragon 8 Elite CPU: the same DiT without the NPU; phone CPU runs are 400-1500x slower than the NPU
  (NOTES.md) — we take the conservative end, 400x, so fetching is *not* favoured by the profile. The VAE
  (encode + decode, ~0.5 s) runs on the Adreno GPU in both profiles' apps; it is outside the KV story.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PROFILES", "DeviceProfile", "PhoneDiT", "PHONE_DIT", "get_profile"]

_GIB = 2**30  # bytes

# ratios from the CPU measurements in NOTES.md, relative to a step with cached reference KV
_FULL_OVER_CACHED = 3.45 / 1.73  # a layer that also runs the template tokens (extract mode)
_TEMPLATE_ONLY_OVER_CACHED = 1.44 / 1.73


@dataclass(frozen=True)
class PhoneDiT:
    """Geometry of the simulated phone-class DiT (see module doc)."""

    layers: int = 24
    heads: int = 16
    head_dim: int = 64
    image_tokens: int = 1024
    template_tokens: int = 1024
    text_tokens: int = 128
    steps: int = 4

    @property
    def kv_bytes_fp16(self) -> int:
        return self.layers * 2 * self.template_tokens * self.heads * self.head_dim * 2

    @property
    def shard_bytes_fp16(self) -> int:
        return self.kv_bytes_fp16 // self.layers


PHONE_DIT = PhoneDiT()


@dataclass(frozen=True)
class DeviceProfile:
    """A phone's compute speed and memory budget.

    Attributes:
        name: profile id.
        soc: system-on-chip.
        step_cached_s: one denoising step with cached template KV (all layers), seconds.
        fixed_s: per-edit work outside the DiT (VAE encode of the user image + decode), seconds.
        npu_session_bytes: memory one NPU session may hold (0 = no NPU).
        model: the DiT it runs.
        host_budget_bytes: memory the editing app may use on the application processor when the model runs there
            (no NPU): phones have 8-16 GB of RAM shared with the OS and other apps; 4 GiB is a safe share.
        weight_bytes_per_param: bytes per weight where the DiT runs (w8a16 on the NPU: 1; fp16 on the CPU: 2).
        activation_bytes: bytes per activation / KV value where the DiT runs (a16 or fp16: 2).
        link_mbit_s: typical downlink of the phone (Mbit/s), the default link of phone-scale simulations.
    """

    name: str
    soc: str
    step_cached_s: float
    fixed_s: float
    npu_session_bytes: int
    model: PhoneDiT = PHONE_DIT
    host_budget_bytes: int = 4 * _GIB
    weight_bytes_per_param: int = 2
    activation_bytes: int = 2
    link_mbit_s: float = 20.0

    def __post_init__(self) -> None:
        if self.step_cached_s <= 0 or self.fixed_s < 0:
            raise ValueError(f"profile {self.name}: step_cached_s must be > 0 and fixed_s >= 0")
        if self.npu_session_bytes < 0 or self.host_budget_bytes <= 0:
            raise ValueError(
                f"profile {self.name}: npu_session_bytes must be >= 0 and host_budget_bytes > 0, got "
                f"{self.npu_session_bytes}, {self.host_budget_bytes}"
            )
        if self.weight_bytes_per_param < 1 or self.activation_bytes < 1 or self.link_mbit_s <= 0:
            raise ValueError(
                f"profile {self.name}: weight_bytes_per_param and activation_bytes must be >= 1 and link_mbit_s > 0"
            )

    @property
    def has_npu(self) -> bool:
        return self.npu_session_bytes > 0

    @property
    def memory_budget_bytes(self) -> int:
        """What one edit may hold: one NPU session's memory when the DiT runs on the NPU, else the app's share."""
        return self.npu_session_bytes if self.has_npu else self.host_budget_bytes

    @property
    def layer_cached_s(self) -> float:
        """One layer, request tokens only, template KV injected."""
        return self.step_cached_s / self.model.layers

    @property
    def layer_full_s(self) -> float:
        """One layer that also runs the template tokens (extract mode)."""
        return self.layer_cached_s * _FULL_OVER_CACHED

    @property
    def template_pass_s(self) -> float:
        return self.step_cached_s * _TEMPLATE_ONLY_OVER_CACHED


PROFILES = {
    "snapdragon-8-elite-npu": DeviceProfile(
        name="snapdragon-8-elite-npu",
        soc="SM8750 (Snapdragon 8 Elite), Hexagon NPU, w8a16",
        step_cached_s=0.062,
        fixed_s=0.225,
        npu_session_bytes=int(3.75 * 2**30),
        weight_bytes_per_param=1,
    ),
    "snapdragon-8-elite-cpu": DeviceProfile(
        name="snapdragon-8-elite-cpu",
        soc="SM8750 (Snapdragon 8 Elite), Oryon CPU only",
        step_cached_s=0.062 * 400,
        fixed_s=0.5,
        npu_session_bytes=0,
    ),
    # Published NPU step times for other SoCs (w8a16 512^2 diffusion step, NOTES.md): 8 Gen 3 ~77 ms,
    # 8 Elite Gen 5 ~45 ms (the paper's phone).
    "snapdragon-8-gen-3-npu": DeviceProfile(
        name="snapdragon-8-gen-3-npu",
        soc="SM8650 (Snapdragon 8 Gen 3), Hexagon NPU, w8a16",
        step_cached_s=0.077,
        fixed_s=0.225,
        npu_session_bytes=int(3.75 * 2**30),
        weight_bytes_per_param=1,
    ),
    "snapdragon-8-elite-gen-5-npu": DeviceProfile(
        name="snapdragon-8-elite-gen-5-npu",
        soc="SM8850 (Snapdragon 8 Elite Gen 5), Hexagon NPU, w8a16",
        step_cached_s=0.045,
        fixed_s=0.2,
        npu_session_bytes=int(3.75 * 2**30),
        weight_bytes_per_param=1,
    ),
}


def get_profile(name: str) -> DeviceProfile:
    try:
        return PROFILES[name]
    except KeyError as e:
        raise ValueError(f"unknown device profile {name!r}; choose one of {', '.join(PROFILES)}") from e
