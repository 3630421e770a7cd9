"""What a serving process sets up before its loop runs, the single one and each worker alike."""

from __future__ import annotations

import asyncio
import ctypes
import os

__all__ = ["install_fast_loop", "prepare_process", "return_large_buffers_to_the_os"]


def prepare_process() -> None:
    """uvloop where it is installed, and large buffers given back to the OS when freed."""
    install_fast_loop()
    return_large_buffers_to_the_os()


def install_fast_loop() -> None:
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
_MMAP_THRESHOLD = 256 << 10


def return_large_buffers_to_the_os() -> None:
    """Serve large allocations (request bodies, big reads) from their own mappings, so the
    memory goes back to the kernel when they are freed.

    glibc raises its mmap threshold after the first large buffer is freed (up to 32 MiB),
    so later bodies come from the heap, which it rarely gives back: after a burst of large
    requests a pod keeps ~50 MiB it no longer uses, counted against its limit. A
    fixed threshold (glibc's ``MALLOC_MMAP_THRESHOLD_``) keeps the default's behaviour for
    good. No-op where the C library is not glibc, or when the variable is set already."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") is not None:
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - not glibc (musl, macOS)
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
