"""Facts a live run records about one rank (the contract between probe/ and rules/).

The probe (``torchdoctor run``) fills these structs inside the user's job; the rules read them.
Every field is optional in spirit: a fact the probe could not read stays at its default
(``None`` or empty), and a rule that needs it must then stay silent or lower its confidence.
This module imports neither torch nor anything heavy: the analysis path reads these facts
from JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

import msgspec

# The probe keeps at most this many steps' timings in a rank's summary (probe/clock.py): a longer
# job's summary ends there however it ended.
SUMMARY_STEPS_KEPT = 100_000


class DataLoaderFacts(msgspec.Struct, omit_defaults=True):
    """One ``torch.utils.data.DataLoader`` the job iterated over."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    batch_size: int | None = None
    # Qualified name of the collate_fn ("torch.utils.data._utils.collate.default_collate" when default).
    collate_fn: str | None = None
    # Source location "file:line" of the user's DataLoader(...) call, for the permanent fix; for
    # a loader a library re-created from the user's (same dataset), the user's original call.
    call_site: str | None = None
    # The installed package whose code called DataLoader(...) ("transformers": the Trainer
    # builds it from TrainingArguments), and that line; None when the user's code called it.
    created_by: str | None = None
    library_site: str | None = None
    # For a library-built loader: the library function the user's code called (timm's
    # "create_loader"), the user's line that called it, and that function's parameter names (a
    # setting it forwards to DataLoader(...) is changed through it).
    library_call: str | None = None
    library_caller: str | None = None
    library_call_params: list[str] = []
    # Host syncs (.item() / .numpy() / .tolist() on tensors) seen inside collate_fn per batch.
    collate_syncs_per_batch: float | None = None
    # Mean time in collate_fn per batch, ms (num_workers=0 only: workers collate out of sight).
    collate_ms_mean: float | None = None
    # Workers only: share of batches already produced when the step asked for them, and the mean
    # wait for those (the handoff cost a ready batch still pays), ms.
    ready_share: float | None = None
    ready_wait_ms_mean: float | None = None
    dataset_len: int | None = None
    # Batches one epoch of this rank yields: len() of its batch sampler, so a DistributedSampler's
    # share and drop_last count (None for an IterableDataset, whose length only its end tells).
    batches_per_epoch: int | None = None
    # (index among the batches drawn, fingerprint) of the first batches drawn outside the profiler's window
    # (probe/batches.py): ranks with the same ones drew the same batches (DI-17).
    batch_samples: list[tuple[int, float]] = []
    # Mean wall time per batch spent in __next__ (ms), measured by the probe.
    next_ms_mean: float | None = None
    # Batches this process drew from it (its __next__ calls on the training thread): the training
    # loop's loader draws the most, an evaluation loader fewer.
    batches: int | None = None
    # Workers only, measured inside them (probe/workers.py), per batch: ms in the dataset's reads
    # (the fetch without the collate), ms in collate_fn (wall, and the worker's CPU time), and the
    # host conversions (.item()/.tolist()/.numpy()) collate_fn makes; over `worker_batches` batches.
    worker_pids: list[int] = []  # the most recent workers' process ids (their counter files: probe/workers.py)
    worker_batches: int | None = None
    worker_dataset_ms_mean: float | None = None
    worker_collate_ms_mean: float | None = None
    worker_collate_cpu_ms_mean: float | None = None
    worker_cpu_ms_mean: float | None = None  # the loading thread's CPU time per batch (reads and collate)
    worker_collate_syncs_per_batch: float | None = None
    # Whether the dataset's reads draw random numbers in the workers (random augmentation), from
    # the workers' first batches; None when not checked.
    worker_random_draws: bool | None = None
    # The same in the training process, for a loader without workers (num_workers=0): its fetches
    # advanced the process's global random number generators; None when not checked.
    dataset_random_draws: bool | None = None


