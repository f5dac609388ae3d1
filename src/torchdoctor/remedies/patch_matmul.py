"""matmul.contiguous_input: a linear whose input matmul would not fold, computed as one mm (HW-20's remedy).

``torch.nn.functional.linear`` is replaced, the moment torch is imported, by a function that computes
an input of three or more dimensions that torch's matmul would not fold (ATen's ``should_fold``: the
leading dimensions' strides are not those of one row-major block; a weight that needs a gradient
folds anyway) as ``linear(input.reshape(-1, in), weight, bias)`` viewed back to the input's leading
shape. torch's matmul would run a ``bmm`` over the weight expanded to the batch instead
(metrics/weight_copies.py). A batch of one is such an input too: a sequence chunk of [1, S, D] is
contiguous, but its strides are the whole sequence's, and matmul does not fold it. The reshape is
a view where one is possible, else a copy of the input, which is done only where it is the smaller
one (fewer elements than batch rows x the weight's).

``nn.Linear`` and torchtune's ``TiedLinear`` call ``F.linear`` through the module, so both are
covered; a module that bound the name before torch finished importing is not. Inside a
torch.compile'd region the original runs unchanged (Dynamo folds ``is_compiling()``), and
TorchScript keeps ``aten::linear`` for the wrapper (it is registered as that builtin). torch.ao's FX
quantization keys tables on ``F.linear``: those it builds when it loads are built first, with the
original in place, and the first call of its entry points (``prepare_fx`` ...) puts the original
back and refuses the remedy for the job, before the patterns they build.

The same product, computed by one ``mm`` instead of a ``bmm``: the kernels may sum in another
order, so the results can differ in the last bits (class ``numerics``; `fix` checks the losses).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
from typing import Any

from torchdoctor.probe import imphook, unseen

from . import runtime
from .runtime import Runtime

ID = "matmul.contiguous_input"
IDS = (ID,)
MAX_SITES = 3
# torch.ao's FX quantization: its entry points build patterns keyed on F.linear when called (torchtune's import
# of torchao loads the modules whether the job quantizes or not, so only a call says the job does).
_QUANTIZE_FX = "torch.ao.quantization.quantize_fx"
_QUANTIZE_ENTRIES: dict[str, tuple[str, ...]] = {
    _QUANTIZE_FX: ("prepare_fx", "prepare_qat_fx", "convert_fx", "convert_to_reference_fx", "fuse_fx"),
    "torch.ao.quantization.backend_config": (
        "get_native_backend_config", "get_native_backend_config_dict", "get_fbgemm_backend_config",
        "get_qnnpack_backend_config", "get_x86_backend_config", "get_onednn_backend_config",
        "get_executorch_backend_config", "get_tensorrt_backend_config"),
    "torch.ao.quantization": ("get_default_qconfig_mapping", "get_default_qat_qconfig_mapping"),
    "torch.ao.quantization.qconfig_mapping": (
        "get_default_qconfig_mapping", "get_default_qat_qconfig_mapping", "QConfigMapping.set_object_type",
        "QConfigMapping.set_module_name_object_type_order"),
}


def folds(x: Any) -> bool:
    """Whether torch's matmul folds ``x`` (3+ dimensions) into a matrix without a copy: its leading
    dimensions' strides are those of one row-major block (ATen's should_fold, LinearAlgebra.cpp)."""
    if x.numel() == 0:
        return True
    sizes, strides = x.shape, x.stride()
    return all(strides[i] == strides[i + 1] * sizes[i + 1] for i in range(x.dim() - 2))


def install(torch: Any, rt: Runtime) -> None:
    if rt.active(ID) is None:
        return
    functional = torch.nn.functional
    orig = getattr(functional, "linear", None)
    register = getattr(getattr(getattr(torch, "jit", None), "_builtins", None), "_register_builtin", None)
    if orig is None or register is None:
        rt.refuse(ID, "this torch has no torch.nn.functional.linear or no way to keep TorchScript's aten::linear")
        return
    # torch.ao's FX quantization keys module-level tables on F.linear when it loads: load it first (18 ms), with
    # the original in place; the tables its entry points build when called are handled by _guard_quantize_fx.
    with contextlib.suppress(Exception):
        importlib.import_module(_QUANTIZE_FX)
    is_compiling = unseen.compiling()
    tensor = torch.Tensor
    overrides = torch.overrides
    has_torch_function, handle_torch_function = overrides.has_torch_function, overrides.handle_torch_function
    sites: set[Any] = set()

    def note() -> None:
        try:
            site = runtime.creation_site()
            key = site.user or site.library_site
            if key in sites or len(sites) >= MAX_SITES:
                return
            sites.add(key)
            rt.did(ID, "linear", site.user, {"input": "folded into one mm"}, {"input": "a bmm over the weight"},
                   library=site.library, library_site=site.library_site)
        except Exception as exc:
            rt.broken(IDS, exc)

    def linear(input: Any, weight: Any, bias: Any = None) -> Any:
        if (isinstance(input, tensor) and isinstance(weight, tensor) and not is_compiling()
                and has_torch_function((input, weight, bias))):
            # A tensor subclass's __torch_function__ (torch's expanded weights, torchao's NF4Tensor) keys its
            # table on F.linear as it was when that table was built: after torch's import, this function.
            return handle_torch_function(linear, (input, weight, bias), input, weight, bias=bias)
        if (not is_compiling() and isinstance(input, tensor) and isinstance(weight, tensor) and input.dim() > 2
                and weight.dim() == 2 and not weight.requires_grad and (bias is None or bias.dim() <= 1)
                and not folds(input) and rt.active(ID) is not None):
            try:
                flat = input.view(-1, input.shape[-1])
            except RuntimeError:  # not viewable: a copy of the input, only where the smaller one
                flat = (input.reshape(-1, input.shape[-1])
                        if input.numel() < math.prod(input.shape[:-2]) * weight.numel() else None)
            if flat is not None:
                if len(sites) < MAX_SITES:
                    note()
                return orig(flat, weight, bias).view(*input.shape[:-1], weight.shape[0])
        return orig(input, weight, bias)

    linear.__doc__ = orig.__doc__
    functional.linear = linear
    try:
        register(linear, "aten::linear")  # TorchScript compiles the wrapper as the builtin it replaces
    except Exception as exc:
        functional.linear = orig
        rt.refuse(ID, f"TorchScript would not compile the replaced F.linear ({type(exc).__name__})")
        return
    for name, entries in _QUANTIZE_ENTRIES.items():
        imphook.when_imported(name, lambda module, entries=entries: _guard_quantize_fx(
            module, entries, functional, orig, linear, rt))
    rt.skip(ID, "no linear had an input of 3 or more dimensions that matmul would not fold, against a weight "
                "without gradient")


def _guard_quantize_fx(module: Any, entries: tuple[str, ...], functional: Any, orig: Any, wrapper: Any,
                       rt: Runtime) -> None:
    """Wrap torch.ao's FX quantization entry points (and what builds its tables keyed on F.linear: the backend
    configs, a QConfigMapping's object types): the first call puts the original F.linear back and refuses the
    remedy, before any pattern is built; an argument that is the wrapper (a job's F.linear, read while the remedy
    was on) is passed as the original. Never raises."""
    try:
        for name in entries:
            owner, _, attr = name.rpartition(".")
            target = getattr(module, owner) if owner else module
            fn = getattr(target, attr, None)
            if fn is None:
                continue

            def entry(*args: Any, __fn: Any = fn, **kwargs: Any) -> Any:
                if functional.linear is not orig:
                    functional.linear = orig
                    rt.refuse(ID, "the job quantizes with torch.ao's FX flow, which finds F.linear by identity")
                args = tuple(orig if a is wrapper else a for a in args)
                kwargs = {k: orig if v is wrapper else v for k, v in kwargs.items()}
                return __fn(*args, **kwargs)

            setattr(target, attr, functools.wraps(fn)(entry))
    except Exception as exc:
        rt.broken(IDS, exc)
