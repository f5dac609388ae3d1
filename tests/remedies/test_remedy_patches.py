"""Remedies applied in-process on real torch objects (each test restores what it patched)."""

from __future__ import annotations

import math
import os
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.nn.modules import module as nn_module  # noqa: E402
from torch.nn.parallel import distributed  # noqa: E402
from torch.optim import optimizer as optim_mod  # noqa: E402
from torch.utils.data import DataLoader, Dataset, IterableDataset, dataloader  # noqa: E402

from torchdoctor.remedies import (  # noqa: E402
    patch_data,
    patch_flags,
    patch_fsdp,
    patch_model,
    patch_optim,
    recorder,
)
from torchdoctor.remedies.catalogue import parse  # noqa: E402
from torchdoctor.remedies.runtime import ENV_SAID, ENV_STEPS, Runtime  # noqa: E402


class Squares(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3,), float(i))


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(8))


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch):
    """A fresh Runtime; every torch attribute a remedy may replace is restored afterwards."""
    monkeypatch.setattr(dataloader.DataLoader, "__init__", dataloader.DataLoader.__init__)
    monkeypatch.setattr(dataloader.DataLoader, "__iter__", dataloader.DataLoader.__iter__)
    monkeypatch.setattr(distributed.DistributedDataParallel, "__init__", distributed.DistributedDataParallel.__init__)
    for obj in vars(torch.optim).values():
        if isinstance(obj, type) and "__init__" in obj.__dict__:
            monkeypatch.setattr(obj, "__init__", obj.__dict__["__init__"])
    monkeypatch.setattr(torch, "set_anomaly_enabled", torch.set_anomaly_enabled)
    monkeypatch.setattr(torch.autograd, "backward", torch.autograd.backward)
    monkeypatch.setattr(torch.nn.functional, "linear", torch.nn.functional.linear)
    monkeypatch.setattr(torch.distributed, "init_process_group", torch.distributed.init_process_group)
    c10d = torch.distributed.distributed_c10d
    monkeypatch.setattr(c10d, "init_process_group", c10d.init_process_group)
    monkeypatch.setenv(ENV_SAID, "")
    hooks = [optim_mod._global_optimizer_pre_hooks, optim_mod._global_optimizer_post_hooks,
             nn_module._global_forward_pre_hooks, nn_module._global_forward_hooks]
    before = [dict(h) for h in hooks]
    threads = torch.get_num_threads()
    yield Runtime()
    for h, saved in zip(hooks, before, strict=True):
        h.clear()
        h.update(saved)
    torch.set_num_threads(threads)
    torch.set_anomaly_enabled(False)


def want(rt: Runtime, *texts: str) -> Runtime:
    for text in texts:
        spec, why = parse(text)
        assert spec is not None, why
        rt.specs[spec.id] = spec
        rt.requested.append(text)
    return rt


def batches(loader: DataLoader) -> list[torch.Tensor]:
    return [b.clone() for b in loader]


