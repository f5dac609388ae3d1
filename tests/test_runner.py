"""`torchdoctor run`: the job behaves exactly as without the wrapper; the run directory records it."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from probe.livejob import (
    PY,
    facts_of,
    job_stderr,
    load_run,
    run,
    run_plain,
    run_wrapped,
    script,
    signalled_run,
    wrapper_cmd,
)
from torchdoctor.probe.config import parse_steps
from torchdoctor.runner import BOOTSTRAP_DIR, job_env

# Trains a few steps (so the probe has something to flush), then blocks until a signal arrives.
BLOCKING = """
import time
import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_the_wrapper_reaches_the_job(tmp_path, sig):
    job = script(tmp_path, BLOCKING)
    plain = signalled_run([PY, str(job)], sig)
    wrapped = signalled_run(wrapper_cmd(tmp_path / "run", [PY, str(job)]), sig)
    assert plain.returncode == wrapped.returncode == -sig
    assert wrapped.stdout == plain.stdout
    assert job_stderr(wrapped.stderr) == plain.stderr  # SIGINT: the same KeyboardInterrupt traceback
    manifest = load_run(tmp_path / "run")
    assert manifest["exit_code"] == -sig and manifest["signal"] == signal.Signals(sig).name
    # The wrapper reports what it saw: the probe flushed a summary after the first steps.
    assert facts_of(tmp_path / "run")["steps"]


# Says whether it was started with the signal (argv[1]) ignored, then outlives it.
IGNORING = """
import signal
import sys
import time

sig = signal.Signals[sys.argv[1]]
print("ready", flush=True)
time.sleep(1.5)
print(sig.name, "ignored:", signal.getsignal(sig) == signal.SIG_IGN)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP])
def test_a_signal_ignored_by_the_caller_stays_ignored_by_the_job(tmp_path, sig):
    # `nohup torchdoctor run ...` (SIGHUP) or `torchdoctor run ... &` in a script (SIGINT): the job
    # must inherit the ignore as it does without the wrapper, not die of a signal it would ignore.
    job = script(tmp_path, IGNORING)
    cmd = [PY, str(job), sig.name]
    plain = signalled_run(cmd, sig, ignored=(sig,))
    wrapped = signalled_run(wrapper_cmd(tmp_path / "run", cmd), sig, ignored=(sig,))
    assert plain.returncode == wrapped.returncode == 0
    assert wrapped.stdout == plain.stdout == f"ready\n{sig.name} ignored: True\n"
    assert load_run(tmp_path / "run")["exit_code"] == 0


def test_job_without_torch_is_untouched(tmp_path):
    job = script(
        tmp_path,
        "import sys\nprint('torch' in sys.modules, sys.path[0] == __import__('os').path.dirname(__file__))\n",
    )
    plain = run_plain(job)
    wrapped = run_wrapped(tmp_path / "run", job)
    assert plain.returncode == wrapped.returncode == 0
    assert wrapped.stdout == plain.stdout == "False True\n"  # the probe never imports torch itself
    assert load_run(tmp_path / "run")["ranks"] == []
    assert "no rank wrote a summary" in wrapped.stderr


def test_bad_invocations(tmp_path):
    missing = run([PY, "-m", "torchdoctor.runner", "--out", str(tmp_path / "r"), "--", "no-such-command-td"])
    assert missing.returncode == 127 and "cannot run" in missing.stderr
    assert run([PY, "-m", "torchdoctor.runner"]).returncode == 2
    bad = run([PY, "-m", "torchdoctor.runner", "--profile-steps", "0:3", "--", sys.executable, "-c", "pass"])
    assert bad.returncode == 2 and "1 <= A < B" in bad.stderr


def test_profile_steps_parsing():
    assert parse_steps("5:8") == (5, 8)
    assert parse_steps("off") is None and parse_steps("") is None
    assert parse_steps(None) == (5, 8)
    for bad in ("8:5", "0:2", "x", "3"):
        with pytest.raises(ValueError):
            parse_steps(bad)


def test_job_env_puts_the_bootstrap_first_once(tmp_path):
    base = {"PYTHONPATH": f"/a{os.pathsep}{BOOTSTRAP_DIR}"}
    env = job_env(str(tmp_path), (2, 4), base=base)
    assert env["PYTHONPATH"].split(os.pathsep) == [BOOTSTRAP_DIR, "/a"]
    assert env["TORCHDOCTOR_PROFILE_STEPS"] == "2:4" and env["TORCHDOCTOR_RUN_DIR"] == str(tmp_path)
    assert job_env(str(tmp_path), None, base={})["TORCHDOCTOR_PROFILE_STEPS"] == "off"
