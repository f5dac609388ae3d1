"""Hardware layer, copies a matmul makes of its weight (HW-20).

``torch.matmul`` computes a non-contiguous 3-D activation against a weight that needs no gradient as a
batched matmul over the weight copied once per batch row (metrics/weight_copies.py): time in memory
copies, where one ``mm`` over the activation made contiguous does the same product. It costs most
where the weight is large and frozen: the tied output projection of a LoRA fine-tune, whose final
hidden state torchtune's CEWithChunkedOutputLoss splits along the sequence. Measured on torchtune's
``lora_finetune_single_device`` (a 6-layer Qwen2, 151,936-token vocabulary, CPU, bf16): 23.2 s of a
28.8 s step in ``aten::copy_`` inside 16 ``aten::linear`` calls.

The claim is the copies' time (on an accelerator, the device time of the copy kernels, scaled by the
busy share like every kernel-time gain): the contiguous input costs one copy of the activation's
chunk instead, small beside batch x the weight. `torchdoctor fix --apply matmul.contiguous_input`
measures it.
"""

from __future__ import annotations

from ..advice.matmul import TORCHTUNE
from ._common import View, built_by, finding, fmt_ms, per_rank, work_ms
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

MIN_PCT = 3.0  # below this share of the step the copies are not worth a finding

@rule("HW-20", budgets=("device.busy", "step"))
def weight_copies(inputs: RuleInputs) -> list[Finding]:
    """Matmuls that copy their weight for a batched matmul, every call (metrics/weight_copies.py)."""

    def one(v: View) -> Finding | None:
        wc = v.r.weight_copies if v.r is not None else None
        if wc is None or not wc.calls:
            return None
        ms, on_device, gain = work_ms(v, wc.copy_ns, wc.device_ns)
        what = "device time of the copy kernels" if on_device else "host time of aten::copy_"
        if v.pct(gain) < MIN_PCT:
            return None
        per_step = wc.calls / max(wc.steps, 1)
        shapes = "; ".join(f"{dims} x{n}" for dims, n in wc.shapes.items())
        text = ("Give the projection its input as one matrix, so that matmul runs one mm: "
                "F.linear(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1). torch computes a 3-D input whose "
                "leading dimensions are not one row-major block (a chunk along the sequence, even of a batch of one; "
                "a transposed view) against a weight that needs no gradient as a bmm over the weight copied once per "
                "batch row.")
        snippet = ("y = F.linear(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)   "
                   "# before: F.linear(x, w), x a chunk or a transposed view")
        language = "python"
        if built_by(v) == "torchtune":
            text, snippet, language = f"{text} {TORCHTUNE[0]}", TORCHTUNE[1], "yaml"
        return finding(
            v, "HW-20", "hardware",
            f"{per_step:g} matmul(s) per step copy their weight for a batched matmul: {fmt_ms(ms)} per step "
            f"({v.pct(ms):.0f}% of the step) in copies a contiguous input would not make.",
            gain, budget="device.busy" if on_device else "step",
            evidence=[Evidence(
                f"{wc.calls} aten::matmul call(s) over {max(wc.steps, 1)} step(s) ran an aten::bmm and spent "
                f"{100 * wc.copy_ns / max(wc.matmul_ns, 1):.0f}% of their time in aten::copy_; the {what}: "
                f"{fmt_ms(ms)} per step." + (f" Input Dims: {shapes}." if shapes else ""),
                {"calls_per_step": round(per_step, 2), "copy_ms": round(ms, 3), "measured": what,
                 "copy_share": round(wc.copy_ns / max(wc.matmul_ns, 1), 3), "shapes": dict(wc.shapes)})],
            fix=Fix(text, snippet, language=language),
            confidence="medium", remedy="matmul.contiguous_input",
            confirm="`torchdoctor fix --apply matmul.contiguous_input` runs the job with F.linear making such an input "
                    "contiguous and measures both arms",
            source="the trace: aten::copy_ inside aten::matmul calls that ran aten::bmm (metrics/weight_copies.py); "
                   "ATen's matmul folding (LinearAlgebra.cpp)")

    return per_rank(inputs, one)
