"""torchdoctor bootstrap, loaded at interpreter start-up from PYTHONPATH (set by ``torchdoctor run``).

It does two things and nothing else:

1. when ``TORCHDOCTOR_RUN_DIR`` is set, arm the probe (``torchdoctor.probe.bootstrap.activate``),
   which waits for the job to import torch; a failure is reported once and the job carries on;
2. chain-load the ``sitecustomize`` that this one shadows, if any (as ddtrace-run and coverage do),
   so the job's own start-up customisation still runs.
"""

import os
import sys


def _activate() -> None:
    if not os.environ.get("TORCHDOCTOR_RUN_DIR"):
        return
    try:
        from torchdoctor.probe import bootstrap

        bootstrap.activate()
    except Exception as exc:  # the job must run even when the probe cannot
        sys.stderr.write(f"torchdoctor: probe not loaded in {sys.executable}: {type(exc).__name__}: {exc}\n")


def _chain_load() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    # Our directory leaves sys.path for good: the job sees the sys.path it would have without us.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import sitecustomize  # noqa: F401  (the next one on sys.path)
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise  # a broken user sitecustomize: let site.py report it as it always does
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_activate()
_chain_load()
