"""Dynamo's failing guards, read as text: which input changed, how, and the values it took.

Pure string work on what Dynamo prints (``torch._dynamo.utils.guard_failures``, the
``recompile_reason`` of its compilation metrics, TORCH_TRACE's ``recompile_reasons``), shared by
the live probe and the TORCH_TRACE reader. No torch import.
"""

from __future__ import annotations

import re

_MAX_VALUES = 12
# "0/7: tensor 'x' size mismatch at index 0. expected 11, actual 12"
_ENTRY = re.compile(r"^\s*\d+/\d+:\s*")
_TENSOR = re.compile(r"tensor '(.+?)' (\w[\w ]*?) mismatch")  # names may quote: 'targets[0]['boxes']'
_INDEX = re.compile(r"at index (\d+)")
_EXPECTED = re.compile(r"expected ([^,]+), actual ([^\s.,]+)")
_VALUE = re.compile(r"^(.+?)\s*==\s*(.+?)\s*(?:#.*)?$")
# A symbolic shape guard, once a dimension is dynamic: "2 <= targets[1]['boxes'].size()[0]",
# "L['x'].size()[1] == 64", "x.stride()[0] <= 4096" (the tensor, size or stride, the dimension).
_SYMBOLIC = re.compile(r"(?P<t>(?:L\[)?[A-Za-z_][\w.\[\]'\"]*?)\.(?P<what>size|stride)\(\)\[(?P<d>\d+)\]")
_RELATION = re.compile(r"<=|>=|==|!=|<|>")
# The guard a dynamic dimension fails when it is 0 or 1: Dynamo compiles sizes 0 and 1 apart even
# for a dynamic dimension ("0/1 specialization").
_BELOW_TWO = re.compile(r"^\s*2\s*<=\s*\S+\.size\(\)\[\d+\]\s*$")
# A symbolic guard pinning a dynamic dimension to one value: "L['x'].size()[1] == 64".
_PINNED = re.compile(r"\.(?:size|stride)\(\)\[\d+\]\s*==\s*(-?\d+)\s*$")
# Guards are one line of Dynamo's text (untrusted when read from a log): longer ones are cut, so that
# no pattern's backtracking can grow with them.
_MAX_GUARD = 1000


def guard_kind(guard: str) -> tuple[str, str | None, int | None]:
    """(kind, tensor name, dim) of a failing guard as Dynamo prints it.

    Kinds: "size", "stride", "rank", "dtype", "requires_grad", "device" (tensor guards from
    C++ ``TensorCheck``, "dispatch key set" and "device index" both mean device/layout/autocast;
    size and stride also from the symbolic guards of a dynamic dimension, ``2 <= x.size()[0]``),
    "global_state" (grad mode, autocast, num_threads...), "value" (a Python value compared with
    ``==``), "identity" (``___check_obj_id``/``___check_type_id``: a different object or type),
    "length" (``len(...) == n``), else "other".
    """
    text = _ENTRY.sub("", guard[:_MAX_GUARD]).strip()
    m = _TENSOR.search(text)
    if m:
        what = m.group(2).strip()
        kind = {"size": "size", "stride": "stride", "rank": "rank", "dtype": "dtype",
                "requires_grad": "requires_grad", "dispatch key set": "device",
                "device index": "device"}.get(what, "other")
        idx = _INDEX.search(text)
        return kind, m.group(1), int(idx.group(1)) if idx else None
    if text.startswith("GLOBAL_STATE"):
        return "global_state", None, None
    line = first_line(text)
    sym = _SYMBOLIC.search(line)
    if sym and _RELATION.search(line):
        return sym.group("what"), local_name(sym.group("t")), int(sym.group("d"))
    if "___check_obj_id" in text or "___check_type_id" in text:
        return "identity", None, None
    if text.startswith("len("):
        return "length", None, None
    if _VALUE.match(text.split("\n", 1)[0]):
        return "value", _VALUE.match(text.split("\n", 1)[0]).group(1).strip(), None  # type: ignore[union-attr]
    return "other", None, None


def local_name(name: str) -> str:
    """A guarded name as the user's code spells it: Dynamo's L['x'] -> x, L['t'][0] -> t[0] (G[...]
    for globals likewise); a name already so (targets[1]['boxes']) stays."""
    m = re.fullmatch(r"[LG]\['([^']+)'\](.*)", name)
    return m.group(1) + m.group(2) if m else name


def below_two(guard: str) -> bool:
    """A symbolic size guard failed because the dimension was 0 or 1 (``2 <= x.size()[d]``)."""
    return bool(_BELOW_TWO.match(first_line(guard)))


def pinned(guard: str) -> str | None:
    """The value a symbolic guard pins a dynamic dimension to (``x.size()[1] == 64`` -> "64"): code
    that specializes the size (an int() of it, a branch on it); None for other guards."""
    m = _PINNED.search(first_line(guard))
    return m.group(1) if m else None


def first_line(guard: str) -> str:
    """The guard itself: its first line, without the "frame/entry: " prefix and the source comment."""
    line = _ENTRY.sub("", (guard or "").split("\n", 1)[0]).strip()
    return re.sub(r"\s{2,}#.*$", "", line)[:300]


def observed_values(guards: list[str], kind: str, tensor: str | None, dim: int | None) -> list[str]:
    """Distinct values the guarded size or Python value took, in the order first seen."""
    seen: dict[str, None] = {}
    for g in guards:
        line = first_line(g)
        if kind in ("size", "stride") and tensor is not None and dim is not None and f"[{dim}]" in line \
                and tensor in line and (value := pinned(line)) is not None:
            seen.setdefault(value, None)  # a dynamic dimension pinned to a value, once per value
            continue
        if kind in ("size", "stride", "rank", "dtype") and tensor is not None:
            if f"tensor '{tensor}'" not in line or (dim is not None and f"index {dim}." not in line):
                continue
            m = _EXPECTED.search(line)
            if m:
                seen.setdefault(m.group(1).strip(), None)
                seen.setdefault(m.group(2).strip(), None)
        elif kind == "value" and tensor is not None:
            m = _VALUE.match(line)
            if m and m.group(1).strip() == tensor:
                seen.setdefault(m.group(2).strip(), None)
    return list(seen)[:_MAX_VALUES]