def test_dataloader_workers_persistent_prefetch(runtime: Runtime) -> None:
    want(runtime, "dataloader.workers=1", "dataloader.persistent_workers", "dataloader.prefetch")
    plain = batches(DataLoader(Squares(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0)))
    patch_data.install(torch, runtime)
    loader = DataLoader(Squares(), batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (1, True, 4)
    # The same batches in the same order: the sampler stays in the main process.
    assert all(torch.equal(a, b) for a, b in zip(plain, batches(loader), strict=True))
    sites = {e["site"] for e in runtime.applied}
    assert sites == {f"{__file__}:{test_dataloader_workers_persistent_prefetch.__code__.co_firstlineno + 4}"}
    assert {e["id"] for e in runtime.applied} == {"dataloader.workers", "dataloader.persistent_workers",
                                                   "dataloader.prefetch"}
    # Persistent workers outlive the loop: stop them here, not from a garbage collection in a later
    # test (a full-suite run once hung at the next test's call with a worker still alive).
    loader._iterator._shutdown_workers()


def seeded_by_count(worker_id: int, num_workers: int, rank: int, seed: int) -> None:
    """mmengine.dataset.utils.worker_init_fn's seed: the count its Runner passed in, bound by partial."""
    torch.manual_seed(num_workers * rank + worker_id + seed)


def test_a_worker_init_fn_bound_to_the_worker_count_is_told_the_new_count(runtime: Runtime) -> None:
    """mmengine's Runner builds DataLoader(..., worker_init_fn=partial(worker_init_fn, num_workers=
    cfg.get('num_workers'), rank=0, seed=...)); with num_workers set under it, every worker raised
    TypeError (None * 0) and `fix` rejected the remedy as "the job failed"."""
    import functools

    want(runtime, "dataloader.workers=1")
    patch_data.install(torch, runtime)
    init = functools.partial(seeded_by_count, num_workers=None, rank=0, seed=7)
    loader = DataLoader(Squares(), batch_size=8, worker_init_fn=init)
    assert loader.num_workers == 1 and loader.worker_init_fn.keywords == {"num_workers": 1, "rank": 0, "seed": 7}
    assert len(batches(loader)) == 8  # the worker seeded itself and ran
    # The seeding is the library's, not a setting of the remedy's: the permanent change stays num_workers.
    assert [(e["id"], e["set"]) for e in runtime.applied] == [("dataloader.workers", {"num_workers": 1})]
    # A partial naming another count than the loader's own is the job's choice: left as it is.
    other = functools.partial(seeded_by_count, num_workers=4, rank=0, seed=7)
    assert DataLoader(Squares(), batch_size=8, worker_init_fn=other).worker_init_fn is other


def test_persistent_workers_keep_the_jobs_random_stream(runtime: Runtime) -> None:
    """pytorch/examples super_resolution (shuffle=True, the global generator): with the workers kept
    alive, epoch 2 came in another order and `fix` rejected the remedy for changing the losses."""
    def epochs(loader: DataLoader, n: int = 3) -> list[list[torch.Tensor]]:
        torch.manual_seed(0)
        out = [batches(loader) for _ in range(n)]
        out.append([torch.rand(1)])  # and the job's own draws after the loop
        if loader.persistent_workers:
            loader._iterator._shutdown_workers()
        return out

    def same(a: list[list[torch.Tensor]], b: list[list[torch.Tensor]]) -> bool:
        return all(torch.equal(x, y) for ea, eb in zip(a, b, strict=True) for x, y in zip(ea, eb, strict=True))

    plain = epochs(DataLoader(Squares(), batch_size=8, shuffle=True, num_workers=1))
    # What the remedy has to undo: persistent workers alone shuffle epoch 2 differently.
    alone = epochs(DataLoader(Squares(), batch_size=8, shuffle=True, num_workers=1, persistent_workers=True))
    assert same(plain[:1], alone[:1]) and not same(plain[1:2], alone[1:2])
    patch_data.install(torch, want(runtime, "dataloader.persistent_workers"))
    loader = DataLoader(Squares(), batch_size=8, shuffle=True, num_workers=1)
    assert loader.persistent_workers
    assert same(plain, epochs(loader))
    assert "dataloader.persistent_workers" not in runtime.refused


def test_a_loader_iterated_once_is_left_out_of_the_permanent_change(runtime: Runtime) -> None:
    """MONAI's 3D segmentation tutorial checks its first batch with a loader of its own: persistent
    workers there keep four idle processes, and `fix` suggested the change on all three loaders."""
    from torchdoctor.remedies.suggest import changes_for

    patch_data.install(torch, want(runtime, "dataloader.persistent_workers"))
    train = DataLoader(Squares(), batch_size=8, num_workers=1)  # iterated every epoch
    check = DataLoader(Squares(), batch_size=8, num_workers=1)  # one look at the first batch
    for _ in range(2):
        batches(train)
    next(iter(check))
    for loader in (train, check):
        loader._iterator._shutdown_workers()
    applied = runtime.record()["applied"]
    sites = {e["site"].rsplit(":", 1)[1]: e["exercised"] for e in applied}
    assert sorted(sites.values()) == [False, True] and len(applied) == 2
    used = next(e["site"] for e in applied if e["exercised"])
    idle = next(e["site"] for e in applied if not e["exercised"])
    assert int(used.rsplit(":", 1)[1]) + 1 == int(idle.rsplit(":", 1)[1])  # train's line, then check's
    diff, note = changes_for(["dataloader.persistent_workers"], {"dataloader.persistent_workers": applied})
    assert diff.where == used and "persistent_workers=True" in diff.text
    assert note.where == "left out" and idle in note.text and "not iterated a second time" in note.text


def test_a_library_s_copy_of_a_loader_answers_for_the_user_s_line(runtime: Runtime) -> None:
    """huggingface/accelerate's prepare() builds a DataLoaderShard from the user's loader's attributes
    (persistent_workers among them) and the job iterates only that copy, three epochs: `fix` left the
    user's DataLoader line out of the permanent change as 'not iterated a second time'. A loader the
    user's own code builds over the same dataset stays the user's own."""
    import linecache

    from torchdoctor.remedies.suggest import changes_for

    class Shard(DataLoader):
        pass

    # accelerate's prepare_data_loader, reduced, as if installed.
    path = "/venv/lib/python3.11/site-packages/accelerate/data_loader.py"
    src = ("def prepare(loader, Shard):\n    return Shard(loader.dataset, batch_size=loader.batch_size, "
           "num_workers=loader.num_workers, persistent_workers=loader.persistent_workers)\n")
    linecache.cache[path] = (len(src), None, src.splitlines(True), path)
    ns: dict = {}
    exec(compile(src, path, "exec"), ns)

    patch_data.install(torch, want(runtime, "dataloader.persistent_workers"))
    user = DataLoader(Squares(), batch_size=8, num_workers=1)
    copy = ns["prepare"](user, Shard)
    own = DataLoader(user.dataset, batch_size=4, num_workers=1, persistent_workers=True)  # the user's, not a copy
    torch.manual_seed(0)
    for _ in range(2):
        batches(copy)
        batches(own)
    drawn = torch.rand(1)
    for loader in (copy, own):
        loader._iterator._shutdown_workers()
    applied = runtime.record()["applied"]
    assert [e["exercised"] for e in applied] == [True] and applied[0]["site"].endswith(
        f":{test_a_library_s_copy_of_a_loader_answers_for_the_user_s_line.__code__.co_firstlineno + 21}")
    (diff,) = changes_for(["dataloader.persistent_workers"], {"dataloader.persistent_workers": applied})
    assert diff.where == applied[0]["site"] and "persistent_workers=True" in diff.text
    # The copy's second epoch drew the number a new iterator draws, and the user's own loader drew nothing
    # extra: the job's random stream is the one it has without the remedy.
    plain_copy = DataLoader(Squares(), batch_size=8, num_workers=1)
    plain_own = DataLoader(Squares(), batch_size=4, num_workers=1, persistent_workers=True)
    torch.manual_seed(0)
    for _ in range(2):
        batches(plain_copy)
        batches(plain_own)
    assert torch.equal(drawn, torch.rand(1))
    plain_own._iterator._shutdown_workers()


def test_torchdata_s_stateful_loader_takes_the_loader_remedies(runtime: Runtime, tmp_path, monkeypatch) -> None:
    """torchdata's StatefulDataLoader never calls DataLoader.__init__: `fix` called persistent workers on
    it a no-op, 'the job never reached what it changes'. Made persistent, it must keep the job's random
    stream: with a checkpoint taken before training and torchdata's sampler, which draws its permutation
    when walked, the remedy first took another shuffle from epoch 2 (the real torchdata 0.11: 'losses
    differ first at step 16', x1.98 rejected)."""
    import sys

    import stateful_loader

    stateful_loader.install(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("torchdata")]:
        monkeypatch.delitem(sys.modules, name)
    from torchdata.stateful_dataloader import StatefulDataLoader

    def epochs() -> list[torch.Tensor]:
        torch.manual_seed(0)
        dl = StatefulDataLoader(Squares(), batch_size=8, num_workers=1, shuffle=True)
        dl.state_dict()
        out = [torch.cat([b.flatten() for b in batches(dl)]) for _ in range(3)] + [torch.rand(1)]
        if dl.persistent_workers:
            dl._iterator._shutdown_workers()
        return out

    try:
        plain = epochs()
        patch_data.install(torch, want(runtime, "dataloader.persistent_workers"))
        loader = StatefulDataLoader(Squares(), batch_size=8, num_workers=1)
        assert loader.persistent_workers
        for _ in range(2):
            batches(loader)
        loader._iterator._shutdown_workers()
        (entry,) = runtime.record()["applied"]
        assert entry["exercised"] and entry["set"] == {"persistent_workers": True}
        assert all(torch.equal(a, b) for a, b in zip(plain, epochs(), strict=True))
    finally:
        for name in [m for m in sys.modules if m.startswith("torchdata")]:
            sys.modules.pop(name, None)


def test_no_workers_also_drops_what_torch_refuses_without_them(runtime: Runtime) -> None:
    """dataloader.workers=0 (DL-1: a batch costs less to make than to receive) on a loader with
    persistent workers and a prefetch depth: torch raises ValueError for either without workers."""
    patch_data.install(torch, want(runtime, "dataloader.workers=0"))
    loader = DataLoader(Squares(), batch_size=8, num_workers=2, persistent_workers=True, prefetch_factor=4,
                        multiprocessing_context="spawn")
    assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor) == (0, False, None)
    assert loader.multiprocessing_context is None
    assert [b.tolist() for b in batches(loader)] == [b.tolist() for b in batches(DataLoader(Squares(), batch_size=8))]
    stream = DataLoader(Stream(), batch_size=4, num_workers=2)  # no workers: no stream replayed
    assert stream.num_workers == 0 and "dataloader.workers" not in runtime.refused
    first = [e for e in runtime.applied if e["id"] == "dataloader.workers"][:4]  # the first loader's four keys
    assert {k: v for e in first for k, v in e["set"].items()} == {
        "num_workers": 0, "persistent_workers": False, "prefetch_factor": None, "multiprocessing_context": None}


