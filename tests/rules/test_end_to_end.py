"""Code-built Kineto traces through the whole path (decode → metrics → signals → rules)."""

from __future__ import annotations

from torchdoctor.session import analyze_paths

from .kineto import Trace

TC_GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x128_32x3_nn_align1>(Params)"
STEP_US = 10_000.0


def gpu_trace(tmp_path, loader_us: float, sync_us: float, name: str) -> str:
    """4 steps: DataLoader wait, one long tensor-core GEMM, then an .item() sync with the device idle."""
    t = Trace(device=True)
    for n in range(4):
        s = n * STEP_US
        t.step(n, s, STEP_US)
        if loader_us:
            t.host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", s, loader_us, cat="user_annotation")
        k0 = s + loader_us
        t.host("aten::mm", k0, 20.0)
        gemm_end = s + STEP_US - sync_us
        t.kernel(TC_GEMM, k0 + 5, k0 + 30, gemm_end - k0 - 30)
        if sync_us:
            t.host("aten::item", gemm_end, sync_us)
            t.host("aten::_local_scalar_dense", gemm_end + 1, sync_us - 2)
            t.kernel("Memcpy DtoH (Device -> Pageable)", gemm_end + 2, s + STEP_US - 30, 2.0,
                     api="cudaMemcpyAsync", api_dur=5.0, cat="gpu_memcpy", nbytes=4)
            t.host("cudaStreamSynchronize", gemm_end + 10, sync_us - 20, cat="cuda_runtime")
    return t.write(tmp_path / f"{name}.json.gz")


def test_input_bound_gpu_job_with_item_sync(tmp_path):
    rep = analyze_paths([gpu_trace(tmp_path, loader_us=3000.0, sync_us=2000.0, name="sick")])
    assert not rep.errors
    by_id = {f.id: f for f in rep.findings}
    assert {"DL-2", "HO-3"} <= set(by_id)
    assert 25 < by_id["DL-2"].recoverable_pct <= 31
    assert 15 < by_id["HO-3"].recoverable_pct <= 21
    assert "_local_scalar_dense" in " ".join(e.text for e in by_id["HO-3"].evidence)
    assert rep.healthy is False


def test_busy_gpu_job_is_healthy(tmp_path):
    rep = analyze_paths([gpu_trace(tmp_path, loader_us=0.0, sync_us=0.0, name="healthy")])
    assert rep.healthy is True and not [f for f in rep.findings if f.severity != "info"]


def test_cpu_only_gloo_job(tmp_path):
    t = Trace(device=False, backend="gloo", world_size=2)
    for n in range(4):
        s = n * STEP_US
        t.step(n, s, STEP_US)
        t.host("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", s, 2000.0, cat="user_annotation")
        t.host("aten::linear", s + 2000, 3000.0)
        t.host("gloo:all_reduce", s + 5000, 5000.0, cat="user_annotation")
    rep = analyze_paths([t.write(tmp_path / "cpu_rank0.json.gz")])
    by_id = {f.id: f for f in rep.findings}
    assert abs(by_id["DL-1"].recoverable_pct - 20.0) < 0.5
    assert by_id["DI-3"].severity == "critical" and "inside collectives" in by_id["DI-3"].title


def test_adamw_foreach_on_a_gpu_trace_is_priced_by_its_kernels(tmp_path):
    """Issue 14's unfused-optimizer advisor, trace only: a busy GPU step whose last 2 ms are
    AdamW's foreach update (Optimizer.step#AdamW.step holding aten::_foreach_* ops, each launching
    one multi_tensor_apply kernel). HO-18 claims the kernels' time x (1 - 7/21) (AdamW's default
    weight decay), low confidence, and says what a trace cannot know."""
    t = Trace(device=True)
    opt_us = 2000.0
    for n in range(4):
        s = n * STEP_US
        t.step(n, s, STEP_US)
        t.host("aten::mm", s + 10, 20.0)
        t.kernel(TC_GEMM, s + 15, s + 40, 4000.0)  # then the device idles until the update: busy about 60%
        o = s + STEP_US - opt_us - 10
        t.host("Optimizer.step#AdamW.step", o - 5, opt_us, cat="user_annotation")
        ops = ["aten::_foreach_mul_", "aten::_foreach_lerp_", "aten::_foreach_mul_", "aten::_foreach_addcmul_",
               "aten::_foreach_sqrt", "aten::_foreach_div_", "aten::_foreach_add_", "aten::_foreach_addcdiv_"]
        each = opt_us / len(ops)
        for i, op in enumerate(ops):
            t.host(op, o + i * each, 10.0)
            t.kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>()",
                     o + i * each + 1, o + i * each + 2, each - 4)
    rep = analyze_paths([t.write(tmp_path / "adamw.json.gz")])
    assert not rep.errors
    (f,) = [f for f in rep.findings if f.id == "HO-18"]
    kernels_ms = 8 * (opt_us / 8 - 4) / 1000  # per step
    busy = rep.ranks[0].metrics["busy_pct"] / 100
    assert 0.5 < busy < 0.7
    assert abs(f.recoverable_ms - kernels_ms * (1 - 7 / 21) * busy) < 0.002
    assert f.confidence == "low" and f.remedy == "optim.fused"
    assert "constructor's default" in f.evidence[0].text and "foreach update" in f.title