class DDPFacts(msgspec.Struct, omit_defaults=True):
    """One ``DistributedDataParallel`` wrapper: constructor arguments and logging data."""

    find_unused_parameters: bool | None = None
    static_graph: bool | None = None
    gradient_as_bucket_view: bool | None = None
    bucket_cap_mb: float | None = None
    broadcast_buffers: bool | None = None
    call_site: str | None = None
    # The installed package that wrapped the model ("transformers": the Trainer, through
    # accelerate), when the user's code did not; its settings, not a DDP(...) line, change it.
    created_by: str | None = None
    # As DataLoaderFacts: the library function that wrapped the model, where the user called it,
    # and its parameter names.
    library_call: str | None = None
    library_caller: str | None = None
    library_call_params: list[str] = []
    # From model._get_ddp_logging_data() (names kept as torch spells them).
    unused_parameter_size: int | None = None
    bucket_sizes: list[int] = []
    num_buckets: int | None = None
    can_set_static_graph: bool | None = None
    avg_forward_compute_time_ns: float | None = None
    avg_backward_compute_time_ns: float | None = None
    avg_backward_comm_time_ns: float | None = None
    avg_backward_compute_comm_overlap_time_ns: float | None = None
    total_parameter_bytes: int | None = None
    backend_name: str | None = None


class FSDPFacts(msgspec.Struct, omit_defaults=True):
    version: int | None = None  # 1 or 2
    sharding_strategy: str | None = None
    reshard_after_forward: bool | None = None
    limit_all_gathers: bool | None = None
    forward_prefetch: bool | None = None
    backward_prefetch: str | None = None
    cpu_offload: bool | None = None
    mixed_precision: str | None = None
    # FSDP2: fully_shard units in the model and the unsharded parameter MB each one all-gathers
    # (its own parameters, nested units excluded): median and largest.
    units: int | None = None
    unit_mb_median: float | None = None
    unit_mb_max: float | None = None
    model_mb: float | None = None  # all units together: the unsharded parameters
    # The root's first parameter's dtype ("bfloat16"): what the all-gathers move without a mixed-precision
    # policy (a model built in bf16 already halves them).
    param_dtype: str | None = None


class TensorParallelFacts(msgspec.Struct, omit_defaults=True):
    """Parameters sharded by tensor parallelism (DTensors outside any fully_shard unit:
    ``parallelize_module``), from the model's roots."""

    params: int = 0  # DTensor parameters
    layers: int = 0  # modules with a DTensor parameter of their own
    model_mb: float | None = None  # every parameter, unsharded (a DTensor's numel is the global one)
    mesh: str | None = None  # the first DTensor parameter's mesh, e.g. "tp=2" or "(2,)"


class OptimizerFacts(msgspec.Struct, omit_defaults=True):
    cls: str | None = None
    foreach: bool | None = None
    fused: bool | None = None
    capturable: bool | None = None
    num_params: int | None = None
    num_param_tensors: int | None = None
    # The device type of its parameters ("cpu", "cuda"...), the first parameter's.
    param_device: str | None = None
    # Whether this torch has a fused update for this class and these parameters (the device check
    # torch makes at the first fused step, and a `fused` argument in the constructor); None: not
    # known (a torch without the check, or an optimizer that is not torch.optim's).
    fused_available: bool | None = None
    # The first parameter group's settings that change the update's work: weight_decay, momentum,
    # nesterov, amsgrad, maximize, differentiable (those the class has).
    settings: dict[str, float | bool] = {}
    call_site: str | None = None
    # The installed package that created it ("transformers": Trainer.create_optimizer), if not the user.
    created_by: str | None = None


class ZeroGradFacts(msgspec.Struct, omit_defaults=True):
    """An optimizer's zero_grad called with set_to_none=False (it fills gradients with zeros), and
    who passed it: the user's own line, or a library that wraps the optimizer (Opacus' DPOptimizer
    defaults to False and forwards it to the optimizer it wraps)."""

    optimizer: str | None = None  # the class whose torch.optim zero_grad ran ("SGD")
    call_site: str | None = None  # the user's own call, when the user's code passed False
    called_by: str | None = None  # else the library that passed it ("opacus")
    library_site: str | None = None  # the library's line that called zero_grad
    caller: str | None = None  # the user's line that led into the library
    entry: str | None = None  # the library function that line called ("DPOptimizer.zero_grad")