def test_positional_num_workers_is_found(runtime: Runtime) -> None:
    patch_data.install(torch, want(runtime, "dataloader.workers=1"))
    loader = DataLoader(Squares(), 8, False, None, None, 0)
    assert loader.num_workers == 1


def test_workers_beyond_the_cpus_are_refused_and_the_loader_still_works(runtime: Runtime,
                                                                        capfd: pytest.CaptureFixture[str]) -> None:
    patch_data.install(torch, want(runtime, "dataloader.workers=64"))
    loader = DataLoader(Squares(), batch_size=8)
    assert loader.num_workers == 0 and len(batches(loader)) == 8
    assert "num_workers=64 is beyond 4 per CPU" in runtime.refused["dataloader.workers"]
    assert "remedy dataloader.workers refused" in capfd.readouterr().err


class InProcessOnly(DataLoader):
    """A loader class that rejects workers while DataLoader.__init__ runs (like a custom loader
    whose dataset handle cannot cross processes)."""

    def __setattr__(self, name: str, value: object) -> None:
        if name == "num_workers" and value:
            raise ValueError("this loader must stay in the training process")
        super().__setattr__(name, value)


def test_a_loader_that_rejects_the_change_is_built_as_written(runtime: Runtime) -> None:
    patch_data.install(torch, want(runtime, "dataloader.workers=1"))
    loader = InProcessOnly(Squares(), batch_size=8)
    assert loader.num_workers == 0 and len(batches(loader)) == 8
    assert "must stay in the training process" in runtime.refused["dataloader.workers"]
    assert not runtime.applied


