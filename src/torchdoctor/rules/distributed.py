"""Distributed layer: communication the step waits for (DI-1..DI-14).

The exposed communication of a step (comm kernels with no compute running; host time inside
collectives on a CPU-only trace; DDP's comm minus overlap on a live run) is split in a fixed
order, each rule claiming its share of what the earlier ones left (the ledger's ``comm.exposed``):
DI-5 waiting for a straggler → DI-2 gloo on GPUs → DI-14 degraded NCCL transport →
DI-10 too many small buckets → DI-11e a replicated embedding's gradient → DI-13 buffer
broadcasts → DI-6 all-reduce per micro-batch →
DI-4 poor overlap → DI-11 uncompressed bandwidth-bound all-reduce → DI-3 the rest.
First make the communication cheaper, then hide what is left.
"""

from __future__ import annotations

import functools

import numpy as np

from torchdoctor.advice.framework_settings import framework_fix
from torchdoctor.facts import FSDPFacts, TensorParallelFacts
from torchdoctor.metrics.model import Accumulation
from torchdoctor.metrics.stragglers import StragglerSeries

from ._comm import (
    COMM_CRIT_PCT,
    COMM_WARN_PCT,
    PRIORITY,
    STRAGGLER_WARN_STEPS,
    TML_CRITICAL_STEPS,
    accumulation_room,
    accumulation_within_ms,
    backend,
    big_embedding,
    bucket_counts,
    collective,
    comm_evidence,
    comm_rule,
    cores_full,
    ddp,
    degraded_env,
    dominant_collective,
    effective_backend,
    exposed_comm_ms,
    facts_waits,
    micro_step_comm_ms,
    overlap_text,
    run_stragglers,
    sev_at_least,
    sharding,
)
from ._common import (
    WARN_PCT,
    View,
    built_by,
    checkpoint_saves,
    data_wait_ms,
    finding,
    fmt_ms,
    foreign_load,
    per_rank,
    severity,
    views,
)
from .engine import RuleInputs, rule
from .model import Evidence, Finding, Fix
from .model import Severity as Sev
from .page_faults import fault_counters

# --- advice by how the model is sharded ------------------------------------------------------------

# All-gathers below this many MB are latency-bound (nccl-tests' bandwidth knee is a few MB):
# fully_shard units that small gain from being grouped (proposed threshold).
SMALL_UNIT_MB = 1.0
# A model whose parameters are below this many MB fits on any accelerator many times over with
# its optimizer state: sharding it only adds collectives; replicate it (proposed threshold).
SMALL_MODEL_MB = 100.0
_PREFETCH = ("for i, block in enumerate(model.layers[:-1]):\n"
             "    block.set_modules_to_forward_prefetch([model.layers[i + 1]])\n"
             "    model.layers[i + 1].set_modules_to_backward_prefetch([block])")
_FSDP1 = Fix("FSDP: wrap per transformer block (auto_wrap_policy), prefetch the next unit in backward and "
             "forward, and keep the rate limiter on.",
             "FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}), backward_prefetch=BackwardPrefetch.BACKWARD_PRE,\n"
             "     forward_prefetch=True, limit_all_gathers=True)")


def fsdp2_fix(fs: FSDPFacts | None) -> Fix:
    """FSDP2 advice from what the probe saw of its units: a model too small to shard (replicate
    it), one unit (nothing overlaps), tiny units (latency-bound all-gathers), else explicit
    prefetch; bf16 parameters when none are set and the model is not in 16 bits already."""
    units, med = (fs.units, fs.unit_mb_median) if fs is not None else (None, None)
    total = fs.model_mb if fs is not None else None
    if total is not None and total < SMALL_MODEL_MB:
        text = (f"FSDP2 on a {total:.1f} MB model: parameters, gradients and optimizer state fit on every rank "
                f"many times over, so sharding only adds collectives ({units} all-gathers forward and backward, "
                "reduce-scatters); replicate it: one gradient all-reduce per step, overlapped with backward.")
        snippet = "model = DistributedDataParallel(model)   # instead of fully_shard"
    elif units == 1:
        text = ("FSDP2: the whole model is one fully_shard unit, so its all-gather cannot overlap any compute: "
                "call fully_shard on each transformer block before the root.")
        snippet = "for block in model.layers:\n    fully_shard(block)\nfully_shard(model)"
    elif units and med is not None and med < SMALL_UNIT_MB:
        text = (f"FSDP2: {units} fully_shard units of {med:.2f} MB (median) each: all-gathers this small are "
                f"latency-bound; shard groups of blocks (a few MB or more per unit) instead.")
        snippet = "for group in (model.layers[i:i + k] for i in range(0, len(model.layers), k)):\n    fully_shard(group)"
    else:
        text = ("FSDP2: start each unit's all-gather before it runs: explicit forward and backward prefetch"
                + (f" ({units} units, {med:.1f} MB median)" if units and med is not None else "") + ".")
        snippet = _PREFETCH
    replicate = total is not None and total < SMALL_MODEL_MB
    low = fs is not None and fs.param_dtype in ("bfloat16", "float16")  # built in 16 bits: nothing to halve
    if not replicate and not low and (fs is None or fs.mixed_precision is None
                                      or "param_dtype=None" in fs.mixed_precision):
        text += " bf16 parameters in a MixedPrecisionPolicy halve the all-gather bytes."
        snippet += "\n# fully_shard(module, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))"
    return Fix(text, snippet)


def _fsdp(v: View) -> FSDPFacts | None:
    return next((fs for fs in v.f.fsdp if fs.version == 2), None) if v.f is not None else None


