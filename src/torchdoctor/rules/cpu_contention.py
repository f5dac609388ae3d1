"""Host layer, CPU contention: the training thread waits for a core, and who holds the cores (HO-14).

Measured, not assumed: the training thread's run-queue delay, apportioned to who held its CPUs
(rules/_cpu.py: the rank's own threads, other ranks, DataLoader workers, others). A job without
workers or other load shows almost no delay (measured: 0.3-0.4 ms of a 62-67 ms step, lm job,
num_workers=0), so its delay comes from the load beyond its own threads.

HO-14 claims the workers' part: cheaper per-sample work, or workers at a lower priority, gives it
back. That claim is an upper bound: a fix removes only the workers' excess work, and the part
they need stays. Measured on the accuracy harness's lm job (benchmarks/results/accuracy_lm_mlp.md),
the healthy job's necessary workers already cost 1-8% of the step this way, and a collate that
doubles the workers' CPU time measured +17% against a claim of 5-14%: the claim cannot tell
necessary work from excess, so HO-14 is a warning only from WARN_AT_PCT (20%) of the step, where
even a part of it matters, and info below, with low confidence and the A/B that confirms it.

A converting collate measured inside the workers (probe/workers.py: at least one host conversion
per batch, and its CPU time) tells the excess apart: element-by-element ``.item()``/``.tolist()``
costs orders of magnitude more than the whole-tensor collate that replaces it, so the collate's CPU
time is the excess. When the ranks' intra-op threads cover every CPU they run on, each millisecond a
worker holds a CPU is taken from one of those threads, and a parallel op waits for its slowest
thread: the claim is then the collate's CPU time per batch (one batch per step), not only the
training thread's own delay (measured on the lm job: a collate of 9 ms of CPU per batch, a 17%
gain from removing it, against 10% of run-queue delay on the training thread). With fewer threads
than CPUs, or on an accelerator (whose intra-op threads mostly wait for the device), the training
thread's delay bounds it: the workers' part times the collate's share of the workers' CPU. Either
way the excess is known, so the usual ladder applies (warning from 5%). A loader that falls behind
(the step waits for batches not produced yet) sets the step's pace: the collate then costs
waiting, HO-3's claim, and HO-14 keeps its upper-bound reading.

The other parts are reported, not claimed: the own threads' part is HO-13's to price; other
processes' (steal included) is not the job's to fix. The split apportions by CPU time; it does
not trace who preempted whom.
"""

from __future__ import annotations

from ..facts import DataLoaderFacts
from ._common import (
    WARN_PCT,
    View,
    converting_collate,
    finding,
    fmt_ms,
    per_rank,
    unready_wait_ms,
    views,
    worker_loader,
    worker_split_text,
)
from ._cpu import oversubscribed_by_job, run_delay
from .engine import RuleInputs, rule
from .input import cheaper_in_process, no_workers_fix
from .model import Evidence, Finding, Fix

MIN_DELAY_PCT = 2.0  # below this share of the step the run-queue delay is the scheduler's normal jitter
WARN_AT_PCT = 20.0  # the workers' part is an upper bound (module docstring): warn only where a part of it matters
CRIT_AT_PCT = 40.0
LOADER_BEHIND_PCT = 1.0  # the step waits this share of itself for batches not produced yet