class ModuleDeviceFacts(msgspec.Struct, omit_defaults=True):
    """A module whose parameters/buffers sit on another device than the bulk of the model."""

    name: str
    device: str
    model_device: str
    num_params: int = 0


class EmbeddingFacts(msgspec.Struct, omit_defaults=True):
    name: str
    num_embeddings: int
    embedding_dim: int
    bytes: int
    sparse: bool = False
    # True when the same full table is replicated on every rank (plain DDP, no sharding).
    replicated: bool = True


class GraphBreakFacts(msgspec.Struct, omit_defaults=True):
    """One graph break as Dynamo recorded it while compiling (``torch._dynamo.utils.graph_break_reasons``)."""

    reason: str  # the first line of Dynamo's message: its graph-break type, or a legacy reason
    # Graph-break registry id ("GB0124") with its explanation and hints, when this torch has one.
    gb_id: str | None = None
    explanation: str | None = None
    hints: list[str] = []
    # The user's innermost frame in the break's stack ("file:line"), its source line and function;
    # torch's and torchdoctor's frames are never named. None: the stack held no user frame.
    location: str | None = None
    source: str | None = None
    function: str | None = None
    # The break itself is in torch's code, reached from ``location`` (e.g. torch.optim's deliberate
    # break around ``step()``), or the stack held no user frame at all.
    in_torch: bool = False
    # Times Dynamo met this break (same reason, same line) while compiling: once per compiled
    # frame, resume function or recompile that reaches it, not once per step.
    compiles: int = 1
    # A data-dependent branch rewritten with torch.where (compile/rewrite.py), as a unified diff
    # against the user's file, and its validation after the run (compile/rewrite_check.py):
    # True validated, False refuted, None not checked (``rewrite_check`` says why).
    rewrite: str | None = None
    rewrite_ok: bool | None = None
    rewrite_check: str | None = None


class RecompileFacts(msgspec.Struct, omit_defaults=True):
    """Recompiles of one compiled frame for one cause (the failing guard's kind, input and dimension),
    from Dynamo's compilation metrics (probe/recompiles.py): a frame that recompiled for two causes
    has two entries."""

    frame: str  # the compiled function's name
    location: str | None = None  # "file:line" of its first line
    count: int = 0  # compiles after the first (the limit-hit attempt not counted)
    # The latest failing guard as Dynamo printed it ("tensor 'x' size mismatch at index 1.
    # expected 64, actual 80", "n == 2"), and what kind of guard it is: size, stride, rank,
    # dtype, requires_grad, device, global_state, value, identity, length, other.
    guard: str = ""
    kind: str = "other"
    # The guarded input ('x', "L['self'].scale") and, for a size or stride, its dimension.
    tensor: str | None = None
    dim: int | None = None
    # Distinct values the guarded size or Python value took, in the order Dynamo saw them.
    values: list[str] = []
    # The frame hit torch._dynamo.config.recompile_limit (it runs in eager from then on): set on the
    # entry of the cause of its last recompile.
    limit_hit: bool = False
    compile_s: float = 0.0  # seconds spent on its recompiles


