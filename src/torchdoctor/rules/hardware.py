"""Hardware layer: precision, layouts, memory and copies (HW-1..HW-7, HW-11).

Gains on kernel time are scaled by the busy share (`device_bound`): faster kernels do not
shorten a host-bound step.
"""

from __future__ import annotations

from ..report.model import Evidence, Finding, Fix
from ._common import View, alloc_idle_ms, device_bound, finding, fmt_ms, per_rank, tops_text, ts_item
from .engine import RuleInputs, rule

# Tensor-core math is several times faster than FP32 SIMT (A100: 156 TF32 vs 19.5 FP32 TFLOP/s;
# V100: 125 FP16 vs 15.7). End to end GEMMs rarely gain that much: we assume they halve.
TENSOR_CORE_GAIN = 0.5
# TBP: peak memory > 90% of device memory → gradient checkpointing / AMP.
MEMORY_FULL = 0.90
# SMD BatchSize: GPU memory below 70% while utilisation is low → a larger batch fits.
MEMORY_ROOM = 0.70
# Device-to-device copies that layout fixes or fusion remove: assume half (assumption).
DTOD_GAIN = 0.5


def capability(v: View) -> float | None:
    cc = None
    if v.r is not None and v.r.signals is not None:
        cc = v.r.signals.compute_capability
    if cc is None and v.f is not None:
        cc = v.f.device.capability
    try:
        return float(cc) if cc else None
    except ValueError:
        return None


@rule("HW-1")
def fp32_math(inputs: RuleInputs) -> list[Finding]:
    """FP32 matmuls/convolutions without tensor cores.

    TBP: compute capability >= 7 with no tensor-core kernels but TC-eligible ops → AMP; TT
    FP32MatMulPattern and PL: Ampere+ with float32_matmul_precision 'highest' → TF32. Trace:
    GEMM/conv time in plain FP32 kernels (sgemm, scudnn...). Gain: TENSOR_CORE_GAIN of it, scaled
    by the busy share. On Ampere+ the fix is a flag (TF32): severity by gain. Before Ampere only
    AMP helps, which changes numerics and code: info.
    """
    def one(v: View) -> Finding | None:
        if not v.accel or (v.r is not None and v.r.device_kind == "rocm"):
            return None
        cc = capability(v)
        s = v.r.signals if v.r is not None else None
        simt = v.ms(s.fp32_simt_ns) if s is not None else 0.0
        b = v.f.backends if v.f is not None else None
        tf32_off = b is not None and (b.cuda_matmul_allow_tf32 is False or b.float32_matmul_precision == "highest")
        amp_off = b is not None and b.autocast_used is False
        traced = v.has_device_trace
        if traced and (v.pct(simt) < 0.5 or v.pct(simt * TENSOR_CORE_GAIN * device_bound(v)) < 0.1):
            return None
        if not traced and not (tf32_off and amp_off and cc and cc >= 8):
            return None
        gain = simt * TENSOR_CORE_GAIN * device_bound(v)
        ampere = cc is not None and cc >= 8
        ev = []
        if s is not None and s.matmul_ns:
            ev.append(Evidence(
                f"{fmt_ms(simt)} per step of GEMM/convolution runs in plain FP32 kernels "
                f"({100 * s.fp32_simt_ns / s.matmul_ns:.0f}% of matmul time; tensor cores: "
                f"{100 * s.tensor_core_ns / s.matmul_ns:.0f}%; compute capability {cc}). Top: "
                f"{tops_text(v, s.fp32_simt_top, width=40)}.",
                {"fp32_ms": round(simt, 3), "compute_capability": cc},
                [ts_item(t.name[:120], t.ns, t.count, t.first_ts_ns, v.n_steps) for t in s.fp32_simt_top]))
        if b is not None:
            ev.append(Evidence("Precision settings of the live run.",
                               {"allow_tf32": b.cuda_matmul_allow_tf32, "float32_matmul_precision": b.float32_matmul_precision,
                                "autocast": b.autocast_used}))
        if ampere:
            fix = Fix("Allow TF32 for FP32 matmuls (numerics change within tolerance), or train in bf16 autocast.",
                      "torch.set_float32_matmul_precision('high')\n"
                      "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)")
            remedy = "precision.tf32"
        else:
            fix = Fix("Train with mixed precision (fp16 autocast + GradScaler): this GPU has no TF32.",
                      "scaler = torch.amp.GradScaler()\nwith torch.autocast('cuda', dtype=torch.float16):\n"
                      "    loss = model(x)\nscaler.scale(loss).backward()")
            remedy = "precision.autocast"
        return finding(
            v, "HW-1", "hardware",
            f"Matmuls and convolutions run in FP32 without tensor cores ({fmt_ms(simt)} per step)"
            + (f"; {'TF32' if ampere else 'mixed precision'} could save about {fmt_ms(gain)}." if traced else "."),
            gain, sev=None if ampere and traced else "info", evidence=ev, fix=fix,
            confidence="medium" if traced else "low",
            confirm="" if traced else "the profiler window of `torchdoctor run` measures the FP32 kernel time",
            remedy=remedy, source="TBP AMP rule; TT FP32MatMulPattern; PL matmul precision; TTG up to 3x")
    return per_rank(inputs, one)


