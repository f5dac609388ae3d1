"""Typed results of the metrics: small, serialisable summaries of one rank (no event arrays).

Percentages (`*_pct`) are shares of the analysis window's wall time unless a docstring says
otherwise, so they never exceed 100 and a fix moves them the right way.
"""

from __future__ import annotations

import msgspec


class WindowInfo(msgspec.Struct):
    start_ns: int
    end_ns: int
    steps: list[int]
    mode: str
    skipped_warmup: list[int] = []
    # Where the steps came from (metrics/steps.py): "ProfilerStep", or inferred from
    # "Optimizer.step", "DataLoader" or "backward"; "none" when the trace has no step boundary.
    boundaries: str = "ProfilerStep"


class Headline(msgspec.Struct):
    """The metrics every report carries (the JSON schema's `metrics` object).

    Device fields are None on a trace without device activity: never invented.
    """

    busy_pct: float | None = None
    idle_pct: float | None = None
    compute_pct: float | None = None
    comm_pct: float | None = None
    comm_exposed_pct: float | None = None
    memcpy_pct: float | None = None
    dataloader_pct: float | None = None
    dataloader_exposed_pct: float | None = None
    sync_pct: float | None = None
    # Share of communication time overlapped by compute (100 x |comm ∩ compute| / |comm|).
    overlap_pct: float | None = None
    step_ms_median: float | None = None


class StepRow(msgspec.Struct):
    """One step of the window. Times in ms."""

    step: int
    start_ns: int
    dur_ms: float
    busy_ms: float | None = None
    idle_ms: float | None = None
    comm_ms: float | None = None
    comm_exposed_ms: float | None = None
    dataloader_ms: float = 0.0
    dataloader_exposed_ms: float = 0.0
    sync_ms: float = 0.0
    syncs: int = 0
    # Host-side split of the step (exclusive, sums to dur_ms): data, forward, backward, optimizer,
    # comm, other.
    host_split_ms: dict[str, float] = {}


class GapClass(msgspec.Struct):
    """Per-stream idle gaps of one class (HTA's host_wait / kernel_wait / other)."""

    ns: int = 0
    count: int = 0


class StreamIdle(msgspec.Struct):
    stream: int
    busy_ns: int
    host_wait: GapClass
    kernel_wait: GapClass
    other: GapClass


class NamedTime(msgspec.Struct):
    name: str
    ns: int
    count: int = 0
    # Start (ns) of the largest occurrence, so a user can find it in the trace viewer.
    first_ts_ns: int | None = None
    # A labelled region (user_annotation, record_function), not an op: time inside it with no op
    # of its own is the Python the region runs.
    region: bool = False


class IdleCause(msgspec.Struct):
    """Device idle time attributed to what the host was doing meanwhile."""

    cause: str  # dataloader | sync | optimizer | comm_host | host_ops | untraced
    ns: int
    top: list[NamedTime] = []


class SyncSite(msgspec.Struct):
    api: str
    op: str  # innermost enclosing aten op, "" when none
    top_op: str  # outermost enclosing host op
    explanation: str
    count: int
    ns: int
    first_ts_ns: int


class SyncStats(msgspec.Struct):
    count: int = 0
    ns: int = 0
    per_step: float = 0.0
    sites: list[SyncSite] = []
    # cuda_sync events (device-side record of waits) by name: count.
    device_sync_events: dict[str, int] = {}


class LaunchStats(msgspec.Struct):
    launches: int = 0
    by_api: dict[str, int] = {}
    launch_ns_median: float | None = None
    launch_ns_p95: float | None = None
    # Kernels whose device time is shorter than the host call that launched them.
    short_kernels: int = 0
    short_kernels_pct: float | None = None
    launch_delay_ns_median: float | None = None
    launch_delay_ns_p95: float | None = None
    # The part of the launch delay that no earlier device work explains: not the wait for the
    # previous op on the kernel's stream, nor for another stream's op it depends on (metrics/host.py).
    launch_wait_ns_median: float | None = None
    launch_wait_ns_p95: float | None = None
    queue_depth_median: float | None = None
    # Share of launches that found at most one kernel queued: the device starves.
    queue_le1_pct: float | None = None
    kernels_per_step: float | None = None
    graph_launches: int = 0


