"""DataLoader and DDP fixes told where the job builds them (advice/framework_settings.py)."""

from __future__ import annotations

import pytest

from torchdoctor.advice.framework_settings import framework_fix, loader_fix, trainer_snippet
from torchdoctor.facts import DataLoaderFacts, DDPFacts

SNIPPET = "DataLoader(dataset, batch_size=..., num_workers=2, pin_memory=True,\n           persistent_workers=True, prefetch_factor=2)"


def test_the_users_loader_gets_its_line():
    fix = loader_fix([DataLoaderFacts(call_site="/job/train.py:12")], "Use workers{where}.", SNIPPET)
    assert fix.text == "Use workers (DataLoader created at /job/train.py:12)." and fix.snippet == SNIPPET


def test_the_trainers_loader_gets_training_arguments():
    trainer = DataLoaderFacts(created_by="transformers", library_site="/venv/site-packages/accelerate/data_loader.py:428")
    fix = loader_fix([trainer], "Load in workers{where}: set num_workers=2, keep pin_memory.", SNIPPET)
    assert fix.text == ("Load in workers (the DataLoader is built by transformers' Trainer from its TrainingArguments): "
                        "set dataloader_num_workers=2, keep dataloader_pin_memory.")
    assert fix.snippet == ("TrainingArguments(..., dataloader_num_workers=2, dataloader_pin_memory=True, "
                           "dataloader_persistent_workers=True, dataloader_prefetch_factor=2)")
    # A setting TrainingArguments lacks keeps the DataLoader snippet.
    assert trainer_snippet("DataLoader(ds, worker_init_fn=f)") is None


def test_another_library_is_named_with_its_line():
    fix = loader_fix([DataLoaderFacts(created_by="lightning", library_site="/venv/site-packages/lightning/x.py:9")],
                     "Pin memory{where}.", "DataLoader(..., pin_memory=True)")
    assert fix.text == ("Pin memory (the DataLoader is built by lightning, at /venv/site-packages/lightning/x.py:9: "
                        "change it through lightning's settings if it has one, or there).")


TIMM = DataLoaderFacts(created_by="timm", library_site="/venv/site-packages/timm/data/loader.py:467",
                       library_call="create_loader", library_caller="/job/train.py:805",
                       library_call_params=["dataset", "batch_size", "num_workers", "pin_memory", "persistent_workers"])


def test_a_library_function_that_takes_the_settings_gets_them_at_the_users_call():
    fix = loader_fix([TIMM], "Pin memory{where}.", "DataLoader(ds, batch_size=..., num_workers=2, pin_memory=True)")
    assert fix.text == ("Pin memory (the DataLoader is built inside timm's create_loader(), which takes these "
                        "settings: at /job/train.py:805).")
    assert fix.snippet == "create_loader(..., num_workers=2, pin_memory=True)"  # batch_size only locates the call
    # prefetch_factor is no parameter of create_loader: the user's line is named, the snippet stays.
    fix = loader_fix([TIMM], "Load in workers{where}.", SNIPPET)
    assert fix.text == ("Load in workers (the DataLoader is built inside timm's create_loader(), which "
                        "/job/train.py:805 calls and which takes no such setting by name: change it through timm's "
                        "settings if it has one, or where timm builds it, at /venv/site-packages/timm/data/loader.py:467).")
    assert fix.snippet == SNIPPET
    # A sampler is the change itself (longer epochs): create_loader takes none, so the DataLoader form stays.
    epochs = "sampler = RandomSampler(ds)\nDataLoader(ds, sampler=sampler, num_workers=N)"
    assert loader_fix([TIMM], "x{where}", epochs).snippet == epochs


