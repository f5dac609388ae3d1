"""torchdata's StatefulDataLoader (torchtitan's loader), reduced for tests that cannot install torchdata:
a DataLoader subclass that never calls DataLoader.__init__ (it sets every attribute itself, as
torchdata 0.11 does) and has its own __iter__ (an iterator kept and reset when persistent, a new one
otherwise; the iterator state_dict() built first serves the first epoch), a random sampler that
draws its permutation when walked, and workers started with a worker loop of its own, imported by
name, as torchdata's are. Map-style datasets only."""

from __future__ import annotations

from pathlib import Path

SOURCE = '''
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, _utils
from torch.utils.data._utils import worker as _torch_worker
from torch.utils.data.dataloader import _DatasetKind, _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter

from .worker import _worker_loop


class _EagerRandomSampler(RandomSampler):  # torchdata's: the permutation is drawn when the sampler is walked
    def __iter__(self):
        return iter(torch.randperm(len(self.data_source), generator=self.generator).tolist())


class _StatefulSingle(_SingleProcessDataLoaderIter):
    pass


class _StatefulMulti(_MultiProcessingDataLoaderIter):
    def __init__(self, loader):  # torchdata starts its workers with its own loop, imported by name
        saved = _torch_worker._worker_loop
        _torch_worker._worker_loop = _worker_loop  # this module's, as it is when the workers start
        try:
            super().__init__(loader)
        finally:
            _torch_worker._worker_loop = saved


class StatefulDataLoader(DataLoader):
    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None,
                 multiprocessing_context=None, generator=None, *, prefetch_factor=None, persistent_workers=False,
                 pin_memory_device="", in_order=True, snapshot_every_n_steps=1):
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        self.dataset, self.num_workers, self.prefetch_factor = dataset, num_workers, prefetch_factor
        self.pin_memory, self.pin_memory_device, self.timeout = pin_memory, pin_memory_device, timeout
        self.worker_init_fn, self.multiprocessing_context, self.in_order = worker_init_fn, multiprocessing_context, in_order
        self._dataset_kind = _DatasetKind.Map
        if sampler is None:
            sampler = _EagerRandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        self.batch_size, self.drop_last, self.sampler = batch_size, drop_last, sampler
        self.batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.generator = generator
        self.collate_fn = collate_fn or _utils.collate.default_collate
        self.persistent_workers = persistent_workers
        self._DataLoader__initialized = True
        self._IterableDataset_len_called = None
        self._iterator = None
        self.snapshot_every_n_steps = snapshot_every_n_steps
        self._initial_iter_for_state_dict = False

    def _get_iterator(self):
        return (_StatefulSingle if self.num_workers == 0 else _StatefulMulti)(self)

    def state_dict(self):  # a checkpoint before the first epoch builds that epoch's iterator
        if self._iterator is None:
            self._iterator = self._get_iterator()
            self._initial_iter_for_state_dict = True
        return {}

    def __iter__(self):
        if self._initial_iter_for_state_dict:
            self._initial_iter_for_state_dict = False
            return self._iterator
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None:
                self._iterator = self._get_iterator()
            else:
                self._iterator._reset(self)
        else:
            self._iterator = self._get_iterator()
        return self._iterator
'''


WORKER_SOURCE = '''
from torch.utils.data._utils import worker as _torch_worker

_TORCH_LOOP = _torch_worker._worker_loop


def _worker_loop(dataset_kind, dataset, index_queue, data_queue, done_event, auto_collation, collate_fn, drop_last,
                 base_seed, init_fn, worker_id, num_workers, persistent_workers, shared_seed):
    # torchdata's is a copy of torch's that also keeps the worker's state; here torch's own (not a
    # wrapper of it that the probe may have put in its place).
    loop = getattr(_TORCH_LOOP, "__wrapped__", _TORCH_LOOP)
    return loop(dataset_kind, dataset, index_queue, data_queue, done_event, auto_collation, collate_fn, drop_last,
                base_seed, init_fn, worker_id, num_workers, persistent_workers, shared_seed)
'''


def install(site_packages: Path) -> None:
    """The package torchdata.stateful_dataloader.stateful_dataloader under ``site_packages``."""
    package = site_packages / "torchdata" / "stateful_dataloader"
    package.mkdir(parents=True, exist_ok=True)
    (site_packages / "torchdata" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from .stateful_dataloader import StatefulDataLoader\n")
    (package / "stateful_dataloader.py").write_text(SOURCE)
    (package / "worker.py").write_text(WORKER_SOURCE)