class KernelStat(msgspec.Struct):
    name: str
    kind: str
    count: int
    total_ns: int
    mean_ns: float
    min_ns: int
    max_ns: int
    std_ns: float
    # Roofline (metrics/roofline.py defines each): FLOPs and bytes of the invocations whose
    # launching op had recorded shapes, achieved TFLOP/s and GB/s, % of the device's dense peak
    # and of its memory bandwidth, FLOP per byte, and which roof bounds it; null when unknown,
    # `roofline` says why (or which peak was used).
    flops: int | None = None
    achieved_tflops: float | None = None
    pct_of_peak: float | None = None
    bytes: int | None = None
    achieved_gbps: float | None = None
    pct_of_bandwidth: float | None = None
    intensity: float | None = None
    bound: str | None = None
    roofline: str = ""


class KindTime(msgspec.Struct):
    kind: str
    ns: int
    count: int
    pct_of_busy: float


class MemcpyRow(msgspec.Struct):
    direction: str
    host_memory: str
    count: int
    ns: int
    bytes: int
    # bytes / ns of the copies (1e9 bytes/s); null without copy time.
    achieved_gbps: float | None = None


class RooflineRow(msgspec.Struct):
    """One kind (and precision) of kernel in the window against its roof (metrics/rooflinesum.py)."""

    kind: str
    precision: str | None
    ns: int  # device time of every kernel of this kind (and precision, when known) in the window
    known_ns: int  # the part whose FLOPs (GEMM/conv) or bytes (elementwise/reduction) are known
    flops: int | None = None
    bytes: int | None = None
    achieved_tflops: float | None = None
    achieved_gbps: float | None = None
    pct_of_peak: float | None = None
    pct_of_bandwidth: float | None = None


class Roofline(msgspec.Struct):
    """Per rank: the device the roofs come from, kinds against their roofs, and MFU (rooflinesum.py)."""

    device_key: str | None = None
    device_note: str = ""
    peak_tflops: dict[str, float] = {}
    mem_bw_gbs: float | None = None
    rows: list[RooflineRow] = []
    model_flops: int | None = None
    flops_per_step: float | None = None
    step_ns: float | None = None
    mfu_pct: float | None = None
    mfu_precision: str | None = None
    mfu_note: str = ""


class KernelBreakdown(msgspec.Struct):
    by_kind: list[KindTime] = []
    # Pointwise/reduction kernels that ATen ops launched (metrics/kernels.py `eager_fusable`):
    # what Inductor could fuse; a custom extension's hand-fused kernels are not in it.
    eager_fusable: KindTime | None = None
    top: list[KernelStat] = []
    memcpy: list[MemcpyRow] = []
    distinct_kernels: int = 0
    # The device table entry the peaks come from (hardware/devices.toml), or why there is none.
    device_key: str | None = None
    device_note: str = ""


class HostBreakdown(msgspec.Struct):
    """Host (CPU) time per step split into exclusive phases; ms medians over the window steps."""

    phases_ms: dict[str, float] = {}
    phases_pct: dict[str, float] = {}
    top_ops: list[NamedTime] = []


# --- collectives with their recorded metadata (metrics/collectives.py) ---------------------------

class CollectiveKind(msgspec.Struct):
    """All calls of one collective (by name and process group) in the window."""

    name: str  # "allreduce", "all_gather_into_tensor", ... as torch records it
    process_group: str
    calls: int
    bytes: int  # input message bytes, summed (-1 when a dtype or size was not recorded)
    time_ns: int  # summed duration of the rows (device time when `source` is "device")


