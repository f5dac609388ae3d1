"""What Inductor made of each compiled graph, read from its output code (no torch, nothing executed).

The probe keeps the output-code module of every graph Inductor compiled or loaded from its cache
(probe/compile_cache.py: ``caches/output_code/*.py``) and, per captured Dynamo graph, the user
line of each node. The output code's ``call`` launches, in order, the generated kernels and the
extern calls (reference section 6):
- a generated kernel: ``cpp_fused_<ops>_<n>(...)`` on a CPU, ``triton_<cat>_fused_<ops>_<n>.run(...)``
  on a GPU; its fused ATen ops are the comment above the launch (``# Topologically Sorted Source
  Nodes: [a, b], Original ATen: [aten.x, aten.y]``) where Inductor writes one, else the op names in
  its name (sorted and deduplicated by Inductor, so not in execution order);
- an extern call: ``extern_kernels.mm/addmm/bmm/convolution(...)`` (a library GEMM or convolution,
  not fused), and ATen fallbacks ``torch.ops.aten.<op>.<overload>(...)``, written ``aten.<op>.<overload>(...)``
  by torch 2.14 (``aten.scatter_reduce_.two``, ``aten.randint.low_out``).
A comment belongs to the next launch only: torch 2.14 writes none above C++ kernels, so a comment
above a fallback must not pass to the kernel after it (PyG's compiled GIN: dropout's seed call).
Source nodes are the Dynamo graph's node names: they lead to the user's lines.
"""

from __future__ import annotations

import os
import re
from typing import Any

_COMMENT = re.compile(r"#\s*(?:Topologically Sorted|Unsorted) Source Nodes: \[([^\]]*)\], Original ATen: \[([^\]]*)\]")
_KERNEL_CALL = re.compile(r"^\s+((?:cpp|triton)_\w+?)(?:\.run)?\(")
_EXTERN = re.compile(r"^\s+(?:\w+\s*=\s*)?extern_kernels\.(\w+)\(")
_FALLBACK = re.compile(r"^\s+(?:\w+\s*=\s*)?(?:torch\.ops\.)?aten\.(\w+)\.\w+\(")
_TRITON_CAT = re.compile(r"^triton_(poi|red|per|tem|for|spl|unk)_")
_SUFFIX = re.compile(r"_\d+$")
# Kernels named past this many ops would make the console line unreadable.
MAX_OPS = 12


# Words of multi-word ATen op names: joined to the word before (SUFFIXES) or after (PREFIXES) when a
# kernel's name is split back into ops ("gelu_gelu_backward_sum" -> gelu, gelu_backward, sum).
SUFFIXES = frozenset({"backward", "forward", "with", "indices", "norm", "dense", "put", "like", "pool2d", "pool3d",
                      "pool1d", "nd", "reduce", "grad", "logits", "entropy", "bag", "loss", "legit", "functional",
                      "no"})
PREFIXES = frozenset({"native", "layer", "batch", "group", "instance", "adaptive", "index", "unsafe",
                      "log", "scaled", "binary", "cross", "upsample", "constant", "reflection", "replication", "where",
                      "nll", "smooth", "to", "new", "no"})
# "scatter" ends slice_scatter, select_scatter, ... and starts scatter_add, scatter_reduce: which one
# depends on its neighbour ("relu_scatter_add" is relu, scatter_add; "slice_scatter_add" is
# slice_scatter, add).
JOINS_AFTER = {"scatter": frozenset({"slice", "select", "masked", "diagonal", "strided"})}
STARTS = {"scatter": frozenset({"add", "reduce"})}


def ops_from_name(name: str) -> list[str]:
    """The op names Inductor put in a kernel's name ("cpp_fused_add_gelu_0" -> ["add", "gelu"]), once
    each: best effort (Inductor joins op names with "_", the same character many op names contain)."""
    body = _SUFFIX.sub("", _TRITON_CAT.sub("triton_", name))
    body = body.split("fused_", 1)[1] if "fused_" in body else ""
    words = [w for w in body.split("_") if w]
    ops: list[str] = []
    glue = False
    for i, word in enumerate(words):
        joined = bool(ops) and (glue or word in SUFFIXES or words[i - 1] in JOINS_AFTER.get(word, ()))
        if joined:
            ops[-1] += "_" + word
        else:
            ops.append(word)
        glue = word in PREFIXES or (not joined and i + 1 < len(words) and words[i + 1] in STARTS.get(word, ()))
    return list(dict.fromkeys(ops))[:MAX_OPS]


