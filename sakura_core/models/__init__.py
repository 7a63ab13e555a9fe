"""DiT adapters and model types: :class:`~.edit_model.EditModel` / :class:`~.edit_model.ModelSpec` (the transformer
the runtime edits with, token packing, the embedded demo weights), the FLUX.2 KV-mode adapter with its hybrid
forward (:mod:`.flux2_kv`), the joint-attention approximation (:mod:`.joint_approx`, labelled approximate) and the
canonical :class:`~.kv_types.TemplateKV`."""

__all__: list[str] = []
