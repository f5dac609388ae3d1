"""The rank summary: what the probe of one process turns into ``RankFacts``.

Built at checkpoints (the gather step, periodic writes) and at exit, never on the hot path.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import weakref
from dataclasses import dataclass, field
from types import CodeType
from typing import TYPE_CHECKING, Any

import msgspec

from torchdoctor.callsite import Site
from torchdoctor.facts import (
    CompileFacts,
    CpuFacts,
    DataLoaderFacts,
    DDPFacts,
    DeviceFacts,
    RankFacts,
    StepTiming,
)
from torchdoctor.hardware import topology
from torchdoctor.probe import collect, output, postprocess, sysinfo, workers
from torchdoctor.probe.errors import ERRORS

if TYPE_CHECKING:
    from torchdoctor.probe.core import Probe

perf_counter = time.perf_counter
# Workers whose per-batch counters a loader's facts average (probe/workers.py): a sample of the most
# recent ones is enough for means, and bounds the files read on the training thread at a summary.
MAX_WORKER_PIDS = 64


@dataclass
class LoaderRecord:
    """What the probe knows about one DataLoader."""

    facts: DataLoaderFacts
    collate_code: CodeType | None = None
    batches: int = 0  # timed ones: outside the profiler's window
    drawn: int = 0  # all of them
    next_s: float = 0.0
    collate_syncs: int = 0
    collate_s: float = 0.0
    ready_batches: int = 0  # batches already produced by workers when asked for
    ready_s: float = 0.0
    polled_batches: int = 0  # batches whose readiness could be read
    # (the batch's index among those drawn, its fingerprint) of the first batches: probe/batches.py
    batch_samples: list[tuple[int, float]] = field(default_factory=list)
    # In-process fetches (num_workers=0) tried, checked for random-number draws, and those that drew.
    rng_tries: int = 0
    rng_checked: int = 0
    rng_drawn: int = 0
    # The most recent workers' process ids (insertion order; at most MAX_WORKER_PIDS): non-persistent
    # workers are new processes every epoch, and their counter files are read at each summary.
    worker_pids: dict[int, None] = field(default_factory=dict)

    def add_worker(self, pid: int) -> None:
        self.worker_pids[pid] = None
        while len(self.worker_pids) > MAX_WORKER_PIDS:
            del self.worker_pids[next(iter(self.worker_pids))]

    def summary(self, run_dir: str | None = None) -> DataLoaderFacts:
        facts = msgspec.structs.replace(self.facts)
        if self.worker_pids:
            facts.worker_pids = list(self.worker_pids)
            if run_dir:
                inside(facts, workers.read(run_dir, set(self.worker_pids)))
        if self.drawn:
            facts.batches = self.drawn
        if self.batch_samples:
            facts.batch_samples = list(self.batch_samples)
        if self.rng_checked:
            facts.dataset_random_draws = self.rng_drawn > 0
        if self.batches:
            facts.next_ms_mean = round(1e3 * self.next_s / self.batches, 3)
            # Only the main process's collation is visible; workers collate out of sight.
            if facts.num_workers == 0 and self.collate_code is not None:
                facts.collate_syncs_per_batch = round(self.collate_syncs / self.batches, 3)
                if self.collate_s:
                    facts.collate_ms_mean = round(1e3 * self.collate_s / self.batches, 3)
            if self.polled_batches:
                facts.ready_share = round(self.ready_batches / self.polled_batches, 3)
                if self.ready_batches:
                    facts.ready_wait_ms_mean = round(1e3 * self.ready_s / self.ready_batches, 3)
        return facts


# Reinforcement-learning environment libraries, by module name (imported by the job, never by the probe).
ENV_LIBRARIES = ("gymnasium", "gym", "envpool", "pettingzoo", "dm_env", "dm_control", "procgen", "minigrid", "vizdoom",
                 "mujoco", "ale_py", "pybullet", "isaacgym", "torchrl", "tianshou", "stable_baselines3")


def inside(facts: DataLoaderFacts, stats: workers.WorkerStats | None) -> None:
    """The workers' own per-batch counters (probe/workers.py) into the loader's facts."""
    if stats is not None and stats.batches:
        for key, value in workers.per_batch(stats).items():
            setattr(facts, key, value)


@dataclass
class DDPRecord:
    """One DDP wrapper: a weak reference, its facts, and the last logging data read from it."""

    ref: weakref.ref[Any]
    facts: DDPFacts
    last_iteration: int = 0
    logging_data: dict[str, Any] | None = None
    site: Site = field(default_factory=Site)  # where the model was wrapped


def code_of(fn: Any) -> CodeType | None:
    """The code object run when ``fn`` is called (to recognise a collate_fn on the stack)."""
    fn = getattr(fn, "func", fn)  # functools.partial
    code = getattr(fn, "__code__", None)
    if code is None:
        call = type(fn).__dict__.get("__call__")  # a callable object's own __call__
        code = getattr(call, "__code__", None)
    return code


def _child_processes_cpu_s(probe: Probe, workers: set[int], reaped_s: float) -> float:
    """CPU seconds since the first training activity of the job's child processes that are neither
    its DataLoader workers (``workers``), nor the probe's own post-processing, nor probed processes
    themselves (a rank its parent started: that rank reports its own CPU time): those alive now, and,
    when no DataLoader worker or probed child was ever there to share it, those already reaped
    (nnU-Net ends its augmenters before exit; ``RUSAGE_CHILDREN`` cannot tell children apart)."""
    live = sysinfo.child_pids()
    run_dir = probe.config.run_dir
    if run_dir:
        probe.probed_children.update(pid for pid in live if output.is_probed(run_dir, pid))
    mine = [pid for pid in live if pid not in workers and pid not in postprocess.STARTED
            and pid not in probe.probed_children]
    now = sysinfo.live_child_cpu(mine)
    total = sum(max(0.0, cpu - probe.child_cpu0.get(pid, 0.0)) for pid, cpu in now.items())
    if not workers and not probe.probed_children:
        # A child alive at the first training activity and reaped since brought its whole lifetime
        # into RUSAGE_CHILDREN: its CPU time before that activity is taken back out.
        before = sum(cpu for pid, cpu in probe.child_cpu0.items() if pid not in live)
        total += max(0.0, reaped_s - before)
    return total


def cpu_facts(probe: Probe) -> CpuFacts:
    """CPUs, threads, and CPU use (percent of one core) since the first training activity."""
    torch = probe.torch
    wall = perf_counter() - probe.wall0 if probe.active else 0.0
    pids = sorted({pid for rec in probe.loaders for pid in rec.worker_pids})
    reaped = sysinfo.reaped_children_cpu_s() - probe.children_cpu0
    workers = None
    if pids:
        workers = sysinfo.percent(reaped + sysinfo.live_child_cpu_s(pids), wall)
    try:
        own = _child_processes_cpu_s(probe, set(pids), reaped)
    except Exception as exc:  # /proc unreadable in an odd way: no figure, and said once
        ERRORS.record("child processes", exc)
        own = 0.0
    children = sysinfo.percent(own, wall) if own > 0.005 * wall else None  # a `hostname` call is nothing
    lws = os.environ.get("LOCAL_WORLD_SIZE")
    mask = sysinfo.affinity()
    busy_now = sysinfo.cpus_busy_s(mask)
    busy = None
    if busy_now is not None and probe.cpus_busy0 is not None:
        busy = sysinfo.percent(busy_now - probe.cpus_busy0, wall)
    return CpuFacts(
        logical_cpus=os.cpu_count(),
        affinity=mask,
        torch_num_threads=collect.attempt(torch.get_num_threads),
        torch_num_interop_threads=collect.attempt(torch.get_num_interop_threads),
        local_world_size=int(lws) if lws and lws.isdigit() else None,
        main_process_cpu_pct=sysinfo.percent(sysinfo.own_cpu_s() - probe.cpu0, wall),
        dataloader_workers_cpu_pct=workers,
        child_processes_cpu_pct=children,
        numa_nodes=sysinfo.numa_nodes(),
        affinity_cpus_busy_pct=busy,
    )


_TOPOLOGY: list[topology.Topology] = []


def place(probe: Probe, device: DeviceFacts, cpu: CpuFacts) -> None:
    """The rank on the host's topology (sysfs, read once): its mask's NUMA nodes, its accelerator's."""
    if not _TOPOLOGY:
        _TOPOLOGY.append(topology.read("/"))
    topo = _TOPOLOGY[0]
    device.numa_node = topology.numa_of(topo, device.pci_address)
    where = topology.placement(topo, cpu.affinity, device.numa_node)
    cpu.affinity_numa = {str(k): v for k, v in sorted(where.cpu_nodes.items())}
    device.numa_node_cpus = where.near_cpus
    # torchrun --numa-binding ships as torch/numa/binding.py: looked up as a file, never imported.
    torch_dir = os.path.dirname(getattr(probe.torch, "__file__", "") or "")
    cpu.numa_binding_available = os.path.isfile(os.path.join(torch_dir, "numa", "binding.py")) if torch_dir else None