@rule("HW-3")
def channels_last(inputs: RuleInputs) -> list[Finding]:
    """NCHW convolutions: cuDNN converts layouts around them (nchwToNhwc / nhwcToNchw kernels).

    TTG/Composer: channels_last (about 30% on ResNet-50 with AMP). Gain: the conversion kernels'
    time, scaled by the busy share; warning from 5% (ladder).
    """
    def one(v: View) -> Finding | None:
        s = v.r.signals if v.r is not None else None
        if s is None or not s.layout_transpose_count:
            return None
        t = v.ms(s.layout_transpose_ns)
        gain = t * device_bound(v)
        if v.pct(gain) < 0.5:
            return None
        return finding(
            v, "HW-3", "hardware",
            f"cuDNN converts NCHW<->NHWC around convolutions ({s.layout_transpose_count // max(v.n_steps, 1)} "
            f"conversions, {fmt_ms(t)} per step).", gain,
            evidence=[Evidence(f"{s.layout_transpose_count} nchwToNhwc/nhwcToNchw kernels, {fmt_ms(t)} per step.", {"count": s.layout_transpose_count, "ms_per_step": round(t, 3)})],
            fix=Fix("Keep the model and its inputs in channels_last.",
                    "model = model.to(memory_format=torch.channels_last)\nx = x.to(memory_format=torch.channels_last)"),
            confidence="medium", source="TTG channels_last; Composer method card")
    return per_rank(inputs, one)


@rule("HW-5")
def small_batch(inputs: RuleInputs) -> list[Finding]:
    """Batch too small for the device: low utilisation with memory to spare.

    TBP: utilisation < 50% → increase the batch; SMD BatchSize: memory < 70%. Info: the idle time
    is owned by the host/input findings; a larger batch is one more way to shrink it.
    """
    def one(v: View) -> Finding | None:
        if v.f is None or v.r is None or not v.has_device_trace:
            return None
        d = v.f.device
        if not d.total_memory_bytes or not d.max_memory_allocated_bytes:
            return None
        used = d.max_memory_allocated_bytes / d.total_memory_bytes
        if (v.r.metrics.busy_pct or 100) >= 50 or used >= MEMORY_ROOM:
            return None
        return finding(
            v, "HW-5", "hardware",
            f"The device is busy {v.r.metrics.busy_pct:.0f}% of the step with {used:.0%} of its memory used: "
            "a larger batch would give it more work per host step.", 0.0, sev="info",
            evidence=[Evidence(f"Device busy {v.r.metrics.busy_pct:.0f}%, peak memory {used:.0%} of the device.", {"busy_pct": v.r.metrics.busy_pct, "memory_used": round(used, 3)})],
            fix=Fix("Raise the per-device batch (scale the learning rate; watch convergence)."),
            confidence="medium", source="TBP util < 50%; SMD BatchSize 70%")
    return per_rank(inputs, one)


