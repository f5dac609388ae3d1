"""Where activation checkpointing is switched off: the library setting that turned it on, or the job's call.

Shared by HW-19's advice and `fix`'s permanent change for memory.no_checkpoint. Each library's
setting is read from its sources: transformers' Trainer calls model.gradient_checkpointing_enable()
when TrainingArguments(gradient_checkpointing=True), and every trl config (trl/trainer/base_config.py,
trl 1.16) defaults it to True; timm's train.py calls model.set_grad_checkpointing(enable=True) for
--grad-checkpointing, and its models then run blocks through timm.models.checkpoint_seq, which calls
torch.utils.checkpoint.checkpoint (timm 1.0.22); Lightning's FSDPStrategy wraps the layers its
activation_checkpointing_policy names.
"""

from __future__ import annotations

# A device peak above this share of its memory leaves no room for the activations checkpointing drops
# (usually several times the segment inputs it keeps): HW-19 is then info, and `fix` does not pick its
# remedy by itself (an out-of-memory arm would end the A/B of every remedy tried with it).
MEMORY_TIGHT = 0.70


def memory_full(peak: float | None, total: float | None) -> float | None:
    """The device's peak as a share of its memory when above MEMORY_TIGHT; None otherwise or unknown."""
    if not peak or not total:
        return None
    share = peak / total
    return share if share > MEMORY_TIGHT else None

# library -> (what turns it on, the change that turns it off)
SETTINGS: dict[str, tuple[str, str]] = {
    "transformers": (
        "The Trainer turns it on from TrainingArguments(gradient_checkpointing=True), trl's configs (SFTConfig, "
        "DPOConfig, GRPOConfig, ...) by default, a loop of its own with model.gradient_checkpointing_enable() "
        "(PEFT's prepare_model_for_kbit_training calls it too).",
        "TrainingArguments(..., gradient_checkpointing=False)   # trl: SFTConfig(..., gradient_checkpointing=False)\n"
        "# trl's scripts: --gradient_checkpointing False; a loop of its own: leave out "
        "model.gradient_checkpointing_enable()"),
    "timm": (
        "timm's train.py turns it on with --grad-checkpointing (model.set_grad_checkpointing()).",
        "# train.py: leave out --grad-checkpointing; in code:\nmodel.set_grad_checkpointing(False)"),
    "lightning": (
        "Under Lightning it is the strategy's activation_checkpointing_policy (FSDP) or the model's own "
        "torch.utils.checkpoint calls.",
        "FSDPStrategy(..., activation_checkpointing_policy=None)"),
    # torchtune 0.6.1's recipes: cfg.get("enable_activation_checkpointing", False), then
    # training.set_activation_checkpointing (FSDP's apply_activation_checkpointing) on every layer.
    "torchtune": (
        "torchtune's recipes turn it on for every transformer layer from the config's "
        "enable_activation_checkpointing (True in most of its shipped configs).",
        "# tune run ... enable_activation_checkpointing=False   (or in the config file:)\n"
        "enable_activation_checkpointing: False"),
}
SETTINGS["pytorch_lightning"] = SETTINGS["lightning"]
LANGUAGE = {"torchtune": "yaml"}  # the change's language, where it is not Python
# torch's helpers that call torch.utils.checkpoint.checkpoint for the job's line.
VIA = {
    "checkpoint_wrapper": "# FSDP's checkpoint_wrapper / apply_activation_checkpointing wraps these blocks: leave it out, "
                          "or narrow its check_fn\n# apply_activation_checkpointing(model, check_fn=...)",
    "checkpoint_sequential": "# before: y = checkpoint_sequential(model, segments, x)\ny = model(x)",
}
# The job's own call of torch.utils.checkpoint.checkpoint.
OWN_CALL = ("It is the job's calls of torch.utils.checkpoint.checkpoint (or FSDP's checkpoint_wrapper, "
            "model.gradient_checkpointing_enable()): call the block directly where memory allows.",
            "# before: h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)\nh = block(h)")


def turned_on_by(library: str | None) -> tuple[str, str]:
    """(what turns checkpointing on, the change that turns it off) for ``library``; the job's own call else."""
    return SETTINGS.get(library or "", OWN_CALL)