class CompileFacts(msgspec.Struct, omit_defaults=True):
    used: bool = False
    graph_breaks: int | None = None
    graph_break_reasons: list[str] = []
    breaks: list[GraphBreakFacts] = []
    # Recompiles in all (every compile of a frame after its first); per frame and cause in ``recompile_frames``.
    recompiles: int | None = None
    recompile_reasons: list[str] = []
    recompile_frames: list[RecompileFacts] = []
    # Compiled frame id -> its code's name, to name the trace's "Torch-Compiled Region: F/N"
    # ranges (a graph break's resume function is "torch_dynamo_resume_in_<function>_at_<line>").
    frame_names: dict[str, str] = {}
    unique_graphs: int | None = None
    cache_hits: int | None = None
    cache_misses: int | None = None
    cudagraph_skips: int | None = None
    # Hits, misses, bypasses per cache ("fx_graph.hit", "aot_autograd.miss", ...: Dynamo's counters),
    # and the cache pack `run --cache` loaded before the job compiled, or why it was refused.
    cache_counts: dict[str, int] = {}
    cache_pack: str | None = None
    # Inductor's cache directory, and whether it is Inductor's default (under the temporary
    # directory: gone with the machine, a CI runner or a container).
    cache_dir: str | None = None
    cache_dir_default: bool | None = None
    # Device-agnostic hash of each graph Dynamo captured, in capture order (probe/compile_cache.py):
    # equal graphs hash equal on any machine.
    graph_hashes: list[str] = []
    # Compile seconds so far: every frame's compile and the backward graphs compiled at their first
    # backward; split into Dynamo's tracing and the backend's (AOTAutograd + Inductor) work.
    compile_time_s: float | None = None
    dynamo_s: float | None = None
    backend_s: float | None = None
    # When the first compile began (epoch seconds, Dynamo's start_time_us): a compile that runs
    # before the probe sees any training activity still belongs to the job's training wall time.
    first_compile_at: float | None = None


class CpuFacts(msgspec.Struct, omit_defaults=True):
    logical_cpus: int | None = None
    affinity: list[int] = []
    torch_num_threads: int | None = None
    torch_num_interop_threads: int | None = None
    local_world_size: int | None = None
    # CPU time of the main process and of the DataLoader workers, percent of one core over the run.
    main_process_cpu_pct: float | None = None
    dataloader_workers_cpu_pct: float | None = None
    # CPU time of the process's other child processes since its first training activity (not its
    # DataLoader workers, the probe's own, nor probed processes such as ranks it started): a
    # data-augmentation pool outside torch's DataLoader (nnU-Net's batchgenerators augmenters), a
    # multiprocessing Pool; those alive at the summary, plus the reaped ones when no DataLoader
    # worker or probed child shares RUSAGE_CHILDREN with them (a `subprocess` call counts there
    # too). Percent of one core over the run (probe/summary.py).
    child_processes_cpu_pct: float | None = None
    numa_nodes: int | None = None
    # Busy time of the CPUs in the affinity mask over the same interval, by every process on the
    # machine (this job included), percent of one core: with the job's own share it tells how
    # much of those CPUs other processes took.
    affinity_cpus_busy_pct: float | None = None
    # NUMA node -> how many CPUs of the affinity mask are on it (keys are node numbers as text),
    # and whether the running torch's torchrun has --numa-binding (torch.numa.binding).
    affinity_numa: dict[str, int] = {}
    numa_binding_available: bool | None = None


class DeviceFacts(msgspec.Struct, omit_defaults=True):
    kind: str = "cpu"  # "cpu", "cuda", "rocm", "xpu", "mps"
    name: str | None = None
    count: int | None = None
    capability: str | None = None
    total_memory_bytes: int | None = None
    # NVML readings over the run, only when NVML is available: never invented.
    nvml_util_pct_mean: float | None = None
    nvml_mem_used_bytes_max: int | None = None
    max_memory_allocated_bytes: int | None = None
    # The rank's accelerator on the host's topology (sysfs): PCI address and NUMA node (None:
    # unknown), and the CPUs of that node.
    pci_address: str | None = None
    numa_node: int | None = None
    numa_node_cpus: list[int] = []
    num_alloc_retries: int | None = None
    # The caching allocator's reserved peak and its peak of inactive split blocks (fragmentation:
    # memory_stats' inactive_split_bytes.all.peak), over the run.
    max_memory_reserved_bytes: int | None = None
    inactive_split_bytes_peak: int | None = None


