"""Memory rules from the trace's allocator records: HW-18, and HW-5 / HW-6 without live facts."""

from __future__ import annotations

from memory_traces import memory_trace
from torchdoctor.facts import DeviceFacts
from torchdoctor.session import analyze_paths

from .conftest import gpu_facts, gpu_result, only, run


def ids(path: str) -> dict:
    rep = analyze_paths([path])
    assert not rep.errors and not [w for w in rep.warnings if "rule" in w.message]
    return {f.id: f for f in rep.findings}


def test_hw18_reserved_far_above_the_tensors_under_pressure(tmp_path):
    f = ids(memory_trace(tmp_path, total_gib=80, reserved_gib=60))["HW-18"]  # 75% of the device, 80% slack
    assert f.severity == "info" and f.remedy == "memory.expandable_segments" and f.recoverable_ms == 0
    assert "reserves 60.0 GiB (75% of the device) but the tensors peak at 12.0 GiB" in f.title
    assert "expandable_segments:True" in f.fix.snippet


def test_hw18_warns_at_capacity_and_hw6_says_memory_is_full(tmp_path):
    found = ids(memory_trace(tmp_path, total_gib=64, reserved_gib=60))  # 94% of the device
    assert found["HW-18"].severity == "warning"
    assert "reserved peak is 94% of device memory" in found["HW-6"].title


def test_no_memory_finding_with_room_to_spare(tmp_path):
    found = ids(memory_trace(tmp_path, total_gib=160, reserved_gib=60))  # 38% of the device
    assert "HW-18" not in found and "HW-6" not in found
    # Busy 30% with 8% of memory used: a larger batch would fit, said from the trace alone.
    hw5 = found["HW-5"]
    assert "x larger would fit" in hw5.evidence[0].text and hw5.evidence[0].values["batch_scale"] > 1.2


def test_hw18_from_live_allocator_peaks():
    gib = 2**30
    dev = DeviceFacts(kind="cuda", name="NVIDIA A100", capability="8.0", total_memory_bytes=80 * gib,
                      max_memory_allocated_bytes=20 * gib, max_memory_reserved_bytes=70 * gib)
    f = only(run("HW-18", (gpu_result(), gpu_facts(device=dev))), "HW-18")
    assert f.remedy == "memory.expandable_segments" and f.severity == "info"
    assert f.evidence[0].text.startswith("torch.cuda memory stats over the run: reserved peak 70.00 GiB")
    # Room to spare: no finding.
    dev.max_memory_reserved_bytes = 30 * gib
    assert run("HW-18", (gpu_result(), gpu_facts(device=dev))) == []