def tensor_parallel_fix(tp: TensorParallelFacts | None, accel: bool) -> Fix:
    """Tensor parallelism's advice: its collectives carry activations inside every parallelized layer,
    forward and backward, so no_sync() or gradient compression do not touch them. A model that fits
    on every rank is better replicated; a large one keeps its TP group inside a node and, with NCCL on
    CUDA, overlaps the collectives with the matmuls (async TP)."""
    mb = tp.model_mb if tp is not None else None
    if mb is not None and mb < SMALL_MODEL_MB:
        layers = f"{tp.layers} parallelized layers" if tp is not None and tp.layers else "each parallelized layer"
        return Fix(f"Tensor parallelism on a {mb:.1f} MB model: {layers} all-reduce or all-gather activations in "
                   "forward and backward, on the critical path, while the model fits on every rank many times "
                   "over: replicate it instead (DDP: one gradient all-reduce per step, overlapped with backward); "
                   "tensor parallelism pays off for layers too large for one device.",
                   "model = DistributedDataParallel(model)   # instead of parallelize_module(model, tp_mesh, plan)")
    if not accel:
        return Fix("Tensor parallelism puts a collective on the critical path of every parallelized layer: keep the "
                   "TP degree as small as memory allows and use the rest of the ranks for data parallelism.",
                   "mesh = init_device_mesh(device, (dp, tp), mesh_dim_names=(\"dp\", \"tp\"))   # smaller tp, larger dp")
    return Fix("Tensor parallelism puts a collective on the critical path of every parallelized layer: keep the TP "
               "group inside one node (NVLink), and let torch.compile overlap the collectives with the matmuls "
               "(async tensor parallelism, NCCL on CUDA).",
               "from torch.distributed._symmetric_memory import enable_symm_mem_for_group\n"
               "torch._inductor.config._micro_pipeline_tp = True\n"
               "enable_symm_mem_for_group(tp_mesh.get_group().group_name)   # then torch.compile(model)\n"
               "# torchtitan: --parallelism.enable_async_tensor_parallel --compile.enable")


def sharded_fix(kind: str | None, v: View) -> Fix | None:
    """The FSDP or tensor-parallel advice for this rank, or None when it does not shard."""
    if kind == "tp":
        return tensor_parallel_fix(v.f.tensor_parallel if v.f is not None else None, v.accel)
    if kind == "fsdp2":
        return fsdp2_fix(_fsdp(v))
    if kind == "fsdp1":
        return _FSDP1
    if kind == "fsdp":
        f = fsdp2_fix(None)
        return Fix(f.text + " (FSDP1: backward_prefetch=BACKWARD_PRE, forward_prefetch=True.)", f.snippet)
    return None


def exposed_fix(kind: str | None, v: View) -> Fix:
    """DI-3's advice: sharding-specific for FSDP (never no_sync() for FSDP2), else DDP's."""
    return sharded_fix(kind, v) or Fix(
        "Overlap and shrink communication: larger per-rank batch or gradient accumulation "
        "with no_sync(), bf16 gradient compression, FSDP/ZeRO sharding for large models.",
        "with model.no_sync():\n    loss.backward()   # accumulate N-1 micro-batches, sync on the last")


def accumulation_fix(kind: str | None, library: str | None = None) -> Fix:
    """DI-6's advice: FSDP2 turns gradient sync off on the module; DDP and FSDP1 use no_sync().
    torchtune's distributed recipes (0.6) accumulate without either and have no setting for it."""
    if kind in ("fsdp2", "fsdp") and library == "torchtune":
        return Fix("Skip the gradient reduce-scatter on all but the last micro-batch. torchtune's distributed "
                   "recipes accumulate without set_requires_gradient_sync and have no setting for it: in your copy "
                   "of the recipe (`tune cp <recipe> my_recipe.py` for a built-in one, then run the copy), turn the "
                   "sync off before each backward but the last.",
                   "# in the copy's training loop, before current_loss.backward():\n"
                   "self._model.set_requires_gradient_sync((idx + 1) % self._gradient_accumulation_steps == 0)")
    if kind in ("fsdp2", "fsdp"):
        return Fix("Skip the gradient reduce-scatter on all but the last micro-batch (FSDP2 has no no_sync()).",
                   "model.set_requires_gradient_sync(is_last_microbatch)\nloss.backward()")
    return Fix("Skip gradient sync on all but the last micro-batch.",
               "ctx = model.no_sync() if (i + 1) % accum else contextlib.nullcontext()\nwith ctx:\n    loss.backward()")


# --- rules -----------------------------------------------------------------------------------------

@rule("DI-3", priority=PRIORITY["DI-3"], budgets=("comm.exposed",))
def exposed_comm(inputs: RuleInputs) -> list[Finding]:
    """Exposed communication (TBP Communication category: > 10% of the step → warning; GPP > 40% high).

    Generic: the gain claimed is only what the specific rules leave that could run under compute
    (backward) — never the whole exposed time, part of which is transfer that has to happen
    somewhere. Severity follows the exposed share when no specific rule explains it, else its own
    remaining gain (the specific findings carry the warning).
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        ex = exposed_comm_ms(v)
        share = v.pct(ex)
        if share < COMM_WARN_PCT and v.pct(ms) < WARN_PCT:
            return None  # below TBP's 10% the umbrella speaks only for a warning-sized gain of its own
        where = "host time inside collectives" if v.r is not None and not v.has_device_trace else "communication"
        others = v.claimed("comm.exposed")
        title = f"Exposed {where}: {fmt_ms(ex)} per step ({share:.0f}%)"
        if others:
            title += f"; the findings above claim {fmt_ms(others)} of it"
        if ms:
            title += f"; {'another ' if others else 'about '}{fmt_ms(ms)} could run under compute"
        elif cores_full(v, inputs):
            title += "; the ranks' threads fill every CPU, so none of it can run under compute"
        # CPU training traced on the host only: time inside a collective mixes transfer with waits
        # for peers descheduled on shared cores, which the trace cannot separate. Without a gain of
        # its own, that is reported, not warned about.
        host_only = v.r is not None and not v.has_device_trace
        return finding(
            v, "DI-3", "distributed", title + ".",
            ms, sev=severity(v.pct(ms)) if others or (host_only and not ms)
            else severity(share, COMM_WARN_PCT, COMM_CRIT_PCT),
            evidence=[comm_evidence(v, budget)],
            fix=exposed_fix(sharding(v), v),
            confidence="low" if host_only else "medium",
            confirm="analyse all ranks' traces together: part of the time inside a collective is waiting for the slowest rank",
            source="TBP communication > 10% of step; GPP comm_dominant 20%/40%")
    return comm_rule(inputs, "DI-3", build)


@rule("DI-4", priority=PRIORITY["DI-4"], budgets=("comm.exposed",))
def poor_overlap_rule(inputs: RuleInputs) -> list[Finding]:
    """Communication not overlapped with compute (all-reduce exposed at the end of backward).

    Threshold (catalogue, proposed): overlap < 50% of comm time while exposed comm matters. Gain:
    the exposed comm (after the earlier shares) that backward compute could hide.
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        if v.pct(ms) < 0.5:
            return None
        lay = v.r.signals.comm if v.r is not None and v.r.signals is not None else None
        ev = [comm_evidence(v, budget)]
        at_end = ""
        if lay is not None and lay.block_ms > 0:
            at_end = (f": {fmt_ms(lay.block_ms)} of it runs in one block starting {lay.block_start_pct:.0f}% into "
                      "the step")
            ev.append(Evidence(f"Densest run of exposed communication: {fmt_ms(lay.block_ms)} over "
                               f"{fmt_ms(lay.block_span_ms)}, starting {lay.block_start_pct}% into the step.",
                               {"block_ms": lay.block_ms, "block_span_ms": lay.block_span_ms,
                                "block_start_pct": lay.block_start_pct, "comm_kernels_per_step": lay.kernels_per_step}))
        d = ddp(v)
        kind = dominant_collective(v)
        if kind in ("all_to_all", "send_recv"):
            what = "the all-to-all/send-recv traffic (model-parallel embeddings)"
            fix = Fix("Pipeline it: start the next batch's input distribution while this batch computes "
                      "(TorchRec TrainPipelineSparseDist), and keep it off the compute stream's critical path.",
                      "pipeline = TrainPipelineSparseDist(model, optimizer, device)\nfor _ in range(n):\n"
                      "    pipeline.progress(dataloader_iter)")
            confidence = "low"
        elif sharding(v) in ("fsdp2", "fsdp1", "fsdp"):
            what = "the parameter all-gathers and gradient reduce-scatters"
            fix = sharded_fix(sharding(v), v) or _FSDP1
            confidence = "medium"
        else:
            what = "the gradient all-reduce"
            fix = _ddp_fix(v, "Let gradients all-reduce while backward runs{where}: avoid find_unused_parameters=True, "
                           "keep the parameter order close to the execution order, and with torch.compile keep DDP's "
                           "graph splitting on (torch._dynamo.config.optimize_ddp=True).",
                           "DDP(model, find_unused_parameters=False, static_graph=True, gradient_as_bucket_view=True)")
            confidence = "medium"
        return finding(
            v, "DI-4", "distributed",
            f"Communication barely overlaps compute ({overlap_text(v)} overlapped){at_end}; "
            f"overlapping {what} could hide about {fmt_ms(ms)} per step.",
            ms, evidence=ev, fix=fix, confidence=confidence,
            confirm="analyse all ranks together: part of a collective's time can be waiting for a late peer",
            remedy="ddp.static_graph" if d is not None else None,
            source="HTA comm/comp overlap; proposed overlap < 50%")
    return comm_rule(inputs, "DI-4", build)


