"""Host layer, the optimizer's update: a fused implementation left unused (HO-18).

Adam, AdamW, SGD and Adagrad have a fused update in torch.optim, on CUDA and, since torch 2.4, on
the CPU, but it is never the default: on a CPU torch runs the per-parameter loop, on CUDA the
foreach lists. Scripts written for GPUs often pass ``fused=(device_type == "cuda")`` (nanoGPT,
llm.c), so a CPU run keeps the loop. The update is memory-bound and the unfused paths make one
pass per operation, the fused one a single pass: advice/optimizer.py counts both, and the claim
is the update's time times the share of its memory traffic fused saves.

Measured with `torchdoctor fix --apply optim.fused` (3 ABBA pairs, losses within tolerance) on
this machine's 2 CPUs: karpathy/llm.c's train_gpt2.py (GPT-2 124M, AdamW, fused=False on a CPU)
claimed 13.7% (320.5 ms), measured x1.16 [1.12, 1.19], 13.5% (279.0 ms); timm's train.py (resnet18,
SGD with Nesterov momentum) claimed 9.8%, measured x1.10 [1.08, 1.11], 8.8%. The time is the trace's Optimizer.step ranges (host time on a CPU; on an accelerator,
the device time of what they launched, scaled by the busy share), else the probe's median
optimizer time. Where HO-9 speaks (the per-parameter loop on an accelerator) it advises fused too.
"""

from __future__ import annotations

from ..advice.command import job_command
from ..advice.optimizer import FUSED_CLASSES, fused_saving, library_fix, update_traffic
from ..facts import OptimizerFacts
from ._common import View, device_bound, finding, fmt_ms, per_rank
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

# Below this share of the step the update is not worth a finding.
MIN_PCT = 1.0


# Trace only: classes whose fused CUDA update every torch a trace comes from has (Adam and AdamW
# since torch 2.0), with their constructors' default weight decay (the group's is not in a trace).
TRACE_DEFAULTS = {"Adam": {"weight_decay": 0.0}, "AdamW": {"weight_decay": 0.01}}


def _candidates(v: View) -> list[OptimizerFacts]:
    """The rank's optimizers that could run fused and do not: the live facts say torch has a fused
    update for the class and parameters, and nothing set it (fused not True, no differentiable
    update, which fused cannot do); a GAN's generator and discriminator are two. Without live
    facts, a trace of an accelerator whose Optimizer.step runs Adam's or AdamW's foreach ops."""
    if v.f is not None and v.f.optimizers:
        return [o for o in v.f.optimizers if o.cls in FUSED_CLASSES and o.fused is not True and o.fused_available
                and not o.settings.get("differentiable")]
    s = v.r.signals if v.r is not None else None
    if v.f is None and v.accel and s is not None and s.optimizer_impl == "foreach":
        known = [c for c in s.optimizer_classes if c in TRACE_DEFAULTS]
        if len(known) == len(s.optimizer_classes) == 1:
            return [OptimizerFacts(cls=known[0], foreach=True, settings=dict(TRACE_DEFAULTS[known[0]]))]
    return []


def _on_host(v: View, o: OptimizerFacts) -> bool:
    """Whether the update runs on the CPU: its parameters live there (an optimizer a GPU job keeps
    on the CPU, DeepSpeed-style offload, too), else the rank has no accelerator."""
    return o.param_device == "cpu" if o.param_device else not v.accel


def _share(v: View, o: OptimizerFacts) -> float:
    """The candidate's part of the time every optimizer's step took: its parameters over all the
    optimizers' (an AdamW(fused=True) beside a small Adam([log_alpha]) must not lend it its time).
    Approximate: an update's time follows its parameters, but an Adam's pass costs more than an
    SGD's, and a device optimizer's host time is launches."""
    if v.f is None or len(v.f.optimizers) < 2:
        return 1.0
    if any(not x.num_params for x in v.f.optimizers):
        return 1.0 / len(v.f.optimizers)  # sizes unknown (older facts): an equal part each
    return (o.num_params or 0) / sum(x.num_params or 0 for x in v.f.optimizers)


def _update_ms(v: View, o: OptimizerFacts) -> tuple[float, str] | None:
    """(ms per step of the candidate's update, where it was read): the trace's Optimizer.step ranges
    (the device work they launched for an update on an accelerator), else the probe's median
    optimizer time for one on the CPU; the candidate's share of it (``_share``)."""
    s = v.r.signals if v.r is not None else None
    host = _on_host(v, o)
    share = _share(v, o)
    part = f", {share:.0%} of it by the optimizers' parameters" if share < 1.0 else ""
    if s is not None and not host and s.optimizer_device_ns:
        return (v.ms(s.optimizer_device_ns) * share,
                f"the device time of the kernels Optimizer.step launched (profiler window){part}")
    if s is not None and host and s.optimizer_step_ns:
        return v.ms(s.optimizer_step_ns) * share, f"Optimizer.step's time (profiler window){part}"
    if host and (ms := v.facts_median("optimizer_ms")):
        return ms * share, f"the probe's median optimizer time over the steady steps{part}"
    return None