class Collectives(msgspec.Struct):
    """The window's collectives, and each call's (group, sequence number, duration) for matching
    the same call across ranks. Sizes stay small: one entry per call, three integers."""

    source: str  # "device": linked device rows; "host": record_param_comms CPU ops
    kinds: list[CollectiveKind] = []
    groups: list[str] = []  # process group names; `call_group` indexes it
    call_group: list[int] = []
    call_seq: list[int] = []
    call_dur_ns: list[int] = []



class MemoryStats(msgspec.Struct):
    """Device memory over the window from `[memory]` records (metrics/memory.py defines each field)."""

    device_id: int
    records: int
    peak_allocated: int
    peak_reserved: int
    floor_allocated: int
    cache_slack_pct: float
    reserved_growth: int
    allocs_per_step: float
    alloc_bytes_per_step: int
    total_memory: int | None = None
    batch_scale: float | None = None


class Recompute(msgspec.Struct):
    """Forward work activation checkpointing ran again in the window's backward passes
    (metrics/recompute.py defines each field)."""

    nodes: int  # autograd nodes that ran a segment's forward again
    reentrant: int  # of them, reentrant checkpoints (CheckpointFunctionBackward)
    host_ns: int  # host time of that work over the window
    device_ns: int | None  # device time of what it launched; None without device activity
    steps: int  # the window's steps (0: a trace without steps)
    forward_ops: dict[str, int] = {}  # the forward ops seen again, by count (the most frequent)
    batch_norm: int = 0  # BatchNorm calls among them (each updates the running statistics once more)
    compiled: int = 0  # of the nodes, those priced by the compiled forwards they hold (a compiled segment's)


class WeightCopies(msgspec.Struct):
    """Matmuls that copied their operands for a bmm in the window (metrics/weight_copies.py defines the fields)."""

    calls: int  # outermost aten::matmul calls whose copies took COPY_SHARE or more of their time
    copy_ns: int  # host time of the copies inside them, over the window
    matmul_ns: int  # host time of those matmuls
    device_ns: int | None  # device time of what the copies launched; None without device activity
    steps: int  # the window's steps (0: a trace without steps)
    shapes: dict[str, int] = {}  # the matmuls' Input Dims, by count (the most frequent)


class AttentionSite(msgspec.Struct):
    """Attention calls of one kind and shape in the window (metrics/choice.py defines the fields)."""

    path: str  # flash | efficient | cudnn | fused | math | manual | unknown
    calls: int
    dtype: str
    precision: str | None
    q_dims: list[int]
    kv_len: int
    head_dim: int
    has_mask: bool
    is_causal: bool | None
    # Why a fused backend did not run (math / manual paths), as plain sentences.
    reasons: list[str] = []
    # Forward device time of the kernels the calls launched, and parts of it by math path.
    device_ns: int = 0
    simt_ns: int = 0
    fusable_ns: int = 0
    flops: float | None = None
    # The registry family that should run them, and its device time for forward + backward.
    family: str = ""
    family_note: str = ""
    expected_ns: float | None = None
    with_backward: bool = False


class ChainSite(msgspec.Struct):
    """A hand-written normalisation or activation: a run of pointwise/reduction ops that one fused
    kernel replaces (metrics/choice.py)."""

    pattern: str  # rms_norm | layer_norm | gelu_tanh | gelu_erf
    calls: int
    ops: list[str]
    kernels_per_call: float
    dtype: str
    input_dims: list[int]
    device_ns: int = 0
    nbytes: float | None = None
    family: str = ""
    family_note: str = ""
    expected_ns: float | None = None


class GemmCandidates(msgspec.Struct):
    """GEMMs a cheaper precision or format could run: their calls, device time and FLOPs."""

    target: str  # fp8 | sparse24
    calls: int
    ns: int
    flops: float
    precision: str
    shapes: list[str] = []
    family: str = ""
    family_note: str = ""
    # The share of the target roof the pricing assumed, and the device time it gives the candidates.
    efficiency: float | None = None
    expected_ns: float | None = None