class BackendFacts(msgspec.Struct, omit_defaults=True):
    cudnn_benchmark: bool | None = None
    cudnn_deterministic: bool | None = None
    cudnn_allow_tf32: bool | None = None
    cuda_matmul_allow_tf32: bool | None = None
    float32_matmul_precision: str | None = None
    deterministic_algorithms: bool | None = None
    anomaly_detection: bool | None = None
    autocast_used: bool | None = None
    autocast_dtype: str | None = None
    sync_debug_mode: int | None = None
    param_dtypes: dict[str, int] = {}


class StepTiming(msgspec.Struct, omit_defaults=True):
    """Probe timings of one optimizer step (wall clock, ms)."""

    step: int
    total_ms: float
    dataloader_ms: float = 0.0
    forward_ms: float = 0.0
    backward_ms: float = 0.0
    optimizer_ms: float = 0.0
    # DDP's communication time, read from its logging data on the iterations DDP samples (1-10,
    # then 2 in every 100; `comm_sampled`): 0 on the other steps, whose collectives are part of
    # backward_ms (see `sampled_comm_median`). No probe timing for FSDP: 0 on every step.
    comm_ms: float = 0.0
    other_ms: float = 0.0
    samples: int | None = None
    # Part of dataloader_ms spent on batches that workers had not produced yet when the step asked
    # (all of it with num_workers=0 or when readiness is unknown). The rest is the handoff of ready
    # batches (queue, unpickling, shared memory), which more workers do not shorten.
    dataloader_unready_ms: float | None = None
    # DataLoader iterators created in this step (a new epoch: ``for batch in loader`` starting
    # again) and the time spent creating them (non-persistent workers start here).
    epoch_starts: int = 0
    loader_iter_ms: float = 0.0
    # Time autograd's anomaly mode spent recording a stack trace for every graph node the forward
    # created (torch.autograd.set_detect_anomaly(True)): its forward cost, measured.
    anomaly_stack_ms: float = 0.0
    # The training thread's scheduler counters over the step (Linux /proc schedstat; None where
    # unavailable): time on a CPU, and time it was ready to run but waited for a CPU that
    # another thread or process held (the run-queue delay: the step's CPU contention, measured).
    thread_cpu_ms: float | None = None
    run_delay_ms: float | None = None
    # Time the training thread spent blocked in checkpoint saves in this step (torch.save, DCP
    # save and the blocking part of async_save; nested calls counted once), and how many.
    checkpoint_ms: float = 0.0
    checkpoint_saves: int = 0
    # The training thread's minor page faults over the step and its system CPU time (part of
    # thread_cpu_ms), from getrusage(RUSAGE_THREAD) on Linux; None where unavailable. Thousands of
    # faults per step: the allocator gives memory back to the kernel and faults it in again (HO-15).
    minor_faults: int | None = None
    thread_sys_ms: float | None = None
    # True on the steps whose comm_ms DDP's logging data measured (absent in run directories
    # written before 2026-12-05: `sampled_comm_median` then takes the steps with comm_ms > 0).
    comm_sampled: bool = False
    # Part of forward_ms: the model's forwards run without autograd (torch.no_grad or
    # inference_mode) on the training thread, as an evaluation or an RL rollout between updates.
    inference_ms: float = 0.0
    # Part of inference_ms: the training step's own: those of modules whose forward had not run with
    # autograd (a DQN target network, a frozen distillation teacher, an EMA copy), and those on an
    # input that a forward with autograd takes later in the same step (OpenCLIP's --accum-freq and
    # other gradient caching: every micro-batch's features first without autograd, then again with).
    frozen_inference_ms: float = 0.0


