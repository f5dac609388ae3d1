"""Host layer, work between training steps: an evaluation, a rollout or logging every N steps (HO-16).

Every other rule reads the steady step (the median, or the profiler window, which avoids the odd
step by design). A loop that stops every N steps for work of its own, an RL rollout between
policy updates or an evaluation every epoch, spends that time outside every steady step, and a
report of the steady step alone calls the job healthy while most of its wall time goes there.
Measured by the probe over the whole run (``StepTiming`` of every step, metrics/between.py): the
steps whose work outside the training phases (forward, backward and optimizer with autograd)
exceeds the steady steps' by half a steady step, and what that excess is made of: the model's forwards without
autograd (``inference_ms``: an evaluation or a rollout), an evaluation's waits for batches, and
the rest (Python outside the model: environment steps, metrics, logging). Saves and DataLoader
restarts are left out: DI-15 and DL-6 price them; so are longer training batches.

An evaluation after every step (PyG's gcn.py: a full-graph forward without autograd after each
update) makes no step stand out: then the steady steps' forwards without autograd are the work, when
they run in most steps for 5% of the step and 1 ms or more (metrics/between.py,
``inference_in_every_step``).

Priced against the job, not the step: the excess is time the job spends, ``job_s`` seconds and
``job_pct`` of its wall time since its first training activity (``RankFacts.train_wall_s``); no
claim on the step's budget. How much of it a change gives back depends on what the work is, which
only the user knows: the finding measures it, says what it is made of and where it is called.
Severity by the job share, on the default ladder (5% warning, 20% critical).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..advice.command import py_spy
from ..advice.environments import parallel_envs
from ..metrics.between import ONE_OFF_FACTOR, Between, inference_in_every_step
from ._common import View, finding, fmt_ms, per_rank, severity, views
from .engine import RuleInputs, rule
from .input import no_core_for_workers
from .model import Evidence, Finding, Fix

# Below this share of the job's wall time the work between steps is not worth a finding.
MIN_JOB_PCT = 3.0
WARN_PCT, CRIT_PCT = 5.0, 20.0


@rule("HO-16")
def work_between_steps(inputs: RuleInputs) -> list[Finding]:
    """Every N steps the loop stops for work of its own: an evaluation, a rollout, logging.

    Live only (the probe's timing of every step; a profiler window holds steady steps). Claims
    nothing per step: the cost is the job's (``job_s``/``job_pct``), severity by that share.
    """
    all_views = views(inputs)

    def one(v: View) -> Finding | None:
        b = v.between
        if (b is None or b.job_pct < MIN_JOB_PCT) and v.f is not None:
            # A small pattern (logging every 50 steps) must not hide an evaluation in every step.
            every = inference_in_every_step(v.timed, v.f.train_wall_s)
            if every is not None and every.job_pct >= MIN_JOB_PCT:
                return _every_step(v, every, all_views, inputs.run, len(inputs.ranks))
        if b is None or b.job_pct < MIN_JOB_PCT:
            return None
        n = len(b.steps)
        each = b.excess_ms / n
        when = f"Every {b.every} steps" if b.every else f"At {n} irregular steps"
        # Environments and rollouts only where the job imported an RL environment library (a
        # sentence-transformers job read "Python: environment steps" for its evaluator's scoring).
        rl = bool(v.f is not None and v.f.env_libraries)
        parts = [(b.inference_ms, "in the model's forwards without autograd ("
                  + ("an evaluation or a rollout)" if rl else "an evaluation)")),
                 (b.data_ms, "waiting for batches"),
                 (b.rest_ms, "outside the model (Python: " + ("environment steps, " if rl else "")
                  + "metrics, logging" + ("" if rl else ", saves other than torch.save's") + ")")]
        split = ", ".join(f"{fmt_ms(ms / n)} {what}" for ms, what in parts if ms / n >= 0.05 * each)
        site = v.f.inference_site if v.f is not None else None
        title = (f"{when} the training loop stops for {fmt_ms(each)} of work between steps ({n} times, "
                 f"{b.excess_ms / 1e3:.1f} s, {b.job_pct:.0f}% of the job's training time): {split}.")
        first = b.steps[0].step
        # Irregular long steps may be the machine's (other processes, swapping), not the loop's.
        sev = severity(b.job_pct, WARN_PCT, CRIT_PCT) if b.every else "info"
        f = finding(
            v, "HO-16", "host", title, 0.0, sev=sev,
            evidence=[Evidence(
                f"{n} of {b.recorded} steps took {fmt_ms(sum(s.total_ms for s in b.steps) / n)} on average against a "
                f"median steady step of {fmt_ms(b.median_ms)}; counted: their time outside the forward, backward and "
                "optimizer step beyond the steady steps' (saves and DataLoader restarts left out: DI-15 and DL-6 "
                "price them). The steady steps, which the other findings read, leave this time out."
                + (f" The first forward without autograd after step 0 was called at {site}." if site else "")
                + _one_offs(b),
                {"long_steps": n, "every_steps": b.every, "median_step_ms": round(b.median_ms, 3),
                 "excess_ms_per_long_step": round(each, 3), "inference_ms": round(b.inference_ms / n, 3),
                 "data_ms": round(b.data_ms / n, 3), "rest_ms": round(b.rest_ms / n, 3),
                 "train_wall_s": round(b.train_wall_s, 3), "job_pct": round(b.job_pct, 1), "inference_site": site},
                [{"step": s.step, "ms": round(s.total_ms, 3), "inference_ms": round(s.inference_ms, 3),
                  "other_ms": round(s.other_ms, 3)} for s in b.steps[:5]])] + _in_window(v, b),
            fix=_fix(b, site, no_core_for_workers(v, all_views), v.f.inference_mode if v.f else None,
                 v.f.env_libraries if v.f else [], inputs.run, len(inputs.ranks)), confidence="high" if b.every else "medium",
            confirm=f"`torchdoctor run --profile-steps {first}:{first + 1}` traces one of these steps",
            source="probe: every step's wall time and phases; the default ladder on the job's share")
        f.job_s, f.job_pct, f.per = round(b.excess_ms / 1e3, 3), round(b.job_pct, 1), "job"
        return f
    return per_rank(inputs, one)


def _every_step(v: View, b: Between, all_views: list[View], run: Mapping, processes: int) -> Finding:
    """HO-16 for forwards without autograd after every step (``inference_in_every_step``)."""
    n = len(b.steps)
    each = b.excess_ms / n
    site = v.f.inference_site if v.f is not None else None
    pct = 100.0 * each / b.median_ms if b.median_ms > 0 else 0.0
    title = (f"After every training step the loop runs the model's forwards without autograd for {fmt_ms(each)} "
             f"({pct:.0f}% of a {fmt_ms(b.median_ms)} step): an evaluation or a rollout in each step "
             f"({b.excess_ms / 1e3:.1f} s, {b.job_pct:.0f}% of the job's training time).")
    sev = severity(b.job_pct, WARN_PCT, CRIT_PCT)
    f = finding(
        v, "HO-16", "host", title, 0.0, sev=sev,
        evidence=[Evidence(
            f"{n} of {b.recorded} steady steps ran forwards without autograd, {fmt_ms(each)} on average, inside "
            f"steps of {fmt_ms(b.median_ms)} (median); no step stands out, so the steady step holds this work."
            + (f" The first forward without autograd after step 0 was called at {site}." if site else ""),
            {"long_steps": n, "every_steps": 1, "median_step_ms": round(b.median_ms, 3),
             "excess_ms_per_long_step": round(each, 3), "inference_ms": round(each, 3), "data_ms": 0.0,
             "rest_ms": 0.0, "train_wall_s": round(b.train_wall_s, 3), "job_pct": round(b.job_pct, 1),
             "inference_site": site})],
        fix=_fix(b, site, no_core_for_workers(v, all_views), v.f.inference_mode if v.f else None,
                 v.f.env_libraries if v.f else [], run, processes),
        confidence="high", confirm="the trace's forward phase holds both forwards: the one without autograd "
                                   "has no backward after it",
        source="probe: every step's forwards without autograd; the default ladder on the job's share")
    f.job_s, f.job_pct, f.per = round(b.excess_ms / 1e3, 3), round(b.job_pct, 1), "job"
    return f


def _one_offs(b: Between) -> str:
    """The long steps left out of the pattern as one-offs (fewer than MIN_LONG_STEPS), in words ("" without any)."""
    if not b.one_offs:
        return ""
    named = ", ".join(f"step {s.step} ({fmt_ms(s.total_ms)})" for s in b.one_offs)
    return (f" Left out as one-offs, over {ONE_OFF_FACTOR:.0f} times the typical long step's work: {named}"
            " (such as a first evaluation compiling its graph, which the compile findings price).")


def _in_window(v: View, b: Between) -> list[Evidence]:
    """Evidence that the profiler window holds steps where the period puts this work (the probe does
    not time the profiled steps, so the period says which): the trace's shares of that window
    count it with the training steps'."""
    window = v.r.window.steps if v.r is not None and v.f is not None and v.f.steps else []
    if not b.every or not window:
        return []
    hit = [s for s in window if s >= b.steps[0].step and (s - b.steps[0].step) % b.every == 0]
    if not hit:
        return []
    return [Evidence(
        f"The profiler window (steps {window[0]}–{window[-1]}) holds step {', '.join(map(str, hit))}, where this "
        "work recurs: the window's shares (the phase table, the per-rank summary) include it; the probe's figures "
        "for the other findings leave it out.", {"window_steps": window, "long_steps_in_window": hit})]


# Where a trainer runs the evaluation, its own settings say how often and on how much (the site
# names the library whose function the user's line called: "transformers's Trainer.train() at ...").
_LIGHTNING = ("Lightning validates every val_check_interval on limit_val_batches of the loader: validate less "
              "often or on fewer batches.",
              "{alias}.Trainer(..., val_check_interval=1.0, check_val_every_n_epoch=2, limit_val_batches=0.25)")
_EVAL_SETTINGS = (
    ("transformers", "The Trainer evaluates every eval_steps on the whole eval_dataset: evaluate less often, on a "
                     "subset, with a larger eval batch.",
     "TrainingArguments(..., eval_steps=500, per_device_eval_batch_size=64)\n"
     "Trainer(..., eval_dataset=eval_ds.select(range(1000)))"),
    # The same Trainer under its two package names, each with its usual import alias.
    ("lightning", _LIGHTNING[0], _LIGHTNING[1].format(alias="L")),
    ("pytorch_lightning", _LIGHTNING[0], _LIGHTNING[1].format(alias="pl")),
)


# Where an RL library runs the rollout, its forwards are the data collection itself: one policy forward
# per environment step over n_envs environments (stable_baselines3 OnPolicyAlgorithm.collect_rollouts,
# n_steps per environment between updates). "Less often" would change the algorithm; more environments
# per forward, at the same n_steps x n_envs, make each forward cover more of the rollout (the docs'
# CartPole PPO, 40k steps: n_envs=4, n_steps=2048 took 18.6-23.5 s; n_envs=16, n_steps=512 15.8-16.3 s).
_SB3 = ("Stable-Baselines3 collects n_steps x n_envs transitions between updates with one policy forward per "
        "environment step: step more environments per forward at the same rollout size (n_envs up, n_steps down), "
        "in processes when env.step costs CPU (SubprocVecEnv), and keep a small MLP policy on the CPU. An "
        "EvalCallback's evaluation runs inside learn() too: eval_freq and n_eval_episodes set its cost.",
        "vec_env = make_vec_env(env_id, n_envs=16)   # vec_env_cls=SubprocVecEnv when env.step costs CPU\n"
        "model = PPO(\"MlpPolicy\", vec_env, n_steps=2048 * 4 // 16, device=\"cpu\")   # same transitions per update")
# The on-policy algorithms, whose rollout is n_steps per environment (off-policy ones collect
# train_freq steps between gradient steps and take no n_steps).
_SB3_ON_POLICY = re.compile(r"(?:stable_baselines3|sb3_contrib)'s (?:PPO|A2C|TRPO|RecurrentPPO|MaskablePPO)\.")


def _fix(b: Between, site: str | None, crowded: bool = False, inference_mode: bool | None = None,
         envs: Sequence[str] = (), run: Mapping | None = None, processes: int = 1) -> Fix:
    """What to do, by what the work is made of; through the trainer's settings where one evaluates.
    ``crowded``: the job's torch threads hold every CPU of the rank (DL-2's no_core_for_workers);
    ``inference_mode``: the forwards already run under torch.inference_mode() (not advised again);
    ``envs``: the RL environment libraries the job imported (stepping environments is then likely
    part of the Python outside the model; a fastai vision job was told to use AsyncVectorEnv);
    ``run``: the live run's context, whose command the profiling snippet shows."""
    where = f" (called at {site})" if site else ""
    if b.inference_ms >= b.rest_ms and b.inference_ms >= b.data_ms:
        if site and _SB3_ON_POLICY.search(site):
            return Fix(f"Most of it is the policy's forwards of the rollout{where}. {_SB3[0]}", _SB3[1])
        mode = "" if inference_mode else ", under torch.inference_mode(),"
        what, each = ("evaluation or rollout", "sample or environment step") if envs else ("evaluation", "sample")
        fix = Fix(f"Most of it is the model's forwards without autograd{where}: run that {what} less "
                  f"often or on fewer samples{mode} and batch it: one forward over many inputs instead of one per "
                  f"{each}.",
                  "with torch.inference_mode():\n    out = model(torch.stack(inputs))   # one batched forward")
    elif b.data_ms >= b.rest_ms:
        # Batches of a fixed evaluation set are the same at every evaluation: made once, they cost
        # nothing after; workers only move the work to other cores, which a crowded rank lacks.
        once = ("an evaluation set without random transforms that fits in memory can be collated once and its "
                "batches reused (val_batches = list(val_loader))")
        if crowded:
            fix = Fix(f"Most of it waits for batches of a loader read between steps (an evaluation set), made in the "
                      f"training process with no CPU free for workers: {once}; or evaluate less often or on fewer "
                      "batches.", "val_batches = list(val_loader)   # once, before training\n"
                      "for batch in val_batches: ...             # at each evaluation")
        else:
            fix = Fix(f"Most of it waits for batches of a loader read between steps (an evaluation set): {once}; or "
                      "give that loader workers and persistent_workers=True, or evaluate on fewer batches.",
                      "val_batches = list(val_loader)   # once, before training\n"
                      "val_loader = DataLoader(val_set, batch_size=..., num_workers=2, persistent_workers=True)")
    elif envs:
        how, code = parallel_envs(envs)
        return Fix("Most of it is Python outside the model: profile one of these steps (py-spy record, or a "
                   f"profiler window on one of them) and move the work off the loop: {how}, compute metrics on the "
                   "device and read them once, log less often.", code)
    else:
        return Fix("Most of it is Python outside the model: profile one of these steps (py-spy record, or a "
                   "profiler window on one of them) and move the work off the loop: compute metrics on the device "
                   "and read them once, log and save less often, run callbacks every N steps.",
                   f"{py_spy(run or {}, 'between.svg', processes)}   # or a profiler window on one such step")
    for library, how, snippet in _EVAL_SETTINGS:
        if site and f"{library}'s " in site:
            return Fix(f"{fix.text} {how}", f"{snippet}\n{fix.snippet}")
    return fix