def test_iterable_dataset_and_missing_accelerator(runtime: Runtime) -> None:
    patch_data.install(torch, want(runtime, "dataloader.workers=1", "dataloader.pin_memory"))
    loader = DataLoader(Stream(), batch_size=2)
    assert loader.num_workers == 0
    assert "IterableDataset" in runtime.skipped["dataloader.workers"]
    if not patch_data.has_accelerator(torch):
        assert not loader.pin_memory
        assert "no accelerator" in runtime.refused["dataloader.pin_memory"]


def train(opt_cls: type, steps: int = 6, **kw: object) -> tuple[list[float], torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = opt_cls(model.parameters(), lr=1e-2, **kw)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out, opt


def test_foreach_is_bit_identical_and_replaces_the_choice_the_finding_is_about(runtime: Runtime) -> None:
    plain, _ = train(torch.optim.Adam)
    patch_optim.install(torch, want(runtime, "optim.foreach"))
    losses, opt = train(torch.optim.Adam)
    assert opt.defaults["foreach"] is True
    assert losses == plain  # the catalogue's claim for `safe`
    # HO-9's live case is an explicit foreach=False on an accelerator: the remedy must change it.
    _, loop = train(torch.optim.SGD, foreach=False)
    assert loop.defaults["foreach"] is True
    assert runtime.applied[-1]["was"] == {"foreach": False} and runtime.applied[-1]["set"] == {"foreach": True}
    _, mine = train(torch.optim.SGD, fused=True)  # a fused update is left alone
    assert mine.defaults["fused"] is True and not mine.defaults["foreach"]


def test_fused_replaces_fused_false_and_foreach_true(runtime: Runtime) -> None:
    """llm.c and nanoGPT pass fused=(device_type == "cuda"): on a CPU that is fused=False, the choice
    HO-18 is about. A foreach=True the code passed gives way (both True is an error)."""
    patch_optim.install(torch, want(runtime, "optim.fused"))
    _, opt = train(torch.optim.AdamW, fused=False)
    assert opt.defaults["fused"] is True
    assert runtime.applied[-1]["id"] == "optim.fused" and runtime.applied[-1]["was"] == {"fused": False}
    _, opt = train(torch.optim.Adam, foreach=True)
    assert opt.defaults["fused"] is True and not opt.defaults["foreach"]
    assert runtime.applied[-1]["set"] == {"fused": True, "foreach": None}
    # fused cannot differentiate the update (built only: a differentiable step needs its own loop)
    before = len(runtime.applied)
    opt = torch.optim.Adam(torch.nn.Linear(2, 2).parameters(), differentiable=True)
    assert not opt.defaults["fused"] and len(runtime.applied) == before


def test_fused_checks_the_parameters_first(runtime: Runtime) -> None:
    patch_optim.install(torch, want(runtime, "optim.fused"))
    _, opt = train(torch.optim.AdamW)
    assert opt.defaults["fused"] is True
    counts = torch.zeros(3, dtype=torch.int64)  # fused kernels take floating point only
    opt = torch.optim.SGD([counts], lr=0.1)
    assert not opt.defaults["fused"]
    assert "floating-point" in runtime.refused["optim.fused"]


def test_fused_is_refused_where_the_first_step_would_fail(runtime: Runtime) -> None:
    """An SGD over an nn.Embedding(sparse=True) gets sparse gradients, which torch's fused SGD
    rejects at the first step ("does not support sparse gradients"): refused at construction, the
    job trains as written."""
    patch_optim.install(torch, want(runtime, "optim.fused"))
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1, fused=False)
    assert not opt.defaults["fused"] and "sparse gradients" in runtime.refused["optim.fused"]
    emb(torch.tensor([1, 2])).sum().backward()
    opt.step()  # the loop it was given


def test_fused_problem_reads_the_kernel_table_dtypes_and_gradients() -> None:
    from torchdoctor.advice.optimizer import fused_problem

    w = torch.nn.Parameter(torch.randn(3))
    assert fused_problem(torch, "AdamW", [w]) is None
    assert "floating-point" in fused_problem(torch, "SGD", [torch.zeros(3, dtype=torch.int64)])
    assert "no fused implementation" in fused_problem(torch, "RMSprop", [w])
    w.grad = torch.randn(3).to_sparse()
    assert "sparse gradients" in fused_problem(torch, "Adagrad", [w])
    w.grad = None
    assert "sparse gradients" in fused_problem(torch, "SGD", [w], frozenset({id(w)}))
    meta = torch.nn.Parameter(torch.empty(3, device="meta"))  # no fused kernel registered for it
    assert "no fused AdamW kernel for parameters on meta" in fused_problem(torch, "AdamW", [meta])


