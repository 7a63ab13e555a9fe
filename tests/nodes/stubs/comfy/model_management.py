"""Stand-in for the interrupt part of ``comfy.model_management``."""

import threading


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
