"""Compile layer: eager overhead, graph breaks, skipped CUDA graphs, cuDNN autotuning (CG-1, CG-2,
CG-4, CG-5); recompiles and compile time are in compile_cost.py (CG-3, CG-6).

Gains on kernel time are scaled by the busy share (`device_bound`): faster kernels do not
shorten a host-bound step.
"""

from __future__ import annotations

import msgspec

from torchdoctor.callsite import library_of
from torchdoctor.compile.records import RESUME
from torchdoctor.facts import GraphBreakFacts
from torchdoctor.metrics.compiled import gaps_by_break

from ._common import View, device_bound, finding, fmt_ms, per_rank
from .compile_breaks import ADVICE, advice, describe, kind_of
from .engine import RuleInputs, rule
from .ledger import capacity
from .model import Evidence, Finding, Fix

# Inductor fuses chains of pointwise/reduction ops into one kernel and removes their round
# trips to memory; we assume it saves a third of their device time (assumption, not measured).
FUSION_GAIN = 1.0 / 3.0
# CG-1 needs a fusable population: >= 100 pointwise/reduction kernels per step.
MIN_FUSABLE_PER_STEP = 100
# cuDNN autotuning (benchmark=True) picks the fastest algorithm per shape; assume 10% of
# convolution time for static shapes (assumption; the cudnn.benchmark remedy measures it).
CUDNN_BENCHMARK_GAIN = 0.10
MAX_BREAKS_SHOWN = 8


def compiled(v: View) -> bool | None:
    """torch.compile in use (live counters, or compiled regions in the trace); None when unknown."""
    if v.f is not None and v.f.compile.used:
        return True
    if v.r is not None and v.r.compile_regions:
        return True
    if v.f is not None:
        return False
    return False if v.r is not None else None


FUSABLE_KINDS = ("elementwise", "reduction")


def fusion_claim(v: View) -> tuple[float, float, float] | None:
    """(fusable kernels per step, their ms per step, CG-1's gain) when CG-1 prices them, else None.

    HW-4 leaves these kernels' time to CG-1 whenever CG-1 claims it (the ledger's
    ``device.busy.fusable``), so the two never count it twice.
    """
    if v.r is None or compiled(v) or not v.has_device_trace:
        return None
    fusable = fusable_kernels(v)
    count = sum(k.count for k in fusable) / max(v.n_steps, 1)
    if count < MIN_FUSABLE_PER_STEP:
        return None
    dev = v.ms(sum(k.ns for k in fusable))
    gain = dev * FUSION_GAIN * device_bound(v)
    if v.pct(gain) < 0.5:
        return None
    return count, dev, gain


@capacity("device.busy.fusable")
def fusable_capacity(v: View) -> float:
    """Pointwise/reduction kernel time per step (what fusion could shorten)."""
    if v.r is None or not v.has_device_trace:
        return 0.0
    return v.ms(sum(k.ns for k in fusable_kernels(v)))


def fusable_kernels(v: View) -> list:
    """The kernels compiling would fuse: pointwise/reduction kernels that ATen ops launched
    (`kernels.eager_fusable`), else, for a trace without launch correlation, all of those kinds."""
    ks = v.r.kernels
    if ks.eager_fusable is not None:
        return [ks.eager_fusable]
    return [k for k in ks.by_kind if k.kind in FUSABLE_KINDS]


