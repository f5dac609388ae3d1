"""FSDP settings that a library, not the job's own call, passes to ``fully_shard``.

Shared by DI-16's advice and `fix`'s permanent change for fsdp.keep_unsharded. torchtune's
distributed recipes shard through torchtune.training.shard_model with
``reshard_after_forward=cfg.get("fsdp_reshard_after_forward", True)`` (torchtune 0.6.1,
recipes/full_finetune_distributed.py and the other *_distributed recipes): the config key is the
change, on the command line or in the YAML.
"""

from __future__ import annotations

# library -> (where the setting lives, the change)
RESHARD_SETTINGS: dict[str, tuple[str, str]] = {
    "torchtune": (
        "torchtune's distributed recipes take it from the config",
        "fsdp_reshard_after_forward: False   # the recipe's config, or fsdp_reshard_after_forward=False on the "
        "command line"),
}
