"""Kernel choice advisors (HW-13..HW-17): the kernels a trace ran against the kernel registry's
family for the device and precision (hardware/kernels.toml, metrics/choice.py).

Each prices the replacement at the registry family's efficiency on the device table's roof (or at
what the rank's own GEMMs reach, when lower): the gain is measured device time minus that time,
scaled by the busy share (`device_bound`) like every gain on kernel time. Findings priced with an
efficiency the registry marks as an assumption are "medium" confidence at most.
"""

from __future__ import annotations

from ..metrics.choice import BACKWARD_TIME
from ..metrics.model import AttentionSite, ChainSite, GemmCandidates
from ._common import NOISE_PCT, View, device_bound, finding, fmt_ms, per_rank
from .engine import DERIVED, RuleInputs, rule
from .ledger import capacity
from .model import Evidence, Finding, Fix

UNFUSED_ATTENTION = ("math", "manual", "unknown")

# The registry's fixes, per hand-written chain.
CHAIN_FIX = {
    "rms_norm": ("Use torch.nn.RMSNorm / F.rms_norm (one fused kernel on recent PyTorch), or torch.compile the "
                 "module: Inductor fuses the chain into one kernel.",
                 "norm = torch.nn.RMSNorm(dim, eps=eps)  # instead of x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w"),
    "layer_norm": ("Use torch.nn.LayerNorm / F.layer_norm: one fused kernel instead of the chain.",
                   "y = torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)"),
    "gelu_tanh": ("Use F.gelu(x, approximate='tanh'): the same function in one kernel.",
                  "y = torch.nn.functional.gelu(x, approximate='tanh')"),
    "gelu_erf": ("Use F.gelu(x): the exact (erf) GELU in one kernel.", "y = torch.nn.functional.gelu(x)"),
    "bias_dropout_add": ("torch.compile the block: Inductor fuses the bias add, dropout and residual add into one "
                         "kernel (eager PyTorch has no fused bias-dropout-add).",
                         "block = torch.compile(block)  # x = residual + dropout(x + bias) becomes one kernel"),
}
CHAIN_LABEL = {"rms_norm": "RMSNorm", "layer_norm": "LayerNorm", "gelu_tanh": "tanh-GELU", "gelu_erf": "GELU",
               "bias_dropout_add": "Bias-dropout-add"}


def _saving(v: View, saved_ns: float) -> float | None:
    """ms per step a replacement saving `saved_ns` of window device time gives back (scaled by the
    busy share), None below the noise floor."""
    gain = max(0.0, v.ms(saved_ns)) * device_bound(v)
    return gain if v.pct(gain) >= NOISE_PCT else None


def _choice(v: View):
    return v.r.choice if v.r is not None and v.has_device_trace else None


# --- HW-13: attention without a fused kernel ------------------------------------------------------

def _attention_measured(s: AttentionSite) -> float:
    """Device ns the site's calls cost over the window: forward, plus the assumed backward."""
    return s.device_ns * (1.0 + (BACKWARD_TIME if s.with_backward else 0.0))


def _unfused(v: View) -> list[AttentionSite]:
    c = _choice(v)
    return [s for s in c.attention if s.path in UNFUSED_ATTENTION and s.expected_ns is not None] if c else []


@capacity("device.busy.attention")
def attention_capacity(v: View) -> float:
    """Device time per step of attention calls no fused kernel ran (HW-13's)."""
    return sum(v.ms(_attention_measured(s)) for s in _unfused(v))


@rule("HW-13", priority=DERIVED - 2,
      budgets=("device.busy.attention", "device.busy.fp32_simt", "device.busy.fusable", "device.busy"))
