"""The claims ledger: one budget of step time per rank, split into sub-budgets that findings claim.

Why: several rules can explain the same milliseconds (a DataLoader wait is the collate's, the
workers' and the input-bound step's at once). Without one owner of the budget the findings
double count and the sum of "recoverable" shares exceeds what fixing everything gives back.

How: budgets form a tree per rank (below). A rule asks for time from one or more budgets
(``Claim``), the engine runs the rules in priority order (rules/engine.py) and grants each
claim at most what is left of its budget and of every budget above it, up to the step. A rule
that needs to know what the earlier rules took asks ``View.left(budget)`` / ``View.claimed``;
it never calls another rule. Adding a rule adds claims; it edits no other rule.

Budgets (ms per step; capacities are defined by the functions registered with ``@capacity``)::

    step                      the step (window wall time per step, or the probe's median step)
      idle                    device idle (the whole step on a CPU-only job)
        idle.host             ... while the host ran ops, untraced Python or the optimizer
          idle.host.dtoh_copy ... inside blocking device-to-host copies
          idle.host.htod_pageable ... inside blocking pageable host-to-device copies
          idle.host.optimizer ... inside Optimizer.step / zero_grad
        idle.sync             ... inside blocking synchronisations
        data.wait             ... waiting for the next batch
      comm.exposed            communication nothing else overlaps
      device.busy             device busy time (gains on kernel time)
        device.busy.fusable   ... in pointwise/reduction kernels (fusion)
        device.busy.fp32_simt ... in plain FP32 GEMM/convolution kernels (tensor cores)
        device.busy.attention ... in attention no fused kernel ran (the rest of it)
        device.busy.lowp      ... in GEMMs a cheaper format (FP8, 2:4 sparsity) could run
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._common import View

PARENT: dict[str, str | None] = {
    "step": None,
    "idle": "step",
    "idle.host": "idle",
    "idle.host.dtoh_copy": "idle.host",
    "idle.host.htod_pageable": "idle.host",
    "idle.host.optimizer": "idle.host",
    "idle.sync": "idle",
    "data.wait": "idle",
    "comm.exposed": "step",
    "device.busy": "step",
    "device.busy.fusable": "device.busy",
    "device.busy.fp32_simt": "device.busy",
    "device.busy.attention": "device.busy",
    "device.busy.lowp": "device.busy",
}
CAPACITY: dict[str, Callable[[View], float]] = {}


def capacity(name: str) -> Callable[[Callable[[View], float]], Callable[[View], float]]:
    """Register the function that sizes budget ``name`` for one rank (ms per step)."""
    if name not in PARENT:
        raise KeyError(f"unknown budget {name!r}: add it to ledger.PARENT")

    def register(fn: Callable[[View], float]) -> Callable[[View], float]:
        CAPACITY[name] = fn
        return fn

    return register


def chain(budget: str) -> list[str]:
    """The budget and its parents, innermost first."""
    out: list[str] = []
    b: str | None = budget
    while b is not None:
        out.append(b)
        b = PARENT[b]
    return out


class Ledger:
    """What each rank's budgets hold and what has been granted from them, in grant order."""

    def __init__(self) -> None:
        self.views: dict[int | None, View] = {}
        self._cap: dict[tuple[int | None, str], float] = {}
        self._got: dict[tuple[int | None, str], float] = {}
        # (rule id, rank, budget, asked, granted) in the order granted: the audit trail.
        self.grants: list[tuple[str, int | None, str, float, float]] = []
        self._rank_grants: dict[int | None, list[tuple[str, str, float]]] = {}  # by_rule's index

    def see(self, v: View) -> None:
        self.views[v.rank] = v

    def capacity(self, rank: int | None, budget: str) -> float:
        key = (rank, budget)
        if key not in self._cap:
            v = self.views.get(rank)
            size = CAPACITY[budget](v) if v is not None and budget in CAPACITY else 0.0
            self._cap[key] = max(0.0, float(size or 0.0))
        return self._cap[key]

    def claimed(self, rank: int | None, budget: str) -> float:
        """Granted so far from ``budget`` itself (claims on its sub-budgets included)."""
        return self._got.get((rank, budget), 0.0)

    def left(self, rank: int | None, budget: str) -> float:
        """What a new claim on ``budget`` could still get: the tightest of it and its parents."""
        return max(0.0, min(self.capacity(rank, b) - self.claimed(rank, b) for b in chain(budget)))

    def grant(self, rule_id: str, rank: int | None, budget: str, asked: float) -> float:
        got = max(0.0, min(float(asked), self.left(rank, budget)))
        for b in chain(budget):
            self._got[(rank, b)] = self.claimed(rank, b) + got
        self.grants.append((rule_id, rank, budget, float(asked), got))
        self._rank_grants.setdefault(rank, []).append((rule_id, budget, got))
        return got

    def by_rule(self, rank: int | None, budget: str) -> dict[str, float]:
        """Granted ms per rule on ``budget`` or any of its sub-budgets (for evidence texts)."""
        out: dict[str, float] = {}
        for rid, b, got in self._rank_grants.get(rank, ()):
            if budget in chain(b) and got:
                out[rid] = out.get(rid, 0.0) + got
        return out