@rule("DI-5", priority=PRIORITY["DI-5"], budgets=("comm.exposed", "step"))
def straggler(inputs: RuleInputs) -> list[Finding]:
    """A straggler: the other ranks wait for one rank inside every collective.

    TML straggler score warn 10% / critical 20% of the step (critical from 20 steps, warning from
    5 here). Evidence, in order of trust: the whole live run's per-step timings of every rank
    (metrics/stragglers.py: who reaches the collectives last, persistently or now and then), else
    the traces' cross-rank blame over their window (the late rank waits least, metrics/ranks.py).
    Gain for a victim: what it waits for the straggler per step. A lead that the straggler's own
    page faults explain (its training thread's extra system time, HO-15's measure) is said and left
    at info: HO-15 claims it and its fix applies to every rank.
    """
    series = run_stragglers(inputs)
    if series is not None and series.straggler is not None:
        # A lead that one phase of the straggler's own work explains is the job's, load or not.
        shared = shared_machine(inputs, series.straggler) if series_cause(series)[0] is None else None
        faults = fault_lead_ms(inputs, series)
        return per_rank(inputs, lambda v: _series_finding(v, series, shared, faults))
    c = inputs.cross
    waits = (c.per_rank if c is not None else [])[:16]

    @functools.cache
    def blame() -> tuple[int | None, str, Evidence | None]:
        """(culprit, cause, shared machine): the same for every victim, so found once."""
        who = c.straggler if c is not None and c.straggler is not None else _facts_straggler(inputs)
        cause = _straggler_cause(inputs, who)
        return who, cause, shared_machine(inputs, who) if not cause else None

    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        if v.pct(ms) < 0.5:
            return None
        culprit, cause, shared = blame()
        # The title says the wait measured; the gain is what the exposed-comm budget grants of it
        # (less when the profiler's slowdown is deducted or earlier rules claimed part of it).
        measured = next((w.excess_wait_ms for w in waits if w.rank == v.rank), ms)
        granted = "" if measured <= ms * 1.05 else f"; {fmt_ms(ms)} of it counted as gain (the exposed-comm budget)"
        return finding(
            v, "DI-5", "distributed",
            f"Rank {culprit} is a straggler: rank {v.rank} waits {fmt_ms(max(ms, measured))} more per step inside "
            "collectives" + (f" ({cause})" if cause else "") + granted + ".",
            ms, warn=10.0 if v.n_steps >= STRAGGLER_WARN_STEPS else 101.0,
            crit=20.0 if v.n_steps >= TML_CRITICAL_STEPS else 101.0,
            sev="info" if shared is not None else None,
            evidence=[Evidence("Collective wait per step by rank: " + ", ".join(
                f"rank {w.rank} {fmt_ms(w.comm_wait_ms)}" for w in waits[:8])
                + f" (over {v.n_steps} step(s)).",
                               {"straggler": culprit},
                               [{"rank": w.rank, "comm_wait_ms": w.comm_wait_ms, "excess_wait_ms": w.excess_wait_ms,
                                 "step_ms": w.step_ms} for w in waits])] + ([shared] if shared else []),
            fix=_straggler_fix(culprit),
            confidence="low" if shared is not None else "medium",
            confirm=SHARED_CONFIRM if shared is not None else "",
            source="TML straggler score 10%/20%; NVRX; HTA potential stragglers")
    return comm_rule(inputs, "DI-5", build)


SHARED_CONFIRM = "the same job on dedicated cores (the machine was shared while it ran)"