def unfused_attention(inputs: RuleInputs) -> list[Finding]:
    """Attention on SDPA's math path, or written by hand (matmul, softmax, matmul).

    GPP rule_sdpa_suboptimal; the registry's flash / memory-efficient family for the device and
    dtype (hardware/kernels.toml). Gain: the calls' measured forward device time (x (1 +
    BACKWARD_TIME) with a backward pass) minus the family's time for their FLOPs, scaled by the
    busy share. The claim is split over the budgets the replaced kernels sit in (plain FP32 GEMMs,
    pointwise/reduction, the rest), so HW-1 and CG-1 do not count them again.
    """
    def one(v: View) -> Finding | None:
        sites = _unfused(v)
        if not sites:
            return None
        measured = sum(_attention_measured(s) for s in sites)
        expected = sum(s.expected_ns or 0.0 for s in sites)
        gain = _saving(v, measured - expected)
        if gain is None:
            return None
        top = sites[0]
        what = "is written by hand" if top.path == "manual" else f"runs on SDPA's {top.path} path"
        ev = []
        for s in sites:
            shape = "x".join(str(d) for d in s.q_dims)
            ev.append(Evidence(
                f"{s.calls} attention call(s) {('written by hand' if s.path == 'manual' else 'on the ' + s.path + ' path')}"
                f", q [{shape}] {s.dtype or 'dtype unknown'}, kv length {s.kv_len}, head dim {s.head_dim}"
                f"{', with attn_mask' if s.has_mask else ''}{', causal' if s.is_causal else ''}: "
                f"{fmt_ms(v.ms(s.device_ns))} forward per step"
                + (f" (+{BACKWARD_TIME:.0f}x that assumed for the unfused backward)" if s.with_backward else "")
                + f"; {s.family_note}: {fmt_ms(v.ms(s.expected_ns or 0))} per step. Why no fused kernel: "
                + "; ".join(s.reasons) + ".",
                {"path": s.path, "calls": s.calls, "q_dims": s.q_dims, "dtype": s.dtype, "kv_len": s.kv_len,
                 "head_dim": s.head_dim, "has_mask": s.has_mask, "is_causal": s.is_causal,
                 "forward_ms_per_step": round(v.ms(s.device_ns), 3), "with_backward": s.with_backward,
                 "expected_ms_per_step": round(v.ms(s.expected_ns or 0), 3), "flops": s.flops, "family": s.family,
                 "reasons": s.reasons}))
        fp32 = any(s.precision not in ("fp16", "bf16") for s in sites)
        masked = any(s.has_mask for s in sites)
        manual = any(s.path == "manual" for s in sites)
        steps = []
        if manual:
            steps.append("replace matmul-softmax-matmul with F.scaled_dot_product_attention (for nn.MultiheadAttention: "
                         "pass need_weights=False, which lets it call SDPA)")
        if masked:
            steps.append("pass is_causal=True instead of a causal mask tensor where the mask is causal")
        if fp32:
            steps.append("run attention in bf16 autocast (flash needs fp16/bf16)")
        if not steps:
            steps.append("re-enable the fused SDPA backends (torch.backends.cuda.enable_flash_sdp(True)) and make "
                         "q, k, v contiguous")
        snippet = ("out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
                   "# instead of: softmax((q @ k.transpose(-2, -1)) * scale + mask) @ v")
        text = "; ".join(steps)
        parts = _split(gain, sites)
        return finding(
            v, "HW-13", "hardware",
            f"Attention {what}, without a fused kernel: {fmt_ms(v.ms(measured))} per step; the "
            f"{'flash' if not fp32 else 'memory-efficient'} kernel would take about {fmt_ms(v.ms(expected))}.",
            gain, evidence=ev, fix=Fix(text[0].upper() + text[1:] + ".", snippet),
            confidence="medium",
            confirm="run the same shapes through torch.nn.functional.scaled_dot_product_attention under "
                    "torch.profiler and compare the attention kernels' time",
            source="GPP rule_sdpa_suboptimal; PyTorch SDPA backend rules; kernels.toml attention families",
            budget=parts)
    return per_rank(inputs, one)


def _split(gain: float, sites: list[AttentionSite]) -> dict[str, float]:
    """The gain over the budgets the replaced kernels sit in, in proportion to their device time."""
    total = sum(s.device_ns for s in sites) or 1
    simt = gain * sum(s.simt_ns for s in sites) / total
    fusable = gain * sum(s.fusable_ns for s in sites) / total
    return {"device.busy.fp32_simt": simt, "device.busy.fusable": fusable,
            "device.busy.attention": max(0.0, gain - simt - fusable)}


# --- HW-14: hand-written normalisations and activations ------------------------------------------

def _chains(v: View) -> list[ChainSite]:
    c = _choice(v)
    return [s for s in c.chains if s.expected_ns is not None] if c else []