@rule("CG-1", budgets=("device.busy.fusable",))
def eager_pointwise(inputs: RuleInputs) -> list[Finding]:
    """Eager mode with many pointwise/reduction kernels that torch.compile would fuse.

    Trace: no `Torch-Compiled Region` events and >= 100 elementwise/reduction kernels per step
    that ATen ops launched (HTA frequent-sequence candidates, TTG "Fuse operations"; a custom
    extension's own kernels are already fused by hand and compiling leaves them alone). Gain: FUSION_GAIN of their device
    time, scaled by the busy share. Always info: the gain is an assumption and compile is an
    opt-in remedy (it can fail or recompile); warnings are for time measured as wasted.
    """
    def one(v: View) -> Finding | None:
        got = fusion_claim(v)
        if got is None:
            return None
        count, dev, gain = got
        aten = v.r.kernels.eager_fusable is not None
        what = "ATen pointwise/reduction" if aten else "pointwise/reduction"
        how = " (launched innermost by aten:: ops; a custom extension's own kernels left out)" if aten else ""
        return finding(
            v, "CG-1", "compile",
            f"Eager mode runs {count:.0f} {what} kernels per step ({fmt_ms(dev)}); torch.compile "
            f"could fuse them (about {fmt_ms(gain)} per step).",
            gain, sev="info", evidence=[Evidence(f"{count:.0f} {what}{how} kernels per step, {fmt_ms(dev)} of "
                                                 f"device time; no compiled regions; busy share {device_bound(v):.0%}.",
                                     {"kernels_per_step": round(count, 1), "device_ms": round(dev, 3),
                                      "busy_share": round(device_bound(v), 3)})],
            fix=Fix("Compile the model (use mode='reduce-overhead' for small batches, 'max-autotune' for "
                    "GEMM-heavy models).", "model = torch.compile(model)"),
            confidence="low", confirm="`torchdoctor fix --apply compile` measures the gain",
            remedy="compile", source="TTG fuse operations; HTA frequent kernel sequences; assumed 1/3 saved",
            budget="device.busy.fusable")
    return per_rank(inputs, one)


