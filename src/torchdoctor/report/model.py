"""The report model: what every renderer (console, JSON, HTML) draws from.

JSON schema `torchdoctor.report/1` (see docs/json-schema.md): the top-level `Report` struct
encoded with msgspec. Fields are only ever added within version 1; a rename or a change of
meaning bumps the version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import msgspec

from ..facts import RankFacts
from ..metrics.model import RankResult
from ..metrics.ranks import CrossRank

# The finding model belongs to the rules that produce it; the report renders it.
from ..rules.model import SEVERITY_ORDER, Claim, Evidence, Finding, Fix, Layer, Severity  # noqa: F401

SCHEMA = "torchdoctor.report/1"


class ErrorEntry(msgspec.Struct):
    file: str
    message: str


class RankReport(msgspec.Struct):
    """One rank: its measured metrics plus, for live runs, the facts the probe recorded."""

    rank: int | None
    file: str
    device: str | None
    window: dict[str, Any]
    metrics: dict[str, Any]
    analysis: RankResult | None = None
    facts: RankFacts | None = None
    # torch.compile in this rank: breaks, recompiles, compile time (metrics/compiled.py::compile_summary).
    compile: dict[str, Any] | None = None


class ABRemedy(msgspec.Struct):
    id: str
    kept: bool
    speedup: float | None = None
    reason: str = ""
    # The paired statistic behind the verdict (remedies/verdict.py): geometric mean of the per-round
    # pair ratios, its bootstrap interval (None below 3 pairs), the exact two-sided sign test.
    geomean: float | None = None
    interval: list[float] | None = None
    pairs: int = 0
    sign_p: float | None = None
    method: str = ""  # which pairs: "treated / baseline, per round" or the leave-one-out ones


class ABResult(msgspec.Struct):
    baseline_steps_per_s: float
    treated_steps_per_s: float
    speedup_median: float
    speedup_min: float
    speedup_max: float
    remedies: list[ABRemedy] = []
    details: dict[str, Any] = {}
    # Treated over baseline, per round: geometric mean, bootstrap interval, pairs, sign test p.
    speedup_geomean: float | None = None
    interval: list[float] | None = None
    pairs: int = 0
    sign_p: float | None = None
    method: str = ""  # how the interval and p were computed


class LazyRanks(Sequence[RankReport]):
    """`Report.ranks` of a job analysed from stored summaries (metrics/store.py): each RankReport is
    built when read, from its rank's inputs, and not kept, so a report over thousands of ranks does
    not hold their decoded results. Read it rank by rank (iterate, index); json_out streams it.
    msgspec cannot encode it whole: a report is written through json_out.chunks."""

    def __init__(self, items: list[Any], build: Callable[[Any], RankReport]) -> None:
        self._items, self._build = items, build

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> RankReport: ...

    @overload
    def __getitem__(self, i: slice) -> list[RankReport]: ...

    def __getitem__(self, i: int | slice) -> RankReport | list[RankReport]:
        if isinstance(i, slice):
            return [self._build(x) for x in self._items[i]]
        return self._build(self._items[i])

    def __iter__(self) -> Iterator[RankReport]:
        return (self._build(x) for x in self._items)

    def result(self, i: int) -> RankResult | None:
        """Rank i's result alone, without building its RankReport (items are rules' RankInputs)."""
        return self._items[i].result

    def heads(self) -> Iterator[tuple[int, int | None, str]]:
        """(index, rank, file) of each rank with a result, from the store's handles: nothing decoded."""
        for i, ri in enumerate(self._items):
            if ri.has_result:
                yield i, ri.rank, (ri.stored or ri.result).file

    @property
    def held_bytes(self) -> int:
        """Bytes the stores behind these ranks hold (metrics/store.py SummaryStore.nbytes)."""
        stores = {id(h.store): h.store for h in (x.stored for x in self._items) if h is not None}
        return sum(st.nbytes for st in stores.values())


class Report(msgspec.Struct):
    schema: str = SCHEMA
    tool: str = "torchdoctor"
    version: str = ""
    source: str = "trace"  # trace | run | fix
    ranks: list[RankReport] = []
    cross_rank: CrossRank | None = None
    findings: list[Finding] = []
    errors: list[ErrorEntry] = []
    warnings: list[ErrorEntry] = []
    # True only when no finding is a warning or worse AND the tool saw what a verdict needs
    # (device activity, or a CPU-only job's steps, over steady steps); None when it could not tell.
    healthy: bool | None = None
    run: dict[str, Any] = {}
    ab: ABResult | None = None
    # The effective rule configuration: {"file": path or None, "ignore": [...], "thresholds": {...}}.
    config: dict[str, Any] = {}
    # What the tool could not see, each {"kind", "text", ...details}, leading the report; kinds in
    # docs/json-schema.md. Any kind but "no-verdict" makes `analyze` exit 4.
    blind_spots: list[dict[str, Any]] = []
