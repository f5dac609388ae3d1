"""A cheap fingerprint of a batch, so that ranks can tell whether they drew the same batches (DI-17).

Ranks of a data-parallel job should each draw their own share of the data; DDP without a
DistributedSampler gives every rank the same batches, and nothing in the step times shows it. The
loss tells on a CPU (facts.loss_samples), but a loss on a device is never read (a sync). The
batch is still on the host when the DataLoader hands it over: the sum of the first
FINGERPRINT_ELEMENTS elements of its first few host tensors, each weighted by its position, is a few
microseconds of work on the first BATCH_SAMPLES batches outside the profiler's window, and equal
sums at the same batch index on two ranks mean the same batch.

Only plain contiguous strided CPU tensors of torch.Tensor itself are read (a view of a non-contiguous
tensor would copy it; a device tensor would sync; a subclass's __torch_function__ runs the job's code;
a nested tensor has no flat view), and nothing while the job runs under a dispatch or torch-function
mode of its own (a FlopCounterMode would count our ops, a FakeTensorMode would hand back fakes); a
fingerprint that is not finite (a NaN in the batch) is none. Anything else gives no fingerprint.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from torchdoctor.probe import unseen

BATCH_SAMPLES = 8
FINGERPRINT_ELEMENTS = 4096
TENSORS = 3  # the first tensors of a batch read (inputs, then masks or labels)


def fingerprint(torch: Any, batch: Any) -> float | None:
    """The batch's fingerprint, or None when it holds no readable host tensor."""
    if unseen.in_job_mode(torch):
        return None
    tensors = _tensors(torch, batch, [])
    if not tensors:
        return None
    total = 0.0
    with torch.no_grad():
        weights = _weights(torch)
        for i, t in enumerate(tensors):
            flat = t.view(-1)[:FINGERPRINT_ELEMENTS]
            # Weighted by position: the same samples in another order are another batch.
            total += (i + 1) * float(flat.to(torch.float64).dot(weights[:flat.numel()]))
    return total if math.isfinite(total) else None


@functools.cache
def _weights(torch: Any) -> Any:
    # On the CPU whatever the job's default device (set_default_device, a `with torch.device(...)`).
    return torch.arange(FINGERPRINT_ELEMENTS, dtype=torch.float64, device="cpu").remainder_(251).add_(1)


def _tensors(torch: Any, x: Any, out: list[Any], depth: int = 0) -> list[Any]:
    if len(out) >= TENSORS or depth > 4:
        return out
    if isinstance(x, torch.Tensor):
        if (type(x) is torch.Tensor and x.device.type == "cpu" and x.layout == torch.strided and not x.is_nested
                and x.numel() and x.is_contiguous() and not x.is_complex() and not x.is_quantized
                and x.dtype != torch.bool):
            out.append(x)
        return out
    if isinstance(x, Mapping):  # a dict, or transformers' BatchEncoding (a UserDict)
        items: Any = list(x.values())
    elif isinstance(x, (list, tuple)):
        items = x
    else:
        return out
    for item in items[:8]:
        _tensors(torch, item, out, depth + 1)
    return out
