"""HW-20: matmuls that copy their weight for a batched matmul, every call."""

from __future__ import annotations

from torchdoctor.facts import OptimizerFacts
from torchdoctor.metrics.model import WeightCopies

from .conftest import MS, N_STEPS, cpu_facts, cpu_result, gpu_result, only, run


def _copies(copy_ms: float, device_ms: float | None = None, calls_per_step: int = 16) -> WeightCopies:
    return WeightCopies(calls=calls_per_step * N_STEPS, copy_ns=int(copy_ms * N_STEPS * MS),
                        matmul_ns=int(copy_ms * 1.05 * N_STEPS * MS),
                        device_ns=None if device_ms is None else int(device_ms * N_STEPS * MS), steps=N_STEPS,
                        shapes={"[[4, 15, 512], [512, 151936]]": 16 * N_STEPS})


def test_a_cpu_job_claims_the_copies_host_time():
    r = cpu_result()
    r.weight_copies = _copies(copy_ms=40.0)
    f = only(run("HW-20", (r, cpu_facts())), "HW-20")
    assert f.recoverable_ms == 40.0 and f.recoverable_pct == 40.0 and f.severity == "critical"
    assert f.claims[0].budget == "step" and f.remedy == "matmul.contiguous_input"
    assert f.title.startswith("16 matmul(s) per step copy their weight for a batched matmul: 40.0 ms per step (40%")
    assert "Input Dims: [[4, 15, 512], [512, 151936]] x80." in f.evidence[0].text
    assert "F.linear(x.reshape(-1, x.shape[-1]), w)" in f.fix.snippet and f.fix.language == "python"


def test_torchtune_is_told_its_loss_setting():
    r = cpu_result()
    r.weight_copies = _copies(copy_ms=40.0)
    f = only(run("HW-20", (r, cpu_facts(optimizers=[OptimizerFacts(created_by="torchtune")]))), "HW-20")
    assert "CEWithChunkedOutputLoss" in f.fix.text and "torch.nn.CrossEntropyLoss" in f.fix.snippet
    assert f.fix.language == "yaml"


def test_accelerator_claims_the_copy_kernels_scaled_by_the_busy_share_and_small_copies_are_silent():
    r = gpu_result(busy=50.0)
    r.weight_copies = _copies(copy_ms=1.0, device_ms=20.0)
    f = only(run("HW-20", (r, cpu_facts())), "HW-20")
    assert f.recoverable_ms == 10.0 and f.claims[0].budget == "device.busy"
    r.weight_copies = _copies(copy_ms=1.0, device_ms=2.0)
    assert run("HW-20", (r, cpu_facts())) == []  # 1% of the step
