"""Server-side template preparation: probe requests, token importance, and precompute (exact KV -> every
representation of every shard + the manifest). Runs on the cloud server and in benchmarks, never on the phone path.
"""

from .attention_capture import capture_attention
from .importance import TokenImportance, attention_error, estimate_importance
from .probes import ProbeConfig
from .template import PrecomputedTemplate, precompute_template

__all__ = [
    "PrecomputedTemplate",
    "ProbeConfig",
    "TokenImportance",
    "attention_error",
    "capture_attention",
    "estimate_importance",
    "precompute_template",
]
