"""Host-layer rules (HO-1..HO-13)."""

from __future__ import annotations

import msgspec
import pytest

from torchdoctor.facts import (
    BackendFacts,
    CpuFacts,
    DataLoaderFacts,
    ModuleDeviceFacts,
    OptimizerFacts,
    StepTiming,
    ZeroGradFacts,
)
from torchdoctor.metrics.model import CopySite, LaunchStats, MemcpyRow, SyncSite, SyncStats

from .conftest import MS as MS_NS
from .conftest import cpu_facts, cpu_result, gpu_facts, gpu_result, idle, only, run, run_all


def site(api="cudaStreamSynchronize", op="aten::_local_scalar_dense", ns=10_000_000, count=5) -> SyncSite:
    return SyncSite(api=api, op=op, top_op=op or "", explanation="x", count=count, ns=ns, first_ts_ns=0)


def with_sync(sites: list[SyncSite], idle_ms: float = 10.0):
    r = idle(gpu_result(busy=100 - idle_ms), "sync", idle_ms)
    r.syncs = SyncStats(count=sum(s.count for s in sites), ns=sum(s.ns for s in sites), per_step=1.0, sites=sites)
    return r


def test_ho1_umbrella_on_mostly_idle_device():
    r = idle(gpu_result(busy=30.0), "host_ops", 70.0)
    got = only(run("HO-1", (r, None)), "HO-1")
    assert got.severity == "info" and got.recoverable_pct == 0.0


def test_ho1_silent_on_busy_device():
    assert run("HO-1", (gpu_result(busy=95.0), None)) == []


def test_ho1_says_when_the_window_has_no_device_work():
    got = only(run("HO-1", (gpu_result(busy=0.0), None)), "HO-1")
    assert "no device work" in got.title


def launch_bound(queue_le1=90.0, short=50.0):
    r = idle(gpu_result(busy=70.0), "host_ops", 30.0)
    r.launches = LaunchStats(launches=5000, launch_ns_median=10_000.0, queue_le1_pct=queue_le1,
                             short_kernels_pct=short, kernels_per_step=1000.0, queue_depth_median=0.0)
    return r


def test_ho2_launch_bound():
    got = only(run("HO-2", (launch_bound(), None)), "HO-2")
    assert abs(got.recoverable_ms - 9.0) < 1e-6  # 1000 launches x 10 µs x 90% into a starving queue


def test_ho2_silent_with_deep_queue():
    assert run("HO-2", (launch_bound(queue_le1=5.0, short=10.0), None)) == []


def test_ho3_item_sync_in_trace():
    got = only(run("HO-3", (with_sync([site()]), None)), "HO-3")
    assert abs(got.recoverable_pct - 10.0) < 0.1 and got.severity == "warning"


def test_ho3_blocking_dtoh_copy():
    r = idle(gpu_result(busy=60.0), "host_ops", 40.0)
    r.signals.blocking_copies = [CopySite("cudaMemcpyAsync", "DtoH", "pageable", "aten::copy_",
                                          "## sparse_data_dist ##", 5, 5 * 45 * 10**6, 5 * 30 * 10**6, 100, 0)]
    found = run_all((r, None))
    ho3, ho5 = only(found, "HO-3"), only(found, "HO-5")
    assert abs(ho3.recoverable_pct - 30.0) < 0.1
    assert abs(ho5.recoverable_pct - 10.0) < 0.1  # the generic rule keeps only the rest of the 40 ms
    assert "sparse_data_dist" in ho3.title


def test_ho3_silent_without_syncs():
    assert run("HO-3", (gpu_result(), None)) == []


def test_ho3_loss_item_every_step_from_facts():
    gpu = only(run("HO-3", (None, gpu_facts(host_syncs_per_step=1.0, host_sync_sites={"train.py:42": 10}))), "HO-3")
    cpu = only(run("HO-3", (None, cpu_facts(host_syncs_per_step=1.0))), "HO-3")
    assert gpu.severity == "warning" and cpu.severity == "info"
    # Without an accelerator the probe leaves out a library's conversions outside the autograd graph.
    assert "a lower bound" in cpu.evidence[0].text and "lower bound" not in gpu.evidence[0].text
    assert "(e.g. loss.item() every step)" in gpu.title and "Log every N steps" in gpu.fix.text


