"""Fail-safety: whatever breaks, the job's exit code and output are exactly those without the probe."""

from __future__ import annotations

import pytest

from probe.livejob import TRAIN, facts_of, job_stderr, load_run, run_plain, run_wrapped, script

# Observers of every kind (shims, torch-called hooks, module hooks, the profiler window)
# raise at once; the job must not notice, and each failure is recorded once. ("backward" and
# "optimizer.post" are left working: they start the clock and close steps, so the other sites run.)
ALL_SITES = "dataloader.iter,dataloader.next,forward,optimizer.pre,sync,window"


@pytest.fixture(scope="module")
def train_job(tmp_path_factory):
    """The training script and its plain run (10 steps, exit code 3), shared by the tests below."""
    job = script(tmp_path_factory.mktemp("train"), TRAIN)
    return job, run_plain(job, "10", "3")


def test_exit_code_stdout_and_stderr_pass_through(tmp_path, train_job):
    job, plain = train_job
    wrapped = run_wrapped(tmp_path / "run", job, "10", "3")
    assert plain.returncode == wrapped.returncode == 3
    assert wrapped.stdout == plain.stdout  # the report goes to stderr: stdout is the job's alone
    assert job_stderr(wrapped.stderr) == plain.stderr
    manifest = load_run(tmp_path / "run")
    assert manifest["schema"] == "torchdoctor.run/1"
    assert manifest["exit_code"] == 3 and manifest["command"][-2:] == ["10", "3"]
    (rank,) = manifest["ranks"]
    steps = rank["facts"]["steps"]
    # 10 optimizer steps, the profiler window (5, 6, 7) left out of the timings.
    assert [s["step"] for s in steps] == [0, 1, 2, 3, 4, 8, 9]
    assert rank["facts"]["profile_steps"] == [5, 8] and rank["facts"]["trace_file"] == "traces/rank0.json.gz"
    assert (tmp_path / "run" / "traces" / "rank0.json.gz").is_file()


def test_probe_hooks_that_raise_change_nothing(tmp_path, train_job):
    job, plain = train_job
    wrapped = run_wrapped(tmp_path / "run", job, "10", "3", TORCHDOCTOR_PROBE_FAULT=ALL_SITES)
    assert plain.returncode == wrapped.returncode == 3
    assert wrapped.stdout == plain.stdout
    assert job_stderr(wrapped.stderr) == plain.stderr
    errors = facts_of(tmp_path / "run")["probe_errors"]
    assert {e.split(":")[0] for e in errors} == set(ALL_SITES.split(","))
    # Logged once per site, prefixed "torchdoctor:", on stderr.
    logged = [line for line in wrapped.stderr.splitlines() if "injected probe fault" in line]
    assert len(logged) == len(ALL_SITES.split(",")) and all(
        line.startswith("torchdoctor:") for line in logged
    )


# An exception through a wrapped torch call (the dataset inside DataLoader.__next__) and a
# warning with stacklevel=2 raised inside a wrapped call.
FAILING = """
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

class Liar(IterableDataset):
    def __len__(self):
        return 2
    def __iter__(self):
        return iter([torch.zeros(1)] * 4)
    def __repr__(self):
        return "Liar()"

class Corrupt(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        if i == 9:
            raise ValueError(f"corrupt sample {i}")
        return torch.ones(2)

liar = DataLoader(Liar(), batch_size=None)
assert len(liar) == 2
for _ in liar:  # UserWarning pointing at this line (stacklevel=2 inside __next__)
    pass
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(Corrupt(), batch_size=1):
    model(x).sum().backward()
    opt.step()
"""


def test_user_errors_and_warnings_look_the_same(tmp_path):
    job = script(tmp_path, FAILING)
    plain = run_plain(job, "dataset")
    wrapped = run_wrapped(tmp_path / "run", job, "dataset")
    assert plain.returncode == wrapped.returncode == 1
    assert "UserWarning: Length of IterableDataset" in plain.stderr and "corrupt sample 9" in plain.stderr
    assert job_stderr(wrapped.stderr) == plain.stderr  # same traceback frames, same warning line
    assert facts_of(tmp_path / "run")["steps"]  # the wrapper still reports what it saw


# No DataLoader and no optimizer: a hand-written SGD loop. Steps then come from backward calls.
MANUAL = """
import torch
w = torch.zeros(8, requires_grad=True)
for i in range(12):
    loss = ((torch.randn(32, 8) @ w - 1.0) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad = None
print("manual done")
"""

# Inference only: steps come from DataLoader batches; no torch.distributed anywhere.
INFERENCE = """
import torch
from torch.utils.data import DataLoader, TensorDataset
model = torch.nn.Linear(4, 2).eval()
with torch.no_grad():
    for (x,) in DataLoader(TensorDataset(torch.randn(96, 4)), batch_size=8):
        model(x)
print("inference done")
"""