class PrecisionPath(msgspec.Struct):
    """The precision advisor's answer for one rank (metrics/choice.py precision_path)."""

    # Share of GEMM/convolution kernel time by precision (%; "" = precision unknown).
    shares: dict[str, float] = {}
    dominant: str | None = None
    recommended: str = ""
    # The `fix` remedy that applies it (None: a code change), and whether it changes numerics.
    remedy: str | None = None
    numerics: bool = False
    why: str = ""


class KernelChoice(msgspec.Struct):
    """What ran against what the kernel registry (hardware/kernels.toml) says should run."""

    device_key: str | None = None
    arch: str | None = None
    # Precisions the device has dense tensor/matrix-core peaks for (the device table).
    supported: list[str] = []
    attention: list[AttentionSite] = []
    chains: list[ChainSite] = []
    # GEMM/convolution kernel time and FLOPs by precision ("" = unknown) over the window.
    gemm_ns: dict[str, int] = {}
    gemm_flops: dict[str, float] = {}
    # bf16/fp16 GEMMs on a device without that precision's tensor cores (e.g. bf16 on V100).
    unsupported: GemmCandidates | None = None
    # Plain FP32 (SIMT) GEMM/conv kernels with known FLOPs, priced as TF32 (or fp16 before Ampere).
    fp32_simt: GemmCandidates | None = None
    fp8: GemmCandidates | None = None
    sparse24: GemmCandidates | None = None
    precision: PrecisionPath | None = None


class RankResult(msgspec.Struct):
    """Everything measured on one rank, small enough to gather from thousands of ranks."""

    rank: int | None
    file: str
    device: str | None
    device_kind: str  # "cuda", "rocm", "cpu"
    window: WindowInfo
    metrics: Headline
    world_size: int | None = None
    backend: str | None = None
    rank_source: str = "order"
    steps: list[StepRow] = []
    stream_idle: list[StreamIdle] = []
    idle_causes: list[IdleCause] = []
    syncs: SyncStats = msgspec.field(default_factory=SyncStats)
    launches: LaunchStats = msgspec.field(default_factory=LaunchStats)
    kernels: KernelBreakdown = msgspec.field(default_factory=KernelBreakdown)
    host: HostBreakdown = msgspec.field(default_factory=HostBreakdown)
    comm_ops: list[NamedTime] = []
    # Timeline sketch for plots: merged busy intervals and idle gaps (ns, relative to window start),
    # capped in number; gap cause labels match idle_causes.
    timeline_busy: list[tuple[int, int]] = []
    timeline_gaps: list[tuple[int, int, str]] = []
    events: int = 0
    warnings: list[str] = []
    compile_regions: dict[str, int] = {}
    # Eager ms per step before each nested compiled region "F/N": the code a graph break left
    # between compiled pieces (metrics/compiled.py::break_gaps).
    compile_gaps_ms: dict[str, float] = {}
    signals: RuleSignals | None = None
    # Collective calls with their recorded metadata (metrics/collectives.py); None without it.
    collectives: Collectives | None = None
    # Kernel kinds against the device's roofs, and MFU (metrics/rooflinesum.py); None without kernels.
    roofline: Roofline | None = None
    # What the kernels were against the registry's best family (metrics/choice.py); None without kernels.
    choice: KernelChoice | None = None
    # Device memory from the allocator's records (metrics/memory.py); None without profile_memory.
    memory: MemoryStats | None = None
    # Forward work activation checkpointing ran again in backward (metrics/recompute.py); None without.
    recompute: Recompute | None = None
    # Matmuls that copied their weight for a bmm (metrics/weight_copies.py); None without.
    weight_copies: WeightCopies | None = None


