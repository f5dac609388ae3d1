"""Hardware layer: precision, shapes, SM fill, layouts, memory and copies (HW-1..HW-7, HW-11).

Gains on kernel time are scaled by the busy share (`device_bound`): faster kernels do not
shorten a host-bound step. They claim busy time only, never the idle budget the host/input
rules share (see _common).
"""

from __future__ import annotations

from ._common import (
    WARN_PCT,
    View,
    alloc_idle_ms,
    at,
    device_bound,
    finding,
    fmt_ms,
    per_rank,
    tops_text,
    ts_item,
)
from .compile import FUSABLE_KINDS
from .engine import DERIVED, RuleInputs, rule
from .ledger import capacity
from .model import Evidence, Finding, Fix

# Tensor-core math is several times faster than FP32 SIMT (A100: 156 TF32 vs 19.5 FP32 TFLOP/s;
# V100: 125 FP16 vs 15.7). End to end GEMMs rarely gain that much: we assume they halve.
TENSOR_CORE_GAIN = 0.5
# TBP: peak memory > 90% of device memory → gradient checkpointing / AMP.
MEMORY_FULL = 0.90
# SMD BatchSize: GPU memory below 70% while utilisation is low → a larger batch fits.
MEMORY_ROOM = 0.70
# Device-to-device copies that layout fixes or fusion remove: assume half (assumption).
DTOD_GAIN = 0.5
# fp16/bf16 GEMMs with dims off a multiple of 8: cuBLAS >= 11 still runs them on tensor cores,
# but with narrower (unvectorised) loads and partly empty tiles; cuBLAS < 11 falls back to
# non-tensor-core kernels (several times slower). We assume padding saves a quarter of their
# device time (assumption, not measured: it depends on the library version and the shape).
ALIGN_GAIN = 0.25
# HW-4: the SM-time compute kernels leave empty must reach this share of device busy time
# (proposed; the 5% a cause needs before TBP flags it, applied to busy time).
SM_IDLE_MIN_PCT = WARN_PCT
# Filling the SMs (more work per launch: larger micro-batch, fusion) gives back part of the
# empty SM-time only: small kernels are latency-bound (a few µs whatever their size), so more
# work per launch buys throughput per sample, not a shorter kernel. Assume a quarter (assumption).
UNDERFILL_GAIN = 0.25


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


def fp32_simt_priced(v: View) -> bool:
    """HW-1 prices this rank's plain FP32 GEMM/conv kernel time (from its trace)."""
    if not v.accel or v.r is None or v.r.device_kind == "rocm" or not v.has_device_trace or v.r.signals is None:
        return False
    simt = v.ms(v.r.signals.fp32_simt_ns)
    return v.pct(simt) >= 0.5 and v.pct(simt * TENSOR_CORE_GAIN * device_bound(v)) >= 0.1


@capacity("device.busy.fp32_simt")
def fp32_simt_capacity(v: View) -> float:
    """Plain FP32 GEMM/convolution kernel time per step (HW-1's)."""
    s = v.r.signals if v.r is not None and v.has_device_trace else None
    return v.ms(s.fp32_simt_ns) if s is not None else 0.0


def tensor_core_saving(v: View, simt_ms: float, priced) -> float:
    """ms per step tensor cores save on `simt_ms` of plain FP32 kernels: the part with known FLOPs
    priced by the kernel registry (metrics/choice.py fp32_simt), the rest at TENSOR_CORE_GAIN."""
    if priced is None or priced.expected_ns is None:
        return simt_ms * TENSOR_CORE_GAIN
    known = min(simt_ms, v.ms(priced.ns))
    return max(0.0, known - v.ms(priced.expected_ns)) + (simt_ms - known) * TENSOR_CORE_GAIN