def test_ho3_a_librarys_sync_every_step_is_named_as_the_librarys(monkeypatch):
    """mmengine's ResNet-50 example: the one sync a step is mmengine's RuntimeInfoHook logging the loss
    through MessageHub.update_scalar (.item() at message_hub.py:346) at every iteration; "log every N
    steps" in the job's code was advice for code the job does not have."""
    site = "/venv/lib/python3.11/site-packages/mmengine/logging/message_hub.py:346"
    got = only(run("HO-3", (None, gpu_facts(host_syncs_per_step=1.0, host_sync_sites={site: 128, "train.py:9": 3}))),
               "HO-3")
    assert got.title.startswith("1 host sync(s) per step (in mmengine's code, mmengine/logging/message_hub.py:346)")
    assert got.fix.text.startswith("The sync is inside mmengine (mmengine/logging/message_hub.py:346)")
    assert not got.fix.snippet
    # torchtune's built-in recipes are the top-level package "recipes": named by the distribution.
    from torchdoctor import callsite

    monkeypatch.setattr(callsite, "_distributions", lambda: {"recipes": ["torchtune"], "mmengine": ["mmengine"]})
    site = "/venv/lib/python3.11/site-packages/recipes/full_finetune_single_device.py:720"
    got = only(run("HO-3", (None, gpu_facts(host_syncs_per_step=1.0, host_sync_sites={site: 8}))), "HO-3")
    assert "(in torchtune's code, recipes/full_finetune_single_device.py:720)" in got.title
    assert got.fix.text.startswith("The sync is inside torchtune (recipes/full_finetune_single_device.py:720)")
    # The job's own lines nearly as many (a metric the loop updates, and its own loss.item()): not the library's.
    mixed = {"/venv/lib/python3.11/site-packages/torchmetrics/metric.py:300": 500, "train.py:9": 499}
    got = only(run("HO-3", (None, gpu_facts(host_syncs_per_step=2.0, host_sync_sites=mixed))), "HO-3")
    assert "(e.g. loss.item() every step)" in got.title and "Log every N steps" in got.fix.text
    # 85% in the library is not enough to call the syncs its own either.
    mixed = {"/venv/lib/python3.11/site-packages/torchmetrics/metric.py:300": 85, "train.py:9": 15}
    got = only(run("HO-3", (None, gpu_facts(host_syncs_per_step=1.0, host_sync_sites=mixed))), "HO-3")
    assert "(e.g. loss.item() every step)" in got.title


def test_ho3_collate_fn_conversions():
    f = cpu_facts(dataloaders=[DataLoaderFacts(num_workers=0, collate_fn="train.collate", collate_syncs_per_batch=64)])
    r = cpu_result(dataloader_pct=30.0, dataloader_exposed_pct=30.0)
    got = only(run("HO-3", (r, f)), "HO-3")
    assert "collate_fn" in got.title and got.severity == "warning" and got.recoverable_pct == 0.0


def test_ho3_collate_time_is_claimed_and_the_loader_rules_split_the_rest():
    # 100 ms steps waiting 30 ms for data, 8 ms of which the probe timed inside collate_fn.
    dl = DataLoaderFacts(num_workers=0, collate_fn="train.collate", collate_syncs_per_batch=64, collate_ms_mean=8.0)
    f = cpu_facts(dataloaders=[dl], cpu=CpuFacts(affinity=[0, 1], local_world_size=2))
    found = run_all((cpu_result(dataloader_pct=30.0, dataloader_exposed_pct=30.0), f))
    collate = next(x for x in found if x.id == "HO-3" and "collate_fn" in x.title)
    assert abs(collate.recoverable_pct - 8.0) < 0.1 and "8.0 ms per batch" in collate.evidence[0].text
    loader = sum(x.recoverable_pct for x in found if x.id in ("DL-1", "DL-2"))
    assert abs(loader + collate.recoverable_pct - 30.0) < 0.1  # the wait is claimed once, in full
    assert collate.severity == "warning"
    # A converting collate that costs little (0.3 ms of a 100 ms step) is reported, not warned about.
    cheap = msgspec.structs.replace(dl, collate_ms_mean=0.3)
    found = run_all((cpu_result(dataloader_pct=30.0, dataloader_exposed_pct=30.0), msgspec.structs.replace(f, dataloaders=[cheap])))
    collate = next(x for x in found if x.id == "HO-3" and "collate_fn" in x.title)
    assert collate.severity == "info" and abs(collate.recoverable_pct - 0.3) < 0.01


