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
_AOT_BACKWARD = re.compile(r"^# AOT ID: \[[^\]]*backward", re.MULTILINE)
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


# ATen ops of more words than the rules above join, longest first ("scaled_dot_product_flash_attention_
# for_cpu_backward" would otherwise read as seven ops).
LONG_OPS = sorted((tuple(n.split("_")) for n in (
    "scaled_dot_product_flash_attention_for_cpu_backward", "scaled_dot_product_flash_attention_for_cpu",
    "scaled_dot_product_flash_attention_backward", "scaled_dot_product_flash_attention",
    "scaled_dot_product_efficient_attention_backward", "scaled_dot_product_efficient_attention",
    "scaled_dot_product_cudnn_attention_backward", "scaled_dot_product_cudnn_attention",
    "log_softmax_backward_data", "softmax_backward_data", "scalar_tensor")), key=len, reverse=True)


def ops_from_name(name: str) -> list[str]:
    """The op names Inductor put in a kernel's name ("cpp_fused_add_gelu_0" -> ["add", "gelu"]), once
    each: best effort (Inductor joins op names with "_", the same character many op names contain)."""
    body = _SUFFIX.sub("", _TRITON_CAT.sub("triton_", name))
    body = body.split("fused_", 1)[1] if "fused_" in body else ""
    words = [w for w in body.split("_") if w]
    ops: list[str] = []
    glue = False
    skip = 0
    for i, word in enumerate(words):
        if skip:
            skip -= 1
            continue
        long = next((op for op in LONG_OPS if tuple(words[i:i + len(op)]) == op), None)
        if long is not None:
            ops.append("_".join(long))
            skip, glue = len(long) - 1, False
            continue
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
    # The source nodes of every launch, in launch order ([] where no comment came with it): where a
    # kernel without a comment sits among launches that have one (report(), _nearby).
    launch_nodes: list[list[str]] = []
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
                seen["at"].append(len(launch_nodes))
            else:
                kernels.append({"name": name, "kind": "triton" if name.startswith("triton") else "cpp",
                                "aten": aten or ops_from_name(name), "nodes": nodes,
                                "ops_from": "comment" if aten else "name", "launches": 1,
                                "at": [len(launch_nodes)]})
        elif (e := _EXTERN.match(line)) is not None:
            externs.append({"name": f"extern_kernels.{e.group(1)}", "aten": aten, "nodes": nodes,
                            "at": [len(launch_nodes)]})
        elif (f := _FALLBACK.match(line)) is not None:
            externs.append({"name": f"aten.{f.group(1)}", "aten": aten or [f.group(1)], "nodes": nodes,
                            "fallback": True, "at": [len(launch_nodes)]})
        else:
            continue
        launch_nodes.append(nodes)
        pending = None
    # AOTAutograd's backward module ("# AOT ID: ['0_backward']", or its tangents_ inputs) runs the
    # forward's nodes from last to first.
    backward = bool(_AOT_BACKWARD.search(text)) or "tangents_" in body
    return {"kernels": kernels, "externs": externs, "launch_nodes": launch_nodes, "backward": backward}


def lines_of(nodes: list[str], where: dict[str, str]) -> list[str]:
    """The user lines of source nodes, "file:line", in order, once each."""
    return list(dict.fromkeys(where[n] for n in nodes if n in where))


# Ops of a captured graph (torch functions, operators, methods) and the ATen ops Inductor names its
# kernels after, where the two names differ. Compared without leading underscores, as kernel names
# lose them ("cpp_fused__native_batch_norm_legit_functional_copy__relu_2").
ATEN_OF = {
    "layer_norm": ("native_layer_norm",), "group_norm": ("native_group_norm",),
    "batch_norm": ("native_batch_norm", "native_batch_norm_legit_functional", "native_batch_norm_legit_no_training"),
    "dropout": ("native_dropout",), "linear": ("addmm", "mm"), "matmul": ("mm", "bmm"),
    "cross_entropy": ("log_softmax", "nll_loss_forward", "nll_loss"), "softmax": ("softmax",), "log_softmax": ("log_softmax",),
    "relu": ("relu", "threshold"), "embedding": ("embedding", "embedding_dense"),
    "iadd": ("add",), "truediv": ("div",), "floordiv": ("div",), "itruediv": ("div",), "imul": ("mul",),
    "isub": ("sub",), "rsub": ("sub", "rsub"),
    "scaled_dot_product_attention": ("scaled_dot_product_flash_attention_for_cpu", "scaled_dot_product_flash_attention",
                                     "scaled_dot_product_efficient_attention", "scaled_dot_product_cudnn_attention"),
}
# Ops in nearly every kernel of a graph (layout and indexing): matching them would tie a kernel to any
# line, so they do not count.
LAYOUT_OPS = frozenset({"view", "unsafe_view", "reshape", "t", "transpose", "permute", "expand", "clone",
                        "contiguous", "getitem", "arange", "copy", "split", "squeeze", "unsqueeze", "flatten",
                        "size", "to", "type_as", "float", "detach", "slice", "select", "cat", "full", "zeros"})


_FORWARD = re.compile(r"_backward(?:_data|_input|_weight)?$")
# Without a window (no commented launch near a kernel), matches spread over at most this many lines are
# still a hint; more would name lines at random.
MAX_UNWINDOWED_LINES = 3


