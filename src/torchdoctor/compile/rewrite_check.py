"""Validate a branch rewrite (compile/rewrite.py) in a separate Python process with torch.

The tool does this after the job, never inside it. The child builds two functions of the names
the ``if`` reads (the original statement and its rewrite), with the module's literal constants
and ``torch`` as their only globals, and calls both on fresh random tensors (shape CHECK_SHAPE)
scaled from 1e-2 to 1e3 until the condition has been both true and false. It checks that the
results are equal, then compiles the rewrite with ``torch.compile(fullgraph=True)``. Anything
the statement needs beyond that (``self``, other functions) makes it "not validated", with the
reason. The outcome is True (validated), False (the rewrite differs or does not compile), or None
(could not be checked here).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from torchdoctor.compile.rewrite import Rewrite

TIMEOUT_S = 90
CHECK_SHAPE = (4, 16)

_CHILD = r'''
import json, sys, textwrap
spec = json.load(sys.stdin)
import torch
names, result = spec["names"], spec["result"]
env = {"torch": torch, **spec["constants"]}

def make(body):
    tail = "" if result == ["return"] else "\n    return (" + ", ".join(result) + ",)"
    src = "def f(" + ", ".join(names) + "):\n" + textwrap.indent(body, "    ") + tail
    ns = dict(env)
    exec(compile(src, "<torchdoctor rewrite check>", "exec"), ns)
    return ns["f"]

def out(ok, text):
    print(json.dumps({"ok": ok, "text": text}))
    sys.exit(0)

try:
    orig, new = make(spec["original"]), make(spec["rewritten"])
except Exception as exc:
    out(None, f"could not build the check: {type(exc).__name__}: {exc}")
seen = set()
args = None
for scale in (1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3):
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(*spec["shape"], generator=gen) * scale for _ in names]
    try:
        cond = bool(eval(spec["condition"], dict(env), dict(zip(names, args))))
        a, b = orig(*args), new(*args)
    except Exception as exc:
        out(None, f"not validated: the statement needs more than tensors for {', '.join(names)} "
                  f"({type(exc).__name__}: {str(exc)[:120]})")
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    if len(a) != len(b) or not all(torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(a, b)):
        out(False, f"the rewrite gives different values when the condition is {cond}")
    seen.add(cond)
    if seen == {True, False}:
        break
if seen != {True, False}:
    out(None, "not validated: random inputs took only one branch (" + str(seen.pop()) + ")")
try:
    torch.compile(new, fullgraph=True, backend="eager")(*args)
except Exception as exc:
    out(False, f"the rewrite does not compile with fullgraph=True: {type(exc).__name__}: {str(exc)[:160]}")
out(True, "outputs equal on both branches, and torch.compile(fullgraph=True) captures it in one graph")
'''


def check(rw: Rewrite, python: str | None = None) -> tuple[bool | None, str]:
    """(validated?, why) for one rewrite, run in ``python`` (default: this interpreter)."""
    python = python or sys.executable
    if python == sys.executable and importlib.util.find_spec("torch") is None:
        return None, "not validated: torch is not importable here"
    spec = {"names": rw.names, "result": rw.result, "constants": rw.constants, "original": rw.original,
            "rewritten": rw.rewritten, "condition": rw.condition, "shape": list(CHECK_SHAPE)}
    try:
        # The job's compile logging and the probe stay out of the check's process.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("TORCH_TRACE", "TORCH_LOGS", "TORCH_COMPILE_DEBUG", "TORCHDOCTOR_"))}
        proc = subprocess.run([python, "-c", _CHILD], input=json.dumps(spec), capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env)
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        return got["ok"], str(got["text"])
    except subprocess.TimeoutExpired:
        return None, f"not validated: the check took over {TIMEOUT_S} s"
    except (OSError, ValueError, IndexError, KeyError):
        return None, "not validated: the check did not run"