def test_a_library_function_that_passes_settings_on_gets_them_at_the_users_call():
    """Ignite's idist.auto_model(model, **kwargs) and auto_dataloader(dataset, **kwargs), Ray Train's
    prepare_model(..., parallel_strategy_kwargs={...}): the settings go there (found on their examples:
    DI-9 and DL-6 said only "change it through ignite's settings")."""
    ignite = DDPFacts(created_by="ignite", library_call="auto_model", library_caller="/job/main.py:224",
                      library_call_params=["model", "sync_bn", "kwargs"])
    fix = framework_fix("DDP", [ignite], "Let gradients live in the buckets{where}.", "DDP(model, gradient_as_bucket_view=True)")
    assert fix.text == ("Let gradients live in the buckets (the DistributedDataParallel wrapper is built inside "
                        "ignite's auto_model(), which passes its keyword arguments on to it: at /job/main.py:224).")
    assert fix.snippet == "auto_model(..., gradient_as_bucket_view=True)"
    ray = DDPFacts(created_by="ray", library_call="prepare_model", library_caller="/job/train.py:76",
                   library_call_params=["model", "move_to_device", "parallel_strategy", "parallel_strategy_kwargs"])
    fix = framework_fix("DDP", [ray], "x{where}", "DDP(model, find_unused_parameters=False, static_graph=True)")
    assert fix.snippet == 'prepare_model(..., parallel_strategy_kwargs={"find_unused_parameters": False, "static_graph": True})'
    assert "which passes its parallel_strategy_kwargs on to it: at /job/train.py:76" in fix.text
    loader = DataLoaderFacts(created_by="ignite", library_call="auto_dataloader", library_caller="/job/main.py:211",
                             library_call_params=["dataset", "kwargs"])
    fix = loader_fix([loader], "Keep the workers alive{where}.", "DataLoader(..., persistent_workers=True)")
    assert fix.snippet == "auto_dataloader(..., persistent_workers=True)"
    # auto_dataloader divides num_workers by the processes per node: a per-rank count said there
    # would be another number at DataLoader(...), so the generic advice stays.
    fix = loader_fix([loader], "Use 2 workers{where}.", "DataLoader(..., num_workers=2, persistent_workers=True)")
    assert fix.snippet == "DataLoader(..., num_workers=2, persistent_workers=True)"
    assert fix.text.endswith("calls: change it through ignite's settings).")
    # The same function for the other object passes nothing on: the generic advice stays.
    fix = loader_fix([DataLoaderFacts(created_by="ignite", library_call="auto_model", library_caller="/job/main.py:1")],
                     "x{where}", "DataLoader(..., persistent_workers=True)")
    assert fix.snippet == "DataLoader(..., persistent_workers=True)"


def test_a_library_function_without_the_settings_is_named_with_the_users_line():
    fit = DataLoaderFacts(created_by="lightning", library_call="Trainer.fit", library_caller="/job/pl.py:40",
                          library_call_params=["self", "model"])
    fix = loader_fix([fit], "Pin memory{where}.", "DataLoader(..., pin_memory=True)")
    assert fix.text == ("Pin memory (the DataLoader is built inside lightning's Trainer.fit(), which /job/pl.py:40 "
                        "calls and which takes no such setting by name: change it through lightning's settings if it has one).")
    assert fix.snippet == "DataLoader(..., pin_memory=True)"
    # denoising-diffusion-pytorch's Trainer(...) builds its DataLoader with num_workers=cpu_count() and
    # no other setting: its line is named (it said only "change it through its settings").
    ddpm = DataLoaderFacts(created_by="denoising_diffusion_pytorch", library_call="Trainer.__init__",
                           library_caller="/job/train.py:7",
                           library_site="/venv/denoising_diffusion_pytorch/denoising_diffusion_pytorch.py:955",
                           library_call_params=["self", "diffusion_model", "folder", "train_batch_size"])
    fix = loader_fix([ddpm], "Keep the workers alive{where}.", "DataLoader(..., persistent_workers=True)")
    assert fix.text.endswith("which takes no such setting by name: change it through denoising_diffusion_pytorch's "
                             "settings if it has one, or where denoising_diffusion_pytorch builds it, at "
                             "/venv/denoising_diffusion_pytorch/denoising_diffusion_pytorch.py:955).")


def test_unknown_origin_says_nothing_more():
    assert loader_fix([DataLoaderFacts()], "Pin memory{where}.", "x").text == "Pin memory."


