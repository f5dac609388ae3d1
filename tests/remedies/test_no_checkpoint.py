"""memory.no_checkpoint on real torch.utils.checkpoint calls, in-process (torch's function is restored)."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")

import torch.utils.checkpoint as tuc  # noqa: E402

from torchdoctor.remedies import patch_checkpoint  # noqa: E402
from torchdoctor.remedies.catalogue import parse  # noqa: E402
from torchdoctor.remedies.runtime import ENV_SAID, Runtime  # noqa: E402
from torchdoctor.remedies.suggest import changes_for  # noqa: E402


class Block(torch.nn.Module):
    """A block that counts its forwards; dropout makes the checkpoint replay its random state."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.drop, self.calls = torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.drop(torch.relu(self.lin(x)))


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tuc, "checkpoint", tuc.checkpoint)
    monkeypatch.setenv(ENV_SAID, "")
    rt = Runtime()
    spec, why = parse("memory.no_checkpoint")
    assert spec is not None, why
    rt.specs[spec.id] = spec
    return rt


def _step(blocks: list[Block], call) -> list[torch.Tensor]:
    torch.manual_seed(0)
    h = torch.ones(4, 16)
    for b in blocks:
        h = call(b, h)
    h.sum().backward()
    grads = [b.lin.weight.grad.clone() for b in blocks]
    for b in blocks:
        b.zero_grad(set_to_none=True)
    return grads


def test_segments_run_once_with_the_checkpointed_gradients(runtime: Runtime) -> None:
    torch.manual_seed(1)
    blocks = [Block(), Block()]
    checkpointed = _step(blocks, lambda b, h: tuc.checkpoint(b, h, use_reentrant=False))
    assert [b.calls for b in blocks] == [2, 2]  # forward, and again in backward
    patch_checkpoint.install(torch, runtime)
    # The ways jobs reach it after torch is imported: the module attribute, a from-import made later,
    # and Hugging Face's functools.partial(checkpoint, **gradient_checkpointing_kwargs).
    from torch.utils.checkpoint import checkpoint

    partial = functools.partial(tuc.checkpoint, use_reentrant=False)
    for call in (lambda b, h: checkpoint(b, h, use_reentrant=False), lambda b, h: partial(b, h),
                 lambda b, h: tuc.checkpoint(b, h, use_reentrant=True, preserve_rng_state=True)):
        for b in blocks:
            b.calls = 0
        grads = _step(blocks, call)
        assert [b.calls for b in blocks] == [1, 1]  # nothing runs again
        # The same dropout masks and so the same gradients: the checkpoint replays the forward's random state.
        assert all(torch.equal(a, g) for a, g in zip(checkpointed, grads, strict=True))
    # checkpoint_sequential calls the module's checkpoint by name: covered too.
    seq = torch.nn.Sequential(Block(), Block())
    tuc.checkpoint_sequential(seq, 2, torch.ones(4, 16, requires_grad=True), use_reentrant=False).sum().backward()
    assert [m.calls for m in seq] == [1, 1]
    (entry,) = runtime.applied  # said once, at the first call: the job's own line
    assert entry["id"] == "memory.no_checkpoint" and entry["site"].startswith(f"{__file__}:")
    (change,) = changes_for(["memory.no_checkpoint"], {"memory.no_checkpoint": runtime.applied})
    assert change.where == entry["site"] and "h = block(h)" in change.text


def test_a_compiled_region_keeps_dynamo_s_own_checkpoint(runtime: Runtime) -> None:
    """Dynamo knows the checkpoint by identity (torch._dynamo.utils.is_utils_checkpoint: whatever
    torch.utils.checkpoint.checkpoint is) and turns it into its checkpoint operator: the replacement is
    never traced, adds no graph break, and a compiled region checkpoints as before (its backward is
    one CompiledFunctionBackward node, which HW-19 does not read either)."""
    torch._dynamo.reset()
    patch_checkpoint.install(torch, runtime)
    block = torch.nn.Linear(16, 16)

    @torch.compile(backend="aot_eager", fullgraph=True)  # fullgraph: a graph break raises
    def f(x: torch.Tensor) -> torch.Tensor:
        return tuc.checkpoint(block, x, use_reentrant=False)

    x = torch.ones(2, 16)
    f(x).sum().backward()
    assert torch.equal(block.weight.grad, torch.ones(16, 1) * x.sum(0))
    assert runtime.applied == []  # nothing of ours ran
    torch._dynamo.reset()


def test_hugging_face_s_layers_get_the_training_arguments() -> None:
    entries = [{"id": "memory.no_checkpoint", "target": "torch.utils.checkpoint", "site": None, "set": {}, "was": {},
                "library": "transformers", "library_site": "/x/transformers/modeling_layers.py:123"}]
    (change,) = changes_for(["memory.no_checkpoint"], {"memory.no_checkpoint": entries})
    assert "gradient_checkpointing=False" in change.text and "TrainingArguments" in change.where