def shared_machine(inputs: RuleInputs, who: int | None) -> Evidence | None:
    """Why a straggler verdict is confounded, when other processes held a large share of the CPUs
    the straggler runs on (rules/_common.foreign_load) and no phase of its own work explains its
    lead: the rank that loses CPU time to them is the one that arrives last, whatever the job does.
    The finding then stays at info with low confidence: the lateness is measured, its cause is not
    the job's to fix. (The "other processes" include the launcher and torchdoctor's own trace
    analysis, a few CPU seconds: on a job of a few seconds they look like load, which is why a
    lead one phase explains is never called confounded.)"""
    vs = views(inputs)
    f = next((v.f for v in vs if v.rank == who and v.f is not None), None)
    got = foreign_load(f, vs)
    if got is None:
        return None
    pct, cpus = got
    return Evidence(
        f"Other processes kept {pct:.0f}% of a core busy on the {cpus} CPU(s) rank {who} runs on "
        f"({pct / cpus:.0f}% of their time): on a shared machine the rank that loses CPU time to them arrives "
        "last, whatever the job does. Measure on dedicated cores before acting on this.",
        {"foreign_cpu_pct": round(pct, 1), "cpus": cpus})


# What to do about a straggler whose lead one phase explains (series_cause).
_PHASE_FIX = {
    "dataloader": "Make rank {r}'s input keep up: more DataLoader workers, its data shard on local storage, or "
                  "batches of even cost across ranks.",
    "forward": "Give every rank batches of the same cost (bucket samples by length) and check rank {r}'s device.",
    "optimizer": "Check what rank {r} does in its optimizer step that the others do not (gradient clipping with a "
                 "host sync, logging of norms).",
    "checkpoint": "Save asynchronously (torch.distributed.checkpoint.async_save), or from every rank's shard with "
                  "DCP instead of gathering on rank {r}.",
    "other": "Move rank {r}'s extra work off the step path: log, evaluate and write metrics every N steps, or in a "
             "background thread, and keep host syncs (.item(), .cpu()) out of the loop.",
}


def _straggler_fix(culprit: int | None, phase: str | None = None) -> Fix:
    if phase in _PHASE_FIX:
        return Fix(_PHASE_FIX[phase].format(r=culprit))
    return Fix(f"Find what makes rank {culprit} late: its input pipeline, rank-0-only work (logging, "
               "checkpoints, eval) on the step path, uneven batches (bucket by length), or a slow device.")


# What a straggler's extra own time in each phase means (metrics/stragglers.py lead_by_phase).
_PHASE_CAUSE = {
    "dataloader": "waits {ms} longer for its DataLoader",
    "forward": "spends {ms} longer in its forward",
    "optimizer": "spends {ms} longer in its optimizer step",
    "checkpoint": "blocks {ms} more in checkpoint saves",
    "other": "spends {ms} longer in the loop outside loading, forward, backward and the optimizer "
             "(logging, evaluation, host syncs)",
}
# A phase names the cause when it explains this share of the lead (TML coverage, as _straggler_cause).
CAUSE_COVERAGE = 0.8


def series_cause(s: StragglerSeries) -> tuple[str | None, str]:
    """(phase, words): the phase of its own work that explains CAUSE_COVERAGE of the straggler's
    lead, and the sentence that says so; (None, "") when no phase does."""
    if not s.lead_by_phase or s.lead_ms_mean <= 0:
        return None, ""
    phase, ms = max(s.lead_by_phase.items(), key=lambda kv: kv[1])
    if ms < CAUSE_COVERAGE * s.lead_ms_mean:
        return None, ""
    cause = _PHASE_CAUSE[phase].format(ms=fmt_ms(ms)) + " than the other ranks"
    if phase == "other" and s.forward_unseen:
        cause += " (its forward included: the probe could not time the forward, see the remarks)"
    return phase, f"in those steps rank {s.straggler} " + cause


def fault_lead_ms(inputs: RuleInputs, s: StragglerSeries) -> float | None:
    """How much more system time per step the straggler's training thread spends than the other
    ranks' (median of their medians), when page faults explain CAUSE_COVERAGE of its lead (HO-15's
    measure: the allocator churns on that rank more than on the others); else None."""
    own, others = None, []
    for v in views(inputs):
        counted = fault_counters(v)
        if counted is None:
            continue
        if v.rank == s.straggler:
            own = counted[1]
        else:
            others.append(counted[1])
    if own is None or not others or s.lead_ms_mean <= 0:
        return None
    extra = own - float(np.median(others))
    return extra if extra >= CAUSE_COVERAGE * s.lead_ms_mean else None


def _series_finding(v: View, s: StragglerSeries, shared: Evidence | None = None,
                    faults: float | None = None) -> Finding | None:
    """DI-5 from the whole run's step timings (metrics/stragglers.py), for one victim.

    The run's gain is a share of the run's mean step, claimed as that share of this view's step
    (a profiler window's steps are not the run's). A persistent straggler's wait shows in every
    step, the window's too: claimed from the exposed communication. A transient one's late steps
    are usually outside the window: claimed from the step."""
    who, n = s.straggler, s.steps
    if v.rank == who or not v.step_ms or not s.step_ms_mean:
        return None
    share = s.gain_ms / s.step_ms_mean
    ms = share * v.step_ms
    budget = "comm.exposed" if s.persistent else "step"
    if s.persistent:
        ms = min(ms, v.left(budget))
    if v.pct(ms) < 0.5:
        return None
    if s.persistent:
        how = f"it reaches the collectives last in {s.late_count} of {n} steps"
    else:
        how = (f"it reaches the collectives last in {s.late_count} of {n} steps"
               + (f", every {s.period} steps" if s.period else ""))
    phase, cause = series_cause(s)
    if faults is not None:  # its own page faults make it late: HO-15 prices and fixes them
        cause = (f"in those steps rank {who}'s training thread spends {fmt_ms(faults)} more in system time (page "
                 "faults) than the other ranks' (HO-15)")
    late = ", ".join(str(k) for k in s.late_steps) + (" ..." if s.late_count > len(s.late_steps) else "")
    evidence = [Evidence(
        f"Whole run, {n} steps timed by the probe on every rank: rank {who} arrived last by a median "
        f"{fmt_ms(s.lead_ms_median)} in steps {late}; own time per step (outside the collectives) by rank: "
        + ", ".join(f"rank {r.rank} {fmt_ms(r.own_ms_median)}" for r in s.ranks[:8])
        + (f" ({len(s.ranks) - 8} more)" if len(s.ranks) > 8 else "") + ".",
        {"straggler": who, "persistent": s.persistent, "steps": n, "late_steps": s.late_count,
         "period": s.period, "lead_ms_median": s.lead_ms_median, "gain_ms": s.gain_ms,
         "step_ms_mean": s.step_ms_mean, "lead_by_phase": s.lead_by_phase},
        [{"rank": r.rank, "own_ms_median": r.own_ms_median, "late_steps": r.late_steps,
          "lead_ms_total": r.lead_ms_total} for r in s.ranks[:16]])]
    return finding(
        v, "DI-5", "distributed",
        f"Rank {who} is a {'' if s.persistent else 'transient '}straggler ({how}"
        + (f"; {cause}" if cause else "") + f"): rank {v.rank} waits for it "
        + (f"{fmt_ms(ms)} per step." if s.persistent else
           f"{fmt_ms(s.gain_ms)} per step on average over the run ({100 * share:.0f}% of its time)."),
        ms, budget=budget, warn=10.0 if n >= STRAGGLER_WARN_STEPS else 101.0, crit=20.0 if n >= TML_CRITICAL_STEPS else 101.0,
        sev="info" if shared is not None or faults is not None else None,
        evidence=evidence + ([shared] if shared else []),
        fix=Fix(f"Rank {who}'s allocator returns memory to the kernel and faults it in again: see HO-15 (its fix "
                "applies to every rank).") if faults is not None else _straggler_fix(who, phase),
        confidence="medium" if s.persistent and shared is None else "low",
        confirm=SHARED_CONFIRM if shared is not None else
        "" if s.persistent else "a transient straggler costs only in its late steps: check what runs there",
        source="TML straggler score 10%/20%; NVRX straggler detection over the run's step times")


