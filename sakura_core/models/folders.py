"""What a model source is, without torch: a diffusers FLUX.2 [klein] pipeline folder (from its JSON alone), or a
user's klein single-file checkpoints as ComfyUI keeps them (:class:`KleinFiles`; loaded by ``single_files``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KLEIN_FILES_PREFIX", "KLEIN_PIPELINES", "KleinFiles", "is_klein_folder"]

# model_index.json ``_class_name`` values whose folders hold a FLUX.2 [klein] pipeline (same components).
KLEIN_PIPELINES = ("Flux2KleinKVPipeline", "Flux2KleinPipeline")
#: ``--model`` form of single files: ``klein-files:diffusion_model=A,text_encoder=B,vae=C,tokenizer=DIR``.
KLEIN_FILES_PREFIX = "klein-files:"


def is_klein_folder(folder: str | Path) -> bool:
    """True when ``folder/model_index.json`` names a FLUX.2 [klein] pipeline (see ``KLEIN_PIPELINES``)."""
    try:
        data = json.loads((Path(folder) / "model_index.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("_class_name") in KLEIN_PIPELINES


@dataclass(frozen=True)
class KleinFiles:
    """A user's klein checkpoints as ComfyUI keeps them.

    Attributes:
        diffusion_model: the transformer file (``models/diffusion_models``).
        text_encoder: the Qwen3 file (``models/text_encoders``).
        vae: the FLUX.2 VAE file (``models/vae``).
        tokenizer: a folder ``AutoTokenizer`` loads (a diffusers klein folder's ``tokenizer/``, or ComfyUI's bundled
            ``comfy/text_encoders/qwen25_tokenizer``).
        klein_template: give the tokenizer klein's prompt template (``KLEIN_CHAT_TEMPLATE``) instead of its own: for
            a tokenizer folder made for another Qwen (ComfyUI's bundled one carries Qwen2.5's chat template).
    """

    diffusion_model: str
    text_encoder: str
    vae: str
    tokenizer: str
    klein_template: bool = False

    def __post_init__(self) -> None:
        for name in ("diffusion_model", "text_encoder", "vae"):
            path = Path(getattr(self, name))
            if path.suffix != ".safetensors":
                raise ValueError(
                    f"{name} {str(path)!r}: only .safetensors checkpoints are read (no pickle); "
                    "convert the file or use the safetensors download"
                )
        if not Path(self.tokenizer).is_dir():
            raise ValueError(
                f"tokenizer {self.tokenizer!r} is not a folder: give a diffusers klein folder's "
                "tokenizer/ (or ComfyUI's comfy/text_encoders/qwen25_tokenizer)"
            )

    @classmethod
    def parse(cls, source: str) -> KleinFiles:
        """``klein-files:diffusion_model=A,text_encoder=B,vae=C,tokenizer=D`` (the ``--model`` form)."""
        if not source.startswith(KLEIN_FILES_PREFIX):
            raise ValueError(f"not a klein files source: {source[:60]!r} (it starts with {KLEIN_FILES_PREFIX!r})")
        fields: dict[str, str] = {}
        for part in source[len(KLEIN_FILES_PREFIX) :].split(","):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in {"diffusion_model", "text_encoder", "vae", "tokenizer"}:
                raise ValueError(
                    f"klein files source: {part[:60]!r} is not key=path with key diffusion_model, "
                    "text_encoder, vae or tokenizer (paths may not hold commas)"
                )
            fields[key.strip()] = value.strip()
        missing = sorted({"diffusion_model", "text_encoder", "vae", "tokenizer"} - set(fields))
        if missing:
            raise ValueError(
                f"klein files source names no {', '.join(missing)}: give "
                f"{KLEIN_FILES_PREFIX}diffusion_model=A,text_encoder=B,vae=C,tokenizer=DIR"
            )
        return cls(
            diffusion_model=fields["diffusion_model"],
            text_encoder=fields["text_encoder"],
            vae=fields["vae"],
            tokenizer=fields["tokenizer"],
        )

    @staticmethod
    def is_spec(source: str) -> bool:
        return isinstance(source, str) and source.startswith(KLEIN_FILES_PREFIX)

    @property
    def name(self) -> str:
        return Path(self.diffusion_model).stem
