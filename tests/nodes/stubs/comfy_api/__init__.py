"""Test stand-in for ComfyUI's ``comfy_api`` (only ``comfy_api.latest``)."""