def _facts_straggler(inputs: RuleInputs) -> int | None:
    fw = facts_waits(inputs)
    return min(fw, key=lambda r: fw[r]) if fw else None


def _straggler_cause(inputs: RuleInputs, culprit: int | None) -> str:
    """Name the straggler's cause when its data wait, or its checkpoint saves, explain >= 80% of
    the gap (TML coverage)."""
    vs = {v.rank: v for v in views(inputs)}
    if culprit not in vs:
        return ""
    waits = {r: data_wait_ms(x) for r, x in vs.items()}
    others = [w for r, w in waits.items() if r != culprit]
    gap = inputs.cross.straggler_lead_ms if inputs.cross is not None and inputs.cross.straggler_lead_ms else 0.0
    if others and gap and waits[culprit] - float(np.median(others)) >= 0.8 * gap:
        return f"rank {culprit} waits {fmt_ms(waits[culprit])} for its DataLoader"
    saves = {r: _per_step(checkpoint_saves(x)) for r, x in vs.items()}
    rest = [ms for r, ms in saves.items() if r != culprit]
    if rest and gap and saves[culprit] - float(np.median(rest)) >= 0.8 * gap:
        return f"rank {culprit} blocks {fmt_ms(saves[culprit])} per step in checkpoint saves"
    return ""


def _per_step(got: tuple[int, float, int]) -> float:
    """Checkpoint ms per recorded step (DI-15's amortised cost) from ``checkpoint_saves``."""
    _, blocked, steps = got
    return blocked / steps if steps else 0.0


@rule("DI-2", priority=PRIORITY["DI-2"], budgets=("comm.exposed",))
def gloo_on_gpu(inputs: RuleInputs) -> list[Finding]:
    """gloo backend for accelerator training (TBP: NCCL is "the fastest and highly recommended").

    Presence warns; gain: half of the exposed comm (gloo stages device tensors through the host).
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        if not (v.accel and backend(v) == "gloo"):
            return None
        return finding(
            v, "DI-2", "distributed", "Training on an accelerator uses the gloo backend instead of NCCL.",
            ms, sev=sev_at_least(v, ms, "warning"), evidence=[comm_evidence(v, budget)],
            fix=Fix("Initialise the process group with NCCL (RCCL on ROCm).",
                    "torch.distributed.init_process_group(backend='nccl')"),
            confidence="high", source="TBP DDP without NCCL; torchrun docs")
    return comm_rule(inputs, "DI-2", build)


@rule("DI-14", priority=PRIORITY["DI-14"], budgets=("comm.exposed",))
def nccl_env(inputs: RuleInputs) -> list[Finding]:
    """NCCL transports disabled or forced by environment (NCCL env docs: these are debugging knobs).

    NCCL_P2P_DISABLE / NCCL_SHM_DISABLE / NCCL_IB_DISABLE / NCCL_P2P_LEVEL=LOC push traffic onto
    slower paths: warns on presence with NCCL; gain = half the exposed comm (see
    DEGRADED_TRANSPORT_GAIN). With gloo they change nothing: info. IB on a single node: info.
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        off, forced = degraded_env(v)
        if not off and not forced:
            return None
        be = effective_backend(v)
        single_node = v.f is not None and v.f.cpu.local_world_size is not None and \
            v.f.world_size <= v.f.cpu.local_world_size
        relevant = [e for e in off if not (single_node and e.startswith("NCCL_IB_DISABLE"))]
        if be != "nccl" or not relevant:
            sev: Sev = "info"
        else:
            sev = sev_at_least(v, ms, "warning")
        note = "" if be == "nccl" else f" (no effect on the {be or 'current'} backend, but NCCL runs will pay)"
        return finding(
            v, "DI-14", "distributed",
            f"NCCL is forced onto slower paths by the environment: {', '.join(off + forced)}{note}.",
            ms if be == "nccl" else 0.0, sev=sev,
            evidence=[Evidence(f"Environment of the live run: {', '.join(off + forced)}; backend {be}; "
                               f"{'single node' if single_node else 'multi-node or unknown'}.",
                               {"env": off + forced, "backend": be,
                                                                  "single_node": single_node}),
                      comm_evidence(v, budget)],
            fix=Fix("Unset them (NCCL picks NVLink/P2P, shared memory and InfiniBand itself); run once with "
                    "NCCL_DEBUG=INFO to confirm the transports ('via P2P/IPC', 'via NET/IB').",
                    "unset " + " ".join(sorted({e.split('=')[0] for e in off + forced})), "shell"),
            confidence="high" if relevant and be == "nccl" else "medium",
            confirm="NCCL_DEBUG=INFO shows the transport each channel uses",
            source="NCCL env docs (debugging variables); DS comms busbw")
    return comm_rule(inputs, "DI-14", build)