@rule("CG-2")
def graph_breaks(inputs: RuleInputs) -> list[Finding]:
    """Graph breaks inside the compiled step (proposed threshold: any break in the step).

    Live: Dynamo's graph_break counter, and each break with its reason, registry id and the user's
    line (``CompileFacts.breaks``), each shown with the fix of its kind (rules/compile_breaks.py);
    trace: more than one compiled frame per step, which is also what functions compiled apart look
    like (a compiled model and a compiled loss), so a trace alone says both, as an info of low
    confidence; live facts of a job that compiled, counted no break and resumed no function after
    one overrule the trace's frames. Each break's eager
    time per step comes from the profiler window (``eager_gaps``: the gap before its resume function's compiled region). That
    time is host time HO-5 prices, so no gain is claimed here.
    """
    def one(v: View) -> Finding | None:
        breaks = v.f.compile.graph_breaks if v.f is not None else None
        reasons = v.f.compile.graph_break_reasons if v.f is not None else []
        listed = v.f.compile.breaks if v.f is not None else []
        frames = {k.split("/")[0] for k in (v.r.compile_regions if v.r is not None else {})}
        per_step = len(frames) if v.r is not None and v.r.window.steps else 0
        if not breaks and not listed and per_step <= 1:
            return None
        c = v.f.compile if v.f is not None else None
        if breaks == 0 and not listed and c is not None and c.used and not any(
                RESUME.fullmatch(name) for name in c.frame_names.values()):
            # Dynamo compiled, counted no break and resumed no function after one: the trace's compiled frames
            # are functions compiled apart (torchtune compiles each layer and its loss, 2 frames per step).
            return None
        if not breaks and not listed:
            # A trace alone (or facts that saw no compile): several compiled frames per step are breaks or
            # functions compiled apart, which only Dynamo's log tells apart.
            return finding(
                v, "CG-2", "compile",
                f"The step runs {per_step} compiled frames: graph breaks between them, or functions compiled "
                "apart (a model and its loss).", 0.0, sev="info",
                evidence=[Evidence(f"{per_step} compiled frames per step in the trace: {sorted(frames)}; no count "
                                   "of graph breaks from Dynamo.", {"graph_breaks": breaks,
                                                                    "compiled_frames": sorted(frames)})],
                fix=Fix("Run the job with TORCH_LOGS=graph_breaks (or under `torchdoctor run`, which reads Dynamo's "
                        "counters): a break is printed with its reason and line; functions compiled apart print "
                        "nothing and need no change.", "TORCH_LOGS=graph_breaks python train.py ..."),
                confidence="low", confirm="TORCH_LOGS=graph_breaks prints each break with its line",
                source="the trace's Torch-Compiled Region frames; proposed: any break in the step")
        n = breaks if breaks else len(listed)
        evidence = [Evidence(f"{n} graph break(s)" + (f"; reasons: {'; '.join(reasons[:3])}" if reasons and not listed else "")
                             + (f"; compiled frames in the trace: {sorted(frames)}" if frames else "") + ".",
                             {"graph_breaks": breaks, "compiled_frames": sorted(frames)},
                             [{"reason": r} for r in reasons[:5]] if not listed else [])]
        fix = Fix("Remove the data-dependent Python, .item() and unsupported calls named in the reasons; "
                  "fullgraph=True makes each break an error.", "model = torch.compile(model, fullgraph=True)")
        gaps = eager_gaps(v, listed)
        if gaps is not None and not listed:
            evidence.append(Evidence(f"Eager code between compiled regions: {fmt_ms(sum(gaps.values()))} per step.",
                                     {"eager_ms_per_step": round(sum(gaps.values()), 4)}))
        if listed:
            shown = listed[:MAX_BREAKS_SHOWN]
            evidence += [Evidence(describe(b) + (f" Eager time it leaves: {fmt_ms(gaps[i])} per step." if gaps and i in gaps else ""),
                                  {"compiles": b.compiles, "eager_ms_per_step": gaps.get(i) if gaps else None},
                                  [{**msgspec.to_builtins(b), "kind": kind_of(b), "fix": advice(b)[0],
                                    "eager_ms_per_step": gaps.get(i) if gaps else None}]) for i, b in enumerate(shown)]
            # One advice once, with every line it is for (a compiled training step breaks at three).
            at: dict[str, list[str]] = {}
            for b in shown:
                if kind_of(b) != "torch":
                    at.setdefault(advice(b)[0], []).append((b.location or "torch").rsplit("/", 1)[-1])
            steps = {f"{', '.join(dict.fromkeys(where))}: {_sentence(text)}" for text, where in at.items()}
            snippets = dict.fromkeys(advice(b)[1] for b in shown if advice(b)[1] and not b.rewrite)
            rewrites = [b for b in shown if b.rewrite and b.rewrite_ok is not False]
            for b in rewrites:  # the branch rewritten at the user's line: the diff, with its validation
                steps.add(f"{(b.location or '').rsplit('/', 1)[-1]}: rewritten below with torch.where "
                          f"({'validated: ' if b.rewrite_ok else ''}{b.rewrite_check or 'not validated'}).")
            owners = {library_of(b.location.rsplit(":", 1)[0]) for b in listed if b.location and kind_of(b) != "torch"}
            if owners and None not in owners:
                # torchvision's Faster R-CNN broke at 13 lines, all torchvision's: its settings apply, its
                # lines are not the job's to edit.
                names = " and ".join(f"{o}'s" for o in sorted(o for o in owners if o))
                steps.add(f"(Every break is in {names} code, not the job's: the settings apply to it; a change "
                          "to its lines would be the library's to make.)")
            fix = Fix(" ".join(sorted(steps, key=lambda t: (t.startswith("("), t))) or ADVICE["torch"][0],
                      "\n".join([*snippets, *(b.rewrite or "" for b in rewrites)]),
                      language="diff" if rewrites and not snippets else "python")
        return finding(
            v, "CG-2", "compile", (f"torch.compile breaks the graph at {len(listed)} place(s)" if listed else
                                   f"torch.compile breaks the graph {n} time(s)") + ": eager code runs between compiled pieces"
            + (f" ({_sites(listed)})" if listed else "")
            + (f", {fmt_ms(sum(gaps.values()))} per step" if gaps else "") + ".",
            0.0, sev="warning", evidence=evidence, fix=fix,
            confidence="high",
            confirm="TORCH_LOGS=graph_breaks prints each break with its line",
            source="PT dynamo counters, graph_break_reasons and the graph-break registry; proposed: any break in the step")
    return per_rank(inputs, one)


