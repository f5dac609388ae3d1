"""Run the live-probe and fix tests against several torch releases (issue 15: the declared range is tested).

For each torch version, one at a time: a throw-away venv under benchmarks/out/compat-venvs/, the
project installed into it (``--no-deps -e .``, the analysis deps at requirements-dev.txt's pins,
then ``torch==X``), each test group run as its own ``pytest -x``, the venv deleted. The table goes
to benchmarks/results/torch_compat.md.

    python benchmarks/torch_compat.py                            # oldest claimed + newest installable
    python benchmarks/torch_compat.py --torch 2.13.0 2.14.1 --groups tests/probe tests/test_fixer.py
    python benchmarks/torch_compat.py --torch 2.11.0 --find-links /tmp/wheels   # pre-downloaded wheels
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENVS = ROOT / "benchmarks" / "out" / "compat-venvs"
RESULTS = ROOT / "benchmarks" / "results" / "torch_compat.md"
GROUPS = ["tests/probe", "tests/remedies", "tests/test_fixer.py", "tests/test_runner.py", "tests/workloads"]
DEPS = ["numpy", "msgspec", "rich", "plotly", "pytest"]
# Imports and reads every private torch API that src/torchdoctor/probe and remedies use (docs/private_apis.md).
PRIVATE_CHECK = r'''
import json
import torch
from torch import nn

out = {}
def check(name, fn):
    try:
        out[name] = bool(fn())
    except Exception as exc:
        out[name] = f"{type(exc).__name__}: {exc}"[:120]

def loader_iter(workers):
    ds = torch.utils.data.TensorDataset(torch.arange(8.0))
    return iter(torch.utils.data.DataLoader(ds, batch_size=2, num_workers=workers))

from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import dataloader as dl
check("DistributedDataParallel._get_ddp_logging_data", lambda: callable(DDP._get_ddp_logging_data))
check("torch.utils.data.dataloader._BaseDataLoaderIter", lambda: hasattr(dl._BaseDataLoaderIter, "__next__"))
check("torch.utils.data._utils.worker._worker_loop",
      lambda: callable(__import__("torch.utils.data._utils.worker", fromlist=["x"])._worker_loop))
it = loader_iter(0)
check("_SingleProcessDataLoaderIter._dataset_fetcher.collate_fn", lambda: callable(it._dataset_fetcher.collate_fn))
it = loader_iter(1)
check("_MultiProcessingDataLoaderIter._task_info / _rcvd_idx",
      lambda: isinstance(it._task_info, dict) and isinstance(it._rcvd_idx, int))
check("_MultiProcessingDataLoaderIter._data_queue (._reader.poll or .qsize)",
      lambda: hasattr(getattr(it._data_queue, "_reader", it._data_queue), "poll") or hasattr(it._data_queue, "qsize"))
check("_MultiProcessingDataLoaderIter._workers (.pid)", lambda: all(w.pid for w in it._workers))
del it
from torch.profiler import profiler as tp
check("torch.profiler.profiler._KinetoProfile.prepare_trace", lambda: callable(tp._KinetoProfile.prepare_trace))
check("torch.autograd.profiler._is_profiler_enabled", lambda: isinstance(torch.autograd.profiler._is_profiler_enabled, bool))
check("torch._C._autograd._profiler_enabled", lambda: torch._C._autograd._profiler_enabled() in (True, False))
check("torch.autocast instance ._enabled", lambda: isinstance(torch.autocast("cpu")._enabled, bool))
def fsdp2():
    from torch.distributed.fsdp import FSDPModule
    return callable(FSDPModule._get_fsdp_state)
check("torch.distributed.fsdp.FSDPModule._get_fsdp_state", fsdp2)
def fsdp_state():
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    return hasattr(FSDPState(), "_fsdp_param_group")
check("FSDPState._fsdp_param_group", fsdp_state)
def dtensor():
    from torch.distributed.tensor import DTensor
    return hasattr(DTensor, "_local_tensor")
check("DTensor._local_tensor", dtensor)
def init_optim_state():
    from torch.distributed.checkpoint import state_dict
    return callable(state_dict._init_optim_state)
check("torch.distributed.checkpoint.state_dict._init_optim_state", init_optim_state)
check("OptimizedModule._orig_mod (torch.compile wrapper)", lambda: isinstance(torch.compile(nn.Linear(2, 2))._orig_mod, nn.Linear))
def dynamo_utils():
    import torch._dynamo.utils as u
    return hasattr(u.counters, "get") and hasattr(u, "guard_failures")
check("torch._dynamo.utils.counters / guard_failures", dynamo_utils)
def dynamo_config():
    import torch._dynamo
    return isinstance(torch._dynamo.config.suppress_errors, bool)
check("torch._dynamo.config.suppress_errors", dynamo_config)
from torch.optim import optimizer as topt
check("torch.optim.optimizer._get_fused_kernels_supported_devices",
      lambda: "cpu" in topt._get_fused_kernels_supported_devices() or bool(topt._get_fused_kernels_supported_devices()))
def ddp_logging():
    import os
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29531")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        model = DDP(nn.Linear(4, 4))
        model(torch.randn(2, 4)).sum().backward()
        data = model._get_ddp_logging_data()
        return {"backend_name", "can_set_static_graph", "bucket_sizes"} <= set(data)
    finally:
        dist.destroy_process_group()
check("_get_ddp_logging_data() keys backend_name, can_set_static_graph, bucket_sizes", ddp_logging)
print(json.dumps({"torch": torch.__version__, "apis": out}))
'''

NEWEST_HERE = "2.14.1"  # /etc/xdg/pip caps torch here: the newest this machine can install


@dataclass
class GroupResult:
    group: str
    counts: dict[str, int]
    seconds: float
    rc: int


@dataclass
class VersionResult:
    torch: str
    python: str = ""
    installed: str = ""  # torch.__version__ as imported, e.g. 2.13.0+cpu
    install_s: float = 0.0
    problem: str = ""  # why no tests ran (install failed or timed out)
    groups: list[GroupResult] = field(default_factory=list)
    private: dict[str, bool | str] = field(default_factory=dict)  # PRIVATE_CHECK's answers

    @property
    def ok(self) -> bool:
        return not self.problem and bool(self.groups) and all(g.rc == 0 for g in self.groups)


def pins() -> dict[str, str]:
    """name -> version from requirements-dev.txt."""
    out = {}
    for line in (ROOT / "requirements-dev.txt").read_text().splitlines():
        if "==" in line and not line.lstrip().startswith("#"):
            name, version = line.split("#")[0].strip().split("==")
            out[name.lower()] = version
    return out


def declared_range() -> str:
    """The torch requirement of pyproject's ``live`` extra."""
    m = re.search(r'^live\s*=\s*\["torch([^"]*)"\]', (ROOT / "pyproject.toml").read_text(), re.M)
    return f"torch{m.group(1)}" if m else "?"


