"""A real legacy-profiler trace (`torch.autograd.profiler.profile`, no ProfilerStep) analysed end to end.

torch 2.13's legacy profiler runs on Kineto and exports the same Chrome-trace JSON as
torch.profiler (schemaVersion, traceEvents with cpu_op / user_annotation events), so the decoder
reads it unchanged. The loop: ITERS iterations of a small MLP with SGD; the first sleeps
WARMUP_S inside the iteration (a stand-in for cuDNN set-up, allocator warm-up), every one sleeps
STEADY_S between backward and the optimizer step, so steady iterations are clearly defined.

Nothing asserts wall-clock timings of the run: the checks compare numbers read from the trace
with each other, or with lower bounds that sleeping guarantees (a sleep never returns early).
"""

from __future__ import annotations

import subprocess
import sys
import time
from statistics import median

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torchdoctor.session import analyze_rank_file  # noqa: E402
from torchdoctor.trace.load import load_trace  # noqa: E402

ITERS = 8
WARMUP_S = 0.5
STEADY_S = 0.03


def record(path: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                                torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 10)
    with torch.autograd.profiler.profile() as prof:
        for i in range(ITERS):
            opt.zero_grad()
            if i == 0:
                time.sleep(WARMUP_S)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            time.sleep(STEADY_S)
            opt.step()
    prof.export_chrome_trace(path)


@pytest.fixture(scope="module")
def legacy_trace(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("legacy") / "legacy.json")
    record(path)
    return path


def test_decoder_reads_the_legacy_export(legacy_trace):
    tr = load_trace(legacy_trace)
    assert tr.warnings == []
    names = tr.names_of(np.arange(len(tr)))
    assert not any(n.startswith("ProfilerStep#") for n in names)
    assert names.count("Optimizer.step#SGD.step") == ITERS
    assert names.count("aten::mse_loss") == ITERS


def test_steps_inferred_from_optimizer_and_warmup_skipped(legacy_trace):
    r = analyze_rank_file(legacy_trace)
    w = r.window
    assert w.boundaries == "Optimizer.step"
    assert w.mode == "steady-state (steps inferred from Optimizer.step)"
    assert w.skipped_warmup == [0]
    assert w.steps == list(range(1, ITERS))
    assert [row.step for row in r.steps] == list(range(1, ITERS))
    # Every steady step holds its iteration's sleep; the window excludes the warm-up sleep.
    assert all(row.dur_ms >= STEADY_S * 1e3 for row in r.steps)
    assert (w.end_ns - w.start_ns) / 1e9 < (ITERS - 1) * STEADY_S + WARMUP_S


def test_window_step_time_is_the_steady_iteration_time(legacy_trace):
    """Per-step window time vs the iteration period read independently from the trace: the
    spacing of the zero_grad annotations that open every iteration.
    """
    tr = load_trace(legacy_trace)
    starts = np.sort(tr.ts[tr.name_mask(lambda n: n == "Optimizer.zero_grad#SGD.zero_grad")])
    assert starts.size == ITERS
    period = median(np.diff(starts[1:]).tolist())  # steady iterations: 1 -> 2, ..., 6 -> 7
    r = analyze_rank_file(legacy_trace)
    # Medians: one iteration delayed by a loaded machine moves neither.
    assert 0.8 * period <= r.metrics.step_ms_median * 1e6 <= 1.25 * period
    # The window's mean step: had the warm-up (>= 0.5 s) been kept it would be ~3x the period.
    per_step = (r.window.end_ns - r.window.start_ns) / len(r.window.steps)
    assert 0.8 * period <= per_step <= 1.5 * period
    # The warm-up iteration, 0 -> 1, is the one holding the long sleep.
    assert starts[1] - starts[0] >= WARMUP_S * 1e9


def test_the_console_says_where_the_steps_came_from(legacy_trace):
    done = subprocess.run([sys.executable, "-m", "torchdoctor.cli", "analyze", legacy_trace],
                          capture_output=True, text=True)
    assert done.returncode in (0, 4), done.stderr[-2000:]
    assert f"steps 1–{ITERS - 1} from Optimizer.step" in done.stdout  # inferred steps, and from what