@rule("DI-10", priority=PRIORITY["DI-10"], budgets=("comm.exposed",))
def bucket_size(inputs: RuleInputs) -> list[Finding]:
    """Gradient buckets too small: many latency-bound all-reduces per step.

    Live: bucket_cap_mb below DDP's default 25 MiB with more buckets than the default would make.
    Trace: >= 50 all-reduces per step averaging < 0.5 ms (proposed). Gain: the per-call latency
    of the surplus buckets, LATENCY_SHARE of their time.
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        b = bucket_counts(v)
        if b is None or v.pct(ms) < 0.5 and ddp(v) is None:
            return None
        n_now, n_ideal, src = b
        return finding(
            v, "DI-10", "distributed",
            f"{n_now} gradient all-reduces per step ({src}); with 25 MiB buckets about {n_ideal} would do, "
            f"saving about {fmt_ms(ms)} of per-call latency.",
            ms, evidence=[comm_evidence(v, budget),
                          Evidence(f"{n_now} buckets per step now, about {n_ideal} with the default 25 MiB cap "
                                   f"(+ the 1 MiB first bucket); source: {src}.",
                                   {"buckets_now": n_now, "buckets_default_cap": n_ideal, "source": src})],
            fix=_ddp_fix(v, "Use larger buckets{where} (the default 25 MiB, or 50-100 MiB on fast links).",
                         "DDP(model, bucket_cap_mb=25)"),
            confidence="medium" if src != "trace" else "low", remedy="ddp.bucket_cap",
            confirm="" if src != "trace" else "`torchdoctor fix --apply ddp.bucket_cap` measures it",
            source="PT DDP default 25 MiB; DS autotuner bucket sweep; proposed latency share")
    return comm_rule(inputs, "DI-10", build)


@rule("DI-13", priority=PRIORITY["DI-13"], budgets=("comm.exposed",))
def buffer_broadcast(inputs: RuleInputs) -> list[Finding]:
    """DDP broadcasts buffers (e.g. BatchNorm stats) every forward (broadcast_buffers=True).

    Trace: broadcast collectives inside the window; gain: their device time. No published
    threshold: info below 5% of the step.
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        b = collective(v, "broadcast")
        d = ddp(v)
        if not b and not (d is not None and d.broadcast_buffers and ms):
            return None
        if v.pct(ms) < 0.05 and not (d is not None and d.broadcast_buffers):
            return None
        return finding(
            v, "DI-13", "distributed",
            f"DDP broadcasts module buffers every forward ({b[0] // max(v.n_steps, 1) if b else '?'} broadcast(s) per step, "
            f"{fmt_ms(ms)}).", ms,
            evidence=[Evidence(f"{b[0] if b else 0} broadcast kernels in the window, {fmt_ms(ms)} per step.",
                               {"count": b[0] if b else None, "ms_per_step": round(ms, 3)})],
            fix=_ddp_fix(v, "If the buffers need not be identical on every rank (they are recomputed), stop the "
                         "broadcast{where}.", "DDP(model, broadcast_buffers=False)"),
            confidence="medium", source="PT DDP broadcast_buffers docstring")
    return comm_rule(inputs, "DI-13", build)


def _accumulating_steps(v: View, acc: Accumulation, kind: str | None, ms: float,
                        budget: dict[str, float]) -> Finding:
    """DI-6 from the micro-batches inside each step (metrics/accumulation.py)."""
    if kind in (None, "fsdp"):  # the trace alone: its root forwards name the wrapper
        kind = {"FSDP2": "fsdp2", "FSDP": "fsdp1", "DDP": "ddp"}[acc.wrapper]
    k = acc.micro_batches
    batches = f"{k:g} micro-batches" if k == int(k) else f"{k:.1f} micro-batches on average"
    what = " and ".join(acc.kinds) or "reduction"
    fits, extra = accumulation_room(v)  # (True, None) but for FSDP2, whose kept gradients cost memory
    memory = ""
    if extra is not None:
        # FSDP2 keeps the skipped micro-batches' gradients unsharded until the last one reduces them.
        memory = (f" Skipping them keeps each unit's gradients unsharded between micro-batches: about {extra:.0f} MB "
                  "more per rank" + ("." if fits else ", more than the device has room for at its peak, so nothing "
                                     "is claimed."))
    took = fmt_ms(ms) if fits else f"{fmt_ms(accumulation_within_ms(v))}, which memory does not allow to skip,"
    return finding(
        v, "DI-6", "distributed",
        f"Gradient accumulation reduces the gradients on every micro-batch: {batches} per optimizer step, each "
        f"with {acc.reductions_per_micro_batch} {what} call(s) ({acc.wrapper}), where only the last "
        f"micro-batch's are needed: {took} per step.",
        ms, sev="info" if not fits else None,
        evidence=[comm_evidence(v, budget), Evidence(
            f"{acc.synced_steps} of {acc.steps} step(s) with one optimizer step and {batches} (the {acc.wrapper} "
            f"root forward's ranges) reduced gradients inside every micro-batch's backward; the reductions of all "
            f"but the last took {fmt_ms(v.ms(acc.early_ns))} per step "
            + ("(their device time that no other device work covered)." if v.has_device_trace
               else "(host time inside the reductions, on every thread)")
            + ("" if v.has_device_trace else _unprofiled(v, acc, ms if fits else accumulation_within_ms(v)))
            + memory,
            {"wrapper": acc.wrapper, "micro_batches": k, "reductions_per_micro_batch": acc.reductions_per_micro_batch,
             "kinds": list(acc.kinds), "early_reduction_ms": round(v.ms(acc.early_ns), 3), "steps": acc.steps,
             "synced_steps": acc.synced_steps, **({"extra_mb": round(extra, 1)} if extra is not None else {})})],
        fix=accumulation_fix(kind, built_by(v)),
        # Every step read reduced every micro-batch: the job's pattern, not a step that happened to.
        confidence="medium" if acc.synced_steps == acc.steps and fits else "low",
        confirm="time the step with the change: the reductions then run once per optimizer step",
        source="the trace: reduction calls per micro-batch (metrics/accumulation.py); FSDP2 "
               "set_requires_gradient_sync, DDP no_sync docs")


def _unprofiled(v: View, acc: Accumulation, claim: float) -> str:
    """The end of DI-6's host-time sentence: what is left of it without the profiler's slowdown
    (``claim``: the finding's ms, which the ledger may have capped further)."""
    if accumulation_within_ms(v) >= v.ms(acc.early_ns):
        return "."
    return (f"; the profiled steps ran {fmt_ms(v.profiler_inflation_ms)} longer than the unprofiled ones, so "
            f"{fmt_ms(claim)} is claimed, the same share of the unprofiled step or less.")


