"""Test stand-in for ComfyUI's ``comfy`` package (only what the Sakura nodes use)."""