def _fix(o: OptimizerFacts, rest: list[OptimizerFacts], command: str) -> Fix:
    """For the candidate ``o`` that gains most, through its library's setting where one built it,
    else at its call site; ``rest``: the other candidates, named after it."""
    lib = library_fix(o.created_by, o.cls, command)
    if lib is not None:
        return Fix(f"{lib[0]}: one pass over each parameter's state instead of one per operation. It rounds "
                   "differently from the loop (about 1e-7 relative).", lib[1], lib[2])
    where = f" (created at {o.call_site})" if o.call_site else ""
    text = (f"Pass fused=True to {o.cls}{where}: one pass over each parameter's state instead of one per "
            f"operation. It rounds differently from the loop (about 1e-7 relative).")
    if o.fused is False:
        text += " The code passes fused=False now: scripts written for GPUs often pass fused=(device == 'cuda')."
    if rest:
        sites = [r.call_site for r in rest if r.call_site]
        unnamed = len(rest) - len(sites)
        text += (" The same for " + (f"the optimizer(s) created at {', '.join(sites)}" if sites else "")
                 + (" and " if sites and unnamed else "")
                 + (f"{unnamed} more whose call site was not recorded" if unnamed else "") + ".")
    return Fix(text, f"torch.optim.{o.cls}(params, lr=..., fused=True)")


@rule("HO-18", budgets=("step", "device.busy"))
def unfused_optimizer(inputs: RuleInputs) -> list[Finding]:
    """Adam, AdamW, SGD or Adagrad running their per-parameter or foreach update where torch has a
    fused one for the job's parameters.

    Claim: the update's time per step (``_update_ms``) x ``fused_saving`` (the share of memory
    traffic the fused update saves, advice/optimizer.py), on an accelerator scaled by the busy
    share and claimed from ``device.busy``; on a CPU from ``step``. Medium confidence on a CPU,
    where the model was checked against measured updates; low on an accelerator, not yet measured
    there. Without live facts, a trace of an accelerator whose Optimizer.step runs Adam's or AdamW's
    foreach ops (fused on CUDA since torch 2.0) is priced with the class's default weight decay.
    Silent where HO-9 speaks (its fix is fused already) and where fused saves nothing (SGD
    without momentum moves the same memory either way).
    """
    def priced(v: View, o: OptimizerFacts) -> dict | None:
        """One candidate's update: its implementation, saving, time and gain per step."""
        if o.cls is None:
            return None
        host = _on_host(v, o)
        if not host and o.foreach is False:
            return None  # HO-9's: the per-parameter loop on an accelerator (its fix is fused already)
        impl = "foreach" if o.foreach or (not host and o.foreach is None) else "single_tensor"
        saving = fused_saving(o.cls, o.settings, impl)
        read = _update_ms(v, o)
        if not saving or read is None:
            return None
        scale = 1.0 if host else device_bound(v)
        return {"o": o, "host": host, "impl": impl, "saving": saving, "ms": read[0], "where": read[1],
                "scale": scale, "gain": read[0] * saving * scale}

    def evidence(v: View, c: dict) -> Evidence:
        o, impl, host = c["o"], c["impl"], c["host"]
        unfused, fused = update_traffic(o.cls, o.settings, impl), update_traffic(o.cls, o.settings, "fused")
        words = "per-parameter" if impl == "single_tensor" else impl
        settings = ", ".join(f"{k}={val}" for k, val in sorted(o.settings.items()) if val)
        if v.f is None:
            settings = f"{settings or 'no weight decay'}, its constructor's default: a trace does not record it"
        return Evidence(
            (f"{o.cls} on {o.param_device or 'its device'} with fused={o.fused}, foreach={o.foreach}"
             + (f" (created at {o.call_site})" if o.call_site else "")
             if v.f is not None else f"{o.cls}'s Optimizer.step runs foreach ops (aten::_foreach_*) in the trace")
            + (f" ({settings})" if settings else "") + f"; its update took {fmt_ms(c['ms'])} per step, "
            f"read from {c['where']}. It is memory-bound: the {words} update reads and writes about {unfused} "
            f"parameter-sized tensors per parameter, the fused one {fused}"
            + (f"; scaled by the device's busy share ({c['scale']:.0%})" if not host else "")
            + ("" if v.f is not None else "; complex parameters, or a class of the same name that is not "
               "torch's, would not take fused=True: `torchdoctor fix` finds out") + ".",
            {"optimizer": o.cls, "update_ms": round(c["ms"], 3), "saving": round(c["saving"], 3),
             "traffic_unfused": unfused, "traffic_fused": fused, "fused": o.fused, "foreach": o.foreach,
             "device": o.param_device})

    def one(v: View) -> Finding | None:
        found = [c for o in _candidates(v) if (c := priced(v, o)) is not None and c["gain"] > 0]
        gain = sum(c["gain"] for c in found)
        if not found or v.pct(gain) < MIN_PCT:
            return None
        first = max(found, key=lambda c: c["gain"])
        if len(found) == 1:
            words = "per-parameter" if first["impl"] == "single_tensor" else first["impl"]
            title = (f"{first['o'].cls} runs its {words} update ({fmt_ms(first['ms'])} per step) where torch has a "
                     f"fused one for these parameters: fused=True would save about {first['saving']:.0%} of it.")
        else:
            names = ", ".join(c["o"].cls or "" for c in found)
            title = (f"{len(found)} optimizers ({names}) run unfused updates "
                     f"({fmt_ms(sum(c['ms'] for c in found))} per step together) where torch has fused ones for "
                     f"their parameters: fused=True would save about {fmt_ms(gain)} per step.")
        hosts = {c["host"] for c in found}
        fix = _fix(first["o"], [c["o"] for c in found if c is not first], job_command(inputs.run))
        return finding(
            v, "HO-18", "host", title, gain, evidence=[evidence(v, c) for c in found],
            fix=fix, confidence="medium" if hosts == {True} else "low",
            confirm="`torchdoctor fix --apply optim.fused` measures the gain and checks the losses",
            remedy="optim.fused",
            budget={"step": sum(c["gain"] for c in found if c["host"]),
                    "device.busy": sum(c["gain"] for c in found if not c["host"])},
            source="torch.optim fused implementations (CPU since 2.4); memory traffic of the update, "
                   "advice/optimizer.py")
    return per_rank(inputs, one)
