"""memory.no_checkpoint on real torch.utils.checkpoint calls, in-process (torch's function is restored)."""

from __future__ import annotations

import functools
import sys
import types

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
    orig = tuc.checkpoint
    monkeypatch.setenv(ENV_SAID, "")
    rt = Runtime()
    spec, why = parse("memory.no_checkpoint")
    assert spec is not None, why
    rt.specs[spec.id] = spec
    yield rt
    # torch's function back everywhere a replacement went: the module, and modules that imported the
    # name while it was replaced (FSDP's checkpoint_wrapper binds it at import).
    for mod in list(sys.modules.values()):
        names = getattr(mod, "__dict__", None)
        if isinstance(names, dict) and str(getattr(mod, "__name__", "")).startswith("torch"):
            for key, value in list(names.items()):
                if type(value) is types.FunctionType and value.__dict__.get("__wrapped__") is orig:
                    names[key] = orig
    assert tuc.checkpoint is orig


def _step(blocks: list[Block], call) -> list[torch.Tensor]:
    torch.manual_seed(0)
    h = torch.ones(4, 16, requires_grad=True)  # a reentrant checkpoint needs an input that requires grad
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


def test_a_reentrant_segment_without_an_input_that_requires_grad_still_trains_nothing(runtime: Runtime) -> None:
    """torch's reentrant checkpoint gives such a segment's parameters no gradient (it warns); a plain call
    would train them, and the job would learn something else."""
    import warnings

    def grads() -> tuple[bool, bool]:
        torch.manual_seed(2)
        inner, outer = torch.nn.Linear(4, 4), torch.nn.Parameter(torch.ones(4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's "None of the inputs have requires_grad=True"
            out = tuc.checkpoint(inner, torch.ones(2, 4), use_reentrant=True)
        (out.sum() + outer.sum()).backward()
        return inner.weight.grad is None, outer.grad is not None

    assert grads() == (True, True)  # torch's own
    patch_checkpoint.install(torch, runtime)
    assert grads() == (True, True)
    assert runtime.applied  # it did replace the call


def _backward_graph_ops(runtime: Runtime | None) -> list[str]:
    """The ops of the backward graph AOTAutograd builds for a compiled checkpointed block."""
    from functorch.compile import default_partition, make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    torch._dynamo.reset()
    if runtime is not None:
        patch_checkpoint.install(torch, runtime)
    seen: list[str] = []

    def forward(gm, _):
        return make_boxed_func(gm.forward)

    def backward(gm, _):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)

    block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 16))

    # The default partition saves every activation unless the checkpoint tags it for recomputation.
    compiler = aot_autograd(fw_compiler=forward, bw_compiler=backward, partition_fn=default_partition)

    @torch.compile(backend=compiler, fullgraph=True)
    def f(x: torch.Tensor) -> torch.Tensor:  # fullgraph: a graph break raises
        return tuc.checkpoint(block, x, use_reentrant=False)

    f(torch.ones(2, 16, requires_grad=True)).sum().backward()
    torch._dynamo.reset()
    return sorted(seen)


def test_a_compiled_region_keeps_dynamo_s_own_checkpoint(runtime: Runtime) -> None:
    """Dynamo knows the checkpoint by identity (torch._dynamo.utils.is_utils_checkpoint: whatever
    torch.utils.checkpoint.checkpoint is) and turns it into its checkpoint operator, which calls the
    function again from torch._higher_order_ops.wrap: that call gets torch's own, so the backward graph
    still recomputes the block (a compiled region's backward is one CompiledFunctionBackward node, which
    HW-19 does not read either), and nothing of ours is traced."""
    before = _backward_graph_ops(None)
    assert "aten.gelu.default" in before and "aten.addmm.default" in before  # the block's forward, again
    assert _backward_graph_ops(runtime) == before
    assert runtime.applied == []


@pytest.mark.parametrize("helper", ["checkpoint_sequential", "checkpoint_wrapper"])
def test_torch_s_helpers_are_named_in_the_permanent_change(runtime: Runtime, helper: str) -> None:
    """The call site skips torch's frames, so it is the job's line that called the helper: the change
    names the helper, not a checkpoint call that line does not have."""
    patch_checkpoint.install(torch, runtime)
    x = torch.ones(2, 16, requires_grad=True)
    if helper == "checkpoint_sequential":
        seq = torch.nn.Sequential(Block(), Block())
        tuc.checkpoint_sequential(seq, 2, x, use_reentrant=False).sum().backward()
        assert [m.calls for m in seq] == [1, 1]
    else:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        block = Block()
        checkpoint_wrapper(block)(x).sum().backward()
        assert block.calls == 1
    (entry,) = runtime.applied
    assert entry["set"]["via"] == helper and entry["site"].startswith(f"{__file__}:")
    (change,) = changes_for(["memory.no_checkpoint"], {"memory.no_checkpoint": runtime.applied})
    assert helper in change.where
    assert ("y = model(x)" if helper == "checkpoint_sequential" else "apply_activation_checkpointing") in change.text


def test_hugging_face_s_layers_get_the_training_arguments() -> None:
    entries = [{"id": "memory.no_checkpoint", "target": "torch.utils.checkpoint", "site": None, "set": {}, "was": {},
                "library": "transformers", "library_site": "/x/transformers/modeling_layers.py:123"}]
    (change,) = changes_for(["memory.no_checkpoint"], {"memory.no_checkpoint": entries})
    assert "gradient_checkpointing=False" in change.text and change.where == "the setting that turns it on in transformers"
    assert change.text.startswith("# The Trainer turns it on from TrainingArguments(gradient_checkpointing=True)")
