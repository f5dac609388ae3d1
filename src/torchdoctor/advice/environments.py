"""How to step a job's RL environments off the training loop, in the terms of the library it uses.

The probe records which environment libraries the job imported (``RankFacts.env_libraries``).
torchrl wraps gymnasium's environments in its own (GymEnv) and collects with its own collectors,
so gymnasium's AsyncVectorEnv is not what a torchrl job would change: its ParallelEnv runs each
environment in a process of its own, and its multi-process collectors run whole collectors so
(named MultiSyncCollector / MultiAsyncCollector since torchrl 0.11, MultiSyncDataCollector /
MultiaSyncDataCollector before: pytorch/rl 8779f2a, "[Refactor] Rename collectors"). tianshou and
Stable-Baselines3 wrap gymnasium's environments in vector classes of their own likewise.
"""

from __future__ import annotations

from collections.abc import Sequence


def parallel_envs(env_libraries: Sequence[str]) -> tuple[str, str]:
    """(the advice's words, a one-line snippet) for stepping environments in other processes."""
    if "tianshou" in env_libraries:
        # tianshou's examples build DummyVectorEnv (every env stepped in the training process) and
        # say in a comment that SubprocVectorEnv runs them in parallel (examples/discrete/discrete_dqn.py).
        return ("step environments in other processes with tianshou's SubprocVectorEnv (or ShmemVectorEnv) in place "
                "of DummyVectorEnv, where env.step costs more than the inter-process round trip",
                "training_envs = ts.env.SubprocVectorEnv([lambda: gym.make(task) for _ in range(n)])   # one process per env")
    if "stable_baselines3" in env_libraries:
        return ("step environments in other processes with Stable-Baselines3's SubprocVecEnv in place of DummyVecEnv, "
                "where env.step costs more than the inter-process round trip",
                "vec_env = make_vec_env(env_id, n_envs=n, vec_env_cls=SubprocVecEnv)   # one process per env")
    if "torchrl" in env_libraries:
        return ("step environments in other processes with torchrl's ParallelEnv, or collect with a multi-process "
                "collector (MultiSyncCollector; MultiSyncDataCollector before torchrl 0.11)",
                "env = ParallelEnv(n, make_env)   # torchrl.envs: one process per environment")
    return ("step environments as a vector (gymnasium.vector.AsyncVectorEnv runs them in other processes)",
            "envs = gymnasium.vector.AsyncVectorEnv([make_env for _ in range(n)])   # one process per env")
