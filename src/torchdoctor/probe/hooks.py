"""Glue between torch and the probe: which torch events are observed, and how.

=====================  =====================================================================
event                  mechanism
=====================  =====================================================================
batch wait             shim on ``_BaseDataLoaderIter.__next__`` (main thread only)
DataLoader config      shims on ``DataLoader.__init__`` (call site) and ``__iter__`` (facts, workers)
optimizer step         global ``register_optimizer_step_pre/post_hook``; shim on
                       ``Optimizer.__init__`` for the call site
zero_grad fills        shim on ``Optimizer.zero_grad``: who passes ``set_to_none=False``
backward               shim on ``torch.autograd.backward`` (``Tensor.backward`` calls it) and on
                       ``torch.autograd.grad`` (timed as backward; ends no step)
forward                hooks on the root modules, found by one scan of live objects after
                       step 0 (no global module hooks: they would slow every module call and
                       make torch.compile warn and recompile)
DDP                    shim on ``DistributedDataParallel.__init__``; logging data read at steps
autocast               shim on ``torch.amp.autocast_mode.autocast.__enter__``
host syncs             shims on ``Tensor.item``, ``Tensor.tolist``, ``Tensor.numpy``
foreign profiler       shims on profiler start: the probe's window yields to the job's profiler
anomaly-mode stacks    timer around ``torch.fx.traceback.format_stack`` (what anomaly mode calls
                       for every node the forward creates), active only while anomaly mode is on
checkpoint saves       shims on ``torch.save`` and, once the job imports DCP or safetensors, on
                       ``torch.distributed.checkpoint.save``/``async_save`` and
                       ``safetensors.torch.save_file``/``save_model`` (training thread only)
files loaded early     shims on ``torch.load`` and DCP's ``load``/``load_state_dict``: what the
                       training thread loads before step 0 ends (path, modification time)
DCP's optimizer init   shim on DCP's ``state_dict._init_optim_state``: the zero-lr ``step()`` it
                       runs to create the optimizer's state is no training step
=====================  =====================================================================

Every callback is guarded: an exception is recorded once (``errors.ERRORS``) and the site is
skipped from then on; the torch call itself always happens, with the caller's arguments.

None of it is seen by torch.compile (``unseen``): a hook or shim that Dynamo traces returns at
once under ``is_compiling()`` (folded to a constant: nothing enters the graph, no guard on probe
state), and their frames are never handed to Dynamo when torch calls them eagerly. The cost:
inside a compiled region (a ``Module.compile``'d forward, a compiled optimizer step) the probe
does not time or count what the compiled code runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from torchdoctor.callsite import Site, library_of
from torchdoctor.facts import ZeroGradFacts
from torchdoctor.probe import batches, collect, imphook, shims, unseen, workers
from torchdoctor.probe.clock import Phase, Source
from torchdoctor.probe.core import Probe, perf_counter
from torchdoctor.probe.errors import ERRORS, fault_point
from torchdoctor.probe.summary import DDPRecord, LoaderRecord, code_of

_MAX_LOADERS = 20
# Steps in a row another optimizer takes, the step-marking one taking none, before it marks steps.
_TAKE_OVER_STEPS = 2
BROKEN = ERRORS.broken


MAX_LOADED_FILES = 16  # a dataset of .pt files would list thousands: the first ones say enough


def _failed(where: str) -> Callable[[BaseException], None]:
    return lambda exc: ERRORS.record(where, exc)


def _guard(where: str, fn: Callable[..., None]) -> Callable[..., None]:
    """Wrap a hook torch calls directly: it returns None whatever happens.

    Traced by Dynamo (an optimizer hook inside a compiled ``step``) it folds away before it reads
    anything (a read of ``BROKEN`` would become a guard); called eagerly, Dynamo never sees it.
    """
    is_compiling = unseen.compiling()

    def hook(*args: Any) -> None:
        if is_compiling() or where in BROKEN:
            return
        try:
            fn(*args)
        except Exception as exc:
            ERRORS.record(where, exc)

    unseen.hide(fn)
    return unseen.hide(hook)


def _anomaly_stacks(probe: Probe) -> None:
    """Time the stack traces autograd's anomaly mode records in the forward.

    With ``set_detect_anomaly(True)`` every graph node the forward creates stores the Python
    stack, which autograd gets by calling ``torch.fx.traceback.format_stack`` (looked up on the
    module at each call, so a wrapper there sees every one). The wrapper only adds a timer on the
    training thread while anomaly mode is on; under torch.compile (fx/Dynamo call it while
    tracing) and everywhere else it is a plain pass-through. Feature-detected.
    """
    import torch
    import torch.fx.traceback as fx_traceback

    orig = getattr(fx_traceback, "format_stack", None)
    enabled = getattr(torch, "is_anomaly_enabled", None)
    if orig is None or enabled is None or getattr(orig, "_torchdoctor_timed", False):
        return
    is_compiling = probe.is_compiling

    def timed() -> bool:
        if is_compiling() or "anomaly" in BROKEN or threading.get_ident() != probe.main_thread:
            return False
        try:
            fault_point("anomaly")
            return bool(enabled())
        except Exception as exc:
            ERRORS.record("anomaly", exc)
            return False

    def format_stack(*args: Any, **kwargs: Any) -> Any:
        if not timed():
            return without_own_frame(orig(*args, **kwargs))
        t0 = perf_counter()
        try:
            return without_own_frame(orig(*args, **kwargs))
        finally:
            try:
                probe.clock.add(Phase.ANOMALY_STACKS, perf_counter() - t0)
            except Exception as exc:  # never into autograd's call
                ERRORS.record("anomaly", exc)

    own_file = f'File "{format_stack.__code__.co_filename}"'

    def without_own_frame(stack: Any) -> Any:
        # torch drops only its own frame from the stack it records: drop this wrapper's too, or
        # anomaly mode's "Traceback of forward call" would show a torchdoctor line.
        if isinstance(stack, list) and stack and isinstance(stack[-1], str) and own_file in stack[-1]:
            return stack[:-1]
        return stack

    format_stack._torchdoctor_timed = True  # type: ignore[attr-defined]
    format_stack.__wrapped__ = orig  # type: ignore[attr-defined]
    unseen.hide_all(timed, format_stack)
    fx_traceback.format_stack = format_stack


def install_all(probe: Probe) -> None:
    """Install every observer; one that cannot be installed is recorded and the others still are."""
    for name, install in (
        ("dataloader", _dataloader),
        ("optimizer", _optimizer),
        ("backward", _backward),
        ("ddp", _ddp),
        ("autocast", _autocast),
        ("syncs", _syncs),
        ("profiler", _profiler_guard),
        ("distributed", _distributed),
        ("anomaly", _anomaly_stacks),
        ("checkpoint", _checkpoints),
        ("graphs", _graphs),
    ):
        try:
            fault_point(f"install.{name}")
            install(probe)
        except Exception as exc:
            ERRORS.record(f"install.{name}", exc)


def _site_recorder(probe: Probe, where: str) -> tuple[Callable[..., Any], Callable[..., None]]:
    """before/after pair remembering the user's call site of a constructor."""

    def before(args: tuple[Any, ...]) -> Site | None:
        called = type(args[0]).__name__ if args else None
        return probe.creation_site(2, called)  # frames: creation_site <- before <- shim <- caller

    def after(site: Site | None, args: tuple[Any, ...], result: Any) -> None:
        if result is not shims.FAILED and args:
            fault_point(where)
            probe.sites[args[0]] = site or Site()

    return before, after


def _loader_site(probe: Probe, loader: Any) -> Site | None:
    """The loader's creation site; for one a library re-created from the user's (same dataset),
    the user's DataLoader(...) line, which the library copies its settings from."""
    site = probe.sites.get(loader)
    # The Trainer builds its loader from TrainingArguments, not from a loader of the user's: a
    # DataLoader the user made over the same dataset elsewhere is not where its settings live.
    if site is None or site.user is not None or site.library == "transformers":
        return site
    dataset = getattr(loader, "dataset", None)
    entry = probe.dataset_sites.get(id(dataset)) if dataset is not None else None
    if entry is None or entry[0]() is not dataset:  # an id a freed dataset left behind
        return site
    first = entry[1]
    if first.user is not None:
        return replace(site, user=first.user)
    # A library's loader re-created by another package's code (denoising-diffusion-pytorch's Trainer
    # builds DataLoader(..., num_workers=cpu_count()) and accelerate's prepare() copies it; timm's
    # create_loader and then the user's accelerator.prepare): the first one's origin, where its
    # settings are. A second loader the same code builds is its own.
    here, there = (library_of(s.library_site.rpartition(":")[0]) if s.library_site else None for s in (site, first))
    if first is site or here == there or there is None:
        return site
    return replace(site, library=first.library, library_site=first.library_site, caller=first.caller,
                   entry=first.entry, entry_params=first.entry_params)