@rule("HW-14", priority=DERIVED - 1, budgets=("device.busy.fusable",))
def unfused_chains(inputs: RuleInputs) -> list[Finding]:
    """RMSNorm, LayerNorm, GELU or bias-dropout-add written as a chain of pointwise/reduction ops.

    TTG "fuse pointwise operations"; the registry's fused norm / pointwise family. Gain: the
    chains' forward device time minus one fused kernel reading and writing the tensor once at the
    family's share of bandwidth, scaled by the busy share (the backward of such a chain is unfused
    too and not counted). Claims pointwise/reduction time before CG-1 does.
    """
    def one(v: View) -> Finding | None:
        sites = _chains(v)
        if not sites:
            return None
        gain = _saving(v, sum(max(0.0, s.device_ns - (s.expected_ns or 0.0)) for s in sites))
        if gain is None:
            return None
        top = sites[0]
        fix_text, snippet = CHAIN_FIX[top.pattern]
        ev = [Evidence(
            f"{CHAIN_LABEL[s.pattern]} written as {len(s.ops)} ops ({' > '.join(s.ops)}), {s.calls} call(s) on "
            f"{s.dtype or '?'} [{'x'.join(str(d) for d in s.input_dims)}]: {s.kernels_per_call:g} kernels per call, "
            f"{fmt_ms(v.ms(s.device_ns))} per step forward; {s.family_note}: {fmt_ms(v.ms(s.expected_ns or 0))}.",
            {"pattern": s.pattern, "ops": s.ops, "calls": s.calls, "kernels_per_call": s.kernels_per_call,
             "forward_ms_per_step": round(v.ms(s.device_ns), 3),
             "expected_ms_per_step": round(v.ms(s.expected_ns or 0), 3), "bytes": s.nbytes, "family": s.family})
            for s in sites]
        return finding(
            v, "HW-14", "hardware",
            f"{CHAIN_LABEL[top.pattern]} runs as {len(top.ops)} separate ops "
            f"({fmt_ms(v.ms(sum(s.device_ns for s in sites)))} per step); fused kernels would save about "
            f"{fmt_ms(gain)}.", gain, evidence=ev, fix=Fix(fix_text, snippet), confidence="medium",
            confirm="the chain's backward is unfused as well: the saving is larger with a backward pass",
            source="TTG fuse pointwise operations; kernels.toml norm / elementwise families",
            budget="device.busy.fusable")
    return per_rank(inputs, one)


# --- HW-15: a precision the device has no tensor cores for ----------------------------------------

@rule("HW-15", budgets=("device.busy",))
def unsupported_precision(inputs: RuleInputs) -> list[Finding]:
    """bf16 (or TF32) GEMMs on a device without tensor cores for them (bf16 on V100/T4).

    Device table: the precision has no dense peak for the device. cuBLAS runs such GEMMs without
    tensor cores. Gain: their measured time minus fp16 tensor-core GEMMs doing the same FLOPs at the
    registry's efficiency, scaled by the busy share. The fix (fp16 + GradScaler) is a code change.
    """
    def one(v: View) -> Finding | None:
        c = _choice(v)
        u = c.unsupported if c is not None else None
        if u is None or u.expected_ns is None:
            return None
        gain = _saving(v, u.ns - u.expected_ns)
        if gain is None:
            return None
        dev = v.r.choice.device_key if v.r is not None and v.r.choice is not None else "this device"
        return finding(
            v, "HW-15", "hardware",
            f"{u.precision} GEMMs on {dev}, which has no {u.precision} tensor cores: {fmt_ms(v.ms(u.ns))} per step; "
            f"fp16 would take about {fmt_ms(v.ms(u.expected_ns))}.", gain,
            evidence=[_gemm_evidence(v, u, f"{u.precision} GEMMs")],
            fix=Fix(f"Train in fp16 autocast with a GradScaler: {dev} runs fp16 on tensor cores, {u.precision} without.",
                    "scaler = torch.amp.GradScaler()\nwith torch.autocast('cuda', dtype=torch.float16):\n"
                    "    loss = model(x)\nscaler.scale(loss).backward()\nscaler.step(opt)\nscaler.update()"),
            confidence="medium", source="device table (no dense peak for the precision); kernels.toml gemm families",
            budget="device.busy")
    return per_rank(inputs, one)


