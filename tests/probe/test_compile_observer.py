"""The probe is invisible to torch.compile: same graphs, breaks and break sites with and without it.

The job compiles a model with graph breaks (a data-dependent ``if``, a print and an ``.item()`` in
its forward) three ways:
an ``OptimizedModule`` wrapper, ``Module.compile`` in place (the probe's forward hooks are then
traced by Dynamo) and a compiled training step with ``backward()`` and ``opt.step()`` inside (the
probe's backward shim and optimizer hooks run around and inside compiled frames). It reads what
Dynamo itself recorded and prints it as JSON, so the comparison does not trust the probe.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from probe.livejob import facts_of, run_plain, run_wrapped, script

JOB = """
import json
import sys
from collections import Counter

import torch

backend, variant = sys.argv[1], sys.argv[2]


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if h.sum() > 0:  # LINE_BRANCH
            h = h * 2
        print("forward", h.shape[0], file=sys.stderr)  # LINE_PRINT
        scale = h.mean().item()  # LINE_ITEM
        return self.b(h) * scale


torch.manual_seed(0)
wrapped = torch.compile(Net(), backend=backend)  # an OptimizedModule around the model
inplace = Net()
if variant == "full":
    inplace.compile(backend=backend)  # Module.compile: the module itself runs compiled
opt = torch.optim.SGD([*wrapped.parameters(), *inplace.parameters()], lr=0.01)


@torch.compile(backend=backend)
def train_step(x):
    loss = (wrapped(x) - inplace(x)).pow(2).mean()
    loss.backward()  # LINE_BACKWARD
    opt.step()  # LINE_STEP
    return loss


for step in range(8):
    x = torch.randn(8, 16)
    opt.zero_grad()
    if variant == "full" and step % 2:
        train_step(x)
    else:
        loss = (wrapped(x) - inplace(x)).pow(2).mean()
        loss.backward()
        opt.step()

from torch._dynamo import utils

counters = utils.counters
breaks = Counter()
for reason in utils.graph_break_reasons:
    frame = reason.user_stack[-1] if reason.user_stack else None
    where = f"{frame.filename}:{frame.lineno}" if frame else "?"
    breaks[f"{where} {reason.reason.splitlines()[0]}"] += 1
print(json.dumps({
    "unique_graphs": counters["stats"]["unique_graphs"],
    "graph_breaks": sum(counters["graph_break"].values()),
    "unimplemented": sum(counters["unimplemented"].values()),
    "frames": counters["frames"]["total"],
    "recompiles": sum(len(v) for v in utils.guard_failures.values()),
    "breaks": dict(sorted(breaks.items())),
}))
"""

# Dynamo's log lines start with level, date, time and pid: different in every run.
_LOG_PREFIX = re.compile(r"^[WIE]\d{4} [\d:.]+ \d+ ", re.M)


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(JOB.splitlines(), start=1) if marker in line)


def dynamo_view(stdout: str) -> dict:
    """What Dynamo recorded, less the number of frames it looked at (see the full-variant test)."""
    seen = json.loads(stdout)
    print(json.dumps(seen))  # shown by pytest -s and on failure
    return {k: v for k, v in seen.items() if k != "frames"}


def job_stderr(text: str) -> list[str]:
    return [line for line in _LOG_PREFIX.sub("", text).splitlines() if not line.startswith("torchdoctor:")]


# Inductor compiles C++ for the model: minutes on a busy 2-core machine, so it runs on request.
INDUCTOR = pytest.param("inductor", "forward", marks=[pytest.mark.slow, pytest.mark.skipif(
    not os.environ.get("TORCHDOCTOR_INDUCTOR_TESTS"), reason="set TORCHDOCTOR_INDUCTOR_TESTS=1")])


@pytest.mark.parametrize(("backend", "variant"), [("eager", "full"), INDUCTOR])
def test_same_graphs_and_breaks_with_and_without_the_probe(tmp_path, backend, variant):
    job = script(tmp_path, JOB)
    plain = run_plain(job, backend, variant)
    wrapped = run_wrapped(tmp_path / "run", job, backend, variant)
    assert plain.returncode == 0 and wrapped.returncode == 0, wrapped.stderr
    seen = dynamo_view(plain.stdout)
    assert dynamo_view(wrapped.stdout) == seen
    # The job's own stderr (its prints, Dynamo's warnings) is unchanged: no warning about the probe.
    assert job_stderr(wrapped.stderr) == job_stderr(plain.stderr)
    sites = {key.split(" ")[0] for key in seen["breaks"]}
    assert {f"{job}:{line_of(m)}" for m in ("LINE_PRINT", "LINE_ITEM", "LINE_BRANCH")} <= sites
    assert seen["graph_breaks"] >= 2 and seen["unique_graphs"] >= 3
    if variant == "full":
        assert f"{job}:{line_of('LINE_BACKWARD')}" in sites
    frames = json.loads(wrapped.stdout)["frames"]
    # The probe's frames are never handed to Dynamo. Inside the compiled optimizer step Dynamo
    # traces (and folds away) the probe's optimizer hooks, which changes how it splits torch's
    # step wrapper into frames (one fewer on torch 2.13): graphs and breaks stay the same.
    assert json.loads(plain.stdout)["frames"] - (1 if variant == "full" else 0) <= frames
    assert frames <= json.loads(plain.stdout)["frames"]
    facts = facts_of(tmp_path / "run")
    assert "probe_errors" not in facts
    # The probe names each break at the user's line, with Dynamo's reason and registry id.
    named = {b["location"]: b for b in facts["compile"]["breaks"] if b.get("location")}
    print(json.dumps(facts["compile"]["breaks"], indent=1))
    for marker, reason in (("LINE_PRINT", "Failed to trace builtin operator"),
                           ("LINE_ITEM", "Unsupported Tensor.item() call"),
                           ("LINE_BRANCH", "Data-dependent branching")):
        found = named[f"{job}:{line_of(marker)}"]
        assert found["reason"].startswith(reason) and found["source"] in JOB and marker in found["source"]
        assert found["function"] == "forward" and found.get("gb_id", "GB").startswith("GB")
    assert not [loc for loc in named if "torchdoctor" in loc or "/torch/" in loc]
