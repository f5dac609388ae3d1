"""Steps inferred without ProfilerStep: Optimizer.step, DataLoader, backward boundaries, in that order.

Fixtures are built in code (kineto_builder). One iteration is PERIOD µs long: a DataLoader fetch,
a forward op, two autograd roots (the backward pass), the optimizer step and a zero_grad; the
first iteration's forward is SLOW µs longer (the warm-up that must be skipped).
"""

from __future__ import annotations

from statistics import median

import msgspec
import pytest

from kineto_builder import MAIN_TID, TraceBuilder
from real_traces import trace
from torchdoctor.metrics import steps as S
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.metrics.steps import WindowError, choose_window, step_boundaries
from torchdoctor.trace.load import load_trace

PERIOD = 1000.0
SLOW = 2000.0
N = 8
US = 1000  # ns per µs
AUTOGRAD_TID = 77  # the engine's device thread on CUDA
PIN_TID = 88  # a pin_memory thread


def iteration(b: TraceBuilder, t0: float, slow: float = 0.0, dl: bool = True, opt: bool = True,
              roots: bool = True, annotate: bool = False, bw_tid: int = MAIN_TID) -> float:
    """One iteration starting at `t0` (µs); returns where the next one starts."""
    if dl:
        b.dataloader(t0, 50)
    b.op("aten::linear", t0 + 60, 200 + slow)
    t = t0 + slow
    if annotate:
        b.annotation("## backward ##", t + 290, 220)
    if roots:
        b.op("autograd::engine::evaluate_function: AddmmBackward0", t + 300, 100, tid=bw_tid)
        b.op("aten::mm", t + 310, 50, tid=bw_tid)  # nested in its root: no cut
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t + 405, 90, tid=bw_tid)
    if opt:
        b.annotation("Optimizer.step#SGD.step", t + 600, 100)
    b.op("aten::zero_", t + 750, 50)
    return t0 + PERIOD + slow


def training(n: int = N, **kw) -> TraceBuilder:
    b = TraceBuilder(device_name=None)
    t = 0.0
    for i in range(n):
        t = iteration(b, t, SLOW if i == 0 else 0.0, **kw)
    return b


def load(b: TraceBuilder, tmp_path):
    return load_trace(str(b.write(tmp_path / "t.json")))


def ends_us(steps) -> list[float]:
    return [s.end / US for s in steps]


def test_optimizer_steps_first_in_trust_and_warmup_skipped(tmp_path):
    tr = load(training(), tmp_path)
    source, steps = step_boundaries(tr)
    assert source == "Optimizer.step"
    assert [s.number for s in steps] == list(range(N))
    # Step 0 runs from the trace's first host event (the first fetch at 0) to its optimizer's end.
    assert (steps[0].start, steps[0].end) == (0, (SLOW + 700) * US)
    assert ends_us(steps[1:]) == [SLOW + 700 + k * PERIOD for k in range(1, N)]
    win = choose_window(tr)
    assert win.mode == "steady-state (steps inferred from Optimizer.step)"
    assert win.boundaries == "Optimizer.step"
    assert win.skipped_warmup == (0,)
    assert [s.number for s in win.steps] == list(range(1, N))
    assert (win.start, win.end) == (steps[1].start, steps[-1].end)
    assert win.dur == (N - 1) * PERIOD * US


def test_dataloader_steps_when_no_optimizer(tmp_path):
    tr = load(training(opt=False), tmp_path)
    source, steps = step_boundaries(tr)
    assert source == "DataLoader"
    starts = [0.0, SLOW + PERIOD] + [SLOW + PERIOD * k for k in range(2, N)]
    assert [s.start / US for s in steps] == starts
    # The last step ends at the last host event: that iteration's zero_grad.
    assert steps[-1].end / US == starts[-1] + 800
    win = choose_window(tr)
    assert (win.mode, win.boundaries, win.skipped_warmup) == (
        "steady-state (steps inferred from DataLoader)", "DataLoader", (0,))
    assert len(win.steps) == N - 1


def test_dataloader_exhausted_fetch_is_a_partial_step(tmp_path):
    b = training(opt=False)
    b.dataloader(SLOW + N * PERIOD, 20)  # the fetch that raised StopIteration
    source, steps = step_boundaries(load(b, tmp_path))
    assert source == "DataLoader" and len(steps) == N
    assert steps[-1].end / US == SLOW + N * PERIOD  # cut at the exhausted fetch