def test_ho4_sync_memcpy_api():
    got = only(run("HO-4", (with_sync([site(api="cudaMemcpy", op="aten::copy_")]), None)), "HO-4")
    assert abs(got.recoverable_pct - 10.0) < 0.1


def test_ho4_silent_on_implicit_syncs():
    assert run("HO-4", (with_sync([site()]), None)) == []


def test_ho7_explicit_synchronize():
    found = run_all((with_sync([site(api="cudaDeviceSynchronize", op=""), site(ns=10_000_000)]), None))
    ho7, ho3 = only(found, "HO-7"), only(found, "HO-3")
    assert abs(ho7.recoverable_pct + ho3.recoverable_pct - 10.0) < 0.1  # sync idle split, not doubled


def test_ho7_silent_without_explicit_syncs():
    assert run("HO-7", (with_sync([site()]), None)) == []


def test_ho5_host_bound_names_the_host_work():
    r = idle(gpu_result(busy=60.0), "host_ops", 40.0, [("## RecMetricModule:update ##", 35.0)])
    got = only(run("HO-5", (r, None)), "HO-5")
    assert "RecMetricModule" in got.title and abs(got.recoverable_pct - 40.0) < 0.1


def test_ho5_names_a_region_whose_own_python_holds_the_idle():
    # DeepSeek's H800 trace: the idle sits inside record_function regions with no op of their
    # own; the region is the user's code, named as where the Python runs, not as an op to move.
    r = idle(gpu_result(busy=60.0), "host_ops", 40.0,
             [("1F1B", 38.0), ("combine(B)", 20.0), ("dispatch(F)", 18.0), ("aten::empty_like", 1.0)])
    for t in r.idle_causes[-1].top[:3]:
        t.region = True
    got = only(run("HO-5", (r, None)), "HO-5")
    assert "the Python between ops in the `1F1B` region (and in `combine(B)`, `dispatch(F)`)" in got.title
    # An op that holds most of the region's idle is named itself.
    r.idle_causes[-1].top[3].ns = r.idle_causes[-1].top[0].ns
    got = only(run("HO-5", (r, None)), "HO-5")
    assert "runs aten::empty_like and other host work" in got.title


@pytest.mark.parametrize(("top", "htod", "says", "snippet"), [
    # TraceLens' H100 BERT/Qwen traces: eager Hugging Face models, aten::linear leads the host time.
    ("aten::linear", False, "The host issues the model's ops more slowly than the device runs them (aten::linear "
     "leads)", "torch.compile(model)"),
    ("vllm::moe_forward", False, "run the engine with its CUDA graphs", "enforce_eager=False"),
    ("Torch-Compiled Region: 0/0", False, "capture the compiled step in CUDA (HIP) graphs", 'mode="reduce-overhead"'),
    ("CompiledFunction", False, "capture the compiled step in CUDA (HIP) graphs", 'mode="reduce-overhead"'),
    # A cast under autocast is the model's op; with host-to-device copies in the trace it is a copy to fix.
    ("aten::to", False, "The host issues the model's ops more slowly", "torch.compile(model)"),
    ("aten::to", True, "Copies and casts run on the host in the step (aten::to leads)", "non_blocking=True"),
    ("## RecMetricModule:update ##", False, "move ## RecMetricModule:update ## off it", "torch.compile(model)"),
])
def test_ho5_tells_the_models_ops_from_work_to_move(top, htod, says, snippet):
    """'move aten::linear off the step path' is no advice: a model's op is issued, not moved."""
    r = idle(gpu_result(busy=60.0), "host_ops", 40.0, [(top, 35.0)])
    if htod:
        r.kernels.memcpy = [MemcpyRow(direction="HtoD", host_memory="pageable", count=3, ns=3_000_000, bytes=1 << 20)]
    got = only(run("HO-5", (r, None)), "HO-5")
    assert says in got.fix.text and snippet in got.fix.snippet
    assert ("off it" in got.fix.text) == top.startswith("##")


def test_ho5_a_region_around_the_models_forward_is_the_models_python():
    """param's DLRM traces (8 V100 ranks): the idle sits in DDP's forward and "## forward ##" regions; their
    Python is the model's per-op work, not something to move off the step."""
    r = idle(gpu_result(busy=60.0), "host_ops", 40.0, [("DistributedDataParallel.forward", 38.0), ("## forward ##", 20.0)])
    for t in r.idle_causes[-1].top:
        t.region = True
    got = only(run("HO-5", (r, None)), "HO-5")
    assert got.fix.text.startswith("The model's own Python issues its ops more slowly") and "off it" not in got.fix.text