def test_the_trainers_ddp_gets_training_arguments_and_says_what_has_no_field():
    trainer = [DDPFacts(created_by="transformers")]
    fix = framework_fix("DDP", trainer, "Turn the search off{where}.",
                        "DDP(model, find_unused_parameters=False)   # or static_graph=True")
    # The comment names an alternative, not a second argument.
    assert fix.snippet == "TrainingArguments(..., ddp_find_unused_parameters=False)"
    assert fix.text == ("Turn the search off (the DistributedDataParallel wrapper is built by transformers' Trainer "
                        "from its TrainingArguments).")
    both = framework_fix("DDP", trainer, "x{where}.", "DDP(model, static_graph=True, gradient_as_bucket_view=True)")
    assert both.snippet == ("TrainingArguments(..., ddp_static_graph=True)  # gradient_as_bucket_view: no "
                            "TrainingArguments field")
    none = framework_fix("DDP", trainer, "Let gradients live in the buckets{where}.",
                         "DDP(model, gradient_as_bucket_view=True)")
    assert none.snippet == "DDP(model, gradient_as_bucket_view=True)" and "has no field for this setting" in none.text
    # The user's own DDP(...) keeps its line and its snippet.
    mine = framework_fix("DDP", [DDPFacts(call_site="/job/train.py:40")], "x{where}.", "DDP(model, bucket_cap_mb=25)")
    assert (mine.text, mine.snippet) == ("x (DDP created at /job/train.py:40).", "DDP(model, bucket_cap_mb=25)")


def test_the_snippets_other_lines_stay_and_nested_calls_are_one_argument():
    assert trainer_snippet("torch.set_num_threads(1)\nDataLoader(dataset, batch_size=..., num_workers=1)") == (
        "torch.set_num_threads(1)\nTrainingArguments(..., dataloader_num_workers=1)")
    assert trainer_snippet("DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)") == (
        "TrainingArguments(..., dataloader_pin_memory=True)\nx = x.to(device, non_blocking=True)")
    assert trainer_snippet("DataLoader(ds, num_workers=min(4, os.cpu_count()), pin_memory=True)") == (
        "TrainingArguments(..., dataloader_num_workers=min(4, os.cpu_count()), dataloader_pin_memory=True)")


SKORCH = DataLoaderFacts(created_by="skorch", library_site="/venv/site-packages/skorch/net.py:1976",
                         library_call="NeuralNetClassifier.fit", library_caller="/job/train.py:41",
                         library_call_params=["self", "X", "y"])


def test_skorch_builds_its_loaders_from_the_nets_prefixed_parameters():
    """skorch's README example with workers: the DataLoaders come from NeuralNet.get_iterator, set by
    iterator_train__* / iterator_valid__* where the net is created (the advice said only "change it
    through skorch's settings")."""
    fix = loader_fix([SKORCH], "Keep the workers alive{where}.", "DataLoader(..., persistent_workers=True)")
    assert fix.text == ("Keep the workers alive (the DataLoader is built by skorch (NeuralNetClassifier.fit() at "
                        "/job/train.py:41) from its iterator_train__*/iterator_valid__* parameters: set them where "
                        "the NeuralNetClassifier is created).")
    assert fix.snippet == ("NeuralNetClassifier(..., iterator_train__persistent_workers=True, "
                           "iterator_valid__persistent_workers=True)")
    # A sampler is the training loader's alone; batch_size only locates the call.
    epochs = "sampler = RandomSampler(ds)\nDataLoader(ds, batch_size=..., sampler=sampler, num_workers=N)"
    assert loader_fix([SKORCH], "x{where}", epochs).snippet == (
        "sampler = RandomSampler(ds)\nNeuralNetClassifier(..., iterator_train__sampler=sampler, "
        "iterator_train__num_workers=N, iterator_valid__num_workers=N)")


def test_fixs_permanent_change_for_a_skorch_loader_is_the_nets_parameters():
    from torchdoctor.remedies.suggest import changes_for

    entries = [{"id": "dataloader.workers", "target": "DataLoader", "site": None, "set": {"num_workers": 0},
                "was": {"num_workers": 2}, "library": "skorch", "entry": f"NeuralNetClassifier.{call}"}
               for call in ("fit", "predict_proba")]
    (change,) = changes_for(["dataloader.workers"], {"dataloader.workers": entries})
    assert change.text == "NeuralNetClassifier(..., iterator_train__num_workers=0, iterator_valid__num_workers=0)"
    assert change.where == "skorch builds the DataLoader: its NeuralNetClassifier(...) parameters"


