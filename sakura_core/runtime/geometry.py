"""DiT geometries the simulator runs (``--geometry``) and their FLOP counts per layer.

FLOPs follow the FLUX.2 block (diffusers ``Flux2TransformerBlock`` / ``Flux2SingleTransformerBlock``): per token
and layer, Q, K, V and the output projection (4 d^2 weights) and a gated (SwiGLU) MLP with hidden ``mlp_ratio * d``
(3 * mlp_ratio * d^2 weights): ``2 * (4 + 3 * mlp_ratio) * d^2`` FLOPs (= 26 d^2 at ratio 3; a double block has two
weight sets, one per stream, but each token passes through one of them, so the count per token is the same).
Attention: ``4 * queries * keys * d`` (Q K^T and A V). Modulation, embedders and norms are left out (< 1 %).

Single KV mode (the template tokens attend only to themselves):
* a layer with the template KV injected (``cached``): request tokens (image + text) attend to request + template;
* a layer that also runs the template tokens (``full``, extract mode): cached + the template tokens' own layer;
* a template-only pass: every layer's template part.
Per KV byte of a template token-layer (4 d bytes in fp16) that is ``6.5 d + keys`` FLOPs: the regime-map rule.

Several references (``references`` > 1, try-on / in-context edits with 2-4 reference images): ``template_tokens``
is all of them together, in the model's order. In FLUX.2 [klein] KV mode the reference tokens attend to every
reference token (diffusers 0.42.1 ``_flux2_kv_causal_attention``: one self-attention over the whole reference
block), so the refs attend to each other and the template's attention is ``4 * T^2 * d`` over all T of them; the
request attends to all of them too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .record_fields import split_fields

__all__ = ["GEOMETRIES", "PHONE_DIT", "BlockShape", "DitGeometry", "PhoneDiT", "TokenCounts", "get_geometry"]


@dataclass(frozen=True)
class BlockShape:
    """A DiT's transformer blocks (a part of :class:`DitGeometry`).

    Attributes:
        layers: transformer blocks (double + single).
        heads, head_dim: attention heads and their width (model width d = heads * head_dim).
        mlp_ratio: gated MLP hidden width over d.
        double_layers: how many of ``layers`` are double-stream blocks (information only: same FLOPs per token).
    """

    layers: int = 24
    heads: int = 16
    head_dim: int = 64
    mlp_ratio: float = 3.0
    double_layers: int = 0


@dataclass(frozen=True)
class TokenCounts:
    """The tokens one edit runs (a part of :class:`DitGeometry`).

    Attributes:
        image_tokens: tokens of the edited image (the request).
        template_tokens: tokens of the template (reference) image(s).
        text_tokens: prompt tokens.
        references: reference images the template tokens hold (equal shares of ``template_tokens``; they attend to
            each other, see the module docstring).
    """

    image_tokens: int = 1024
    template_tokens: int = 1024
    text_tokens: int = 128
    references: int = 1


#: The published flat form's keys, in the order :meth:`DitGeometry.as_dict` writes them (the e2e JSON's ``model``).
_FLAT_KEYS = (
    "name",
    "layers",
    "heads",
    "head_dim",
    "image_tokens",
    "template_tokens",
    "text_tokens",
    "steps",
    "mlp_ratio",
    "double_layers",
    "references",
    "description",
)


@dataclass(frozen=True)
class DitGeometry:
    """A DiT's shape as the cost model and the KV sizes need it. Its fields read flat too (``g.layers``,
    ``g.template_tokens``: read-only views of its parts); :meth:`of` and :meth:`with_fields` take the flat names.

    Attributes:
        name: geometry id (``--geometry``).
        shape: its transformer blocks (:class:`BlockShape`).
        tokens: the tokens one edit runs (:class:`TokenCounts`).
        steps: denoising steps.
        description: where the numbers come from.
    """

    name: str = "phone-dit-512"
    shape: BlockShape = BlockShape()
    tokens: TokenCounts = TokenCounts()
    steps: int = 4
    description: str = "phone-class DiT: 24 layers, width 1024, 512^2 edit with one 512^2 template, 128 text tokens"

    def __post_init__(self) -> None:
        ints = (self.layers, self.heads, self.head_dim, self.image_tokens, self.template_tokens, self.steps)
        if min(ints) < 1 or self.text_tokens < 0 or self.mlp_ratio <= 0:
            raise ValueError(
                f"geometry {self.name}: layers, heads, head_dim, image_tokens, template_tokens, steps must be >= 1, "
                f"text_tokens >= 0 and mlp_ratio > 0; got {self}"
            )
        if self.references < 1 or self.template_tokens % self.references:
            raise ValueError(
                f"geometry {self.name}: references must be >= 1 and divide template_tokens ({self.template_tokens}), "
                f"got {self.references}"
            )
        if not 0 <= self.double_layers <= self.layers:
            raise ValueError(f"geometry {self.name}: double_layers {self.double_layers} must be in 0..{self.layers}")

    @classmethod
    def of(cls, **flat: Any) -> DitGeometry:
        """A geometry from flat field names (``layers=``, ``template_tokens=``, ... as :meth:`as_dict` writes them,
        less the derived ``width`` and ``kv_bytes_fp16``); a name left out takes the default geometry's value."""
        return PHONE_DIT.with_fields(**flat)

    def with_fields(self, **changes: Any) -> DitGeometry:
        """This geometry with the flat fields ``changes`` set (``g.with_fields(steps=1)``)."""
        shape, tokens, own = split_fields(
            f"geometry {changes.get('name', self.name)}", changes, BlockShape, TokenCounts, DitGeometry
        )
        return replace(self, shape=replace(self.shape, **shape), tokens=replace(self.tokens, **tokens), **own)

    @property
    def layers(self) -> int:
        return self.shape.layers

    @property
    def heads(self) -> int:
        return self.shape.heads

    @property
    def head_dim(self) -> int:
        return self.shape.head_dim

    @property
    def mlp_ratio(self) -> float:
        return self.shape.mlp_ratio

    @property
    def double_layers(self) -> int:
        return self.shape.double_layers

    @property
    def image_tokens(self) -> int:
        return self.tokens.image_tokens

    @property
    def template_tokens(self) -> int:
        return self.tokens.template_tokens

    @property
    def text_tokens(self) -> int:
        return self.tokens.text_tokens

    @property
    def references(self) -> int:
        return self.tokens.references

    @property
    def width(self) -> int:
        return self.heads * self.head_dim

    @property
    def request_tokens(self) -> int:
        return self.image_tokens + self.text_tokens

    @property
    def kv_bytes_fp16(self) -> int:
        return self.layers * 2 * self.template_tokens * self.width * 2

    @property
    def shard_bytes_fp16(self) -> int:
        """One layer's template K and V in fp16."""
        return self.kv_bytes_fp16 // self.layers

    def linear_flops(self, tokens: int) -> float:
        """Projections + gated MLP of ``tokens`` tokens through one layer."""
        return 2.0 * (4 + 3 * self.mlp_ratio) * self.width**2 * tokens

    def attention_flops(self, queries: int, keys: int) -> float:
        return 4.0 * queries * keys * self.width

    @property
    def layer_cached_flops(self) -> float:
        """One layer, request tokens only, template KV injected (they attend to request + template keys)."""
        r = self.request_tokens
        return self.linear_flops(r) + self.attention_flops(r, r + self.template_tokens)

    @property
    def template_layer_flops(self) -> float:
        """The template tokens' own part of one layer (they attend only to template tokens: every reference to
        every reference, as FLUX.2 [klein] KV mode does)."""
        t = self.template_tokens
        return self.linear_flops(t) + self.attention_flops(t, t)

    @property
    def layer_full_flops(self) -> float:
        """One layer that also runs the template tokens (extract mode)."""
        return self.layer_cached_flops + self.template_layer_flops

    def as_dict(self) -> dict:
        """The published flat form (the e2e JSON's ``model``): every field by its flat name, then ``width`` and
        ``kv_bytes_fp16``."""
        return {**{k: getattr(self, k) for k in _FLAT_KEYS}, "width": self.width, "kv_bytes_fp16": self.kv_bytes_fp16}