# In a fresh process: freeing the DDP model in pytest's own process deadlocked a full-suite run
# (gdb: ProcessGroupGloo's destructor, holding the GIL, joined a gloo thread that waited for the GIL
# to drop a Python object, a mode stack entry, from the thread-local state of earlier tests).
_DDP_JOB = """
import json, os, sys
from datetime import timedelta
from pathlib import Path
import torch
import torch.distributed as dist
from torch.nn.parallel import distributed
from torchdoctor.remedies import patch_ddp
from torchdoctor.remedies.catalogue import parse
from torchdoctor.remedies.runtime import Runtime

rt = Runtime()
for text in sys.argv[1:]:
    spec, why = parse(text)
    assert spec is not None, why
    rt.specs[spec.id] = spec
    rt.requested.append(text)
# One rank over an in-memory store: nothing to connect to, and a bounded wait if anything hangs.
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
patch_ddp.install(torch, rt)
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
ddp = distributed.DistributedDataParallel(model, find_unused_parameters=True, bucket_cap_mb=0.001)
state = [ddp.find_unused_parameters, ddp.static_graph, ddp.gradient_as_bucket_view, ddp.bucket_bytes_cap]
for _ in range(3):
    ddp(torch.randn(2, 4)).sum().backward()
print(json.dumps({"state": state, "applied": sorted(e["id"] for e in rt.applied)}), flush=True)
os._exit(0)
"""