# --- signals the diagnosis rules need (metrics/signals.py) -------------------------------------

class CopySite(msgspec.Struct):
    """Host copy calls that blocked the host until their device copy finished, grouped by cause."""

    api: str
    direction: str  # HtoD | DtoH | DtoD | ...
    host_memory: str  # pageable | pinned | device | ""
    op: str  # innermost enclosing aten op
    region: str  # outermost enclosing user annotation (e.g. "## sparse_data_dist ##"), "" when none
    count: int
    host_ns: int  # time the host spent inside these calls
    idle_ns: int  # device idle meanwhile that no earlier idle cause (dataloader, sync, ...) claims
    bytes: int
    first_ts_ns: int  # start of the longest call


class CommLayout(msgspec.Struct):
    """Where device communication sits in the steps (medians over the window's steps, ms)."""

    # Comm time inside the compute-free stretch of the step that holds the most comm.
    block_ms: float = 0.0
    block_span_ms: float = 0.0
    # Where that stretch starts, as % of the step (near 100: at the end of backward / before the
    # optimizer; near 0: at the start of forward).
    block_start_pct: float | None = None
    exposed_ms: float = 0.0
    kernels_per_step: float = 0.0


class GemmSite(msgspec.Struct):
    """fp16/bf16 GEMM ops of one op name, dtype and shape whose GEMM dims are not multiples of 8."""

    op: str  # aten::mm | aten::bmm | aten::addmm | ...
    dtype: str  # Kineto's `Input type` of the matrices ("c10::Half", "c10::BFloat16")
    shapes: str  # the op's `Input Dims` as recorded
    dims: dict[str, int]  # GEMM dims {"M": .., "K": .., "N": ..}
    misaligned: list[str]  # which of M, K, N are not multiples of 8
    count: int
    device_ns: int  # kernels these ops launched (by correlation)
    host_ns: int  # the ops' own host duration
    first_ts_ns: int  # start of the longest occurrence


class MisalignedGemms(msgspec.Struct):
    """fp16/bf16 GEMMs whose M, K or N are not multiples of 8 (metrics/gemm.py)."""

    count: int = 0
    device_ns: int = 0
    host_ns: int = 0
    # "device" when the kernels were joined by correlation, "host" when only the op time is known.
    time_source: str = "device"
    # fp16/bf16 GEMM ops with recorded shapes in the window (aligned or not).
    half_gemms: int = 0
    sites: list[GemmSite] = []


class KernelFill(msgspec.Struct):
    """One compute kernel name's launch shape (duration-weighted means over its invocations)."""

    name: str
    kind: str
    count: int
    ns: int
    blocks_per_sm: float
    occupancy_pct: float | None
    idle_ns: int  # ns x (1 - min(blocks per SM, 1)), summed: SM-time its launches left empty
    first_ts_ns: int  # start of its longest invocation


class SmFill(msgspec.Struct):
    """How well compute kernels fill the SMs (metrics/occupancy.py)."""

    # Compute kernel time (non-communication, `blocks per SM` known), clipped to the window.
    kernel_ns: int = 0
    # Part of it in kernels with fewer blocks than SMs (blocks per SM < 1).
    underfilled_ns: int = 0
    # SM-time left empty while compute kernels ran: integral of 1 - min(sum of concurrent
    # blocks per SM, 1) over compute-kernel time (TBP's "est. SM efficiency" complement).
    sm_idle_ns: int = 0
    sm_efficiency_pct: float | None = None
    occupancy_pct: float | None = None  # duration-weighted est. achieved occupancy
    # sm_idle_ns split by kernel kind (elementwise, reduction, gemm, ...), and the part in plain
    # FP32 (SIMT) GEMM/conv kernels, so rules that price those kernels are not counted twice.
    idle_by_kind: dict[str, int] = {}
    idle_fp32_simt_ns: int = 0
    top: list[KernelFill] = []
    # The SM/CU count the fill is measured against and where it comes from (metrics/occupancy.py
    # sm_count): Kineto's blocks per SM use deviceProperties' numSms; without it, grid / the table's.
    sms: int | None = None
    sms_source: str = ""


