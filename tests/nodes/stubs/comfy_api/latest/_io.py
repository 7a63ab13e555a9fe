"""Stand-in for ``comfy_api.latest.io``: the V3 schema types the Sakura nodes use, with the same constructor
keywords as ComfyUI's (a keyword ComfyUI does not take fails here too), and ``Schema.validate``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = [
    "Boolean",
    "Combo",
    "ComfyNode",
    "Custom",
    "Float",
    "Hidden",
    "Image",
    "Input",
    "Int",
    "Latent",
    "NodeOutput",
    "Output",
    "Schema",
    "String",
]


class Input:
    io_type: str = ""

    def __init__(self, id: str, display_name: str = None, optional=False, tooltip: str = None, lazy: bool = None):
        self.id = id
        self.display_name = display_name
        self.optional = optional
        self.tooltip = tooltip
        self.lazy = lazy


class WidgetInput(Input):
    def __init__(
        self,
        id,
        display_name=None,
        optional=False,
        tooltip=None,
        lazy=None,
        default=None,
        socketless=None,
        force_input=None,
    ):
        super().__init__(id, display_name, optional, tooltip, lazy)
        self.default = default
        self.socketless = socketless
        self.force_input = force_input


class Output:
    io_type: str = ""

    def __init__(self, id: str = None, display_name: str = None, tooltip: str = None, is_output_list=False):
        self.id = id
        self.display_name = display_name
        self.tooltip = tooltip
        self.is_output_list = is_output_list


def _type(io_type: str, input_base=Input):
    """A ComfyType: a class with ``io_type`` and nested ``Input``/``Output`` classes bound to it."""

    class _Input(input_base):
        pass

    class _Output(Output):
        pass

    _Input.io_type = _Output.io_type = io_type
    return type(f"ComfyType_{io_type}", (), {"io_type": io_type, "Input": _Input, "Output": _Output})


def Custom(io_type: str):
    return _type(io_type)


Image = _type("IMAGE")
Model = _type("MODEL")
Latent = _type("LATENT")


class Int:
    io_type = "INT"

    class Input(WidgetInput):
        io_type = "INT"

        def __init__(
            self,
            id,
            display_name=None,
            optional=False,
            tooltip=None,
            lazy=None,
            default=None,
            min=None,
            max=None,
            step=None,
            control_after_generate=None,
            display_mode=None,
            socketless=None,
            force_input=None,
        ):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, force_input)
            self.min, self.max, self.step = min, max, step
            self.control_after_generate = control_after_generate

    Output = _type("INT").Output


class Float:
    io_type = "FLOAT"

    class Input(WidgetInput):
        io_type = "FLOAT"

        def __init__(
            self,
            id,
            display_name=None,
            optional=False,
            tooltip=None,
            lazy=None,
            default=None,
            min=None,
            max=None,
            step=None,
            round=None,
            display_mode=None,
            socketless=None,
            force_input=None,
        ):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, force_input)
            self.min, self.max, self.step, self.round = min, max, step, round

    Output = _type("FLOAT").Output


class String:
    io_type = "STRING"

    class Input(WidgetInput):
        io_type = "STRING"

        def __init__(
            self,
            id,
            display_name=None,
            optional=False,
            tooltip=None,
            lazy=None,
            multiline=False,
            placeholder=None,
            default=None,
            dynamic_prompts=None,
            socketless=None,
            force_input=None,
        ):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, force_input)
            self.multiline = multiline
            self.placeholder = placeholder

    Output = _type("STRING").Output


class Boolean:
    io_type = "BOOLEAN"

    class Input(WidgetInput):
        io_type = "BOOLEAN"

        def __init__(
            self,
            id,
            display_name=None,
            optional=False,
            tooltip=None,
            lazy=None,
            default=None,
            label_on=None,
            label_off=None,
            socketless=None,
            force_input=None,
        ):
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless, force_input)

    Output = _type("BOOLEAN").Output


class Combo:
    io_type = "COMBO"

    class Input(WidgetInput):
        io_type = "COMBO"

        def __init__(
            self,
            id,
            options=None,
            display_name=None,
            optional=False,
            tooltip=None,
            lazy=None,
            default=None,
            control_after_generate=None,
            upload=None,
            image_folder=None,
            remote=None,
            socketless=None,
        ):
            if isinstance(options, type) and issubclass(options, Enum):
                options = [v.value for v in options]
            super().__init__(id, display_name, optional, tooltip, lazy, default, socketless)
            self.options = options

    Output = _type("COMBO").Output


class Hidden(str, Enum):
    unique_id = "UNIQUE_ID"
    prompt = "PROMPT"
    extra_pnginfo = "EXTRA_PNGINFO"
    dynprompt = "DYNPROMPT"


class HiddenHolder:
    def __init__(self, unique_id=None, prompt=None, extra_pnginfo=None, dynprompt=None):
        self.unique_id = unique_id
        self.prompt = prompt
        self.extra_pnginfo = extra_pnginfo
        self.dynprompt = dynprompt


@dataclass
class Schema:
    node_id: str
    display_name: str = None
    category: str = "sd"
    inputs: list = None
    outputs: list = None
    hidden: list = None
    description: str = ""
    is_input_list: bool = False
    is_output_node: bool = False
    is_deprecated: bool = False
    is_experimental: bool = False
    is_api_node: bool = False
    not_idempotent: bool = False
    enable_expand: bool = False

    def validate(self) -> None:
        """Input and output ids unique, within and across the two lists (as ComfyUI checks)."""
        ins = [i.id for i in self.inputs or []]
        outs = [o.id for o in self.outputs or []]
        issues = []
        for what, ids in (("Input", ins), ("Output", outs)):
            dup = [k for k, n in Counter(ids).items() if n > 1]
            if dup:
                issues.append(f"{what} ids must be unique, but {dup} are not.")
        both = set(ins) & set(outs)
        if both:
            issues.append(f"Ids must be unique between inputs and outputs, but {both} are not.")
        if issues:
            raise ValueError("\n".join(issues))


class NodeOutput:
    def __init__(self, *args: Any, ui=None, expand=None, block_execution=None):
        self.args = args
        self.ui = ui
        self.expand = expand
        self.block_execution = block_execution

    @property
    def result(self):
        return self.args if self.args else None

    def __getitem__(self, index):
        return self.args[index]


class ComfyNode:
    hidden: HiddenHolder = None

    @classmethod
    def define_schema(cls) -> Schema:
        raise NotImplementedError

    @classmethod
    def execute(cls, **kwargs) -> NodeOutput:
        raise NotImplementedError

    @classmethod
    def GET_SCHEMA(cls) -> Schema:
        schema = cls.define_schema()
        schema.validate()
        return schema

    @classmethod
    def PREPARE_CLASS_CLONE(cls, hidden_inputs: dict):
        """A subclass carrying the hidden inputs, as ComfyUI makes before each execution."""
        clone = type(cls.__name__, (cls,), {})
        clone.hidden = HiddenHolder(**{h.name: v for h, v in hidden_inputs.items()})
        return clone
