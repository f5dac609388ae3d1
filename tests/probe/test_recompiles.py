"""Recompiles and compile time as the probe reads them from Dynamo (probe/recompiles.py)."""

from __future__ import annotations

import time

import pytest

from probe.livejob import facts_of, run_wrapped, script
from torchdoctor.compile import guards as rc
from torchdoctor.compile.records import LIMIT_REASON
from torchdoctor.probe import recompiles

GUARDS = [
    ("0/7: tensor 'x' size mismatch at index 1. expected 11, actual 12", ("size", "x", 1)),
    ("tensor 'x' dtype mismatch. expected Float, actual Double", ("dtype", "x", None)),
    ("0/2: tensor 'x' rank mismatch. expected 1, actual 2", ("rank", "x", None)),
    ("0/0: n == 2                                # return x * n  # rc.py:6 in g", ("value", "n", None)),
    ("0/0: GLOBAL_STATE changed: grad_mode ", ("global_state", None, None)),
    ("0/0: ___check_obj_id(L['self'].act, 140)", ("identity", None, None)),
    ("0/0: len(L['xs']) == 3", ("length", None, None)),
    ("0/0: tensor 'x' dispatch key set mismatch. expected ...", ("device", "x", None)),
    # torchvision's Faster R-CNN under torch.compile: inputs in a list of dicts, named with quotes.
    ("tensor 'targets[0]['boxes']' size mismatch at index 0. expected 1, actual 2", ("size", "targets[0]['boxes']", 0)),
    # The symbolic guards of a dimension already dynamic.
    ("2 <= targets[1]['boxes'].size()[0]", ("size", "targets[1]['boxes']", 0)),
    ("0/3: L['x'].size()[1] == 64  # model.py:7 in forward", ("size", "x", 1)),
    ("x.stride()[0] <= 4096", ("stride", "x", 0)),
]


@pytest.mark.parametrize(("guard", "want"), GUARDS)
def test_guard_kinds_name_the_input_and_dimension(guard: str, want: tuple) -> None:
    assert rc.guard_kind(guard) == want


def test_symbolic_guards_tell_a_0_or_1_dimension_and_a_pinned_one() -> None:
    assert rc.below_two("2 <= targets[1]['boxes'].size()[0]") and not rc.below_two("2 <= x.size()[0] <= 8")
    assert rc.pinned("0/1: L['x'].size()[1] == 65  # m.py:3 in f") == "65" and rc.pinned("2 <= x.size()[0]") is None
    assert rc.observed_values(["L['x'].size()[1] == 64", "0/1: L['x'].size()[1] == 65"], "size", "x", 1) == ["64", "65"]


def test_observed_values_follow_the_guarded_dimension_only() -> None:
    guards = ["0/0: tensor 'x' size mismatch at index 0. expected 4, actual 5\nUser stack trace: ...",
              "0/1: tensor 'x' size mismatch at index 0. expected 5, actual 6",
              "0/0: tensor 'x' size mismatch at index 0. expected 4, actual 6",
              "0/0: tensor 'y' size mismatch at index 0. expected 9, actual 10",
              "0/0: tensor 'x' size mismatch at index 1. expected 3, actual 7"]
    assert rc.observed_values(guards, "size", "x", 0) == ["4", "5", "6"]
    assert rc.observed_values(["0/0: s == 0.5  # x * s", "0/1: s == 1.5"], "value", "s", None) == ["0.5", "1.5"]


def _fresh_dynamo():
    """(torch, torch._dynamo.utils, collect.compile_facts) with Dynamo's caches, its compilation
    metrics and the probe's record of them cleared."""
    torch = pytest.importorskip("torch")
    import torch._dynamo.utils as utils

    from torchdoctor.probe.collect import compile_facts

    torch._dynamo.reset()
    utils.clear_compilation_metrics()
    recompiles._SEEN.clear()
    return torch, utils, compile_facts