@rule("DI-6", priority=PRIORITY["DI-6"], budgets=("comm.exposed",))
def accumulation_without_no_sync(inputs: RuleInputs) -> list[Finding]:
    """Gradient accumulation that reduces gradients every micro-batch (no no_sync(), no set_requires_gradient_sync).

    Trace: steps holding one optimizer step whose every micro-batch (root forward of DDP/FSDP)
    reduces gradients (metrics/accumulation.py), or profiler steps without an optimizer step that
    still run collectives (TTG: "all-reduce is not necessary after every training step"). Gain:
    the reductions of all but the last micro-batch; the exposed comm of those profiler steps.
    Measured on torchtune's full_finetune_distributed (FSDP2, 2 gloo ranks, 8 micro-batches of 2):
    claimed 11.8% of the step (3.4 s, the profiler's slowdown taken out); the recipe with
    set_requires_gradient_sync before each backward ran x1.12 faster (10.8% of the step, two ABBA
    pairs of 5 steps). The claim runs high because the skipped micro-batches accumulate unsharded
    gradients instead, which is not priced.
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        acc = v.r.signals.accumulation if v.r is not None and v.r.signals is not None else None
        kind = sharding(v)
        if acc is None or not acc.synced_steps or accumulation_within_ms(v) < micro_step_comm_ms(v):
            if v.pct(ms) < 0.5:
                return None
            return finding(
                v, "DI-6", "distributed",
                f"Micro-batches without an optimizer step still all-reduce gradients ({fmt_ms(ms)} per step).",
                ms, evidence=[comm_evidence(v, budget)],
                fix=accumulation_fix(kind),
                confidence="medium", source="TTG no_sync for gradient accumulation")
        fits = accumulation_room(v)[0]
        if fits and v.pct(ms) < 0.5 or not fits and v.pct(accumulation_within_ms(v)) < 0.5:
            return None
        return _accumulating_steps(v, acc, kind, ms, budget)
    return comm_rule(inputs, "DI-6", build)


@rule("DI-11", priority=PRIORITY["DI-11"], budgets=("comm.exposed",))
def uncompressed(inputs: RuleInputs) -> list[Finding]:
    """Bandwidth-bound all-reduce without gradient compression (TBP recommends compression > 10%).

    Fires on all-reduce kernels averaging >= 1 ms (bandwidth, not latency, dominates). Gain:
    half of what is left of the exposed comm (bf16 halves the bytes).
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        if v.pct(ms) < 0.5:
            return None
        return finding(
            v, "DI-11", "distributed",
            f"Large all-reduces dominate the exposed communication; bf16 compression could save about {fmt_ms(ms)} per step.",
            ms, evidence=[comm_evidence(v, budget)],
            fix=Fix("Register a compression hook (mind the accuracy caveat).",
                    "from torch.distributed.algorithms.ddp_comm_hooks import default_hooks\n"
                    "model.register_comm_hook(None, default_hooks.bf16_compress_hook)"),
            confidence="low", confirm="compare loss curves with and without the hook",
            source="TBP gradient compression at comm > 10%")
    return comm_rule(inputs, "DI-11", build)


@rule("DI-1")
def data_parallel(inputs: RuleInputs) -> list[Finding]:
    """nn.DataParallel in use (TBP use_dp → "use DistributedDataParallel"; TTG the same).

    Presence warns; the single-process scatter/gather cost is not priced here.
    """
    def one(v: View) -> Finding | None:
        s = v.r.signals if v.r is not None else None
        mark = s.markers.get("DataParallel.forward") if s is not None else None
        if not mark:
            return None
        return finding(
            v, "DI-1", "distributed", "The model is wrapped in nn.DataParallel (one process drives all GPUs).",
            0.0, sev="warning", evidence=[Evidence("DataParallel.forward calls.", {"count": mark[0]})],
            fix=Fix("Use DistributedDataParallel, one process per GPU (torchrun).",
                    "model = DDP(model.to(local_rank), device_ids=[local_rank])"),
            confidence="high", confirm="`torchdoctor fix` cannot switch this for you; compare steps/s after the change",
            source="TBP use_dp; TTG")
    return per_rank(inputs, one)


@rule("DI-7")
def find_unused(inputs: RuleInputs) -> list[Finding]:
    """find_unused_parameters=True although no parameter is unused.

    The reducer warns ("extra traversal of the autograd graph every iteration", reducer.cpp).
    Gain: DDP.forward's own time outside any op when a trace shows it (the graph search runs
    there), else none claimed. Presence with unused_parameter_size == 0 warns.
    """
    def one(v: View) -> Finding | None:
        d = ddp(v)
        if d is None or not d.find_unused_parameters or d.unused_parameter_size not in (0, None):
            return None
        s = v.r.signals if v.r is not None else None
        gain = v.ms(s.ddp_forward_self_ns) if s is not None else 0.0
        sure = d.unused_parameter_size == 0
        return finding(
            v, "DI-7", "distributed",
            "DDP searches the autograd graph for unused parameters every step (find_unused_parameters=True)"
            + (", but none are unused." if sure else ".")
            + (f" DDP's own forward work costs {fmt_ms(gain)} per step." if gain else ""),
            gain, sev=sev_at_least(v, gain, "warning") if sure else "info",
            evidence=[Evidence(f"DDP(find_unused_parameters=True); logging data: unused_parameter_size="
                               f"{d.unused_parameter_size}; DDP.forward outside any op: {fmt_ms(gain)} per step.",
                               {"find_unused_parameters": True, "unused_parameter_size": d.unused_parameter_size,
                                "ddp_forward_self_ms": round(gain, 3), "call_site": d.call_site})],
            fix=_ddp_fix(v, "Turn the search off{where} (or declare the graph static).",
                         "DDP(model, find_unused_parameters=False)   # or static_graph=True"),
            confidence="high" if sure else "medium", remedy="ddp.find_unused_false",
            confirm="" if gain else "`torchdoctor fix --apply ddp.find_unused_false` measures the gain",
            source="PT reducer.cpp warning; TTG")
    return per_rank(inputs, one)