MMENGINE = DataLoaderFacts(created_by="mmengine", library_site="/venv/site-packages/mmengine/runner/runner.py:1476",
                           library_call="Runner.train", library_caller="/job/train.py:94", library_call_params=["self"])


def test_mmengine_builds_its_loaders_from_the_runners_dataloader_dicts():
    """mmengine's examples/distributed_training.py (OpenMMLab's trainers run on the same Runner): the
    loader is DataLoader(..., **train_dataloader) in Runner.build_dataloader, so its settings go in
    that dict; the advice said "Runner.train() ... takes no such setting by name"."""
    fix = loader_fix([MMENGINE], "Keep the workers alive{where}.", "DataLoader(dataset, num_workers=N, persistent_workers=True)")
    assert fix.text == ("Keep the workers alive (the DataLoader is built by mmengine's Runner from its train_dataloader "
                        "dict: set it in the config or the Runner(...) call; Runner.train() at /job/train.py:94).")
    assert fix.snippet == ("train_dataloader = dict(..., num_workers=N, persistent_workers=True)  "
                           "# the config's train_dataloader, or Runner(..., train_dataloader=dict(...))")
    # The snippet's other lines stay; batch_size only locates the call.
    two = loader_fix([MMENGINE], "x{where}", "torch.set_num_threads(1)\nDataLoader(dataset, batch_size=..., num_workers=1)")
    assert two.snippet.startswith("torch.set_num_threads(1)\ntrain_dataloader = dict(..., num_workers=1)  #")
    # mmengine builds a sampler from a dict of its own (sampler=dict(type='DefaultSampler')): not passed on as
    # it is, so a snippet that sets one keeps the generic text.
    sampler = loader_fix([MMENGINE], "x{where}", "DataLoader(ds, sampler=RandomSampler(ds), num_workers=N)")
    assert "train_dataloader" not in sampler.snippet and "takes no such setting by name" in sampler.text


SPEECHBRAIN = DataLoaderFacts(created_by="speechbrain", library_site="/venv/site-packages/speechbrain/dataio/dataloader.py:182",
                              library_call="Brain.fit", library_caller="/job/train.py:37",
                              library_call_params=["self", "epoch_counter", "train_set", "valid_set", "progressbar",
                                                   "train_loader_kwargs", "valid_loader_kwargs"])


def test_speechbrain_s_fit_passes_its_train_loader_kwargs_on_to_the_loader():
    """speechbrain's Brain.fit(..., train_loader_kwargs={...}) builds SaveableDataLoader(dataset,
    **train_loader_kwargs); the advice said fit() "takes no such setting by name"."""
    fix = loader_fix([SPEECHBRAIN], "Load in workers{where}.", "DataLoader(dataset, batch_size=..., num_workers=1)")
    assert fix.text == ("Load in workers (the DataLoader is built inside speechbrain's Brain.fit(), which passes its "
                        "train_loader_kwargs on to it: at /job/train.py:37).")
    assert fix.snippet == 'fit(..., train_loader_kwargs={"num_workers": 1})'
    # speechbrain sets the sampler itself for shuffle=True: a snippet with one keeps the generic text.
    sampler = loader_fix([SPEECHBRAIN], "x{where}", "DataLoader(ds, sampler=RandomSampler(ds), num_workers=N)")
    assert "train_loader_kwargs" not in sampler.snippet


