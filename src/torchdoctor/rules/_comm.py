"""The exposed-communication budget shared by the distributed rules (see rules/distributed.py).

Each rule's ask (SHARES) is computed from what the earlier rules left of the ledger's
``comm.exposed`` budget, in the fixed ORDER (their ledger priorities), so that no two findings
claim the same milliseconds; every constant states its source or the reasoning behind it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..metrics.stragglers import StragglerSeries, straggler_series
from ._common import View, env_on, fmt_ms, per_rank, severity, tops_text, views
from ._cpu import oversubscribed_by_job
from .engine import DERIVED, GENERIC, RuleInputs
from .ledger import capacity
from .model import Evidence, Finding
from .model import Severity as Sev

# TBP: exposed communication > 10% of the step → "gradient compression / accumulation / larger
# batch" (data.py); GPP comm_dominant high above 40%.
COMM_WARN_PCT = 10.0
COMM_CRIT_PCT = 40.0
# Proposed (catalogue DI-4): overlap below 50% of comm time is poor overlap.
POOR_OVERLAP_PCT = 50.0
# Backward is about 2/3 of the compute of a training step (fwd:bwd ≈ 1:2, GPP HW-10 note): the
# most compute an all-reduce can hide under.
BACKWARD_SHARE = 2.0 / 3.0
# A transport forced onto a slower path (P2P → SHM/PCIe, IB → sockets) at least halves bus
# bandwidth (NCCL topo.h: NVLink 20 GB/s per link vs PCI 12; IB HDR vs 100 GbE): claim half.
DEGRADED_TRANSPORT_GAIN = 0.5
# gloo moves CUDA tensors through host memory; NCCL is "the fastest" (TBP). Claim half.
GLOO_ON_GPU_GAIN = 0.5
# bf16/fp16 compression halves the bytes of a bandwidth-bound all-reduce.
COMPRESSION_GAIN = 0.5
# Small buckets are latency-dominated: assume half their time is fixed per-call latency.
LATENCY_SHARE = 0.5
# DDP's default bucket cap (distributed.py _DEFAULT_BUCKET_CAP_MB) and the "many tiny
# collectives" trace signal: >= 50 collectives per step averaging < 0.5 ms each.
DEFAULT_BUCKET_MB = 25.0
MANY_COLLECTIVES = 50
TINY_COLLECTIVE_NS = 500_000
# Without facts, assume default buckets would merge at least 4 of the observed tiny ones.
TRACE_MERGE_FACTOR = 4
# Model-parallel all-to-all (embedding lookups) feeds the same step's forward: only the input
# distribution can be pipelined behind the previous batch. We assume half of it can hide.
ALL_TO_ALL_HIDEABLE = 0.5
# A bandwidth-bound all-reduce kernel lasts >= 1 ms on average.
BANDWIDTH_BOUND_NS = 1_000_000
# TML: straggler findings turn critical only with >= 20 steps of evidence. We also ask >= 5 steps
# for a warning (TML: 2): a 3-step profiler window on a loaded host swings step times 2-4x.
TML_CRITICAL_STEPS = 20
STRAGGLER_WARN_STEPS = 5
TRANSPORT_ENV = ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE")
ORDER = ("DI-5", "DI-2", "DI-14", "DI-10", "DI-11e", "DI-13", "DI-6", "DI-16", "DI-4", "DI-11", "DI-3")
# FSDP2 with resharding: per unit and step, an all-gather in forward, the same all-gather again in
# backward and a reduce-scatter of the gradients (the same bytes). Where the trace does not split
# the communication by kind (host-only traces), the backward all-gathers are taken as a quarter of
# it: a reduce-scatter costs about two all-gathers (a reduction and a scatter; gloo measured here).
BACKWARD_GATHER_SHARE = 0.25
# Keeping parameters unsharded must leave this much of the device's memory free.
MEMORY_HEADROOM = 0.9
# A replicated embedding is "large" from 256 MiB or 25% of the parameter bytes (our threshold:
# from there its dense gradient is a visible share of every all-reduce).
BIG_EMBEDDING_BYTES = 256 * 2**20
BIG_EMBEDDING_SHARE = 0.25


# --- the exposed-comm budget -----------------------------------------------------------------------

def exposed_comm_ms(v: View) -> float:
    """Exposed communication per step: the window's, less the profiler's own inflation of the window
    (View.profiler_inflation_ms, all of it counted against communication: a lower bound, as a claim
    should be); else DDP's logging data; else the probe's timings."""
    if v.r is not None and v.r.window.steps:
        return max(0.0, v.window_ms(v.r.metrics.comm_exposed_pct) - v.profiler_inflation_ms)
    d = ddp(v)
    if d is not None and d.avg_backward_comm_time_ns is not None:
        return max(0.0, (d.avg_backward_comm_time_ns - (d.avg_backward_compute_comm_overlap_time_ns or 0)) / 1e6)
    return v.comm_median() or 0.0


def hideable_ms(v: View) -> float:
    """Compute time per step that an all-reduce could run under but does not yet."""
    if v.r is None:
        d = ddp(v)
        return (d.avg_backward_compute_time_ns or 0) / 1e6 if d is not None else 0.0
    m = v.r.metrics
    if v.has_device_trace:
        overlapped = (m.comm_pct or 0) * (m.overlap_pct or 0) / 100.0
        return max(0.0, v.window_ms((m.compute_pct or 0) - overlapped)) * BACKWARD_SHARE
    ph = v.r.host.phases_ms
    if ph.get("backward"):
        return ph["backward"]
    return sum(ms for p, ms in ph.items() if p not in ("comm", "data")) * BACKWARD_SHARE


def ddp(v: View):
    return v.f.ddp[0] if v.f is not None and v.f.ddp else None


def sharding(v: View) -> str | None:
    """How the rank shards its model: "fsdp2" (fully_shard), "fsdp1" (FullyShardedDataParallel),
    "fsdp" (a trace whose communication is mostly all-gathers and reduce-scatters: sharded, version
    unknown), "ddp", "tp" (parallelize_module without FSDP or DDP); None when unknown. Advice
    differs: FSDP2 has no ``no_sync()``, tensor parallelism communicates activations, not gradients."""
    if v.f is not None and v.f.fsdp:
        return "fsdp2" if any(fs.version == 2 for fs in v.f.fsdp) else "fsdp1"
    if ddp(v) is not None:
        return "ddp"
    if v.f is not None and v.f.tensor_parallel is not None:
        return "tp"
    return "fsdp" if dominant_collective(v) in ("all_gather", "reduce_scatter") else None


def backend(v: View) -> str | None:
    if v.f is not None and v.f.distributed_backend:
        return v.f.distributed_backend
    d = ddp(v)
    if d is not None and d.backend_name:
        return d.backend_name
    return v.r.backend if v.r is not None else None


def effective_backend(v: View) -> str | None:
    """The backend, or NCCL when unrecorded on an accelerator (init_process_group's default there)."""
    return backend(v) or ("nccl" if v.accel else None)


def collective(v: View, kind: str) -> list[int] | None:
    s = v.r.signals if v.r is not None else None
    return s.collectives.get(kind) if s is not None else None


def dominant_collective(v: View) -> str | None:
    s = v.r.signals if v.r is not None else None
    if s is None or not s.collectives:
        return "all_reduce" if ddp(v) is not None else None
    return max(s.collectives, key=lambda k: s.collectives[k][1])


def run_stragglers(inputs: RuleInputs) -> StragglerSeries | None:
    """The whole run's straggler series (metrics/stragglers.py) from the probe's step timings of the
    ranks that wrap their model in DDP or FSDP (where the collectives sit is known); None without
    two such ranks sharing STRAGGLER_WARN_STEPS steps. Computed once per diagnosis."""
    if "stragglers" not in inputs.memo:
        by_rank, sharded, skip = {}, False, {1}
        for ri in inputs.ranks:
            f = ri.facts
            if f is not None and f.steps and (f.ddp or f.fsdp):
                by_rank[ri.rank if ri.rank is not None else f.rank] = f.steps
                sharded = sharded or bool(f.fsdp)
                # The probe's first steps warm up; the step after its profiler window pays for the
                # window's export, unevenly across ranks.
                skip.update(f.profile_steps[1:2])
        got = straggler_series(by_rank, sharded, skip)
        inputs.memo["stragglers"] = got if got is not None and got.steps >= STRAGGLER_WARN_STEPS else None
    return inputs.memo["stragglers"]


def straggler_wait_ms(v: View, inputs: RuleInputs) -> float:
    """What this rank waits per step for the straggler: from the whole run's step timings when they
    name one (the job's gain, amortised), else from the traces' cross-rank blame (its extra
    collective wait vs the rank that waits least), else from the probe's comm timings."""
    s = run_stragglers(inputs)
    if s is not None and s.straggler is not None:
        return s.gain_ms if v.rank != s.straggler else 0.0
    c = inputs.cross
    if c is not None and c.straggler is not None and v.rank in c.victims:
        return next((w.excess_wait_ms for w in c.per_rank if w.rank == v.rank), 0.0)
    fw = facts_waits(inputs)
    if fw and v.rank in fw:
        least = min(fw.values())
        med_step = float(np.median([x.step_ms for x in views(inputs) if x.step_ms]))
        if fw[v.rank] - least > 0.05 * med_step:
            return fw[v.rank] - least
    return 0.0


def facts_waits(inputs: RuleInputs) -> dict[int, float]:
    """Median per-step comm time of each rank from live step timings (no traces); computed once per
    diagnosis (rules ask for it rank by rank)."""
    if "facts_waits" not in inputs.memo:
        out = {}
        for ri, v in zip(inputs.ranks, views(inputs), strict=True):
            if not ri.has_result and v.rank is not None and (w := v.comm_median()) is not None:
                out[v.rank] = w
        inputs.memo["facts_waits"] = out if len(out) >= 2 else {}
    return inputs.memo["facts_waits"]


def bucket_counts(v: View) -> tuple[int, int, str] | None:
    """(buckets now, buckets with the default cap, source) when buckets look too small."""
    d = ddp(v)
    if d is not None:
        n_now = d.num_buckets or len(d.bucket_sizes)
        total = d.total_parameter_bytes or sum(d.bucket_sizes)
        small_cap = d.bucket_cap_mb is not None and d.bucket_cap_mb < DEFAULT_BUCKET_MB
        if n_now and total:
            n_ideal = max(1, math.ceil(total / (DEFAULT_BUCKET_MB * 2**20))) + 1  # + the 1 MiB first bucket
            if n_now > n_ideal and small_cap:
                return n_now, n_ideal, f"bucket_cap_mb={d.bucket_cap_mb:g}"
        return None
    ar = collective(v, "all_reduce")
    if v.r is not None and ar and v.n_steps:
        per_step = ar[0] / max(v.n_steps, 1)
        if per_step >= MANY_COLLECTIVES and ar[1] / ar[0] < TINY_COLLECTIVE_NS:
            return int(per_step), max(1, int(per_step) // TRACE_MERGE_FACTOR), "trace"
    return None


def cores_full(v: View, inputs: RuleInputs) -> bool:
    """A CPU job (no accelerator) whose ranks' intra-op threads cover every CPU of the host: there a
    collective is CPU work (gloo reduces and copies on the host, the kernel moves the bytes) that
    can only take a core from compute, not run under it, so no part of it is claimed as hideable.
    Measured on the demo with bucket_cap_mb=0.001 (2 one-thread ranks on 2 CPUs): DI-3 claimed 8-17%
    as "could run under compute" beside DI-10's 5-12%; the larger buckets gave back 9% in all."""
    if v.accel or v.f is None:
        return False
    return oversubscribed_by_job(v, views(inputs))


def comm_cap(v: View, rem: float) -> float:
    """The most of ``rem`` that compute can hide.

    With n gradient buckets at most (n-1)/n of the all-reduce can run under backward: the last
    bucket is only ready when backward ends (one bucket: nothing overlaps). Model-parallel
    all-to-all feeds the same step's forward: ALL_TO_ALL_HIDEABLE of it.
    """
    n = buckets_per_step(v)
    cap = rem * (1 - 1 / n) if n else rem
    if dominant_collective(v) in ("all_to_all", "send_recv"):
        cap = min(cap, rem * ALL_TO_ALL_HIDEABLE)
    return cap


def _compress_share(v: View, rem: float) -> float:
    ar = collective(v, "all_reduce")
    if not ar or ar[1] / ar[0] < BANDWIDTH_BOUND_NS:
        return 0.0
    # Only the all-reduce share of the communication is compressible by a DDP hook.
    all_comm = sum(x[1] for x in v.r.signals.collectives.values()) if v.r and v.r.signals else ar[1]
    return rem * COMPRESSION_GAIN * ar[1] / max(all_comm, 1)


def _bucket_share(v: View, rem: float) -> float:
    b = bucket_counts(v)
    return rem * LATENCY_SHARE * (1 - b[1] / b[0]) if b is not None else 0.0


def _embedding_share(v: View, rem: float) -> float:
    e = big_embedding(v)
    return rem * e[1] if e is not None and e[1] else 0.0


# Each distributed rule's ask, from what the earlier ones left of the exposed communication
# (``rem``, ms per step). The rules claim in ORDER (their ledger priorities).
SHARES: dict[str, Callable[[View, RuleInputs, float], float]] = {
    "DI-5": lambda v, inputs, rem: min(rem, straggler_wait_ms(v, inputs)),
    "DI-2": lambda v, inputs, rem: rem * GLOO_ON_GPU_GAIN if v.accel and backend(v) == "gloo" else 0.0,
    "DI-14": lambda v, inputs, rem: (rem * DEGRADED_TRANSPORT_GAIN
                                     if effective_backend(v) == "nccl" and degraded_env(v)[0] else 0.0),
    "DI-10": lambda v, inputs, rem: _bucket_share(v, rem),
    "DI-11e": lambda v, inputs, rem: _embedding_share(v, rem),
    "DI-13": lambda v, inputs, rem: min(rem, broadcast_ms(v)),
    "DI-6": lambda v, inputs, rem: min(rem, accumulation_comm_ms(v)),
    "DI-16": lambda v, inputs, rem: min(rem, backward_gather_ms(v, rem)) if keep_unsharded_room(v)[0] else 0.0,
    "DI-4": lambda v, inputs, rem: (min(hideable_ms(v), comm_cap(v, rem))
                                    if poor_overlap(v) and not cores_full(v, inputs) else 0.0),
    "DI-11": lambda v, inputs, rem: _compress_share(v, rem),
    "DI-3": lambda v, inputs, rem: (0.0 if poor_overlap(v) or cores_full(v, inputs)
                                    else min(hideable_ms(v), comm_cap(v, rem))),
}
# Rules about DDP's gradient all-reduce (buckets, comm hooks, buffer broadcasts, no_sync, embedding
# gradients, overlap with backward): a tensor-parallel rank (sharding "tp") has none of it. Its
# collectives move activations inside each layer and block it; DI-3 advises on them.
NOT_FOR_TENSOR_PARALLEL = frozenset({"DI-4", "DI-6", "DI-10", "DI-11", "DI-11e", "DI-13"})
# Ledger priorities: inside the DERIVED tier, in ORDER; DI-3 (what is left) is generic.
PRIORITY = {k: (GENERIC if k == "DI-3" else DERIVED + 1 + i) for i, k in enumerate(ORDER)}


def resharding_fsdp2(v: View):
    """The rank's FSDP2 facts when some unit reshards after forward (all-gathers again in backward)."""
    if v.f is None:
        return None
    return next((fs for fs in v.f.fsdp if fs.version == 2 and fs.reshard_after_forward), None)


def keep_unsharded_room(v: View) -> tuple[bool, float | None]:
    """(whether the rank can keep its parameters unsharded through the step, the extra MB it would
    hold): every unit's unsharded parameters less its own shard. On a device with memory facts (or
    the trace's allocator records) the peak plus the extra must stay under MEMORY_HEADROOM of its
    memory; without them (CPU) it is allowed and the extra is said."""
    fs = resharding_fsdp2(v)
    if fs is None or not fs.model_mb:
        return False, None
    return unsharded_room(v, fs.model_mb)


def unsharded_room(v: View, model_mb: float) -> tuple[bool, float]:
    """(whether the rank's memory holds ``model_mb`` of unsharded tensors on top of its peak, less
    its own shard, and that extra in MB): keep_unsharded_room's test, for parameters kept through the
    step (DI-16) or gradients kept unsharded between micro-batches (DI-6's FSDP2 advice)."""
    world = max(v.f.world_size, 1) if v.f is not None else 1
    extra = model_mb * (1 - 1 / world)
    d = v.f.device if v.f is not None else None
    if d is not None and d.total_memory_bytes and d.max_memory_allocated_bytes:
        return d.max_memory_allocated_bytes + extra * 1e6 <= MEMORY_HEADROOM * d.total_memory_bytes, extra
    m = v.r.memory if v.r is not None else None
    if m is not None and m.total_memory:  # the trace's allocator records (profile_memory=True)
        return m.peak_allocated + extra * 1e6 <= MEMORY_HEADROOM * m.total_memory, extra
    return True, extra


def backward_gather_ms(v: View, exposed: float) -> float:
    """The exposed communication per step that backward's all-gathers take: half the all-gather
    share of the communication where the trace names the kinds, else BACKWARD_GATHER_SHARE of it,
    of the exposed time before DI-6's reductions-only claim (``exposed`` is what is left after it)."""
    s = v.r.signals if v.r is not None else None
    share = BACKWARD_GATHER_SHARE
    if s is not None and s.collectives:
        total = sum(x[1] for x in s.collectives.values())
        share = 0.5 * s.collectives.get("all_gather", [0, 0])[1] / total if total else 0.0
    # DI-6's within-step claim is reductions only: the all-gathers' share is of the exposed time before it.
    # Its micro-step claim is all the exposed communication of those steps, all-gathers included.
    before = exposed
    if v.ledger is not None and accumulation_within_ms(v) >= micro_step_comm_ms(v):
        before += min(v.ledger.by_rule(v.rank, "comm.exposed").get("DI-6", 0.0), accumulation_within_ms(v))
    return min(exposed, before * share)


def buckets_per_step(v: View) -> int | None:
    """Gradient all-reduces per step: DDP's bucket count, else the all-reduce kernels per step."""
    d = ddp(v)
    if d is not None and (d.num_buckets or d.bucket_sizes):
        return d.num_buckets or len(d.bucket_sizes)
    ar = collective(v, "all_reduce")
    if ar and dominant_collective(v) == "all_reduce":
        return max(1, round(ar[0] / max(v.n_steps, 1)))
    return None


def poor_overlap(v: View) -> bool:
    if v.r is not None and v.has_device_trace:
        return v.r.metrics.overlap_pct is not None and v.r.metrics.overlap_pct < POOR_OVERLAP_PCT
    d = ddp(v)
    if d is not None and d.avg_backward_comm_time_ns:
        return (d.avg_backward_compute_comm_overlap_time_ns or 0) < POOR_OVERLAP_PCT / 100 * d.avg_backward_comm_time_ns
    return False


def degraded_env(v: View) -> tuple[list[str], list[str]]:
    """(transport-disabling variables set, forced algorithm/protocol variables set)."""
    if v.f is None:
        return [], []
    off = [f"{k}={v.f.env[k]}" for k in TRANSPORT_ENV if env_on(v.f, k)]
    lvl = v.f.env.get("NCCL_P2P_LEVEL", "").upper()
    if lvl in ("LOC", "0"):
        off.append(f"NCCL_P2P_LEVEL={lvl}")
    forced = [f"{k}={v.f.env[k]}" for k in ("NCCL_ALGO", "NCCL_PROTO") if v.f.env.get(k)]
    return off, forced


def big_embedding(v: View):
    """(largest replicated embedding, its share of the parameter bytes or 0 when unknown)."""
    if v.f is None or v.f.world_size < 2:
        return None
    d = ddp(v)
    total = d.total_parameter_bytes if d is not None and d.total_parameter_bytes else None
    big = [e for e in v.f.embeddings if e.replicated and not e.sparse and
           (e.bytes >= BIG_EMBEDDING_BYTES or (total and e.bytes >= BIG_EMBEDDING_SHARE * total))]
    if not big:
        return None
    e = max(big, key=lambda x: x.bytes)
    return e, min(1.0, e.bytes / total) if total else 0.0


def broadcast_ms(v: View) -> float:
    if v.r is None or v.r.signals is None:
        return 0.0
    b = collective(v, "broadcast")
    return v.ms(b[1]) if b else 0.0


def accumulation_comm_ms(v: View) -> float:
    """Gradient reductions that accumulation did not need, ms per step: the reductions of every
    micro-batch but the last inside steps that hold one optimizer step (metrics/accumulation.py),
    or, where the profiler's steps are the micro-batches, the exposed comm of the steps that run no
    optimizer step."""
    within, micro = accumulation_within_ms(v), micro_step_comm_ms(v)
    if within >= micro and not accumulation_room(v)[0]:
        return 0.0  # the unsharded gradients would not fit: nothing to give back as it stands
    return max(within, micro)


def accumulation_room(v: View) -> tuple[bool, float | None]:
    """(whether memory holds it, MB per rank) for skipping FSDP2's reductions between micro-batches:
    FSDP2 then keeps each unit's unsharded gradients until the last micro-batch reduces them, in
    the policy's reduce_dtype when it has one (fp32 beside bf16 parameters: twice the gathered size).
    (True, None) for DDP and FSDP1, whose no_sync() keeps gradients the size they are anyway."""
    fs = next((f for f in v.f.fsdp if f.version == 2), None) if v.f is not None else None
    if fs is None or not fs.model_mb:
        return True, None
    mp = fs.mixed_precision or ""
    low = fs.param_dtype in ("bfloat16", "float16") or any(f"param_dtype=torch.{d}" in mp for d in ("bfloat16", "float16"))
    scale = 2.0 if low and "reduce_dtype=torch.float32" in mp else 1.0
    return unsharded_room(v, fs.model_mb * scale)


def accumulation_within_ms(v: View) -> float:
    """The reductions of all but the last micro-batch inside the steps, ms per step (0 when none).
    On a host-only trace whose profiled steps ran longer than the probe's unprofiled ones, scaled
    down by that ratio: the profiler's per-event cost lands in host ranges like these (torchtune's
    FSDP2 recipe: 3.7 s per step in a window 8% slower than its steps)."""
    acc = v.r.signals.accumulation if v.r is not None and v.r.signals is not None else None
    if acc is None or not acc.synced_steps:
        return 0.0
    ms = v.ms(acc.early_ns)
    if not v.has_device_trace and v.step_ms:
        ms *= 1 - v.profiler_inflation_ms / v.step_ms
    return ms


def micro_step_comm_ms(v: View) -> float:
    """Exposed comm per step in profiler steps that run no optimizer step (accumulation micro-steps)."""
    if v.r is None or len(v.r.steps) < 2:
        return 0.0
    rows = [s for s in v.r.steps if s.host_split_ms]
    with_opt = [s for s in rows if s.host_split_ms.get("optimizer", 0) > 0]
    without = [s for s in rows if s.host_split_ms.get("optimizer", 0) == 0 and (s.comm_ms or 0) > 0]
    if not with_opt or not without:
        return 0.0
    return sum(s.comm_exposed_ms or 0.0 for s in without) / len(rows)


def overlap_text(v: View) -> str:
    if v.r is not None and v.has_device_trace and v.r.metrics.overlap_pct is not None:
        return f"{v.r.metrics.overlap_pct:.0f}%"
    d = ddp(v)
    if d is not None and d.avg_backward_comm_time_ns:
        return f"{100 * (d.avg_backward_compute_comm_overlap_time_ns or 0) / d.avg_backward_comm_time_ns:.0f}%"
    return "little"


def comm_evidence(v: View, budget: dict[str, float]) -> Evidence:
    m = v.r.metrics if v.r is not None else None
    vals = {"exposed_comm_ms": round(exposed_comm_ms(v), 3)}
    if m is not None:
        vals.update({"comm_pct": m.comm_pct, "comm_exposed_pct": m.comm_exposed_pct, "overlap_pct": m.overlap_pct})
    vals["split_ms"] = {k: round(x, 3) for k, x in budget.items() if x}
    items = []
    if v.r is not None:
        items = [{"name": t.name, "ms_per_step": round(v.ms(t.ns), 3), "count": t.count, "ts_ns": t.first_ts_ns}
                 for t in v.r.comm_ops[:4]]
    text = f"Communication exposed (nothing else running): {fmt_ms(exposed_comm_ms(v))} per step"
    if m is not None and m.comm_pct is not None:
        text += f"; comm {m.comm_pct:.1f}% of the step, {m.overlap_pct or 0:.0f}% of it overlapped"
    inflation = v.profiler_inflation_ms if m is not None and v.r.window.steps else 0.0
    if inflation > 0:
        # The profiled steps ran longer than the unprofiled ones: exposed_comm_ms takes that out.
        window = v.window_ms(m.comm_exposed_pct)
        vals.update({"window_exposed_comm_ms": round(window, 3), "profiler_inflation_ms": round(inflation, 3)})
        text += (f"; the profiled steps expose {fmt_ms(window)}, but ran {fmt_ms(inflation)} longer than the "
                 "unprofiled ones, and that slowdown is taken out of the communication (a lower bound)")
    if v.r is not None and v.r.comm_ops:
        text += f". Host collective calls: {tops_text(v, v.r.comm_ops)}"
    return Evidence(text + ".", vals, items)


def comm_rule(inputs: RuleInputs, key: str,
              build: Callable[[View, float, dict[str, float]], Finding | None]) -> list[Finding]:
    """Run a distributed rule per rank with its share of the exposed communication; merge over ranks.

    ``build`` gets the rule's ask and the split so far ({rule: ms} granted on ``comm.exposed``,
    this rule's ask included, "rest" = what is left after it); its finding claims the ask from
    the ledger's ``comm.exposed``.
    """
    def one(v: View) -> Finding | None:
        if key in NOT_FOR_TENSOR_PARALLEL and sharding(v) == "tp":
            return None  # its collectives carry activations: no bucket, hook, buffer or overlap knob
        rem = v.left("comm.exposed")
        ms = max(0.0, min(rem, SHARES[key](v, inputs, rem)))
        split = {**(v.ledger.by_rule(v.rank, "comm.exposed") if v.ledger is not None else {}), key: ms}
        split["rest"] = rem - ms
        f = build(v, ms, split)
        if f is not None:
            for c in f.claims:
                c.budget = "comm.exposed"
        return f
    return per_rank(inputs, one)


@capacity("comm.exposed")
def comm_capacity(v: View) -> float:
    return exposed_comm_ms(v)


def sev_at_least(v: View, ms: float, floor: Sev) -> Sev:
    s = severity(v.pct(ms))
    order = {"info": 0, "warning": 1, "critical": 2}
    return s if order[s] >= order[floor] else floor
