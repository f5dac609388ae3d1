"""Code-built traces with the allocator's `[memory]` records (metrics/memory.py, rules/memory.py)."""

from __future__ import annotations

from kineto_builder import TraceBuilder

GIB = 2**30


def memory_trace(tmp_path, total_gib: float = 80.0, reserved_gib: float = 60.0):
    """3 steps of 1 ms: each allocates 2 GiB of activations on a 10 GiB floor, then frees them."""
    b = TraceBuilder(device_props={"totalGlobalMem": int(total_gib * GIB)})
    floor = 10 * GIB
    for n in range(3):
        t0 = n * 1000.0
        b.step(n, t0, 1000.0)
        b.kernel("void at::native::vectorized_elementwise_kernel<4>", t0 + 100, 300.0, launch_at=t0 + 50)
        b.memory(t0 + 10, GIB, floor + GIB, int(reserved_gib * GIB))
        b.memory(t0 + 20, GIB, floor + 2 * GIB, int(reserved_gib * GIB))
        b.memory(t0 + 500, -2 * GIB, floor, int(reserved_gib * GIB))
    b.memory(1500.0, 1, 5, 7, device_type=0)  # a CPU record: not the device's
    return str(b.write(tmp_path / "mem.json"))
