"""The remedies `torchdoctor fix` can apply: what each answers, changes, risks and needs.

This module is metadata only (no torch): the wrapper reads it to choose and explain remedies,
the bootstrap reads it inside the job to validate the ids it was given. The code that applies a
remedy lives in the ``patch_*`` modules, the permanent code change in ``suggest``.

Safety classes:
  safe          the job computes bit-for-bit the same losses (the A/B loop checks it);
  numerics      results change within a tolerance (other rounding or precision);
  experimental  may change numerics and behaviour; never picked automatically.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Literal

from ..advice import host_allocator

Safety = Literal["safe", "numerics", "experimental"]
SAFETY_RANK: dict[str, int] = {"safe": 0, "numerics": 1, "experimental": 2}
ValueKind = Literal["", "int", "float", "dtype", "mode"]
# What compile=VALUE accepts: a torch.compile mode, or "dynamic" (dynamic=True: one graph for all the
# shapes a recompiling job feeds it). "reduce-overhead" is the cudagraphs remedy.
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs", "dynamic")
# DDP's own default bucket cap (torch/nn/parallel/distributed.py); the restore value of ddp.bucket_cap.
DDP_DEFAULT_BUCKET_MB = 25.0
# DataLoader arguments torch refuses without workers (DataLoader.__init__ raises ValueError), and their off value.
WITH_WORKERS_ONLY: dict[str, object] = {"persistent_workers": False, "prefetch_factor": None,
                                        "multiprocessing_context": None}


@dataclass(frozen=True)
class Remedy:
    id: str
    answers: tuple[str, ...]  # catalogue ids of the findings it fixes
    changes: str
    safety: Safety
    why_safety: str
    preconditions: str
    # Constructor whose call site gets a diff ("DataLoader", "DistributedDataParallel", "optimizer");
    # None: a process-wide setting, suggested as a snippet.
    target: str | None = None
    snippet: str = ""
    value: ValueKind = ""  # what ID=VALUE accepts ("" = no value)
    value_help: str = ""
    value_min: int = 1  # the least an "int" value may be (0 workers: load in the training process)
    gpu_only: bool = False
    # Picked together with this remedy: its own finding can only fire once that one is applied
    # (DL-6 "workers restarted every epoch" and DL-7 "bursty loader" need workers to be seen).
    follows: str | None = None
    # Costs nothing by construction: it only removes work (a debug check, a graph traversal), so a
    # measurement that cannot tell it from the baseline keeps it (``why_free`` says why).
    free: bool = False
    why_free: str = ""


_DL_SAME = ("same batches in the same order: the sampler still runs in the main process and "
            "in_order=True keeps the order (a dataset drawing random numbers in __getitem__ would "
            "draw other ones in workers: the loss check catches that)")

REMEDIES: tuple[Remedy, ...] = (
    Remedy("dataloader.workers", ("DL-2", "DL-1", "DL-3"),
           "DataLoader(num_workers=N): load batches in N worker processes instead of the training "
           "process (N = CPUs in the affinity mask // local ranks - 1, at least 1); N = 0 loads them in "
           "the training process, where a batch costs less to make than to receive from a worker",
           "safe", _DL_SAME,
           "N <= CPUs in the affinity mask // local ranks; not for an IterableDataset (every worker "
           "would replay the whole stream)", target="DataLoader", value="int",
           value_help="workers per DataLoader, 0 for none", value_min=0),
    Remedy("dataloader.pin_memory", ("DL-4",), "DataLoader(pin_memory=True): page-locked batches, "
           "asynchronous host-to-device copies", "safe", "copies the same bytes",
           "an accelerator (pinned memory only speeds up copies to a device)", target="DataLoader",
           gpu_only=True),
    Remedy("dataloader.persistent_workers", ("DL-6",), "DataLoader(persistent_workers=True): keep "
           "the workers alive across epochs", "safe", _DL_SAME + "; each later epoch still draws the "
           "random number a new iterator draws, so a shuffled sampler keeps the job's order (made "
           "permanent, persistent_workers=True shuffles later epochs differently, as randomly)",
           "num_workers > 0",
           target="DataLoader", follows="dataloader.workers"),
    Remedy("dataloader.prefetch", ("DL-7",), "DataLoader(prefetch_factor=F): a deeper queue of "
           "batches per worker (F = max(4, 2 x current) unless given)", "safe", _DL_SAME,
           "num_workers > 0", target="DataLoader", value="int", value_help="batches per worker",
           follows="dataloader.workers"),
    Remedy("ddp.find_unused_false", ("DI-7",), "DistributedDataParallel(find_unused_parameters="
           "False): no traversal of the autograd graph every iteration", "safe",
           "the same gradients are reduced", "DDP saw no unused parameter (unused_parameter_size == 0); "
           "with unused parameters DDP would stop with an error", target="DistributedDataParallel",
           free=True, why_free="it only skips DDP's search of the autograd graph for unused parameters"),
    Remedy("ddp.static_graph", ("DI-8",), "DistributedDataParallel(static_graph=True)", "safe",
           "the same gradients are reduced", "DDP reported can_set_static_graph (the same parameters "
           "are used in every iteration)", target="DistributedDataParallel"),
    Remedy("ddp.grad_as_bucket_view", ("DI-9",), "DistributedDataParallel(gradient_as_bucket_view="
           "True): gradients are views into the communication buckets (no copy, less memory)", "safe",
           "the same gradients, without the copy", "the job does not call detach_() on .grad or replace "
           ".grad tensors", target="DistributedDataParallel"),
    Remedy("ddp.bucket_cap", ("DI-10",), f"DistributedDataParallel(bucket_cap_mb=MB): fewer, larger "
           f"all-reduces (MB = DDP's default {DDP_DEFAULT_BUCKET_MB:g} unless given)", "safe",
           "the same sums; with more than 2 ranks a collective may add in another order, which the "
           "loss check would show", "DDP (any backend)", target="DistributedDataParallel", value="float",
           value_help="bucket size in MiB"),
    Remedy("fsdp.keep_unsharded", ("DI-16",), "fully_shard(module, reshard_after_forward=False) on every "
           "unit: parameters stay unsharded from forward to backward, so backward does not all-gather them "
           "again (one all-gather per unit and step instead of two)", "safe",
           "the same parameters and gradients; it costs memory: every unit's unsharded parameters stay "
           "allocated through the step", "FSDP2 (fully_shard) imported after torch starts; memory for the "
           "unsharded parameters", target="fully_shard"),
    Remedy("fsdp.prefetch", ("DI-12",), "FullyShardedDataParallel(backward_prefetch=BackwardPrefetch.BACKWARD_PRE, "
           "forward_prefetch=True): every FSDP1 unit issues the next unit's all-gather before it computes", "safe",
           "the same collectives in another order: the same numbers (one more unit's parameters unsharded at a time)",
           "FSDP1 (FullyShardedDataParallel); FSDP2 (fully_shard) prefetches by itself", target="FullyShardedDataParallel"),
    Remedy("optim.foreach", ("HO-9",), "optimizer(foreach=True): one multi-tensor kernel per operation "
           "instead of a Python loop over parameters", "safe",
           "bit-identical updates (checked for Adam and SGD on torch 2.13 CPU)",
           "an optimizer that takes foreach; fused not asked for", target="optimizer"),
    Remedy("optim.fused", ("HO-9", "HO-18"), "optimizer(fused=True): one fused kernel for the whole update",
           "numerics", "fused kernels round differently (2e-7 on Adam, torch 2.13 CPU)",
           "an optimizer that takes fused; floating-point parameters on a device with fused kernels",
           target="optimizer"),
    Remedy("cudnn.benchmark", ("CG-5",), "torch.backends.cudnn.benchmark = True: cuDNN times its "
           "convolution algorithms once per shape and keeps the fastest", "numerics",
           "other algorithms round differently", "an NVIDIA GPU with cuDNN; static input shapes",
           snippet="torch.backends.cudnn.benchmark = True  # at start-up, static input shapes only",
           gpu_only=True),
    Remedy("precision.tf32", ("HW-1",), "torch.set_float32_matmul_precision('high'): TF32 tensor "
           "cores for float32 matmuls", "numerics", "TF32 keeps 10 mantissa bits in the products",
           "an NVIDIA GPU (it only changes anything from compute capability 8.0)",
           snippet="torch.set_float32_matmul_precision('high')  # at start-up", gpu_only=True),
    Remedy("precision.autocast", ("HW-1",), "torch.autocast(dtype=bfloat16) around the model's "
           "forward (the loss outside it stays float32)", "numerics", "bfloat16 activations",
           "a device with bfloat16 support; fp16 is refused (it needs a GradScaler in the loop)",
           value="dtype", value_help="bf16",
           snippet="with torch.autocast(device_type=DEVICE, dtype=torch.bfloat16):\n    out = model(x)"),
    Remedy("debug.off", ("HO-8",), "unset CUDA_LAUNCH_BLOCKING and TORCH_DISTRIBUTED_DEBUG=DETAIL, "
           "turn autograd anomaly detection off", "safe", "debug modes check, they do not compute",
           "none", snippet="# remove set_detect_anomaly(True) / detect_anomaly() from the training loop\n"
           "unset CUDA_LAUNCH_BLOCKING TORCH_DISTRIBUTED_DEBUG", free=True,
           why_free="it only turns debug checks off: synchronous launches, anomaly tracing, DDP consistency checks"),
    Remedy("memory.expandable_segments", ("HW-18", "HW-7"), "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
           "(added to the variable's other settings): the caching allocator grows its segments instead of "
           "reserving new ones, so freed blocks of other sizes can be reused", "safe",
           "the allocation strategy only: the same tensors, kernels and numbers", "an NVIDIA GPU; the variable is set "
           "at start-up, before torch initialises CUDA", gpu_only=True,
           snippet="export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
    Remedy("memory.host_allocator", ("HO-15",), "glibc malloc keeps freed memory in the process "
           "(MALLOC_MMAP_THRESHOLD_=32 MiB, MALLOC_TRIM_THRESHOLD_=256 MiB, MALLOC_TOP_PAD_=256 MiB, MALLOC_MMAP_MAX_=0; "
           "mallopt in the running process): the step's buffers, those above 32 MiB included, are reused from the "
           "heap instead of being unmapped and faulted in again", "safe",
           "the allocation strategy only: the same tensors and numbers; resident memory stays at the heap's "
           "high-water mark instead of going back to the kernel between steps (word_language_model: peak "
           "resident 0.5 -> 1.2-1.5 GiB; `fix` prints both)", "glibc (Linux); a job that sets "
           "its own thresholds or preloads jemalloc/tcmalloc keeps its choice",
           snippet=host_allocator.SNIPPET),
    Remedy("memory.no_checkpoint", ("HW-19",), "activation checkpointing off: torch.utils.checkpoint.checkpoint "
           "calls each segment directly, so the backward runs no forward again (the job's own calls, Hugging "
           "Face's gradient_checkpointing, FSDP's checkpoint_wrapper)", "safe",
           "the segment's forward runs once on the same inputs and random state, so the losses and gradients "
           "are the checkpointed run's; a BatchNorm inside a segment updates its running statistics once per "
           "step instead of twice (as without checkpointing), which an evaluation reads; it costs memory: the "
           "activations stay allocated until backward (`fix` prints both arms' peak)",
           "memory for the activations; checkpointing through torch.utils.checkpoint (DeepSpeed's and "
           "Megatron's own are not replaced)",
           snippet="TrainingArguments(..., gradient_checkpointing=False)   # Hugging Face / trl\n"
                   "# or call the block directly instead of torch.utils.checkpoint.checkpoint(block, x)"),
    Remedy("matmul.contiguous_input", ("HW-20",), "torch.nn.functional.linear computes an input of 3 or more "
           "dimensions that matmul would not fold (a sequence chunk, a transposed view) against a weight that needs "
           "no gradient as one mm over the input reshaped to a matrix, instead of a bmm over the weight copied per "
           "batch row", "numerics",
           "the same product by one mm instead of a bmm, whose kernels may sum in another order: the last bits "
           "can differ", "F.linear called through torch.nn.functional (nn.Linear, torchtune's TiedLinear); not "
           "inside a compiled region or TorchScript; refused for a job that quantizes with torch.ao's FX flow",
           snippet="y = F.linear(x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], -1)   # x: a chunk or a view"),
    Remedy("threads.affinity", ("HO-13",), "torch.set_num_threads(CPUs // local ranks) in each rank, "
           "and one disjoint CPU range per local rank when each gets 4 CPUs or more", "numerics",
           "another thread count splits parallel reductions differently (2e-7 on an MLP, torch 2.13 CPU)",
           "known CPU affinity and local world size", value="int", value_help="threads per rank",
           snippet="torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // LOCAL_WORLD_SIZE))"),
    Remedy("compile", ("CG-1", "HO-2"), "torch.compile on the model (Module.compile()); falls back to "
           "eager when compilation fails. `fix` also measures one other setting: dynamic=True where the "
           "job recompiled, else mode='max-autotune-no-cudagraphs', and keeps it only when it is faster",
           "experimental", "fused kernels round differently",
           "a compiler toolchain for the device", snippet="model.compile()  # or model = torch.compile(model)",
           value="mode", value_help=" | ".join(COMPILE_MODES)),
    Remedy("cudagraphs", ("CG-4", "HO-2"), "torch.compile(mode='reduce-overhead'): CUDA graphs replay "
           "the step's kernels", "experimental", "compiled kernels; static shapes required",
           "an NVIDIA GPU; static shapes", snippet="model.compile(mode='reduce-overhead')", gpu_only=True),
)
BY_ID: dict[str, Remedy] = {r.id: r for r in REMEDIES}


@dataclass(frozen=True)
class Spec:
    """One requested remedy: its id and the optional ``=VALUE``."""

    id: str
    value: str | None = None

    def __str__(self) -> str:
        return self.id if self.value is None else f"{self.id}={self.value}"

    @property
    def remedy(self) -> Remedy:
        return BY_ID[self.id]


def parse(text: str) -> tuple[Spec | None, str]:
    """``"id"`` or ``"id=value"`` -> (Spec, "") or (None, why it is refused)."""
    rid, sep, value = text.strip().partition("=")
    rid, value = rid.strip(), value.strip()
    remedy = BY_ID.get(rid)
    if remedy is None:
        near = difflib.get_close_matches(rid, list(BY_ID), n=2)
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        return None, f"unknown remedy id {rid!r}{hint}; known ids: {', '.join(BY_ID)}"
    if not sep:
        return Spec(rid), ""
    if not remedy.value:
        return None, f"{rid} takes no value (got {value!r})"
    try:
        if remedy.value == "int" and int(value) < remedy.value_min:
            raise ValueError
        if remedy.value == "float" and not float(value) > 0:
            raise ValueError
    except ValueError:
        least = "a positive" if remedy.value != "int" or remedy.value_min == 1 else f"at least {remedy.value_min}, an"
        return None, f"{rid}={value}: expected {least} {remedy.value} ({remedy.value_help})"
    if remedy.value == "dtype" and value not in ("bf16", "bfloat16", "fp16", "float16"):
        return None, f"{rid}={value}: expected bf16"
    if remedy.value == "mode" and value not in COMPILE_MODES:
        return None, f"{rid}={value}: expected one of {', '.join(COMPILE_MODES)}"
    return Spec(rid, value), ""


def parse_all(texts: list[str]) -> tuple[list[Spec], dict[str, str]]:
    """Parse ids; return the valid specs (first of each id wins) and the refused ones with reasons."""
    specs: dict[str, Spec] = {}
    refused: dict[str, str] = {}
    for text in texts:
        if not text.strip():
            continue
        spec, why = parse(text)
        if spec is None:
            refused[text.strip()] = why
        elif spec.id not in specs:
            specs[spec.id] = spec
    return list(specs.values()), refused
