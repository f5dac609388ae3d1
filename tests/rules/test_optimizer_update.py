"""HO-18: a fused optimizer update left unused (rules/optimizer_update.py, advice/optimizer.py)."""

from __future__ import annotations

import pytest

from torchdoctor.advice.optimizer import fused_saving, update_traffic
from torchdoctor.facts import OptimizerFacts, StepTiming

from .conftest import MS, N_STEPS, cpu_facts, cpu_result, gpu_facts, gpu_result, only, run

ADAMW = dict(cls="AdamW", fused=False, fused_available=True, param_device="cpu", call_site="train_gpt2.py:269",
             settings={"weight_decay": 0.1, "amsgrad": False, "differentiable": False})


def test_traffic_model_counts_the_passes_of_each_update():
    loop = "single_tensor"
    assert update_traffic("AdamW", {"weight_decay": 0.1}, loop) == 21
    assert update_traffic("Adam", {}, loop) == 19 and update_traffic("Adam", {"weight_decay": 0.1}, loop) == 22
    assert update_traffic("Adam", {"weight_decay": 0.1, "decoupled_weight_decay": True}, loop) == 21
    assert update_traffic("Adam", {"amsgrad": True}, "fused") == 9
    assert update_traffic("Adam", {"capturable": True}, "foreach") == 21  # step sizes as lists
    assert update_traffic("Adam", {"maximize": True}, loop) == 21  # the negated gradient
    assert update_traffic("Adagrad", {}, loop) == 12 and update_traffic("Adagrad", {}, "foreach") == 14
    assert fused_saving("AdamW", {"weight_decay": 0.1}) == pytest.approx(1 - 7 / 21)
    assert fused_saving("SGD", {"momentum": 0.9}) == pytest.approx(1 - 5 / 8)
    assert fused_saving("SGD", {"momentum": 0.0}) == 0.0  # one pass either way
    assert fused_saving("Adagrad", {}) == pytest.approx(1 - 5 / 12)
    assert fused_saving("RMSprop", {}) is None


def test_cpu_update_priced_from_the_trace_optimizer_step():
    r = cpu_result()
    r.signals.optimizer_step_ns = 30 * MS * N_STEPS  # 30 ms of a 100 ms step
    f = cpu_facts(optimizers=[OptimizerFacts(**ADAMW)])
    got = only(run("HO-18", (r, f)), "HO-18")
    assert got.recoverable_ms == pytest.approx(30 * (1 - 7 / 21), abs=1e-3)
    assert got.remedy == "optim.fused" and got.confidence == "medium" and got.severity == "critical"  # 20% of the step
    assert "per-parameter update (30.0 ms per step)" in got.title
    assert "train_gpt2.py:269" in got.fix.text and "fused=False now" in got.fix.text


def test_cpu_without_a_trace_uses_the_probes_optimizer_time():
    steps = [StepTiming(step=i, total_ms=100.0, optimizer_ms=20.0) for i in range(1, 12)]
    f = cpu_facts(optimizers=[OptimizerFacts(**ADAMW)], steps=steps)
    got = only(run("HO-18", (None, f)), "HO-18")
    assert got.recoverable_ms == pytest.approx(20 * (1 - 7 / 21), abs=1e-3)


def test_accelerator_prices_the_device_time_by_the_busy_share_with_low_confidence():
    r = gpu_result(busy=80.0)
    r.signals.optimizer_impl = "foreach"
    r.signals.optimizer_device_ns = 10 * MS * N_STEPS
    f = gpu_facts(optimizers=[OptimizerFacts(**{**ADAMW, "fused": None, "param_device": "cuda"})])
    got = only(run("HO-18", (r, f)), "HO-18")
    assert got.recoverable_ms == pytest.approx(10 * (1 - 7 / 21) * 0.8, abs=1e-3)
    assert "foreach update" in got.title and got.confidence == "low"


@pytest.mark.parametrize("change", [
    {"fused": True},  # already fused
    {"fused_available": False},  # this torch has no fused kernel for these parameters
    {"fused_available": None},  # not known (a subclass, an older torch)
    {"cls": "RMSprop"},  # no fused implementation
    {"settings": {"differentiable": True}},  # fused cannot differentiate the update
])
def test_silent_where_fused_cannot_or_does_already(change):
    r = cpu_result()
    r.signals.optimizer_step_ns = 30 * MS * N_STEPS
    assert run("HO-18", (r, cpu_facts(optimizers=[OptimizerFacts(**{**ADAMW, **change})]))) == []


def test_silent_for_plain_sgd_and_a_small_update_and_where_ho9_speaks():
    r = cpu_result()
    r.signals.optimizer_step_ns = 30 * MS * N_STEPS
    sgd = OptimizerFacts(cls="SGD", fused_available=True, settings={"momentum": 0.0})
    assert run("HO-18", (r, cpu_facts(optimizers=[sgd]))) == []  # one pass either way: nothing to save
    r.signals.optimizer_step_ns = int(0.5 * MS * N_STEPS)  # 0.33 ms of a 100 ms step
    assert run("HO-18", (r, cpu_facts(optimizers=[OptimizerFacts(**ADAMW)]))) == []
    g = gpu_result()
    g.signals.optimizer_device_ns = 10 * MS * N_STEPS
    loop = gpu_facts(optimizers=[OptimizerFacts(**{**ADAMW, "foreach": False, "param_device": "cuda"})])
    assert run("HO-18", (g, loop)) == []  # HO-9's: the per-parameter loop on an accelerator