def test_ho5_does_not_advise_cuda_graphs_a_trace_already_replays():
    r = idle(gpu_result(busy=60.0), "host_ops", 40.0, [("aten::linear", 35.0)])
    r.launches.graph_launches = 12
    got = only(run("HO-5", (r, None)), "HO-5")
    assert "reduce-overhead" not in got.fix.text + got.fix.snippet and "already replays graphs" in got.fix.text

def test_ho5_silent_on_compute_bound_device():
    assert run("HO-5", (idle(gpu_result(busy=99.8), "host_ops", 0.2), None)) == []


def test_ho6_slow_launch_calls():
    r = gpu_result()
    r.launches = LaunchStats(launches=100, launch_ns_p95=300_000.0, launch_ns_median=5_000.0)
    assert only(run("HO-6", (r, None)), "HO-6").severity == "info"


def test_ho6_silent_on_fast_launches():
    r = gpu_result()
    r.launches = LaunchStats(launches=100, launch_ns_p95=12_000.0, launch_delay_ns_p95=5_000.0)
    assert run("HO-6", (r, None)) == []


def test_ho6_late_kernels_count_only_the_wait_nothing_earlier_explains():
    # 145 µs of HTA launch delay with a shallow queue, all of it waiting for earlier device work
    # (the A100 NCCL trace in tests/data/hta): silent. The same delay left unexplained: info.
    r = gpu_result()
    r.launches = LaunchStats(launches=100, launch_ns_p95=12_000.0, launch_delay_ns_p95=145_000.0,
                             launch_wait_ns_p95=2_300.0, queue_depth_median=0.0)
    assert run("HO-6", (r, None)) == []
    r.launches.launch_wait_ns_p95 = 140_000.0
    got = only(run("HO-6", (r, None)), "HO-6")
    assert "140 µs after launch" in got.title and got.evidence[0].values["launch_wait_us_p95"] == 140.0


def test_ho8_debug_switches():
    f = gpu_facts(env={"CUDA_LAUNCH_BLOCKING": "1"}, backends=BackendFacts(anomaly_detection=True))
    got = only(run("HO-8", (None, f)), "HO-8")
    assert got.severity == "warning" and got.remedy == "debug.off"


def test_ho8_silent_on_clean_run():
    assert run("HO-8", (None, gpu_facts(env={"NCCL_DEBUG": "WARN"}))) == []


def single_tensor(cls="Adam"):
    r = idle(gpu_result(busy=85.0), "optimizer", 15.0,
             [(f"Optimizer.step#{cls}.step", 10.0), (f"Optimizer.zero_grad#{cls}.zero_grad", 5.0)])
    r.signals.optimizer_impl = "single_tensor"
    r.signals.optimizer_classes = [cls]
    r.signals.optimizer_ops_per_step = r.signals.optimizer_launches_per_step = 400.0
    return r


def test_ho9_single_tensor_optimizer():
    got = only(run("HO-9", (single_tensor(), None)), "HO-9")
    assert got.remedy == "optim.fused" and abs(got.recoverable_pct - 10.0) < 0.1


def test_ho9_from_facts_foreach_false():
    f = gpu_facts(optimizers=[OptimizerFacts(cls="RMSprop", foreach=False)])
    assert only(run("HO-9", (None, f)), "HO-9").remedy == "optim.foreach"


@pytest.mark.parametrize("cls", ["Adam", "AdamW", "SGD", "Adagrad", "Adamax", "RAdam", "NAdam", "RMSprop"])
def test_ho9_advises_fused_only_where_torch_optim_takes_it(cls):
    # The printed fix must run: NAdam(params, fused=True) is a TypeError (found on a public DLRM trace).
    import inspect

    import torch

    takes_fused = "fused" in inspect.signature(getattr(torch.optim, cls).__init__).parameters
    got = only(run("HO-9", (single_tensor(cls), None)), "HO-9")
    assert got.remedy == ("optim.fused" if takes_fused else "optim.foreach")
    assert got.fix.snippet == f"torch.optim.{cls}(params, lr=..., {'fused' if takes_fused else 'foreach'}=True)"
    assert takes_fused == (cls in {"Adam", "AdamW", "SGD", "Adagrad"})  # the pinned torch, as HO-9 knows it