@rule("HO-14")
def cpu_contention(inputs: RuleInputs) -> list[Finding]:
    """The training thread waits for a CPU (measured run-queue delay); the workers' share is claimed."""
    all_views = views(inputs)

    def one(v: View) -> Finding | None:
        rd = run_delay(v, all_views)
        if rd is None or 100.0 * rd.delay_ms / rd.step_ms < MIN_DELAY_PCT or rd.holders.total <= 0:
            return None
        delay, step, thread_pct, h = rd.delay_ms, rd.step_ms, rd.thread_pct, rd.holders
        parts = {"DataLoader workers": h.workers, "this process's other threads": h.own_threads,
                 "other ranks on this host": h.other_ranks, "the job's other child processes": h.children,
                 "other processes (steal included)": h.others}
        split = {k: rd.part(x) for k, x in parts.items()}
        gain = split["DataLoader workers"]
        cpus = len(v.f.cpu.affinity) or v.f.cpu.logical_cpus or 0
        who = ", ".join(f"{k} {fmt_ms(ms)} ({x:.0f}% of a core)" for (k, ms), x
                        in zip(split.items(), parts.values(), strict=True) if ms >= 0.05 * delay)
        lead = max(split, key=lambda k: split[k])
        title = (f"The training thread waits {fmt_ms(delay)} per step for a CPU ({100 * delay / step:.0f}% of the "
                 f"step): {lead} hold the {cpus or 'available'} CPU(s) it runs on.")
        evidence = [Evidence(
            f"Run-queue delay of the training thread (Linux schedstat), mean over {len(v.timed)} steady steps: "
            f"{fmt_ms(delay)} of a {fmt_ms(step)} step; the training thread itself ran {thread_pct:.0f}% of a core. "
            f"Apportioned by CPU time on those CPUs: {who}.",
            {"run_delay_ms": round(delay, 3), "step_ms": round(step, 3), "cpus": cpus,
             "holders_pct_of_core": {k: round(x, 1) for k, x in parts.items()},
             "delay_split_ms": {k: round(x, 3) for k, x in split.items()}})]
        to_view = rd.to_view(v)
        conv = converting_collate(v)
        # A loader that falls behind sets the step's pace: there the collate costs waiting (HO-3's
        # claim), and giving its CPU to the training threads would not shorten the step.
        if conv is not None and v.pct(unready_wait_ms(v)) < LOADER_BEHIND_PCT:
            return _collate_finding(v, conv, evidence, gain, delay, step, to_view,
                                    oversubscribed_by_job(v, all_views))
        if lead == "DataLoader workers" or v.pct(gain) >= WARN_PCT:  # the workers' part is worth a look
            inside = worker_loader(v)
            if inside is not None:
                evidence.append(Evidence(worker_split_text(inside), {
                    "dataset_ms": inside.worker_dataset_ms_mean, "collate_ms": inside.worker_collate_ms_mean}))
            fix = Fix(f"Make the workers' per-batch work cheaper ({_cheaper(inside)}), or run them at a lower "
                      "priority so that the training thread gets the CPU first; fewer workers only help if the "
                      "loader stays ahead (no data wait).",
                      "DataLoader(ds, num_workers=N, worker_init_fn=lambda _: os.nice(10))  # workers yield the CPU",
                      "python")
            confirm = ("an A/B with a cheaper collate/transform (or the workers at nice 10): the claim is the most "
                       "it can give back, as the workers' necessary work stays")
            cheaper = cheaper_in_process(inside) if inside is not None else None
            if inside is not None and cheaper is not None:  # no workers at all, and no contention with them
                fix = no_workers_fix([inside], f"; a worker makes a batch in {fmt_ms(cheaper[1])} and receiving it "
                                               f"takes {fmt_ms(cheaper[0])}, so the workers cost this CPU time and more "
                                               "than they give.")
                confirm = "`torchdoctor fix --apply dataloader.workers=0` measures it"
            return finding(v, "HO-14", "host", title, gain * to_view, evidence=evidence, fix=fix, confidence="low",
                           warn=WARN_AT_PCT, crit=CRIT_AT_PCT, confirm=confirm,
                           source="Linux schedstat run delay (Documentation/scheduler/sched-stats.rst)")
        # The workers' part is small: say what holds the CPUs, at info (HO-13 prices the own threads' part).
        fix = {"this process's other threads": Fix(
                   "The rank's own threads compete with its training thread: match intra-op threads to the CPUs "
                   "(see HO-13 when it fires).", "torch.set_num_threads(N_CPUS // LOCAL_RANKS)", "python"),
               "other ranks on this host": Fix(
                   "More busy processes than CPUs: give each rank its own cores (fewer ranks per host, or a "
                   "larger affinity mask).", "torchrun --nproc-per-node N ...   # N <= CPUs", "shell"),
               "the job's other child processes": Fix(
                   "The job's own child processes besides DataLoader workers (a data-augmentation pool such as "
                   "nnU-Net's, set by nnUNet_n_proc_DA; a multiprocessing Pool) take the CPUs the training thread "
                   "needs: run fewer of them, or at a lower priority, as long as they keep up with the steps.",
                   "export nnUNet_n_proc_DA=N   # nnU-Net; elsewhere the pool's own process count", "shell"),
               }.get(lead, Fix("Other processes (or the hypervisor: steal) take the CPUs this job runs on: run it "
                               "on dedicated cores, or measure it when the machine is quiet.",
                               "taskset -c CPUS torchrun ...", "shell"))
        return finding(v, "HO-14", "host", title, gain * to_view, sev="info",
                       evidence=evidence, fix=fix, confidence="medium",
                       source="Linux schedstat run delay (Documentation/scheduler/sched-stats.rst)")

    return per_rank(inputs, one)


