"""Hardware layer, memory traded for time: activation checkpointing recomputes the forward (HW-19).

Checkpointing keeps a segment's inputs instead of its activations and runs the segment's forward
again in the backward pass: memory for time. Where the memory is not needed, that second forward
is pure cost. trl's trainers turn it on by default (``gradient_checkpointing=True`` in every trl
config), Hugging Face and Lightning users switch it on for a large model and keep it for a small
one. Measured on a 2-core CPU: trl's SFT script (a 4-layer Qwen2 with LoRA) claimed 113.7 ms, 23.1% of
the profiled step, and `fix` measured x1.23 [1.16, 1.30], 18.6% of its steps, losses identical; timm's
train.py --grad-checkpointing (resnet18) claimed 20.5%, measured 14.3% [11.7%, 16.8%] and, in a
second `fix`, 20.0% [15.4%, 24.4%].

Measured from the trace (metrics/recompute.py): the host time of the forward work run again in
backward, on an accelerator the device time of what it launched. The claim is that time, scaled
like every kernel-time gain by the device's busy share (a host-bound step does not get shorter by
doing less device work); it is what turning checkpointing off gives back, which `torchdoctor fix
--apply memory.no_checkpoint` measures, with each arm's peak memory. Whether the activations then
fit is the question the finding cannot answer from one run: it shows the peak it knows (the live
facts', else the trace's allocator records) and, when that peak is already above MEMORY_TIGHT of the
device (advice/checkpointing.memory_full), calls the finding "info" and leaves its remedy to an
explicit `--apply`. The title's share is the time run again; the gain column, that time scaled by
the busy share. trl's SFT with use_reentrant=True: 21.2% claimed, x1.29 [1.25, 1.33] measured, 22.3%.
"""

from __future__ import annotations

from ..advice.checkpointing import LANGUAGE, memory_full, turned_on_by
from ..metrics.recompute import COMPILED_FORWARD
from ._common import View, built_by, finding, fmt_ms, per_rank, work_ms
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

# Below this share of the step the recompute is not worth a finding.
MIN_PCT = 3.0
GIB = 2**30


def _memory(v: View) -> tuple[float, float | None] | None:
    """(peak bytes, the device's bytes or None) of this rank's accelerator, from the live facts or
    the trace's allocator records; None where neither recorded a peak."""
    peak = total = None
    if v.f is not None:
        peak, total = v.f.device.max_memory_allocated_bytes, v.f.device.total_memory_bytes
    m = v.r.memory if v.r is not None else None
    if peak is None and m is not None:
        peak = m.peak_allocated
    if total is None and m is not None:
        total = m.total_memory
    return (float(peak), float(total) if total else None) if peak else None


def _op_name(name: str) -> str:
    return "a compiled segment's forward" if name == COMPILED_FORWARD else name.removeprefix("aten::")


def _fix(trainer: str | None, tight: bool, reentrant: bool) -> Fix:
    why = ("Turn activation checkpointing off where the activations fit in memory, or checkpoint fewer layers "
           "(every second block, or only the attention: more memory, less time)")
    if tight:
        why = ("Memory is already close to full, so turning checkpointing off may not fit: checkpoint fewer layers "
               "(every second block, or only the attention) only where the memory allows, or keep it as it is")
    where, change = turned_on_by(trainer)
    own = (" DeepSpeed's and Megatron's own checkpointing (CheckpointFunctionBackward too) is set in their "
           "configuration: DeepSpeed's activation_checkpointing section, Megatron's --recompute-granularity."
           if reentrant and trainer not in ("transformers", "timm") else "")
    return Fix(f"{why}. {where}{own}", change, language=LANGUAGE.get(trainer or "", "python"))


@rule("HW-19", budgets=("device.busy", "step"))
def activation_recompute(inputs: RuleInputs) -> list[Finding]:
    """Activation checkpointing runs part of the forward again in backward, every step."""

    def one(v: View) -> Finding | None:
        rc = v.r.recompute if v.r is not None else None
        if rc is None or not rc.nodes:
            return None
        ms, on_device, gain = work_ms(v, rc.host_ns, rc.device_ns)
        what = "device time of the kernels it launched" if on_device else "host time"
        if v.pct(gain) < MIN_PCT:
            return None
        mem = _memory(v)
        tight = bool(mem and memory_full(*mem))
        per_step = rc.nodes / max(rc.steps, 1)
        kind = ("reentrant checkpoints (CheckpointFunctionBackward)" if rc.reentrant == rc.nodes else
                "non-reentrant checkpoints" if not rc.reentrant else "checkpoints of both kinds")
        # How each node was priced (metrics/recompute.py): reentrant, by same-name nodes, or by what it held.
        ways = [w for n, w in (
            (rc.reentrant, "reentrant nodes less the backward nested in them"),
            (rc.nodes - rc.reentrant - rc.compiled, "built-in nodes less what nodes of the same name take without "
                                                    "forward ops"),
            (rc.compiled, "compiled segments' forwards (CompiledFunction) run inside a backward node, and the "
                          "forward ops beside them: their own time")) if n > 0]
        how = "; ".join(ways)
        ops = ", ".join(_op_name(name) + f" x{n}" for name, n in rc.forward_ops.items())
        memory = ""
        if mem is not None:
            peak, total = mem
            memory = (f" The device's peak was {peak / GIB:.1f} of {total / GIB:.0f} GiB ({100 * peak / total:.0f}%)."
                      if total else f" The device's peak was {peak / GIB:.1f} GiB.")
        title = (f"Activation checkpointing runs the forward of {per_step:g} checkpointed segment(s) again per step: "
                 f"{fmt_ms(ms)} per step ({v.pct(ms):.0f}% of the step) spent computing activations a second time.")
        if rc.batch_norm:
            memory += (f" {rc.batch_norm / max(rc.steps, 1):g} BatchNorm call(s) per step ran again: in training mode "
                       "each updated its running statistics a second time, which turning checkpointing off stops (an "
                       "evaluation then reads other statistics).")
        f = finding(
            v, "HW-19", "hardware", title, gain,
            sev="info" if tight else None,
            budget="device.busy" if on_device else "step",
            evidence=[Evidence(
                f"{rc.nodes} backward node(s) over {max(rc.steps, 1)} step(s) ran forward ops ({kind}); the {what} of "
                f"that work ({how}): {fmt_ms(ms)} per step. Forward ops "
                f"seen again: {ops or 'none recorded'}.{memory}",
                {"segments_per_step": round(per_step, 2), "recompute_ms": round(ms, 3), "measured": what,
                 "reentrant": rc.reentrant, "forward_ops": dict(rc.forward_ops), "batch_norm": rc.batch_norm,
                 **({"peak_bytes": int(mem[0]), "device_bytes": int(mem[1]) if mem[1] else None} if mem else {})})],
            fix=_fix(built_by(v), tight, bool(rc.reentrant)),
            confidence="medium",
            # Near full memory `fix` does not try it by itself: an arm out of memory would end the A/B of every
            # remedy tried with it (remedies/select.py refuses it from the live facts too).
            remedy=None if tight else "memory.no_checkpoint",
            confirm="`torchdoctor fix --apply memory.no_checkpoint` runs the job with torch.utils.checkpoint calling "
                    "each segment directly and prints both arms' step time and peak memory"
                    + (" (alone: memory is close to full)" if tight else ""),
            source="the trace: forward ops inside built-in autograd nodes, compiled forwards inside backward nodes and "
                   "CheckpointFunctionBackward "
                   "(metrics/recompute.py); torch.utils.checkpoint docs (recomputation in backward)")
        return f

    return per_rank(inputs, one)