def _shim_once(cls: Any, name: str, before: Callable[..., Any], after: Callable[..., None], where: str) -> None:
    """``cls.<name>`` (a class's or a module's own attribute) wrapped by shims.around, once: a second
    call (the same hook installed again, the same module imported again) finds the mark and leaves it."""
    orig = cls.__dict__.get(name)
    if not callable(orig) or getattr(orig, "_torchdoctor_shim", False):
        return
    shim = shims.around(orig, before, after, _failed(where))
    shim._torchdoctor_shim = True  # type: ignore[attr-defined]
    setattr(cls, name, shim)


def _register_iterator(probe: Probe, key: Any, it: Any, facts: Callable[[], Any]) -> LoaderRecord | None:
    """The loader record of ``key`` (made from ``facts()`` the first time), tied to its iterator ``it``
    for the batch shim, with the iterator's worker pids; None past _MAX_LOADERS."""
    record = probe.loader_by_obj.get(key)
    if record is None:
        if len(probe.loaders) >= _MAX_LOADERS:
            return None
        record = facts()
        probe.loader_by_obj[key] = record
        probe.loaders.append(record)
    probe.loader_by_iter[it] = record
    probe.last_iter = None  # the next batch looks the iterator up again
    for worker in getattr(it, "_workers", None) or ():
        if getattr(worker, "pid", None):
            record.add_worker(worker.pid)
    return record


def _dataloader(probe: Probe) -> None:
    from torch.utils.data import dataloader as dl

    loader_cls, base_iter = dl.DataLoader, dl._BaseDataLoaderIter
    from torch.utils.data._utils import worker

    _quiet_workers(probe, worker)
    before, record = _site_recorder(probe, "dataloader.init")

    def after(site: Site | None, args: tuple[Any, ...], result: Any) -> None:
        record(site, args, result)
        # The first user's loader over a dataset, else the first a library builds: a library that
        # re-creates it (accelerate's prepare) copies its settings, which live there.
        if result is not shims.FAILED and args and site is not None and (site.user or site.library_site):
            dataset = getattr(args[0], "dataset", None)
            if dataset is None:
                return
            sites = probe.dataset_sites
            for key in [k for k, (ref, _) in sites.items() if ref() is None]:
                del sites[key]  # freed datasets: their ids may be reused
            first = sites.get(id(dataset))
            if (first is None and len(sites) < _MAX_LOADERS) or (first is not None and first[1].user is None
                                                                  and site.user):
                with contextlib.suppress(TypeError):  # a dataset without weak references: not linked
                    sites[id(dataset)] = (weakref.ref(dataset), site)

    def init_after(site: Site | None, args: tuple[Any, ...], result: Any) -> None:
        after(site, args, result)
        if result is not shims.FAILED and args:
            own_iter(type(args[0]))

    loader_cls.__init__ = shims.around(loader_cls.__init__, before, init_after, _failed("dataloader.init"))
    nesting = threading.local()

    def own_iter(cls: type) -> None:
        """A DataLoader subclass with an __iter__ of its own never runs DataLoader.__iter__ unless it
        calls it: torchdata's StatefulDataLoader (torchtitan's loader) builds and resets its iterators
        itself, so its epochs, its facts and its workers went unrecorded. Its __iter__ gets the same
        shim, once per class. In a chain of such calls (one calling DataLoader's) the innermost that
        returns an iterator records it, once; a wrapper around it (DGL's prefetching iterator) or a
        generator (a loader that yields from DataLoader.__iter__) records nothing of its own."""
        owner = next((c for c in cls.__mro__ if "__iter__" in c.__dict__), loader_cls)
        # A mixin before DataLoader in the MRO is no loader: its other users keep their __iter__.
        if owner is not loader_cls and issubclass(owner, loader_cls):
            _shim_once(owner, "__iter__", iter_before, iter_after, "dataloader.iter")

    def iter_after(t0: float | None, args: tuple[Any, ...], it: Any) -> None:
        probe.loader_setup -= 1
        nesting.depth -= 1
        inner_done = getattr(nesting, "done", False)
        if nesting.depth == 0:
            nesting.done = False
        # A generator __iter__ returns before it builds anything: the DataLoader.__iter__ it calls
        # later is the one that counts. A call around one that recorded (it returns that iterator,
        # or a wrapper of it) adds nothing.
        if it is shims.FAILED or "dataloader.iter" in BROKEN or inspect.isgenerator(it) or inner_done:
            return
        if nesting.depth > 0:
            nesting.done = True
        fault_point("dataloader.iter")
        if t0 is not None:  # an epoch starts (main thread): its cost, and the mark DL-6/DL-1 read
            _epoch_start(probe, t0)
        loader = args[0]
        if not isinstance(it, base_iter):
            # An iterator around torch's (PyG's DataLoaderIterator from _get_iterator): batches come
            # from the one it holds, which the batch shim sees.
            held = getattr(it, "__dict__", None) or {}
            it = next((v for v in list(held.values()) if isinstance(v, base_iter)), it)
        record = _register_iterator(probe, loader, it, lambda: LoaderRecord(
            collect.dataloader_facts(loader, _loader_site(probe, loader)), collate_code=code_of(loader.collate_fn)))
        if record is not None and record.collate_code is not None:
            _time_collate(probe, it, record)
        if record is not None and record.rng_tries < workers.SAMPLE_RNG:
            _check_draws(probe, it, record)

    def iter_before(args: tuple[Any, ...]) -> Any:
        probe.loader_setup += 1  # torch's own .item() on the loader's seed is not the job's sync
        nesting.depth = getattr(nesting, "depth", 0) + 1
        return perf_counter() if threading.get_ident() == probe.main_thread else None

    _shim_once(loader_cls, "__iter__", iter_before, iter_after, "dataloader.iter")
    # Where DataLoader.__iter__ builds a new iterator, and what a loader that never runs it calls
    # (ultralytics' InfiniteDataLoader: one iterator for every epoch, built inside a generator).
    _shim_once(loader_cls, "_get_iterator", iter_before, iter_after, "dataloader.iter")

    def on_stateful(cls: type) -> None:
        """torchdata's StatefulDataLoader (torchtitan's) subclasses DataLoader but never calls its
        __init__ (it sets every attribute itself), so neither its site nor its own __iter__ was seen."""
        _shim_once(cls, "__init__", before, after, "dataloader.init")
        own_iter(cls)
        # Its workers run torchdata's own loop, which its module imported by name.
        home = sys.modules.get(cls.__module__.rpartition(".")[0] + ".worker")
        if home is not None:
            _quiet_workers(probe, home, sys.modules.get(cls.__module__))

    imphook.when_class("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader", loader_cls,
                       _guard("dataloader.torchdata", on_stateful))

    def next_before(args: tuple[Any, ...]) -> tuple[float, bool | None] | None:
        if "dataloader.next" in BROKEN or threading.get_ident() != probe.main_thread:
            return None
        fault_point("dataloader.next")
        ready = None
        if probe.next_depth == 0:
            now = perf_counter()
            probe.activity(now)
            probe.boundary(Source.DATALOADER, now)
            it = args[0]
            last = probe.last_iter
            if last is None or last() is not it:  # a weak-dict lookup only when the iterator changes
                # Held weakly: an iterator the job drops (a sanity check's one batch) is freed, and
                # its dataset's stream closed, when the job lets go of it, not at our next batch.
                probe.last_iter, probe.last_iter_record = weakref.ref(it), probe.loader_by_iter.get(it)
            probe.current_loader = probe.last_iter_record
            if (probe.current_loader is not None and probe.current_loader.facts.num_workers
                    and "dataloader.batch_ready" not in BROKEN):
                ready = batch_ready(it)
        probe.next_depth += 1
        return perf_counter(), ready

    def next_after(t: tuple[float, bool | None] | None, args: tuple[Any, ...], result: Any) -> None:
        if t is None:
            return
        probe.next_depth -= 1
        if probe.next_depth:
            return
        t0, ready = t
        seconds = perf_counter() - t0
        probe.clock.add(Phase.DATALOADER, seconds)
        if ready is not True:
            probe.clock.add(Phase.DATA_UNREADY, seconds)
        record, probe.current_loader = probe.current_loader, None
        if record is None or result is shims.FAILED:
            return
        record.drawn += 1
        if not probe.window_active:
            if len(record.batch_samples) < batches.BATCH_SAMPLES and "dataloader.fingerprint" not in BROKEN:
                try:
                    fp = batches.fingerprint(probe.torch, result)
                except Exception as exc:  # the batch is the job's: never let reading it break the loader's timing
                    ERRORS.record("dataloader.fingerprint", exc)
                    fp = None
                if fp is not None:
                    record.batch_samples.append((record.drawn, fp))
            record.batches += 1
            record.next_s += seconds
            if ready is not None:
                record.polled_batches += 1
                if ready:
                    record.ready_batches += 1
                    record.ready_s += seconds
            probe.clock.samples += record.facts.batch_size or 0

    base_iter.__next__ = shims.around(base_iter.__next__, next_before, next_after, _failed("dataloader.next"))
    _foreign_loaders(probe, loader_cls, (dl._SingleProcessDataLoaderIter, dl._MultiProcessingDataLoaderIter))
    imphook.when_imported("fastai.data.load", _guard("dataloader.fastai", lambda m: _fastai_loader_sites(probe, m)))


