"""Permanent code changes: unified diffs against the recorded call site, snippets otherwise."""

from __future__ import annotations

from pathlib import Path

from torchdoctor.remedies.suggest import call_site_diff, changes_for

TRAIN = '''import torch
from torch.utils.data import DataLoader

loader = DataLoader(ds, batch_size=32, num_workers=0)
model = torch.nn.parallel.DistributedDataParallel(
    net,
    find_unused_parameters=True,
)
opt = torch.optim.Adam(model.parameters())
odd = make(**options)
loader_train = create_loader(ds, input_size=(3, 64, 64), num_workers=args.workers)
'''


def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def apply_diff(original: str, diff: str) -> str:
    """Tiny patch applier for one-hunk diffs (enough to check the result compiles and says the right thing)."""
    lines = diff.splitlines(keepends=True)[3:]
    old = "".join(x[1:] for x in lines if x[:1] in (" ", "-"))
    new = "".join(x[1:] for x in lines if x[:1] in (" ", "+"))
    assert old in original
    return original.replace(old, new)


def test_keyword_replaced_and_appended(tmp_path: Path) -> None:
    path = script(tmp_path)
    diff = call_site_diff(f"{path}:4", {"num_workers": 2, "persistent_workers": True})
    assert diff is not None
    result = apply_diff(TRAIN, diff)
    assert "DataLoader(ds, batch_size=32, num_workers=2, persistent_workers=True)" in result
    compile(result, "train.py", "exec")


def test_multiline_call_with_trailing_comma(tmp_path: Path) -> None:
    path = script(tmp_path)
    diff = call_site_diff(f"{path}:5", {"find_unused_parameters": False, "gradient_as_bucket_view": True})
    assert diff is not None
    result = apply_diff(TRAIN, diff)
    assert "find_unused_parameters=False, gradient_as_bucket_view=True," in result
    compile(result, "train.py", "exec")
    diff = call_site_diff(f"{path}:9", {"foreach": True})
    assert diff is not None and "torch.optim.Adam(model.parameters(), foreach=True)" in diff


def test_no_diff_when_it_cannot_tell(tmp_path: Path) -> None:
    path = script(tmp_path)
    assert call_site_diff(f"{path}:10", {"num_workers": 2}) is None  # **options may set it
    assert call_site_diff(f"{tmp_path}/missing.py:1", {"num_workers": 2}) is None
    assert path.read_text() == TRAIN  # never written


def test_changes_group_by_site_and_fall_back_to_snippets(tmp_path: Path) -> None:
    path = script(tmp_path)
    applied = {
        "dataloader.workers": [{"id": "dataloader.workers", "target": "DataLoader", "site": f"{path}:4",
                                "set": {"num_workers": 2}, "was": {"num_workers": 0}}],
        "dataloader.persistent_workers": [{"id": "dataloader.persistent_workers", "target": "DataLoader",
                                           "site": f"{path}:4", "set": {"persistent_workers": True}, "was": {}}],
        "debug.off": [{"id": "debug.off", "target": "environment", "site": None,
                       "set": {"CUDA_LAUNCH_BLOCKING": None}, "was": {"CUDA_LAUNCH_BLOCKING": "1"}}],
    }
    changes = changes_for(["dataloader.workers", "dataloader.persistent_workers", "debug.off"], applied)
    assert [c.language for c in changes] == ["diff", "shell"]
    assert changes[0].ids == ["dataloader.workers", "dataloader.persistent_workers"]
    assert changes[1].text == "unset CUDA_LAUNCH_BLOCKING"


def test_a_loader_the_trainer_builds_is_changed_through_training_arguments() -> None:
    def entry(rid: str, key: str, value: object, library: str) -> dict:
        return {"id": rid, "target": "DataLoader", "site": None, "set": {key: value}, "was": {}, "library": library}

    applied = {"dataloader.workers": [entry("dataloader.workers", "num_workers", 1, "transformers")],
               "dataloader.pin_memory": [entry("dataloader.pin_memory", "pin_memory", True, "lightning")]}
    trainer, other = changes_for(["dataloader.workers", "dataloader.pin_memory"], applied)
    assert trainer.where.startswith("TrainingArguments") and trainer.text == "TrainingArguments(..., dataloader_num_workers=1)"
    ddp = {"id": "ddp.find_unused_false", "target": "DistributedDataParallel", "site": None,
           "set": {"find_unused_parameters": False}, "was": {}, "library": "transformers"}
    (change,) = changes_for(["ddp.find_unused_false"], {"ddp.find_unused_false": [ddp]})
    assert change.text == "TrainingArguments(..., ddp_find_unused_parameters=False)"
    # Another library: no file of its to patch, its settings named.
    assert other.where == "inside lightning (change it through its settings)"
    assert other.text == "DataLoader(..., pin_memory=True)"
    # Where the library builds it, when known (denoising-diffusion-pytorch's Trainer: no setting of its own).
    ddpm = dict(entry("dataloader.persistent_workers", "persistent_workers", True, "denoising_diffusion_pytorch"),
                library_site="/venv/ddpm.py:955")
    (change,) = changes_for(["dataloader.persistent_workers"], {"dataloader.persistent_workers": [ddpm]})
    assert change.where == ("inside denoising_diffusion_pytorch (change it through its settings if it has one, "
                            "or where it builds the DataLoader, at /venv/ddpm.py:955)")


