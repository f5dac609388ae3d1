"""Batch fingerprints (probe/batches.py): equal for the same batch, different for another, and never a
copy, a device read or an error on what a loader may hand over."""

from __future__ import annotations

from collections import UserDict

import pytest

torch = pytest.importorskip("torch")

from torchdoctor.probe.batches import FINGERPRINT_ELEMENTS, fingerprint  # noqa: E402


def test_the_same_batch_the_same_fingerprint_another_batch_another():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    assert fingerprint(torch, (x, y)) == fingerprint(torch, (x.clone(), y.clone()))
    assert fingerprint(torch, (x, y)) != fingerprint(torch, (torch.randn(16, 3, 8, 8, generator=g), y))
    # Hugging Face's batches are mappings (a dict, or a BatchEncoding: a UserDict): token ids first.
    ids = torch.randint(0, 32000, (4, 256), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones(4, 256, dtype=torch.long), "labels": ids}
    assert fingerprint(torch, batch) == fingerprint(torch, dict(batch)) == fingerprint(torch, UserDict(batch))
    assert fingerprint(torch, batch) != fingerprint(torch, {**batch, "input_ids": ids.flip(0)})
    # Only the leading elements are read: a change past them in a large tensor is not seen (cheap by design).
    big = torch.zeros(2 * FINGERPRINT_ELEMENTS)
    changed = big.clone()
    changed[-1] = 1.0
    assert fingerprint(torch, big) == fingerprint(torch, changed)


def test_nothing_readable_no_fingerprint():
    assert fingerprint(torch, None) is None and fingerprint(torch, "text") is None
    assert fingerprint(torch, [torch.ones(4, 4).t()]) is None  # non-contiguous: a view would copy it
    assert fingerprint(torch, {"mask": torch.ones(3, dtype=torch.bool)}) is None
    sparse = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.tensor([1.0]), (3,), check_invariants=True)
    assert fingerprint(torch, [sparse]) is None
    assert fingerprint(torch, [torch.empty(0)]) is None
    assert fingerprint(torch, [torch.ones(2, 2, requires_grad=True)]) == 10.0  # 1+2+3+4; no autograd graph built
    assert fingerprint(torch, [torch.tensor([1.0, float("nan")])]) is None  # a NaN matches nothing, itself included

    class Meta(torch.Tensor):  # a subclass's __torch_function__ would run the job's code (MONAI's MetaTensor)
        pass

    assert fingerprint(torch, [torch.ones(3).as_subclass(Meta)]) is None
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    assert fingerprint(torch, [nested]) is None
    # The job's own modes are left alone: nothing runs under them, and the job's default device is not ours.
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        assert fingerprint(torch, [torch.ones(3)]) is None
    assert counter.get_total_flops() == 0