def test_backward_roots_on_the_same_thread(tmp_path):
    tr = load(training(opt=False, dl=False), tmp_path)
    source, steps = step_boundaries(tr)
    assert source == "backward" and len(steps) == N
    # Each pass ends with its AccumulateGrad root (t + 495); the first step starts at the first op.
    assert steps[0].start == 60 * US
    assert ends_us(steps) == [SLOW + 495 + k * PERIOD for k in range(N)]
    assert choose_window(tr).mode == "steady-state (steps inferred from backward)"


def test_backward_roots_on_the_autograd_thread(tmp_path):
    """CUDA layout: roots on the engine's thread, forward on the main one, a pin_memory thread busy
    during every pass (it must not cut one).
    """
    b = training(opt=False, dl=False, bw_tid=AUTOGRAD_TID)
    for k in range(N):
        b.op("aten::pin_memory", SLOW + k * PERIOD + 401, 3, tid=PIN_TID)  # between a pass's roots
    passes = S.backward_passes(load(b, tmp_path))
    assert [(a / US, e / US) for a, e in zip(*passes, strict=True)] == [
        (SLOW + k * PERIOD + 300, SLOW + k * PERIOD + 495) for k in range(N)]
    source, steps = step_boundaries(load(b, tmp_path))
    assert source == "backward" and len(steps) == N


def test_backward_annotation_preferred_over_roots(tmp_path):
    tr = load(training(opt=False, dl=False, annotate=True), tmp_path)
    starts, ends = S.backward_passes(tr)
    assert list(ends / US) == [SLOW + 510 + k * PERIOD for k in range(N)]
    assert list(starts / US) == [SLOW + 290 + k * PERIOD for k in range(N)]


def test_order_of_trust(tmp_path):
    # Every source present: Optimizer.step wins; without it DataLoader; without both, backward.
    assert step_boundaries(load(training(), tmp_path))[0] == "Optimizer.step"
    assert step_boundaries(load(training(opt=False), tmp_path))[0] == "DataLoader"
    assert step_boundaries(load(training(opt=False, dl=False), tmp_path))[0] == "backward"


def test_one_optimizer_step_is_not_enough(tmp_path):
    b = training(opt=False)
    b.annotation("Optimizer.step#SGD.step", SLOW + 600, 100)
    assert step_boundaries(load(b, tmp_path))[0] == "DataLoader"


def test_inconsistent_optimizer_period_falls_through(tmp_path):
    # The optimizer steps at iterations 1, 2, 6 and 7 only: steady periods 1, 4, 1 iterations.
    b = training(opt=False)
    for k in (1, 2, 6, 7):
        b.annotation("Optimizer.step#SGD.step", SLOW + k * PERIOD + 600, 100)
    tr = load(b, tmp_path)
    durs = [s.dur / US for s in S.optimizer_steps(tr, 0)]
    assert durs == [SLOW + PERIOD + 700, PERIOD, 4 * PERIOD, PERIOD]
    assert not S.consistent(S.optimizer_steps(tr, 0))
    assert step_boundaries(tr)[0] == "DataLoader"


def test_nested_duplicates_count_once(tmp_path):
    b = training(opt=False)
    for k in range(N):
        t = SLOW + k * PERIOD
        # A wrapper optimizer around SGD, and SGD's step also seen as an op of the same span.
        b.annotation("Optimizer.step#EMAOptimizer.step", t + 590, 120)
        b.annotation("Optimizer.step#SGD.step", t + 600, 100)
        b.op("Optimizer.step#SGD.step", t + 600, 100)
    source, steps = step_boundaries(load(b, tmp_path))
    assert source == "Optimizer.step" and len(steps) == N
    assert ends_us(steps) == [SLOW + 710 + k * PERIOD for k in range(N)]


def test_two_optimizers_per_iteration_give_one_step(tmp_path):
    # Dense and sparse optimizers step one after the other: the one ending last delimits.
    b = training(opt=False)
    for k in range(N):
        t = SLOW + k * PERIOD
        b.annotation("Optimizer.step#Adam.step", t + 600, 50)
        b.annotation("Optimizer.step#SparseAdam.step", t + 660, 40)
    source, steps = step_boundaries(load(b, tmp_path))
    assert source == "Optimizer.step" and len(steps) == N
    assert ends_us(steps) == [SLOW + 700 + k * PERIOD for k in range(N)]


