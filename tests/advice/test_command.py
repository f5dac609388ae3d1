"""advice/command.py: snippets that start the job the way the user started it."""

from torchdoctor.advice.command import (
    cprofile,
    is_launcher,
    job_command,
    py_spy,
    started_by_torchrun,
    torchrun_with,
)


def test_job_command_quotes_the_live_command_and_falls_back_for_a_trace():
    assert job_command({"command": ["python", "train.py", "--name", "a b"]}) == "python train.py --name 'a b'"
    assert job_command({}) == "python train.py"
    assert job_command({"command": "python train.py"}) == "python train.py"  # not an argv: the generic text
    assert job_command({"command": ["python", 3]}, fallback="X") == "X"


def test_launchers_are_followed_by_py_spy():
    assert is_launcher(["torchrun", "--nproc-per-node", "2", "train.py"])
    assert is_launcher(["/usr/bin/python3.11", "-m", "torch.distributed.run", "train.py"])
    assert is_launcher(["accelerate", "launch", "train.py"])
    assert not is_launcher(["python", "spawn_ddp.py"])
    assert py_spy({"command": ["python", "t.py"]}, "x.svg") == "py-spy record -o x.svg -- python t.py"
    assert (py_spy({"command": ["torchrun", "--nproc-per-node", "2", "t.py"]}, "x.svg")
            == "py-spy record --subprocesses -o x.svg -- torchrun --nproc-per-node 2 t.py")
    # torch.multiprocessing.spawn: the ranks are the script's children; a shell script starts Python.
    assert py_spy({"command": ["python", "spawn.py"]}, "x.svg", processes=2).startswith("py-spy record --subprocesses")
    assert py_spy({"command": ["bash", "run.sh"]}, "x.svg").startswith("py-spy record --subprocesses")
    # srun's tasks are not its children: py-spy goes inside each task.
    assert "py-spy inside each task" in py_spy({"command": ["srun", "-N2", "python", "t.py"]}, "x.svg")


def test_cprofile_runs_a_script_but_not_a_launcher():
    assert cprofile({"command": ["python3", "t.py", "--lr", "1"]}) == "python3 -m cProfile -s cumtime t.py --lr 1"
    assert cprofile({"command": ["torchrun", "t.py"]}) is None
    assert cprofile({"command": ["python", "-m", "pkg.train", "--x"]}) == "python -m cProfile -s cumtime -m pkg.train --x"
    assert cprofile({"command": ["python", "-m", "torch.distributed.run", "t.py"]}) is None
    assert cprofile({"command": ["python", "spawn.py"]}, processes=2) is None  # cProfile sees the parent only
    assert cprofile({}) == "python -m cProfile -s cumtime train.py"


def test_torchrun_with_adds_the_flag_to_torchrun_itself():
    got = torchrun_with({"command": ["torchrun", "--nproc-per-node", "2", "t.py", "--x"]}, "--numa-binding=node", "F")
    assert got == "torchrun --numa-binding=node --nproc-per-node 2 t.py --x"
    got = torchrun_with({"command": ["python", "-m", "torch.distributed.run", "t.py"]}, "--numa-binding=node", "F")
    assert got == "python -m torch.distributed.run --numa-binding=node t.py"
    assert torchrun_with({"command": ["python", "t.py"]}, "--numa-binding=node", "F") == "F"
    assert torchrun_with({}, "--numa-binding=node", "F") == "F"


def test_started_by_torchrun_is_unknown_without_a_command():
    assert started_by_torchrun({}) is None
    assert started_by_torchrun({"command": ["torchrun", "t.py"]}) is True
    assert started_by_torchrun({"command": ["python", "spawn.py"]}) is False
