"""Break-even steps of a remedy that compiles (remedies/breakeven.py), on hand-made A/B runs."""

from __future__ import annotations

from torchdoctor.facts import CompileFacts, RankFacts
from torchdoctor.remedies.breakeven import break_even, sentence
from torchdoctor.remedies.measure import Arm


def arm(kind: str, k: int, steps_per_s: float, compile_s: float | None, last_step: int = 59) -> Arm:
    facts = [RankFacts(rank=r, compile=CompileFacts(used=compile_s is not None, compile_time_s=compile_s),
                       last_step=last_step) for r in (0, 1)]
    facts[1].compile.compile_time_s = None if compile_s is None else compile_s * 0.9  # the slowest rank counts
    return Arm(f"{kind[0].upper()}{k}", kind, [], f"/runs/{kind}{k}", round=k, steps_per_s=steps_per_s, facts=facts)


def test_compile_pays_after_the_extra_compile_seconds_over_the_seconds_saved_per_step():
    # 40 ms -> 25 ms per step (median over rounds); 12 s of compiling: 12000 / 15 = 800 steps.
    arms = [arm("baseline", 1, 25.0, None), arm("treated", 1, 40.0, 12.0), arm("baseline", 2, 24.0, None),
            arm("treated", 2, 40.0, 11.0), arm("baseline", 3, 26.0, None), arm("treated", 3, 41.0, 13.0)]
    be = break_even(arms)
    assert be["compile_s"] == 12.0 and be["baseline_step_ms"] == 40.0 and be["treated_step_ms"] == 25.0
    assert be["break_even_steps"] == 800 and be["job_steps"] == 60 and be["pays_within_run"] is False
    assert "pays back after 800 steps (this run: 60 steps, it does not pay within it)" in sentence(be)


def test_a_job_that_already_compiles_counts_only_the_remedy_s_extra_compiling():
    arms = [arm("baseline", 1, 25.0, 10.0), arm("treated", 1, 50.0, 10.5, last_step=9999)]
    be = break_even(arms)
    assert be["compile_s"] == 0.5 and be["break_even_steps"] == 25 and be["pays_within_run"] is True


def test_no_verdict_without_extra_compiling_and_never_when_not_faster():
    assert break_even([arm("baseline", 1, 25.0, None), arm("treated", 1, 30.0, None)]) is None
    slower = break_even([arm("baseline", 1, 25.0, None), arm("treated", 1, 20.0, 5.0)])
    assert slower["break_even_steps"] is None and "never pays back" in sentence(slower)