def _cheaper(d: DataLoaderFacts | None) -> str:
    """How to make the workers' batches cheaper, by where their time goes (the workers' own timing)."""
    reads, collate = (d.worker_dataset_ms_mean or 0.0, d.worker_collate_ms_mean or 0.0) if d else (0.0, 0.0)
    if reads + collate <= 0:
        return ("a vectorised collate such as default_collate instead of element-by-element "
                ".item()/.tolist(), decode once and cache")
    if collate >= 0.5 * (reads + collate):
        share = f"collate_fn takes {collate / (reads + collate):.0%} of their time per batch"
        if d is not None and (d.collate_fn or "").endswith("default_collate"):
            # torch's own collate converts nothing: its cost is one small tensor per sample, stacked.
            return (f"{share}, torch's default_collate stacking one small sample at a time: let one __getitem__ "
                    "return a whole batch (a BatchSampler as the sampler, batch_size=None)")
        return f"{share}: collate with whole-tensor ops instead of element-by-element .item()/.tolist()"
    return (f"the dataset's reads and transforms take {reads / (reads + collate):.0%} of their time per batch: "
            "decode once and cache, store smaller or pre-resized samples, lighter CPU augmentation")


def _collate_finding(v: View, d: DataLoaderFacts, evidence: list[Evidence], workers_part: float, delay: float,
                     step: float, to_view: float, covered: bool) -> Finding:
    """HO-14 when the workers measured a converting collate: its CPU time is the excess (docstring)."""
    collate_cpu = d.worker_collate_cpu_ms_mean or 0.0
    # On an accelerator the intra-op threads mostly wait for the device: there, as with fewer
    # threads than CPUs, the training thread's own delay bounds the claim.
    if covered and not v.accel:
        # At most the step: a collate costlier than the step runs behind it (HO-3's case).
        gain = min(collate_cpu, step)
        how = "the ranks' intra-op threads cover every CPU, so its CPU time is taken from them"
    else:
        share = min(1.0, collate_cpu / d.worker_cpu_ms_mean) if d.worker_cpu_ms_mean else 1.0
        gain = workers_part * share
        how = (f"the training thread's delay from the workers ({fmt_ms(workers_part)}) times the collate's "
               f"{share:.0%} of the workers' CPU")
    evidence = [*evidence, Evidence(
        worker_split_text(d) + f" Claimed: {fmt_ms(gain)} per step, {100 * gain / step:.0f}% of a {fmt_ms(step)} "
        f"steady step ({how}).",
        {"collate_cpu_ms": collate_cpu, "collate_ms": d.worker_collate_ms_mean,
         "dataset_ms": d.worker_dataset_ms_mean, "conversions_per_batch": d.worker_collate_syncs_per_batch,
         "threads_cover_cpus": covered})]
    title = (f"collate_fn {d.collate_fn or ''} converts {d.worker_collate_syncs_per_batch:.0f} elements per batch "
             f"one by one in the DataLoader workers ({fmt_ms(collate_cpu)} of CPU per batch), on the CPUs the "
             f"training runs on: the training thread waits {fmt_ms(delay)} per step for a CPU.")
    fix = Fix("Collate with whole-tensor ops (torch.stack / torch.as_tensor on whole arrays, or "
              "default_collate) instead of per-element .item()/.tolist()/.numpy(): the workers then need a "
              "fraction of the CPU and give it back to the training threads.",
              "def collate(batch):\n    ids, masks = zip(*batch)\n    return torch.stack(ids), torch.stack(masks)",
              "python")
    return finding(v, "HO-14", "host", title, gain * to_view, evidence=evidence, fix=fix, confidence="medium",
                   confirm="an A/B with the vectorised collate",
                   source="Linux schedstat run delay; the workers' own collate timing (probe/workers.py)")

