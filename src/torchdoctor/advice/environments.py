"""How to step a job's RL environments off the training loop, in the terms of the library it uses.

The probe records which environment libraries the job imported (``RankFacts.env_libraries``).
torchrl wraps gymnasium's environments in its own (GymEnv) and collects with its own collectors,
so gymnasium's AsyncVectorEnv is not what a torchrl job would change: its ParallelEnv runs each
environment in a process of its own, and its multi-process collectors run whole collectors so
(named MultiSyncCollector / MultiAsyncCollector since torchrl 0.11, MultiSyncDataCollector /
MultiaSyncDataCollector before: pytorch/rl 8779f2a, "[Refactor] Rename collectors").
"""

from __future__ import annotations

from collections.abc import Sequence


def parallel_envs(env_libraries: Sequence[str]) -> tuple[str, str]:
    """(the advice's words, a one-line snippet) for stepping environments in other processes."""
    if "torchrl" in env_libraries:
        return ("step environments in other processes with torchrl's ParallelEnv, or collect with a multi-process "
                "collector (MultiSyncCollector; MultiSyncDataCollector before torchrl 0.11)",
                "env = ParallelEnv(n, make_env)   # torchrl.envs: one process per environment")
    return ("step environments as a vector (gymnasium.vector.AsyncVectorEnv runs them in other processes)",
            "envs = gymnasium.vector.AsyncVectorEnv([make_env for _ in range(n)])   # one process per env")
