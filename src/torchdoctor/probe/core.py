"""The probe of one process: its state, step boundaries, checkpoints and exit.

``install(config)`` runs once, right after the job imports torch. ``hooks.install_all`` then
routes torch events (batches, forward, backward, optimizer steps, host syncs, ...) to this
state; ``summary.rank_facts`` turns it into ``RankFacts``. At step boundaries the probe does its housekeeping (profiler window,
gather, periodic writes) outside of any step's timing.

A process is *active* once it shows training activity (a batch, a forward, a backward or an
optimizer step); only active processes write a summary, so launchers and DataLoader workers
leave no files.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import sys
import threading
import time
import weakref
from collections import Counter
from typing import Any

import msgspec

from torchdoctor.callsite import Site, caller_frame, creation_site, library_of, user_frames
from torchdoctor.probe import collect, nvml, output, postprocess, summary, sysinfo, unseen, workers
from torchdoctor.probe.clock import Source, StepClock
from torchdoctor.probe.config import ProbeConfig
from torchdoctor.probe.errors import ERRORS, fault_point, set_fault
from torchdoctor.probe.shims import SHIM_FILENAME
from torchdoctor.probe.window import ProfilerWindow, WindowSkipped

perf_counter = time.perf_counter
# Levels below the root modules the forward hooks may descend to (probe/hooks.descend_forward_hooks).
_MAX_DESCENTS = 3
_DDP_EARLY_STEPS = 12  # DDP samples runtime stats on iterations 1-10, then every 100
LOSS_SAMPLES = 8  # finite losses kept with their steps (DI-17 compares them between ranks)


class Probe:
    """All probe state of this process."""

    def __init__(self, torch: Any, config: ProbeConfig) -> None:
        self.torch = torch
        self.config = config
        self.pid = os.getpid()
        self.torch_dir = os.path.dirname(torch.__file__) + os.sep
        # The training thread: the main one, unless another thread trains first (`on_training_thread`).
        self.main_thread = threading.get_ident()
        self.training_thread: str | None = None  # its name when it is not the main thread
        self.schedstat = sysinfo.ThreadSchedstat()
        self.clock = StepClock(skip=lambda step: self.window_active, sched=self.schedstat.read,
                               faults=sysinfo.thread_faults)
        self.window = ProfilerWindow(*config.profile) if config.profile else None
        self.loaders: list[summary.LoaderRecord] = []
        self.loader_by_obj: weakref.WeakKeyDictionary[Any, summary.LoaderRecord] = weakref.WeakKeyDictionary()
        self.loader_by_iter: weakref.WeakKeyDictionary[Any, summary.LoaderRecord] = (
            weakref.WeakKeyDictionary()
        )
        self.sites: weakref.WeakKeyDictionary[Any, Site] = weakref.WeakKeyDictionary()
        # The site of the user's DataLoader(...) per dataset (by id), else of the first a library
        # built: a loader a library re-creates from it (accelerate's prepare, Lightning's sampler
        # injection) keeps the dataset.
        self.dataset_sites: dict[int, tuple[weakref.ref[Any], Site]] = {}
        self.checkpoint_site: str | None = None  # where the first blocking save was called (DI-15)
        self.loaded_files: list[Any] = []  # facts.LoadedFile: loaded before step 0 ended (hooks.py)
        self.checkpoint_dirs: list[str] = []  # where it saved once a step had ended (hooks.py)
        self.optimizer_state_init = 0  # inside DCP's _init_optim_state: its step() is no step
        # Losses backward started from that the probe could read for free (CPU scalars), how many of
        # them were NaN or inf, and the step of the first such (read_loss).
        self.losses_read = self.losses_nonfinite = 0
        self.first_nonfinite_step: int | None = None
        self.last_finite_step: int | None = None
        self.loss_step = -1  # the step whose loss was read last: one read per step
        # The first LOSS_SAMPLES finite losses with their steps: ranks that compute the same losses at
        # the same steps train the same model on the same batches (DI-17).
        self.loss_samples: list[tuple[int, float]] = []
        self.full_precision = (torch.float32, torch.float64)
        # Tensor-parallel facts of the model's roots, read once per set of roots (summary.py).
        self.tp_roots: tuple[int, ...] | None = None
        self.tp_facts: Any = None
        # Where the first forward without autograd after step 0 of a module that trains was called
        # (HO-16), and whether it ran under torch.inference_mode(); the same of a frozen module's.
        self.inference_site: str | None = None
        self.inference_mode: bool | None = None
        self.frozen_site: str | None = None
        self.frozen_mode: bool | None = None
        self.fwd_grad = True  # the outermost forward in progress records autograd
        self.fwd_frozen = False  # ... or, without it, is a module that never ran with it
        # This step's forwards without autograd of trained modules, by their first input tensor:
        # (step index, input key, a weak reference that keeps the key's memory honest, seconds).
        # A forward with autograd on the same input in the same step makes them the step's own
        # (probe/hooks.py: _forward_hooks).
        self.nograd_inputs: list[tuple[int, tuple[Any, ...], weakref.ref[Any], float]] = []
        # The first input tensors (their storage's owners) of forwards with autograd, by id, with the
        # step that first trained on them: an input trained on in an earlier step is the job's data
        # (a full graph). And the first step whose forwards with autograd were seen.
        self.grad_inputs: dict[int, tuple[int, weakref.ref[Any]]] = {}
        self.first_grad_step: int | None = None
        self.rewraps = 0  # optimizers whose first step looked again for wrapped models (hooks._wrapped_again)
        self.root_alias: dict[int, int] = {}  # a wrapped model's id -> its wrapper's (both timed)
        self.root_device_kind: str | None = None  # the model's device kind when its roots were found
        self.optimizers: list[tuple[weakref.ref[Any], Any]] = []
        self.primary_optimizer: weakref.ref[Any] | None = None
        self.zero_grad_fills: list[Any] = []  # facts.ZeroGradFacts (probe/hooks.py: _optimizer)
        # Another optimizer's steps in a row while the primary one took none (probe/hooks.py).
        self.other_opt: weakref.ref[Any] | None = None
        self.other_steps = 0
        self.ddps: list[summary.DDPRecord] = []
        self.roots: list[weakref.ref[Any]] = []  # top-level modules whose forward is timed
        # (module, pre-hook id, forward-hook id) of the hooks on them, to take off around a save.
        self.root_hooks: list[tuple[weakref.ref[Any], int, int]] = []
        self.root_hook_fns: tuple[Any, ...] = ()
        self.roots_attached = False
        self.script_roots = 0  # TorchScript modules among the roots: they take no hooks (hooks.attach_root_hooks)
        # Forward/backward calls seen in the current step, and how many levels below the roots the
        # forward hooks went looking (a root whose own forward is never called: Lightning).
        self.fwd_calls = self.bwd_calls = 0
        self.hook_descents = 0
        self.hook_frontier: list[weakref.ref[Any]] = []  # the modules the last descent hooked
        self.sync_sites: Counter[tuple[str, int]] = Counter()
        self.sync_total = 0
        self.library_files: dict[str, bool] = {}  # source file -> an installed package's (callsite.library_of)
        # sync_total when step 0 closed, when the last step closed, and the steps in between.
        self.sync_base = self.sync_upto = self.sync_steps = 0
        self.autocast_dtype: str | None = None
        # Nesting depths and start times of the phases in progress.
        self.next_depth = 0
        self.loader_setup = 0  # inside DataLoader.__iter__
        self.fwd_depth = 0
        self.bwd_depth = 0
        self.optimizer_depth = 0  # optimizer.step calls running (their closures' backwards end no step)
        self.fwd_t0 = 0.0
        self.current_loader: summary.LoaderRecord | None = None
        self.worker_stats: workers.WorkerStats | None = None  # set in a DataLoader worker only
        self.last_iter: weakref.ref[Any] | None = None  # the iterator of the last batch and its record (a cache)
        self.last_iter_record: summary.LoaderRecord | None = None
        # Baselines taken at the first training activity.
        self.wall0 = 0.0
        self.cpu0 = 0.0
        self.children_cpu0 = 0.0
        # Each live child's CPU seconds at the first training activity (a pool started before it has
        # spent some already), and the children seen to be probed processes themselves (ranks).
        self.child_cpu0: dict[int, float] = {}
        self.probed_children: set[int] = set()
        self.cpus_busy0: float | None = None
        self.identity: tuple[int, int, str | None] | None = None  # rank, world size, backend
        self.trace_file: str | None = None
        self.profiled: list[int] = []
        self.analysis: Any = None
        self.analysis_slot: str | None = None  # whose trace the post-processing child analyses
        self.gathered = False
        self.last_flush = 0.0
        self.own_file: str | None = None
        self.nvml: nvml.NvmlSampler | None = None
        accelerator = getattr(torch, "accelerator", torch.cuda)  # torch.accelerator is 2.6+
        self.accelerator = bool(collect.attempt(accelerator.is_available))
        self.is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)
        # How the process ends (facts.last_step / ended / own_profiler / own_traces).
        self.progress: output.Progress | None = None
        self.last_step: int | None = None
        self.uncaught: str | None = None  # type name of an uncaught exception (sys.excepthook)
        self.ended: str | None = None
        self.own_profiler = False
        self.own_traces: list[str] = []

    # ----------------------------------------------------------------- state
    @property
    def active(self) -> bool:
        return self.clock.first_activity is not None

    @property
    def window_active(self) -> bool:
        return self.window is not None and self.window.active

    def on_training_thread(self) -> bool:
        """Whether the calling thread is the training thread. A thread other than the main one that
        runs a backward or an optimizer step before the main thread did anything of training becomes
        it: a loop run in a ``threading.Thread`` (Ray Train's runner thread, a GUI's worker) would
        otherwise have steps with no phase in them. Called only from those two hooks: a thread that
        merely iterates a DataLoader (a prefetcher started before the loop) never takes the role."""
        ident = threading.get_ident()
        if ident == self.main_thread:
            return True
        if self.clock.first_activity is not None or self.main_thread == -1:  # -1: a DataLoader worker
            return False
        self.main_thread = ident
        self.training_thread = threading.current_thread().name
        return True

    def activity(self, now: float) -> None:
        """Training activity at ``now``: the first one starts the clock and the CPU baselines."""
        if self.clock.first_activity is None:
            self.clock.begin(now)
            self.wall0 = now
            self.cpu0 = sysinfo.own_cpu_s()
            self.children_cpu0 = sysinfo.reaped_children_cpu_s()
            try:  # on the training thread, inside the hooks: a failure here must not stop the step clock
                self.child_cpu0 = sysinfo.live_child_cpu(sysinfo.child_pids())
            except Exception as exc:
                ERRORS.record("child processes", exc)
            self.cpus_busy0 = sysinfo.cpus_busy_s(sysinfo.affinity())
            self.last_flush = now
            self._open_progress()

    def creation_site(self, depth: int, called: str | None = None) -> Site:
        """Where the caller ``depth`` frames up was called from, past torch and the probe
        (callsite.creation_site: the user's line, or the library that made the call)."""
        probe_dir = os.path.dirname(__file__)
        return creation_site(caller_frame(depth + 1),
                             lambda name: name.startswith(self.torch_dir) or name.startswith(probe_dir),
                             called=called)

    def user_frames(self, depth: int, n: int = 2) -> list[str]:
        """The first ``n`` frames of the user's code above the caller ``depth`` frames up."""
        probe_dir = os.path.dirname(__file__)
        return user_frames(caller_frame(depth + 1),
                           lambda name: name.startswith(self.torch_dir) or name.startswith(probe_dir), n)

    # ------------------------------------------------------------ boundaries
    def read_loss(self, loss: Any) -> None:
        """Note whether the loss a step's first backward starts from is finite, and keep the first
        LOSS_SAMPLES finite non-zero float32/float64 ones with their steps (DI-17): a plain 0-dim
        floating-point CPU tensor only, free to read (a device tensor's value would wait for its
        queue: never read), and never under a job's own torch function or dispatch mode (the read
        would show in it)."""
        if "loss" in ERRORS.broken or self.clock.index == self.loss_step:
            return
        try:
            torch = self.torch
            if not (type(loss) is torch.Tensor and loss.dim() == 0 and loss.device.type == "cpu"
                     and loss.dtype.is_floating_point):
                return
            if unseen.in_job_mode(torch):
                return
            step = self.loss_step = self.clock.index
            value = float(loss.detach())  # float() of a tensor that requires grad warns (2.13)
            self.losses_read += 1
            if math.isfinite(value):
                self.last_finite_step = step
                if self.loss_samples and step <= self.loss_samples[-1][0]:
                    self.loss_samples.clear()  # the clock restarted its count with a stronger step source
                # float32/float64 only: a bf16 loss's spacing (0.0625 near 10) makes different batches'
                # losses equal; an exact 0 (no advantage in a GRPO group) says nothing of the batch.
                if len(self.loss_samples) < LOSS_SAMPLES and value != 0.0 and loss.dtype in self.full_precision:
                    self.loss_samples.append((step, value))
            else:
                self.losses_nonfinite += 1
                if self.first_nonfinite_step is None:
                    self.first_nonfinite_step = step
        except Exception as exc:
            ERRORS.record("loss", exc)

    def boundary(self, source: Source, now: float) -> None:
        """A possible step boundary; on a closed step run housekeeping, then start the next step."""
        before = self.clock.source
        if source < before and self.clock.started_at is not None:
            return  # a weaker source than the one in use: the common case, kept cheap
        closed = self.clock.boundary(source, now)
        if closed is None:
            return
        try:
            fault_point("boundary")
            if before != Source.NONE and self.clock.source != before and self.window is not None:
                self._restart_window()  # steps were renumbered: a running window is meaningless
            self._after_step(closed)
        except Exception as exc:
            ERRORS.record("boundary", exc)
        finally:
            self.clock.resume(perf_counter())

    def _restart_window(self) -> None:
        assert self.window is not None
        if self.window.active:
            self.window.abort()
        if self.analysis_slot is not None:
            # The finished window profiled steps of the old numbering: its trace and analysis
            # describe something else now, and the new window reuses their paths.
            postprocess.discard(self.config.run_dir, self.analysis_slot)
            self.trace_file, self.profiled = None, []
            self.analysis = self.analysis_slot = None
        self.window = ProfilerWindow(self.window.start_step, self.window.end_step)

    def _open_progress(self) -> None:
        """Start this process's progress line (active processes only: ranks, not launchers)."""
        try:
            fault_point("progress")
            self.progress = output.Progress(self.config.run_dir, self.pid)
            self.progress.write(self.rank_identity()[0], -1, "run")
        except Exception as exc:
            ERRORS.record("progress", exc)
            self.progress = None

    def _write_progress(self, state: str = "run") -> None:
        if self.progress is None:
            return
        try:
            rank = self.identity[0] if self.identity else int(os.environ.get("RANK", 0))
            self.progress.write(rank, -1 if self.last_step is None else self.last_step, state)
        except Exception as exc:
            ERRORS.record("progress", exc)
            self.progress = None

    def note_own_trace(self, path: object) -> None:
        """The job exported a profiler trace (``export_chrome_trace``, tensorboard_trace_handler)."""
        if not isinstance(path, str | os.PathLike):
            return
        full = os.path.abspath(os.fspath(path))
        if full.startswith(os.path.abspath(self.config.run_dir) + os.sep):
            return  # the probe's own window
        self.own_profiler = True
        if full not in self.own_traces and len(self.own_traces) < 100:
            self.own_traces.append(full)

    def _after_step(self, closed: int) -> None:
        self.last_step = closed
        # Syncs per step count the steps after step 0 only: step 0's start-up and whatever runs
        # after the last step (evaluation, a per-sample loop before training) are not the loop's.
        if closed == 0:
            self.sync_base, self.sync_steps = self.sync_total, 0
        elif not self.window_active:  # the window's steps count no syncs (on_sync)
            self.sync_steps += 1
        self.sync_upto = self.sync_total
        self._write_progress()
        if closed == 0 and not self.roots_attached:
            # Once: step 0 closes again when a better step source folds the first steps into it.
            self.roots_attached = True
            from torchdoctor.probe import hooks

            hooks.attach_root_hooks(self)
        elif (self.roots_attached and self.fwd_calls == 0 and self.bwd_calls
              and self.hook_descents < _MAX_DESCENTS and "forward" not in ERRORS.broken):
            # Backward ran but no hooked module was called: the roots are containers the loop
            # never calls (a LightningModule's training_step calls its children). One level down.
            self.hook_descents += 1
            try:
                from torchdoctor.probe import hooks

                hooks.descend_forward_hooks(self)
            except Exception as exc:  # the step's housekeeping below must still run
                ERRORS.record("forward", exc)
        self.fwd_calls = self.bwd_calls = 0
        if self.ddps and (closed < _DDP_EARLY_STEPS or closed % 100 <= 1):
            self._read_ddp_comm()
        self._drive_window(closed + 1)
        if closed + 1 == self.config.report_step and not self.gathered and self._lockstep():
            self.gathered = True
            self._gather()
        elif closed == 1 or perf_counter() - self.last_flush > self.config.flush_s:
            self.flush()
        if closed == 0 and self.nvml is None:
            self._start_nvml()

    def _read_ddp_comm(self) -> None:
        if "ddp.logging_data" in ERRORS.broken:
            return
        for record in self.ddps:
            ddp = record.ref()
            if ddp is None:
                continue
            try:  # private API (DistributedDataParallel._get_ddp_logging_data): feature-detected
                data = ddp._get_ddp_logging_data()
            except Exception as exc:
                ERRORS.record("ddp.logging_data", exc)  # marks the site broken: never called again
                return
            if not isinstance(data, dict):
                continue
            iteration = data.get("iteration")
            if isinstance(iteration, int) and iteration != record.last_iteration and iteration >= 1:
                record.last_iteration = iteration
                record.logging_data = data
                comm = collect.exposed_comm_s(data)
                if comm is not None:
                    # Stats read after step k describe DDP iteration k-1 (logged at forward start).
                    self.clock.attribute_comm(iteration - 1, comm)

    def _drive_window(self, next_step: int) -> None:
        window = self.window
        if window is None or window.done:
            return
        try:
            fault_point("window")
            if not window.active:
                if next_step == window.start_step:
                    window.fit([s.total_ms for s in self.clock.steps[1:][-5:]])  # step 0 starts up
                    window.begin(self.torch)
            elif next_step >= window.end_step:
                self._finish_window(window, window.end_step)
            else:
                window.next_step()
        except WindowSkipped as skipped:
            self.own_profiler = self.own_profiler or skipped.own_profiler
            ERRORS.note(f"profiler window skipped: {skipped}")
        except Exception as exc:
            ERRORS.record("window", exc)
            if window.active:
                window.abort()

    def _finish_window(self, window: ProfilerWindow, end: int) -> None:
        """Write the trace of steps [start, end) and hand it to a detached child, never waited for:
        compressing and analysing a large trace here would stall every rank for seconds."""
        rank = self.rank_identity()[0]
        # A process group makes the rank this process's own; without one, others may read the same
        # RANK (Hogwild children, an evaluating parent) and the first to claim it keeps the name.
        grouped = self.identity is not None
        slot = f"rank{rank}" if grouped else output.claim_trace_slot(self.config.run_dir, rank, self.pid)
        raw, gz, _pending, _analysis = postprocess.paths(self.config.run_dir, slot)
        window.finish(raw)
        self.trace_file = os.path.relpath(gz, self.config.run_dir)
        self.profiled = [window.start_step, end]
        self.analysis_slot = slot
        if not postprocess.start(self.config.run_dir, slot):
            ERRORS.note("trace post-processing deferred to the wrapper (no child process)")

    def _analysis(self) -> Any:
        """The window's analysis once the child wrote it (a file check, never a wait)."""
        if self.analysis is None and self.analysis_slot is not None:
            self.analysis = postprocess.read_analysis(self.config.run_dir, self.analysis_slot)
        return self.analysis

    def _lockstep(self) -> bool:
        """Whether all ranks surely reach this step together: only then is a collective safe.

        DDP and FSDP synchronise every step, so every rank arrives at the gather step; a job that
        merely initialised a process group may run a different number of steps on each rank, and
        an extra collective there could hang. Without the gather, each rank's own file remains.
        """
        if self.ddps:
            return True
        return bool(collect.attempt(lambda: collect.fsdp_facts(self.torch, self.live_roots())))

    def _gather(self) -> None:
        payload = self.payload()
        try:
            fault_point("gather")
            received = output.gather_to_rank0(payload)
        except Exception as exc:
            ERRORS.record("gather", exc)
            received = None
        if received:
            output.write_gathered(self.config.run_dir, [p for p in received if p])
        self.flush(payload)

    def _start_nvml(self) -> None:
        try:
            self.nvml = nvml.start(self.torch)
        except Exception as exc:
            ERRORS.record("nvml", exc)

    # ------------------------------------------------------------- summary
    def rank_identity(self) -> tuple[int, int, str | None]:
        """(rank, world size, backend), from the process group while it lives, else the environment."""
        dist = sys.modules.get("torch.distributed")
        try:
            if dist is not None and dist.is_available() and dist.is_initialized():
                self.identity = (dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
        except Exception:
            pass
        if self.identity is not None:
            return self.identity
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), None

    def live_roots(self) -> list[Any]:
        roots = [m for m in (r() for r in self.roots) if m is not None]
        if not roots:  # no forward seen through hooks: fall back on the DDP-wrapped models
            roots = [d for d in (rec.ref() for rec in self.ddps) if d is not None]
        return roots

    def payload(self) -> output.Payload:
        facts = summary.rank_facts(self)
        facts.last_step, facts.ended = self.last_step, self.ended
        facts.own_profiler, facts.own_traces = self.own_profiler, list(self.own_traces)
        return {"facts": msgspec.to_builtins(facts), "analysis": self._analysis()}

    def flush(self, payload: output.Payload | None = None) -> None:
        """Write this rank's summary to ``ranks/``; a failure is recorded, never raised."""
        try:
            fault_point("flush")
            payload = payload or self.payload()
            rank = int(payload["facts"].get("rank", 0))  # to_builtins omits defaults, rank 0 too
            if self.own_file is None or not os.path.basename(self.own_file).startswith(f"rank{rank}."):
                self.own_file = output.own_path(self.config.run_dir, rank, self.pid)
            output.write_json(self.own_file, payload)
        except Exception as exc:
            ERRORS.record("flush", exc)
        self.last_flush = perf_counter()

    def finish(self) -> None:
        """At interpreter exit: close a window still open, write the final summary."""
        if os.getpid() != self.pid or not (self.active or ERRORS.messages):
            return  # a launcher or a DataLoader worker: nothing to say
        window = self.window
        if window is not None and window.active:  # the job ended inside the window
            try:
                self._finish_window(window, self.clock.index + 1)
            except Exception as exc:
                ERRORS.record("window", exc)
        self.ended = f"exception:{self.uncaught}" if self.uncaught else "exit"
        self._write_progress(self.ended)
        self._save_compile_cache()
        self.flush()

    def _save_compile_cache(self) -> None:
        """A job that compiled: its caches' record and artefacts under the run directory
        (probe/compile_cache.py), after its last step."""
        facts = collect.attempt(collect.compile_facts)
        if facts is not None and facts.used and facts.cache_dir is not None:  # Inductor compiled (its caches)
            from torchdoctor.probe import compile_cache

            compile_cache.save(self.torch, self.config.run_dir, self.rank_identity()[0], facts.compile_time_s)

    def after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker, usually) starts with an empty, inactive probe."""
        self.pid = os.getpid()
        self.child_cpu0, self.probed_children = {}, set()  # its own children, none yet
        self.schedstat.close()  # the inherited descriptor reads the parent's thread
        self.schedstat = sysinfo.ThreadSchedstat()
        self.clock = StepClock(skip=lambda step: self.window_active, sched=self.schedstat.read,
                               faults=sysinfo.thread_faults)
        self.window = None  # the profiler session belongs to the parent
        self.sync_sites = Counter()
        self.sync_total = 0
        self.sync_base = self.sync_upto = self.sync_steps = 0
        self.next_depth = self.fwd_depth = self.bwd_depth = self.loader_setup = 0
        self.optimizer_depth = 0
        self.current_loader = self.last_iter = self.last_iter_record = None
        self.nvml = None
        self.own_file = None
        if self.progress is not None:
            self.progress.forget()
        self.progress = None
        self.last_step = self.uncaught = self.ended = None
        self.own_profiler, self.own_traces = False, []
        ERRORS.reset()

    # ------------------------------------------------------------ event sinks
    def _internal(self, filename: str) -> bool:
        return filename.startswith(self.torch_dir) or filename == SHIM_FILENAME

    def on_sync(self, tensor: Any, frame: Any) -> None:
        """``tensor`` copied to the host (``.item()``, ``.tolist()``, ``.numpy()``) from ``frame``.

        With an accelerator only device tensors count (a CPU tensor's ``.item()`` does not block
        the device); on a CPU-only machine the job's own calls count, so the habit still shows.
        There a library's conversion counts only for a tensor of the autograd graph (the model's
        output, a loss): MONAI's decollate reads its metadata tensors with ``.item()`` and its
        DiceLoss makes ``torch.arange(...).tolist()``, CPU tensors on any machine, and they made 62
        of the 63 "syncs per step" of its 3D segmentation tutorial.
        """
        stats = self.worker_stats
        if stats is not None:  # a DataLoader worker: count its collate's conversions (probe/workers.py)
            if stats.in_collate:
                stats.conversions += 1
            return
        if self.clock.started_at is None or self.window_active or threading.get_ident() != self.main_thread:
            return
        if (self.accelerator and tensor.is_cpu) or self.loader_setup:
            return
        fault_point("sync")
        loader = self.current_loader
        if loader is not None:  # inside DataLoader.__next__ (num_workers == 0): a collate sync?
            f = frame
            for _ in range(12):
                if f is None:
                    break
                if f.f_code is loader.collate_code:
                    loader.collate_syncs += 1
                    break
                f = f.f_back
            return
        filename = frame.f_code.co_filename
        if self._internal(filename):
            if not self.accelerator:
                return  # torch's own CPU bookkeeping (e.g. the optimizer's step counters)
            for _ in range(20):  # torch syncing a device tensor on the user's behalf: blame the user
                frame = frame.f_back
                if frame is None or not self._internal(frame.f_code.co_filename):
                    break
            if frame is None:
                return
        elif not self.accelerator and tensor.grad_fn is None and not tensor.requires_grad:
            library = self.library_files.get(filename)
            if library is None:
                library = self.library_files[filename] = library_of(filename) is not None
            if library:
                return
        self.sync_sites[(frame.f_code.co_filename, frame.f_lineno)] += 1
        self.sync_total += 1


_probe: Probe | None = None


def get() -> Probe | None:
    """The probe of this process, if installed."""
    return _probe


def install(config: ProbeConfig) -> Probe | None:
    """Install the probe into this process (idempotent). Called right after torch is imported."""
    global _probe
    if _probe is not None:
        return _probe
    import torch

    from torchdoctor.probe import hooks, shims

    set_fault(config.fault)
    probe = Probe(torch, config)
    _probe = probe
    hooks.install_all(probe)
    shims.install_excepthook()
    for what, watch in (("excepthook", _watch_uncaught), ("children", _watch_children),
                        ("own profiler", _watch_own_traces)):
        try:
            watch(probe)
        except Exception as exc:
            ERRORS.record(what, exc)
    atexit.register(_finish)
    os.register_at_fork(after_in_child=_after_fork)
    return probe


def _watch_uncaught(probe: Probe) -> None:
    """Note the type of an uncaught exception (the exit code of the rank says no more than 1)."""
    previous = sys.excepthook

    def excepthook(etype: type[BaseException], value: BaseException, tb: Any) -> None:
        with contextlib.suppress(Exception):
            probe.uncaught = etype.__name__
        previous(etype, value, tb)

    sys.excepthook = excepthook


def _child_ended(run_dir: str, pid: int, returncode: int | None) -> None:
    try:
        output.record_exit(run_dir, pid, returncode)
        if _probe is not None and output.is_probed(run_dir, pid):
            # A probed child (a rank its parent started): its CPU time is its own report's, and once
            # reaped it is in RUSAGE_CHILDREN, which then says nothing of the job's other children.
            _probe.probed_children.add(pid)
    except Exception as exc:
        ERRORS.record("exit status", exc)


def _watch_children(probe: Probe) -> None:
    """Keep the exit status of probed children this process reaps: torchrun's ranks (subprocess)
    and mp.spawn's (multiprocessing), which only their parent learns. One existence check per
    reaped child; a file only for children that have a progress line (probed ranks)."""
    import subprocess
    from multiprocessing import popen_fork

    run_dir = probe.config.run_dir
    handle_exitstatus = subprocess.Popen._handle_exitstatus  # private API: feature-detected

    def reaped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = handle_exitstatus(self, *args, **kwargs)
        _child_ended(run_dir, self.pid, self.returncode)
        return result

    poll = popen_fork.Popen.poll

    def polled(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self.returncode
        result = poll(self, *args, **kwargs)
        if before is None and result is not None:
            _child_ended(run_dir, self.pid, result)
        return result

    subprocess.Popen._handle_exitstatus = reaped  # type: ignore[method-assign]
    popen_fork.Popen.poll = polled  # type: ignore[method-assign]


def _watch_own_traces(probe: Probe) -> None:
    """Record the traces the job's own torch.profiler writes (``export_chrome_trace``, which
    ``tensorboard_trace_handler`` calls too), so the report can name them."""
    from torch.profiler import profiler as tp

    from torchdoctor.probe import shims

    cls = tp._KinetoProfile
    cls.export_chrome_trace = shims.before_only(  # type: ignore[method-assign]
        cls.export_chrome_trace,
        lambda args: probe.note_own_trace(args[1]) if len(args) > 1 else None,
        lambda exc: ERRORS.record("own profiler", exc),
    )


def _finish() -> None:
    if _probe is not None:
        try:
            _probe.finish()
        except Exception as exc:
            ERRORS.record("finish", exc)


def _after_fork() -> None:
    if _probe is not None:
        with contextlib.suppress(Exception):  # a forked child must never fail because of us
            _probe.after_fork_in_child()
