"""matmul.contiguous_input: a linear's non-contiguous input made contiguous (HW-20's remedy).

``torch.nn.functional.linear`` is replaced, the moment torch is imported, by a function that makes an
input of three or more dimensions contiguous when it is not and the weight needs no gradient, before
calling the original. torch's matmul then folds the input into one ``mm`` instead of a ``bmm`` over
the weight copied once per batch row (metrics/weight_copies.py). ``nn.Linear`` and torchtune's
``TiedLinear`` call ``F.linear`` through the module, so both are covered; a module that bound the
name before torch finished importing is not. It is done only where the input's copy is the smaller
one (the input has fewer elements than batch rows x the weight's). Inside a torch.compile'd region
the original runs unchanged: Dynamo sees ``is_compiling()`` and traces the original call, so the
compiled graphs are the job's own.

The same product, computed by one ``mm`` instead of a ``bmm``: the kernels may sum in another
order, so the results can differ in the last bits (class ``numerics``; `fix` checks the losses).
"""

from __future__ import annotations

import math
from typing import Any

from torchdoctor.probe import unseen

from . import runtime
from .runtime import Runtime

ID = "matmul.contiguous_input"
IDS = (ID,)


def install(torch: Any, rt: Runtime) -> None:
    if rt.active(ID) is None:
        return
    functional = torch.nn.functional
    orig = getattr(functional, "linear", None)
    if orig is None:
        rt.refuse(ID, "this torch has no torch.nn.functional.linear")
        return
    is_compiling = unseen.compiling()
    tensor = torch.Tensor
    said: list[bool] = []

    def note() -> None:
        said.append(True)
        try:
            site = runtime.creation_site()
            rt.did(ID, "linear", site.user, {"input": "made contiguous"}, {"input": "non-contiguous"},
                   library=site.library, library_site=site.library_site)
        except Exception as exc:
            rt.broken(IDS, exc)

    def linear(input: Any, weight: Any, bias: Any = None) -> Any:
        if (not is_compiling() and isinstance(input, tensor) and isinstance(weight, tensor) and input.dim() > 2
                and weight.dim() == 2 and not weight.requires_grad and not input.is_contiguous()
                and input.numel() < math.prod(input.shape[:-2]) * weight.numel()):
            if not said:
                note()
            input = input.contiguous()
        return orig(input, weight, bias)

    linear.__doc__ = orig.__doc__
    linear.__wrapped__ = orig  # type: ignore[attr-defined]
    functional.linear = linear
    rt.skip(ID, "no linear had a non-contiguous input of 3 or more dimensions against a weight without gradient")