def _foreign_loaders(probe: Probe, loader_cls: type, iterators: tuple[type, ...]) -> None:
    """Epochs of loaders that are not torch DataLoaders but draw from torch's iterators: fastai's
    DataLoader hands its ``_FakeLoader`` to ``_MultiProcessingDataLoaderIter`` itself, every epoch,
    and DataLoader.__iter__ never runs. Without the mark, a fastai job's refill at each epoch start
    (285 and 344 ms in the 'Is it a cat?' quick start, 2 ms a batch otherwise) read as 'the loader
    cannot keep up on average: add workers'. A torch DataLoader's iterator is marked by __iter__.
    On each concrete iterator's __init__, not the base class's: the base one returns before the
    workers start, so their start-up and their pids would be missed. ``depth``: a subclass of one
    calling the other's __init__ counts once."""
    depth = [0]

    def before(args: tuple[Any, ...]) -> float | None:
        if len(args) < 2 or isinstance(args[1], loader_cls) or "dataloader.foreign" in BROKEN or depth[0]:
            return None
        depth[0] += 1
        probe.loader_setup += 1  # torch's own .item() on the loader's seed is not the job's sync
        return perf_counter() if threading.get_ident() == probe.main_thread else -1.0

    def after(t0: float | None, args: tuple[Any, ...], result: Any) -> None:
        if t0 is None:
            return
        depth[0] -= 1
        probe.loader_setup -= 1
        if t0 < 0 or result is shims.FAILED:
            return
        fault_point("dataloader.foreign")
        _epoch_start(probe, t0)
        it, loader = args[0], args[1]
        owner = getattr(loader, "d", None) if type(loader).__name__ == "_FakeLoader" else None
        key = owner if owner is not None else loader
        _register_iterator(probe, key, it, lambda: LoaderRecord(
            collect.foreign_loader_facts(loader, owner, probe.sites.get(key))))

    for cls in iterators:
        cls.__init__ = shims.around(cls.__init__, before, after, _failed("dataloader.foreign"))


def _epoch_start(probe: Probe, t0: float) -> None:
    """An epoch starts on the training thread: its iterator's cost, and the mark DL-6/DL-1 read."""
    probe.clock.add(Phase.LOADER_ITER, perf_counter() - t0)
    probe.clock.add(Phase.EPOCH_STARTS, 1.0)


def _fastai_loader_sites(probe: Probe, module: Any) -> None:
    """Where each fastai DataLoader is built (fastai's own code, called from the user's line)."""
    cls = getattr(module, "DataLoader", None)
    if cls is not None:
        _shim_once(cls, "__init__", *_site_recorder(probe, "dataloader.fastai.init"), "dataloader.fastai.init")


def _quiet_workers(probe: Probe, home: Any, *users: Any) -> None:
    """Silence the probe's hot hooks in forked DataLoader workers.

    A forked worker inherits the patched ``Tensor.item``/``numpy``/``tolist`` and the probe,
    with the same thread id: its collate's conversions would run through the probe and be
    recorded as the training loop's. The worker entry point (``home._worker_loop``: torch's, or
    torchdata's own for its StatefulDataLoader) is wrapped so that a worker marks its probe as not
    the training loop, and measures its own batches instead (probe/workers.py). ``users`` are
    modules that imported the name and start workers with it. A spawned worker unpickles the entry
    point by reference (the wrapper keeps ``_worker_loop``'s module and name), i.e. its own
    interpreter's wrapper and probe. Feature-detected.
    """
    import functools

    loop = getattr(home, "_worker_loop", None)
    if loop is None or getattr(loop, "_torchdoctor_quiet", False):
        return

    @functools.wraps(loop)
    def _worker_loop(*args: Any, **kwargs: Any) -> Any:
        probe.main_thread = -1  # no thread has this id: every main-thread hook is a no-op
        args, kwargs = workers.instrument(probe, loop, args, kwargs)  # the worker's own time per batch
        try:
            return loop(*args, **kwargs)
        finally:
            workers.finish(probe)

    _worker_loop._torchdoctor_quiet = True  # type: ignore[attr-defined]
    for module in (home, *users):
        if getattr(module, "_worker_loop", None) is loop:
            module._worker_loop = _worker_loop


def batch_ready(it: Any) -> bool | None:
    """Whether the next batch of a worker iterator is already produced (None: cannot tell).

    Reads torch's private iterator state (torch.utils.data.dataloader
    _MultiProcessingDataLoaderIter): a batch that arrived out of order waits in ``_task_info``;
    otherwise something is ready when the data queue holds an item (a ``queue.Queue`` fed by the
    pin-memory thread, or the workers' multiprocessing pipe, polled without blocking).
    Feature-detected: any other shape of the iterator gives None, and marks the site broken (it is
    private state: a torch where it has another shape would fail the same way on every batch).
    """
    try:
        info = it._task_info.get(it._rcvd_idx)
        if info is not None and len(info) == 2:
            return True
        queue = it._data_queue
        reader = getattr(queue, "_reader", None)
        if reader is not None:
            return bool(reader.poll())
        return queue.qsize() > 0
    except Exception as exc:
        ERRORS.note(f"dataloader.batch_ready: private iterator state not readable on this torch ({exc!r})")
        BROKEN.add("dataloader.batch_ready")
        return None


def _time_collate(probe: Probe, it: Any, record: LoaderRecord) -> None:
    """Time the collate_fn of an in-process iterator (num_workers=0): the ``collate_ms`` fact.

    The iterator's fetcher calls ``self.collate_fn(data)`` (torch.utils.data._utils.fetch); we
    replace that attribute on this iterator's fetcher only, never the user's function, so the
    DataLoader and its workers are untouched. Feature-detected: without a fetcher, no timing.
    """
    fetcher = getattr(it, "_dataset_fetcher", None)
    collate = getattr(fetcher, "collate_fn", None)
    if collate is None or getattr(collate, "_torchdoctor_timed", False):
        return
    fault_point("dataloader.collate")

    def timed_collate(data: Any) -> Any:
        t0 = perf_counter()
        try:
            return collate(data)
        finally:
            if not probe.window_active:
                record.collate_s += perf_counter() - t0

    timed_collate._torchdoctor_timed = True  # type: ignore[attr-defined]
    fetcher.collate_fn = unseen.hide(timed_collate, recursive=False)  # it calls the user's collate