def _gemm_evidence(v: View, g: GemmCandidates, what: str) -> Evidence:
    shapes = f" Most common M x K x N: {', '.join(g.shapes)}." if g.shapes else ""
    return Evidence(
        f"{g.calls} {what}, {g.flops / max(v.n_steps, 1) / 1e9:.1f} GFLOP and {fmt_ms(v.ms(g.ns))} per step "
        f"({g.flops / g.ns / 1e3 if g.ns else 0:.1f} TFLOP/s achieved); {g.family_note}: "
        f"{fmt_ms(v.ms(g.expected_ns or 0))} per step.{shapes}",
        {"calls": g.calls, "ms_per_step": round(v.ms(g.ns), 3), "gflop_per_step": round(g.flops / max(v.n_steps, 1) / 1e9, 3),
         "expected_ms_per_step": round(v.ms(g.expected_ns or 0), 3), "family": g.family, "efficiency": g.efficiency,
         "target": g.target, "shapes": g.shapes})


# --- HW-16 / HW-17: cheaper GEMM formats (numerics changes) ---------------------------------------

@capacity("device.busy.lowp")
def lowp_capacity(v: View) -> float:
    """Device time per step of the GEMMs FP8 or 2:4 sparsity could run (the larger set)."""
    c = _choice(v)
    if c is None:
        return 0.0
    return max([v.ms(g.ns) for g in (c.fp8, c.sparse24) if g is not None] or [0.0])


def _lowp_finding(v: View, g: GemmCandidates | None, rid: str, title: str, fix: Fix, confidence: str,
                  source: str) -> Finding | None:
    if g is None or g.expected_ns is None:
        return None
    gain = _saving(v, g.ns - g.expected_ns)
    if gain is None:
        return None
    return finding(v, rid, "hardware", title.format(ms=fmt_ms(v.ms(g.ns)), gain=fmt_ms(gain), calls=g.calls),
                   gain, sev="info", evidence=[_gemm_evidence(v, g, f"eligible {g.precision} GEMMs")], fix=fix,
                   confidence=confidence, source=source, budget="device.busy.lowp",
                   confirm="a numerics change: train a few hundred steps both ways and compare the loss curves")


@rule("HW-16", budgets=("device.busy.lowp",))
def fp8_eligible(inputs: RuleInputs) -> list[Finding]:
    """bf16/fp16 GEMMs large enough for FP8 training on a device with FP8 tensor cores.

    kernels.toml gemm_fp8 (min_dim on M, N, K). Gain: their time minus the FP8 family's for the
    same FLOPs. Info: FP8 changes numerics and is a code change (torchao.float8).
    """
    return per_rank(inputs, lambda v: _lowp_finding(
        v, (c := _choice(v)) and c.fp8, "HW-16",
        "{calls} GEMM(s) per window are large enough for FP8 ({ms} per step): FP8 training could save about {gain}.",
        Fix("Train the large linear layers in FP8 with torchao (numerics change: compare loss curves)"
            + _torchao_note(v) + ".",
            "from torchao.float8 import convert_to_float8_training\nconvert_to_float8_training(model)"),
        "low", "kernels.toml gemm_fp8; torchao float8 training"))


def _torchao_note(v: View) -> str:
    """Whether the job's environment has torchao (live runs record it; a trace cannot say)."""
    have = v.f.torchao_version if v.f is not None else None
    if have:
        return f"; torchao {have} is installed in the job's environment"
    if have == "":
        return "; torchao is not installed in the job's environment (pip install torchao)"
    return ""


@rule("HW-17", budgets=("device.busy.lowp",))
def sparse24_eligible(inputs: RuleInputs) -> list[Finding]:
    """Linear-layer GEMMs a 2:4 semi-structured sparse kernel could run (Ampere and later).

    kernels.toml gemm_sparse24 (min_dim, dims multiples of 64). Gain: their time minus the sparse
    family's for the same FLOPs. Info and low confidence: pruning to 2:4 changes the model.
    """
    return per_rank(inputs, lambda v: _lowp_finding(
        v, (c := _choice(v)) and c.sparse24, "HW-17",
        "{calls} linear-layer GEMM(s) fit 2:4 semi-structured sparsity ({ms} per step): sparse kernels could "
        "save about {gain}, if the model tolerates pruning.",
        Fix("Prune the large linear layers to 2:4 and run them with semi-structured sparse kernels "
            "(torchao sparsity; numerics change: the model must be fine-tuned after pruning).",
            "from torchao.sparsity import sparsify_, semi_sparse_weight\nsparsify_(model, semi_sparse_weight())"),
        "low", "kernels.toml gemm_sparse24; torch.sparse semi-structured"))