# Gradient accumulation: 3 micro-batches per optimizer step must not count as 3 steps.
ACCUMULATE = """
import torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.AdamW(model.parameters())
for step in range(10):
    for micro in range(3):
        model(torch.randn(8, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def test_step_fallbacks(tmp_path):
    cases = {"manual": (MANUAL, "backward", 12), "inference": (INFERENCE, "dataloader", 12),
             "accumulate": (ACCUMULATE, "optimizer", 10)}  # fmt: skip
    for name, (body, source, n_steps) in cases.items():
        job = script(tmp_path, body, f"{name}.py")
        wrapped = run_wrapped(tmp_path / name, job, options=("--profile-steps", "off"))
        assert wrapped.returncode == 0, wrapped.stderr
        facts = facts_of(tmp_path / name)
        assert facts["step_source"] == source
        # A DataLoader-driven loop: the request that ends the iteration closes the last step.
        assert len(facts["steps"]) == n_steps, (name, [s["step"] for s in facts["steps"]])
        assert "probe_errors" not in facts and facts.get("distributed_backend") is None


WORKERS = """
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.arange(64.0).reshape(32, 2))
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
total = 0.0
for (x,) in DataLoader(data, batch_size=4, num_workers=1):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total += float(x.sum())
print(f"sum {total}")
"""


def test_a_worker_whose_instrumentation_fails_loads_as_without_the_probe(tmp_path):
    # The workers' own counters (probe/workers.py) fail to install: the worker loads exactly as
    # without the probe, and the loader simply has no counters.
    job = script(tmp_path, WORKERS)
    plain = run_plain(job)
    wrapped = run_wrapped(tmp_path / "run", job, TORCHDOCTOR_PROBE_FAULT="dataloader.worker")
    assert plain.returncode == wrapped.returncode == 0 and wrapped.stdout == plain.stdout == "sum 2016.0\n"
    assert job_stderr(wrapped.stderr) == plain.stderr
    (loader,) = facts_of(tmp_path / "run")["dataloaders"]
    assert loader["num_workers"] == 1 and "worker_batches" not in loader
    assert not list((tmp_path / "run" / "ranks").glob("worker*.json"))
    # Without the fault, the same worker counts its 8 batches.
    run_wrapped(tmp_path / "ok", job)
    (loader,) = facts_of(tmp_path / "ok")["dataloaders"]
    assert loader["worker_batches"] == 8 and loader["worker_collate_syncs_per_batch"] == 0.0



def test_a_warning_shown_once_stays_shown_once(tmp_path, train_job):
    """The job warns every step; Python shows it once. The profiler window in the middle must not
    reset Python's record of shown warnings (warnings.catch_warnings did: the DDP tutorial of
    pytorch/examples printed its pin_memory warning twice under `run`)."""
    job = script(tmp_path, TRAIN.replace("        opt.step()\n",
                                         "        opt.step()\n        import warnings\n"
                                         "        warnings.warn('the same warning every step')\n"))
    plain = run_plain(job, "10", "0")
    assert plain.stderr.count("UserWarning: the same warning every step") == 1
    wrapped = run_wrapped(tmp_path / "run", job, "10", "0")
    assert facts_of(tmp_path / "run")["profile_steps"] == [5, 8]  # the window ran between the warnings
    assert job_stderr(wrapped.stderr) == plain.stderr


DROPPED_EARLY = """
import gc
import torch
from torch.utils.data import DataLoader, IterableDataset

gc.disable()


class Stream(IterableDataset):
    def __iter__(self):
        try:
            for _ in range(100):
                yield torch.rand(2)  # a draw: the probe checks the first fetches for it
        finally:
            print("closed")


it = iter(DataLoader(Stream(), batch_size=4))
next(it)
del it  # a sanity check's single batch: the stream closes here, as without the probe
print("dropped")
"""


def test_an_iterator_dropped_early_is_freed_as_without_the_probe(tmp_path):
    """The random-draw check wraps an in-process iterator's fetch for its first fetches: the wrapper
    held its fetcher, a cycle that kept a dropped iterator (and its dataset's open stream) alive until
    the next garbage collection ('dropped' before 'closed')."""
    job = script(tmp_path, DROPPED_EARLY)
    plain = run_plain(job)
    assert plain.stdout == "closed\ndropped\n", plain.stderr
    result = run_wrapped(tmp_path / "run", job, options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == plain.stdout, result.stderr


SCRIPTED = """
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model = torch.jit.script(net)
side = torch.nn.Linear(16, 4)  # a second root, plain: still timed
opt = torch.optim.SGD(list(model.parameters()) + list(side.parameters()), lr=0.1)
data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
for x, y in DataLoader(data, batch_size=16):
    loss = torch.nn.functional.cross_entropy(model(x) + side(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss {loss.item():.6f}")
"""


def test_a_torchscript_model_is_left_unhooked_and_the_other_roots_timed(tmp_path):
    """TorchScript modules refuse forward hooks (RuntimeError): one scripted root used to abort the
    hooking of every root at step 0's boundary, logged as a probe error. It is skipped and counted,
    the plain root beside it is timed, and the job's output is the same."""
    job = script(tmp_path, SCRIPTED)
    plain, wrapped = run_plain(job), run_wrapped(tmp_path / "run", job, options=("--profile-steps", "off"))
    assert wrapped.returncode == plain.returncode == 0, wrapped.stderr
    assert wrapped.stdout == plain.stdout
    facts = facts_of(tmp_path / "run")
    assert "probe_errors" not in facts, facts.get("probe_errors")
    assert facts["script_roots"] == 1
    steady = [s for s in facts["steps"] if s["step"] >= 1]
    assert len(steady) == 15 and all(s.get("forward_ms", 0) > 0 for s in steady)
