"""The live probe of `torchdoctor run`: instrumentation loaded inside the user's training job.

Layout (nothing here imports torch until the job does):

- ``bootstrap/``: the ``sitecustomize`` put on PYTHONPATH, and ``bootstrap.activate()``, the hook
  point that applies remedies and arms the probe;
- ``imphook``: post-import hooks (the probe installs itself right after ``import torch``);
- ``config``: the environment contract with the wrapper;
- ``core``: the probe's state, step boundaries, checkpoints and rank summary (``RankFacts``);
- ``hooks``: which torch events are observed, and how; ``shims``: transparent wrappers;
- ``clock``: per-step wall-time splits; ``collect``: configuration facts; ``sysinfo``: CPU use;
- ``window``: the steady-state torch.profiler window; ``output``: run directory layout, gather;
- ``nvml``: optional GPU sampling; ``errors``: fail-safety (log once, carry on).
"""
