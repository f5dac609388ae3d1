"""Optimizer remedies: ``foreach=True`` / ``fused=True`` on torch.optim's optimizers.

Each built-in optimizer class whose constructor takes the argument gets a wrapper (subclasses
calling ``super().__init__`` go through it too). A choice of the remedy's own kind the code made
is left alone (fused=True, or foreach=True for optim.foreach, or differentiable=True); the choice
a finding is about is replaced (``plan``). fused kernels check devices and dtypes only at the first
``step()``, so that check is made here, at construction, where the user's arguments can still be
used instead (advice/optimizer.fused_problem: the class's kernel for the device, floating point,
DTensor, and the sparse gradients an nn.Embedding(sparse=True) will give its weight).
"""

from __future__ import annotations

import inspect
from typing import Any

from . import runtime
from ._shim import kwargs_shim
from .runtime import Runtime

IDS = ("optim.fused", "optim.foreach")


def _tensors(params: list[Any]) -> list[Any]:
    out = []
    for p in params:
        if isinstance(p, dict):
            out.extend(p.get("params", []) if isinstance(p.get("params"), (list, tuple)) else [p.get("params")])
        elif isinstance(p, tuple) and len(p) == 2:  # named parameters
            out.append(p[1])
        else:
            out.append(p)
    return out


def fused_problem(torch: Any, cls: str, params: list[Any]) -> str | None:
    """Why fused kernels cannot take these parameters, or None (advice/optimizer.fused_problem).
    SGD and Adagrad take sparse gradients, which fused kernels do not: no gradient exists at
    construction, so the weights of nn.Embedding / nn.EmbeddingBag(sparse=True) modules are looked
    up (one walk over the live objects, for those classes only)."""
    from torchdoctor.advice.optimizer import fused_problem as problem

    return problem(torch, cls, _tensors(params), _sparse_weights(torch) if cls in ("SGD", "Adagrad") else frozenset())


def _sparse_weights(torch: Any) -> frozenset[int]:
    import gc

    kinds = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    # type(), not isinstance(): isinstance reads __class__, which deprecated proxies (torch.distributed.
    # reduce_op) answer with a warning.
    return frozenset(id(o.weight) for o in gc.get_objects()
                     if issubclass(type(o), kinds) and getattr(o, "sparse", False))


def plan(torch: Any, rt: Runtime, cls: type, a: dict[str, Any]) -> dict[str, Any]:
    """The arguments to change. An explicit choice of the remedy's own kind is left alone (fused=True
    for either, foreach=True for optim.foreach, differentiable=True); the choice the finding is
    about is replaced: fused=False or foreach=True for optim.fused (llm.c and nanoGPT pass
    fused=(device == "cuda"), so a CPU run keeps the per-parameter loop), foreach=False for
    optim.foreach (HO-9's "AdamW(foreach=False) on an accelerator")."""
    names = inspect.signature(cls.__init__).parameters
    fused, foreach = rt.active("optim.fused"), rt.active("optim.foreach")
    if a.get("fused") or a.get("differentiable"):
        for rid in IDS:
            if rt.active(rid):
                rt.skip(rid, f"{cls.__name__} was given {'fused' if a.get('fused') else 'differentiable'}=True")
        return {}
    if fused is not None:
        problem = fused_problem(torch, cls.__name__, a.get("params", []))
        if "fused" not in names:
            rt.skip(fused.id, f"{cls.__name__} has no fused implementation")
        elif problem:
            rt.refuse(fused.id, problem)
        else:
            # fused and foreach cannot both be True: a foreach=True the code passed gives way.
            return {"fused": True, **({"foreach": None} if a.get("foreach") else {})}
    if foreach is not None:
        if "foreach" not in names:
            rt.skip(foreach.id, f"{cls.__name__} has no foreach implementation")
        elif a.get("foreach"):
            rt.skip(foreach.id, f"{cls.__name__} was given foreach=True")
        else:
            return {"foreach": True}
    return {}


def _wrap(torch: Any, rt: Runtime, cls: type) -> None:
    orig = cls.__dict__["__init__"]
    sig = inspect.signature(orig)
    last: dict[str, Any] = {}

    def adjust(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        last.clear()
        bound = sig.bind(*args, **kwargs)
        params = bound.arguments.get("params")
        listed = params is not None and not isinstance(params, (torch.Tensor, list, tuple))
        if listed:
            bound.arguments["params"] = list(params)  # a generator must survive a retry
        new = plan(torch, rt, cls, bound.arguments)
        plain = (bound.args, bound.kwargs)
        if not new:
            return (plain, plain) if listed else None  # the generator is spent: pass the list on
        where = runtime.creation_site(cls.__name__)
        site = last["site"] = where.user
        rid = last["id"] = "optim.fused" if new.get("fused") else "optim.foreach"
        rt.did(rid, cls.__name__, site, new, {key: bound.arguments.get(key) for key in new}, library=where.library)
        bound.arguments.update(new)
        return (bound.args, bound.kwargs), plain

    def rejected(exc: BaseException) -> None:
        # The optimizer did not accept it: it is built as the user wrote it.
        rid, site = last.get("id"), last.get("site")
        rt.applied[:] = [e for e in rt.applied if not (e["id"] == rid and e["site"] == site)]
        if rid:
            rt.refuse(rid, f"{cls.__name__} refused it: {type(exc).__name__}: {exc}")

    cls.__init__ = kwargs_shim(orig, adjust, rejected, lambda exc: rt.broken(IDS, exc))  # type: ignore[method-assign]


def install(torch: Any, rt: Runtime) -> None:
    if not any(rt.active(i) for i in IDS):
        return
    seen: set[int] = set()
    for obj in vars(torch.optim).values():
        if not (isinstance(obj, type) and issubclass(obj, torch.optim.Optimizer)) or obj is torch.optim.Optimizer:
            continue
        if id(obj) in seen or "__init__" not in obj.__dict__:
            continue
        seen.add(id(obj))
        params = inspect.signature(obj.__init__).parameters
        if "foreach" in params or "fused" in params:
            _wrap(torch, rt, obj)