def _syncs_per_step(probe: Probe, steps: list) -> float | None:
    """Host syncs per step of the training loop: those counted between the end of step 0 and the
    end of the last step, over the steps after step 0 (the window's excluded, as its syncs are).
    Without such steps: every sync over the steps recorded."""
    if probe.sync_steps:
        return round((probe.sync_upto - probe.sync_base) / probe.sync_steps, 3)
    return round(probe.sync_total / len(steps), 3) if steps else None


def _train_wall_s(probe: Probe, compiled: CompileFacts) -> float | None:
    """Wall seconds since the first training activity, or since the first compile when that came
    earlier: a model compiled at its first call, before any loader batch or backward the probe
    sees, would otherwise spend more seconds compiling than the job had run."""
    if not probe.active:
        return None
    since = perf_counter() - probe.wall0
    if compiled.first_compile_at is not None:
        since = max(since, time.time() - compiled.first_compile_at)
    return round(since, 3)


def _profiled_steps(probe: Probe) -> list[StepTiming]:
    """The clock's skipped steps that the finished window profiled (``probe.profiled``, [start, end)):
    a step 0 that a stronger step source folded while the window ran is skipped too, and is none of them."""
    if not probe.profiled:
        return []
    start, end = probe.profiled
    return [s for s in probe.clock.profiled_steps if start <= s.step < end]