@pytest.mark.parametrize(("rid", "setting", "library", "entry", "text", "where"), [
    ("dataloader.workers", {"num_workers": 1}, "mmengine", "Runner.train",
     "train_dataloader = dict(..., num_workers=1)  # the config's train_dataloader, or "
     "Runner(..., train_dataloader=dict(...))\n"
     "# and val_dataloader, if the job validates: fix changed every loader mmengine built",
     "mmengine builds the DataLoader: its train_dataloader dict (the config, or Runner(...))"),
    ("dataloader.persistent_workers", {"persistent_workers": True}, "speechbrain", "Brain.fit",
     'fit(..., train_loader_kwargs={"persistent_workers": True})\n'
     "# and valid_loader_kwargs, if the job validates: fix changed every loader speechbrain built",
     "speechbrain's Brain.fit() passes it on to the DataLoader"),
])
def test_fixs_permanent_change_for_a_library_loader_is_in_the_librarys_own_settings(rid, setting, library, entry,
                                                                                      text, where):
    """mmengine's Runner builds DataLoader(..., **train_dataloader); speechbrain's fit passes its
    train_loader_kwargs on: the permanent change says so, and names the validation loader's settings."""
    from torchdoctor.remedies.suggest import changes_for

    entries = [{"id": rid, "target": "DataLoader", "site": None, "set": setting, "was": {}, "library": library,
                "entry": entry, "library_site": f"/venv/site-packages/{library}/x.py:1"}]
    (change,) = changes_for([rid], {rid: entries})
    assert (change.text, change.where) == (text, where)


OPEN_CLIP = DataLoaderFacts(created_by="open_clip_train",
                            library_site="/venv/site-packages/open_clip_train/data.py:512")


def test_open_clip_s_loader_is_set_from_its_command_line():
    """`python -m open_clip_train.main --workers 0` builds DataLoader(..., num_workers=args.workers,
    pin_memory=True): no line of the user's, and --workers is the only loader option it has."""
    fix = loader_fix([OPEN_CLIP], "Load in workers{where}: set num_workers=1, then tune.",
                     "DataLoader(dataset, batch_size=..., num_workers=1, persistent_workers=True)")
    assert fix.text == ("Load in workers (the DataLoader is built by open_clip_train from its command line: --workers): "
                        "set --workers 1, then tune.")
    assert fix.snippet == ("python -m open_clip_train.main ... --workers 1  "
                           "# persistent_workers: no open_clip_train option")
    # A setting it has no option for keeps the generic text.
    pin = loader_fix([OPEN_CLIP], "Pin{where}.", "DataLoader(..., pin_memory=True)")
    assert pin.snippet == "DataLoader(..., pin_memory=True)" and "settings if it has one" in pin.text
    from torchdoctor.remedies.suggest import changes_for

    entries = [{"id": "dataloader.workers", "target": "DataLoader", "site": None, "set": {"num_workers": 1}, "was": {},
                "library": "open_clip_train", "entry": None, "library_site": OPEN_CLIP.library_site}]
    (change,) = changes_for(["dataloader.workers"], {"dataloader.workers": entries})
    assert change.text == "python -m open_clip_train.main ... --workers 1"
    assert change.where == "open_clip_train builds the DataLoader: its command line"


def test_litgpt_s_loader_is_set_from_its_data_module_option():
    """`litgpt pretrain --data TextFiles --data.num_workers 1`: litdata's StreamingDataLoader, built by litgpt's data
    module with num_workers=self.num_workers; the job has no line of its own around it."""
    lit = DataLoaderFacts(created_by="litgpt", library_site="/venv/site-packages/litdata/streaming/dataloader.py:821")
    fix = loader_fix([lit], "Load in the training process{where}: num_workers=0.",
                     "DataLoader(dataset, batch_size=..., num_workers=0)")
    assert fix.text == ("Load in the training process (the DataLoader is built by litgpt from its command line: "
                        "--data.num_workers): --data.num_workers 0.")
    assert fix.snippet == "litgpt <command> ... --data <DataModule> --data.num_workers 0"
    # The permanent change: litdata's own prefetch_factor, turned off with the workers, is no option to give.
    from torchdoctor.remedies.suggest import changes_for

    entries = [{"id": "dataloader.workers", "target": "DataLoader", "site": None, "library": "litgpt", "entry": None,
                "set": {"num_workers": 0, "prefetch_factor": None}, "was": {}, "library_site": lit.library_site}]
    (change,) = changes_for(["dataloader.workers"], {"dataloader.workers": entries})
    assert change.text == "litgpt <command> ... --data <DataModule> --data.num_workers 0"