class Accumulation(msgspec.Struct):
    """Gradient reductions in the micro-batches of accumulating steps (metrics/accumulation.py)."""

    wrapper: str  # "FSDP2", "DDP" or "FSDP": whose root forwards mark the micro-batches
    steps: int  # window steps holding one optimizer step and two or more micro-batches
    synced_steps: int  # of those, the steps whose every micro-batch reduced gradients
    micro_batches: float  # per step read (mean)
    reductions_per_micro_batch: int  # reduction calls in a micro-batch of a synced step (median)
    early_ns: int  # reduction time in all but the last micro-batch of the synced steps, summed
    kinds: list[str] = []  # "all-reduce", "reduce-scatter": the kinds of those early reduction calls


class RuleSignals(msgspec.Struct):
    """Narrow numbers for the diagnosis rules that the headline metrics do not carry."""

    compute_capability: str | None = None
    device_memory_bytes: int | None = None
    blocking_copies: list[CopySite] = []
    comm: CommLayout | None = None
    # Allocator calls (cudaMalloc/cudaFree/cudaHostAlloc, hip*, cuMem*) inside the window.
    alloc_calls: int = 0
    alloc_ns: int = 0
    # GEMM/convolution device time by math path: tensor cores vs plain FP32 (SIMT) kernels.
    matmul_ns: int = 0
    tensor_core_ns: int = 0
    fp32_simt_ns: int = 0
    fp32_simt_top: list[NamedTime] = []
    # cuDNN NCHW<->NHWC layout conversions around convolutions.
    layout_transpose_ns: int = 0
    layout_transpose_count: int = 0
    conv_ns: int = 0
    # Optimizer internals per step: kernel launches and aten ops inside Optimizer.step, and which
    # implementation the op names reveal (foreach / fused / per-parameter loop).
    optimizer_launches_per_step: float | None = None
    optimizer_ops_per_step: float | None = None
    optimizer_impl: str | None = None  # "foreach" | "fused" | "single_tensor" | None
    optimizer_classes: list[str] = []
    # Optimizer.step in the window: its ranges' host time (outermost ranges, clipped to the window),
    # and the device time of the kernels, copies and memsets launched inside them (by correlation).
    optimizer_step_ns: int = 0
    optimizer_device_ns: int = 0
    # aten::zero_ calls inside Optimizer.zero_grad per step (set_to_none=False).
    zero_grad_fills_per_step: float = 0.0
    # Notable host ops: name -> [count, total ns] in the window.
    markers: dict[str, list[int]] = {}
    # The DataLoader iterator class seen in `enumerate(DataLoader)#<cls>.__next__`.
    dataloader_iter: str | None = None
    # Communication kernels by collective: name -> [count, total ns, shortest ns].
    collectives: dict[str, list[int]] = {}
    # Gradient accumulation that reduces on every micro-batch (no no_sync / set_requires_gradient_sync).
    accumulation: Accumulation | None = None
    # Time inside DistributedDataParallel.forward not covered by any op it calls: DDP's own work
    # (with find_unused_parameters=True, mostly the autograd-graph search).
    ddp_forward_self_ns: int = 0
    # Autograd anomaly mode's NaN checks: aten::isnan / aten::_is_any_true / aten::item run by the
    # autograd engine on every backward node's outputs ([count, total ns] in the window).
    anomaly_checks: list[int] = []
    # HW-2: fp16/bf16 GEMMs with dims that are not multiples of 8 (needs record_shapes).
    misaligned_gemms: MisalignedGemms | None = None
    # HW-4: SM fill of compute kernels (needs Kineto's `blocks per SM` kernel args).
    sm_fill: SmFill | None = None