def _check_draws(probe: Probe, it: Any, record: LoaderRecord) -> None:
    """Whether an in-process loader's fetches (num_workers=0) draw random numbers (random
    augmentation): the ``dataset_random_draws`` fact, from its first SAMPLE_RNG fetches on the
    training thread, as the workers' probe checks theirs. With workers the same draws come from the
    workers' own streams, so ``fix``'s worker count changes the losses step by step by design
    (remedies/verdict.py).

    The fetch is wrapped on this iterator's fetcher only and unwrapped after SAMPLE_RNG tries; the
    wrapper holds the fetcher weakly, so an iterator dropped early is freed as before (a generator
    dataset's ``finally`` runs then, not at the next garbage collection). A fetch on another thread
    (a prefetching wrapper's) is not checked: the training thread's own draws would read as its."""
    fetcher = getattr(it, "_dataset_fetcher", None)
    # A plain method of the fetcher's class (torch's fetchers): called unbound with the fetcher.
    fetch = inspect.getattr_static(type(fetcher), "fetch", None)
    if (getattr(it, "_num_workers", None) != 0 or not isinstance(fetch, types.FunctionType)
            or "fetch" in getattr(fetcher, "__dict__", {"fetch": 0})):
        return
    fault_point("dataloader.draws")
    try:
        ref = weakref.ref(fetcher)
    except TypeError:  # a fetcher without weak references: not checked
        return

    def checked_fetch(index: Any) -> Any:
        this = ref()
        if this is None:  # only through a copy of this attribute that outlived its fetcher
            raise ReferenceError("the DataLoader fetcher this fetch belonged to is gone")
        if record.rng_tries >= workers.SAMPLE_RNG or threading.get_ident() != probe.main_thread:
            if record.rng_tries >= workers.SAMPLE_RNG:
                this.__dict__.pop("fetch", None)
            return fetch(this, index)
        record.rng_tries += 1
        before = workers.rng_states()
        out = fetch(this, index)
        after = workers.rng_states()
        if before is not None and after is not None:
            record.rng_checked += 1
            record.rng_drawn += before != after
        return out

    fetcher.fetch = unseen.hide(checked_fetch, recursive=False)  # it calls the dataset's code


def _optimizer(probe: Probe) -> None:
    from torch.optim import optimizer as optim

    before, after = _site_recorder(probe, "optimizer.init")
    optim.Optimizer.__init__ = shims.around(
        optim.Optimizer.__init__, before, after, _failed("optimizer.init")
    )
    starts: dict[int, tuple[float, float]] = {}
    known: weakref.WeakSet[Any] = weakref.WeakSet()

    def pre(opt: Any, args: Any, kwargs: Any) -> None:
        if not probe.on_training_thread():  # another thread's optimizer (Hogwild-style threads)
            return
        if probe.optimizer_state_init:  # DCP creating the optimizer's state: no step (_checkpoints)
            return
        fault_point("optimizer.pre")
        now = perf_counter()
        probe.activity(now)
        clock_acc = probe.clock.acc
        # Forward/backward run inside step() by closures (LBFGS) are not optimizer time.
        starts[id(opt)] = (now, clock_acc[Phase.FORWARD] + clock_acc[Phase.BACKWARD])
        probe.optimizer_depth += 1
        if opt not in known:
            known.add(opt)
            probe.optimizers.append(
                (weakref.ref(opt), collect.optimizer_facts(opt, probe.sites.get(opt)))
            )
            if probe.roots_attached:
                _wrapped_again(probe, opt)

    def post(opt: Any, args: Any, kwargs: Any) -> None:
        if threading.get_ident() != probe.main_thread or probe.optimizer_state_init:
            return
        fault_point("optimizer.post")
        now = perf_counter()
        start = starts.pop(id(opt), None)
        probe.optimizer_depth = max(0, probe.optimizer_depth - 1)
        clock_acc = probe.clock.acc
        if start is not None:
            nested = clock_acc[Phase.FORWARD] + clock_acc[Phase.BACKWARD] - start[1]
            probe.clock.add(Phase.OPTIMIZER, max(0.0, now - start[0] - nested))
        primary = probe.primary_optimizer() if probe.primary_optimizer is not None else None
        if primary is not opt:
            # With several optimizers, one marks steps: the first, while it keeps stepping (a
            # GAN's generator and discriminator alternate). One that steps twice while the
            # marker does not takes over: training moved on to it (layer by layer, or stages).
            same = probe.other_opt is not None and probe.other_opt() is opt
            probe.other_steps = probe.other_steps + 1 if same else 1
            probe.other_opt = weakref.ref(opt)
            if primary is None or probe.other_steps >= _TAKE_OVER_STEPS:
                probe.primary_optimizer, primary = weakref.ref(opt), opt
        if primary is opt:
            probe.other_steps, probe.other_opt = 0, None
            probe.boundary(Source.OPTIMIZER, now)

    optim.register_optimizer_step_pre_hook(_guard("optimizer.pre", pre))
    optim.register_optimizer_step_post_hook(_guard("optimizer.post", post))
    _zero_grad(probe, optim.Optimizer)
    imphook.when_imported("fastai.optimizer", _guard("optimizer.fastai", lambda m: _foreign_optimizer(
        probe, getattr(m, "Optimizer", None), "step", "optimizer.fastai", pre, post)))
    imphook.when_imported("keras.src.optimizers.base_optimizer", _guard("optimizer.keras", lambda m: _foreign_optimizer(
        probe, getattr(m, "BaseOptimizer", None) if _keras_on_torch() else None, "apply", "optimizer.keras", pre, post,
        library="keras")))


def _keras_on_torch() -> bool:
    """Keras runs on torch (KERAS_BACKEND=torch): with TensorFlow or JAX its optimizer's apply runs
    while a graph is traced, not once a step, and moves no torch tensor."""
    config = sys.modules.get("keras.src.backend.config")
    backend = getattr(config, "backend", None)
    return callable(backend) and backend() == "torch"


def _foreign_optimizer(probe: Probe, cls: Any, method: str, where: str, pre: Callable[..., None],
                       post: Callable[..., None], library: str | None = None) -> None:
    """An optimizer of a library's own, no torch.optim one: torch's step hooks never see it, so a
    job's steps ended at backward and its optimizer time, and the profiler's, counted as the training
    loop's own ('optimizer 0.0 ms'). ``cls.<method>`` gets the same hooks, and the annotation
    torch.optim writes around a step (``Optimizer.step#<class>.step``) for the trace's host split.

    - fastai's Optimizer.step (its default opt_func, Adam, is one): the "Is it a cat?" quick start.
    - Keras 3's optimizers on the torch backend, BaseOptimizer.apply (``model.fit`` calls it after
      ``loss.backward()``): keras.io's MNIST convnet, 13 ms of Adam a step counted as the loop's. A
      wrapper with an apply of its own (LossScaleOptimizer) steps once, through its inner optimizer's.

    ``library`` prefixes the class in the facts and the annotation ("keras.Adam"): Keras names its
    optimizers as torch.optim does, and torch.optim's advice (foreach=True) is not theirs."""
    if cls is None or not callable(getattr(cls, method, None)):
        return
    record_function = probe.torch.autograd.profiler.record_function
    named: weakref.WeakSet[Any] = weakref.WeakSet()  # optimizers whose facts carry the library's name

    def before(args: tuple[Any, ...]) -> Any:
        if where in BROKEN:
            return None
        opt = args[0]
        name = f"{library}.{type(opt).__name__}" if library else type(opt).__name__
        annotation = record_function(f"Optimizer.step#{name}.step")
        annotation.__enter__()
        try:
            pre(opt, (), {})
        except BaseException:
            annotation.__exit__(None, None, None)
            raise
        if library and opt not in named:  # pre() recorded its facts at its first step
            named.add(opt)
            for ref, facts in probe.optimizers:
                if ref() is opt:
                    facts.cls = name
        return opt, annotation

    def after(token: Any, args: tuple[Any, ...], result: Any) -> None:
        if token is None:
            return
        opt, annotation = token
        try:
            annotation.__exit__(None, None, None)
        finally:
            if result is shims.FAILED:  # a step that raised ends no step (torch's post hook never runs)
                probe.optimizer_depth = max(0, probe.optimizer_depth - 1)
            else:
                post(opt, (), {})

    _shim_once(cls, method, before, after, where)


# Optimizers whose zero_grad(set_to_none=False) call is recorded: one call each is enough.
_ZERO_GRAD_RECORDS = 4