def test_ho9_silent_on_foreach_or_custom_optimizer():
    r = single_tensor()
    r.signals.optimizer_impl = "foreach"
    assert run("HO-9", (r, None)) == []
    assert run("HO-9", (single_tensor("Shampoo"), None)) == []


def test_ho10_zero_grad_fills():
    r = single_tensor()
    r.signals.zero_grad_fills_per_step = 400.0
    found = run_all((r, None))
    assert abs(only(found, "HO-10").recoverable_pct - 5.0) < 0.1
    assert not [x for x in found if x.id == "HO-5"]  # the optimizer idle is fully owned by HO-9/HO-10


def ho10_fix(*fills: ZeroGradFacts):
    r = single_tensor()
    r.signals.zero_grad_fills_per_step = 8.0
    return only(run("HO-10", (r, gpu_facts(zero_grad_fills=list(fills)) if fills else None)), "HO-10").fix


def in_library(pkg: str, entry: str, caller: str, path: str) -> ZeroGradFacts:
    return ZeroGradFacts(optimizer="SGD", called_by=pkg, entry=entry, caller=caller,
                         library_site=f"/v/lib/python3.11/site-packages/{path}")


OPACUS = in_library("opacus", "DPOptimizer.zero_grad", "train.py:67", "opacus/optimizers/optimizer.py:537")


@pytest.mark.parametrize("fills, text", [
    ((), "Set gradients to None (the default since PyTorch 2.0)."),
    # A wrapping optimizer's zero_grad, reached from the user's own call: the argument goes there.
    ((OPACUS,), "opacus passes set_to_none=False to SGD.zero_grad (at opacus/optimizers/optimizer.py:537): your "
                "optimizer.zero_grad() at train.py:67 calls DPOptimizer.zero_grad(), which does not default to "
                "torch's set_to_none=True. Pass set_to_none=True there."),
    # A library that zeroes on its own, below the user's trainer.fit(): no line of the user's to edit.
    ((in_library("lightning", "Trainer.fit", "train.py:45", "lightning/pytorch/loops/automatic.py:300"),),
     "lightning passes set_to_none=False to SGD.zero_grad (at lightning/pytorch/loops/automatic.py:300) inside "
     "Trainer.fit() called from train.py:45: look for lightning's setting for it; torch's own default sets "
     "gradients to None."),
    ((OPACUS, ZeroGradFacts(optimizer="Adam", call_site="train.py:12")),
     "Your call at train.py:12 passes set_to_none=False: drop it (torch's default since 2.0 sets gradients to "
     "None) unless the code reads the zeroed gradients."),
])
def test_ho10_names_who_passes_set_to_none_false(fills, text):
    fix = ho10_fix(*fills)
    assert fix.text == text and fix.snippet == "optimizer.zero_grad(set_to_none=True)"


def test_ho10_silent_with_set_to_none():
    assert run("HO-10", (single_tensor(), None)) == []


def test_ho11_module_left_on_cpu():
    f = gpu_facts(modules_off_device=[ModuleDeviceFacts("encoder.norm", "cpu", "cuda:0", 1024)])
    r = idle(gpu_result(busy=80.0), "host_ops", 20.0)
    r.signals.blocking_copies = [CopySite("cudaMemcpyAsync", "DtoH", "pageable", "aten::_to_copy", "", 5,
                                          5 * 20 * 10**6, 5 * 15 * 10**6, 4096, 0)]
    found = run_all((r, f))
    ho11 = only(found, "HO-11")
    assert "encoder.norm" in ho11.title and abs(ho11.recoverable_pct - 15.0) < 0.1
    assert not [x for x in found if x.id == "HO-3"]  # the copies are the module's, not a second finding


def test_ho11_facts_only_still_warns():
    f = gpu_facts(modules_off_device=[ModuleDeviceFacts("head.ln", "cpu", "cuda:0")])
    got = only(run("HO-11", (None, f)), "HO-11")
    assert got.severity == "warning" and got.confirm


def test_ho11_silent_when_model_is_whole():
    assert run("HO-11", (None, gpu_facts())) == []


