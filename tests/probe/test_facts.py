"""What the probe records about a single-process job: configuration, syncs, timings, the trace."""

from __future__ import annotations

import gzip
import json

import pytest

from probe.livejob import TRAIN, facts_of, load_run, run_wrapped, script

JOB = """
import time
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset, default_collate

def counting_collate(batch):
    x, y = default_collate(batch)
    labels = [int(v.item()) for v in y]  # one host sync per sample
    time.sleep(0.003)  # a slow collate: the probe times it
    return x, y

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(4096, 96)  # 1.5 MiB: reported as a large embedding
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    def forward(self, x):
        return self.body(x)

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
train = DataLoader(data, batch_size=8, collate_fn=counting_collate)  # LINE_TRAIN
net = Net()
model = torch.compile(net, backend="eager")  # compiles exactly as without the probe
opt = torch.optim.AdamW(net.parameters(), foreach=False)  # LINE_OPT
losses = []
for step, (x, y) in enumerate(train):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    loss = F.cross_entropy(out.float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())  # LINE_SYNC
    if step == 11:
        break
side = DataLoader(data, batch_size=32, num_workers=2, persistent_workers=True)  # LINE_SIDE
for _ in range(2):
    for batch in side:
        pass

class SlowReads(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.002)  # a read: the workers time it apart from the collate
        return torch.rand(4), torch.tensor(i % 4)  # a random augmentation, drawn in the worker

def worker_collate(batch):
    x, y = default_collate(batch)
    labels = [int(v.item()) for v in y]  # one conversion per sample, inside a worker
    return x, torch.tensor(labels)

third = DataLoader(SlowReads(), batch_size=4, num_workers=1, collate_fn=worker_collate)
assert sum(len(y) for _, y in third) == 64
fourth = DataLoader(SlowReads(), batch_size=16)  # the same random reads, in this process
assert sum(len(y) for _, y in fourth) == 64
print("ok")
"""


def line_of(marker: str) -> int:
    return next(i for i, line in enumerate(JOB.splitlines(), start=1) if marker in line)


