"""Readers of configuration facts from live torch objects (DataLoader, DDP, optimizer, model, flags).

Each reader takes the objects it needs and returns a ``facts`` struct; none of them changes any
state of torch or of the job. Anything that cannot be read stays at its default (``None``/empty):
facts are never guessed.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from torchdoctor.callsite import Site
from torchdoctor.compile.guards import first_line
from torchdoctor.compile.records import LIMIT_REASON, frame_names, recompile_frames
from torchdoctor.facts import (
    BackendFacts,
    CompileFacts,
    DataLoaderFacts,
    DDPFacts,
    DeviceFacts,
    EmbeddingFacts,
    FSDPFacts,
    LoadedFile,
    ModuleDeviceFacts,
    OptimizerFacts,
    TensorParallelFacts,
)
from torchdoctor.hardware import topology
from torchdoctor.probe import recompiles as compiles_read
from torchdoctor.probe.breaks import graph_breaks as breaks_of
from torchdoctor.probe.recompiles import compile_seconds

T = TypeVar("T")

# Environment variables that change performance (prefixes or exact names).
ENV_PREFIXES = (
    "NCCL_", "TORCH_NCCL_", "PYTORCH_", "OMP_", "MKL_", "KMP_", "GLOO_", "TORCHINDUCTOR_",
    "TORCH_COMPILE_", "TORCHDYNAMO_", "CUDA_", "HIP_", "ROCR_",
)  # fmt: skip
ENV_NAMES = ("TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "TORCH_LOGS", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL")

LARGE_EMBEDDING_BYTES = 1 << 20  # embeddings below 1 MiB are never a distributed-memory concern
_MAX_ENTRIES = 50


def attempt(read: Callable[[], T]) -> T | None:
    """``read()``, or None when that torch version or build does not support it."""
    try:
        return read()
    except Exception:
        return None


def qualname(obj: Any) -> str | None:
    """Importable-looking name of a function or callable object ("pkg.mod.fn")."""
    func = getattr(obj, "func", obj)  # functools.partial
    name = getattr(func, "__qualname__", None)
    if name is None:
        func = type(func)
        name = func.__qualname__
    module = getattr(func, "__module__", None)
    if module == "__main__":  # run as `python -m pkg.mod`: name it as importable
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = getattr(spec, "name", None) or module
    return f"{module}.{name}" if module else name


def env_facts(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = dict(os.environ if environ is None else environ)
    out = {}
    for name, value in environ.items():
        if not (name.startswith(ENV_PREFIXES) or name in ENV_NAMES):
            continue
        if any(marker in name for marker in _SECRET_MARKERS):
            continue
        out[name] = value[:200]
    return dict(sorted(out.items()))


def loaded_path(where: Any) -> str | None:
    """The absolute path a load reads: a str or PathLike, or an open file's name; None for buffers."""
    if isinstance(where, str | bytes | os.PathLike):
        return os.path.abspath(os.fsdecode(where))
    name = getattr(where, "name", None)
    return os.path.abspath(os.fsdecode(name)) if isinstance(name, str | bytes) and name else None


def loaded_file(path: str) -> LoadedFile:
    """``path`` with its modification time (None when it cannot be read: the load will say why)."""
    try:
        return LoadedFile(path, os.stat(path).st_mtime)
    except (OSError, ValueError):
        return LoadedFile(path)


