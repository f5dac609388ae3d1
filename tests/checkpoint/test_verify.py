"""`torchdoctor checkpoint verify`: complete, torn by a rank killed mid-save (real DCP, 2 ranks,
gloo), the newest complete one, the commit marker, and bad input."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from torchdoctor.checkpoint.verify import NotACheckpoint, read_metadata, verify

JOB = r'''
import datetime, os, socket, sys
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torchdoctor.checkpoint.commit import save_committed


def rank_main(rank, root, port, commit):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=30))
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    save = save_committed if commit else (lambda sd, path: dcp.save(sd, checkpoint_id=path))
    save({"model": model.state_dict(), "step": 1}, os.path.join(root, "step1"))
    if rank == 1:  # killed in the middle of the next save, before its shard is written
        from torch.distributed.checkpoint import filesystem
        filesystem.FileSystemWriter.write_data = lambda *a, **k: os._exit(9)
    try:
        save({"model": model.state_dict(), "step": 2}, os.path.join(root, "step2"))
    except Exception:
        os._exit(3)  # the surviving rank: its peer is gone
    os._exit(0)


if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.start_processes(rank_main, args=(sys.argv[1], port, sys.argv[2] == "commit"), nprocs=2, join=False,
                       start_method="spawn").join(timeout=120)
'''


def torn_run(tmp_path: Path, mode: str) -> Path:
    pytest.importorskip("torch")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    root = tmp_path / "ckpt"
    root.mkdir()
    subprocess.run([sys.executable, str(job), str(root), mode], capture_output=True, text=True, timeout=180)
    return root


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "torchdoctor.cli", "checkpoint", "verify", *args],
                          capture_output=True, text=True, timeout=60)


def test_a_rank_killed_mid_save_leaves_a_torn_checkpoint_and_latest_picks_the_previous(tmp_path):
    root = torn_run(tmp_path, "plain")
    whole = cli(str(root / "step1"), "--json")
    assert whole.returncode == 0, whole.stderr
    got = json.loads(whole.stdout)
    assert got["complete"] and got["ranks"] == [0, 1] and got["files"] == 2 and got["items"] > 4
    torn = cli(str(root / "step2"))
    assert torn.returncode == 1 and torn.stdout.startswith("torn:")
    assert "no .metadata" in torn.stdout and "__1_" not in "".join(os.listdir(root / "step2")), torn.stdout
    latest = cli(str(root), "--latest")
    assert latest.returncode == 0 and latest.stdout.strip().endswith(f"latest complete: {root / 'step1'}")


def test_with_the_commit_marker_a_torn_save_is_never_complete_and_changed_files_are_caught(tmp_path):
    root = torn_run(tmp_path, "commit")
    assert cli(str(root / "step1"), "--require-marker").returncode == 0
    assert cli(str(root / "step2"), "--require-marker").returncode == 1
    shard = next((root / "step1").glob("__1_*.distcp"))
    with open(shard, "r+b") as f:  # a shard cut short after the commit
        f.truncate(shard.stat().st_size // 2)
    broken = cli(str(root / "step1"))
    assert broken.returncode == 1 and "when committed" in broken.stdout and "short shard" in broken.stdout


def test_bad_input_is_one_line_exit_2_and_metadata_is_never_executed(tmp_path):
    assert cli(str(tmp_path)).returncode == 2  # an empty directory is not a checkpoint
    evil = tmp_path / "evil"
    evil.mkdir()

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "pwned"),))

    (evil / ".metadata").write_bytes(pickle.dumps(Boom()))
    res = cli(str(evil))
    assert res.returncode == 2 and "refused global" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(NotACheckpoint):
        read_metadata(str(evil / ".metadata"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / ".metadata").write_bytes(b"not a pickle")
    assert cli(str(tmp_path / "junk")).returncode == 2
    with pytest.raises(NotACheckpoint):
        verify(str(tmp_path / "missing"))