def forward_unseen(steps: Sequence[StepTiming]) -> bool:
    """True when the probe timed no forward in any step after step 0 although backward passes ran:
    the model is called as ``model.forward(x)``, not ``model(x)``, and module hooks run only through
    ``__call__``. Its forward time is then part of ``other_ms`` on every step."""
    steady = [s for s in steps if s.step >= 1]
    return bool(steady) and all(s.forward_ms == 0 for s in steady) and any(s.backward_ms > 0 for s in steady)



def sampled_comm_median(steps: Iterable[StepTiming]) -> float:
    """Median ``comm_ms`` over the steps DDP sampled (``comm_sampled``; in older run directories,
    the steps with comm_ms > 0), 0.0 when none was: over all steps, DDP's unsampled ones made it 0
    past a few dozen steps."""
    steps = list(steps)
    vals = [s.comm_ms for s in steps if s.comm_sampled]
    if not vals:
        vals = [s.comm_ms for s in steps if s.comm_ms and s.comm_ms > 0]
    return float(statistics.median(vals)) if vals else 0.0


class LoadedFile(msgspec.Struct, omit_defaults=True, array_like=True):
    """A file the training thread loaded (torch.load, DCP load) before its first step ended."""

    path: str  # absolute
    mtime: float | None = None  # its modification time when loaded (seconds since the epoch)