@rule("DI-8")
def static_graph(inputs: RuleInputs) -> list[Finding]:
    """static_graph=False although DDP reports the graph could be static (can_set_static_graph).

    Info: the search it would skip is priced by DI-7 when that fires.
    """
    def one(v: View) -> Finding | None:
        d = ddp(v)
        if d is None or d.static_graph or not d.can_set_static_graph:
            return None
        return finding(
            v, "DI-8", "distributed", "DDP reports a static graph but static_graph=False.", 0.0, sev="info",
            evidence=[Evidence("DDP logging data.", {"can_set_static_graph": True})],
            fix=_ddp_fix(v, "Declare it{where}.", "DDP(model, static_graph=True)"), confidence="medium",
            remedy="ddp.static_graph", source="PT DDP docstring (can_set_static_graph)")
    return per_rank(inputs, one)


@rule("DI-9")
def grad_as_bucket_view(inputs: RuleInputs) -> list[Finding]:
    """gradient_as_bucket_view=False: every step copies gradients into and out of the buckets.

    Gain: two copies of the parameter bytes at an assumed 1000 GB/s (GPU) or 10 GB/s (CPU
    memcpy); info below 5%.
    """
    def one(v: View) -> Finding | None:
        d = ddp(v)
        if d is None or d.gradient_as_bucket_view is not False:
            return None
        bw = 1000e9 if v.accel else 10e9
        gain = 2 * (d.total_parameter_bytes or 0) / bw * 1e3
        return finding(
            v, "DI-9", "distributed",
            "DDP copies gradients into its buckets every step (gradient_as_bucket_view=False).",
            gain, evidence=[Evidence(f"{(d.total_parameter_bytes or 0) / 1e6:.1f} MB of gradients copied into and out "
                                     f"of the buckets per step (est. {fmt_ms(gain)} at {bw / 1e9:.0f} GB/s).",
                                     {"total_parameter_bytes": d.total_parameter_bytes, "est_ms": round(gain, 3)})],
            fix=_ddp_fix(v, "Let gradients live in the buckets{where} (saves a gradient-sized copy and its memory).",
                         "DDP(model, gradient_as_bucket_view=True)"),
            confidence="medium", remedy="ddp.grad_as_bucket_view", source="PT DDP docstring")
    return per_rank(inputs, one)


@rule("DI-12")
def fsdp_settings(inputs: RuleInputs) -> list[Finding]:
    """FSDP overlap features off or the rate limiter stalling the host (FSDP docstrings).

    backward_prefetch=None: "no communication and computation overlap in the backward pass"
    (warning); CPU offload (info); rate_limiter time > 5% of the step (proposed) is claimed.
    """
    def one(v: View) -> Finding | None:
        s = v.r.signals if v.r is not None else None
        limiter = s.markers.get("FullyShardedDataParallel.rate_limiter") if s is not None else None
        gain = v.ms(limiter[1]) if limiter else 0.0
        problems = []
        for fs in (v.f.fsdp if v.f is not None else []):
            if fs.version != 2 and fs.backward_prefetch in ("None", "NONE", ""):
                problems.append("backward_prefetch=None")
            if fs.cpu_offload:
                problems.append("cpu_offload=True")
        if gain and v.pct(gain) >= 0.5:
            problems.append(f"rate limiter stalls the host {fmt_ms(gain)} per step")
        if not problems:
            return None
        return finding(
            v, "DI-12", "distributed", "FSDP overlap is limited: " + "; ".join(problems) + ".", gain,
            sev=sev_at_least(v, gain, "warning") if "backward_prefetch=None" in problems or gain else "info",
            evidence=[Evidence("FSDP settings and rate-limiter time.", {"problems": problems,
                                                                        "rate_limiter_ms": round(gain, 3)})],
            fix=Fix("Prefetch in backward, wrap per transformer block, keep parameters on the device.",
                    "FSDP(model, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, limit_all_gathers=True)"),
            confidence="medium", source="FSDP docstrings; proposed rate_limiter > 5%",
            remedy="fsdp.prefetch" if "backward_prefetch=None" in problems else None)
    return per_rank(inputs, one)


@rule("DI-11-embedding", priority=PRIORITY["DI-11e"], budgets=("comm.exposed",))
def replicated_embedding(inputs: RuleInputs) -> list[Finding]:
    """A large embedding table kept whole on every rank (plain DDP): catalogue DI-11's case of
    bandwidth-bound gradients — its dense gradient rides in every all-reduce.

    Threshold (ours): a dense, replicated table >= 256 MiB or >= 25% of the parameter bytes.
    Gain: the table's share of the parameter bytes times the exposed comm left after the
    transport and bucket shares (sharding sends only the looked-up rows).
    """
    def build(v: View, ms: float, budget: dict[str, float]) -> Finding | None:
        got = big_embedding(v)
        if got is None:
            return None
        e, share = got
        ex = exposed_comm_ms(v)
        size = f"{100 * share:.0f}% of the parameters" if share else f"{e.bytes / 2**20:.0f} MiB"
        return finding(
            v, "DI-11", "distributed",
            f"Embedding {e.name} ({e.num_embeddings:,} x {e.embedding_dim}, {size}) is replicated on all "
            f"{v.f.world_size if v.f else '?'} ranks: its full gradient is all-reduced every step"
            + (f" (about {fmt_ms(ms)} of the exposed communication)." if ms else "."),
            ms, sev=sev_at_least(v, ms, "warning"),
            evidence=[Evidence("Replicated embedding tables.", {"exposed_comm_ms": round(ex, 3), "share_of_params": share},
                               [{"name": e.name, "rows": e.num_embeddings, "dim": e.embedding_dim, "bytes": e.bytes}]),
                      comm_evidence(v, budget)],
            fix=Fix("Shard the table across ranks (TorchRec DistributedModelParallel, FSDP2 fully_shard on the "
                    "embedding, or a row-wise DTensor), or use sparse gradients.",
                    "emb = nn.Embedding(n, d, sparse=True)  # plus an optimizer that takes sparse grads"),
            confidence="medium" if ms else "low",
            confirm="" if ms else "the profiler window of `torchdoctor run` prices the all-reduce it rides in",
            source="ours: >= 256 MiB or >= 25% of parameters; catalogue DI-11/DI-3 sharding")
    return comm_rule(inputs, "DI-11e", build)


def _ddp_fix(v: View, text: str, snippet: str) -> Fix:
    """A DDP fix at the job's own wrapper: its DDP(...) line, or the TrainingArguments fields when
    transformers' Trainer wraps the model (advice/framework_settings.py); `{where}` takes the site."""
    return framework_fix("DDP", v.f.ddp if v.f is not None else [], text, snippet)
