"""What to do about one graph break: its kind, from Dynamo's reason, registry id and the user's line.

CG-2 shows each break at the user's line with the fix that matches its kind. The kinds cover the
common causes named by the graph-break registry (torch/_dynamo/graph_break_registry.json); any
other break gets the registry's first hint. No torch import: this reads ``GraphBreakFacts``.
"""

from __future__ import annotations

import re

from torchdoctor.facts import GraphBreakFacts

# kind -> (what to do, snippet)
ADVICE: dict[str, tuple[str, str]] = {
    "logging": ("Move the print/log call out of the compiled code, or let Dynamo run it after the graph.",
                "torch._dynamo.config.reorderable_logging_functions.add(print)"),
    "logger": ("Dynamo cannot trace logging.Logger calls, even when the level silences them: move the call "
               "out of the compiled code, or let Dynamo drop it from compiled code.",
               "torch._dynamo.config.ignore_logging_functions.add(logger.debug)   # your logger's method"),
    "scalar": ("Keep the value on the device as a 0-d tensor (no .item()/.tolist() in the step), or capture "
               "the scalar in the graph.", "torch._dynamo.config.capture_scalar_outputs = True"),
    "branch": ("Express the Python `if` on a tensor with tensors: torch.where for an elementwise choice, "
               "torch.cond for two sub-computations.",
               "y = torch.where(pred, a, b)   # or torch.cond(pred, true_fn, false_fn, (x,))"),
    "unsupported": ("Dynamo cannot trace this call: allow it in the graph when it is traceable, or wrap it "
                    "as a custom op so it becomes one opaque node.",
                    "torch.compiler.allow_in_graph(fn)   # or @torch.library.custom_op(\"mylib::fn\", mutates_args=())"),
    "disabled": ("This region is excluded on purpose with torch.compiler.disable; remove the decorator if "
                 "the code is traceable, or keep the region out of the hot path.", ""),
    "ddp": ("Expected: DDP's optimizer splits the graph at gradient-bucket boundaries so communication "
            "overlaps compute. Nothing to fix.", ""),
    "train_step": ("The compiled function runs the whole training step: Dynamo does not trace backward(), and "
                   "torch.optim keeps zero_grad() and step() out of the graph on purpose, so the step is cut "
                   "into pieces here. Compile the model (its backward is compiled with it) and leave "
                   "zero_grad/backward/step outside; compile the optimizer step on its own to fuse it.",
                   "model.compile()   # forward, and its backward through AOTAutograd\n"
                   "@torch.compile(fullgraph=False)\ndef opt_step():\n    opt.step()   # the compiled optimizer"),
    "torch": ("The break is inside torch's own code reached from this line (torch.optim breaks around "
              "step() on purpose). Usually expected; nothing to fix in this line.", ""),
}
_SCALAR_IDS = {"GB0124", "GB0109"}
_BRANCH_IDS = {"GB0170", "GB0035", "GB0033"}
_DISABLED_IDS = {"GB0098", "GB0099"}
_UNSUPPORTED_IDS = {"GB0007", "GB0008", "GB0009", "GB0059"}
# The user's line runs backward or the optimizer (pytorch/tutorials' torch_compile_full_example
# compiles `train()`: zero_grad, forward, backward, step). Not any `.step(`: env.step(a.item()) is a
# scalar break, a diffusion scheduler's step is the model's own code.
_BACKWARD = re.compile(r"\.backward\(|\bautograd\.backward\(")
_OPTIMIZER_CALL = re.compile(r"\b\w*(?:opt|optim|optimizer|optimiser|scaler)\w*\s*\.\s*(?:step|zero_grad)\(", re.I)


def _train_step(b: GraphBreakFacts, reason: str) -> bool:
    source = b.source or ""
    if _BACKWARD.search(source):
        return b.gb_id == "GB0123" or "backward" in reason
    return bool(_OPTIMIZER_CALL.search(source)) or (".zero_grad(" in source and "zero_grad" in (b.explanation or ""))


def kind_of(b: GraphBreakFacts) -> str:
    """The break's kind (a key of ADVICE), or "other"."""
    reason = b.reason.lower()
    text = f"{b.explanation or ''} {b.source or ''}".lower()
    if "ddp" in reason or "ddpoptimizer" in text:
        return "ddp"
    if b.gb_id in _DISABLED_IDS or "compiler.disable" in reason:
        return "disabled"
    if b.in_torch:  # inside torch.optim's step(): its breaks are there on purpose
        return "torch"
    if b.gb_id in _BRANCH_IDS or "data-dependent branching" in reason:
        return "branch"
    if b.gb_id in _SCALAR_IDS or "item()" in reason or "tolist" in reason:
        return "scalar"
    if _train_step(b, reason):
        return "train_step"
    if b.gb_id == "GB0291" or "logging.logger method" in reason:
        return "logger"
    logs = ("`print`", "print(", "logging", "logger.")
    if (b.gb_id == "GB0059" or "builtin operator" in reason) and any(word in text for word in logs):
        return "logging"
    if b.gb_id in _UNSUPPORTED_IDS or "marked as skipped" in reason or "builtin operator" in reason:
        return "unsupported"
    return "other"


def advice(b: GraphBreakFacts) -> tuple[str, str]:
    """(what to do, snippet) for one break; "other" breaks get the registry's first hint."""
    kind = kind_of(b)
    if kind in ADVICE:
        return ADVICE[kind]
    hint = b.hints[0] if b.hints else "Rewrite the code at this line so Dynamo can trace it."
    return hint, ""


def describe(b: GraphBreakFacts) -> str:
    """One line: where, what the line says, why, how often it was compiled."""
    where = b.location or "torch's own code (no user frame)"
    if b.function:
        where += f" in {b.function}()"
    line = f" `{b.source}`" if b.source else ""
    gb = f" [{b.gb_id}]" if b.gb_id else ""
    times = f", met {b.compiles}x while compiling" if b.compiles > 1 else ""
    return f"{where}:{line} {b.reason}{gb}{times}"
