"""Compile layer, what compiling cost the job: recompiles explained (CG-3) and compile time (CG-6).

Compiling is a one-off cost of the job, not a per-step loss: these findings claim nothing from
the step's budget. Their cost is priced against the job's wall time since its first training
activity (``RankFacts.train_wall_s``) and carried in ``Finding.job_s``/``job_pct``, so they never
rank above a per-step cause by a share they do not have. Facts come from Dynamo's compilation
metrics (probe/recompiles.py); a trace alone shows compiled variants (``Torch-Compiled Region:
F/N`` with N > 0), which CG-3 reports without a cause.
"""

from __future__ import annotations

import re

from torchdoctor.advice.command import GENERIC as GENERIC_COMMAND
from torchdoctor.advice.command import job_command
from torchdoctor.callsite import library_of
from torchdoctor.compile.guards import below_two, first_line, local_name, pinned
from torchdoctor.compile.records import RESUME
from torchdoctor.facts import CompileFacts, RecompileFacts

from ._common import View, finding, per_rank
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix

# Recompiles of one frame from which CG-3 warns: one recompile is what automatic dynamic shapes
# (and a train/eval switch) cost by design; a second one means the guard keeps failing.
WARN_RECOMPILES = 2
MAX_FRAMES_SHOWN = 5
MAX_VALUES_SHOWN = 8

# kind -> (what changed, in words; what to do)
_KINDS: dict[str, tuple[str, str]] = {
    "size": ("changes size", "Mark the dimension dynamic before the first call, or compile with dynamic=True; "
                             "if the sizes are few, pad or bucket the inputs to them."),
    "stride": ("changes strides (layout)", "Make the input contiguous (x.contiguous()) before the compiled call."),
    "rank": ("changes its number of dimensions", "Give the input one rank (reshape or unsqueeze before the call)."),
    "dtype": ("changes dtype", "Cast the input to one dtype before the compiled call."),
    "requires_grad": ("changes requires_grad", "Call the compiled function with the same requires_grad "
                                               "(or compile training and inference separately)."),
    "device": ("changes device, layout or autocast state", "Keep the input's device and the autocast context the "
                                                          "same around every call."),
    "global_state": ("global state changed (grad mode, autocast, default dtype or thread count)",
                     "Keep grad mode, autocast and torch.set_num_threads fixed around the compiled call; "
                     "compile training and evaluation as separate functions."),
    "value": ("a Python value the code depends on changes",
              "Pass the value as a tensor (torch.tensor(v)) so it is an input, not a constant baked into the graph, "
              "or keep it fixed."),
    "identity": ("a different object (module, function or type) is passed",
                 "Create the object once and reuse it across calls."),
    "length": ("a list or tuple changes length", "Pad it to one length or pass a tensor."),
    "other": ("a guard failed", "TORCH_LOGS=recompiles prints every failing guard; make that input stable."),
}