def _aten_names(op: str) -> tuple[str, ...]:
    """The ATen names a graph op is written as in kernel names: ``add_``, ``add.Tensor`` and ``add``
    alike, and its ATEN_OF aliases."""
    op = op.split(".")[0].strip("_")
    return (op, *ATEN_OF.get(op, ()))


def by_op_name(item: dict[str, Any], graph: _Graph, launch_nodes: list[list[str]], reverse: bool) -> list[str]:
    """The captured nodes a kernel without source nodes (C++ kernels on a CPU) was most likely made
    from: nodes whose op is one its name spells, between the commented launches around each of its
    launches (kernels run in topological order, so a fused kernel's nodes lie near its neighbours').
    Where no node of the graph lies there, every match if they fall on at most MAX_UNWINDOWED_LINES
    lines. A hint, not provenance."""
    # A backward kernel is told by the forward op it differentiates, as Inductor's comments do on a GPU.
    wanted = {_FORWARD.sub("", a.lstrip("_")) for a in item["aten"]} - LAYOUT_OPS
    named = [n for n, op in graph.ops.items() if wanted.intersection(_aten_names(op))]
    spans = [_nearby(at, launch_nodes, graph.position, reverse) for at in item.get("at", ())]
    spans = [s for s in spans if s is not None]
    near = [n for n in named if any(lo <= graph.position[n] <= hi for lo, hi in spans)] if spans else []
    if near:
        return near
    return named if len(set(lines_of(named, graph.where))) <= MAX_UNWINDOWED_LINES else []


def _nearby(at: int, launch_nodes: list[list[str]], position: dict[str, int], reverse: bool
            ) -> tuple[int, int] | None:
    """The span of graph positions of the source nodes of the nearest commented launches before and
    after launch ``at``; open at an end without one, the way the module runs (``reverse``: a backward
    module runs the forward's nodes from last to first); None when no launch around it names a node
    of the graph."""
    def first(indices: range) -> list[int]:
        for i in indices:
            known = [position[n] for n in launch_nodes[i] if n in position]
            if known:
                return known
        return []

    before, after = first(range(at - 1, -1, -1)), first(range(at + 1, len(launch_nodes)))
    if before and after:
        return min(before + after), max(before + after)
    if not before and not after:
        return None
    # Only one neighbour: the kernel lies on the side of it that runs earlier (before it) or later.
    lower = min(before) if before else min(after)
    upper = max(before) if before else max(after)
    runs_later = bool(before) != reverse  # forward order with a neighbour before, or reverse with one after
    return (lower, len(position)) if runs_later else (0, upper)


class _Graph:
    """Captured graphs' nodes as the fusion report needs them: user line, op and position."""

    def __init__(self, graphs: list[dict[str, Any]]) -> None:
        self.where: dict[str, str] = {}
        self.ops: dict[str, str] = {}
        for g in graphs:
            for node, line in (g.get("lines") or {}).items():
                self.where.setdefault(node, line)
            # Records written before the probe kept each node's op: its name's stem ("mul_1" -> "mul").
            node_ops = g.get("node_ops")
            for node in g.get("lines") or {}:
                op = node_ops.get(node) if node_ops is not None else _SUFFIX.sub("", node)
                if op is not None:
                    self.ops.setdefault(node, op)
        self.position = {n: i for i, n in enumerate(self.where)}


def _graph_of(graphs: list[_Graph], merged: _Graph, module: dict[str, Any], launch_nodes: list[list[str]]) -> _Graph:
    """The captured graph an output-code module was compiled from: the one whose node names its
    comments name most (graphs around a graph break share names such as ``add`` and ``linear``, at
    other lines and positions), then the one with ops for more of the ops its kernels are named
    after; all of them together when no comment names a node."""
    named = {n for nodes in launch_nodes for n in nodes}
    spelled = {_FORWARD.sub("", a.lstrip("_")) for k in module["kernels"] for a in k["aten"]} - LAYOUT_OPS

    def score(g: _Graph) -> tuple[int, int]:
        have = {a for op in set(g.ops.values()) for a in _aten_names(op)}
        return len(named.intersection(g.where)), len(spelled & have)

    scores = [score(g) for g in graphs]
    if not scores or max(scores)[0] == 0:
        return merged
    return graphs[scores.index(max(scores))]


def report(folder: str, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Per output-code module of a run's compile-cache record: its kernels and extern calls with
    their ops and user lines, and the Dynamo graphs' op count for comparison."""
    captured = record.get("graphs") or []
    merged = _Graph(captured)
    graphs = [_Graph([g]) for g in captured]
    out = []
    for name in record.get("output_code") or []:
        try:
            with open(os.path.join(folder, "output_code", os.path.basename(name)), encoding="utf-8",
                      errors="replace") as f:
                got = parse(f.read())
        except OSError:
            continue
        launch_nodes = got.pop("launch_nodes")
        reverse = got.pop("backward")
        graph = _graph_of(graphs, merged, got, launch_nodes)
        for item in got["kernels"] + got["externs"]:
            item["lines"] = lines_of(item["nodes"], graph.where) or lines_of(item["nodes"], merged.where)
            if not item["nodes"] and item["aten"]:
                # No source nodes written for it (C++ kernels on a CPU).
                item["lines"] = lines_of(by_op_name(item, graph, launch_nodes, reverse), graph.where)
                item["lines_from"] = "op names" if item["lines"] else None
            item.pop("at", None)
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