def eager_gaps(v: View, listed: list[GraphBreakFacts]) -> dict[int, float] | None:
    """Eager ms per step each break leaves (metrics.compiled.gaps_by_break), by index in
    ``listed``; with no break listed, every gap under key -1. None when the trace has no gaps."""
    gaps = v.r.compile_gaps_ms if v.r is not None else {}
    if not gaps:
        return None
    if not listed:
        return {-1: sum(gaps.values())}
    return gaps_by_break(gaps, v.f.compile.frame_names if v.f is not None else {}, listed)


def _sentence(text: str) -> str:
    """``text`` ending as a sentence: Dynamo's hints end without a full stop, and the fix joins them."""
    text = text.rstrip()
    if text.endswith((".", "!", "?", ".)", "!)", "?)")):
        return text
    return text.rstrip(",;:") + "."


def _sites(listed: list[GraphBreakFacts]) -> str:
    """The user lines of the breaks, short: "train.py:12, train.py:30"."""
    names = dict.fromkeys(b.location.rsplit("/", 1)[-1] for b in listed if b.location)
    more = len(names) - 4
    return ", ".join(list(names)[:4]) + (f" and {more} more" if more > 0 else "") if names else "inside torch"


@rule("CG-4")
def cudagraph_skips(inputs: RuleInputs) -> list[Finding]:
    """CUDA graphs silently skipped under mode='reduce-overhead' (inductor cudagraph_skips counter).

    Presence warns; the launch overhead they would have removed is priced by HO-2.
    """
    def one(v: View) -> Finding | None:
        n = v.f.compile.cudagraph_skips if v.f is not None else None
        if not n:
            return None
        return finding(
            v, "CG-4", "compile", f"CUDA graphs were skipped {n} time(s): the step runs without them.", 0.0,
            sev="warning", evidence=[Evidence(f"inductor cudagraph_skips counter = {n}.", {"cudagraph_skips": n})],
            fix=Fix("Remove the skip reasons (CPU tensors, input mutation, dynamic shapes); make skips errors "
                    "while fixing them.", "torch._inductor.config.triton.cudagraph_or_error = True"),
            confidence="high", confirm="TORCH_LOGS=cudagraphs prints 'skipping cudagraphs due to ...'",
            remedy="cudagraphs", source="PT inductor cudagraph_utils")
    return per_rank(inputs, one)


@rule("CG-5")
def cudnn_benchmark(inputs: RuleInputs) -> list[Finding]:
    """cuDNN autotuner off for a convolution net (TTG: benchmark=True for static shapes).

    Needs the live flag (cudnn.benchmark=False) and convolutions in the trace. Gain:
    CUDNN_BENCHMARK_GAIN of convolution time, scaled by the busy share.
    """
    def one(v: View) -> Finding | None:
        if v.f is None or v.f.backends.cudnn_benchmark is not False or not v.accel:
            return None
        conv = v.ms(v.r.signals.conv_ns) if v.r is not None and v.r.signals is not None else 0.0
        if v.r is not None and not conv:
            return None
        gain = conv * CUDNN_BENCHMARK_GAIN * device_bound(v)
        return finding(
            v, "CG-5", "compile",
            "cuDNN autotuning is off (cudnn.benchmark=False)"
            + (f" while convolutions take {fmt_ms(conv)} per step." if conv else "."),
            gain, sev=None if conv else "info",
            evidence=[Evidence(f"cudnn.benchmark=False; convolutions {fmt_ms(conv)} per step.", {"conv_ms": round(conv, 3), "cudnn_benchmark": False})],
            fix=Fix("Enable it when input shapes are static (not with highly variable sizes).",
                    "torch.backends.cudnn.benchmark = True"),
            confidence="low", confirm="`torchdoctor fix --apply cudnn.benchmark` measures the gain",
            remedy="cudnn.benchmark", source="TTG cudnn.benchmark; PL Trainer(benchmark)")
    return per_rank(inputs, one)
