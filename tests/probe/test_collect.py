"""Facts the probe reads off live torch objects (probe/collect.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch


@pytest.mark.parametrize("param_dtype, itemsize, model_dtype", [
    (None, 4, torch.float32), (torch.bfloat16, 2, torch.float32), (None, 2, torch.bfloat16)])
def test_fsdp2_units_are_sized_in_the_dtype_they_are_gathered_in(param_dtype, itemsize, model_dtype):
    """pytorch/examples FSDP2 --mixed-precision (param_dtype=bf16): DI-16 priced keeping the
    parameters unsharded at their fp32 size, twice the memory it would take. A model built in bf16
    (torchtune's `dtype: bf16`) gathers bf16 without a policy, and its dtype is recorded: the
    advice to gather in bf16 does not apply to it."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    from torchdoctor.probe.collect import fsdp_facts

    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        model = torch.nn.Sequential(torch.nn.Linear(1000, 1000), torch.nn.Linear(1000, 500)).to(model_dtype)
        policy = MixedPrecisionPolicy(param_dtype=param_dtype)
        fully_shard(model[0], mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        model(torch.randn(2, 1000, dtype=model_dtype)).sum().backward()
        (facts,) = fsdp_facts(torch, [model])
        assert isinstance(model, FSDPModule) and facts.version == 2 and facts.units == 2
        assert facts.param_dtype == str(model_dtype).removeprefix("torch.")
        # The inner unit: 1000 x 1000 + 1000 elements; the root: 1000 x 500 + 500 (MB rounded to 3 places).
        assert facts.unit_mb_max == pytest.approx(1_001_000 * itemsize / 1e6, abs=1e-3)
        assert facts.model_mb == pytest.approx(1_501_500 * itemsize / 1e6, abs=1e-3)
    finally:
        dist.destroy_process_group()


def test_tensor_parallel_parameters_are_counted_and_fsdp2_ones_are_not():
    """pytorch/examples' tensor_parallel_example.py: parallelize_module turns the layers' weights into
    DTensors; FSDP2's own parameters are DTensors too, and stay FSDP's (fsdp_facts)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from torchdoctor.probe.collect import tensor_parallel_facts

    dist = torch.distributed
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        assert tensor_parallel_facts([torch.nn.Linear(4, 4)]) is None  # plain parameters
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        facts = tensor_parallel_facts([model])
        # Colwise: weight and bias sharded; rowwise: weight sharded, bias replicated (not counted).
        assert facts is not None and (facts.params, facts.layers, facts.mesh) == (3, 2, "tp=1")
        assert facts.model_mb == pytest.approx((10 * 32 + 32 + 32 * 5 + 5) * 4 / 1e6, abs=1e-3)
        sharded = torch.nn.Sequential(torch.nn.Linear(8, 8))
        fully_shard(sharded)
        assert tensor_parallel_facts([sharded]) is None
    finally:
        dist.destroy_process_group()


def test_a_loaders_epoch_is_its_own_ranks_batches():
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from torchdoctor.probe.collect import dataloader_facts

    data = TensorDataset(torch.zeros(4903, 1))
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=False)  # 2,452 samples on this rank
    facts = dataloader_facts(DataLoader(data, batch_size=32, sampler=sampler), None)
    assert (facts.dataset_len, facts.batches_per_epoch) == (4903, 77)
    assert dataloader_facts(DataLoader(data, batch_size=32, drop_last=True), None).batches_per_epoch == 153

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

        def __len__(self):
            return 10

    loader = DataLoader(Stream(), batch_size=4)
    facts = dataloader_facts(loader, None)
    # len(loader) would record the length on the loader and change the warnings it gives later.
    assert facts.batches_per_epoch is None and loader._IterableDataset_len_called is None
    len(loader)
    assert loader._IterableDataset_len_called == 10  # what the check above would catch


def test_a_loader_with_a_batch_sampler_has_its_batch_size():
    """accelerate's prepare() builds every loader with batch_sampler=: its batch_size is None, and fix
    printed no samples/s for denoising-diffusion-pytorch's Trainer."""
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    from torchdoctor.probe.collect import dataloader_facts

    data = torch.zeros(10, 1)
    loader = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 4, drop_last=False))
    assert loader.batch_size is None
    assert dataloader_facts(loader, None).batch_size == 4
    assert dataloader_facts(DataLoader(data, batch_size=None), None).batch_size is None  # samples one by one

    class Shard(BatchSampler):  # accelerate's BatchSamplerShard(split_batches=True): a share of each batch
        split_batches, num_processes = True, 2

    loader = DataLoader(data, batch_sampler=Shard(SequentialSampler(data), 4, drop_last=False))
    assert dataloader_facts(loader, None).batch_size == 2


def test_the_models_device_kind_is_read_through_its_wrappers():
    # Read when the roots are found (end of step 0): a model inside main() is gone at exit.
    from torchdoctor.probe.collect import device_of_kind, model_device_kind

    class Wrapper(torch.nn.Module):  # DDP and torch.compile hold the model as .module / ._orig_mod
        def __init__(self, module):
            super().__init__()
            self.module = module

    on_meta = torch.nn.Linear(4, 4, device="meta")
    assert model_device_kind([Wrapper(on_meta), torch.nn.Linear(2, 2, device="meta")]) == "meta"
    assert model_device_kind([torch.nn.ReLU()]) is None  # nothing to read: no verdict on the device
    assert device_of_kind(torch, "cpu").kind == "cpu"