PhoneDiT = DitGeometry  # the name older code imports
PHONE_DIT = DitGeometry()


#: FLUX.2 [klein] 4B's blocks: 5 double + 20 single, width 3072
_KLEIN = BlockShape(layers=25, double_layers=5, heads=24, head_dim=128, mlp_ratio=3.0)
GEOMETRIES = {
    g.name: g
    for g in (
        PHONE_DIT,
        DitGeometry(
            name="klein4b-512-ref1024",
            shape=_KLEIN,
            tokens=TokenCounts(image_tokens=1024, template_tokens=4096, text_tokens=512),
            steps=4,
            description="FLUX.2 [klein] 4B-like: 5 double + 20 single blocks, width 3072, 512 text tokens; a 512^2 "
            "edit (1024 tokens) against one 1024^2 template (4096 tokens, ~2.7x the request)",
        ),
        DitGeometry(
            name="klein4b-512-2ref1024",
            shape=_KLEIN,
            tokens=TokenCounts(image_tokens=1024, template_tokens=2 * 4096, text_tokens=512, references=2),
            steps=4,
            description="FLUX.2 [klein] 4B-like (as above); a 512^2 edit against two 1024^2 references (8192 tokens, "
            "~5.3x the request; the references attend to each other): try-on / in-context with two images",
        ),
        DitGeometry(
            name="klein4b-1024-ref1024",
            shape=_KLEIN,
            tokens=TokenCounts(image_tokens=4096, template_tokens=4096, text_tokens=512),
            steps=4,
            description="FLUX.2 [klein] 4B-like (as above); a 1024^2 edit against one 1024^2 template",
        ),
    )
}


def get_geometry(name: str) -> DitGeometry:
    try:
        return GEOMETRIES[name]
    except KeyError as e:
        raise ValueError(f"unknown geometry {name!r}; choose one of {', '.join(GEOMETRIES)}") from e