def _input(tensor: str | None) -> tuple[str, str]:
    """(words, a Python name) for a guarded input: 'x' -> ("input 'x'", "x"); Dynamo names the
    positional arguments of a wrapped module call "args[0]" -> ("argument 0", "arg0")."""
    name = local_name(tensor or "x")
    m = re.fullmatch(r"args\[(\d+)\]", name)
    if m:
        return f"argument {m.group(1)}", f"arg{m.group(1)}"
    usable = re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[(?:\d+|'[^']*')\])*", name)
    return f"input '{name}'", name if usable else "x"  # targets[1]['boxes'] names it in the user's code too


def frame_name(r: RecompileFacts) -> str:
    """The frame in words: a graph break's resume function is the rest of its function."""
    m = RESUME.fullmatch(r.frame)
    return f"{m.group(1)} (after line {m.group(2)})" if m else r.frame


def _values(r: RecompileFacts) -> str:
    values = sorted(r.values, key=int) if all(v.lstrip("-").isdigit() for v in r.values) else r.values
    shown = values[:MAX_VALUES_SHOWN]
    more = len(values) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def describe(r: RecompileFacts) -> str:
    """One sentence: which frame, how often, which input changed how, with the values seen."""
    where = f"{frame_name(r)} ({r.location.rsplit('/', 1)[-1]})" if r.location else frame_name(r)
    subject = _cause(r)
    seen = f" (values seen: {_values(r)})" if r.values and r.kind in ("size", "value") else ""
    cliff = "; it hit the recompile limit and runs in eager from then on" if r.limit_hit else ""
    return (f"{where} recompiled {r.count} time(s): {subject}{seen}{cliff}. "
            f"Failing guard: {r.guard or 'unknown'}.")


def _grad_mode(r: RecompileFacts) -> bool:
    """A recompile because grad mode changed: a forward under no_grad or inference_mode (an
    evaluation) after the training ones, or the other way round."""
    return r.kind == "global_state" and "grad_mode" in r.guard


def _expected(r: RecompileFacts) -> bool:
    """A single grad-mode recompile: an evaluation's graph, compiled once and reused after (Dynamo
    keeps a cache entry for each), no part of how often a frame recompiles."""
    return _grad_mode(r) and r.count <= 1 and not r.limit_hit


def _cause(r: RecompileFacts) -> str:
    """The cause, short: "input 'ids' changes size at dim 1"."""
    if _grad_mode(r):
        return "grad mode changed: a forward under no_grad, an evaluation, compiles a graph of its own"
    what = _KINDS.get(r.kind, _KINDS["other"])[0]
    if r.kind == "value" and r.tensor:
        return f"the Python value {r.tensor} changes"
    if r.tensor:
        zero_one = " (to 0 or 1 on some calls)" if r.kind == "size" and below_two(r.guard) else ""
        return f"{_input(r.tensor)[0]} {what}" + (f" at dim {r.dim}" if r.dim is not None else "") + zero_one
    return what


def fix_for(r: RecompileFacts, command: str = GENERIC_COMMAND) -> tuple[str, str]:
    """(what to do, snippet) for one frame's recompiles, naming the input and dimension; ``command``
    starts the job (advice/command.py)."""
    text = _KINDS.get(r.kind, _KINDS["other"])[1]
    if _expected(r):
        text = ("Expected once: the evaluation's graph is compiled at its first call and reused after; "
                "nothing to change unless it recurs.")
    words, name = _input(r.tensor)
    if r.kind in ("size", "stride") and pinned(r.guard) is not None:
        text = (f"The dimension is dynamic, but the code pins it to one value ({first_line(r.guard)}): an int() of "
                "the size, or a branch on it, specializes it. TORCH_LOGS=+dynamic names the line; keep the size "
                "a tensor expression there.")
        snippet = f"TORCH_LOGS=+dynamic {command}   # logs the line that specializes the size"
    elif r.kind == "size" and below_two(r.guard):
        # torchvision's Faster R-CNN under torch.compile: an image with one box recompiled 4 frames.
        text = ("The dimension is dynamic already, but was 0 or 1 on some calls, and Dynamo compiles sizes 0 and 1 "
                "apart (0/1 specialization): mark it unbacked before the call, or keep it at 2 or more (pad it).")
        snippet = (f"torch._dynamo.decorators.mark_unbacked({name}, {r.dim if r.dim is not None else 0})   "
                   f"# {name}: {words} of {frame_name(r)}, before the call")
    elif r.kind == "size" and (lib := _library(r)):
        # torchvision's Faster R-CNN: box_iou recompiled for every new box count, a function the job never
        # calls itself; mark_dynamic(boxes1, 0) has no line of the job's to go on.
        # One text for every such frame (their sizes are in the evidence), so that the fix names them together.
        text = (f"{lib}'s own code, called from inside {lib}: the job has no line where its input could be marked "
                "dynamic. Compile with dynamic=True, which treats sizes as dynamic from the first compile, or mark "
                "the job's own input that carries this size.")
        if any(v in ("0", "1") for v in r.values):
            text += " Sizes 0 and 1 still compile apart (0/1 specialization)."
        snippet = "model = torch.compile(model, dynamic=True)   # sizes dynamic from the first compile"
    elif r.kind == "size":
        snippet = (f"torch._dynamo.mark_dynamic({name}, {r.dim if r.dim is not None else 0})   "
                   f"# {name}: {words} of {frame_name(r)}, before the call; or torch.compile(..., dynamic=True)")
        if r.values:
            text += f" Sizes seen: {_values(r)}."
    elif r.kind == "value":
        snippet = f"{name} = torch.tensor({name})   # an input of the graph, not a constant guarded on"
    else:
        snippet = ""
    if r.limit_hit:
        text += (" Until then, raising torch._dynamo.config.recompile_limit only delays the cliff; "
                 "torch.compiler.set_stance('fail_on_recompile') in a test catches it early.")
    return text, snippet


def _library(r: RecompileFacts) -> str | None:
    """The installed library whose code the frame is (not torch's, whose frames inline into the caller's)."""
    lib = library_of(r.location.rsplit(":", 1)[0]) if r.location else None
    return lib if lib and lib != "torch" else None


def _job(c: CompileFacts, v: View, seconds: float) -> tuple[float | None, str]:
    """(share of the job's wall time in percent, or None; the phrase that says it)."""
    wall = v.f.train_wall_s if v.f is not None else None
    if not wall or wall <= 0:
        return None, f"{seconds:.1f} s of compiling (the job's wall time is unknown)"
    pct = 100.0 * min(seconds, wall) / wall
    # The wall time runs from the first training activity to the summary: the whole training of a job
    # that ended, the training so far of one still running (or killed before its last summary).
    span = "of training" if v.f is not None and v.f.ended else "so far"
    return pct, f"{seconds:.1f} s of compiling, {pct:.0f}% of the job's {wall:.0f} s {span}"


@rule("CG-3")
def recompiles(inputs: RuleInputs) -> list[Finding]:
    """Recompiles, each frame explained: the failing guard in words and the fix for its kind.

    Live: ``CompileFacts.recompile_frames`` (Dynamo's compilation metrics). A frame that hit
    ``recompile_limit`` runs in eager from then on, silently → critical; WARN_RECOMPILES or more
    recompiles of one frame → warning; a single one (automatic dynamic shapes, train/eval) → info.
    Trace only: compiled variants ``F/N``, N > 0, in the profiler window → info, cause unknown.
    Claims nothing per step: the recompiles' compile seconds are a one-off job cost (``job_s``),
    and a frame back in eager loses what compile gained, which only ``fix`` can measure.
    """
    def one(v: View) -> Finding | None:
        c = v.f.compile if v.f is not None else None
        frames = c.recompile_frames if c is not None else []
        variants = [k for k in (v.r.compile_regions if v.r is not None else {}) if not k.endswith("/0")]
        total = c.recompiles if c is not None and c.recompiles else sum(r.count for r in frames)
        if not total and not any(r.limit_hit for r in frames):
            if not variants:
                return None
            return finding(
                v, "CG-3", "compile", f"The trace runs {len(variants)} recompiled variant(s) of compiled code "
                f"({', '.join(sorted(variants)[:4])}).", 0.0, sev="info",
                evidence=[Evidence(f"Compiled regions with a compile id past /0: {sorted(variants)}.",
                                   {"compiled_variants": sorted(variants)})],
                fix=Fix("Run under `torchdoctor run` (or TORCH_LOGS=recompiles) to see which guard fails."),
                confidence="medium", confirm="TORCH_LOGS=recompiles prints the failing guard",
                source="PT Torch-Compiled Region compile ids")
        limit = [r for r in frames if r.limit_hit]
        per_frame: dict[tuple[str, str | None], int] = {}  # over each frame's causes, an entry each
        for r in frames:
            per_frame[(r.frame, r.location)] = per_frame.get((r.frame, r.location), 0) + (0 if _expected(r) else r.count)
        worst = max(per_frame.values(), default=total)
        sev = "critical" if limit else "warning" if worst >= WARN_RECOMPILES else "info"
        seconds = sum(r.compile_s for r in frames)
        pct, cost = _job(c, v, seconds) if c is not None else (None, "")
        shown = frames[:MAX_FRAMES_SHOWN]
        if limit:
            gave_up = {(r.frame, r.location) for r in limit}
            title = (f"torch.compile gave up on {', '.join(dict.fromkeys(frame_name(r) for r in limit))} after "
                     f"{sum(r.count for r in frames if (r.frame, r.location) in gave_up)} recompile(s): it runs in "
                     "eager from then on")
        else:
            title = f"torch.compile recompiled {total} time(s)"
        if shown:  # each cause once (a frame's several causes, or one cause of several frames)
            causes = list(dict.fromkeys(_cause(r) for r in shown))
            title += f" ({'; '.join(causes[:2])}{'; …' if len(causes) > 2 else ''})"
        title += f"; {cost}." if seconds else "."
        evidence = [Evidence(describe(r), {"recompiles": r.count, "compile_s": r.compile_s, "limit_hit": r.limit_hit},
                             [{"frame": r.frame, "location": r.location, "guard": r.guard, "kind": r.kind,
                               "tensor": r.tensor, "dim": r.dim, "values": r.values}]) for r in shown]
        if not shown and c is not None and c.recompile_reasons:
            evidence.append(Evidence(f"{total} recompile(s); failing guards: {'; '.join(c.recompile_reasons[:3])}.",
                                     {"recompiles": total}, [{"guard": g} for g in c.recompile_reasons[:5]]))
        roots = {r.frame for r in shown if not RESUME.fullmatch(r.frame)}
        by_fix: dict[str, list[str]] = {}
        snippets: dict[str, str] = {}  # the change (the snippet's code) -> the snippet
        for r in shown:
            m = RESUME.fullmatch(r.frame)
            if m and m.group(1) in roots:
                continue  # the rest of a function after a break recompiles with it: its fix covers both
            text, snippet = fix_for(r, job_command(inputs.run))
            names = by_fix.setdefault(text, [])
            if frame_name(r) not in names:  # a frame's causes with one fix: named once
                names.append(frame_name(r))
            code = snippet.split("   #", 1)[0]
            if snippet and code not in snippets:  # one line per change: the same input seen by two frames
                snippets[code] = snippet
        texts = [f"{', '.join(names)}: {text}" for text, names in by_fix.items()]
        f = finding(
            v, "CG-3", "compile", title, 0.0, sev=sev, evidence=evidence,
            fix=Fix(" ".join(texts) or _KINDS["other"][1], "\n".join(snippets.values())),
            confidence="high" if frames else "medium",
            confirm="TORCH_LOGS=recompiles prints every failing guard"
            + ("; `torchdoctor fix --apply compile` measures what eager costs" if limit else ""),
            source="PT recompile_limit (8) and guard-failure reasons; one recompile is automatic dynamic shapes")
        f.job_s, f.job_pct = (round(seconds, 3), round(pct, 1) if pct is not None else None) if seconds else (None, None)
        return f
    return per_rank(inputs, one)


@rule("CG-6")
def compile_time(inputs: RuleInputs) -> list[Finding]:
    """Compile time as a job-level number: seconds, split Dynamo / backend, share of the job.

    Always info: whether compiling pays off depends on how long the job runs after it, which
    `torchdoctor fix --apply compile` measures (break-even steps). Cache hits and misses of the
    FX graph cache are shown (a cold start that should have been warm is for the cache rules).
    """
    def one(v: View) -> Finding | None:
        c = v.f.compile if v.f is not None else None
        if c is None or not c.used or not c.compile_time_s:
            return None
        pct, cost = _job(c, v, c.compile_time_s)
        split = (f"Dynamo {c.dynamo_s:.1f} s, the backend (AOTAutograd, Inductor) {c.backend_s:.1f} s"
                 if c.dynamo_s is not None and c.backend_s is not None else "")
        cache = (f"FX graph cache: {c.cache_hits or 0} hit(s), {c.cache_misses or 0} miss(es)"
                 if c.cache_hits is not None or c.cache_misses is not None else "")
        if c.cache_pack and c.cache_pack.startswith("loaded"):
            cache += f" (warm start: cache pack {c.cache_pack.removeprefix('loaded ')})"
        f = finding(
            v, "CG-6", "compile", f"torch.compile took {cost}" + (f" ({split})" if split else "") + ".", 0.0, sev="info",
            evidence=[Evidence("; ".join(x for x in (f"{c.compile_time_s:.2f} s compiling", split, cache,
                                                     f"{c.unique_graphs} graph(s)" if c.unique_graphs else "") if x) + ".",
                               {"compile_s": c.compile_time_s, "dynamo_s": c.dynamo_s, "backend_s": c.backend_s,
                                "job_s": v.f.train_wall_s if v.f is not None else None, "job_pct": pct,
                                "graphs": c.unique_graphs, "cache_hits": c.cache_hits, "cache_misses": c.cache_misses})],
            fix=Fix("A one-off cost: it pays when the steps after it save more. Keep the compile cache between "
                    "runs (a persistent TORCHINDUCTOR_CACHE_DIR) so later runs start warm.",
                    "export TORCHINDUCTOR_CACHE_DIR=/persistent/inductor-cache", language="shell"),
            confidence="high", confirm="`torchdoctor fix --apply compile` measures the break-even step count",
            source="PT compilation_time_metrics (_compile.compile_inner, call_user_compiler, bw_compiler)")
        f.job_s, f.job_pct = round(c.compile_time_s, 3), (round(pct, 1) if pct is not None else None)
        return f
    return per_rank(inputs, one)