def _tensor_parallel(probe: Any, roots: list[Any]) -> Any:
    """collect.tensor_parallel_facts, once per set of roots: it walks every parameter, and summaries
    are written every 30 s on the training thread."""
    key = tuple(id(r) for r in roots)
    if probe.tp_roots != key:
        probe.tp_roots, probe.tp_facts = key, collect.attempt(lambda: collect.tensor_parallel_facts(roots))
    return probe.tp_facts


def rank_facts(probe: Probe) -> RankFacts:
    """Everything the probe of this process knows, as the contract struct the rules read."""
    torch = probe.torch
    rank, world, backend = probe.rank_identity()
    roots = probe.live_roots()
    device, off_device = collect.device_facts(torch, roots)
    if not roots and probe.root_device_kind not in (None, device.kind):
        device = collect.device_of_kind(torch, probe.root_device_kind)  # the model is gone (inside main())
    cpu = cpu_facts(probe)
    collect.attempt(lambda: place(probe, device, cpu))
    if probe.nvml is not None:
        device.nvml_util_pct_mean, device.nvml_mem_used_bytes_max = probe.nvml.readings()
    backends = collect.backend_facts(torch)
    backends.autocast_used = probe.autocast_dtype is not None
    backends.autocast_dtype = probe.autocast_dtype
    backends.param_dtypes = collect.param_dtypes(collect.inner(r) for r in roots)
    steps = probe.clock.steps
    ddp_facts = []
    for rec in probe.ddps:
        ddp = rec.ref()
        if ddp is not None:  # static_graph etc. may have changed since construction
            rec.facts = collect.ddp_facts(ddp, rec.site)
            if "ddp.logging_data" not in ERRORS.broken:  # a torch whose DDP raised there: never called again
                rec.logging_data = collect.attempt(lambda ddp=ddp: ddp._get_ddp_logging_data()) or rec.logging_data
        facts = msgspec.structs.replace(rec.facts)
        if rec.logging_data:
            collect.apply_ddp_logging(facts, rec.logging_data)
        ddp_facts.append(facts)
    lr = os.environ.get("LOCAL_RANK")
    compile_facts = collect.compile_facts()
    return RankFacts(
        rank=rank,
        local_rank=int(lr) if lr and lr.isdigit() else None,
        world_size=world,
        hostname=socket.gethostname(),
        pid=probe.pid,
        torch_version=str(torch.__version__),
        torchao_version=collect.package_version("torchao"),
        env_libraries=[m for m in ENV_LIBRARIES if m in sys.modules],
        distributed_backend=backend,
        dataloaders=[rec.summary(probe.config.run_dir) for rec in probe.loaders],
        ddp=ddp_facts,
        fsdp=collect.fsdp_facts(torch, roots),
        tensor_parallel=_tensor_parallel(probe, roots),
        optimizers=[facts for _, facts in probe.optimizers],
        zero_grad_fills=list(probe.zero_grad_fills),
        modules_off_device=off_device,
        embeddings=collect.embedding_facts(torch, roots),
        compile=compile_facts,
        cpu=cpu,
        device=device,
        backends=backends,
        env=collect.env_facts(),
        steps=steps,
        profiled_steps=_profiled_steps(probe),
        train_wall_s=_train_wall_s(probe, compile_facts),
        peak_rss_mib=sysinfo.peak_rss_mib(),
        host_syncs_per_step=_syncs_per_step(probe, steps),
        host_sync_sites={f"{f}:{line}": n for (f, line), n in probe.sync_sites.most_common(20)},
        checkpoint_site=probe.checkpoint_site,
        loaded_files=list(probe.loaded_files),
        losses_read=probe.losses_read,
        losses_nonfinite=probe.losses_nonfinite,
        first_nonfinite_step=probe.first_nonfinite_step,
        last_finite_step=probe.last_finite_step,
        loss_samples=list(probe.loss_samples),
        checkpoint_dirs=list(probe.checkpoint_dirs),
        inference_site=probe.inference_site or probe.frozen_site,
        inference_mode=probe.inference_mode if probe.inference_site else probe.frozen_mode,
        script_roots=probe.script_roots,
        probe_errors=list(ERRORS.messages),
        trace_file=probe.trace_file,
        step_source=probe.clock.source.name.lower() if probe.clock.source else None,
        training_thread=probe.training_thread,
        profile_steps=list(probe.profiled),
    )
