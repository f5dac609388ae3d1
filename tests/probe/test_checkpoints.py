"""Checkpoint saves the training loop blocks on, timed live (torch.save and DCP), and DI-15."""

from __future__ import annotations

import json

import pytest

from probe.livejob import facts_of, run_plain, run_wrapped, script

JOB = """
import os, sys, tempfile
import torch

if sys.argv[1] == "safetensors":  # as transformers' modeling_utils, at import: the name is bound then
    from safetensors.torch import save_file as safe_save_file

torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])  # 8 MB of weights
opt = torch.optim.SGD(model.parameters(), lr=0.01)
out = tempfile.mkdtemp()
x = torch.randn(32, 512)


def save_on_master(*args, **kwargs):  # as torchvision's references/classification/utils.py
    torch.save(*args, **kwargs)  # HELPER


for step in range(24):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 4 == 3:  # every 4 steps, from the training loop
        if sys.argv[1] == "dcp":
            import torch.distributed.checkpoint as dcp
            dcp.save({"model": model.state_dict()}, checkpoint_id=os.path.join(out, f"step{step}"))
        elif sys.argv[1] == "safetensors":
            safe_save_file(model.state_dict(), os.path.join(out, f"step{step}.safetensors"), metadata={"format": "pt"})
        elif sys.argv[1] == "helper":
            save_on_master(model.state_dict(), os.path.join(out, f"step{step}.pt"))  # CALL
        else:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(out, f"step{step}.pt"))  # SAVE
print("ok")
"""


def saves(run_dir):
    steps = facts_of(run_dir)["steps"]
    return {s["step"]: (s.get("checkpoint_saves", 0), s.get("checkpoint_ms", 0.0)) for s in steps}


def saved_every_4_steps(tmp_path, how, first=False):
    """Run JOB saving ``how``, unprofiled; check one timed save on each saving step (a save after step
    k's optimizer step lands in the interval that ends at step k + 1's) and none elsewhere; return
    (job path, run directory, per-step saves, the report)."""
    before = "from safetensors.torch import save_file as safe_save_file  # before torch, as isort orders it\n"
    job = script(tmp_path, before + JOB if first else JOB)
    run_dir = tmp_path / "run"
    result = run_wrapped(run_dir, job, how, options=("--profile-steps", "off", "--json", str(tmp_path / "r.json")))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    got = saves(run_dir)
    with_saves = sorted(k for k, (n, _) in got.items() if n)
    assert len(with_saves) >= 5 and all(got[k][0] == 1 and got[k][1] > 0 for k in with_saves), got
    assert all(n == 0 and ms == 0.0 for k, (n, ms) in got.items() if k not in with_saves)
    return job, run_dir, got, json.loads((tmp_path / "r.json").read_text())


def test_torch_save_in_the_loop_is_timed_on_its_steps_and_priced_per_step(tmp_path):
    job, run_dir, got, report = saved_every_4_steps(tmp_path, "torch")
    di15 = next(f for f in report["findings"] if f["id"] == "DI-15")
    total = sum(ms for _, ms in got.values())
    assert abs(di15["recoverable_ms"] - total / len(got)) < 0.01 and "one every 4 steps" in di15["title"]
    assert "Thread(target=torch.save" in di15["fix"]["snippet"]
    # The fix names the job's own torch.save line.
    line = next(i for i, t in enumerate(JOB.splitlines(), start=1) if "# SAVE" in t)
    assert facts_of(run_dir)["checkpoint_site"] == f"{job}:{line}"
    assert f"(the save at {job}:{line})" in di15["fix"]["text"]


@pytest.mark.parametrize("first", [False, True], ids=["torch first", "safetensors first"])
def test_a_safetensors_save_is_a_checkpoint_save(tmp_path, first):
    """Hugging Face's save_pretrained writes the weights with safetensors' save_file, a name bound
    by `from safetensors.torch import save_file` when the library is imported: timed as a save.
    Imported before torch (isort's order), safetensors.torch is still running when torch's import
    sets the probe up: its save_file is wrapped once the module's body has run."""
    _, _, _, report = saved_every_4_steps(tmp_path, "safetensors", first=first)
    di15 = next(f for f in report["findings"] if f["id"] == "DI-15")
    assert "one every 4 steps" in di15["title"], di15["title"]


def test_a_save_in_the_jobs_own_helper_names_the_helper_and_its_caller(tmp_path):
    job = script(tmp_path, JOB)
    run_dir = tmp_path / "run"
    result = run_wrapped(run_dir, job, "helper", options=("--profile-steps", "off",))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    lines = JOB.splitlines()
    helper = next(i for i, t in enumerate(lines, start=1) if "# HELPER" in t)
    call = next(i for i, t in enumerate(lines, start=1) if "# CALL" in t)
    assert facts_of(run_dir)["checkpoint_site"] == f"{job}:{helper} (save_on_master), from {job}:{call}"


def test_a_dcp_save_is_one_save_not_the_torch_saves_inside_it(tmp_path):
    job = script(tmp_path, JOB)
    run_dir = tmp_path / "run"
    result = run_wrapped(run_dir, job, "dcp", options=("--profile-steps", "off",))
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr
    got = saves(run_dir)
    counts = [n for n, _ in got.values() if n]
    assert len(counts) >= 5 and set(counts) == {1}, got


