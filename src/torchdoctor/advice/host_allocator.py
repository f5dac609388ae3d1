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

The pad holds only what fits in it, and glibc maps a block above 32 MiB rather than grow the heap
for it. pytorch/examples' word_language_model (LSTM, 28,913-word vocabulary, batch 20 x 35) keeps
several 81 MB blocks (the logits, their log-softmax and both gradients) alive at once: with the
thresholds and the pad it still took 39,528 faults per step (96-108 ms of system time in a 630 ms
step), exactly as many as without them. Setting the number of mapped blocks to zero
(``MALLOC_MMAP_MAX_=0``) serves every block from the heap, which grows to the step's peak and
keeps it: 0-2,574 faults, 0 ms of system time. The cost is memory: what a step frees stays
resident for the next one (peak resident 578-594 MB without, 877-955 MB with, the pad included).
A block the heap cannot grow for is still mapped (glibc falls back to mmap when sbrk fails).
"""

from __future__ import annotations

MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 256 * 2**20  # free memory kept at the heap's top before it is returned
TOP_PAD = TRIM_THRESHOLD  # kept free at the heap's top: blocks above MMAP_THRESHOLD come from there
MMAP_MAX = 0  # mapped blocks at once: none, so blocks above MMAP_THRESHOLD come from the heap too
# mallopt(3) parameter numbers (malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
       "MALLOC_TOP_PAD_": str(TOP_PAD), "MALLOC_MMAP_MAX_": str(MMAP_MAX)}
# What torchdoctor's own analysis processes get (keep_freed_memory(big_blocks=False)'s settings),
# for engine workers that start from an environment rather than fork from this process.
ANALYSIS_ENV = {k: ENV[k] for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")}
SHELL = "export " + " ".join(f"{k}={v}" for k, v in ENV.items())
# The shell lines HO-15 and the remedy's permanent change give: the settings, or another allocator.
SNIPPET = f"{SHELL}\n# or: export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
# Allocators that replace malloc when preloaded: the job already chose one.
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def keep_freed_memory(big_blocks: bool = True) -> str | None:
    """Set the thresholds, the top pad and the mapped-block limit in this process with mallopt(3) (its
    malloc read its environment when it started); processes it forks inherit them. None when set, else
    why not (never raises).

    `big_blocks=False` (the thresholds only) for torchdoctor's own analysis, whose blocks stay under the
    mmap threshold: the pad kept 80 MB more resident there (peak 369 -> 448 MB on a 622 MB trace) for
    no speed."""
    import ctypes
    import platform

    try:
        if platform.libc_ver()[0] != "glibc":
            return "not glibc: the thresholds are glibc malloc's"
        libc = ctypes.CDLL(None)
        done = (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
                and (not big_blocks or (libc.mallopt(M_TOP_PAD, TOP_PAD) == 1
                                        and libc.mallopt(M_MMAP_MAX, MMAP_MAX) == 1)))
    except Exception as exc:  # a start-up helper: never fail the job for it
        return f"mallopt unavailable ({type(exc).__name__}: {exc})"
    return None if done else "mallopt refused the thresholds"
