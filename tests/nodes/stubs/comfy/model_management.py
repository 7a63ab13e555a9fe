"""Stand-in for the parts of ``comfy.model_management`` the nodes use: the interrupt flag, and the device / dtype
choices and ``free_memory`` (ComfyUI 0.3.64 signatures)."""

import threading

import torch


class InterruptProcessingException(Exception):
    pass


_lock = threading.RLock()
_interrupted = False


def interrupt_current_processing(value=True) -> None:
    global _interrupted
    with _lock:
        _interrupted = value


def processing_interrupted() -> bool:
    with _lock:
        return _interrupted


def throw_exception_if_processing_interrupted() -> None:
    global _interrupted
    with _lock:
        if _interrupted:
            _interrupted = False
            raise InterruptProcessingException()


# ---- device and dtype choices (ComfyUI's names and signatures; a CPU-only ComfyUI: what `main.py --cpu` picks) ----
emulate_gpu = False  # tests set True to stand in for a GPU machine (devices below then say "cuda")
freed: list[tuple[int, str]] = []  # (memory_required, device) of each free_memory call


def get_torch_device():
    return torch.device("cuda") if emulate_gpu else torch.device("cpu")


def unet_dtype(
    device=None, model_params=0, supported_dtypes=(torch.float16, torch.bfloat16, torch.float32), weight_dtype=None
):
    if device is None or torch.device(device).type == "cpu":
        return torch.float32
    return supported_dtypes[0]


def vae_device():
    return get_torch_device()


def vae_dtype(device=None, allowed_dtypes=()):
    if device is None or torch.device(device).type == "cpu":
        return torch.float32
    return allowed_dtypes[0] if allowed_dtypes else torch.float32


def text_encoder_device():
    return get_torch_device()


def text_encoder_dtype(device=None):
    return torch.float16  # ComfyUI's choice on every device (its CPU path computes in float32)


def free_memory(memory_required, device, keep_loaded=()):
    freed.append((int(memory_required), str(device)))