def parse(text: str) -> dict[str, Any]:
    """One output-code module: its launches in order, each a kernel or an extern call."""
    kernels: list[dict[str, Any]] = []
    externs: list[dict[str, Any]] = []
    body = text.split("def call(", 1)[1] if "def call(" in text else ""
    pending: tuple[list[str], list[str]] | None = None
    for line in body.splitlines():
        m = _COMMENT.search(line)
        if m:
            pending = ([n.strip() for n in m.group(1).split(",") if n.strip()],
                       [a.strip().removeprefix("aten.") for a in m.group(2).split(",") if a.strip()])
            continue
        nodes, aten = pending or ([], [])
        if (k := _KERNEL_CALL.match(line)) is not None:
            name = k.group(1)
            seen = next((x for x in kernels if x["name"] == name), None)
            if seen is not None:  # the same kernel launched again (each layer of a loop, say)
                seen["launches"] += 1
                seen["nodes"] += [n for n in nodes if n not in seen["nodes"]]
            else:
                kernels.append({"name": name, "kind": "triton" if name.startswith("triton") else "cpp",
                                "aten": aten or ops_from_name(name), "nodes": nodes,
                                "ops_from": "comment" if aten else "name", "launches": 1})
            pending = None
        elif (e := _EXTERN.match(line)) is not None:
            externs.append({"name": f"extern_kernels.{e.group(1)}", "aten": aten, "nodes": nodes})
            pending = None
        elif (f := _FALLBACK.match(line)) is not None:
            externs.append({"name": f"aten.{f.group(1)}", "aten": aten or [f.group(1)], "nodes": nodes, "fallback": True})
            pending = None
    return {"kernels": kernels, "externs": externs}


def lines_of(nodes: list[str], where: dict[str, str]) -> list[str]:
    """The user lines of source nodes, "file:line", in order, once each."""
    return list(dict.fromkeys(where[n] for n in nodes if n in where))


def report(folder: str, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per output-code module of a run's compile-cache record: its kernels and extern calls with
    their ops and user lines, and the Dynamo graphs' op count for comparison."""
    where: dict[str, str] = {}
    for g in record.get("graphs") or []:
        for node, line in (g.get("lines") or {}).items():
            where.setdefault(node, line)
    out = []
    for name in record.get("output_code") or []:
        try:
            with open(os.path.join(folder, "output_code", os.path.basename(name)), encoding="utf-8",
                      errors="replace") as f:
                got = parse(f.read())
        except OSError:
            continue
        for item in got["kernels"] + got["externs"]:
            item["lines"] = lines_of(item["nodes"], where)
            if not item["nodes"] and item["aten"]:
                # No source nodes written for it (C++ kernels on a CPU): the captured nodes named after
                # its ops ("mul", "mul_1", ...), a hint rather than provenance.
                named = [n for n in where if _SUFFIX.sub("", n) in item["aten"]]
                item["lines"] = lines_of(named, where)
                item["lines_from"] = "op names" if item["lines"] else None
        got["module"] = name
        out.append(got)
    return out


def summary(modules: list[dict[str, Any]], graph_ops: int | None) -> str:
    """One line: "2 graph(s): 14 ops -> 3 generated kernels + 4 extern calls (mm x2, addmm x2)"."""
    kernels = sum(len(m["kernels"]) for m in modules)
    externs = [e["name"].removeprefix("extern_kernels.") for m in modules for e in m["externs"]]
    counts = {n: externs.count(n) for n in dict.fromkeys(externs)}
    text = f"{len(modules)} compiled module(s)" + (f", {graph_ops} captured ops" if graph_ops else "")
    text += f" -> {kernels} generated kernel(s) + {len(externs)} extern call(s)"
    if counts:
        text += " (" + ", ".join(f"{n} x{c}" if c > 1 else n for n, c in counts.items()) + ")"
    return text