def default_versions() -> list[str]:
    lower = re.search(r">=\s*([\d.]+)", declared_range())
    oldest = lower.group(1) if lower else "2.4"
    return [oldest if oldest.count(".") == 2 else f"{oldest}.0", NEWEST_HERE]


def run(cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def pytest_counts(output: str) -> dict[str, int]:
    """The summary line's counts: {'passed': 12, 'failed': 1, 'skipped': 2, ...}."""
    lines = [ln for ln in output.strip().splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", ln)]
    if not lines:
        return {}
    return {word.rstrip("s"): int(n) for n, word in re.findall(r"(\d+) ([a-z]+)", lines[-1])}


def test_version(version: str, groups: list[str], find_links: list[str], install_timeout: float,
                 group_timeout: float, also: list[str], log: Path) -> VersionResult:
    res = VersionResult(version)
    venv = VENVS / f"torch-{version}"
    shutil.rmtree(venv, ignore_errors=True)
    py = venv / "bin" / "python"
    try:
        run([sys.executable, "-m", "venv", str(venv)]).check_returncode()
        pin = pins()
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
               *[f"--find-links={d}" for d in find_links]]
        t0 = time.monotonic()
        for cmd in ([*pip, "--no-deps", "-e", "."], [*pip, *[f"{d}=={pin[d]}" for d in DEPS]],
                    [*pip, f"torch=={version}"]):
            left = install_timeout - (time.monotonic() - t0)
            try:
                done = run(cmd, timeout=max(left, 1))
            except subprocess.TimeoutExpired:
                res.problem = f"install timed out after {install_timeout:.0f} s"
                return res
            if done.returncode:
                res.problem = "install failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                return res
        res.install_s = time.monotonic() - t0
        probe = run([str(py), "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"])
        res.python, res.installed = probe.stdout.split()
        check = run([str(py), "-c", PRIVATE_CHECK], timeout=300)
        res.private = json.loads(check.stdout.strip().splitlines()[-1])["apis"] if check.returncode == 0 else {}
        for script in also:  # e.g. tests/data/kineto_versions/record.py
            done = run([str(py), script], timeout=600)
            with log.open("a") as f:
                f.write(f"\n===== torch {version} {script} rc={done.returncode}\n{done.stdout}{done.stderr[-5000:]}\n")
        for group in groups:
            t0 = time.monotonic()
            try:
                done = run([str(py), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", group],
                           timeout=group_timeout)
                counts, rc, text = pytest_counts(done.stdout), done.returncode, done.stdout + done.stderr
            except subprocess.TimeoutExpired as exc:
                counts, rc, text = {"timeout": 1}, 124, str(exc.stdout or "")
            res.groups.append(GroupResult(group, counts, time.monotonic() - t0, rc))
            with log.open("a") as f:
                f.write(f"\n===== torch {version} {group} rc={rc}\n{text[-20000:]}\n")
            print(f"  {group}: {counts} rc={rc} ({res.groups[-1].seconds:.0f} s)", flush=True)
        return res
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # a CUDA torch is ~5 GB on disk


def supported(results: list[VersionResult]) -> str:
    """The narrowest range spanning the versions on which every group passed."""
    ok = sorted(tuple(int(x) for x in r.torch.split(".")) for r in results if r.ok)
    if not ok:
        return "none of the tried versions passed"
    lo, hi = ok[0], ok[-1]
    return f"torch>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}"


def cell(g: GroupResult | None) -> str:
    if g is None:
        return "—"
    failed = g.counts.get("failed", 0) + g.counts.get("error", 0)
    text = f"{g.counts.get('passed', 0)} passed / {failed} failed"
    if g.counts.get("skipped"):
        text += f" / {g.counts['skipped']} skipped"
    if "timeout" in g.counts:
        text = "timed out"
    return text + ("" if g.rc == 0 else f" (rc {g.rc})")


def private_table(results: list[VersionResult]) -> list[str]:
    names = list(dict.fromkeys(n for r in results for n in r.private))
    rows = ["| private API | " + " | ".join(r.installed or r.torch for r in results) + " |",
            "|---|" + "---|" * len(results)]
    for n in names:
        marks = ["yes" if r.private.get(n) is True else str(r.private.get(n, "—")) for r in results]
        rows.append(f"| `{n}` | " + " | ".join(marks) + " |")
    return rows


def write_table(results: list[VersionResult], groups: list[str], command: str) -> None:
    head = ["torch", "python", *[f"`{g}`" for g in groups], "install s", "tests s"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        by = {g.group: g for g in r.groups}
        if r.problem:
            rows.append(f"| {r.torch} | {r.python or '—'} | {r.problem} |" + " |" * (len(head) - 3))
            continue
        tests_s = sum(g.seconds for g in r.groups)
        rows.append(f"| {r.installed} | {r.python} | " + " | ".join(cell(by.get(g)) for g in groups)
                    + f" | {r.install_s:.0f} | {tests_s:.0f} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        "# torch compatibility of the live probe and the fixes\n\n"
        f"Made by `{command}` on {platform.node() or 'this machine'} ({platform.machine()}, "
        f"{time.strftime('%Y-%m-%d')}). Each group is one `python -m pytest -q -x -p no:cacheprovider GROUP` "
        "in a fresh venv (project `--no-deps -e .`, requirements-dev.txt pins, `torch==X`): `-x` stops a "
        "group at its first failure, so a failed group's counts are partial. CPU only (no GPU here).\n\n"
        + "\n".join(rows) + "\n\n"
        "Private torch APIs the probe and the remedies read (docs/private_apis.md), imported and "
        "read in each venv:\n\n" + "\n".join(private_table(results)) + "\n\n"
        f"- Declared in pyproject.toml (`live` extra) when this ran: `{declared_range()}`\n"
        f"- Supported by these results: `{supported(results)}`\n"
        "- Full pytest output: benchmarks/out/torch_compat.log\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", nargs="+", default=None, help="versions (default: oldest claimed, newest here)")
    ap.add_argument("--groups", nargs="+", default=[g for g in GROUPS if (ROOT / g).exists()])
    ap.add_argument("--find-links", nargs="*", default=[], help="extra wheel folders for pip")
    ap.add_argument("--install-timeout", type=float, default=720.0, help="seconds for a version's installs")
    ap.add_argument("--run-also", nargs="*", default=[], help="python scripts to run in each venv")
    ap.add_argument("--group-timeout", type=float, default=1200.0, help="seconds for one test group")
    args = ap.parse_args(argv)
    versions = args.torch or default_versions()
    log = ROOT / "benchmarks" / "out" / "torch_compat.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    results = []
    for version in versions:
        print(f"torch {version}:", flush=True)
        r = test_version(version, args.groups, args.find_links, args.install_timeout, args.group_timeout,
                         args.run_also, log)
        if r.problem:
            print(f"  {r.problem}", flush=True)
        results.append(r)
        # Written after each version, so an interrupted run keeps what it measured.
        write_table(results, args.groups, "python benchmarks/torch_compat.py " + " ".join(argv or sys.argv[1:]))
    print(f"{RESULTS.relative_to(ROOT)}: supported {supported(results)}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
