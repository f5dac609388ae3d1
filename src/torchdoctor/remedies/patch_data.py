"""DataLoader remedies: workers, persistent workers, prefetch depth, pinned memory.

One wrapper around ``DataLoader.__init__`` changes the arguments of each loader the job creates
(positional or keyword, also through subclasses calling ``super().__init__``). A loader the
changed arguments make invalid is built with the user's own arguments instead, and the remedy is
refused with torch's message.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from typing import Any

from ..advice.workers import WORKERS_PER_CPU_CAP
from ..callsite import editable_site
from . import runtime
from ._shim import kwargs_shim
from .catalogue import WITH_WORKERS_ONLY
from .runtime import Runtime

IDS = ("dataloader.workers", "dataloader.persistent_workers", "dataloader.prefetch", "dataloader.pin_memory")


def default_workers() -> int:
    """PL's suggested_max_num_workers: CPUs in the affinity mask // local ranks - 1, at least 1."""
    return max(1, runtime.cpus() // runtime.local_world_size() - 1)


def has_accelerator(torch: Any) -> bool:
    accel = getattr(torch, "accelerator", None)
    try:
        if accel is not None:
            return bool(accel.is_available())
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def plan(torch: Any, rt: Runtime, a: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """New values for the bound arguments ``a`` of one DataLoader, and which remedy set which."""
    new: dict[str, Any] = {}
    by: dict[str, str] = {}
    workers = a.get("num_workers", 0) or 0
    spec = rt.active("dataloader.workers")
    if spec is not None:
        want = int(spec.value) if spec.value else default_workers()
        if want and isinstance(a.get("dataset"), torch.utils.data.IterableDataset):
            rt.skip(spec.id, "the dataset is an IterableDataset: each worker would replay the whole "
                    "stream unless the dataset shards itself (a code change)")
        elif want > WORKERS_PER_CPU_CAP * runtime.cpus():
            # Latency-bound loading gains from more workers than CPUs (they mostly wait; torch only
            # warns beyond the CPUs), and `fix` measures it; beyond the advice's own cap a value is
            # a typo or a runaway, not a tuning.
            rt.refuse(spec.id, f"num_workers={want} is beyond {WORKERS_PER_CPU_CAP} per CPU of the "
                      f"{runtime.cpus()} CPU(s) in this process's affinity mask")
        elif workers == want or (workers and not spec.value):
            rt.skip(spec.id, f"the DataLoader already has num_workers={workers}")
        else:
            new["num_workers"], by["num_workers"] = want, spec.id
            if not want:  # torch refuses these without workers (DataLoader.__init__ raises ValueError)
                for key, off in WITH_WORKERS_ONLY.items():
                    if a.get(key) not in (None, False):
                        new[key], by[key] = off, spec.id
    workers = new.get("num_workers", workers)
    spec = rt.active("dataloader.persistent_workers")
    if spec is not None:
        if not workers:
            rt.skip(spec.id, "the DataLoader has no worker processes to keep alive (num_workers=0)")
        elif a.get("persistent_workers"):
            rt.skip(spec.id, "the DataLoader already has persistent_workers=True")
        else:
            new["persistent_workers"], by["persistent_workers"] = True, spec.id
    spec = rt.active("dataloader.prefetch")
    if spec is not None:
        current = a.get("prefetch_factor") or 2  # torch's default with workers
        want = int(spec.value) if spec.value else max(4, 2 * current)
        if not workers:
            rt.skip(spec.id, "prefetch_factor needs worker processes (num_workers=0)")
        elif want == a.get("prefetch_factor"):
            rt.skip(spec.id, f"the DataLoader already has prefetch_factor={want}")
        else:
            new["prefetch_factor"], by["prefetch_factor"] = want, spec.id
    spec = rt.active("dataloader.pin_memory")
    if spec is not None:
        if not has_accelerator(torch):
            rt.refuse(spec.id, "no accelerator: pinned memory only speeds up copies to a device")
        elif a.get("pin_memory"):
            rt.skip(spec.id, "the DataLoader already has pin_memory=True")
        else:
            new["pin_memory"], by["pin_memory"] = True, spec.id
    return new, by


def worker_init_told(arguments: dict[str, Any], new: dict[str, Any]) -> Any:
    """The loader's worker_init_fn told the remedy's worker count, when the library that builds the
    loader baked its own count into it; else None.

    mmengine's Runner.build_dataloader passes worker_init_fn=partial(worker_init_fn, num_workers=
    cfg.get('num_workers'), rank=..., seed=...) and each worker seeds itself with num_workers * rank
    + worker_id + seed (mmcv's and mmdet's older build_dataloader do the same): with num_workers
    changed under it, the partial still said None and every worker raised TypeError (mmengine's
    examples/distributed_training.py under `fix`: "the job failed with the remedies"). Told the new
    count, it seeds as the job does once its configuration says that count. A partial that names
    another count than the loader's own is the job's choice and is left alone."""
    if "num_workers" not in new:
        return None
    fn = arguments.get("worker_init_fn")
    if not isinstance(fn, functools.partial) or "num_workers" not in fn.keywords:
        return None
    if (fn.keywords["num_workers"] or 0) != (arguments.get("num_workers") or 0):  # None: the library's default, 0
        return None
    return functools.partial(fn.func, *fn.args, **{**fn.keywords, "num_workers": new["num_workers"]})


def install(torch: Any, rt: Runtime) -> None:
    if not any(rt.active(i) for i in IDS):
        return
    from torch.utils.data import dataloader

    # Loaders this remedy made persistent, and the call site of each (whose change the suggestion edits).
    kept_alive: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
    _patch_loader_class(torch, rt, dataloader.DataLoader, kept_alive)

    def stateful(cls: Any) -> None:
        # torchdata's StatefulDataLoader (torchtitan's) sets its attributes itself and never calls
        # DataLoader.__init__: `fix` called persistent workers on it a no-op ("the job never reached
        # what it changes").
        try:
            if cls is not None and "__init__" in cls.__dict__:
                _patch_loader_class(torch, rt, cls, kept_alive, stateful=True)
        except Exception as exc:
            rt.broken(IDS, exc)

    from torchdoctor.probe.imphook import when_class

    when_class("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader", dataloader.DataLoader,
               stateful)


def _patch_loader_class(torch: Any, rt: Runtime, cls: type,
                        kept_alive: weakref.WeakKeyDictionary[Any, str | None], stateful: bool = False) -> None:
    """The remedies on ``cls.__init__`` (DataLoader's, or a subclass's that does not call it), and on
    its ``__iter__`` the persistent workers' random-stream guard."""
    orig = cls.__init__
    sig = inspect.signature(orig)
    last: dict[str, Any] = {}

    def adjust(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        last.clear()
        bound = sig.bind(*args, **kwargs)
        inherit(bound.arguments)
        new, by = plan(torch, rt, bound.arguments)
        if not new:
            return None
        plain = (bound.args, bound.kwargs)
        was = {k: bound.arguments.get(k) for k in new}
        seeding = worker_init_told(bound.arguments, new)
        bound.arguments.update(new)
        if seeding is not None:  # not a setting of the remedy's: the library's own seeding, kept true
            bound.arguments["worker_init_fn"] = seeding
        where = runtime.creation_site(type(bound.arguments["self"]).__name__)
        target, site = editable_site(where, "DataLoader", new)
        last.update(new=new, by=by, site=site, self=weakref.ref(bound.arguments["self"]))
        if "persistent_workers" in new:
            kept_alive[bound.arguments["self"]] = site
        for key, value in new.items():
            rt.did(by[key], target, site, {key: value}, {key: was[key]}, library=where.library, entry_call=where.entry,
                   library_site=where.library_site)
        return (bound.args, bound.kwargs), plain

    def inherit(arguments: dict[str, Any]) -> None:
        """A persistent loader a library builds over the dataset of one this remedy made persistent,
        with as many workers, is that library's copy of it, iterated in its place, and answers for
        its site: accelerate's ``prepare`` builds a DataLoaderShard from the user's loader's
        attributes (persistent_workers included) and the job iterates only that; `fix` had left the
        user's line out as 'not iterated a second time' (huggingface/accelerate's cv_example, three
        epochs). A loader the user's own code builds over the same dataset is the user's own."""
        dataset = arguments.get("dataset")
        if not kept_alive or dataset is None or not arguments.get("persistent_workers"):
            return
        try:
            source = next((loader for loader in list(kept_alive.keys())
                           if getattr(loader, "dataset", None) is dataset
                           and getattr(loader, "num_workers", None) == arguments.get("num_workers")), None)
            if source is not None and runtime.creation_site(type(arguments["self"]).__name__).library:
                kept_alive[arguments["self"]] = kept_alive[source]
        except (RuntimeError, TypeError):  # another thread building a loader; a loader type without hash
            pass

    def rejected(exc: BaseException) -> None:
        # torch refused the combination: this loader is built as the user wrote it.
        with contextlib.suppress(Exception):
            kept_alive.pop(last["self"](), None)
        for key, rid in last.get("by", {}).items():
            rt.applied[:] = [e for e in rt.applied if not (e["id"] == rid and e["site"] == last["site"])]
            rt.refuse(rid, f"DataLoader(..., {key}={last['new'][key]!r}) failed: {type(exc).__name__}: {exc}")

    cls.__init__ = kwargs_shim(orig, adjust, rejected, lambda exc: rt.broken(IDS, exc))
    if rt.active("dataloader.persistent_workers"):
        rt.track("dataloader.persistent_workers")
        _same_random_stream(torch, rt, cls, kept_alive, stateful)


def _same_random_stream(torch: Any, rt: Runtime, cls: type, kept_alive: weakref.WeakKeyDictionary[Any, str | None],
                        stateful: bool = False) -> None:
    """A new epoch of a loader the remedy keeps alive draws the random number a new iterator draws.

    Without persistent workers, every ``iter(loader)`` builds an iterator whose constructor draws a
    base seed for the workers from the loader's generator (the global one by default), before the
    sampler draws its shuffle seed; a persistent loader only resets its iterator and skips that draw.
    So from the second epoch on the job's random stream, and with it a shuffled sampler's order,
    would differ from the job without the remedy (pytorch/examples super_resolution: `fix` rejected
    the remedy, "losses differ first at step 50", its first step of epoch 2) and the A/B would
    compare other batches. Made permanent, persistent_workers=True shuffles later epochs differently
    from the job as it is, and as randomly: the suggested change says so.

    A second ``iter()`` is also where persistent workers first save anything: a loader iterated once
    (MONAI's tutorial checks its first batch with a loader of its own) would only keep idle worker
    processes, so its site is left out of the permanent change (``Runtime.exercised_at``).
    """
    orig_iter = cls.__iter__

    def __iter__(self: Any) -> Any:
        try:
            # torchdata's StatefulDataLoader: an iterator state_dict() built before the first epoch is
            # that epoch's own (it drew its seed); a new one of its iterators walks the sampler twice
            # (__init__ and its first _reset), a persistent reset once, and torchdata's RandomSampler
            # draws its permutation when walked.
            if (self in kept_alive and getattr(self, "_iterator", None) is not None
                    and not getattr(self, "_initial_iter_for_state_dict", False)):
                rt.exercised_at("dataloader.persistent_workers", kept_alive[self])
                torch.empty((), dtype=torch.int64).random_(generator=self.generator)
                if stateful:
                    iter(self._index_sampler)
        except Exception as exc:  # never the job's problem: its iterator is built as usual
            rt.broken(("dataloader.persistent_workers",), exc)
        return orig_iter(self)

    cls.__iter__ = __iter__