@rule("HW-1", budgets=("device.busy.fp32_simt",))
def fp32_math(inputs: RuleInputs) -> list[Finding]:
    """FP32 matmuls/convolutions without tensor cores.

    TBP: compute capability >= 7 with no tensor-core kernels but TC-eligible ops → AMP; TT
    FP32MatMulPattern and PL: Ampere+ with float32_matmul_precision 'highest' → TF32. Trace:
    GEMM/conv time in plain FP32 kernels (sgemm, scudnn...). Gain: TENSOR_CORE_GAIN of it, scaled
    by the busy share; the kernels with known FLOPs are priced by the kernel registry instead
    (tensor_core_saving). On Ampere+ the fix is a flag (TF32): severity by gain. Before Ampere only
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
        if traced and not fp32_simt_priced(v):
            return None
        if not traced and not (tf32_off and amp_off and cc and cc >= 8):
            return None
        priced = v.r.choice.fp32_simt if v.r is not None and v.r.choice is not None else None
        gain = tensor_core_saving(v, simt, priced) * device_bound(v)
        ampere = cc is not None and cc >= 8
        ev = []
        if priced is not None and priced.expected_ns is not None:
            ev.append(Evidence(
                f"{fmt_ms(v.ms(priced.ns))} of it has known FLOPs ({priced.flops / max(v.n_steps, 1) / 1e9:.1f} GFLOP "
                f"per step): {priced.family_note} would take {fmt_ms(v.ms(priced.expected_ns))}; the rest is "
                f"assumed to halve.", {"priced_ms": round(v.ms(priced.ns), 3),
                                       "expected_ms": round(v.ms(priced.expected_ns), 3),
                                       "target": priced.target, "efficiency": priced.efficiency}))
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
        remedy: str | None
        # TF32 already runs some FP32 GEMMs of this window on tensor cores: the flag is on, and
        # the plain FP32 kernels left are there for their shapes (TF32 tiles need aligned dims).
        tf32_on = ampere and v.r is not None and v.r.choice is not None and v.r.choice.gemm_ns.get("tf32", 0) > 0
        if tf32_on:
            share = 100 * v.r.choice.gemm_ns["tf32"] / max(sum(v.r.choice.gemm_ns.values()), 1)
            fix = Fix(f"TF32 is already on ({share:.0f}% of GEMM time runs FP32 on tensor cores): these GEMMs stay on "
                      "plain FP32 kernels for their shapes. Pad their dims to multiples of 8, or train in bf16 autocast.",
                      "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)")
            remedy = "precision.autocast"
        elif ampere:
            fix = Fix("Allow TF32 for FP32 matmuls (numerics change within tolerance), or train in bf16 autocast.",
                      "torch.set_float32_matmul_precision('high')\n"
                      "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)")
            remedy = "precision.tf32"
        elif cc is not None:
            # Before Ampere there is neither TF32 nor bf16: fp16 needs a GradScaler in the loop, a
            # code change. The automatic autocast remedy is bf16-only (patch_model refuses fp16 and
            # GPUs without bf16), so no remedy is named: advice and `fix` agree.
            fix = Fix("Train with mixed precision (fp16 autocast + GradScaler): this GPU has neither TF32 nor "
                      "bf16. A code change (torchdoctor fix's autocast remedy is bf16-only).",
                      "scaler = torch.amp.GradScaler()\nwith torch.autocast('cuda', dtype=torch.float16):\n"
                      "    loss = model(x)\nscaler.scale(loss).backward()\nscaler.step(opt)\nscaler.update()")
            remedy = None
        else:
            # Compute capability unknown: bf16 autocast is the path the remedy can take; it refuses
            # (and says so) on a GPU without bf16, where fp16 + GradScaler is the code change.
            fix = Fix("Train in bf16 autocast (on a GPU without bf16: fp16 autocast + GradScaler, a code change).",
                      "with torch.autocast('cuda', dtype=torch.bfloat16):\n    loss = model(x)")
            remedy = "precision.autocast"
        return finding(
            v, "HW-1", "hardware",
            f"Matmuls and convolutions run in FP32 without tensor cores ({fmt_ms(simt)} per step"
            + (", TF32 on for the others" if tf32_on else "") + ")"
            + (f"; {'bf16' if tf32_on else 'TF32' if ampere else 'mixed precision'} could save about {fmt_ms(gain)}."
               if traced else "."),
            gain, sev=None if ampere and traced else "info", evidence=ev, fix=fix,
            confidence="medium" if traced else "low",
            confirm="" if traced else "the profiler window of `torchdoctor run` measures the FP32 kernel time",
            remedy=remedy, source="TBP AMP rule; TT FP32MatMulPattern; PL matmul precision; TTG up to 3x",
            budget="device.busy.fp32_simt")
    return per_rank(inputs, one)


@rule("HW-2", budgets=("device.busy",))
def misaligned_gemms(inputs: RuleInputs) -> list[Finding]:
    """fp16/bf16 GEMMs whose dims are not multiples of 8 (tensor-core-unfriendly shapes).

    TT MatMulDimInFP16Pattern: aten::mm/bmm/addmm in fp16/bf16 whose last two dims are not
    multiples of 8; NVIDIA/TTG: "set sizes to multiples of 8". Trace (record_shapes=True): the
    innermost GEMM op of each call (aten::linear -> aten::addmm counts once), its matrices' M, K,
    N (metrics/gemm.py). Gain: ALIGN_GAIN of the device time of the kernels those ops launched
    (their host time when the trace cannot join them), scaled by the busy share; fires from 0.5%
    of the step. Capped at warning: the share padding gives back is assumed. fp32 GEMMs are HW-1's.
    """
    def one(v: View) -> Finding | None:
        s = v.r.signals if v.r is not None else None
        g = s.misaligned_gemms if s is not None else None
        if g is None or not g.count or not v.accel:
            return None
        on_device = g.time_source == "device"
        t = v.ms(g.device_ns if on_device else g.host_ns)
        gain = t * ALIGN_GAIN * device_bound(v)
        if v.pct(gain) < 0.5:
            return None
        dims = sorted({d for site in g.sites for d in site.misaligned}, key="MKN".index)
        per_step = round(g.count / max(v.n_steps, 1))
        items = [ts_item(f"{x.op} {x.shapes}", x.device_ns if on_device else x.host_ns, x.count, x.first_ts_ns,
                         v.n_steps, dtype=x.dtype, dims=x.dims, misaligned=x.misaligned) for x in g.sites[:5]]
        where = "; ".join(
            f"{x.op} {x.shapes} {x.dtype} ({', '.join(f'{d}={x.dims[d]}' for d in x.misaligned)}; {x.count}x, "
            f"{fmt_ms(v.ms(x.device_ns if on_device else x.host_ns))}/step, longest {at(v, x.first_ts_ns)})"
            for x in g.sites[:3])
        time_text = ("of device time in the kernels they launch" if on_device
                     else "of host time in these ops (the trace does not join them to kernels)")
        return finding(
            v, "HW-2", "hardware",
            f"{per_step:.0f} fp16/bf16 matmul{'' if per_step == 1 else 's'} per step ha{'s' if per_step == 1 else 've'} "
            f"{'/'.join(dims)} not a multiple of 8 ({fmt_ms(t)} per step); padding the shapes could save about "
            f"{fmt_ms(gain)}.", gain,
            evidence=[Evidence(
                f"{g.count} of {g.half_gemms} fp16/bf16 GEMM calls in the window have a dimension that is not a "
                f"multiple of 8: {fmt_ms(t)} per step {time_text}. Top: {where}.",
                {"count": g.count, "half_gemms": g.half_gemms, "ms_per_step": round(t, 3),
                 "time_source": g.time_source, "busy_share": round(device_bound(v), 3)}, items)],
            fix=Fix("Pad the dimensions that feed matmuls to multiples of 8 (vocabulary, hidden and "
                    "feed-forward sizes, attention head dims; batch x sequence where you choose them).",
                    "vocab_size = (vocab_size + 7) // 8 * 8   # e.g. 50257 -> 50264: the padded rows are never used\n"
                    "hidden = (hidden + 7) // 8 * 8\n"
                    "model = GPT(vocab_size=vocab_size, n_embd=hidden)"),
            confidence="medium" if on_device else "low", crit=float("inf"),
            confirm="" if on_device else "a trace with the kernels' correlation ids gives their device time",
            source="TT MatMulDimInFP16Pattern; TTG/NVIDIA: sizes in multiples of 8; assumed 1/4 saved",
            budget="device.busy")
    return per_rank(inputs, one)


# After CG-1 and HW-1: it prices the empty SM-time they leave.
@rule("HW-4", priority=DERIVED + 5, budgets=("device.busy",))
def underfilled_kernels(inputs: RuleInputs) -> list[Finding]:
    """Compute kernels too small for the device: fewer blocks than SMs leave SMs empty.

    TBP: `blocks per SM` < 1 means the SMs are not fully used; its est. SM efficiency is
    min(blocks per SM, 1) over kernel time. Trace: SM-time left empty by compute kernels (not
    communication), concurrent kernels counted together (metrics/occupancy.py). Fires when that
    empty SM-time is >= SM_IDLE_MIN_PCT of device busy time (proposed). Gain: UNDERFILL_GAIN of
    it, scaled by the busy share, without the parts other rules price: pointwise/reduction
    kernels when CG-1 prices their fusion, and plain FP32 GEMMs (HW-1); from 0.5% of the step.
    Busy time only: the launch overhead around small kernels is idle time, HO-2's. Capped at
    warning (assumed gain). Low occupancy alone does not fire: tuned GEMMs often run at low
    occupancy by design.
    """
    def one(v: View) -> Finding | None:
        s = v.r.signals if v.r is not None else None
        f = s.sm_fill if s is not None else None
        if f is None or v.r is None or not v.has_device_trace or not f.sm_idle_ns:
            return None
        busy = v.window_ms(v.r.metrics.busy_pct)
        idle = v.ms(f.sm_idle_ns)
        share = 100.0 * idle / busy if busy else 0.0
        if share < SM_IDLE_MIN_PCT:
            return None
        others = []
        elsewhere = 0
        if v.claimed("device.busy.fusable"):
            elsewhere += sum(f.idle_by_kind.get(k, 0) for k in FUSABLE_KINDS)
            others.append("pointwise/reduction kernels are CG-1's (fusion)")
        if v.claimed("device.busy.fp32_simt"):
            elsewhere += f.idle_fp32_simt_ns
            others.append("plain FP32 GEMMs are HW-1's")
        mine = v.ms(max(0, f.sm_idle_ns - elsewhere))
        gain = mine * UNDERFILL_GAIN * device_bound(v)
        if v.pct(gain) < 0.5:
            return None
        under = v.ms(f.underfilled_ns)
        items = [ts_item(k.name[:120], k.ns, k.count, k.first_ts_ns, v.n_steps, kind=k.kind,
                         blocks_per_sm=k.blocks_per_sm, occupancy_pct=k.occupancy_pct,
                         empty_sm_ms_per_step=round(v.ms(k.idle_ns), 3)) for k in f.top]
        top = "; ".join(
            f"{(k.name[:59] + '…') if len(k.name) > 60 else k.name} ({k.blocks_per_sm:.2f} blocks/SM, occupancy "
            f"{'?' if k.occupancy_pct is None else f'{k.occupancy_pct:.0f}%'}, {k.count}x, {fmt_ms(v.ms(k.ns))}/step)"
            for k in f.top[:3])
        split = ", ".join(f"{k} {fmt_ms(v.ms(x))}" for k, x in sorted(f.idle_by_kind.items(), key=lambda kv: -kv[1]))
        return finding(
            v, "HW-4", "hardware",
            f"Kernels too small for the device: compute kernels leave {share:.0f}% of the busy time's SM capacity "
            f"empty ({fmt_ms(idle)} per step; est. SM efficiency {f.sm_efficiency_pct:.0f}%).", gain,
            evidence=[Evidence(
                f"{fmt_ms(under)} per step of compute kernels launch fewer blocks than the device has SMs; "
                f"empty SM-time {fmt_ms(idle)} per step ({share:.1f}% of {fmt_ms(busy)} busy; by kind: {split}). "
                f"Duration-weighted est. achieved occupancy {f.occupancy_pct if f.occupancy_pct is not None else '?'}%. "
                f"Top: {top}. Priced here: {fmt_ms(mine)} per step of it"
                + (f" ({'; '.join(others)})." if others else ".")
                + (f" Fill against {f.sms} SMs: {f.sms_source}." if f.sms else ""),
                {"underfilled_ms": round(under, 3), "sms": f.sms, "sms_source": f.sms_source, "empty_sm_ms": round(idle, 3), "empty_sm_pct_of_busy": round(share, 2),
                 "sm_efficiency_pct": f.sm_efficiency_pct, "occupancy_pct": f.occupancy_pct,
                 "priced_ms": round(mine, 3), "busy_share": round(device_bound(v), 3)}, items)],
            fix=Fix("Give each launch more work: a larger micro-batch (fewer accumulation steps), fuse small "
                    "kernels with torch.compile, and capture launch-bound sequences in CUDA graphs.",
                    "model = torch.compile(model, mode='max-autotune')  # fuses small kernels, CUDA graphs\n"
                    "# or: raise the per-device batch and cut gradient-accumulation steps to match"),
            confidence="low", crit=float("inf"),
            confirm="Nsight Compute's launch statistics (grid size vs SM count) for the kernels listed",
            source="TBP blocks per SM < 1 / est. SM efficiency; proposed 5% of busy; assumed 1/4 recoverable",
            budget="device.busy")
    return per_rank(inputs, one)


@rule("HW-3", budgets=("device.busy",))
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
            confidence="medium", source="TTG channels_last; Composer method card", budget="device.busy")
    return per_rank(inputs, one)


@rule("HW-5")
def small_batch(inputs: RuleInputs) -> list[Finding]:
    """Batch too small for the device: low utilisation with memory to spare.

    TBP: utilisation < 50% → increase the batch; SMD BatchSize: memory < 70%. Info: the idle time
    is owned by the host/input findings; a larger batch is one more way to shrink it.
    """
    def one(v: View) -> Finding | None:
        if v.r is None or not v.has_device_trace:
            return None
        d = v.f.device if v.f is not None else None
        mem = v.r.memory
        if d is not None and d.total_memory_bytes and d.max_memory_allocated_bytes:
            used, where = d.max_memory_allocated_bytes / d.total_memory_bytes, "torch.cuda.max_memory_allocated"
        elif mem is not None and mem.total_memory:
            used, where = mem.peak_allocated / mem.total_memory, "the trace's allocator records"
        else:
            return None
        if (v.r.metrics.busy_pct or 100) >= 50 or used >= MEMORY_ROOM:
            return None
        scale = mem.batch_scale if mem is not None else None
        room = (f" A batch about {scale:.1f}x larger would fit (the per-step allocations, "
                f"{(mem.peak_allocated - mem.floor_allocated) / 2**30:.2f} GiB at peak, grown to 90% of the device)."
                if scale and scale > 1.2 else "")
        return finding(
            v, "HW-5", "hardware",
            f"The device is busy {v.r.metrics.busy_pct:.0f}% of the step with {used:.0%} of its memory used: "
            "a larger batch would give it more work per host step.", 0.0, sev="info",
            evidence=[Evidence(f"Device busy {v.r.metrics.busy_pct:.0f}%, peak memory {used:.0%} of the device "
                               f"({where}).{room}", {"busy_pct": v.r.metrics.busy_pct, "memory_used": round(used, 3),
                                                    "batch_scale": scale})],
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
        d = v.f.device if v.f is not None else None
        mem = v.r.memory if v.r is not None else None
        used = (d.max_memory_allocated_bytes / d.total_memory_bytes
                if d is not None and d.total_memory_bytes and d.max_memory_allocated_bytes else None)
        # The trace's allocator records: the reserved peak (what the driver has handed out) is
        # what runs into the device's limit.
        reserved = mem.peak_reserved / mem.total_memory if mem is not None and mem.total_memory else None
        retries = (d.num_alloc_retries or 0) if d is not None else 0
        if not retries and (used is None or used < MEMORY_FULL) and (reserved is None or reserved < MEMORY_FULL):
            return None
        parts = []
        if used is not None and used >= MEMORY_FULL:
            parts.append(f"peak allocation is {used:.0%} of device memory")
        elif reserved is not None and reserved >= MEMORY_FULL:
            parts.append(f"the allocator's reserved peak is {reserved:.0%} of device memory (tensors "
                         f"{mem.peak_allocated / mem.total_memory:.0%}, in the trace's allocator records)")
        if retries:
            parts.append(f"the allocator retried {retries} time(s) after flushing its cache")
        return finding(
            v, "HW-6", "hardware", "Memory at capacity: " + " and ".join(parts) + ".", 0.0, sev="warning",
            evidence=[Evidence("Memory: " + "; ".join(parts) + ".", {"peak_fraction": used, "reserved_fraction": reserved,
                                                                       "num_alloc_retries": retries})],
            fix=Fix("Reduce activation memory (bf16 autocast, activation checkpointing) or shard (FSDP); "
                    "expandable segments cut fragmentation.",
                    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "shell"),
            confidence="high", source="TBP memory > 90%; GPP; torch.cuda.memory_stats; profile_memory records")
    return per_rank(inputs, one)


@rule("HW-7", budgets=("idle.host",))
def allocator_churn(inputs: RuleInputs) -> list[Finding]:
    """cudaMalloc/cudaFree inside steady-state steps (proposed: any, after warm-up).

    NeMo PR #9061 measured ~30% overhead from re-allocation at max memory. Gain: host time in
    allocator calls while the device idled (HO-5 yields it).
    """
    def one(v: View) -> Finding | None:
        s = v.r.signals if v.r is not None else None
        if s is None or not s.alloc_calls or v.r is None or not v.r.window.steps or not v.r.window.mode.startswith("steady-state"):
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
            confidence="medium", source="NeMo PR #9061; TTG preallocate; proposed: any after warm-up",
            budget="idle.host")
    return per_rank(inputs, one)


@rule("HW-11", budgets=("device.busy",))
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
            source="TBP memcpy category; HTA memory bandwidth; assumed half avoidable", budget="device.busy")
    return per_rank(inputs, one)
