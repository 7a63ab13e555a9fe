"""A UI-format workflow checked against node schemas in ComfyUI's ``/object_info`` form, as ComfyUI would take it:
every node type known, every widget value valid for its input (read in input order, as the frontend pairs
``widgets_values``; a seed's control_after_generate mode and LoadImage's upload value follow their widget), every
required socket linked, every link joining an output to an input of the same type. A combo may name a model file
that is not installed here (the files a user downloads): such a value must still be a file name."""

from __future__ import annotations

VIRTUAL = {"Note", "MarkdownNote", "Reroute", "PrimitiveNode"}  # the frontend's own nodes: not in /object_info
WIDGET_KINDS = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
CONTROLS = {"fixed", "increment", "decrement", "randomize"}
MODEL_FILES = (".safetensors", ".sft", ".gguf", ".ckpt", ".pt", ".pth", ".bin")
# ComfyUI's own nodes of the demo-model chain as /object_info gives them (for the check without ComfyUI)
CORE_INFO = {
    "LoadImage": {
        "input": {"required": {"image": [["sakura-face.png", "sakura-object.png"], {"image_upload": True}]}},
        "output": ["IMAGE", "MASK"],
    },
    "SaveImage": {
        "input": {"required": {"images": ["IMAGE"], "filename_prefix": ["STRING", {"default": "ComfyUI"}]}},
        "output": [],
    },
    "PreviewAny": {"input": {"required": {"source": ["*", {}]}}, "output": ["STRING"]},
}


def _kind(spec: list) -> tuple[str, dict]:
    """(io type, options dict) of an /object_info input spec; a list of choices is a COMBO."""
    opts = dict(spec[1]) if len(spec) > 1 and isinstance(spec[1], dict) else {}
    if isinstance(spec[0], list):
        return "COMBO", {**opts, "options": spec[0]}
    return spec[0], opts


def widget_error(kind: str, opts: dict, value) -> str | None:
    if kind == "COMBO":
        options = opts.get("options", [])
        if value in options:
            return None
        if isinstance(value, str) and value.endswith(MODEL_FILES):
            return None  # a model file to download: not installed here, but a file name
        return f"{value!r} not in {options[:8]}"
    expected = {"INT": int, "FLOAT": (int, float), "STRING": str, "BOOLEAN": bool}[kind]
    if value is None or isinstance(value, bool) != (kind == "BOOLEAN") or not isinstance(value, expected):
        return f"{value!r} is not a {kind} value"
    if kind in ("INT", "FLOAT"):
        if opts.get("min") is not None and value < opts["min"]:
            return f"{value!r} below min {opts['min']}"
        if opts.get("max") is not None and value > opts["max"]:
            return f"{value!r} above max {opts['max']}"
    return None


def _inputs(info: dict) -> tuple[dict, list, set]:
    """(specs by name, names in input order, required names) of one /object_info entry."""
    required, optional = info["input"].get("required", {}), info["input"].get("optional", {})
    order = info.get("input_order", {})
    names = list(order.get("required", required)) + list(order.get("optional", optional))
    return {**required, **optional}, names, set(required)


def _node_problems(node: dict, info: dict) -> list[str]:
    where = f"{node['title'] if 'title' in node else node['type']} ({node['type']} #{node['id']})"
    specs, names, required = _inputs(info)
    out = [f"{where}: no input {i['name']!r}" for i in node.get("inputs", []) if i["name"] not in specs]
    linked = {i["name"] for i in node.get("inputs", []) if i.get("link") is not None}
    values = list(node.get("widgets_values") or [])
    for name in names:
        kind, opts = _kind(specs[name])
        if name in linked:
            continue  # a socket (or a widget turned into one) fed by a link
        if kind not in WIDGET_KINDS:
            if name in required:
                out.append(f"{where}: required input {name!r} ({kind}) is not linked")
            continue
        if not values:
            out.append(f"{where}: no value for widget {name!r}")
            continue
        error = widget_error(kind, opts, values.pop(0))
        if error:
            out.append(f"{where}.{name}: {error}")
        if opts.get("control_after_generate") and (not values or values.pop(0) not in CONTROLS):
            out.append(f"{where}.{name}: no control_after_generate mode after the value")
        if opts.get("image_upload") and values:
            values.pop(0)  # the upload button's value
    if values:
        out.append(f"{where}: {len(values)} widget values left over: {values}")
    return out


def problems(ui: dict, object_info: dict) -> list[str]:
    """What ComfyUI would refuse in the UI-format workflow ``ui`` given its ``object_info``; [] if nothing."""
    nodes = {n["id"]: n for n in ui["nodes"]}
    out = []
    for node in ui["nodes"]:
        if node["type"] in VIRTUAL:
            continue
        if node["type"] not in object_info:
            out.append(f"{node.get('title', '')} (#{node['id']}): unknown node type {node['type']!r}")
            continue
        out += _node_problems(node, object_info[node["type"]])
    for link_id, src, src_slot, dst, dst_slot, link_type in ui["links"]:
        if src not in nodes or dst not in nodes:
            out.append(f"link {link_id}: joins a node that is not there ({src} -> {dst})")
            continue
        src_info, dst_info = object_info.get(nodes[src]["type"]), object_info.get(nodes[dst]["type"])
        if src_info is None or dst_info is None:
            continue  # reported above
        outputs = src_info["output"]
        src_type = outputs[src_slot] if src_slot < len(outputs) else None
        dst_inputs = nodes[dst]["inputs"]
        name = dst_inputs[dst_slot]["name"] if dst_slot < len(dst_inputs) else None
        specs = _inputs(dst_info)[0]
        dst_type = _kind(specs[name])[0] if name in specs else None
        if name is None or dst_inputs[dst_slot].get("link") != link_id:
            out.append(f"link {link_id}: input slot {dst_slot} of #{dst} does not name it")
        if src_type is None or dst_type is None:
            out.append(f"link {link_id}: #{src} has no output {src_slot} or #{dst} no input {name!r}")
        elif "*" not in (src_type, dst_type) and src_type != dst_type:
            out.append(
                f"link {link_id}: {nodes[src]['type']} output {src_type} into {nodes[dst]['type']}.{name} ({dst_type})"
            )
        elif link_type != src_type:
            out.append(f"link {link_id}: says {link_type}, the output is {src_type}")
    return out


def object_info_of(schemas: dict) -> dict:
    """``/object_info``-form entries of schema objects (our nodes' V3 schemas, klein_workflows.NATIVE's)."""
    out = dict(CORE_INFO)
    for node_id, schema in schemas.items():
        entry = {"input": {"required": {}, "optional": {}}, "output": [o.io_type for o in schema.outputs]}
        for spec in schema.inputs:
            opts = {k: getattr(spec, k, None) for k in ("min", "max", "default")}
            opts["control_after_generate"] = bool(getattr(spec, "control_after_generate", False))
            if spec.io_type == "COMBO":
                opts["options"] = list(spec.options)
            entry["input"]["optional" if spec.optional else "required"][spec.id] = [spec.io_type, opts]
        out[node_id] = entry
    return out