class RankFacts(msgspec.Struct, omit_defaults=True):
    """Everything the probe learned about one rank of a live run."""

    rank: int = 0
    local_rank: int | None = None
    world_size: int = 1
    hostname: str | None = None
    pid: int | None = None
    torch_version: str | None = None
    # torchao's version when it is installed in the job's environment (read from its metadata, never
    # imported): HW-16's FP8 advice names it; "" when it is not installed, None when unknown.
    torchao_version: str | None = None
    # Reinforcement-learning environment libraries the job imported (ENV_LIBRARIES): the advice on
    # Python between and in steps speaks of environment steps only where there are environments.
    env_libraries: list[str] = []
    distributed_backend: str | None = None
    dataloaders: list[DataLoaderFacts] = []
    ddp: list[DDPFacts] = []
    fsdp: list[FSDPFacts] = []
    optimizers: list[OptimizerFacts] = []
    # Who calls zero_grad(set_to_none=False), per optimizer (the first such call of each, at most 4).
    zero_grad_fills: list[ZeroGradFacts] = []
    modules_off_device: list[ModuleDeviceFacts] = []
    embeddings: list[EmbeddingFacts] = []
    compile: CompileFacts = msgspec.field(default_factory=CompileFacts)
    cpu: CpuFacts = msgspec.field(default_factory=CpuFacts)
    device: DeviceFacts = msgspec.field(default_factory=DeviceFacts)
    backends: BackendFacts = msgspec.field(default_factory=BackendFacts)
    # Environment variables that matter for performance (NCCL_*, OMP_NUM_THREADS, CUDA_LAUNCH_BLOCKING, ...).
    env: dict[str, str] = {}
    steps: list[StepTiming] = []
    # The steps in the profiler's window (``profile_steps``), timed as ``steps`` but left out of them:
    # the profiler slows them. What the job did in them still counts (DI-15's saves).
    profiled_steps: list[StepTiming] = []
    # Wall seconds from the first training activity (first forward, batch or optimizer step) to
    # this summary: the job-level denominator for one-off costs such as compiling.
    train_wall_s: float | None = None
    # Peak resident memory of this rank's process at this summary (getrusage ru_maxrss, MiB; its
    # DataLoader workers are processes of their own): what `fix` compares between its arms, since a
    # remedy that keeps freed memory (memory.host_allocator) trades resident memory for speed.
    peak_rss_mib: float | None = None
    # Host syncs counted by the probe per step (e.g. loss.item() every step), by call site.
    host_syncs_per_step: float | None = None
    host_sync_sites: dict[str, int] = {}
    # Where the job's first blocking checkpoint save was called: its "file:line", or, when a library
    # saves for it, "PKG's FUNCTION() at file:line" (the library function the user's line called).
    checkpoint_site: str | None = None
    # What the training thread loaded before its first step ended (a resumed checkpoint, pretrained
    # weights), the first 16: `fix` tells an arm that resumed from an earlier arm's checkpoint.
    loaded_files: list[LoadedFile] = []
    # Steps whose loss (the first backward's) the probe read (plain floating-point CPU scalars: free
    # to read; device losses are never read), how many were NaN or inf, the first such step and the
    # last step with a finite one.
    losses_read: int = 0
    losses_nonfinite: int = 0
    first_nonfinite_step: int | None = None
    last_finite_step: int | None = None
    # The first finite losses read, as (step, loss): ranks with the same ones train the same model on the
    # same batches (DI-17).
    loss_samples: list[tuple[int, float]] = []
    # Tensor parallelism without FSDP (parallelize_module's DTensor parameters); None: none seen.
    tensor_parallel: TensorParallelFacts | None = None
    # The directories it saved into (torch.save, DCP save) once a step had ended: its checkpoints,
    # not a dataset it prepared before training (first 16, absolute).
    checkpoint_dirs: list[str] = []
    # Where the model's first forward without autograd after step 0 was called from (the user's
    # line, or the library function their line called): the evaluation or rollout's call (HO-16).
    inference_site: str | None = None
    # Whether that forward ran under torch.inference_mode() (None: no such forward seen).
    inference_mode: bool | None = None
    # Top-level modules the forward timing could not hook because they are TorchScript modules
    # (torch.jit.script / torch.jit.trace), which refuse forward hooks: their forward is untimed.
    script_roots: int = 0
    # Probe problems, logged once each: the job carried on.
    probe_errors: list[str] = []
    # Path of the profiler-window trace this rank wrote, relative to the run directory.
    trace_file: str | None = None
    # What defined step boundaries: "optimizer", "backward" or "dataloader" (the probe's fallbacks).
    step_source: str | None = None
    # Half-open [first, end) step range the profiler window covered. Those steps are left out of
    # ``steps`` (profiling inflates them); they are in the trace instead.
    profile_steps: list[int] = []
    # The last step the probe closed (its progress record, rewritten at every step boundary, so
    # it survives a kill): covers steps ``steps`` leaves out. None: no step closed.
    last_step: int | None = None
    # How the process ended as its probe saw it: "exit" (Python shut down: end of script or
    # sys.exit), "exception:<Type>" (an uncaught exception), None when the probe never saw the end
    # (killed by a signal, os._exit, or still running).
    ended: str | None = None
    # Exit status of the process, filled in by the wrapper after the job: the job's own status for
    # the process it started, else what the parent process (torchrun, mp.spawn) reaped. Negative:
    # killed by signal ``-exit_code``, named in ``signal``. ``exit_time``: when it was reaped (epoch s).
    exit_code: int | None = None
    signal: str | None = None
    exit_time: float | None = None
    # The job ran its own torch.profiler (the probe's window stood aside), and the trace files or
    # tensorboard_trace_handler directories it named (absolute paths).
    own_profiler: bool = False
    # The name of the thread the job trains on, when it is not the main thread (probe.core's
    # `on_training_thread`): the probe times that thread's steps.
    training_thread: str | None = None
    own_traces: list[str] = []


def trains(facts: RankFacts | None) -> bool:
    """The process's steps are training steps: its step clock ran on optimizer steps or backwards."""
    return facts is not None and facts.step_source in ("optimizer", "backward")


def evaluation_only(facts: RankFacts | None) -> bool:
    """The process only evaluated: its steps are DataLoader batches whose forwards all ran without
    autograd (no_grad / inference_mode), with no backward and no optimizer in the whole run."""
    if facts is None or facts.step_source != "dataloader" or facts.optimizers or not facts.steps:
        return False
    forward = sum(s.forward_ms for s in facts.steps)
    return (forward > 0 and not any(s.backward_ms for s in facts.steps)
            and sum(s.inference_ms for s in facts.steps) >= 0.99 * forward)