@pytest.mark.parametrize("library, said, language", [
    ("transformers", 'optim="adamw_torch_fused"', "python"),
    ("timm", "python train.py --model resnet18 --opt-kwargs fused=True", "shell"),  # the job's own command
])
def test_a_librarys_optimizer_is_changed_through_its_own_setting(library, said, language):
    r = cpu_result()
    r.signals.optimizer_step_ns = 30 * MS * N_STEPS
    o = OptimizerFacts(**{**ADAMW, "fused": None, "call_site": None, "created_by": library})
    got = only(run("HO-18", (r, cpu_facts(optimizers=[o])),
                   job={"command": ["python", "train.py", "--model", "resnet18"]}), "HO-18")
    assert said in got.fix.snippet and got.fix.language == language and "fused=False now" not in got.fix.text


def test_with_several_optimizers_the_candidate_gets_its_parameters_share_of_the_time():
    """SAC-style: AdamW(fused=True) over the networks and a small Adam over one temperature
    parameter. Every Optimizer.step range is in the trace's time: the Adam's share is 1 parameter
    in 1,000,001, so nothing is claimed."""
    r = cpu_result()
    r.signals.optimizer_step_ns = 30 * MS * N_STEPS
    big = OptimizerFacts(**{**ADAMW, "fused": True, "num_params": 1_000_000})
    alpha = OptimizerFacts(cls="Adam", fused_available=True, num_params=1, param_device="cpu")
    assert run("HO-18", (r, cpu_facts(optimizers=[big, alpha]))) == []
    half = OptimizerFacts(**{**ADAMW, "num_params": 1_000_000})
    got = only(run("HO-18", (r, cpu_facts(optimizers=[half, OptimizerFacts(**{**ADAMW, "fused": True,
                                                                                "num_params": 1_000_000})]))), "HO-18")
    assert got.recoverable_ms == pytest.approx(15 * (1 - 7 / 21), abs=1e-3)


def test_an_optimizer_kept_on_the_cpu_by_a_gpu_job_is_priced_by_its_host_time():
    r = gpu_result(busy=50.0)
    r.signals.optimizer_step_ns, r.signals.optimizer_device_ns = 30 * MS * N_STEPS, 0
    got = only(run("HO-18", (r, gpu_facts(optimizers=[OptimizerFacts(**ADAMW)]))), "HO-18")
    assert got.recoverable_ms == pytest.approx(30 * (1 - 7 / 21), abs=1e-3)  # not scaled by the busy share
    assert "per-parameter update" in got.title and got.confidence == "medium"


def test_a_trace_of_adamw_foreach_on_an_accelerator_is_priced_with_its_default_weight_decay():
    r = gpu_result(busy=100.0)
    r.signals.optimizer_impl, r.signals.optimizer_classes = "foreach", ["AdamW"]
    r.signals.optimizer_device_ns = 6 * MS * N_STEPS
    got = only(run("HO-18", (r, None)), "HO-18")
    assert got.recoverable_ms == pytest.approx(6 * (1 - 7 / 21), abs=1e-3) and got.confidence == "low"
    assert "constructor's default" in got.evidence[0].text
    # SGD's momentum is not in a trace, and plain SGD saves nothing: no claim from a trace.
    r.signals.optimizer_classes = ["SGD"]
    assert run("HO-18", (r, None)) == []


def test_a_gans_two_unfused_optimizers_are_claimed_together():
    """pytorch/examples' dcgan: Adam for the generator and Adam for the discriminator."""
    r = cpu_result()
    r.signals.optimizer_step_ns = 30 * MS * N_STEPS
    adam = dict(cls="Adam", fused_available=True, param_device="cpu", settings={"weight_decay": 0.0})
    g = OptimizerFacts(**adam, num_params=3_000_000, call_site="main.py:230")
    d = OptimizerFacts(**adam, num_params=1_000_000, call_site="main.py:231")
    got = only(run("HO-18", (r, cpu_facts(optimizers=[g, d]))), "HO-18")
    assert got.recoverable_ms == pytest.approx(30 * (1 - 7 / 19), abs=1e-3)
    assert got.title.startswith("2 optimizers (Adam, Adam) run unfused updates (30.0 ms per step together)")
    assert len(got.evidence) == 2 and "main.py:230" in got.fix.text and "main.py:231" in got.fix.text


def test_unknown_sizes_split_the_time_equally_and_ho9s_loop_leaves_the_other_optimizer_priced():
    """Facts without num_params gave each of two candidates the whole time (60 ms from 30). On an
    accelerator, an optimizer with foreach=False is HO-9's; a foreach one beside it is still HO-18's."""
    r = cpu_result()
    r.signals.optimizer_step_ns = 30 * MS * N_STEPS
    two = [OptimizerFacts(**{**ADAMW, "num_params": None}), OptimizerFacts(**{**ADAMW, "num_params": None})]
    got = only(run("HO-18", (r, cpu_facts(optimizers=two))), "HO-18")
    assert got.recoverable_ms == pytest.approx(30 * (1 - 7 / 21), abs=1e-3)
    g = gpu_result(busy=100.0)
    g.signals.optimizer_device_ns = 10 * MS * N_STEPS
    cuda = {**ADAMW, "fused": None, "param_device": "cuda", "num_params": 100}
    loop, lists = OptimizerFacts(**{**cuda, "foreach": False}), OptimizerFacts(**cuda)
    got = only(run("HO-18", (g, gpu_facts(optimizers=[loop, lists]))), "HO-18")
    assert got.recoverable_ms == pytest.approx(5 * (1 - 7 / 21), abs=1e-3) and len(got.evidence) == 1