def test_ho13_threads_oversubscribe_cpus():
    f = cpu_facts(cpu=CpuFacts(affinity=[0, 1], torch_num_threads=2, local_world_size=2))
    r = cpu_result()
    r.host.phases_ms = {"forward": 30.0, "backward": 50.0, "optimizer": 0.0}
    got = only(run("HO-13", (r, f)), "HO-13")
    assert got.remedy == "threads.affinity" and abs(got.recoverable_ms - 20.0) < 1e-6  # 80 x (1 - 1/2) / 2


def test_ho13_advice_starts_the_job_the_way_the_user_started_it():
    """A job of torch.multiprocessing.spawn, started as `python spawn_ddp.py`, was told to run
    `torchrun --nproc-per-node 2 train.py`: a live run's advice shows its own command; a trace
    (no command) keeps the torchrun template."""
    f = cpu_facts(cpu=CpuFacts(affinity=[0, 1], torch_num_threads=2, local_world_size=2))
    r = cpu_result()
    r.host.phases_ms = {"forward": 30.0, "backward": 50.0, "optimizer": 0.0}
    live = only(run("HO-13", (r, f), job={"command": ["/venv/bin/python", "spawn_ddp.py", "--epochs", "2"]}), "HO-13")
    assert live.fix.snippet.startswith("OMP_NUM_THREADS=1 /venv/bin/python spawn_ddp.py --epochs 2   #")
    trace = only(run("HO-13", (r, f)), "HO-13")
    assert trace.fix.snippet.startswith("OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 train.py   #")


def test_ho13_claims_the_run_delay_its_own_threads_cause_not_the_barrier_time():
    # 100 ms steps: 40 ms on a CPU, 5 ms data wait, 5 ms exposed comm, 20 ms waiting for a core:
    # 30 ms blocked at barriers. Over the run the process used 140% of a core (its training thread
    # 40%, so its pool 100%), the workers 10%, others 10% (busy 160%): the pool's part of the delay
    # is 20 x 100 / 120 ms. The barrier time is reported, not claimed.
    steps = [StepTiming(step=i, total_ms=100.0, forward_ms=30.0, backward_ms=50.0, dataloader_ms=5.0, comm_ms=5.0,
                        thread_cpu_ms=40.0, run_delay_ms=20.0) for i in range(10)]
    cpu = CpuFacts(affinity=[0, 1], torch_num_threads=8, local_world_size=1, main_process_cpu_pct=140.0,
                   dataloader_workers_cpu_pct=10.0, affinity_cpus_busy_pct=160.0)
    got = only(run("HO-13", (None, cpu_facts(cpu=cpu, steps=steps))), "HO-13")
    assert got.recoverable_ms == pytest.approx(20 * 100 / 120, abs=1e-3) and got.confidence == "medium"
    assert got.severity == "warning" and got.remedy == "threads.affinity"
    assert "blocked 30.0 ms more, at barriers" in got.evidence[0].text
    # The same threads on an accelerator: the host loop suffers less, info and unpriced.
    gpu = only(run("HO-13", (None, gpu_facts(cpu=cpu, steps=steps))), "HO-13")
    assert gpu.severity == "info" and gpu.recoverable_ms == 0.0


def test_ho13_counts_processes_that_train_side_by_side_without_torchrun():
    """Hogwild: two torch.multiprocessing children train on the same 2 CPUs with 2 threads each and no
    LOCAL_WORLD_SIZE. Each alone fits its CPUs; together they are 4 threads on 2. The advice (1 thread
    per process) is the value `fix` applies."""
    from torchdoctor.remedies.select import choose

    cpu = CpuFacts(affinity=[0, 1], torch_num_threads=2, local_world_size=None)
    r = cpu_result()
    r.host.phases_ms = {"forward": 30.0, "backward": 50.0, "optimizer": 0.0}
    one = cpu_facts(cpu=cpu)
    assert run("HO-13", (r, one)) == []
    got = only(run("HO-13", (r, one), (r, cpu_facts(cpu=cpu))), "HO-13")
    assert "2 intra-op threads x 2 local rank(s) = 4 threads on 2 CPUs" in got.title
    assert got.evidence[0].values["advised_threads"] == 1 and got.remedy == "threads.affinity"
    (chosen,) = [c for c in choose([got], "numerics") if c.spec.id == "threads.affinity"]
    assert chosen.spec.value == "1"
    # On another host's CPUs the second process competes with nobody here.
    assert run("HO-13", (r, one), (r, cpu_facts(cpu=cpu, hostname="other"))) == []


