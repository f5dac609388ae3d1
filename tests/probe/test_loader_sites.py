"""The DataLoader a library re-creates from the user's keeps the user's line (probe/hooks.py
`_loader_site`), and only while the dataset it was linked through is alive."""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

from torchdoctor.callsite import Site
from torchdoctor.probe.hooks import _loader_site


class Data:
    pass


class Loader:
    def __init__(self, dataset):
        self.dataset = dataset


def probe_with(dataset, user_line: str | Site, loader: Loader, site: Site):
    first = Site(user=user_line) if isinstance(user_line, str) else user_line
    sites = weakref.WeakKeyDictionary({loader: site})
    return SimpleNamespace(sites=sites, dataset_sites={id(dataset): (weakref.ref(dataset), first)})


def test_a_rebuilt_loader_takes_the_users_line():
    data = Data()
    rebuilt = Loader(data)
    probe = probe_with(data, "/job/train.py:9", rebuilt, Site(library="accelerate"))
    assert _loader_site(probe, rebuilt).user == "/job/train.py:9"


def test_a_library_s_loader_rebuilt_by_another_library_takes_the_first_library_s_line():
    """denoising-diffusion-pytorch's Trainer builds DataLoader(..., num_workers=cpu_count()) and
    accelerate's prepare() re-creates it: the advice named accelerate's line for ddpm's setting."""
    data = Data()
    rebuilt = Loader(data)
    lib = "/venv/lib/python3.11/site-packages"
    first = Site(library="denoising_diffusion_pytorch", library_site=f"{lib}/denoising_diffusion_pytorch/ddpm.py:955",
                 caller="/job/train.py:7", entry="Trainer.__init__", entry_params=("self", "folder"))
    probe = probe_with(data, first, rebuilt, Site(library="denoising_diffusion_pytorch", caller="/job/train.py:7",
                                                  library_site=f"{lib}/accelerate/data_loader.py:428"))
    assert _loader_site(probe, rebuilt) == first
    # timm's create_loader(...), then the user's accelerator.prepare(loader): timm's call is where the
    # settings are (create_loader(..., num_workers=N) at the user's line), not accelerate's prepare.
    timm = Site(library="timm", library_site=f"{lib}/timm/data/loader.py:467", caller="/job/train.py:5",
                entry="create_loader", entry_params=("dataset", "num_workers"))
    probe = probe_with(data, timm, rebuilt, Site(library="accelerate", library_site=f"{lib}/accelerate/data_loader.py:428",
                                                 caller="/job/train.py:9", entry="Accelerator.prepare"))
    assert _loader_site(probe, rebuilt) == timm
    # A second loader the same library's code builds over the dataset is its own.
    own = Site(library="timm", library_site=f"{lib}/timm/data/loader.py:480", caller="/job/train.py:6",
               entry="create_loader")
    probe = probe_with(data, timm, rebuilt, own)
    assert _loader_site(probe, rebuilt) == own


def test_the_trainers_loader_is_not_linked_to_another_loader_over_its_dataset():
    data = Data()
    built = Loader(data)
    # next(iter(DataLoader(train_ds))) somewhere in the user's script, over the Trainer's dataset
    probe = probe_with(data, "/job/check.py:3", built, Site(library="transformers"))
    assert _loader_site(probe, built).user is None


def test_an_id_a_freed_dataset_left_behind_links_nothing():
    data, other = Data(), Data()
    rebuilt = Loader(other)
    probe = probe_with(data, "/job/train.py:9", rebuilt, Site(library="accelerate"))
    key = id(data)
    del data
    gc.collect()
    probe.dataset_sites[id(other)] = probe.dataset_sites.pop(key)  # as if `other` had got its id
    assert _loader_site(probe, rebuilt).user is None


def test_a_call_with_no_line_of_the_users_is_named_by_the_library_s_line():
    """`yolo train` (a console script): the checkpoint save had no site at all once the stub stopped
    reading as the user's line; it is the library's own line."""
    from torchdoctor.probe.hooks import _user_call_site

    assert _user_call_site(Site(user="/job/train.py:9")) == "/job/train.py:9"
    assert _user_call_site(Site(library="timm", caller="/job/train.py:5", entry="create_loader")) == (
        "timm's create_loader() at /job/train.py:5")
    assert _user_call_site(Site(library="ultralytics", library_site="/venv/ultralytics/engine/trainer.py:712")) == (
        "ultralytics's /venv/ultralytics/engine/trainer.py:712")
    assert _user_call_site(Site()) is None


def test_the_draw_check_wraps_only_a_plain_fetch_method_and_lets_go_of_it():
    import threading

    from torchdoctor.facts import DataLoaderFacts
    from torchdoctor.probe.hooks import _check_draws
    from torchdoctor.probe.summary import LoaderRecord

    probe, record = SimpleNamespace(main_thread=threading.get_ident()), LoaderRecord(DataLoaderFacts())

    class Static:  # called unbound with the fetcher it would raise TypeError into the job's next(it)
        @staticmethod
        def fetch(index):
            return index

    it = SimpleNamespace(_num_workers=0, _dataset_fetcher=Static())
    _check_draws(probe, it, record)
    assert "fetch" not in vars(it._dataset_fetcher) and it._dataset_fetcher.fetch(3) == 3

    class Plain:  # torch's fetchers
        def fetch(self, index):
            return [index]

    it = SimpleNamespace(_num_workers=0, _dataset_fetcher=Plain())
    _check_draws(probe, it, record)
    assert "fetch" in vars(it._dataset_fetcher)
    assert [it._dataset_fetcher.fetch(i) for i in range(6)] == [[i] for i in range(6)]
    assert (record.rng_tries, record.rng_checked, record.rng_drawn) == (4, 4, 0)
    assert "fetch" not in vars(it._dataset_fetcher)  # unwrapped after its last check