def test_no_boundary_keeps_the_whole_trace(tmp_path):
    tr = load(training(opt=False, dl=False, roots=False), tmp_path)
    win = choose_window(tr)
    assert win.steps == () and win.boundaries == "none"
    assert win.mode == ("whole trace (no ProfilerStep, nor any Optimizer.step, DataLoader or backward "
                        "boundary)")
    assert (win.start, win.end) == (60 * US, (SLOW + (N - 1) * PERIOD + 800) * US)
    with pytest.raises(WindowError, match=r"--steps 0:2 selects no step: the trace has no steps: no ProfilerStep, "
                                          r"and no Optimizer.step, DataLoader or backward boundary"):
        choose_window(tr, "0:2")


def test_boundaries_too_irregular_to_be_steps_are_named(tmp_path):
    # Optimizer steps at iterations 1, 2, 6 and 7 only, nothing else: the whole trace is the window,
    # and the label says the optimizer's boundaries were seen, not that there were none.
    b = training(opt=False, dl=False, roots=False)
    for k in (1, 2, 6, 7):
        b.annotation("Optimizer.step#SGD.step", SLOW + k * PERIOD + 600, 100)
    win = choose_window(load(b, tmp_path), "all")
    assert win.steps == () and win.boundaries == "none"
    assert win.mode == "whole trace (no ProfilerStep; Optimizer.step boundaries found, but too irregular to be steps)"


def test_steps_range_on_inferred_steps(tmp_path):
    tr = load(training(opt=False), tmp_path)
    win = choose_window(tr, "2:4")
    assert [s.number for s in win.steps] == [2, 3]
    assert win.mode == "steps 2:4 (inferred from DataLoader)" and win.boundaries == "DataLoader"
    assert (win.start / US, win.end / US) == (SLOW + 2 * PERIOD, SLOW + 4 * PERIOD)
    every = choose_window(tr, "all")
    assert every.mode == "all steps (inferred from DataLoader)" and len(every.steps) == N
    assert choose_window(tr, "trace").mode == "trace"
    with pytest.raises(WindowError, match=r"--steps 9:12 selects no step: the trace has steps 0\.\.7 "
                                          r"\(inferred from DataLoader\)"):
        choose_window(tr, "9:12")


def test_profiler_steps_still_win(tmp_path):
    b = training()
    for k in range(N):
        b.step(k + 10, SLOW + k * PERIOD if k else 0.0, PERIOD + (SLOW if k == 0 else 0.0))
    win = choose_window(load(b, tmp_path))
    assert (win.mode, win.boundaries) == ("steady-state", "ProfilerStep")
    assert [s.number for s in win.steps] == list(range(11, 10 + N))
    with pytest.raises(WindowError, match=r"selects no step: the trace has steps 10\.\.17 \(ProfilerStep\)"):
        choose_window(load(b, tmp_path), "0:3")


def test_boundaries_serialised_and_per_step_rows(tmp_path):
    r = analyze_rank(load(training(), tmp_path))
    assert r.window.boundaries == "Optimizer.step" and r.window.skipped_warmup == [0]
    assert [row.step for row in r.steps] == list(range(1, N))
    assert r.metrics.step_ms_median == PERIOD / 1000
    doc = msgspec.json.decode(msgspec.json.encode(r.window))
    assert doc["boundaries"] == "Optimizer.step"


@pytest.mark.parametrize(("name", "hidden", "source"), [
    # CUDA DDP: roots on the autograd thread, pin_memory/NCCL threads beside it.
    ("a100_8rank_rank3.json.gz", ("ProfilerStep#", "Optimizer.step#", "enumerate(DataLoader)#", "## backward"),
     "backward"),
    ("v100_2rank_rank1_diff.json.gz", ("ProfilerStep#", "Optimizer.step#"), "DataLoader"),
    ("v100_resnet_rank0.json.gz", ("ProfilerStep#",), "Optimizer.step"),
])
def test_real_traces_with_profiler_steps_hidden(name, hidden, source):
    """Inferred steps of a real trace whose ProfilerSteps (and stronger sources) are renamed away
    match the ProfilerStep count and median period.
    """
    tr = load_trace(trace(name))
    real = S.find_steps(tr)
    tr.names = ["hidden:" + n if n.startswith(hidden) else n for n in tr.names]
    got_source, got = step_boundaries(tr)
    assert got_source == source and len(got) == len(real)
    real_med = median(s.dur for s in real[1:])
    got_med = median(s.dur for s in got[1:])
    assert abs(got_med - real_med) <= 0.02 * real_med