@rule("HW-6")
def memory_full(inputs: RuleInputs) -> list[Finding]:
    """Device memory at capacity or the allocator retrying (TBP > 90% of memory; GPP >= 90%).

    num_alloc_retries > 0 means cudaMalloc failed and the cache was flushed (a device sync).
    No gain claimed: it blocks a larger batch and costs syncs priced elsewhere.
    """
    def one(v: View) -> Finding | None:
        if v.f is None:
            return None
        d = v.f.device
        used = (d.max_memory_allocated_bytes / d.total_memory_bytes
                if d.total_memory_bytes and d.max_memory_allocated_bytes else None)
        retries = d.num_alloc_retries or 0
        if not retries and (used is None or used < MEMORY_FULL):
            return None
        parts = []
        if used is not None and used >= MEMORY_FULL:
            parts.append(f"peak allocation is {used:.0%} of device memory")
        if retries:
            parts.append(f"the allocator retried {retries} time(s) after flushing its cache")
        return finding(
            v, "HW-6", "hardware", "Memory at capacity: " + " and ".join(parts) + ".", 0.0, sev="warning",
            evidence=[Evidence("torch.cuda memory stats: " + "; ".join(parts) + ".", {"peak_fraction": used, "num_alloc_retries": retries})],
            fix=Fix("Reduce activation memory (bf16 autocast, activation checkpointing) or shard (FSDP); "
                    "expandable segments cut fragmentation.",
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "shell"),
            confidence="high", source="TBP memory > 90%; GPP; torch.cuda.memory_stats")
    return per_rank(inputs, one)


@rule("HW-7")
def allocator_churn(inputs: RuleInputs) -> list[Finding]:
    """cudaMalloc/cudaFree inside steady-state steps (proposed: any, after warm-up).

    NeMo PR #9061 measured ~30% overhead from re-allocation at max memory. Gain: host time in
    allocator calls while the device idled (HO-5 yields it).
    """
    def one(v: View) -> Finding | None:
        s = v.r.signals if v.r is not None else None
        if s is None or not s.alloc_calls or v.r is None or not v.r.window.steps or v.r.window.mode != "steady-state":
            return None
        gain = alloc_idle_ms(v)
        return finding(
            v, "HW-7", "hardware",
            f"The caching allocator calls the driver in steady state ({s.alloc_calls} cudaMalloc/cudaFree calls, "
            f"{fmt_ms(v.ms(s.alloc_ns))} per step).", gain,
            evidence=[Evidence(f"{s.alloc_calls} allocator calls in the steady-state window, {fmt_ms(v.ms(s.alloc_ns))} "
                               "per step.", {"calls": s.alloc_calls, "ms_per_step": round(v.ms(s.alloc_ns), 3)})],
            fix=Fix("Let segments grow instead of being re-allocated; with variable shapes run one max-size "
                    "step first.", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "shell"),
            confidence="medium", source="NeMo PR #9061; TTG preallocate; proposed: any after warm-up")
    return per_rank(inputs, one)


@rule("HW-11")
def dtod_copies(inputs: RuleInputs) -> list[Finding]:
    """Memory-bound device-to-device copies (.contiguous(), dtype casts, torch.cat).

    No threshold in tools (catalogue). Gain: DTOD_GAIN of the copy time scaled by the busy share;
    info, since how much of the copying is avoidable is assumed, not measured.
    """
    def one(v: View) -> Finding | None:
        if v.r is None or not v.has_device_trace:
            return None
        rows = [m for m in v.r.kernels.memcpy if m.direction == "DtoD"]
        t = v.ms(sum(m.ns for m in rows))
        gain = t * DTOD_GAIN * device_bound(v)
        if v.pct(gain) < 0.5:
            return None
        nbytes = sum(m.bytes for m in rows)
        return finding(
            v, "HW-11", "hardware",
            f"Device-to-device copies take {fmt_ms(t)} per step ({sum(m.count for m in rows) // max(v.n_steps, 1)} "
            f"copies, {nbytes / max(v.n_steps, 1) / 1e9:.2f} GB per step).", gain, sev="info",
            evidence=[Evidence(f"Memcpy DtoD: {sum(m.count for m in rows)} copies, {nbytes / 1e9:.2f} GB, {fmt_ms(t)} "
                               f"per step; busy share {device_bound(v):.0%}.", {"ms_per_step": round(t, 3), "bytes": nbytes,
                                                              "count": sum(m.count for m in rows)})],
            fix=Fix("Avoid layout and dtype round trips (.contiguous(), .to(dtype), torch.cat in the loop); "
                    "preallocate and write in place, or let torch.compile fuse them."),
            confidence="low", confirm="record_shapes=True / with_stack=True shows which ops issue the copies",
            source="TBP memcpy category; HTA memory bandwidth; assumed half avoidable")
    return per_rank(inputs, one)
