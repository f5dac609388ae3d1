"""glibc malloc settings that keep a training step's freed memory in the process (HO-15 and the
``memory.host_allocator`` remedy share them).

glibc serves blocks above its mmap threshold (128 KiB, raised to the size of a freed mapped block,
up to 32 MiB) with mmap and unmaps them on free, and trims the heap's top once more than its trim
threshold is free there: a step's activations are then handed back to the kernel and faulted in
again, zeroed, on the next step. Setting either threshold turns the dynamic adjustment off
(mallopt(3)); setting only the trim threshold pins the mmap threshold at 128 KiB and makes it
worse (measured on the demo: 14 against 28 steps/s), so both are set.

A block above the largest mmap threshold (32 MiB) is still mapped and unmapped at every call,
unless the heap's free top can hold it: the top pad keeps that much free at the top when the heap
grows or is trimmed. timm's train.py (ResNet-18 on a CPU, 64 px, batch 16) maps and unmaps a
72 MiB block every step (strace): with the two thresholds alone it kept 6,975 of its 9,247 page
faults per step (24 of 28 ms of system time); with a 64 MiB pad still 6,970; with a 256 MiB pad
(the trim threshold: what trimming keeps anyway) 2-77. The pad is address space: its pages count
as resident only once a block uses them.
"""

from __future__ import annotations

MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 256 * 2**20  # free memory kept at the heap's top before it is returned
TOP_PAD = TRIM_THRESHOLD  # kept free at the heap's top: blocks above MMAP_THRESHOLD come from there
# mallopt(3) parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
       "MALLOC_TOP_PAD_": str(TOP_PAD)}
SHELL = "export " + " ".join(f"{k}={v}" for k, v in ENV.items())
# Allocators that replace malloc when preloaded: the job already chose one.
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def keep_freed_memory(top_pad: bool = True) -> str | None:
    """Set the thresholds and the top pad in this process with mallopt(3) (its malloc read its environment when it
    started); processes it forks inherit them. None when set, else why not (never raises).

    `top_pad=False` for torchdoctor's own analysis, whose blocks stay under the mmap threshold: the pad
    kept 80 MB more resident there (peak 369 -> 448 MB on a 622 MB trace) for no speed."""
    import ctypes
    import platform

    try:
        if platform.libc_ver()[0] != "glibc":
            return "not glibc: the thresholds are glibc malloc's"
        libc = ctypes.CDLL(None)
        done = (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
                and (not top_pad or libc.mallopt(M_TOP_PAD, TOP_PAD) == 1))
    except Exception as exc:  # a start-up helper: never fail the job for it
        return f"mallopt unavailable ({type(exc).__name__}: {exc})"
    return None if done else "mallopt refused the thresholds"