WHOLE_MODEL = """
import copy, io, os, pickle, sys, tempfile
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(16, 64)
path = os.path.join(tempfile.mkdtemp(), "model.pt")
for step in range(12):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step in (4, 11):  # the whole model, as pytorch/examples' word_language_model saves it
        torch.save(model, path)
ema = copy.deepcopy(model)  # made after the probe hooked the model: it carries stand-ins of its hooks
torch.save({"ema": ema, "step": 12}, path + ".ema")
loaded = torch.load(path, weights_only=False)
ema_loaded = torch.load(path + ".ema", weights_only=False)["ema"]
# The saved copy carries no hook; the job's copy keeps what it had (the stand-in) after the save.
assert torch.equal(ema_loaded(x), model(x)) and not ema_loaded._forward_hooks and len(ema._forward_hooks) == 1
scripted = torch.jit.script(model)
buf = io.BytesIO()
torch.jit.save(scripted, buf)
assert torch.equal(loaded(x), model(x)) and torch.equal(scripted(x), model(x))
def shift(a: int) -> int:
    return a + 3


@torch.jit.script
class Shifted:  # TorchScript resolves `shift` in the caller's frame: the wrapper must not hide it
    def __init__(self, a: int):
        self.a = shift(a)


assert Shifted(1).a == 4
hooks = (len(loaded._forward_hooks), len(loaded._forward_pre_hooks), len(model._forward_hooks))
with open(sys.argv[1], "wb") as f:  # raw pickle: the hooks go along, as harmless stand-ins
    pickle.dump(model, f)
print("ok", hooks)
"""

LOAD_ELSEWHERE = """
import pickle, sys, torch
model = pickle.load(open(sys.argv[1], "rb"))
print(tuple(model(torch.randn(3, 64)).shape), len(model._forward_hooks), "torchdoctor" in sys.modules)
"""


def test_saving_or_scripting_the_whole_model_is_not_broken_by_the_probe_hooks(tmp_path):
    # The probe times the model's forward with hooks on the root module; they are closures, so a
    # model pickled with them (torch.save(model)) could not be saved, and torch.jit.script would try
    # to compile them. Both run with the hooks taken off; the job's own model keeps them after.
    job = script(tmp_path, WHOLE_MODEL)
    pickled = tmp_path / "model.pkl"
    result = run_wrapped(tmp_path / "run", job, str(pickled), options=("--profile-steps", "off"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok (0, 0, 1)\n", result.stdout
    # A raw pickle of the hooked model loads in a process without torchdoctor and runs: its hooks
    # come back as no-ops of the standard library.
    loader = script(tmp_path, LOAD_ELSEWHERE, "load.py")
    plain = run_plain(loader, str(pickled))
    assert plain.returncode == 0 and plain.stdout == "(3, 1) 1 False\n", plain.stderr
    got = saves(tmp_path / "run")
    assert sum(n for n, _ in got.values()) == 1  # step 4's save; step 11's is after the last step's end
    # The job's environment, as HW-16 reads it: torchao's version from its metadata ("" = not installed).
    from torchdoctor.probe.collect import package_version
    assert facts_of(tmp_path / "run").get("torchao_version") == package_version("torchao")


RESUMING = """
import os, sys
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
ckpt = os.path.join(sys.argv[1], "ckpt.pt")
if os.path.exists(ckpt):  # resume, as pytorch/examples' FSDP2 example does (DCP's optimizer state dict)
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    set_optimizer_state_dict(model, opt, state["optim"])  # runs opt.step() at lr 0 to create the state
x = torch.randn(16, 64)
for step in range(8):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 3 and os.path.exists(ckpt):
        torch.load(ckpt)  # after step 0: no resume
torch.save({"model": model.state_dict(), "optim": get_optimizer_state_dict(model, opt)}, ckpt)
import pickle  # Pool.map(torch.load, files) pickles the function: the probe's shims must pickle as torch's
assert pickle.loads(pickle.dumps(torch.load)) is torch.load and pickle.loads(pickle.dumps(torch.save)) is torch.save
print("ok")
"""


def test_a_resumed_checkpoint_is_noted_and_dcps_optimizer_init_is_no_step(tmp_path):
    job = script(tmp_path, RESUMING)
    ckpt = tmp_path / "ckpt.pt"
    first = run_wrapped(tmp_path / "first", job, str(tmp_path), options=("--profile-steps", "off"))
    assert first.returncode == 0 and first.stdout == "ok\n", first.stderr
    written = ckpt.stat().st_mtime
    second = run_wrapped(tmp_path / "second", job, str(tmp_path), options=("--profile-steps", "off"))
    assert second.returncode == 0 and second.stdout == "ok\n", second.stderr
    fresh, resumed = facts_of(tmp_path / "first"), facts_of(tmp_path / "second")
    assert "loaded_files" not in fresh
    assert fresh["checkpoint_dirs"] == resumed["checkpoint_dirs"] == [str(tmp_path)]
    # The file loaded before step 0 ended, with the time the first run wrote it; not the load at step 3.
    assert resumed["loaded_files"] == [[str(ckpt), written]]
    # set_optimizer_state_dict's zero-lr step() is no training step: both runs count the job's 8.
    assert len(fresh["steps"]) == len(resumed["steps"]) == 8
    assert not resumed.get("probe_errors")
