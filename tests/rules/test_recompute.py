"""HW-19: activation checkpointing runs part of the forward again in every backward pass."""

from __future__ import annotations

from torchdoctor.facts import DataLoaderFacts, DeviceFacts, OptimizerFacts
from torchdoctor.metrics.model import Recompute

from .conftest import MS, N_STEPS, STEP_MS, cpu_facts, cpu_result, gpu_facts, gpu_result, only, run

GIB = 2**30


def _recompute(host_ms: float, device_ms: float | None = None, nodes_per_step: int = 4, reentrant: int = 0):
    return Recompute(nodes=nodes_per_step * N_STEPS, reentrant=reentrant, host_ns=int(host_ms * N_STEPS * MS),
                     device_ns=None if device_ms is None else int(device_ms * N_STEPS * MS), steps=N_STEPS,
                     forward_ops={"aten::linear": 8 * N_STEPS, "aten::layer_norm": 4 * N_STEPS})


def test_cpu_job_gets_the_host_time_and_the_trainers_setting():
    r = cpu_result()
    r.recompute = _recompute(host_ms=22.0)
    f = only(run("HW-19", (r, cpu_facts(optimizers=[OptimizerFacts(created_by="transformers")]))), "HW-19")
    assert f.recoverable_ms == 22.0 and f.recoverable_pct == 22.0 and f.severity == "critical"
    assert f.claims[0].budget == "step" and f.remedy == "memory.no_checkpoint"
    assert "forward of 4 checkpointed segment(s) again per step" in f.title and "22.0 ms per step (22% of" in f.title
    assert "gradient_checkpointing=False" in f.fix.snippet and "trl" in f.fix.text
    assert "linear x40" in f.evidence[0].text and f.evidence[0].values["segments_per_step"] == 4
    assert "BatchNorm" not in f.evidence[0].text
    r.recompute.batch_norm = 3 * N_STEPS  # timm's resnet: each block's BatchNorms run again
    f = only(run("HW-19", (r, cpu_facts())), "HW-19")
    assert "3 BatchNorm call(s) per step ran again: in training mode each updated its running statistics a second" \
        in f.evidence[0].text


def test_accelerator_claims_device_time_scaled_by_the_busy_share():
    r = gpu_result(busy=50.0)
    r.recompute = _recompute(host_ms=3.0, device_ms=30.0, reentrant=4 * N_STEPS)
    dev = DeviceFacts(kind="cuda", name="NVIDIA A100", capability="8.0", total_memory_bytes=80 * GIB,
                      max_memory_allocated_bytes=20 * GIB)
    f = only(run("HW-19", (r, gpu_facts(device=dev))), "HW-19")
    # The device time it launched, halved: a host-bound half of the step does not shrink with less device work.
    assert f.recoverable_ms == 15.0 and f.claims[0].budget == "device.busy" and f.severity == "warning"
    assert "30.0 ms per step" in f.title and "reentrant checkpoints" in f.evidence[0].text
    assert "peak was 20.0 of 80 GiB (25%)" in f.evidence[0].text
    assert "torch.utils.checkpoint.checkpoint" in f.fix.text  # no trainer: the job's own calls
    assert "DeepSpeed's activation_checkpointing section" in f.fix.text  # reentrant: maybe theirs
    assert f.remedy == "memory.no_checkpoint"


def test_memory_near_full_is_info_and_says_so():
    r = gpu_result(busy=90.0)
    r.recompute = _recompute(host_ms=3.0, device_ms=30.0)
    dev = DeviceFacts(kind="cuda", name="NVIDIA A100", capability="8.0", total_memory_bytes=80 * GIB,
                      max_memory_allocated_bytes=70 * GIB)
    f = only(run("HW-19", (r, gpu_facts(device=dev, dataloaders=[DataLoaderFacts(created_by="lightning")]))),
             "HW-19")
    assert f.severity == "info" and "may not fit" in f.fix.text and "activation_checkpointing_policy" in f.fix.snippet
    # fix does not try it by itself near full memory: an arm out of memory would end the whole A/B.
    assert f.remedy is None and "(alone: memory is close to full)" in f.confirm


def test_small_or_absent_recompute_says_nothing():
    r = cpu_result()
    assert run("HW-19", (r, cpu_facts())) == []
    r.recompute = _recompute(host_ms=0.02 * STEP_MS)  # 2% of the step
    assert run("HW-19", (r, cpu_facts())) == []


def test_torchtune_s_compiled_layers_get_its_config_key():
    """torchtune with compile=True: each layer is compiled inside its checkpoint wrapper, so what runs again is the
    compiled forward; the setting is the recipe config's enable_activation_checkpointing."""
    r = cpu_result()
    r.recompute = Recompute(nodes=6 * N_STEPS, reentrant=0, host_ns=int(9.0 * N_STEPS * MS), device_ns=None,
                            steps=N_STEPS, forward_ops={"CompiledFunction": 6 * N_STEPS}, compiled=6 * N_STEPS)
    f = only(run("HW-19", (r, cpu_facts(optimizers=[OptimizerFacts(created_by="torchtune")]))), "HW-19")
    assert f.recoverable_ms == 9.0
    assert "a compiled segment's forward x30" in f.evidence[0].text
    assert ("the host time of that work (compiled segments' forwards (CompiledFunction) run inside a backward node, "
            "and the forward ops beside them: their own time)") in f.evidence[0].text
    assert "enable_activation_checkpointing: False" in f.fix.snippet and "torchtune's recipes" in f.fix.text
    assert f.fix.language == "yaml"
    # A reentrant checkpoint around compiled blocks is priced as reentrant: the text says so.
    r.recompute.reentrant, r.recompute.compiled = 6 * N_STEPS, 0
    f = only(run("HW-19", (r, cpu_facts())), "HW-19")
    assert "(reentrant nodes less the backward nested in them)" in f.evidence[0].text