def test_a_recompile_storm_is_explained_per_frame_and_the_limit_is_not_a_graph_break() -> None:
    """A module compiled with dynamic=False and fed 12 batch sizes: 7 recompiles, then the limit
    (8 compiles); Dynamo's own metrics are the truth the facts must match."""
    torch, utils, compile_facts = _fresh_dynamo()
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, batch):
            return self.lin(batch).relu()

    model = Net()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    before = time.time()
    for n in range(4, 16):
        compiled(torch.randn(n, 3))
    metrics = utils.get_compilation_metrics()
    assert sum(1 for m in metrics if m.recompile_reason and not (m.fail_reason or "").startswith(LIMIT_REASON)) == 7
    facts = compile_facts()
    assert facts.recompiles == 7 and facts.graph_breaks == 0, facts
    (frame,) = facts.recompile_frames
    assert frame.frame == "forward" and frame.location.endswith(f"test_recompiles.py:{Net.forward.__code__.co_firstlineno}")
    assert frame.limit_hit and frame.count == 7
    assert (frame.kind, frame.tensor, frame.dim) == ("size", "batch", 0), frame
    assert frame.values[:3] == ["4", "5", "6"] and "12" in frame.values
    assert frame.compile_s > 0 and facts.compile_time_s >= frame.compile_s
    assert facts.dynamo_s is not None and facts.backend_s is not None
    assert abs(facts.dynamo_s + facts.backend_s - facts.compile_time_s) < 0.01
    assert before <= facts.first_compile_at <= before + frame.compile_s / 8 + 1.0  # the first of 8
    # Reading again (the metrics deque is bounded) does not count anything twice.
    assert compile_facts().recompile_frames == facts.recompile_frames
    torch._dynamo.reset()


def test_an_evaluation_and_its_smaller_last_batch_are_two_causes_of_one_frame() -> None:
    """timm's train.py with --torchcompile: the model recompiles once for the evaluation under no_grad
    and once for the validation set's last, smaller batch. Each cause is its own entry with its own
    count, and the size entry keeps the sizes seen (Dynamo's own metrics are the truth)."""
    torch, utils, compile_facts = _fresh_dynamo()

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x).relu()

    compiled = torch.compile(Net(), backend="eager")
    for _ in range(2):
        compiled(torch.randn(16, 3)).sum().backward()
    with torch.no_grad():
        for n in (16, 16, 8):
            compiled(torch.randn(n, 3))
    reasons = [m.recompile_reason for m in utils.get_compilation_metrics() if m.recompile_reason]
    assert len(reasons) == 2, reasons
    facts = compile_facts()
    assert facts.recompiles == 2
    by_kind = {r.kind: r for r in facts.recompile_frames}
    assert set(by_kind) == {"global_state", "size"}, facts.recompile_frames
    assert {r.frame for r in facts.recompile_frames} == {"forward"}
    assert by_kind["global_state"].count == 1 and "grad_mode" in by_kind["global_state"].guard
    size = by_kind["size"]
    assert (size.count, size.tensor, size.dim, sorted(size.values)) == (1, "x", 0, ["16", "8"]), size
    assert not any(r.limit_hit for r in facts.recompile_frames)
    torch._dynamo.reset()


COMPILED_AT_FIRST_CALL = """
import torch

torch.manual_seed(0)
model = torch.compile(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)),
                      backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(64, 32), torch.randn(64, 1)
for step in range(3):
    loss = torch.nn.functional.mse_loss(model(x), y)  # step 0 compiles here, before any backward
    loss.backward()
    opt.step()
    opt.zero_grad()
print("ok")
"""


def test_compile_time_is_a_share_of_the_job_that_includes_it(tmp_path):
    """No DataLoader: the first activity the probe sees is the first backward, after the forward
    compiled. The job's training wall time starts at that compile, so it holds all the compiling
    (the share was clamped at 100%: compile seconds over a wall time that left them out)."""
    result = run_wrapped(tmp_path / "run", script(tmp_path, COMPILED_AT_FIRST_CALL),
                         options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    compiled = facts["compile"]
    assert compiled["compile_time_s"] > 0.05
    assert facts["train_wall_s"] > compiled["compile_time_s"]
