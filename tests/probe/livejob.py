"""Helpers to run real Python/torch jobs with and without ``torchdoctor run`` and compare them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

PY = sys.executable
TIMEOUT = 180

# A small deterministic training job; argv: steps [exit_code].
TRAIN = """
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 12
data = TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
loader = DataLoader(data, batch_size=16, shuffle=False)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
done = 0
while done < steps:
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        done += 1
        if done >= steps:
            break
print(f"trained {done} steps, loss {loss.item():.4f}")
print("some job diagnostics", file=sys.stderr)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""


def script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def env(**extra: str) -> dict[str, str]:
    out = dict(os.environ)
    out.setdefault("OMP_NUM_THREADS", "1")
    for key in [k for k in out if k.startswith("TORCHDOCTOR_")]:
        del out[key]
    out.update(extra)
    return out


def wrapper_cmd(run_dir: Path, command: list[str], *options: str) -> list[str]:
    return [PY, "-m", "torchdoctor.runner", "--quiet", "--out", str(run_dir), *options, "--", *command]


def run(cmd: list[str], **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env(**extra_env), capture_output=True, text=True, timeout=TIMEOUT)


def run_plain(path: Path, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return run([PY, str(path), *args], **extra_env)


def run_wrapped(run_dir: Path, path: Path, *args: str, options: tuple[str, ...] = (), **extra_env: str):
    return run(wrapper_cmd(run_dir, [PY, str(path), *args], *options), **extra_env)


def probed_job(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], list[dict[str, Any]]]:
    """Run ``body`` as a job under the probe, profiler off: (the run, rank 0's facts, the findings)."""
    job, report = script(tmp_path, body), tmp_path / "r.json"
    result = run_wrapped(tmp_path / "run", job, options=("--profile-steps", "off", "--json", str(report)))
    assert result.returncode == 0, result.stderr
    return result, facts_of(tmp_path / "run"), json.loads(report.read_text())["findings"]


def job_stderr(text: str) -> str:
    """The job's own stderr: the wrapper's and the probe's lines all start with "torchdoctor:"."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("torchdoctor:"))


def load_run(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def facts_of(run_dir: Path, rank: int = 0) -> dict[str, Any]:
    for entry in load_run(run_dir)["ranks"]:
        if entry["facts"].get("rank", 0) == rank:
            return entry["facts"]
    raise AssertionError(f"no rank {rank} in {run_dir}")


def _dispositions(ignored: tuple[int, ...]):
    """A child's signal dispositions, set before exec: ``ignored`` ignored, every other signal the
    wrapper forwards at its default. Independent of how pytest was started: a background job of a
    script (`pytest ... &`) starts with SIGINT and SIGQUIT ignored, under `nohup` SIGHUP, and its
    children inherit that."""
    def setup() -> None:
        for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)

    return setup


def signalled_run(cmd: list[str], sig: int, ready: str = "ready",
                  ignored: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Start ``cmd`` (with the signals in ``ignored`` ignored), wait for ``ready`` on its stdout,
    send ``sig`` to it, collect the result."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_dispositions(ignored))
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.strip() == ready, first
    time.sleep(0.3)  # let the job reach its blocking call
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=TIMEOUT)
    return subprocess.CompletedProcess(cmd, proc.returncode, first + out, err)