def test_a_loader_a_library_function_builds_is_changed_at_the_users_call_of_it(tmp_path: Path) -> None:
    # patch_data records timm's create_loader(...) line when create_loader takes num_workers itself
    # (callsite.editable_site): the diff edits that call, not a DataLoader(...) the user does not have.
    path = script(tmp_path)
    applied = {"dataloader.workers": [{"id": "dataloader.workers", "target": "create_loader", "site": f"{path}:11",
                                       "set": {"num_workers": 1}, "was": {"num_workers": 4}, "library": "timm"}]}
    (change,) = changes_for(["dataloader.workers"], applied)
    assert change.language == "diff" and change.where == f"{path}:11"
    assert "create_loader(ds, input_size=(3, 64, 64), num_workers=1)" in apply_diff(TRAIN, change.text)


def test_a_library_built_loader_keeps_its_snippet_when_the_users_loaders_were_idle():
    """Persistent workers kept: the user's one loader was read once (left out), the loader skorch built was
    iterated every epoch: its settings still reach the permanent change."""
    entries = [
        {"id": "dataloader.persistent_workers", "target": "DataLoader", "site": "/job/train.py:9",
         "set": {"persistent_workers": True}, "was": {}, "exercised": False},
        {"id": "dataloader.persistent_workers", "target": "DataLoader", "site": None,
         "set": {"persistent_workers": True}, "was": {}, "library": "skorch", "entry": "NeuralNetRegressor.fit",
         "exercised": True},
    ]
    snippet, note = changes_for(["dataloader.persistent_workers"], {"dataloader.persistent_workers": entries})
    assert snippet.text == ("NeuralNetRegressor(..., iterator_train__persistent_workers=True, "
                            "iterator_valid__persistent_workers=True)")
    assert note.where == "left out" and "/job/train.py:9" in note.text


def test_a_fused_optimizer_a_library_built_is_made_permanent_through_its_setting() -> None:
    """timm's create_optimizer_v2 built the SGD fix made fused: no line of the user's to edit, and
    `optimizer(..., fused=True)` at an "unknown call site" said nothing useful."""
    entry = {"id": "optim.fused", "target": "SGD", "site": None, "set": {"fused": True}, "was": {"fused": None},
             "library": "timm"}
    (change,) = changes_for(["optim.fused"], {"optim.fused": [entry]}, "python train.py --model resnet18")
    assert change.text.endswith("\npython train.py --model resnet18 --opt-kwargs fused=True")
    assert change.language == "shell" and change.where.startswith("timm's setting")
    hf = dict(entry, target="AdamW", library="transformers")
    (change,) = changes_for(["optim.fused"], {"optim.fused": [hf]})
    assert 'optim="adamw_torch_fused"' in change.text
    other = dict(entry, library="somelib")
    (change,) = changes_for(["optim.fused"], {"optim.fused": [other]})
    assert change.text == "optimizer(..., fused=True)"


def test_fully_shard_called_by_torchtune_is_changed_in_its_config() -> None:
    """torchtune's shard_model calls fully_shard for its distributed recipes with
    reshard_after_forward=cfg.get("fsdp_reshard_after_forward", True): the config key is the change
    (on torchtune's full_finetune_distributed, fix kept fsdp.keep_unsharded at x1.07), not a
    fully_shard call at an unknown site."""
    def entry(library: str | None) -> dict:
        e = {"id": "fsdp.keep_unsharded", "target": "fully_shard", "site": None,
             "set": {"reshard_after_forward": False}, "was": {"reshard_after_forward": True}}
        return dict(e, library=library) if library else e

    (change,) = changes_for(["fsdp.keep_unsharded"], {"fsdp.keep_unsharded": [entry("torchtune")] * 2})
    assert change.text.startswith("fsdp_reshard_after_forward: False") and change.language == "yaml"
    assert change.where.startswith("torchtune calls fully_shard")
    (change,) = changes_for(["fsdp.keep_unsharded"], {"fsdp.keep_unsharded": [entry(None)]})
    assert change.text == "fully_shard(..., reshard_after_forward=False)" and change.where == "unknown call site"


def test_contiguous_input_names_torchtune_s_loss_setting_or_the_job_s_lines():
    """fix on torchtune's LoRA recipe: TiedLinear (torchtune's code) called F.linear with the chunk; the permanent
    change is the config's loss, not a line of torchtune's to edit."""
    rid = "matmul.contiguous_input"
    tune = [{"id": rid, "target": "linear", "site": None, "set": {"input": "made contiguous"}, "was": {},
             "library": "torchtune", "library_site": "/venv/torchtune/modules/tied_linear.py:25"}]
    (change,) = changes_for([rid], {rid: tune})
    assert change.language == "yaml" and "torch.nn.CrossEntropyLoss" in change.text and "torchtune" in change.where
    own = [{"id": rid, "target": "linear", "site": "/job/train.py:41", "set": {"input": "made contiguous"}, "was": {}}]
    (change,) = changes_for([rid], {rid: own})
    assert change.where == "/job/train.py:41" and "x.reshape(-1, x.shape[-1])" in change.text
