"""Device profiles: how long a phone takes per transformer layer, derived from FLOPs and a checkable speed.

Cost model: a layer costs ``FLOPs of that layer for the tokens it runs / effective FLOP/s + per-layer overhead``
(FLOPs from :mod:`.geometry`: request tokens, template tokens when the layer runs them, attention over all keys).
The effective FLOP/s of each profile is derived from a published whole-network time of Stable Diffusion 1.5's UNet
at 512^2 (~0.8 TFLOP per pass) on that compute unit — see :data:`PROFILE_SOURCES`, which the docs
print as a table. The per-layer overhead (dispatch, synchronisation) is an assumption, stated as such.

| profile                      | unit (SoC)                 | measured (SD 1.5 UNet, 512^2, 1 pass)          | eff. TFLOP/s |
|------------------------------|----------------------------|------------------------------------------------|--------------|
| snapdragon-8-elite-npu       | Hexagon NPU, SM8750        | 58 ms, w8a16, Galaxy S25 (qai-hub-models 0.65) | 13.8         |
| snapdragon-8-elite-gpu       | Adreno GPU, SM8750         | ~0.23 s, OpenCL/CLML (public phone-GPU runs)   | 3.5          |
| snapdragon-8-elite-cpu       | Oryon CPU, SM8750          | ~4 s on the 8 Gen 3 CPU (public CPU runs)      | 0.2          |
| snapdragon-8-gen-3-npu       | Hexagon NPU, SM8650        | 76 ms, w8a16, Galaxy S24 (qai-hub-models)      | 10.5         |
| snapdragon-8-elite-gen-5-npu | Hexagon NPU, SM8850        | 45 ms, w8a16, Galaxy S26 (qai-hub-models)      | 17.8         |

The CPU figure is the 8 Gen 3's (no public 8 Elite CPU figure was found): conservative, it does not favour fetching
more than the CPU deserves. The VAE (encode + decode) is ``fixed_s``, outside the KV story.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TypedDict

from .geometry import GEOMETRIES, PHONE_DIT, DitGeometry, PhoneDiT, get_geometry
from .record_fields import split_fields

__all__ = [
    "CPU_SLOWDOWN_SOURCE",
    "GEOMETRIES",
    "PHONE_DIT",
    "PROFILES",
    "PROFILE_SOURCES",
    "ProfileSource",
    "SD15_UNET_FLOPS",
    "DeviceCompute",
    "DeviceMemory",
    "DeviceProfile",
    "DitGeometry",
    "PhoneDiT",
    "get_geometry",
    "get_profile",
    "sources_table",
]

_GIB = 2**30  # bytes
SD15_UNET_FLOPS = 0.8e12  # one SD 1.5 UNet pass at 512^2 (64x64 latent), FLOPs


@dataclass(frozen=True)
class DeviceCompute:
    """How fast a phone computes (a part of :class:`DeviceProfile`).

    Attributes:
        effective_flop_per_s: FLOP/s the DiT's layers run at on this unit (see PROFILE_SOURCES).
        fixed_s: per-edit work outside the DiT (VAE encode of the user image + decode), seconds.
        layer_overhead_s: fixed cost per layer call (dispatch, sync), seconds; assumed, see the module doc.
        cpu_slowdown: seconds the phone's application CPU (one big core) takes for a second of single-thread work
            (decode, planning) on the host that measured it; assumed, see :data:`CPU_SLOWDOWN_SOURCE`.
        dit_cpu_cores: cores the DiT runs on when it runs on the application CPU (0 = it runs on the GPU / NPU):
            then each decode or planning thread takes one of them while it works (the DiT's speed x
            (cores - busy) / cores), as the simulator models it.
    """

    effective_flop_per_s: float
    fixed_s: float
    layer_overhead_s: float = 0.0
    cpu_slowdown: float = 1.0
    dit_cpu_cores: int = 0


@dataclass(frozen=True)
class DeviceMemory:
    """What a phone may hold, and at what width (a part of :class:`DeviceProfile`).

    Attributes:
        npu_session_bytes: memory one NPU session may hold (0 = no NPU).
        host_budget_bytes: memory the editing app may use on the application processor when the model runs there
            (no NPU): phones have 8-16 GB of RAM shared with the OS and other apps; 4 GiB is a safe share.
        weight_bytes_per_param: bytes per weight where the DiT runs (w8a16 on the NPU: 1; fp16 elsewhere: 2).
        activation_bytes: bytes per activation / KV value where the DiT runs (a16 or fp16: 2).
    """

    npu_session_bytes: int
    host_budget_bytes: int = 4 * _GIB
    weight_bytes_per_param: int = 2
    activation_bytes: int = 2


@dataclass(frozen=True)
class DeviceProfile:
    """A phone's compute speed and memory budget. The parts' fields read flat too (``p.effective_flop_per_s``,
    ``p.npu_session_bytes``: read-only views of its parts); :meth:`with_fields` takes the flat names.

    Attributes:
        name: profile id.
        soc: system-on-chip and compute unit.
        compute: how fast it computes (:class:`DeviceCompute`).
        memory: what it may hold (:class:`DeviceMemory`).
        model: the DiT geometry it runs.
        link_mbit_s: typical downlink of the phone (Mbit/s), the default link of phone-scale simulations.
    """

    name: str
    soc: str
    compute: DeviceCompute
    memory: DeviceMemory
    model: DitGeometry = PHONE_DIT
    link_mbit_s: float = 20.0

    def __post_init__(self) -> None:
        if not self.effective_flop_per_s > 0 or self.fixed_s < 0 or self.layer_overhead_s < 0:
            raise ValueError(
                f"profile {self.name}: effective_flop_per_s must be > 0 (FLOP/s, e.g. 1.4e13), fixed_s and "
                f"layer_overhead_s >= 0; got {self.effective_flop_per_s}, {self.fixed_s}, {self.layer_overhead_s}"
            )
        if self.npu_session_bytes < 0 or self.host_budget_bytes <= 0:
            raise ValueError(
                f"profile {self.name}: npu_session_bytes must be >= 0 and host_budget_bytes > 0, got "
                f"{self.npu_session_bytes}, {self.host_budget_bytes}"
            )
        if not self.cpu_slowdown > 0 or self.dit_cpu_cores < 0:
            raise ValueError(
                f"profile {self.name}: cpu_slowdown must be > 0 (1.0 = as fast as the measuring host) and "
                f"dit_cpu_cores >= 0 (0 = the DiT is not on the CPU); got {self.cpu_slowdown}, {self.dit_cpu_cores}"
            )
        if self.weight_bytes_per_param < 1 or self.activation_bytes < 1 or self.link_mbit_s <= 0:
            raise ValueError(
                f"profile {self.name}: weight_bytes_per_param and activation_bytes must be >= 1 and link_mbit_s > 0"
            )

    def with_fields(self, **changes: Any) -> DeviceProfile:
        """This profile with the flat fields ``changes`` set (``p.with_fields(dit_cpu_cores=0)``)."""
        compute, memory, own = split_fields(
            f"profile {self.name}", changes, DeviceCompute, DeviceMemory, DeviceProfile
        )
        return replace(self, compute=replace(self.compute, **compute), memory=replace(self.memory, **memory), **own)

    @property
    def effective_flop_per_s(self) -> float:
        return self.compute.effective_flop_per_s

    @property
    def fixed_s(self) -> float:
        return self.compute.fixed_s

    @property
    def layer_overhead_s(self) -> float:
        return self.compute.layer_overhead_s

    @property
    def cpu_slowdown(self) -> float:
        return self.compute.cpu_slowdown

    @property
    def dit_cpu_cores(self) -> int:
        return self.compute.dit_cpu_cores

    @property
    def npu_session_bytes(self) -> int:
        return self.memory.npu_session_bytes

    @property
    def host_budget_bytes(self) -> int:
        return self.memory.host_budget_bytes

    @property
    def weight_bytes_per_param(self) -> int:
        return self.memory.weight_bytes_per_param

    @property
    def activation_bytes(self) -> int:
        return self.memory.activation_bytes

    def with_geometry(self, model: DitGeometry) -> DeviceProfile:
        """The same device running another DiT."""
        return replace(self, model=model)

    def with_speed(self, effective_flop_per_s: float) -> DeviceProfile:
        """The same profile at another effective FLOP/s (regime maps)."""
        return replace(self, compute=replace(self.compute, effective_flop_per_s=effective_flop_per_s))

    @property
    def has_npu(self) -> bool:
        return self.npu_session_bytes > 0

    @property
    def memory_budget_bytes(self) -> int:
        """What one edit may hold: one NPU session's memory when the DiT runs on the NPU, else the app's share."""
        return self.npu_session_bytes if self.has_npu else self.host_budget_bytes

    def seconds(self, flops: float) -> float:
        """One layer call doing ``flops``."""
        return flops / self.effective_flop_per_s + self.layer_overhead_s

    @property
    def layer_cached_s(self) -> float:
        """One layer, request tokens only, template KV injected."""
        return self.seconds(self.model.layer_cached_flops)

    @property
    def layer_full_s(self) -> float:
        """One layer that also runs the template tokens (extract mode)."""
        return self.seconds(self.model.layer_full_flops)

    @property
    def step_cached_s(self) -> float:
        """One denoising step with cached template KV (all layers)."""
        return self.model.layers * self.layer_cached_s

    @property
    def template_pass_s(self) -> float:
        """A template-only pass (every layer's template KV) on the device."""
        return self.model.layers * self.seconds(self.model.template_layer_flops)


class ProfileSource(TypedDict):
    """One row of :data:`PROFILE_SOURCES`: a compute unit's measured SD 1.5 UNet pass and where the figures come from."""

    profile: str
    unit: str
    sd15_unet_pass_s: float
    source: str
    layer_overhead_s: float
    overhead_source: str


def _sd15(seconds_per_pass: float) -> float:
    return SD15_UNET_FLOPS / seconds_per_pass


PROFILE_SOURCES: tuple[ProfileSource, ...] = (
    {"profile": "snapdragon-8-elite-npu", "unit": "Hexagon NPU (SM8750), w8a16", "sd15_unet_pass_s": 0.058,
     "source": "qai-hub-models 0.65.0 perf.yaml, Stable Diffusion 1.5 UNet w8a16, Galaxy S25 (8 Elite)",
     "layer_overhead_s": 1e-4, "overhead_source": "assumed: one graph dispatch per layer"},
    {"profile": "snapdragon-8-elite-gpu", "unit": "Adreno GPU (SM8750), fp16", "sd15_unet_pass_s": 0.23,
     "source": "public SD 1.5 runs via OpenCL/CLML on SM8750 (shared/NOTES.md)",
     "layer_overhead_s": 3e-4, "overhead_source": "assumed: kernel launches per layer"},
    {"profile": "snapdragon-8-elite-cpu", "unit": "Oryon CPU (SM8750), fp16", "sd15_unet_pass_s": 4.0,
     "source": "public SD 1.5 CPU runs on Snapdragon 8 Gen 3 (~4 s per UNet pass, shared/NOTES.md); no 8 Elite "
     "CPU figure found, the older CPU's is used (conservative)",
     "layer_overhead_s": 1e-4, "overhead_source": "assumed: thread-pool sync per layer"},
    {"profile": "snapdragon-8-gen-3-npu", "unit": "Hexagon NPU (SM8650), w8a16", "sd15_unet_pass_s": 0.076,
     "source": "qai-hub-models 0.65.0 perf.yaml, SD 1.5 UNet w8a16, Galaxy S24 (8 Gen 3)",
     "layer_overhead_s": 1e-4, "overhead_source": "assumed"},
    {"profile": "snapdragon-8-elite-gen-5-npu", "unit": "Hexagon NPU (SM8850), w8a16", "sd15_unet_pass_s": 0.045,
     "source": "qai-hub-models 0.65.0 perf.yaml, SD 1.5 UNet w8a16, Galaxy S26 (8 Elite Gen 5, the paper's phone)",
     "layer_overhead_s": 1e-4, "overhead_source": "assumed"},
)  # fmt: skip # keep: a table: one profile a record
_FIXED_S = {"npu": 0.225, "gpu": 0.225, "cpu": 0.5}  # VAE encode (~0.05 s) + decode (150-200 ms)
# Snapdragon 8 Elite (SM8750): 2 Oryon prime cores at 4.32 GHz + 6 at 3.53 GHz; the CPU profile's DiT uses all 8
SM8750_CPU_CORES = 8
CPU_SLOWDOWN_SOURCE = (
    "assumed 1.0: an Oryon prime core's single-thread speed is about a current x86 core's (public single-core "
    "benchmark scores of the same order); decode and planning times are measured on this host and charged x 1.0"
)


def _profile(src: ProfileSource) -> DeviceProfile:
    name = src["profile"]
    npu = name.endswith("-npu")
    compute = DeviceCompute(
        effective_flop_per_s=_sd15(src["sd15_unet_pass_s"]),
        fixed_s=_FIXED_S[name.rsplit("-", 1)[1]],
        layer_overhead_s=src["layer_overhead_s"],
        dit_cpu_cores=SM8750_CPU_CORES if name.endswith("-cpu") else 0,
    )
    memory = DeviceMemory(npu_session_bytes=int(3.75 * _GIB) if npu else 0, weight_bytes_per_param=1 if npu else 2)
    return DeviceProfile(name=name, soc=src["unit"], compute=compute, memory=memory)


PROFILES = {src["profile"]: _profile(src) for src in PROFILE_SOURCES}


def sources_table() -> str:
    """The profiles with their sources, as a text table (the CLI and the docs print it)."""
    lines = [f"{'profile':<30}{'TFLOP/s':>8}{'SD1.5 pass s':>14}  source"]
    for src in PROFILE_SOURCES:
        tflops = _sd15(src["sd15_unet_pass_s"]) / 1e12
        lines.append(f"{src['profile']:<30}{tflops:>8.2f}{src['sd15_unet_pass_s']:>14.3f}  {src['source']}")
    return "\n".join(lines)


def get_profile(name: str, geometry: str | DitGeometry | None = None) -> DeviceProfile:
    """A profile by name, optionally running another geometry (a name from GEOMETRIES or a DitGeometry)."""
    try:
        p = PROFILES[name]
    except KeyError as e:
        raise ValueError(f"unknown device profile {name!r}; choose one of {', '.join(PROFILES)}") from e
    if geometry is None:
        return p
    return p.with_geometry(get_geometry(geometry) if isinstance(geometry, str) else geometry)