def backend_facts(torch: Any) -> BackendFacts:
    cuda = attempt(torch.cuda.is_available) or False
    return BackendFacts(
        cudnn_benchmark=attempt(lambda: bool(torch.backends.cudnn.benchmark)),
        cudnn_deterministic=attempt(lambda: bool(torch.backends.cudnn.deterministic)),
        cudnn_allow_tf32=attempt(lambda: bool(torch.backends.cudnn.allow_tf32)),
        cuda_matmul_allow_tf32=attempt(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
        float32_matmul_precision=attempt(torch.get_float32_matmul_precision),
        deterministic_algorithms=attempt(torch.are_deterministic_algorithms_enabled),
        anomaly_detection=attempt(torch.is_anomaly_enabled),
        sync_debug_mode=attempt(torch.cuda.get_sync_debug_mode) if cuda else None,
    )


def param_dtypes(modules: Iterable[Any]) -> dict[str, int]:
    """Number of parameter elements per dtype over the given root modules."""
    counts: Counter[str] = Counter()
    for module in modules:
        for p in module.parameters():
            counts[str(p.dtype).removeprefix("torch.")] += p.numel()
    return dict(counts)


# Parameter names kept of a library function that built a loader or wrapped a model (a function
# with more forwards **kwargs to the constructor, whose names it does not list anyway).
MAX_PARAMS = 48


def origin_fields(site: Site) -> dict[str, Any]:
    """Who built a loader or wrapped a model, as the fields DataLoaderFacts and DDPFacts share."""
    return {"call_site": site.user, "created_by": site.library, "library_call": site.entry,
            "library_caller": site.caller, "library_call_params": list(site.entry_params[:MAX_PARAMS])}


def _batch_size(loader: Any) -> int | None:
    """The loader's batch size, or its batch sampler's: a loader built with batch_sampler= has
    batch_size None (accelerate's prepare() hands every loader a BatchSamplerShard)."""
    size = loader.batch_size
    if size is None:
        sampler = getattr(loader, "batch_sampler", None)
        size = getattr(sampler, "batch_size", None)
        if getattr(sampler, "split_batches", False) and isinstance(size, int):
            size //= max(1, int(getattr(sampler, "num_processes", 1) or 1))  # accelerate's: a share each
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def dataloader_facts(loader: Any, site: Site | None) -> DataLoaderFacts:
    num_workers = attempt(lambda: int(loader.num_workers))
    site = site or Site()
    return DataLoaderFacts(
        num_workers=num_workers,
        pin_memory=attempt(lambda: bool(loader.pin_memory)),
        # torch keeps prefetch_factor=None when num_workers == 0; 2 is its default otherwise.
        prefetch_factor=attempt(lambda: loader.prefetch_factor),
        persistent_workers=attempt(lambda: bool(loader.persistent_workers)),
        batch_size=attempt(lambda: _batch_size(loader)),
        collate_fn=attempt(lambda: qualname(loader.collate_fn)),
        library_site=site.library_site,
        **origin_fields(site),
        dataset_len=attempt(lambda: len(loader.dataset)),
        batches_per_epoch=attempt(lambda: batches_per_epoch(loader)),
    )


def foreign_loader_facts(loader: Any, owner: Any, site: Site | None) -> DataLoaderFacts:
    """A loader that is no torch DataLoader but hands itself to torch's iterators. fastai's
    ``_FakeLoader`` (``owner``: the fastai DataLoader behind it) says its workers and pinning; the
    batch size, dataset and epoch length are its owner's. fastai builds a new iterator, and new
    workers, every epoch whatever persistent_workers says: so it is left unknown, and nothing
    advises setting it."""
    facts = dataloader_facts(loader, site)
    facts.collate_fn = None
    if owner is not None:
        # Neither is the owner's to set: a new iterator each epoch, and prefetch fixed at 2 in _FakeLoader.
        facts.persistent_workers = facts.prefetch_factor = None
        facts.batch_size = attempt(lambda: int(owner.bs))
        facts.dataset_len = attempt(lambda: len(owner.dataset))
        facts.batches_per_epoch = attempt(lambda: len(owner))
    return facts


def batches_per_epoch(loader: Any) -> int | None:
    """len() of the loader's batch sampler (its sampler with batch_size=None): what len(loader) says
    for a map-style dataset, without calling len(loader), which on an IterableDataset records the
    length and changes the warnings the loader gives later. An iterable one's sampler has no len()."""
    sampler = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    return len(sampler) if type(sampler).__name__ != "_InfiniteConstantSampler" else None


def optimizer_facts(opt: Any, site: Site | None) -> OptimizerFacts:
    defaults = getattr(opt, "defaults", {}) or {}
    groups = getattr(opt, "param_groups", None)
    if groups is not None:
        tensors = [p for g in groups for p in g.get("params", ())]
    else:  # fastai's Optimizer: lists of parameters, one per group
        tensors = [p for group in getattr(opt, "param_lists", ()) for p in group]
    first = attempt(lambda: dict(groups[0])) if groups else None
    first = first if isinstance(first, dict) else {}
    return OptimizerFacts(
        cls=type(opt).__name__,
        foreach=defaults.get("foreach"),
        fused=defaults.get("fused"),
        capturable=defaults.get("capturable"),
        num_params=sum(p.numel() for p in tensors),
        num_param_tensors=len(tensors),
        param_device=attempt(lambda: str(tensors[0].device.type)) if tensors else None,
        fused_available=attempt(lambda: fused_available(opt, tensors)),
        settings={k: v for k in UPDATE_SETTINGS if isinstance(v := first.get(k), bool | int | float)},
        call_site=site.user if site else None,
        created_by=site.library if site else None,
    )


# The settings of a parameter group that change how much work an update does (advice/optimizer.py).
UPDATE_SETTINGS = ("weight_decay", "momentum", "nesterov", "amsgrad", "maximize", "differentiable",
                   "decoupled_weight_decay", "capturable")


def fused_available(opt: Any, tensors: list[Any]) -> bool | None:
    """Whether ``fused=True`` would run for this optimizer: its class is torch.optim's (None for
    another class, a subclass too) and takes ``fused``, and its parameters pass advice/optimizer.
    fused_problem (the class's kernel registered for their device, floating point, dense
    gradients, DTensor only for Adam and AdamW). Read once, at the optimizer's first step, when
    the gradients exist."""
    import inspect

    import torch

    from torchdoctor.advice.optimizer import fused_problem

    cls = type(opt)
    if not cls.__module__.startswith("torch.optim."):
        return None  # a subclass may step its own way
    if "fused" not in inspect.signature(cls.__init__).parameters:
        return False
    return fused_problem(torch, cls.__name__, tensors) is None


def ddp_facts(ddp: Any, site: Site, logging_data: dict[str, Any] | None = None) -> DDPFacts:
    cap_bytes = getattr(ddp, "bucket_bytes_cap", None)
    facts = DDPFacts(
        find_unused_parameters=attempt(lambda: bool(ddp.find_unused_parameters)),
        static_graph=attempt(lambda: bool(ddp.static_graph)),
        gradient_as_bucket_view=attempt(lambda: bool(ddp.gradient_as_bucket_view)),
        bucket_cap_mb=round(cap_bytes / (1024 * 1024), 4) if cap_bytes else None,
        # 2.13 renamed broadcast_buffers to forward_sync_buffers; older versions keep the first.
        broadcast_buffers=attempt(lambda: bool(getattr(ddp, "forward_sync_buffers", ddp.broadcast_buffers))),
        **origin_fields(site),
    )
    if logging_data:
        apply_ddp_logging(facts, logging_data)
    return facts


def _ints(text: Any) -> list[int]:
    if not isinstance(text, str):
        return []
    return [int(x) for x in text.replace(",", " ").split() if x.strip().isdigit()]


def apply_ddp_logging(facts: DDPFacts, data: dict[str, Any]) -> None:
    """Copy what ``DistributedDataParallel._get_ddp_logging_data()`` says (names as torch spells them)."""
    sizes = _ints(data.get("rebuilt_bucket_sizes")) or _ints(data.get("bucket_sizes"))
    facts.bucket_sizes = sizes
    reduced = data.get("num_buckets_reduced")
    facts.num_buckets = int(reduced) if isinstance(reduced, int) and reduced > 0 else (len(sizes) or None)
    for key in ("unused_parameter_size", "total_parameter_size_bytes"):
        if isinstance(data.get(key), int):
            setattr(facts, "total_parameter_bytes" if key.startswith("total") else key, int(data[key]))
    if "can_set_static_graph" in data:
        facts.can_set_static_graph = bool(data["can_set_static_graph"])
    for name in ("forward_compute", "backward_compute", "backward_comm", "backward_compute_comm_overlap"):
        value = data.get(f"avg_{name}_time")
        if isinstance(value, int) and value > 0:
            setattr(facts, f"avg_{name}_time_ns", float(value))
    if isinstance(data.get("backend_name"), str):
        facts.backend_name = data["backend_name"]


def exposed_comm_s(data: dict[str, Any]) -> float | None:
    """Non-overlapped gradient communication of the sampled iteration, in seconds."""
    comm, overlap = data.get("backward_comm_time"), data.get("backward_compute_comm_overlap_time")
    if not isinstance(comm, int) or not isinstance(overlap, int) or comm <= 0:
        return None
    return max(0, comm - overlap) / 1e9


def fsdp_facts(torch: Any, roots: Iterable[Any]) -> list[FSDPFacts]:
    """One entry per root-level FSDP1 wrapper or FSDP2 (``fully_shard``) root."""
    out = []
    fsdp2 = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    for root in roots:
        for module in root.modules():
            if type(module).__name__ == "FullyShardedDataParallel":
                out.append(
                    FSDPFacts(
                        version=1,
                        sharding_strategy=attempt(lambda m=module: m.sharding_strategy.name),
                        limit_all_gathers=attempt(lambda m=module: bool(m.limit_all_gathers)),
                        forward_prefetch=attempt(lambda m=module: bool(m.forward_prefetch)),
                        backward_prefetch=attempt(lambda m=module: str(m.backward_prefetch)),
                        cpu_offload=attempt(lambda m=module: bool(m.cpu_offload.offload_params)),
                        mixed_precision=attempt(lambda m=module: str(m.mixed_precision)),
                    )
                )
                break  # nested FSDP1 units share the root's settings
            if fsdp2 is not None and isinstance(module, fsdp2):
                state = attempt(lambda m=module: m._get_fsdp_state())  # a torch without it: None
                group = getattr(state, "_fsdp_param_group", None)
                sizes = attempt(lambda m=module: fsdp2_unit_mb(m, fsdp2)) or []
                out.append(
                    FSDPFacts(
                        version=2,
                        # Any unit that reshards after forward (the root never does by default).
                        reshard_after_forward=attempt(lambda m=module: fsdp2_reshards(m, fsdp2)),
                        mixed_precision=attempt(lambda g=group: str(g.mp_policy)),
                        units=len(sizes) or None,
                        unit_mb_median=round(sorted(sizes)[len(sizes) // 2], 3) if sizes else None,
                        unit_mb_max=round(max(sizes), 3) if sizes else None,
                        model_mb=round(sum(sizes), 3) if sizes else None,
                        param_dtype=attempt(lambda m=module: str(next(m.parameters()).dtype).removeprefix("torch.")),
                    )
                )
                break
    return out[:_MAX_ENTRIES]


def tensor_parallel_facts(roots: Iterable[Any]) -> TensorParallelFacts | None:
    """The model's tensor-parallel parameters (DTensors sharded on some mesh dimension), when no
    fully_shard unit owns them (FSDP2's
    own parameters are DTensors too: a root with a unit is FSDP's, fsdp_facts). Reads nothing unless
    the job imported torch.distributed.tensor."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is None:
        return None
    fsdp2 = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    params = layers = 0
    total, mesh = 0.0, None
    for root in roots:
        if fsdp2 is not None and any(isinstance(m, fsdp2) for m in root.modules()):
            return None
        for module in root.modules():
            # Sharded ones only: all-Replicate DTensors (distribute_module) split no layer.
            own = [p for p in module.parameters(recurse=False)
                   if isinstance(p, dtensor) and any(pl.is_shard() for pl in p.placements)]
            layers += bool(own)
            params += len(own)
            if own and mesh is None:
                mesh = attempt(lambda p=own[0]: _mesh_text(p.device_mesh))
        total += sum(p.numel() * p.element_size() for p in root.parameters()) / 1e6
    return TensorParallelFacts(params, layers, round(total, 3), mesh) if params else None


def _mesh_text(mesh: Any) -> str:
    """'tp=2' for a named one-dimensional mesh, 'dp=2, tp=4' for two, else its shape '(2,)'."""
    names = getattr(mesh, "mesh_dim_names", None)
    shape = tuple(mesh.shape)
    return ", ".join(f"{n}={k}" for n, k in zip(names, shape, strict=False)) if names else str(shape)


def fsdp2_reshards(root: Any, unit_type: type) -> bool | None:
    """Whether any fully_shard unit under ``root`` frees its unsharded parameters after forward
    (and all-gathers them again in backward); None when no unit's state is readable."""
    seen = []
    for unit in root.modules():
        if isinstance(unit, unit_type):
            group = getattr(unit._get_fsdp_state(), "_fsdp_param_group", None)
            if group is not None:
                seen.append(group.post_forward_mesh_info is not None)
    return any(seen) if seen else None


def fsdp2_unit_mb(root: Any, unit_type: type) -> list[float]:
    """Unsharded MB of parameters each fully_shard unit under ``root`` all-gathers: its own
    parameters, those of nested units left out (a DTensor's numel is the global one), in the
    dtype they are gathered in (a MixedPrecisionPolicy's param_dtype for floating-point ones)."""
    units = [m for m in root.modules() if isinstance(m, unit_type)]
    nested: set[int] = set()
    sizes = []
    for unit in reversed(units):  # innermost first: their parameters are theirs
        own = [p for p in unit.parameters() if id(p) not in nested]
        nested.update(id(p) for p in own)
        cast = attempt(lambda u=unit: _gathered_itemsize(u))
        sizes.append(sum(p.numel() * (cast if cast and p.is_floating_point() else p.element_size())
                         for p in own) / 1e6)
    return sizes


def _gathered_itemsize(unit: Any) -> int | None:
    """Bytes per element of the unit's floating-point parameters once all-gathered: its mixed
    precision policy's param_dtype (private FSDP2 state; None without a cast or where unreadable)."""
    group = getattr(unit._get_fsdp_state(), "_fsdp_param_group", None)
    dtype = getattr(getattr(group, "mp_policy", None), "param_dtype", None)
    return getattr(dtype, "itemsize", None)


def _majority_device(module: Any) -> str | None:
    weights: Counter[str] = Counter()
    for t in [*module.parameters(), *module.buffers()]:
        weights[str(t.device)] += t.numel() * t.element_size()
    return weights.most_common(1)[0][0] if weights else None


def inner(root: Any) -> Any:
    """The user's model inside a DDP/DataParallel/compile wrapper."""
    for attr in ("module", "_orig_mod"):
        child = getattr(root, attr, None)
        if child is not None and hasattr(child, "named_modules"):
            return inner(child)
    return root


def device_facts(torch: Any, roots: list[Any]) -> tuple[DeviceFacts, list[ModuleDeviceFacts]]:
    """The model's device and the submodules whose own tensors sit elsewhere."""
    off: list[ModuleDeviceFacts] = []
    kinds: Counter[str] = Counter()
    for root in roots:
        model = inner(root)
        main = _majority_device(model)
        if main is None:
            continue
        kinds[main.split(":")[0]] += 1
        for name, module in model.named_modules():
            own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            devices = {str(t.device) for t in own}
            if own and main not in devices:
                off.append(
                    ModuleDeviceFacts(
                        name=name or type(module).__name__,
                        device=sorted(devices)[0],
                        model_device=main,
                        num_params=sum(p.numel() for p in module.parameters(recurse=False)),
                    )
                )
    return device_of_kind(torch, kinds.most_common(1)[0][0] if kinds else "cpu"), off[:_MAX_ENTRIES]


def model_device_kind(roots: list[Any]) -> str | None:
    """The device kind most of the models among ``roots`` sit on (None without parameters)."""
    kinds = Counter(d.split(":")[0] for d in (_majority_device(inner(r)) for r in roots) if d is not None)
    return kinds.most_common(1)[0][0] if kinds else None


def device_of_kind(torch: Any, kind: str) -> DeviceFacts:
    """DeviceFacts of a device kind ("cuda", "cpu", ...), a CUDA device's properties filled in."""
    device = DeviceFacts(kind=kind)
    if device.kind == "cuda":
        _fill_cuda(torch, device)
    return device


def package_version(name: str) -> str | None:
    """The installed distribution's version from its metadata ("" when not installed; None when the
    metadata cannot be read), without importing the package."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""
    except Exception:
        return None


def _fill_cuda(torch: Any, device: DeviceFacts) -> None:
    if getattr(torch.version, "hip", None):
        device.kind = "rocm"
    index = attempt(torch.cuda.current_device) or 0
    props = attempt(lambda: torch.cuda.get_device_properties(index))
    device.count = attempt(torch.cuda.device_count)
    if props is not None:
        device.name = props.name
        device.capability = f"{props.major}.{props.minor}"
        device.total_memory_bytes = int(props.total_memory)
        bus = getattr(props, "pci_bus_id", None)
        if isinstance(bus, int):
            device.pci_address = topology.pci_address(int(getattr(props, "pci_domain_id", 0) or 0), bus,
                                                      int(getattr(props, "pci_device_id", 0) or 0))
    device.max_memory_allocated_bytes = attempt(lambda: int(torch.cuda.max_memory_allocated(index)))
    stats = attempt(lambda: torch.cuda.memory_stats(index)) or {}
    if "num_alloc_retries" in stats:
        device.num_alloc_retries = int(stats["num_alloc_retries"])
    device.max_memory_reserved_bytes = attempt(lambda: int(torch.cuda.max_memory_reserved(index)))
    if "inactive_split_bytes.all.peak" in stats:
        device.inactive_split_bytes_peak = int(stats["inactive_split_bytes.all.peak"])


def embedding_facts(torch: Any, roots: list[Any]) -> list[EmbeddingFacts]:
    out = []
    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    for root in roots:
        for name, module in inner(root).named_modules():
            if not isinstance(module, kinds):
                continue
            weight = module.weight
            size = weight.numel() * weight.element_size()
            if size < LARGE_EMBEDDING_BYTES:
                continue
            out.append(
                EmbeddingFacts(
                    name=name,
                    num_embeddings=int(module.num_embeddings),
                    embedding_dim=int(module.embedding_dim),
                    bytes=int(size),
                    sparse=bool(getattr(module, "sparse", False)),
                    # A DTensor weight is sharded (FSDP2/TP); a plain tensor is a full copy per rank.
                    replicated=type(weight).__name__ != "DTensor" and not hasattr(weight, "_local_tensor"),
                )
            )
    return out[:_MAX_ENTRIES]


def compile_facts() -> CompileFacts:
    from torchdoctor.probe import compile_cache

    """torch.compile counters, read only if the job itself imported dynamo."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None:
        return CompileFacts()
    # A frame past recompile_limit is recorded as an "unimplemented" break; it is a recompile
    # cliff (recompile_frames[].limit_hit), not a break in the user's code.
    breaks = Counter({k: n for k, n in (Counter(counters.get("graph_break", {}))
                                        + Counter(counters.get("unimplemented", {}))).items()
                      if not str(k).startswith(LIMIT_REASON)})
    frames = counters.get("frames", {})
    stats = counters.get("stats", {})
    inductor = counters.get("inductor", {})
    records = attempt(lambda: compiles_read.read(utils))  # None: no compilation metrics on this torch
    per_frame = attempt(lambda: recompile_frames(records, compiles_read.guards(utils))) if records is not None else None
    failures = getattr(utils, "guard_failures", {}) or {}
    # One failing guard per cache entry checked: the first guard of each recompile is enough.
    reasons = list(dict.fromkeys(first_line(str(r)) for rs in failures.values() for r in rs))
    total_s, dynamo_s, backend_s = attempt(lambda: compile_seconds(utils)) or (None, None, None)
    caches = attempt(compile_cache.counters) or {}
    inductor_ran = any(k.startswith("fx_graph.") for k in caches)  # else the cache directory is not this job's concern
    return CompileFacts(
        used=bool(frames.get("total") or stats.get("unique_graphs")),
        graph_breaks=sum(breaks.values()),
        graph_break_reasons=[str(r)[:300] for r, _ in breaks.most_common(10)],
        breaks=attempt(lambda: breaks_of(utils)) or [],
        recompiles=sum(r.count for r in per_frame) if per_frame is not None else len(reasons) or None,
        recompile_reasons=reasons[:10],
        recompile_frames=per_frame or [],
        frame_names=frame_names(records or []),
        unique_graphs=stats.get("unique_graphs"),
        cache_hits=inductor.get("fxgraph_cache_hit"),
        cache_misses=inductor.get("fxgraph_cache_miss"),
        cache_counts=caches,
        cache_pack=attempt(compile_cache.summary),
        cache_dir=attempt(compile_cache.where) if inductor_ran else None,
        cache_dir_default=attempt(compile_cache.is_default_dir) if inductor_ran else None,
        graph_hashes=[g["hash"] for g in compile_cache.GRAPHS],
        cudagraph_skips=inductor.get("cudagraph_skips"),
        compile_time_s=total_s,
        dynamo_s=dynamo_s,
        backend_s=backend_s,
        first_compile_at=min((r.started_at for r in records or [] if r.started_at), default=None),
    )