def _zero_grad(probe: Probe, optimizer_cls: Any) -> None:
    """Who calls zero_grad with set_to_none=False: HO-10 sees the zero fills in the trace, and its
    advice depends on whether the user's line passed False or a library wrapping the optimizer did
    (Opacus' DPOptimizer.zero_grad defaults to False and forwards it)."""
    try:
        default = inspect.signature(optimizer_cls.zero_grad).parameters["set_to_none"].default
    except (KeyError, TypeError, ValueError):  # a torch without the argument: nothing to tell
        return
    seen: weakref.WeakSet[Any] = weakref.WeakSet()

    def called(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if "optimizer.zero_grad" in BROKEN:
            return
        value = kwargs.get("set_to_none", args[1] if len(args) > 1 else default)
        if value or not args or len(probe.zero_grad_fills) >= _ZERO_GRAD_RECORDS:
            return
        opt = args[0]
        # The training thread as known so far (not on_training_thread(): a zero_grad claims no role).
        if opt in seen or threading.get_ident() != probe.main_thread:
            return
        seen.add(opt)
        fault_point("optimizer.zero_grad")
        site = probe.creation_site(2)  # frames: creation_site <- called <- shim <- caller
        probe.zero_grad_fills.append(ZeroGradFacts(
            optimizer=type(opt).__name__, call_site=site.user, called_by=site.library,
            library_site=site.library_site, caller=site.caller, entry=site.entry))

    optimizer_cls.zero_grad = shims.before_call(optimizer_cls.zero_grad, called, _failed("optimizer.zero_grad"))


def _backward(probe: Probe) -> None:
    import torch.autograd as autograd

    def before(args: tuple[Any, ...]) -> float | None:
        if "backward" in BROKEN or not probe.on_training_thread():
            return None
        fault_point("backward")
        now = perf_counter()
        probe.activity(now)
        probe.bwd_depth += 1
        probe.bwd_calls += 1
        if probe.bwd_depth == 1 and args:
            probe.read_loss(args[0])
        return now

    def after(t0: float | None, args: tuple[Any, ...], result: Any) -> None:
        if t0 is None:
            return
        probe.bwd_depth -= 1
        if probe.bwd_depth == 0:
            now = perf_counter()
            probe.clock.add(Phase.BACKWARD, now - t0)
            # A backward inside optimizer.step (LBFGS's closure, called 20 times a step) ends
            # no step: counting it would number steps one way until the optimizer's first step
            # ends and then renumber them, discarding a profiler window already recorded.
            if result is not shims.FAILED and not probe.optimizer_depth:
                probe.boundary(Source.BACKWARD, now)

    autograd.backward = shims.around(autograd.backward, before, after, _failed("backward"))

    # torch.autograd.grad inside the step (a PINN's derivatives in its loss, a gradient penalty,
    # MAML's inner step) is backward work too; it ends no step and is no call of backward().
    def grad_before(args: tuple[Any, ...]) -> float | None:
        if "backward" in BROKEN or not probe.on_training_thread():
            return None
        probe.bwd_depth += 1
        return perf_counter()

    def grad_after(t0: float | None, args: tuple[Any, ...], result: Any) -> None:
        if t0 is None:
            return
        probe.bwd_depth -= 1
        if probe.bwd_depth == 0:
            probe.clock.add(Phase.BACKWARD, perf_counter() - t0)

    autograd.grad = shims.around(autograd.grad, grad_before, grad_after, _failed("backward"))


def _forward_hooks(probe: Probe) -> tuple[Callable[..., None], Callable[..., None]]:
    """Pre/post forward hooks that time the outermost module call (model, loss) of the main thread,
    and apart, the part of it run without autograd (an evaluation or a rollout; of it, apart again,
    that of modules that never ran with autograd)."""
    import torch

    is_compiling = probe.is_compiling
    grad_enabled = torch.is_grad_enabled
    # The modules whose forward ran with autograd (ids, a wrapped model's under its wrapper's: the
    # roots live as long as the job): the ones being trained. A forward without autograd of any
    # other (a DQN target network, a distillation teacher) is also timed apart, as "frozen".
    trained: set[int] = set()
    alias = probe.root_alias

    def pre(module: Any, args: Any) -> None:
        if is_compiling():  # traced by dynamo: fold away, add nothing to the graph
            return
        if "forward" in BROKEN or probe.bwd_depth or threading.get_ident() != probe.main_thread:
            return
        try:
            fault_point("forward")
            probe.fwd_depth += 1
            if probe.fwd_depth == 1:
                now = perf_counter()
                probe.activity(now)
                probe.fwd_t0 = now
                probe.fwd_calls += 1
                probe.fwd_grad = grad_enabled()
                key = alias.get(id(module), id(module))
                if probe.fwd_grad:
                    trained.add(key)
                    _grad_forward_input(probe, args)
                else:
                    probe.fwd_frozen = key not in trained
                    if probe.clock.index >= 1 and probe.inference_site is None:
                        # once each: the walk up the stack is cheap next to a forward
                        if not probe.fwd_frozen:
                            probe.inference_site = _call_chain(probe)
                            probe.inference_mode = torch.is_inference_mode_enabled()
                        elif probe.frozen_site is None:
                            probe.frozen_site = _call_chain(probe)
                            probe.frozen_mode = torch.is_inference_mode_enabled()
        except Exception as exc:
            ERRORS.record("forward", exc)

    def post(module: Any, args: Any, result: Any) -> None:
        if is_compiling():
            return
        if "forward" in BROKEN or probe.bwd_depth or threading.get_ident() != probe.main_thread:
            return
        if probe.fwd_depth > 0:
            probe.fwd_depth -= 1
            if probe.fwd_depth == 0:
                took = perf_counter() - probe.fwd_t0
                probe.clock.add(Phase.FORWARD, took)
                if not probe.fwd_grad:
                    probe.clock.add(Phase.INFERENCE, took)
                    if probe.fwd_frozen:
                        probe.clock.add(Phase.FROZEN_INFERENCE, took)
                    else:
                        _remember_nograd_input(probe, args, took)

    unseen.hide_all(pre, post)  # torch calls them eagerly around a compiled module's frames
    return pre, post


# Forwards without autograd remembered per step whose inputs stay alive (an evaluation loop over
# fresh batches frees each, and its entry goes with it): beyond this, the rest are not remembered.
_MAX_NOGRAD_INPUTS = 64
# Inputs of forwards with autograd remembered: when more, those freed are forgotten, then the oldest.
_MAX_GRAD_INPUTS = 256
# Where a failure to find a root's wrapped model again is recorded (it stops that search only).
_WRAPPED = "forward.wrapped"
# Where a failure to read a forward's input is recorded: apart from "forward", so that it stops this
# reading only, never the forward's timing.
_INPUTS = "forward.inputs"


def _first_input(args: Any) -> Any:
    """A forward's first input tensor: the first positional argument, or the first tensor value of a
    dict there (a tokenizer's batch); None without one."""
    import torch

    first = args[0] if isinstance(args, tuple) and args else None
    if isinstance(first, dict):
        first = next((v for v in list(first.values())[:4] if isinstance(v, torch.Tensor)), None)
    return first if isinstance(first, torch.Tensor) and first.layout is torch.strided else None


def _input_key(t: Any) -> tuple[Any, ...] | None:
    """What makes two input tensors the same input: memory, shape, strides (a slice of a batch taken
    again is another tensor object on the same memory). None for a tensor without memory of its own
    (torch.func's vmap and grad wrappers, a DTensor, a fake tensor): their data_ptr() raises."""
    try:
        return t.data_ptr(), t.device, tuple(t.shape), t.stride(), t.dtype
    except Exception:
        return None


def _owner(t: Any) -> Any:
    """The tensor whose storage ``t`` is (a slice's base), held weakly: while it lives, its memory
    cannot be a later batch's."""
    return t._base if t._base is not None else t


def _remember_nograd_input(probe: Probe, args: Any, took: float) -> None:
    """Remember a trained module's forward without autograd of this step by its input."""
    if _INPUTS in BROKEN:
        return
    try:
        first = _first_input(args)
        key = _input_key(first) if first is not None else None
        if key is None:
            return
        index = probe.clock.index
        kept = [e for e in probe.nograd_inputs if e[0] == index and e[2]() is not None]
        if len(kept) < _MAX_NOGRAD_INPUTS:
            kept.append((index, key, weakref.ref(_owner(first)), took))
        probe.nograd_inputs = kept
    except Exception as exc:
        ERRORS.record(_INPUTS, exc)


def _grad_forward_input(probe: Probe, args: Any) -> None:
    """A forward with autograd on an input that a forward without autograd of this step took makes
    that one the step's own, unless an earlier step trained on that input too: OpenCLIP's
    --accum-freq computes each micro-batch's features without autograd for the contrastive loss
    over all of them, then again with it (read as an evaluation after every step, 20% of it, with
    "run it less often" as the advice); PyG's gcn.py evaluates the full graph that every step trains
    on, an evaluation after every step indeed. Its time moves to the step's own forwards without
    autograd, once; not in the first step whose forwards the hooks see (nothing earlier to compare
    with). The input is remembered for later steps."""
    if _INPUTS in BROKEN:
        return
    try:
        first = _first_input(args)
        if first is None:
            return
        index = probe.clock.index
        owner = _owner(first)
        seen = probe.grad_inputs.get(id(owner))
        trained_before = seen is not None and seen[0] < index and seen[1]() is owner
        pending, key = probe.nograd_inputs, None
        for i, (at, k, ref, took) in enumerate(pending):
            if at != index or ref() is None:
                continue
            key = key or _input_key(first)  # built once, and only when this step has entries
            if key is None:
                break
            if k == key:
                del pending[i]
                first_step = probe.first_grad_step
                if first_step is not None and first_step < index and not trained_before:
                    probe.clock.add(Phase.FROZEN_INFERENCE, took)
                break
        if probe.first_grad_step is None:
            probe.first_grad_step = index
        if seen is None or seen[1]() is not owner:
            inputs = probe.grad_inputs
            if len(inputs) >= _MAX_GRAD_INPUTS:
                live = [(k, v) for k, v in inputs.items() if v[1]() is not None]
                inputs = dict(live[-(_MAX_GRAD_INPUTS // 2):])
            inputs[id(owner)] = (index, weakref.ref(owner))
            probe.grad_inputs = inputs
    except Exception as exc:
        ERRORS.record(_INPUTS, exc)


class _Portable(functools.partial):
    """A probe hook that pickles as a no-op of the standard library: a model pickled with it (raw
    ``pickle.dump``, a spawned worker) loads anywhere, torchdoctor installed or not, and its hook
    then only raises an audit event nobody listens to (``sys.audit`` returns None)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return functools.partial, (sys.audit, STAND_IN)


# The audit event a pickled (or deep-copied) probe hook raises instead of timing anything.
STAND_IN = "torchdoctor.detached_probe_hook"


def _ours(value: Any, hooks: tuple[Any, ...]) -> bool:
    """A probe hook, or the stand-in a copy of one became."""
    if any(value is h for h in hooks):
        return True
    return type(value) is functools.partial and value.func is sys.audit and value.args == (STAND_IN,)


def attach_root_hooks(probe: Probe) -> None:
    """Time the forward of the top-level modules that hold trainable parameters.

    Run once, at the end of step 0, when the model exists. The modules are found by one scan of
    the garbage collector's objects, so nothing is patched on ``nn.Module`` and no global module
    hook is ever installed: global hooks make ``torch.compile`` warn and, once removed, recompile
    (dynamo guards on them). A module is a root when no other module holds it as a child.
    """
    import gc

    import torch

    module_cls, optimizer_cls = torch.nn.Module, torch.optim.Optimizer
    # type(), not isinstance(): isinstance reads __class__, which proxies and deprecated
    # objects answer with an exception or a warning.
    modules, optimizers = [], []
    for obj in gc.get_objects():
        kind = type(obj)
        if issubclass(kind, module_cls):
            modules.append(obj)
        elif issubclass(kind, optimizer_cls):
            optimizers.append(obj)
    children = {id(child) for m in modules for child in m.children()}
    pre, post = (_Portable(f) for f in _forward_hooks(probe))
    # Step 0 may close at its backward, before the optimizer's first step: the optimizers that exist.
    optimized = [_optimized_params([opt]) for opt in optimizers]
    roots = []
    for module in modules:
        if id(module) in children or not any(p.requires_grad for p in module.parameters()):
            continue
        if not _hook_pair(probe, module, pre, post):
            # TorchScript refuses forward hooks (RuntimeError): one such root took every root's
            # timing, and the step boundary's housekeeping, down with it.
            probe.script_roots += 1
            continue
        roots.append(weakref.ref(module))
        inner = _wrapped_model(module, optimized)
        if inner is not None and _hook_pair(probe, inner, pre, post):
            # The loop may call the wrapped model itself (timm evaluates the model its training
            # task wraps; an evaluation calls DDP's .module): its forward is the model's too.
            # Inside the wrapper's forward the nested call counts once (the depth counter).
            probe.root_alias[id(inner)] = id(module)
    probe.roots = roots
    probe.root_hook_fns = (pre, post)
    # The model's device while it surely exists: a job whose model lives inside main() has none
    # left when its summary is written at exit, and would read as a CPU job.
    try:
        from .collect import model_device_kind

        probe.root_device_kind = model_device_kind([m for m in (r() for r in roots) if m is not None])
    except Exception as exc:
        ERRORS.record("device", exc)
    if probe.root_hooks:
        _hooks_never_travel(probe, torch)


# Optimizers whose first step looks again for the roots' wrapped models: a job that builds a new
# optimizer every step must not pay for a walk over its modules every step.
_MAX_REWRAPS = 4


def _wrapped_again(probe: Probe, opt: Any) -> None:
    """At an optimizer's first step, the model each root wraps, found again now that gradients and
    the optimizer exist: the roots go on when step 0 first closes, which may be before training
    (sentence-transformers' example evaluates first, and its encode() iterates a DataLoader), when
    every parameter of the loss, its guide model's too, only required grad. For the first
    _MAX_REWRAPS optimizers."""
    if not probe.root_hook_fns or "forward" in BROKEN or _WRAPPED in BROKEN or probe.rewraps >= _MAX_REWRAPS:
        return
    probe.rewraps += 1
    try:
        wrapped = set(probe.root_alias.values())
        hooked = {id(m) for ref, *_ in probe.root_hooks if (m := ref()) is not None}
        pre, post = probe.root_hook_fns
        optimized = [_optimized_params([opt])]
        for ref in probe.roots:
            root = ref()
            if root is None or id(root) in wrapped:
                continue
            inner = _wrapped_model(root, optimized)
            if inner is not None and id(inner) not in hooked and _hook_pair(probe, inner, pre, post):
                probe.root_alias[id(inner)] = id(root)
    except Exception as exc:
        ERRORS.record(_WRAPPED, exc)


def _script_module_class(torch: Any) -> type | None:
    """torch.jit.ScriptModule, or None where this torch has none (then nothing is skipped)."""
    script = getattr(getattr(torch, "jit", None), "ScriptModule", None)
    return script if isinstance(script, type) else None


def _hook_pair(probe: Probe, module: Any, pre: Any, post: Any) -> bool:
    """Put the forward timing hooks on `module`, both or neither, and list them for removal. False
    for a TorchScript module, which refuses hooks (RuntimeError): nothing is put on it."""
    script = _script_module_class(sys.modules.get("torch"))
    if script is not None and isinstance(module, script):
        return False
    a = module.register_forward_pre_hook(pre)
    try:
        b = module.register_forward_hook(post, always_call=True)
    except Exception:
        a.remove()  # never a pre hook without its post: the depth counter would drift
        raise
    probe.root_hooks.append((weakref.ref(module), a.id, b.id))
    return True


def _optimized_params(optimizers: list[Any]) -> set[int]:
    """Ids of the parameters that ``optimizers`` update."""
    out: set[int] = set()
    for opt in optimizers:
        for group in getattr(opt, "param_groups", None) or ():
            out.update(id(p) for p in group.get("params", ()))
    return out


def _wrapped_model(module: Any, optimizers: Sequence[set[int]] = ()) -> Any:
    """The child that holds WRAPPED_SHARE of `module`'s trained parameters (the model a DDP, a
    training task or a LightningModule wraps), or None. Trained: those that require grad, less
    those without a gradient that share an optimizer (``optimizers``: each one's parameter ids)
    with parameters that have one. sentence-transformers' losses hold the model and, for
    GISTEmbedLoss, a guide model run under no_grad, whose parameters require grad and sit in the
    trainer's optimizer (it takes the loss's parameters) but never get a gradient: the model held
    83% of them, so its own calls outside the loss (the evaluator's encode(), 3.1 s of each 3.5 s
    evaluation) were not timed and read as the loop's Python. A parameter whose own optimizer
    holds no gradient at the moment (a GAN's or an actor-critic's other half, its gradients
    cleared) still counts: the container's children are then all the model. Not under
    torch.compile's wrapper, nor for a module compiled in place, whose forward runs compiled:
    hooks there would only be traced."""
    if hasattr(module, "_orig_mod") or getattr(module, "_compiled_call_impl", None) is not None:
        return None
    params = [p for p in module.parameters() if p.requires_grad]
    # .grad of a non-leaf parameter (learn2learn's clones) warns: a leaf's only.
    graded = {id(p) for p in params if p.is_leaf and p.grad is not None}
    if graded:
        idle = {i for ids in optimizers if ids & graded for i in ids - graded}
        params = [p for p in params if id(p) not in idle]
    ids = {id(p) for p in params}
    total = sum(p.numel() for p in params)
    for child in module.children():
        if getattr(child, "_compiled_call_impl", None) is not None:
            continue
        if total and sum(p.numel() for p in child.parameters() if id(p) in ids) >= WRAPPED_SHARE * total:
            return child
    return None


def descend_forward_hooks(probe: Probe) -> None:
    """Put the forward hooks one level below the deepest hooked modules, on their children that
    hold trainable parameters: called when a step ran backward but no hooked module's forward (a
    LightningModule's training_step calls `self.body(x)`, never the LightningModule itself).
    Nested hooked calls count once (the depth counter), so a parent that is called later too
    still times one forward."""
    if not probe.root_hook_fns:
        return
    pre, post = probe.root_hook_fns
    level = probe.hook_frontier or [ref for ref, *_ in probe.root_hooks]
    hooked = {id(m) for ref, *_ in probe.root_hooks if (m := ref()) is not None}
    if any(getattr(ref(), "_compiled_call_impl", None) is not None for ref in level):
        return  # Module.compile(): its forward runs compiled, where the hooks fold away; going down adds nothing
    frontier = []
    for ref in level:
        module = ref()
        if module is None or len(frontier) >= _MAX_CHILD_HOOKS:
            continue
        for child in module.children():
            if id(child) in hooked or not any(p.requires_grad for p in child.parameters()):
                continue
            hooked.add(id(child))
            if not _hook_pair(probe, child, pre, post):
                continue  # a scripted submodule takes no hooks
            frontier.append(weakref.ref(child))
            probe.hook_frontier = frontier
            if len(frontier) >= _MAX_CHILD_HOOKS:
                break
    probe.hook_frontier = frontier


# A child holding this share of its parent's trainable parameters is the model the parent wraps.
WRAPPED_SHARE = 0.9
# At most this many modules get hooks at each level a descent adds (a ModuleList of 100 layers
# would otherwise cost 100 hook pairs per step).
_MAX_CHILD_HOOKS = 16

# The module hook tables the probe's root hooks sit in; a forward hook registered with
# always_call=True is also listed, by the same key, in the third.
_PRE, _POST, _ALWAYS = "_forward_pre_hooks", "_forward_hooks", "_forward_hooks_always_called"
# How deep `_modules_in` looks into the containers a save is given ({"model": model, ...}).
_SEARCH_DEPTH = 3


def _modules_in(value: Any, module_cls: type, depth: int = _SEARCH_DEPTH) -> list[Any]:
    """The nn.Modules in `value`: a module and its submodules, or those inside dicts, lists and tuples."""
    if isinstance(value, module_cls):
        return list(value.modules())
    if depth <= 0:
        return []
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return []
    return [m for item in list(items)[:1000] for m in _modules_in(item, module_cls, depth - 1)]


def _detach(probe: Probe, args: tuple[Any, ...], module_cls: type) -> list[tuple[Any, str, Any, Any]]:
    """Take the probe's forward hooks off the root modules and off every module in `args` (a copy
    of a root made after the hooks were put on carries their stand-ins); returns what to put back."""
    taken: list[tuple[Any, str, Any, Any]] = []
    try:
        ours = probe.root_hook_fns
        modules = [m for ref, *_ in probe.root_hooks if (m := ref()) is not None]
        modules += _modules_in(args, module_cls)
        seen: set[int] = set()
        for module in modules:
            if id(module) in seen:
                continue
            seen.add(id(module))
            always = module.__dict__.get(_ALWAYS)
            for table in (_PRE, _POST):
                d = module.__dict__.get(table)
                if not isinstance(d, dict):
                    continue
                for key in [k for k, v in d.items() if _ours(v, ours)]:
                    taken.append((module, table, key, d.pop(key)))
                    if table == _POST and isinstance(always, dict) and key in always:
                        taken.append((module, _ALWAYS, key, always.pop(key)))
    except Exception as exc:
        ERRORS.record("forward", exc)
    return taken


def _reattach(taken: list[tuple[Any, str, Any, Any]]) -> None:
    for module, table, key, value in taken:
        try:
            module.__dict__[table][key] = value
        except Exception as exc:
            ERRORS.record("forward", exc)


def _hooks_never_travel(probe: Probe, torch: Any) -> None:
    """A module pickled with the probe's hooks would carry them (``torch.save(model)``), and
    ``torch.jit.script(model)`` tries to compile every hook. Both run with the hooks taken off for
    the call and put back after, so the saved or scripted model is the user's alone. Other pickling
    (raw ``pickle.dump``, a spawned worker) gets `_Portable`'s standard-library no-op."""
    def detaching(fn: Callable[..., Any], frames_up: bool = False) -> Callable[..., Any]:
        """`fn` run with the hooks off; `frames_up`: tell torch.jit.script about the wrapper's frame
        (it resolves the names of a scripted class in its caller's frame, `_frames_up` above it)."""
        if getattr(fn, "_torchdoctor_detaching", False):
            return fn

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            # Only the training thread takes hooks off: another thread (a background saver) doing
            # so could change a hook table while the training thread's forward iterates it. Its
            # pickle gets `_Portable`'s no-op instead.
            if frames_up:
                kwargs["_frames_up"] = kwargs.get("_frames_up", 0) + 1
            if probe.is_compiling() or threading.get_ident() != probe.main_thread:
                return fn(*args, **kwargs)
            taken = _detach(probe, args, torch.nn.Module)
            try:
                return fn(*args, **kwargs)
            finally:
                _reattach(taken)

        call._torchdoctor_detaching = True  # type: ignore[attr-defined]
        unseen.hide_all(call)
        return call

    for owner, name in ((torch, "save"), (getattr(torch, "jit", None), "script")):
        fn = getattr(owner, name, None) if owner is not None else None
        if fn is None:
            continue
        try:
            up = name == "script" and "_frames_up" in inspect.signature(fn).parameters
            if name == "script" and not up:
                continue  # without _frames_up a wrapper would hide the caller's names from TorchScript
            setattr(owner, name, detaching(fn, up))
        except Exception as exc:
            ERRORS.record("forward", exc)


def _ddp(probe: Probe) -> None:
    from torch.nn.parallel import distributed

    cls = distributed.DistributedDataParallel

    def before(args: tuple[Any, ...]) -> Site | None:
        return probe.creation_site(2, "DistributedDataParallel")

    def after(site: Site | None, args: tuple[Any, ...], result: Any) -> None:
        if result is shims.FAILED or not args:
            return
        fault_point("ddp.init")
        ddp = args[0]
        site = site or Site()
        probe.ddps.append(DDPRecord(weakref.ref(ddp), collect.ddp_facts(ddp, site), site=site))

    cls.__init__ = shims.around(cls.__init__, before, after, _failed("ddp.init"))


def _autocast(probe: Probe) -> None:
    from torch.amp import autocast_mode

    cls = autocast_mode.autocast

    def before(args: tuple[Any, ...]) -> None:
        ctx = args[0]
        if getattr(ctx, "_enabled", False):
            probe.autocast_dtype = str(getattr(ctx, "fast_dtype", "")).removeprefix("torch.") or None

    cls.__enter__ = shims.before_only(cls.__enter__, before, _failed("autocast"))


def _syncs(probe: Probe) -> None:
    import torch

    on_sync = probe.on_sync
    getframe = sys._getframe

    def before(args: tuple[Any, ...]) -> None:
        if "sync" not in BROKEN and args:
            on_sync(args[0], getframe(2))  # frames: before <- shim <- caller

    for name in ("item", "tolist", "numpy"):
        setattr(torch.Tensor, name, shims.before_only(getattr(torch.Tensor, name), before, _failed("sync")))


def _profiler_guard(probe: Probe) -> None:
    import torch
    from torch.profiler import profiler

    def give_way(args: tuple[Any, ...]) -> None:
        window = probe.window
        if window is not None and window.active and args and args[0] is not window.prof:
            window.abort()
            ERRORS.note("profiler window given up: the job started its own profiler")

    kineto = profiler._KinetoProfile
    kineto.prepare_trace = shims.before_only(kineto.prepare_trace, give_way, _failed("profiler"))
    legacy = torch.autograd.profiler.profile
    legacy.__enter__ = shims.before_only(legacy.__enter__, give_way, _failed("profiler"))


def _distributed(probe: Probe) -> None:
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d

    # The rank is unknown once the group is gone: remember it while it still exists.
    shim = shims.before_only(
        distributed_c10d.destroy_process_group, lambda args: probe.rank_identity(), _failed("distributed")
    )
    distributed_c10d.destroy_process_group = shim
    dist.destroy_process_group = shim


def _call_chain(probe: Probe) -> str | None:
    """Where a hooked call (a forward without autograd, a save) was made, for a hook called from
    its shim: the user's line and the user's line that called it ("ppo.py:122
    (Agent.get_action_and_value), from ppo.py:201"; a save inside the job's own helper,
    "utils.py:242 (save_on_master), from train.py:260 (main)"), or the library function the
    user's line called (an evaluation loop of a trainer)."""
    frames = probe.user_frames(2, 2)  # user_frames <- _call_chain <- the hook <- its caller
    site = probe.creation_site(2)
    if site.user and frames:
        return ", from ".join(frames)
    return _user_call_site(site)


def _user_call_site(site: Site) -> str | None:
    """The user's line of a call (a save, an inference forward), or the library function their line called."""
    if site.user:
        return site.user
    if site.library and site.caller:
        return f"{site.library}'s {site.entry or 'code'}() at {site.caller}"
    if site.library and site.library_site:  # no line of the user's at all (`yolo train`, a console script)
        return f"{site.library}'s {site.library_site}"
    return None


def _checkpoints(probe: Probe) -> None:
    """Time the checkpoint saves the training thread blocks on; note the files loaded before step 0
    ends; keep DCP's optimizer-state initialisation out of the steps.

    ``torch.save`` now; DCP's ``save``/``async_save`` (``async_save`` returns once its tensors are
    staged: that part blocks the step) when the job imports ``torch.distributed.checkpoint``, and
    safetensors' ``save_file``/``save_model`` when it imports ``safetensors.torch``, modules the
    probe never imports itself. A save inside a save (DCP writing with torch.save) is
    counted once; saves on other threads (a background saver) do not block the step.
    """
    import torch

    depth = [0]

    def before(args: tuple[Any, ...]) -> float | None:
        if "checkpoint" in BROKEN or threading.get_ident() != probe.main_thread:
            return None
        if not depth[0] and probe.checkpoint_site is None:  # once: saves are few, the walk is cheap
            probe.checkpoint_site = _call_chain(probe)  # before the count: raising here skips `after`
        depth[0] += 1
        return perf_counter() if depth[0] == 1 else None

    def after(t0: float | None, args: tuple[Any, ...], result: Any) -> None:
        if threading.get_ident() != probe.main_thread:
            return
        depth[0] = max(0, depth[0] - 1)
        if t0 is not None:
            fault_point("checkpoint")
            probe.clock.add(Phase.CHECKPOINT, perf_counter() - t0)
            probe.clock.add(Phase.CHECKPOINT_SAVES, 1)

    def saving(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Where the job saves once a step has ended (its checkpoints, not a dataset it prepares
        # before training): `fix` tells a later run that loads from there (remedies/measure.py).
        if depth[0] or not probe.clock.index or "checkpoint.path" in BROKEN:
            return
        if threading.get_ident() != probe.main_thread:
            return
        path, folder = _io_path(args, kwargs, 1, "storage_writer")  # torch.save(obj, f) or DCP's save
        path = path if folder or path is None else os.path.dirname(path)
        if path is not None and path not in probe.checkpoint_dirs:
            # The last ones: a resume loads the newest (one DCP folder per save: ckpt/step_N).
            del probe.checkpoint_dirs[: len(probe.checkpoint_dirs) - MAX_LOADED_FILES + 1]
            probe.checkpoint_dirs.append(path)

    def wrap(owner: Any, name: str) -> None:
        fn = getattr(owner, name, None)
        if fn is not None and not getattr(fn, "_torchdoctor_checkpoint", False):
            timed = shims.around(fn, before, after, _failed("checkpoint"))
            shim = shims.before_call(timed, saving, _failed("checkpoint.path"))
            shim._torchdoctor_checkpoint = True  # type: ignore[attr-defined]
            setattr(owner, name, shims.picklable_as(shim, owner, name))

    wrap(torch, "save")

    def loading_at(position: int) -> Callable[[tuple[Any, ...], dict[str, Any]], None]:
        """The note for a load whose file or reader is positional argument ``position``."""
        def loading(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            # Only what the job loads before its first step has ended: a resumed checkpoint, pretrained
            # weights, a dataset. `fix` compares the files' times with its own start: an arm that
            # loaded what an earlier arm wrote did not run the same job (remedies/measure.py).
            if probe.clock.index or len(probe.loaded_files) >= MAX_LOADED_FILES or "load" in BROKEN:
                return
            if threading.get_ident() != probe.main_thread:
                return
            path, _ = _io_path(args, kwargs, position, "storage_reader")
            if path is not None and all(f.path != path for f in probe.loaded_files):
                probe.loaded_files.append(collect.loaded_file(path))
        return loading

    def wrap_load(owner: Any, name: str, position: int) -> None:
        fn = getattr(owner, name, None)
        if fn is not None and not getattr(fn, "_torchdoctor_load", False):
            shim = shims.before_call(fn, loading_at(position), _failed("load"))
            shim._torchdoctor_load = True  # type: ignore[attr-defined]
            setattr(owner, name, shims.picklable_as(shim, owner, name))

    wrap_load(torch, "load", 0)  # torch.load(f, ...)

    def init_start(args: tuple[Any, ...]) -> bool:
        # The training thread's only: another thread's (a background checkpointer) must not hide
        # its steps, nor race on the count.
        if threading.get_ident() != probe.main_thread:
            return False
        probe.optimizer_state_init += 1
        return True

    def init_end(counted: bool, args: tuple[Any, ...], result: Any) -> None:
        if counted:
            probe.optimizer_state_init = max(0, probe.optimizer_state_init - 1)

    def on_dcp(module: Any) -> None:
        try:
            for name in ("save", "async_save"):
                wrap(module, name)
            for name in ("load", "load_state_dict"):  # (state_dict, storage_reader) when positional
                wrap_load(module, name, 1)
        except Exception as exc:
            ERRORS.record("checkpoint", exc)

    def on_dcp_state_dict(module: Any) -> None:
        # Private (torch 2.2+): feature-detected; without it the zero-lr step counts as a step.
        try:
            _shim_once(module, "_init_optim_state", init_start, init_end, "optimizer.init_state")
        except Exception as exc:
            ERRORS.record("optimizer.init_state", exc)

    # Each now if the job imported it already (when_imported calls back at once), else on import.
    imphook.when_imported("torch.distributed.checkpoint.state_dict", on_dcp_state_dict)
    imphook.when_imported("torch.distributed.checkpoint", on_dcp)

    def on_safetensors(module: Any) -> None:
        # Hugging Face's save_pretrained (transformers, diffusers, accelerate) writes the weights with
        # safetensors and only the optimizer with torch.save: the Trainer's checkpoint was mostly
        # untimed, and diffusers' UNet save at an epoch's end read as the loop's own work. Wrapped
        # when the module is first imported, before `from safetensors.torch import save_file as
        # safe_save_file` binds the name in the library that imports it.
        try:
            for name in ("save_file", "save_model"):  # save_model writes through save_file: one save
                wrap(module, name)
        except Exception as exc:
            ERRORS.record("checkpoint", exc)

    imphook.when_whole("safetensors.torch", on_safetensors)  # its save_file exists once its body ran


def _io_path(args: tuple[Any, ...], kwargs: dict[str, Any], position: int, storage: str) -> tuple[str | None, bool]:
    """(absolute path, whether it is a DCP folder) of what a checkpoint call reads or writes: DCP's
    ``checkpoint_id=`` or its storage reader/writer's ``path``, else the file (or reader) at
    ``kwargs["f"]`` or positional argument ``position``; None for a buffer."""
    folder = kwargs.get("checkpoint_id") or getattr(kwargs.get(storage), "path", None)
    if folder is not None:
        return collect.loaded_path(folder), True
    where = kwargs.get("f", kwargs.get("filename", args[position] if len(args) > position else None))  # safetensors: filename
    reader = getattr(where, "path", None) if not isinstance(where, str | bytes | os.PathLike) else None
    if reader is not None and getattr(where, "name", None) is None:  # a DCP reader passed positionally
        return collect.loaded_path(reader), True
    return collect.loaded_path(where), False


def _graphs(probe: Probe) -> None:
    """Each graph Dynamo captures, hashed without its devices (probe/compile_cache.py), once the job
    imports Dynamo."""
    from torchdoctor.probe import compile_cache

    def watch(module: Any) -> None:
        try:
            compile_cache.watch_graphs(module, _failed("graphs"))
        except Exception as exc:
            ERRORS.record("graphs", exc)

    def watch_code(module: Any) -> None:
        try:
            compile_cache.watch_output_code(module, _failed("graphs"))
        except Exception as exc:
            ERRORS.record("graphs", exc)

    imphook.when_imported("torch._dynamo.output_graph", watch)
    imphook.when_imported("torch._inductor.codecache", watch_code)
