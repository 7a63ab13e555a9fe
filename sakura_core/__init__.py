"""SAKURA core: everything that runs on the phone or the host. Never imports ComfyUI."""

__version__ = "0.1.0"
__all__ = ["__version__"]
