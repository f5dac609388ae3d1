"""Step clock: turns probe events into per-step wall-time splits (``StepTiming``).

A *step* is one training iteration. Its boundaries come from the best source seen so far:
optimizer steps (the end of ``optimizer.step()``), else backward calls (their end), else
DataLoader batches (the request of the next batch). When a better source shows up, the steps
counted so far are folded into step 0, so gradient accumulation does not split step 0.

Between two boundaries the probe adds phase times (DataLoader wait, forward, backward,
optimizer, exposed communication); ``other`` is what is left of the wall time. Time spent in the
probe's own housekeeping at a boundary belongs to no step: the next step starts when the probe
calls ``resume`` after that work.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from torchdoctor.facts import SUMMARY_STEPS_KEPT, StepTiming


class Source(enum.IntEnum):
    """What defines step boundaries, in increasing order of trust."""

    NONE = 0
    DATALOADER = 1
    BACKWARD = 2
    OPTIMIZER = 3


class Phase(enum.IntEnum):
    DATALOADER = 0
    FORWARD = 1
    BACKWARD = 2
    OPTIMIZER = 3
    COMM = 4
    # Part of the DATALOADER wait spent on batches that were not ready when asked for (all of it
    # when readiness is unknown). Not a phase of its own: left out of the split of the step.
    DATA_UNREADY = 5
    # Also outside the split: time in ``DataLoader.__iter__`` (a new epoch: workers started, or
    # persistent ones reset), the count of such epoch starts, and the time autograd's anomaly
    # mode spent recording the forward's stack traces (part of FORWARD / BACKWARD already).
    LOADER_ITER = 6
    EPOCH_STARTS = 7
    ANOMALY_STACKS = 8
    # The training thread's scheduler counters over the step (``Sched``): time on a CPU and time
    # runnable but waiting for one (the run-queue delay).
    ON_CPU = 9
    RUN_DELAY = 10
    # Outside the split too (it is part of "other"): time the training thread spent inside
    # checkpoint saves (torch.save, DCP save/async_save), and how many it made.
    CHECKPOINT = 11
    CHECKPOINT_SAVES = 12
    # The training thread's minor page faults over the step and its system CPU time (``Faults``),
    # outside the split: part of ON_CPU.
    MINOR_FAULTS = 13
    SYS_CPU = 14
    # 1 when DDP's logging data timed this step's communication (it samples iterations: COMM is 0
    # on the others, and their collectives sit in BACKWARD).
    COMM_SAMPLED = 15
    # Outside the split (part of FORWARD): the model's forwards run without autograd (no_grad,
    # inference_mode) on the training thread: an evaluation or an RL rollout between updates.
    INFERENCE = 16
    # Part of INFERENCE: those that are the training step's own: forwards of modules whose forward
    # never ran with autograd so far (a DQN target network, a frozen distillation teacher, an EMA
    # copy), and those on an input the step then trains on (gradient caching's feature pass).
    FROZEN_INFERENCE = 17


_MAX_STEPS = SUMMARY_STEPS_KEPT  # keep the summary small on very long runs
# Profiled steps kept apart (``profiled_steps``): a window is a few steps; more are not kept.
_MAX_PROFILED = 64
# A step that resumes this soon after the last one closed starts from the counters read at the close.
REUSE_READ_S = 0.0002

# Reads the calling thread's (ns on CPU, ns waiting for a CPU); None when unavailable.
Sched = Callable[[], "tuple[int, int] | None"]
# Reads the calling thread's (minor page faults, ns of system CPU time); None when unavailable.
Faults = Callable[[], "tuple[int, int] | None"]


class StepClock:
    """Per-step accumulators and the list of recorded steps of one process."""

    def __init__(self, skip: Callable[[int], bool] = lambda step: False, sched: Sched | None = None,
                 faults: Faults | None = None) -> None:
        # Steps for which ``skip`` is true are not recorded (the profiler window inflates them).
        self.skip = skip
        # Read at the start and the end of every step, on the thread that drives the clock (the
        # training thread): its scheduler counters over the step. None: not recorded.
        self.sched = sched
        self.sched_at: tuple[int, int] | None = None
        self.has_sched = False
        self.faults = faults  # read with sched, on the same thread
        self.faults_at: tuple[int, int] | None = None
        self.has_faults = False
        # The counters read when the last step closed, and when: the next step starts from them
        # when it resumes within REUSE_READ_S (two syscalls a step fewer; the probe's own
        # housekeeping in between, microseconds, then counts in the next step).
        self.closed_read: tuple[float, tuple[int, int] | None, tuple[int, int] | None] | None = None
        self.source = Source.NONE
        self.index = 0  # index of the step in progress
        self.started_at: float | None = None  # start of the step in progress; None between steps
        self.first_activity: float | None = None
        self.acc = [0.0] * len(Phase)
        self.samples = 0
        # Closed steps: (index, total seconds, phase seconds, samples).
        self.rows: list[tuple[int, float, list[float], int]] = []
        # Closed steps for which ``skip`` was true, apart: their times are the profiler's too, but
        # what ran in them (a checkpoint save) is the job's.
        self.skipped_rows: list[tuple[int, float, list[float], int]] = []

    @property
    def running(self) -> bool:
        return self.started_at is not None

    def begin(self, now: float) -> None:
        """Note training activity at ``now``; starts step 0 if nothing started yet."""
        if self.first_activity is None:
            self.first_activity = now
            self.started_at = now
            self._mark_sched()

    def resume(self, now: float) -> None:
        """Start the next step at ``now`` (after the probe's housekeeping at a boundary)."""
        if self.first_activity is not None and self.started_at is None:
            self.started_at = now
            read, self.closed_read = self.closed_read, None
            if read is None or now - read[0] >= REUSE_READ_S:
                self._mark_sched()
                return
            self.sched_at, self.faults_at = read[1], read[2]
            if self.sched_at is None and self.sched is not None:
                self.sched_at = self.sched()
            if self.faults_at is None and self.faults is not None:
                self.faults_at = self.faults()

    def _mark_sched(self) -> None:
        self.sched_at = self.sched() if self.sched is not None else None
        self.faults_at = self.faults() if self.faults is not None else None

    def _add_sched(self, at: float) -> None:
        """Add the training thread's scheduler and fault counters since the step started to the
        step; keep the readings (``closed_read``) for the next step's start."""
        now_f = now = None
        if self.faults_at is not None and self.faults is not None:
            now_f = self.faults()
            if now_f is not None:
                self.acc[Phase.MINOR_FAULTS] += now_f[0] - self.faults_at[0]
                self.acc[Phase.SYS_CPU] += (now_f[1] - self.faults_at[1]) / 1e9
                self.has_faults = True
            self.faults_at = None
        if self.sched_at is not None and self.sched is not None:
            now = self.sched()
            if now is not None:
                self.acc[Phase.ON_CPU] += (now[0] - self.sched_at[0]) / 1e9
                self.acc[Phase.RUN_DELAY] += (now[1] - self.sched_at[1]) / 1e9
                self.has_sched = True
            self.sched_at = None
        self.closed_read = (at, now, now_f)  # a None here is read afresh by resume

    def add(self, phase: Phase, seconds: float) -> None:
        self.acc[phase] += seconds

    def boundary(self, source: Source, now: float) -> int | None:
        """Close the step in progress at ``now`` if ``source`` defines steps; return its index.

        The caller must call ``resume`` afterwards, once its own boundary work is done.
        """
        if source < self.source or self.started_at is None:
            if source == Source.DATALOADER and self.source <= source:
                self.begin(now)  # the first batch request opens step 0
            return None
        if source > self.source:
            if self.source != Source.NONE:
                self._fold_into_step_zero()
            self.source = source
            if source == Source.DATALOADER and self.index == 0 and not any(self.acc[: Phase.DATA_UNREADY]):
                # First batch request: it opens step 0, closes nothing (the marks outside the
                # split, e.g. the epoch start of the loader's __iter__ just before, stay in step 0).
                return None
        closed = self.index
        self._add_sched(now)
        # Kept raw (the accumulator list itself): StepTimings are built only when asked for.
        row = (closed, now - self.started_at, self.acc, self.samples)
        if not self.skip(closed):
            if len(self.rows) < _MAX_STEPS:
                self.rows.append(row)
        elif len(self.skipped_rows) < _MAX_PROFILED:
            self.skipped_rows.append(row)
        self.index += 1
        self.acc = [0.0] * len(Phase)
        self.samples = 0
        self.started_at = None
        return closed

    def attribute_comm(self, step: int, seconds: float) -> None:
        """Move ``seconds`` of exposed communication of recorded ``step`` out of its backward time."""
        for index, _, acc, _ in reversed(self.rows[-4:]):
            if index == step:
                comm = min(seconds, acc[Phase.BACKWARD])
                acc[Phase.COMM] = comm
                acc[Phase.BACKWARD] -= comm
                acc[Phase.COMM_SAMPLED] = 1.0
                return

    def _fold_into_step_zero(self) -> None:
        # Steps counted by a weaker source were pieces of the first real step.
        for _, _, acc, samples in self.rows:
            self.acc = [a + b for a, b in zip(self.acc, acc, strict=True)]
            self.samples += samples
        self.rows = []
        self.skipped_rows = []
        self.index = 0
        self.started_at = self.first_activity

    @property
    def steps(self) -> list[StepTiming]:
        """The recorded steps, in milliseconds; ``other`` is the wall time no phase claims."""
        return self._timings(self.rows)

    @property
    def profiled_steps(self) -> list[StepTiming]:
        """The steps ``skip`` left out of ``steps`` (the profiler's window), timed the same way."""
        return self._timings(self.skipped_rows)

    def _timings(self, rows: list[tuple[int, float, list[float], int]]) -> list[StepTiming]:
        out = []
        for step, total_s, acc, samples in rows:
            ms = [round(v * 1e3, 3) for v in acc]
            total_ms = round(total_s * 1e3, 3)
            out.append(
                StepTiming(
                    step=step,
                    total_ms=total_ms,
                    dataloader_ms=ms[Phase.DATALOADER],
                    forward_ms=ms[Phase.FORWARD],
                    backward_ms=ms[Phase.BACKWARD],
                    optimizer_ms=ms[Phase.OPTIMIZER],
                    comm_ms=ms[Phase.COMM],
                    other_ms=round(max(0.0, total_ms - sum(ms[: Phase.DATA_UNREADY])), 3),
                    samples=samples or None,
                    dataloader_unready_ms=ms[Phase.DATA_UNREADY],
                    loader_iter_ms=ms[Phase.LOADER_ITER],
                    epoch_starts=int(acc[Phase.EPOCH_STARTS]),
                    anomaly_stack_ms=ms[Phase.ANOMALY_STACKS],
                    thread_cpu_ms=ms[Phase.ON_CPU] if self.has_sched else None,
                    run_delay_ms=ms[Phase.RUN_DELAY] if self.has_sched else None,
                    checkpoint_ms=ms[Phase.CHECKPOINT],
                    checkpoint_saves=int(acc[Phase.CHECKPOINT_SAVES]),
                    minor_faults=int(acc[Phase.MINOR_FAULTS]) if self.has_faults else None,
                    thread_sys_ms=ms[Phase.SYS_CPU] if self.has_faults else None,
                    comm_sampled=bool(acc[Phase.COMM_SAMPLED]),
                    inference_ms=ms[Phase.INFERENCE],
                    frozen_inference_ms=ms[Phase.FROZEN_INFERENCE],
                )
            )
        return out