def test_single_process_facts(tmp_path):
    job = script(tmp_path, JOB)
    result = run_wrapped(tmp_path / "run", job)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    assert not [line for line in result.stderr.splitlines() if not line.startswith("torchdoctor:")]
    facts = facts_of(tmp_path / "run")
    site = f"{job}:"
    train, side, third, fourth = facts["dataloaders"]
    assert train["num_workers"] == 0 and train["batch_size"] == 8 and train["dataset_len"] == 256
    assert train["collate_fn"].endswith("counting_collate") and train["call_site"] == site + str(
        line_of("LINE_TRAIN")
    )
    assert train["collate_syncs_per_batch"] == 8.0 and train["next_ms_mean"] > 0
    # Time inside collate_fn per batch: at least the 3 ms sleep, and part of the wait in __next__.
    assert 3.0 <= train["collate_ms_mean"] <= train["next_ms_mean"]
    assert "collate_ms_mean" not in side  # workers collate out of sight
    assert side["num_workers"] == 2 and side["persistent_workers"] is True and side["prefetch_factor"] == 2
    assert side["collate_fn"] == "torch.utils.data._utils.collate.default_collate"
    # Inside the workers (probe/workers.py): every batch counted, the persistent workers' last ones
    # included (written at their exit, after the training process's summary); default_collate makes
    # no host conversion; the third loader's collate makes one per sample, 4 per batch, counted
    # exactly over its first collates, and its reads (2 ms sleep x 4 samples) are timed apart.
    assert side["worker_batches"] == 16 and len(side["worker_pids"]) == 2
    assert side["worker_collate_syncs_per_batch"] == 0.0
    assert third["worker_batches"] == 16 and third["worker_collate_syncs_per_batch"] == 4.0
    assert third["worker_dataset_ms_mean"] >= 8.0 > third["worker_collate_ms_mean"] > 0
    assert third["worker_collate_cpu_ms_mean"] > 0 and "collate_syncs_per_batch" not in third
    # The third dataset draws random numbers in its workers (another worker count would hand its
    # batches other random streams); indexing a TensorDataset draws none.
    assert third["worker_random_draws"] is True and side["worker_random_draws"] is False
    # The same in the training process, for loaders without workers: indexing a TensorDataset draws
    # none, SlowReads does.
    assert train["dataset_random_draws"] is False and "dataset_random_draws" not in side
    assert fourth["dataset_random_draws"] is True and fourth["batches"] == 4
    (opt,) = facts["optimizers"]
    assert (opt["cls"], opt["foreach"], opt["num_param_tensors"]) == ("AdamW", False, 5)
    assert opt["call_site"] == site + str(line_of("LINE_OPT"))
    # HO-18's facts: torch has a fused AdamW for these CPU parameters (torch >= 2.4), and the group's
    # settings that change the update's work.
    assert opt["param_device"] == "cpu" and opt["fused_available"] is True
    assert opt["settings"] == {"weight_decay": 0.01, "amsgrad": False, "maximize": False, "differentiable": False,
                               "decoupled_weight_decay": True, "capturable": False}
    # loss.item() once per step, at its line; the collate's syncs are counted on the loader instead.
    assert 0.9 <= facts["host_syncs_per_step"] <= 1.2
    # 12 calls, 3 of them while the profiler window ran (not counted: profiling inflates them).
    assert facts["host_sync_sites"] == {site + str(line_of("LINE_SYNC")): 9}
    assert facts["backends"]["autocast_used"] is True and facts["backends"]["autocast_dtype"] == "bfloat16"
    (table,) = facts["embeddings"]
    assert (table["name"], table["num_embeddings"], table["bytes"]) == ("table", 4096, 4096 * 96 * 4)
    cpu = facts["cpu"]
    assert cpu["torch_num_threads"] == 1 and cpu["affinity"] and cpu["main_process_cpu_pct"] > 0
    assert cpu["dataloader_workers_cpu_pct"] is not None
    assert facts["env"]["OMP_NUM_THREADS"] == "1" and facts.get("device", {}) in ({}, {"kind": "cpu"})
    assert "modules_off_device" not in facts and "probe_errors" not in facts
    # The probe adds no graph, break or recompile (it installs no global module hook).
    assert facts["compile"] == {
        "used": True,
        "graph_breaks": 0,
        "recompiles": 0,
        "unique_graphs": 1,
        "compile_time_s": facts["compile"]["compile_time_s"],
        "dynamo_s": facts["compile"]["dynamo_s"],
        "backend_s": facts["compile"]["backend_s"],
        "frame_names": {"0": "forward"},
        "graph_hashes": facts["compile"]["graph_hashes"],
        "first_compile_at": facts["compile"]["first_compile_at"],
    }
    c = facts["compile"]
    assert len(c["graph_hashes"]) == 1 and len(c["graph_hashes"][0]) == 16  # the one graph, hashed
    assert abs(c["dynamo_s"] + c["backend_s"] - c["compile_time_s"]) < 0.01 and c["compile_time_s"] > 0
    assert 0 < c["compile_time_s"] < facts["train_wall_s"]
    # Peak resident memory of the process (ru_maxrss): torch alone keeps well over 50 MiB resident.
    assert 50 < facts["peak_rss_mib"] < 16_384
    assert all(s["forward_ms"] > 0 for s in facts["steps"][1:])  # roots are hooked after step 0
    # 12 steps; 5, 6 and 7 ran under the profiler and are left out of the timings.
    assert facts["step_source"] == "optimizer" and facts["profile_steps"] == [5, 8]
    assert [s["step"] for s in facts["steps"]] == [0, 1, 2, 3, 4, 8, 9, 10, 11]
    for step in facts["steps"]:
        parts = sum(
            step.get(k, 0.0)
            for k in ("dataloader_ms", "forward_ms", "backward_ms", "optimizer_ms", "other_ms")
        )
        assert abs(parts - step["total_ms"]) < 0.01 and step["samples"] == 8
    with gzip.open(tmp_path / "run" / facts["trace_file"]) as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"ProfilerStep#5", "ProfilerStep#6", "ProfilerStep#7"} <= names and "ProfilerStep#8" not in names
    (entry,) = load_run(tmp_path / "run")["ranks"]
    # Analysed inside the job (the analysis may still skip a warm-up step of the window).
    assert entry["analysis"]["window"]["steps"] and set(entry["analysis"]["window"]["steps"]) <= {5, 6, 7}


READINESS_JOB = """
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Sleepy(Dataset):
    def __init__(self, ms):
        self.s = ms / 1e3
    def __len__(self):
        return 4096
    def __getitem__(self, i):
        time.sleep(self.s)
        return torch.zeros(4), i % 2

slow = sys.argv[1] == "slow"
# fast: workers produce a batch in ~0 ms while each step computes 30 ms -> batches wait ready.
# slow: one worker needs 4 x 25 ms per batch while a step computes ~0 ms -> the step waits on it.
loader = DataLoader(Sleepy(25 if slow else 0), batch_size=4, num_workers=1 if slow else 2, prefetch_factor=2)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    if not slow:
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end:
            pass
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 19:
        break
print("ok")
"""


def test_ready_batches_are_told_apart_from_starved_ones(tmp_path):
    job = script(tmp_path, READINESS_JOB)
    for kind in ("fast", "slow"):
        result = run_wrapped(tmp_path / kind, job, kind, options=("--profile-steps", "off"))
        assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
        facts = facts_of(tmp_path / kind)
        (dl,) = facts["dataloaders"]
        steady = facts["steps"][3:]
        waited = sum(s["dataloader_ms"] for s in steady)
        unready = sum(s["dataloader_unready_ms"] for s in steady)
        assert 0 <= unready <= waited + 1e-6
        if kind == "fast":
            # Every steady batch was waiting in the queue: the wait is the handoff alone.
            assert dl["ready_share"] >= 0.8 and dl["ready_wait_ms_mean"] > 0
            assert unready <= 0.2 * waited
        else:
            # ~100 ms per batch from one worker: nearly every batch was still being produced.
            assert dl["ready_share"] <= 0.2 and waited / len(steady) >= 50
            assert unready >= 0.8 * waited