def test_ho13_silent_when_threads_fit():
    f = cpu_facts(cpu=CpuFacts(affinity=[0, 1], torch_num_threads=1, local_world_size=2))
    assert run("HO-13", (None, f)) == []


def test_ho8_prices_anomaly_mode_from_its_nan_checks_and_stack_recording():
    r = cpu_result()
    r.signals.anomaly_checks = [600, 5 * 12 * MS_NS]  # 12 ms per step of the 5-step window
    steps = [StepTiming(step=i, total_ms=100.0, anomaly_stack_ms=8.0) for i in range(10)]
    got = only(run("HO-8", (r, cpu_facts(backends=BackendFacts(anomaly_detection=True), steps=steps))), "HO-8")
    assert got.recoverable_ms == pytest.approx(20.0) and got.recoverable_pct == pytest.approx(20.0)
    assert got.severity == "critical" and not got.confirm and got.remedy == "debug.off"
    assert got.evidence[-1].values == {"nan_check_ops": 600, "nan_check_ms": 12.0, "stack_ms": 8.0}


def test_ho8_finds_anomaly_mode_in_a_trace_alone():
    r = cpu_result()
    r.signals.anomaly_checks = [600, 5 * 12 * MS_NS]
    got = only(run("HO-8", (r, None)), "HO-8")
    assert got.recoverable_ms == pytest.approx(12.0)
    assert "forward's stack recording" in got.evidence[-1].text  # said unmeasured, not priced


def test_ho3_a_converting_collate_in_the_workers_claims_its_share_of_the_unready_wait():
    # 100 ms steps waiting 30 ms for batches; inside the workers a batch takes 30 ms of reads and
    # 20 ms of a collate that converts 256 elements one by one: 30 x 20/50 = 12 ms is the collate's.
    dl = DataLoaderFacts(num_workers=2, collate_fn="train.pad_collate", worker_pids=[7, 8], worker_batches=40,
                         worker_dataset_ms_mean=30.0, worker_collate_ms_mean=20.0, worker_collate_cpu_ms_mean=19.0,
                         worker_cpu_ms_mean=25.0, worker_collate_syncs_per_batch=256.0)
    f = cpu_facts(dataloaders=[dl], cpu=CpuFacts(affinity=[0, 1, 2, 3], local_world_size=1))
    found = run_all((cpu_result(dataloader_pct=30.0, dataloader_exposed_pct=30.0), f))
    collate = next(x for x in found if x.id == "HO-3" and "collate_fn" in x.title)
    assert collate.recoverable_pct == pytest.approx(12.0, abs=0.01) and collate.severity == "warning"
    assert "train.pad_collate" in collate.title and "workers" in collate.title
    loader = next(x for x in found if x.id == "DL-1")
    assert loader.recoverable_pct == pytest.approx(18.0, abs=0.01)  # the rest of the wait, once
    assert any("in collate_fn train.pad_collate" in e.text and "256 host conversions" in e.text
               for e in loader.evidence)
    # Workers that keep up (no wait): the collate costs CPU, not waiting; HO-3 says nothing of it.
    idle = run_all((cpu_result(dataloader_pct=0.0, dataloader_exposed_pct=0.0), f))
    assert not [x for x in idle if x.id == "HO-3"]


def test_ho9_names_the_torch_optimizer_that_loops_among_several():
    """A rank with a third-party optimizer listed first and a torch SGD(foreach=False): HO-9 spoke of
    neither (it read only the first class, not torch's)."""
    from torchdoctor.facts import OptimizerFacts

    r = gpu_result()
    r.signals.optimizer_classes = ["Lion", "SGD"]
    f = gpu_facts(optimizers=[OptimizerFacts(cls="Lion"), OptimizerFacts(cls="SGD", foreach=False)])
    got = only(run("HO-9", (r, f)), "HO-9")
    assert got.title.startswith("SGD updates parameters one at a time") and got.remedy == "optim.fused"
    # An optimizer that is fused already, whatever its foreach says, is not the one that loops.
    r.signals.optimizer_classes = ["AdamW", "RMSprop"]
    f = gpu_facts(optimizers=[OptimizerFacts(cls="AdamW", fused=True, foreach=False),
                              OptimizerFacts(cls="RMSprop", foreach=False)])
    got = only(run("HO-9", (r, f)), "HO-9")
    assert got.title.startswith("RMSprop updates parameters") and got.remedy == "optim.foreach"