def test_ddp_arguments() -> None:
    import json
    import subprocess
    import sys

    ids = ["ddp.find_unused_false", "ddp.static_graph", "ddp.grad_as_bucket_view", "ddp.bucket_cap"]
    done = subprocess.run([sys.executable, "-c", _DDP_JOB, *ids], capture_output=True, text=True, timeout=300,
                          env={**os.environ, ENV_SAID: "", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["state"] == [False, True, True, 25 * 1024 * 1024]
    assert got["applied"] == sorted(ids)


def test_fsdp2_units_keep_their_parameters_unsharded(runtime: Runtime, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    import importlib

    from torchdoctor.probe.collect import fsdp2_reshards

    exporters = [importlib.import_module(name) for name in patch_fsdp.EXPORTERS]
    for module in exporters:
        monkeypatch.setattr(module, "fully_shard", module.fully_shard)
    fsdp = exporters[0]
    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        def build():
            model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
            fsdp.fully_shard(model[0])  # read from the module at call time, as `from ... import` would
            fsdp.fully_shard(model)
            return model

        assert fsdp2_reshards(build(), fsdp.FSDPModule) is True  # FSDP2's default for the inner unit
        want(runtime, "fsdp.keep_unsharded")
        patch_fsdp.install(torch, runtime)
        assert all(m.fully_shard is exporters[0].fully_shard for m in exporters)
        model = build()
        assert fsdp2_reshards(model, fsdp.FSDPModule) is False
        model(torch.randn(2, 4)).sum().backward()
        # Both calls (the block's and the root's lines), each recorded with what the user had.
        assert [(e["set"], e["was"]) for e in runtime.applied] == [
            ({"reshard_after_forward": False}, {"reshard_after_forward": None})] * 2
        assert all(e["site"] and "library" not in e for e in runtime.applied)
        # A library that shards for the job (torchtune's shard_model): the library is recorded, so that
        # fix's permanent change is its setting (remedies/suggest.py), not a line of its file.
        lib = tmp_path / "site-packages" / "shardlib"
        lib.mkdir(parents=True)
        (lib / "__init__.py").write_text("def shard(model, fully_shard):\n    fully_shard(model[1])\n"
                                         "    fully_shard(model)\n")
        monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
        import shardlib

        runtime.applied.clear()
        shardlib.shard(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)), fsdp.fully_shard)
        assert [(e["site"], e.get("library")) for e in runtime.applied] == [(None, "shardlib")]
    finally:
        dist.destroy_process_group()


def test_debug_switches_off(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    want(runtime, "debug.off")
    patch_flags.debug_env_off(runtime)
    patch_flags.install(torch, runtime)
    assert "CUDA_LAUNCH_BLOCKING" not in os.environ and "TORCH_DISTRIBUTED_DEBUG" not in os.environ
    torch.autograd.set_detect_anomaly(True)
    assert not torch.is_anomaly_enabled()
    with pytest.warns(UserWarning, match="Anomaly Detection"), torch.autograd.detect_anomaly():
        assert not torch.is_anomaly_enabled()


def test_threads_and_gpu_only_flags(runtime: Runtime) -> None:
    patch_flags.install(torch, want(runtime, "threads.affinity=1", "cudnn.benchmark", "precision.tf32"))
    assert torch.get_num_threads() == 1
    if not torch.cuda.is_available():
        assert "cuDNN" in runtime.refused["cudnn.benchmark"]
        assert "TF32" in runtime.refused["precision.tf32"]
        assert not torch.backends.cudnn.benchmark and torch.get_float32_matmul_precision() == "highest"


def test_autocast_around_the_model_only(runtime: Runtime) -> None:
    patch_model.install(torch, want(runtime, "precision.autocast", "cudagraphs"))
    if not torch.cuda.is_available():
        assert "CUDA graphs" in runtime.refused["cudagraphs"]
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    loss_fn = torch.nn.MSELoss()
    with torch.no_grad():  # not a training forward: left alone
        assert model(torch.randn(2, 4)).dtype == torch.float32
    for _ in range(2):
        out = model(torch.randn(2, 4))
        assert out.dtype == torch.bfloat16
        loss = loss_fn(out.float(), torch.zeros(2, 2))
        assert loss.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
        loss.backward()
    assert runtime.applied[0]["set"] == {"autocast": "cpu/bfloat16"}


def test_recorder_keeps_losses_and_stops_after_n_steps(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_STEPS, "3")
    monkeypatch.delenv("TORCHDOCTOR_RUN_DIR", raising=False)
    plain, _ = train(torch.optim.SGD, steps=3)
    recorder.install(torch, runtime)
    with pytest.raises(SystemExit) as stop:
        train(torch.optim.SGD, steps=10)
    assert stop.value.code == 0 and runtime.steps == 3
    record = runtime.record()
    assert record is not None and record["losses"] == plain


def test_recorder_leaves_out_a_backward_on_the_meta_device(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """litgpt's pretrain measures its FLOPs with a backward on the meta device before training: that loss has no
    value, and stacked with the others it made every loss of the run NaN."""
    monkeypatch.setenv(ENV_STEPS, "3")
    monkeypatch.delenv("TORCHDOCTOR_RUN_DIR", raising=False)
    plain, _ = train(torch.optim.SGD, steps=3)
    recorder.install(torch, runtime)
    with torch.device("meta"):
        meta = torch.nn.Linear(4, 1)
        meta(torch.randn(2, 4)).sum().backward()
    with pytest.raises(SystemExit):
        train(torch.optim.SGD, steps=10)
    record = runtime.record()
    assert record is not None and record["losses"] == plain
    # A loss that does not stack with the others costs only its own value.
    runtime.losses = [torch.tensor(1.5), torch.empty((), device="meta"), torch.tensor(2.5)]
    runtime._finish_losses()
    assert runtime.loss_values[-3] == 1.5 and math.isnan(runtime.loss_values[-2]) and runtime.loss_values[-1] == 2.5


def test_a_meta_backward_is_no_step_of_a_job_without_an_optimizer(runtime: Runtime,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_STEPS, "3")
    monkeypatch.delenv("TORCHDOCTOR_RUN_DIR", raising=False)
    plain = hand_written_sgd(3)
    recorder.install(torch, runtime)
    with torch.device("meta"):
        torch.nn.Linear(4, 1)(torch.randn(2, 4)).sum().backward()
    with pytest.raises(SystemExit):
        hand_written_sgd(10)
    record = runtime.record()
    assert record is not None and record["losses"] == plain and record["steps"] == 3


def hand_written_sgd(steps: int) -> list[float]:
    """word_language_model's loop: no torch.optim optimizer, the update is `p.data.add_`."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        model.zero_grad()
        loss = model(torch.randn(4, 8, generator=g)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-1e-2)
        out.append(loss.item())
    return out


def test_recorder_stops_a_job_without_an_optimizer_after_n_backwards(runtime: Runtime,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_STEPS, "3")
    monkeypatch.delenv("TORCHDOCTOR_RUN_DIR", raising=False)
    plain = hand_written_sgd(3)
    recorder.install(torch, runtime)
    done: list[float] = []
    with pytest.raises(SystemExit) as stop:
        done.extend(hand_written_sgd(10))
    assert stop.value.code == 0 and runtime.backward_steps == 3 and runtime.steps == 0
    record = runtime.record()
    assert record is not None and record["losses"] == plain and record["steps"] == 3


def test_recorder_counts_optimizer_steps_once_the_job_builds_an_optimizer(runtime: Runtime,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Gradient accumulation: 4 backwards a step; the limit is in optimizer steps, never backwards."""
    monkeypatch.setenv(ENV_STEPS, "2")
    recorder.install(torch, runtime)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with pytest.raises(SystemExit):
        for _ in range(5):
            for _ in range(4):
                model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    record = runtime.record()
    assert runtime.steps == 2 and record is not None and len(record["losses"]) == 8 and record["steps"] == 2


def test_expandable_segments_joins_the_jobs_allocator_settings(runtime: Runtime, monkeypatch) -> None:
    from torchdoctor.remedies.suggest import _snippet
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    patch_flags.alloc_env(want(runtime, "memory.expandable_segments"))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    (entry,) = runtime.applied
    assert entry["was"] == {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"} and entry["target"] == "environment"
    assert "expandable_segments:True" in _snippet("memory.expandable_segments", runtime.applied).text


def test_expandable_segments_keeps_a_jobs_own_choice(runtime: Runtime, monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    patch_flags.alloc_env(want(runtime, "memory.expandable_segments"))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False" and not runtime.applied
    assert "already sets" in runtime.skipped["memory.expandable_segments"]


def test_expandable_segments_refused_with_the_async_allocator(runtime: Runtime, monkeypatch) -> None:
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    patch_flags.alloc_env(want(runtime, "memory.expandable_segments"))
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync" and not runtime.applied
    assert "cudaMallocAsync" in runtime.refused["memory.expandable_segments"]


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")  # one rank: nothing to shard
def test_fsdp1_units_prefetch_forward_and_backward(runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.fsdp import BackwardPrefetch, FullyShardedDataParallel
    from torch.distributed.fsdp import fully_sharded_data_parallel as fsdp1
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    monkeypatch.setattr(FullyShardedDataParallel, "__init__", FullyShardedDataParallel.__init__)
    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        def build():
            model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.nn.Linear(4, 1))
            return FullyShardedDataParallel(model, device_id=torch.device("cpu"), backward_prefetch=None,
                                            auto_wrap_policy=ModuleWrapPolicy({torch.nn.Sequential}))

        plain = build()
        assert plain.backward_prefetch is None and plain.forward_prefetch is False
        want(runtime, "fsdp.prefetch")
        patch_fsdp.install(torch, runtime)
        patch_fsdp._patch_fsdp1(fsdp1, runtime)  # the import hook's call: torch.distributed.fsdp is imported already
        model = build()
        units = [m for m in model.modules() if isinstance(m, FullyShardedDataParallel)]
        assert len(units) == 2 and all(u.backward_prefetch == BackwardPrefetch.BACKWARD_PRE and u.forward_prefetch
                                       for u in units)
        model(torch.randn(2, 4)).sum().backward()
        # One record, at the user's call, with what the job asked for.
        assert [(e["set"], e["was"]) for e in runtime.applied] == [
            ({"backward_prefetch": {"code": "BackwardPrefetch.BACKWARD_PRE"}, "forward_prefetch": True},
             {"backward_prefetch": None, "forward_prefetch": False})]
        # The permanent change, written into a call like the user's.
        import ast

        from torchdoctor.remedies.suggest import edited_call
        src = b"m = FSDP(model, backward_prefetch=None)\n"
        call = ast.parse(src).body[0].value
        assert edited_call(src, call, runtime.applied[0]["set"]) == (
            b"m = FSDP(model, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True)\n")
    finally:
        dist.destroy_process_group()


_MMAPPED_PROBE = """
import ctypes, json, os, sys
from torchdoctor.remedies import patch_flags
from torchdoctor.remedies.catalogue import parse
from torchdoctor.remedies.runtime import Runtime

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def mmapped(size):
    # glibc keeps a chunk's size just before it; bit 2 (IS_MMAPPED) marks a block served by mmap.
    ptr = libc.malloc(size)
    flag = bool(ctypes.c_size_t.from_address(ptr - ctypes.sizeof(ctypes.c_size_t)).value & 2)
    libc.free(ptr)
    return flag

before = mmapped(1 << 20)
rt = Runtime()
if sys.argv[1] == "on":
    spec, _ = parse("memory.host_allocator")
    rt.specs[spec.id] = spec
patch_flags.host_allocator(rt)
after = mmapped(4 << 20)
print(json.dumps({"before": before, "after": after, "above_max": mmapped(40 << 20),
                  "above_pad": mmapped(300 << 20), "applied": rt.applied,
                  "env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}}))
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc malloc's thresholds")
def test_host_allocator_serves_mib_blocks_from_the_heap_here_and_in_the_processes_it_starts() -> None:
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}

    def probe(mode: str) -> dict:
        out = subprocess.run([sys.executable, "-c", _MMAPPED_PROBE, mode], env=env, capture_output=True,
                             text=True, timeout=60, check=True)
        return json.loads(out.stdout.splitlines()[-1])

    off, on = probe("off"), probe("on")
    # A fresh process maps a 1 MiB block (glibc's threshold starts at 128 KiB) and unmaps it on free,
    # which raises the threshold to 1 MiB: a 4 MiB block is mapped (and unmapped) again ...
    assert off["before"] and off["after"] and off["applied"] == []
    assert on["before"] and not on["after"]  # ... but not after mallopt: from the heap, kept when freed
    # A block above glibc's largest threshold (32 MiB) is mapped, unless the heap's free top holds it:
    # the top pad kept 256 MiB free there when the 4 MiB block grew the heap.
    assert off["above_max"] and not on["above_max"]
    # A block larger than the pad (several live at once: word_language_model's 81 MB logits and
    # gradients) is served from the heap too: no block is mapped at all.
    assert off["above_pad"] and not on["above_pad"]
    assert on["env"] == {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "268435456",
                         "MALLOC_TOP_PAD_": "268435456", "MALLOC_MMAP_MAX_": "0"}
    (entry,) = on["applied"]
    assert entry["id"] == "memory.host_allocator" and entry["target"] == "environment"


def test_host_allocator_keeps_a_jobs_own_allocator(runtime: Runtime, monkeypatch) -> None:
    from torchdoctor.advice.host_allocator import ENV

    for key in ENV:  # another test in this process may have applied the remedy
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    patch_flags.host_allocator(want(runtime, "memory.host_allocator"))
    assert not runtime.applied and "jemalloc" in runtime.skipped["memory.host_allocator"]
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ


def _ops(fn) -> set[str]:
    from torch.profiler import profile

    with profile() as p:
        fn()
    return {e.key for e in p.key_averages()}


def test_contiguous_input_gives_a_frozen_weight_s_linear_one_mm(runtime: Runtime) -> None:
    """torchtune's LoRA output: a sequence chunk of the last hidden state against the frozen tied embedding. torch
    computes it as a bmm over the weight copied per batch row; the remedy computes one mm, the same values."""
    from torchdoctor.remedies import patch_matmul

    torch.manual_seed(0)
    w = torch.randn(4096, 64, dtype=torch.bfloat16)  # frozen; a bf16 bmm copies its expanded operand on a CPU
    h = torch.randn(4, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    chunk = h.chunk(4, dim=1)[1]
    one = h[:1].chunk(4, dim=1)[1]  # a batch of one: contiguous, and matmul still does not fold it
    assert one.is_contiguous() and not patch_matmul.folds(one)
    plain, plain_one = torch.nn.functional.linear(chunk, w), torch.nn.functional.linear(one, w)
    assert {"aten::bmm", "aten::copy_"} <= _ops(lambda: torch.nn.functional.linear(chunk, w))
    assert "aten::bmm" in _ops(lambda: torch.nn.functional.linear(one, w))
    trained = w.clone().requires_grad_(True)
    as_torch_does = _ops(lambda: torch.nn.functional.linear(chunk, trained))  # folded by torch itself
    patch_matmul.install(torch, want(runtime, "matmul.contiguous_input"))
    layer = torch.nn.Linear(64, 4096, bias=False, dtype=torch.bfloat16)
    layer.weight.requires_grad_(False)
    layer.weight.copy_(w)
    got = layer(chunk)  # nn.Linear goes through F.linear
    torch.testing.assert_close(got, plain)
    torch.testing.assert_close(torch.nn.functional.linear(one, w), plain_one)
    for x in (chunk, one):
        ops = _ops(lambda x=x: torch.nn.functional.linear(x, w))
        assert "aten::bmm" not in ops and "aten::mm" in ops
    assert runtime.applied[0]["id"] == "matmul.contiguous_input"
    got.sum().backward()  # the input's gradient flows through the reshape
    assert h.grad is not None and h.grad[:, 8:16].abs().sum() > 0 and h.grad[:, :8].abs().sum() == 0
    # Left as they are: an input matmul folds (a last-dim slice), and a weight that needs a gradient.
    sliced = torch.randn(4, 8, 32, dtype=torch.bfloat16)[..., :16]
    assert patch_matmul.folds(sliced)
    assert "aten::copy_" not in _ops(lambda: torch.nn.functional.linear(sliced, w[:, :16]))
    assert _ops(lambda: torch.nn.functional.linear(chunk, trained)) == as_torch_does
    # A bias that broadcasts against the 3-D output goes to torch as it is.
    wide = torch.randn(3, 8, 5)[:, :4]
    torch.testing.assert_close(torch.nn.functional.linear(wide, torch.randn(6, 5), torch.zeros(4, 6)).shape,
                               torch.Size([3, 4, 6]))
    # TorchScript still compiles modules that call F.linear (it keeps aten::linear for the wrapper).
    scripted = torch.jit.script(torch.nn.Linear(4, 4))
    assert scripted(torch.randn(2, 4)).shape == (2, 4)


def test_contiguous_input_steps_aside_when_the_job_quantizes_with_torch_ao_fx() -> None:
    """torch.ao's FX quantization builds patterns keyed on F.linear when prepare_fx runs: the call puts the original
    back and refuses the remedy first, and the linear is quantized as without it (a fresh process)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from torchdoctor.remedies import patch_matmul\n"
        "from torchdoctor.remedies.catalogue import parse\n"
        "from torchdoctor.remedies.runtime import Runtime\n"
        "orig = torch.nn.functional.linear\n"
        "rt = Runtime(); spec, _ = parse('matmul.contiguous_input'); rt.specs[spec.id] = spec\n"
        "patch_matmul.install(torch, rt)\n"
        "assert torch.nn.functional.linear is not orig\n"
        "# Per-sample gradients: torch's expanded weights key a __torch_function__ table on F.linear when they load,\n"
        "# after the remedy; the wrapper dispatches as itself, and they find their linear.\n"
        "from torch.nn.utils._per_sample_grad import call_for_per_sample_grads\n"
        "lin = torch.nn.Linear(5, 3)\n"
        "call_for_per_sample_grads(lin)(torch.randn(4, 5)).sum().backward()\n"
        "assert lin.weight.grad_sample.shape == (4, 3, 5)\n"
        "assert torch.nn.functional.linear is not orig and not rt.refused\n"
        "from torch.ao.quantization import get_default_qconfig_mapping\n"
        "from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx\n"
        "assert torch.nn.functional.linear is not orig and not rt.refused  # loaded, not used yet\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.w = torch.nn.Parameter(torch.randn(8, 8))\n"
        "    def forward(self, x):\n"
        "        return torch.nn.functional.linear(x, self.w)\n"
        "x = torch.randn(4, 8)\n"
        "excluded = torch.ao.quantization.QConfigMapping().set_object_type(torch.nn.functional.linear, None)\n"
        "assert torch.nn.functional.linear is orig and 'FX flow' in rt.refused['matmul.contiguous_input']\n"
        "from torch.ao.quantization.backend_config import get_native_backend_config\n"
        "bc = get_native_backend_config()  # built before prepare_fx, keyed on F.linear\n"
        "q = convert_fx(prepare_fx(M().eval(), get_default_qconfig_mapping('x86'), (x,), backend_config=bc),\n"
        "               backend_config=bc)\n"
        "assert 'quantized.linear' in str(q.code), q.code\n"
        "kept = convert_fx(prepare_fx(M().eval(), excluded, (x,)))\n"
        "assert 'quantized.linear' not in str(kept.code), kept.code  # the job excluded F.linear\n"

        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("ok"), out.stderr[-2000:]