WORKERS_JOB = """
import torch
from torch.utils.data import DataLoader, TensorDataset

def collate(batch):
    import torchdoctor.probe.core as core
    quiet = core._probe is None or core._probe.main_thread == -1
    xs, ys = zip(*batch)
    labels = [int(y.item()) for y in ys]  # would run through the probe's sync hook
    return torch.stack(xs), torch.tensor([quiet] * len(labels))

if __name__ == "__main__":
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    for ctx in ("fork", "spawn"):
        dl = DataLoader(data, batch_size=8, num_workers=2, collate_fn=collate, multiprocessing_context=ctx)
        print(ctx, all(bool(q.all()) for _, q in dl))
"""


def test_dataloader_workers_keep_the_probe_quiet(tmp_path):
    # Forked workers inherit the patched Tensor.item: their probe must not act as the training loop.
    # Spawned workers unpickle the wrapped worker entry point by reference: it must still work.
    job = script(tmp_path, WORKERS_JOB)
    result = run_wrapped(tmp_path / "run", job, options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "fork True\nspawn True\n", result.stderr


SYNCS_AROUND_THE_LOOP = """
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(96, 8), torch.randint(0, 4, (96,))), batch_size=8)
x, y = next(iter(loader))  # the first training activity: the probe counts syncs from here
labels = [v.item() for v in torch.randint(0, 4, (500,))]  # set-up, one conversion per sample
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:  # 12 steps, one loss.item() each
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    loss.item()
scores = [v.item() for v in model(torch.randn(200, 8)).argmax(1)]  # evaluation after the loop
print("ok")
"""


def test_syncs_per_step_count_the_loop_not_its_set_up_or_evaluation(tmp_path):
    """pytorch/examples mnist_forward_forward converts 5,000 labels one by one before training:
    "51 host syncs per step" for a loop that makes one every 10 steps."""
    result = run_wrapped(tmp_path / "run", script(tmp_path, SYNCS_AROUND_THE_LOOP), options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    assert facts_of(tmp_path / "run")["host_syncs_per_step"] == 1.0



# An installed library's own conversions on a CPU-only machine: MONAI's decollate_batch reads its
# metadata tensors with .item() and DiceLoss builds torch.arange(...).tolist(). Those tensors stay on
# the CPU on any machine; a library's conversion of the loss (a tensor of the graph) would sync.
MEDLIB = """
import torch

def decollate(meta):
    return [t.item() for t in meta]  # metadata: CPU tensors on any machine

def dice(out, target):
    axes = torch.arange(2, out.dim()).tolist()  # a CPU tensor made from Python ints
    return 1 - (2 * (out * target).sum(axes) / (out + target).sum(axes).clamp_min(1e-6)).mean()

def log_loss(loss):
    return loss.item()  # the loss, part of the autograd graph: a sync on an accelerator
"""

LIBRARY_CONVERSIONS = """
import sys
sys.path.insert(0, SITE)
import torch
import medlib

torch.manual_seed(0)
model = torch.nn.Conv2d(1, 1, 3, padding=1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.rand(4, 1, 8, 8), (torch.rand(4, 1, 8, 8) > 0.5).float()
meta = torch.arange(6.0)
for step in range(12):
    loss = medlib.dice(torch.sigmoid(model(x)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    medlib.decollate(meta)
    medlib.log_loss(loss)
    loss.item()  # LINE_USER
print("ok")
"""


def test_a_librarys_conversions_of_cpu_tensors_are_not_syncs_on_a_cpu_only_machine(tmp_path):
    site = tmp_path / "venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    (site / "medlib.py").write_text(MEDLIB)
    job = script(tmp_path, f"SITE = {str(site)!r}\n" + LIBRARY_CONVERSIONS)
    result = run_wrapped(tmp_path / "run", job, options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    assert facts["host_syncs_per_step"] == 2.0  # the user's loss.item() and the library's, not 8 more
    lines = job.read_text().splitlines()
    user = f"{job}:{next(i for i, t in enumerate(lines, 1) if 'LINE_USER' in t)}"
    library = f"{site / 'medlib.py'}:{MEDLIB.splitlines().index('    return loss.item()  # the loss, part of the autograd graph: a sync on an accelerator') + 1}"
    assert set(facts["host_sync_sites"]) == {user, library}


# pytorch/examples mnist_forward_forward: each layer's forward() is called directly, so no module
# hook runs on the model, and the forward was silently reported as "other". A LightningModule's
# training_step calls its children, never the LightningModule: the hooks go down a level.
FORWARD_CALLED_DIRECTLY = """
import torch

class Lit(torch.nn.Module):  # a LightningModule's shape: the loop calls training_step
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    def training_step(self, x, y):
        return torch.nn.functional.cross_entropy(self.body(x), y)

torch.manual_seed(0)
if CALL == "leaf":  # a module without children, its forward() called directly: nothing to hook
    model = torch.nn.Linear(64, 8)
elif CALL == "lightning":
    model = Lit()
elif CALL == "script":  # TorchScript modules refuse forward hooks
    model = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
else:
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(512, 64), torch.randint(0, 8, (512,))
for step in range(12):
    if CALL == "lightning":
        loss = model.training_step(x, y)
    else:
        out = model.forward(x) if CALL in ("forward", "leaf") else model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("ok")
"""


@pytest.mark.parametrize("call", ["leaf", "forward", "lightning", "script", "module"])
def test_a_forward_the_hooks_cannot_see_is_said(tmp_path, call):
    from torchdoctor.session import report_from_run_dir

    job = script(tmp_path, f"CALL = {call!r}\n" + FORWARD_CALLED_DIRECTLY)
    result = run_wrapped(tmp_path / "run", job, options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    steady = [s for s in facts_of(tmp_path / "run")["steps"] if s["step"] >= 1]
    assert len(steady) == 11 and all(s.get("backward_ms", 0) > 0 for s in steady)
    remarks = [w.message for w in report_from_run_dir(str(tmp_path / "run")).warnings]
    said = [m for m in remarks if "the probe timed no forward" in m]
    if call == "leaf":
        assert all(s.get("forward_ms", 0) == 0 for s in steady)
        assert len(said) == 1 and said[0].startswith("rank 0:") and "model.forward(x)" in said[0]
    elif call == "forward":
        # Step 1 ran no hooked forward; the hooks then went down to the children that hold
        # parameters, and every later step times its forward.
        assert steady[0].get("forward_ms", 0) == 0 and all(s["forward_ms"] > 0 for s in steady[1:])
        assert not said, remarks
    elif call == "script":
        assert all(s.get("forward_ms", 0) == 0 for s in steady)
        assert len(said) == 1 and "TorchScript module" in said[0] and "model.forward(x)" not in said[0]
    elif call == "lightning":
        # The module the root wraps (its body: all of its parameters) is hooked with the root.
        assert all(s["forward_ms"] > 0 for s in steady)
        assert not said, remarks
    else:
        assert all(s["forward_ms"] > 0 for s in steady)
        assert not said, remarks


# A loop run in a threading.Thread (Ray Train runs the user's loop in one): every phase of every
# step was 0 and the report said "healthy". A second thread that steps its own copy meanwhile
# (Hogwild-style threads) must not take the role over or add steps. (It runs while the trainer is
# alive: a thread started after another ended may get its ident back, and then counts as it.)
TRAINS_IN_A_THREAD = """
import threading
import torch

first_step, helper_done = threading.Event(), threading.Event()

def train(steps, me):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(256, 64), torch.randint(0, 8, (256,))
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if me == "trainer" and step == 0:
            first_step.set()
            helper_done.wait()
    if me == "helper":
        helper_done.set()

trainer = threading.Thread(target=train, args=(12, "trainer"), name="trainer")
trainer.start()
first_step.wait()
helper = threading.Thread(target=train, args=(5, "helper"), name="helper")
helper.start()
helper.join()
trainer.join()
print("ok")
"""


def test_a_loop_on_another_thread_is_the_one_timed(tmp_path):
    result = run_wrapped(tmp_path / "run", script(tmp_path, TRAINS_IN_A_THREAD), options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    assert facts["training_thread"] == "trainer"
    steps = facts["steps"]
    assert [s["step"] for s in steps] == list(range(12))  # the helper's 5 steps are not the loop's
    steady = steps[1:]
    assert all(s["forward_ms"] > 0 and s["backward_ms"] > 0 and s["optimizer_ms"] > 0 for s in steady)


LIBRARY = """
from torch.utils.data import DataLoader

def build(dataset):  # a Trainer-like library that builds the loader itself
    return DataLoader(dataset, batch_size=8)

def prepare(loader):  # an accelerate-like library that re-creates the user's loader
    return DataLoader(loader.dataset, batch_size=loader.batch_size, num_workers=loader.num_workers)
"""

LIBRARY_JOB = """
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset
sys.path.insert(0, sys.argv[1])
import fakelib

data = TensorDataset(torch.randn(64, 4))
for (x,) in fakelib.build(data):
    pass
mine = DataLoader(data, batch_size=8)  # LINE_USER
for (x,) in fakelib.prepare(mine):
    pass
print("ok")
"""


def test_a_loader_a_library_builds_has_no_line_to_edit_and_a_rebuilt_one_keeps_the_users(tmp_path):
    site_packages = tmp_path / "venv" / "lib" / "site-packages"
    (site_packages / "fakelib").mkdir(parents=True)
    (site_packages / "fakelib" / "__init__.py").write_text(LIBRARY)
    job = script(tmp_path, LIBRARY_JOB)
    result = run_wrapped(tmp_path / "run", job, str(site_packages))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    built, rebuilt = facts_of(tmp_path / "run")["dataloaders"]
    assert built["created_by"] == "fakelib" and "call_site" not in built
    assert built["batches"] == rebuilt["batches"] == 8  # 64 samples in batches of 8, each loader once
    assert built["library_site"] == f"{site_packages / 'fakelib' / '__init__.py'}:5"
    # The library function the job called, the job's line that called it, and its parameters.
    build_line = next(i for i, t in enumerate(LIBRARY_JOB.splitlines(), start=1) if "fakelib.build(" in t)
    assert (built["library_call"], built["library_caller"]) == ("build", f"{job}:{build_line}")
    assert built["library_call_params"] == ["dataset"]
    line = next(i for i, t in enumerate(LIBRARY_JOB.splitlines(), start=1) if "LINE_USER" in t)
    assert rebuilt["created_by"] == "fakelib" and rebuilt["call_site"] == f"{job}:{line}"


WRAPPING_LIBRARY = """
import torch

class PrivateOptimizer(torch.optim.Optimizer):  # Opacus' DPOptimizer: wraps one, defaults to False
    def __init__(self, inner):
        self.inner = inner
        super().__init__(inner.param_groups, {})

    def zero_grad(self, set_to_none: bool = False):
        self.inner.zero_grad(set_to_none)

    def step(self, closure=None):
        return self.inner.step(closure)
"""

ZERO_GRAD_JOB = """
import sys
import torch
sys.path.insert(0, sys.argv[1])
import wraplib

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
plain = torch.nn.Linear(4, 1)
wrapped = wraplib.PrivateOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
mine = torch.optim.Adam(plain.parameters(), lr=0.1)
for _ in range(4):
    wrapped.zero_grad()  # LINE_WRAPPED
    mine.zero_grad(set_to_none=False)  # LINE_MINE
    mine.zero_grad()
    (model(torch.randn(8, 4)).sum() + plain(torch.randn(8, 4)).sum()).backward()
    wrapped.step()
    mine.step()
print("ok")
"""


def test_who_asks_zero_grad_to_fill_gradients_with_zeros(tmp_path):
    """HO-10's advice: a library wrapping the optimizer passes set_to_none=False (Opacus), or the
    user's own line does; a call with torch's default is none of them."""
    site_packages = tmp_path / "venv" / "lib" / "site-packages"
    site_packages.mkdir(parents=True)
    (site_packages / "wraplib.py").write_text(WRAPPING_LIBRARY)
    job = script(tmp_path, ZERO_GRAD_JOB)
    result = run_wrapped(tmp_path / "run", job, str(site_packages), options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    line = {tag: next(i for i, t in enumerate(ZERO_GRAD_JOB.splitlines(), start=1) if tag in t)
            for tag in ("LINE_WRAPPED", "LINE_MINE")}
    lib_line = next(i for i, t in enumerate(WRAPPING_LIBRARY.splitlines(), start=1) if "self.inner.zero_grad" in t)
    assert facts_of(tmp_path / "run")["zero_grad_fills"] == [
        {"optimizer": "SGD", "called_by": "wraplib", "library_site": f"{site_packages / 'wraplib.py'}:{lib_line}",
         "caller": f"{job}:{line['LINE_WRAPPED']}", "entry": "PrivateOptimizer.zero_grad"},
        {"optimizer": "Adam", "call_site": f"{job}:{line['LINE_MINE']}"},
    ]


FASTAI_OPTIMIZER = """
class Optimizer:  # fastai.optimizer.Optimizer, reduced: its own step over lists of parameters
    def __init__(self, params, lr):
        self.param_lists, self.lr = [list(params)], lr

    def step(self, closure=None):
        for group in self.param_lists:
            for p in group:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-self.lr)

    def zero_grad(self):
        for group in self.param_lists:
            for p in group:
                p.grad = None
"""

FASTAI_JOB = """
import sys
import time
import torch
sys.path.insert(0, sys.argv[1])
from fastai.optimizer import Optimizer

model = torch.nn.Linear(64, 8)
opt = Optimizer(model.parameters(), lr=0.01)
for _ in range(12):
    model(torch.randn(32, 64)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.002)
print("ok")
"""


def test_fastai_s_own_optimizer_ends_the_steps(tmp_path):
    """fastai's Optimizer is no torch.optim optimizer: torch's step hooks never saw it, the steps ended at
    backward and its time was the loop's own (the 'Is it a cat?' quick start: optimizer 0.0 ms)."""
    site_packages = tmp_path / "venv" / "lib" / "site-packages"
    (site_packages / "fastai").mkdir(parents=True)
    (site_packages / "fastai" / "__init__.py").write_text("")
    (site_packages / "fastai" / "optimizer.py").write_text(FASTAI_OPTIMIZER)
    result = run_wrapped(tmp_path / "run", script(tmp_path, FASTAI_JOB), str(site_packages))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    window = range(*facts["profile_steps"])
    assert facts["step_source"] == "optimizer"
    assert [s["step"] for s in facts["steps"]] == [i for i in range(12) if i not in window]
    assert all(s["optimizer_ms"] > 0 for s in facts["steps"][1:])
    (opt,) = facts["optimizers"]
    assert opt["cls"] == "Optimizer" and opt["num_params"] == 64 * 8 + 8 and opt["num_param_tensors"] == 2
    assert "env_libraries" not in facts  # no environment library imported
    # The profiler's window carries the annotation torch.optim writes around its steps.
    with gzip.open(tmp_path / "run" / facts["trace_file"], "rt") as f:
        names = [e.get("name") for e in json.load(f)["traceEvents"]]
    assert names.count("Optimizer.step#Optimizer.step") == len(window)


KERAS_OPTIMIZER = """
class BaseOptimizer:  # keras.src.optimizers.base_optimizer.BaseOptimizer, reduced: apply(grads, variables)
    def __init__(self, learning_rate=0.01):
        self.learning_rate = learning_rate

    def apply(self, grads, trainable_variables=None):
        for g, v in zip(grads, trainable_variables):
            v.sub_(g, alpha=self.learning_rate)


class LossScaleOptimizer(BaseOptimizer):  # Keras's mixed-precision wrapper: its apply calls the inner one's
    def __init__(self, inner):
        self.inner = inner

    def apply(self, grads, trainable_variables=None):
        return self.inner.apply([g * 1.0 for g in grads], trainable_variables)
"""

KERAS_JOB = """
import sys
import time
import torch
sys.path.insert(0, sys.argv[1])
from keras.src.optimizers.base_optimizer import BaseOptimizer, LossScaleOptimizer

model = torch.nn.Linear(64, 8)
opt = LossScaleOptimizer(BaseOptimizer())
for _ in range(12):  # Keras's TorchTrainer.train_step: backward, then the optimizer's apply
    model(torch.randn(32, 64)).square().mean().backward()
    params = list(model.parameters())
    with torch.no_grad():
        opt.apply([p.grad for p in params], params)
    for p in params:
        p.grad = None
    time.sleep(0.002)
print("ok")
"""


def test_keras_s_own_optimizer_ends_the_steps_once(tmp_path):
    """Keras 3 on the torch backend updates the weights with its own optimizer's apply() after
    loss.backward(): steps ended at backward and Adam's time was the loop's own (keras.io's MNIST
    convnet: optimizer 0.0 ms, 13 ms of 'other' a step). A LossScaleOptimizer's apply, which calls the
    inner one's, is one step, the inner optimizer's."""
    site_packages = tmp_path / "venv" / "lib" / "site-packages"
    package = site_packages / "keras" / "src" / "optimizers"
    backend = site_packages / "keras" / "src" / "backend"
    package.mkdir(parents=True)
    backend.mkdir()
    for folder in (site_packages / "keras", site_packages / "keras" / "src", package):
        (folder / "__init__.py").write_text("")
    (backend / "__init__.py").write_text("from keras.src.backend import config\n")
    (backend / "config.py").write_text("import os\n\ndef backend():\n    return os.environ['KERAS_BACKEND']\n")
    (package / "base_optimizer.py").write_text("import keras.src.backend\n" + KERAS_OPTIMIZER)
    job = script(tmp_path, KERAS_JOB)
    result = run_wrapped(tmp_path / "run", job, str(site_packages), KERAS_BACKEND="torch")
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    window = range(*facts["profile_steps"])
    assert facts["step_source"] == "optimizer" and facts["last_step"] == 11
    assert [s["step"] for s in facts["steps"]] == [i for i in range(12) if i not in window]
    assert all(s["optimizer_ms"] > 0 for s in facts["steps"][1:])
    # Keras names its optimizers as torch.optim does ("Adam"): torch.optim's advice is not theirs.
    assert [o["cls"] for o in facts["optimizers"]] == ["keras.BaseOptimizer"]
    with gzip.open(tmp_path / "run" / facts["trace_file"], "rt") as f:
        names = [e.get("name") for e in json.load(f)["traceEvents"]]
    assert names.count("Optimizer.step#keras.BaseOptimizer.step") == len(window)
    # On another backend, Keras's apply runs while a graph is traced, not once a step: left alone.
    result = run_wrapped(tmp_path / "jax", job, str(site_packages), KERAS_BACKEND="jax")
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    assert facts_of(tmp_path / "jax")["step_source"] == "backward"


FASTAI_LOAD = """
import itertools
from torch.utils.data import get_worker_info
from torch.utils.data._utils.fetch import _IterableDatasetFetcher
from torch.utils.data.dataloader import _DatasetKind, _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

_loaders = (_MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter)


class _FakeLoader:  # fastai.data.load._FakeLoader, as fastai 2.8 writes it
    def _fn_noops(self, x=None, *args, **kwargs): return x
    _IterableDataset_len_called, _auto_collation, collate_fn, drop_last, in_order = None, False, _fn_noops, False, True
    _index_sampler, generator, prefetch_factor = itertools.count(), None, 2
    dataset_kind = _dataset_kind = _DatasetKind.Iterable

    def __init__(self, d, pin_memory, num_workers, timeout, persistent_workers, pin_memory_device):
        self.dataset, self.default, self.worker_init_fn, self.pin_memory_device = self, d, None, pin_memory_device
        self.d, self.pin_memory, self.num_workers, self.timeout = d, pin_memory, num_workers, timeout
        self.persistent_workers = persistent_workers

    def _get_shared_seed(self): return 0

    def __iter__(self): return iter(self.d.create_batches())

    @property
    def multiprocessing_context(self): return None


class DataLoader:  # fastai's DataLoader: a new torch iterator over its _FakeLoader every epoch
    def __init__(self, dataset, bs=8, num_workers=0, persistent_workers=False):
        self.dataset, self.bs = dataset, bs
        self.fake_l = _FakeLoader(self, False, num_workers, 0, persistent_workers, "")

    def __len__(self): return len(self.dataset) // self.bs

    def create_batches(self):
        info = get_worker_info()  # fastai's _wif gives each worker its share
        for i in range(len(self)):
            if info is None or i % info.num_workers == info.id:
                yield self.dataset[i * self.bs:(i + 1) * self.bs]

    def __iter__(self):
        yield from _loaders[self.fake_l.num_workers == 0](self.fake_l)
"""

FASTAI_LOADER_JOB = """
import sys
import time
import torch
sys.path.insert(0, sys.argv[1])
from fastai.data.load import DataLoader
import gymnasium  # an environment library imported (a stand-in): the advice may speak of environments

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(torch.randn(64, 4), bs=8, num_workers=int(sys.argv[2]), persistent_workers=True)  # LINE_LOADER
for epoch in range(3):
    for x in loader:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.001)
print("ok")
"""


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fastai_loader_s_epochs_are_marked_where_torch_s_iterator_starts(tmp_path, workers):
    """fastai hands its _FakeLoader to torch's iterator itself, every epoch: DataLoader.__iter__ never ran,
    so its refill at each epoch start read as 'the loader cannot keep up on average'."""
    site_packages = tmp_path / "venv" / "lib" / "site-packages"
    (site_packages / "fastai" / "data").mkdir(parents=True)
    for init in ("fastai/__init__.py", "fastai/data/__init__.py"):
        (site_packages / init).write_text("")
    (site_packages / "fastai" / "data" / "load.py").write_text(FASTAI_LOAD)
    (site_packages / "gymnasium.py").write_text("")
    job = script(tmp_path, FASTAI_LOADER_JOB)
    result = run_wrapped(tmp_path / "run", job, str(site_packages), str(workers), options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    assert [s["step"] for s in facts["steps"] if s.get("epoch_starts")] == [0, 8, 16]
    (d,) = facts["dataloaders"]
    line = next(i for i, t in enumerate(FASTAI_LOADER_JOB.splitlines(), start=1) if "LINE_LOADER" in t)
    assert d["call_site"] == f"{job}:{line}"  # fastai's own class, built on the job's line
    assert (d["batch_size"], d["dataset_len"], d["batches_per_epoch"], d["batches"]) == (8, 64, 8, 24)
    # It asked for persistent workers, but fastai starts new ones every epoch: unknown, not True.
    assert "persistent_workers" not in d and "prefetch_factor" not in d and d["num_workers"] == workers
    assert facts["env_libraries"] == ["gymnasium"]
    if workers:  # timed when the workers have started: each epoch's two, and their own per-batch counters
        assert len(d["worker_pids"]) == 3 * workers and d["worker_batches"] == 24
        assert all(s["loader_iter_ms"] > 0 for s in facts["steps"] if s.get("epoch_starts"))


# Three epochs of 8 steps over `loader`, then "ok": the loop the loader jobs below share.
THREE_EPOCHS = """
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    for x in loader:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
print("ok")
"""

STATEFUL_JOB = """
import sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "torch first":
    import torch
from torchdata.stateful_dataloader import StatefulDataLoader
import torch

loader = StatefulDataLoader(torch.randn(64, 4), batch_size=8, num_workers=2)  # LINE_LOADER
""" + THREE_EPOCHS


@pytest.mark.parametrize("order", ["torch first", "torchdata first"])
def test_torchdata_s_stateful_loader_is_recorded(tmp_path, order):
    """torchdata's StatefulDataLoader (torchtitan's) never calls DataLoader.__init__ and has its own
    __iter__: the probe recorded no loader, no epoch start and no worker. Imported before torch, its
    module is the one that imports torch, so it is half-built when the probe's torch hooks go in (the
    class was not there yet: nothing was recorded either)."""
    import stateful_loader

    site_packages = tmp_path / "venv" / "lib" / "site-packages"
    stateful_loader.install(site_packages)
    job = script(tmp_path, STATEFUL_JOB)
    result = run_wrapped(tmp_path / "run", job, str(site_packages), order, options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    assert [s["step"] for s in facts["steps"] if s.get("epoch_starts")] == [0, 8, 16]
    (d,) = facts["dataloaders"]
    line = next(i for i, t in enumerate(STATEFUL_JOB.splitlines(), start=1) if "LINE_LOADER" in t)
    assert d["call_site"] == f"{job}:{line}" and d["persistent_workers"] is False
    assert (d["num_workers"], d["batches"], len(d["worker_pids"])) == (2, 24, 6)
    # Its workers run torchdata's own loop: their counters too (they were missing: no random-draw check).
    assert d["worker_batches"] == 24 and d["worker_random_draws"] is False


WRAPPED_JOB = """
import sys
import torch
from torch.utils.data import DataLoader


class Wrapped:  # DGL's _PrefetchingIter / PyG's DataLoaderIterator: an iterator around torch's
    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.it)


class WrapsIter(DataLoader):  # DGL's DataLoader.__iter__
    def __iter__(self):
        return Wrapped(super().__iter__())


class WrapsGetIterator(DataLoader):  # PyG's NodeLoader._get_iterator
    def _get_iterator(self):
        return Wrapped(super()._get_iterator())


class _Repeat:  # ultralytics' _RepeatSampler
    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


class Infinite(DataLoader):  # ultralytics' InfiniteDataLoader: one iterator, from _get_iterator, for every epoch
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "batch_sampler", _Repeat(self.batch_sampler))
        self.iterator = None

    def __len__(self):
        return len(self.batch_sampler.sampler)

    def __iter__(self):
        if self.iterator is None:
            self.iterator = self._get_iterator()
        for _ in range(len(self)):
            yield next(self.iterator)


cls = {"iter": WrapsIter, "get_iterator": WrapsGetIterator, "repeat": Infinite}[sys.argv[1]]
loader = cls(torch.randn(64, 4), batch_size=8, num_workers=1)
""" + THREE_EPOCHS


@pytest.mark.parametrize("kind", ["iter", "get_iterator"])
def test_a_loader_that_wraps_torch_s_iterator_is_recorded_once(tmp_path, kind):
    """DGL's DataLoader returns a prefetching iterator around DataLoader.__iter__'s, PyG's NodeLoader one
    around _get_iterator's: 6fd30df recorded neither (no loader, no epoch start); each is recorded once."""
    job = script(tmp_path, WRAPPED_JOB)
    result = run_wrapped(tmp_path / "run", job, kind, options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    assert [s["step"] for s in facts["steps"] if s.get("epoch_starts")] == [0, 8, 16]
    (d,) = facts["dataloaders"]
    assert (d["num_workers"], d["batches"], len(d["worker_pids"])) == (1, 24, 3)


def test_a_loader_that_keeps_one_iterator_for_every_epoch_is_recorded(tmp_path):
    """ultralytics' InfiniteDataLoader builds its one iterator with _get_iterator() inside a generator
    __iter__ and repeats its sampler: DataLoader.__iter__ never runs, so the loader, its worker and the
    start of its one epoch went unrecorded, and the iterator's seed read counted as the job's sync."""
    job = script(tmp_path, WRAPPED_JOB)
    result = run_wrapped(tmp_path / "run", job, "repeat", options=("--profile-steps", "off"))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    facts = facts_of(tmp_path / "run")
    assert [s["step"] for s in facts["steps"] if s.get("epoch_starts")] == [0]
    (d,) = facts["dataloaders"]
    assert (d["num_workers"], d["batches"], len(d["worker_pids"])) == (1, 24, 1)
    assert facts["host_syncs_per_step"] == 0


CHILD_PROCESS_JOB = """
import multiprocessing as mp
import subprocess
import sys
import time
import torch


def augment(stop):  # stands for nnU-Net's batchgenerators augmenter: a process of the job's own
    while not stop.is_set():
        sum(i * i for i in range(10_000))


if __name__ == "__main__":
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(32, 16)).square().mean().backward()
    opt.step()  # the first training activity: the child below starts after it
    if sys.argv[1] == "reaped":  # joined before the job ends: its time is in RUSAGE_CHILDREN
        stop = mp.get_context("fork").Event()
        child = mp.get_context("fork").Process(target=augment, args=(stop,))
        child.start()
    else:  # never waited for: alive when the job ends, read from /proc
        spin = "import time\\nt = time.time()\\nwhile time.time() - t < 3.5: pass"
        subprocess.Popen([sys.executable, "-c", spin])
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.5:
        loss = model(torch.randn(32, 16)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.01)
    if sys.argv[1] == "reaped":
        stop.set()
        child.join()
    print("ok")
"""


def test_the_jobs_own_child_processes_are_counted_as_the_jobs(tmp_path):
    """nnU-Net's augmenter processes are no DataLoader workers: their CPU time read as "other
    processes (steal included)" in HO-14. A child process of the job's own is counted as the job's
    (child_processes_cpu_pct), and the probe's own child (the trace's post-processing) is not."""
    job = script(tmp_path, CHILD_PROCESS_JOB, "augment.py")
    for how in ("reaped", "alive"):
        result = run_wrapped(tmp_path / how, job, how, options=("--profile-steps", "off"))
        assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
        cpu = facts_of(tmp_path / how)["cpu"]
        # The child spins for the whole run beside a loop that mostly sleeps: most of a core.
        assert cpu["child_processes_cpu_pct"] > 25 and "dataloader_workers_cpu_pct" not in cpu, (how, cpu)
    # A job without children of its own, with a profiler window: the post-processing child is the probe's.
    plain = script(tmp_path, TRAIN, "train.py")
    result = run_wrapped(tmp_path / "plain", plain, "12")
    assert result.returncode == 0, result.stderr
    facts = facts_of(tmp_path / "plain")
    assert facts["profile_steps"] == [5, 8] and "child_processes_cpu_pct" not in facts["cpu"], facts["cpu"]
