"""The C allocator's settings for a process that runs torch on the CPU.

glibc serves an allocation above its mmap threshold (128 KiB at first, raised to the
largest block freed so far, at most 32 MiB) with fresh pages from the system and hands
them back when it is freed, and it returns the top of its heap once more than twice that
threshold is free there. A model's forward pass allocates and frees activations of
megabytes, so every pass paid for page faults again: ``capc teacher fit`` on 40 teachers
spent 12 of its 56 CPU seconds in the kernel, 0.7 with the settings below, and its
hospitals' answerers paid the same on every round of real records. Fixed thresholds keep
freed blocks of up to :data:`MMAP_THRESHOLD` for the next pass; memory a process no
longer uses is still returned once :data:`TRIM_THRESHOLD` of it is free.
"""

from __future__ import annotations

import ctypes
import sys

#: mallopt's parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks below this come from the heap and are reused: glibc's largest (a batch of 256
#: images' largest activations through the shipped body take 25 MiB).
MMAP_THRESHOLD = 32 << 20
#: Free memory at the heap's top kept for reuse before it is returned to the system.
TRIM_THRESHOLD = 256 << 20


def keep_freed_memory() -> bool:
    """Set glibc's thresholds for this process (its later forks inherit them); False
    where the C library is not glibc or refuses, which changes nothing but speed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done)
