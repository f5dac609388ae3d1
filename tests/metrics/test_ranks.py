from __future__ import annotations

from torchdoctor.metrics.model import Headline, RankResult, StepRow, WindowInfo
from torchdoctor.metrics.ranks import cross_rank


def rank(r: int, step_ms: float, comm_ms: float) -> RankResult:
    return RankResult(rank=r, file=f"r{r}", device="gpu", device_kind="cuda", window=WindowInfo(0, 1, [1], "x"),
                      metrics=Headline(step_ms_median=step_ms),
                      steps=[StepRow(step=1, start_ns=0, dur_ms=step_ms, comm_ms=comm_ms)])


def test_straggler_is_the_rank_that_waits_least():
    # Rank 2 computes longest and arrives last: it waits least in the all-reduce, the others
    # (whose steps look just as long, since they wait) are its victims.
    res = [rank(0, 100, 40), rank(1, 101, 38), rank(2, 100, 5), rank(3, 99, 41)]
    c = cross_rank(res)
    assert c.straggler == 2
    assert c.victims == [0, 1, 3]
    assert c.straggler_lead_ms == 36
    assert {w.rank: w.excess_wait_ms for w in c.per_rank} == {0: 35, 1: 33, 2: 0, 3: 36}


def test_no_straggler_when_waits_are_even():
    c = cross_rank([rank(0, 100, 20), rank(1, 100, 21)])
    assert c.straggler is None and c.step_skew_pct == 0.0


def test_single_rank_has_no_cross_rank_view():
    assert cross_rank([rank(0, 100, 20)]) is None


def test_collective_wait_matrix_names_the_last_arrival_of_every_call(tmp_path):
    """Ranks whose all-reduces carry sequence numbers: each call is matched on every rank; the
    straggler arrives last in each (least time inside) and the waiting it causes is summed."""
    from rank_job import write_job
    from torchdoctor.session import analyze_paths

    write_job(tmp_path, 5, straggler=3, seq=True)
    c = analyze_paths([str(tmp_path)], jobs=1).cross_rank
    assert c.matched_by == "seq" and c.matched_calls == 4 and c.straggler == 3
    assert [(w.group, w.last_rank) for w in c.collective_waits] == [("0", 3)] * 4
    assert sorted(w.seq for w in c.collective_waits) == [0, 1, 2, 3]
    w = c.collective_waits[0]
    # rank_job: everyone leaves at 8,600 + 140 + 500 µs after compute starts; rank 3 computes 8,600 + 60.
    assert w.min_ms == 0.58
    others = [8.6 + 0.14 + 0.5 - (6.0 + (r % 7) * 0.02) for r in (0, 1, 2, 4)]
    assert abs(w.excess_ms - sum(o - 0.58 for o in others)) < 1e-3
    assert w.max_ms == round(max(others), 4)
    (late,) = c.late_ranks
    assert (late.rank, late.calls) == (3, 4) and abs(late.excess_ms - 4 * w.excess_ms) < 1e-3
