"""`torchdoctor demo`: each pathology observable on a CPU shows in the recorded facts and timings."""

from __future__ import annotations

import statistics

import pytest

from probe.livejob import PY, load_run, run
from torchdoctor.session import report_from_run_dir

STEPS = "16"  # the profiler window is 10:13 and the gather at 13


def demo(run_dir, *flags):
    result = run(
        [PY, "-m", "torchdoctor.workloads.cli", "--quiet", "--steps", STEPS, "--out", str(run_dir), *flags]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [entry["facts"] for entry in load_run(run_dir)["ranks"]]
    assert [f.get("rank", 0) for f in ranks] == [0, 1]
    return result, ranks, run_dir


def wait_share(facts):
    """Median share of the step spent waiting for the DataLoader."""
    return statistics.median(s.get("dataloader_ms", 0.0) / s["total_ms"] for s in facts["steps"])


@pytest.fixture(scope="module")
def sick(tmp_path_factory):
    return demo(tmp_path_factory.mktemp("demo") / "sick")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return demo(tmp_path_factory.mktemp("demo") / "healthy", "--healthy")


def test_pathologies_are_recorded(sick):
    result, ranks, _ = sick
    assert "torchdoctor demo (pathological): 16 steps on 2 ranks" in result.stdout
    for facts in ranks:
        (loader,) = facts["dataloaders"]
        # DataLoader in the training process, no pinned memory, a collate_fn syncing every sample.
        assert loader["num_workers"] == 0 and loader["pin_memory"] is False
        assert loader["collate_fn"] == "torchdoctor.workloads.demo.syncing_collate"
        # Per sample: .numpy() of the image, .item() of the label; 64 samples.
        assert loader["collate_syncs_per_batch"] == 128.0
        # The collate is timed, and is a small part of the batch wait (storage latency dominates).
        assert 0 < loader["collate_ms_mean"] < 0.25 * loader["next_ms_mean"]
        assert loader["call_site"].split("/")[-1].startswith("demo.py:")
        # loss.item() every step.
        assert 0.9 <= facts["host_syncs_per_step"] <= 1.1
        ((site, _),) = facts["host_sync_sites"].items()
        assert site.split("/")[-1].startswith("demo.py:")
        # find_unused_parameters=True with nothing unused; tiny buckets.
        (ddp,) = facts["ddp"]
        assert ddp["find_unused_parameters"] is True and ddp["unused_parameter_size"] == 0
        assert ddp["bucket_cap_mb"] == 0.001 and ddp["num_buckets"] >= 4
        # Slow decoding in the training process dominates the step.
        assert wait_share(facts) > 0.3
        # GPU-only pathologies are not injected on a CPU, and nothing is invented for the device.
        assert facts.get("device", {}) in ({}, {"kind": "cpu"}) and "modules_off_device" not in facts
        assert facts["trace_file"] and facts["profile_steps"] == [10, 13]


def test_healthy_version_is_fixed(healthy, sick):
    result, ranks, _ = healthy
    assert "torchdoctor demo (healthy): 16 steps on 2 ranks" in result.stdout
    for facts, sick_facts in zip(ranks, sick[1], strict=True):
        (loader,) = facts["dataloaders"]
        assert loader["num_workers"] >= 1 and loader["persistent_workers"] is True
        assert loader["collate_fn"] == "torch.utils.data._utils.collate.default_collate"
        assert facts.get("host_syncs_per_step", 0.0) < 0.1  # one read of the summed loss at the end
        (ddp,) = facts["ddp"]
        assert ddp["find_unused_parameters"] is False and ddp["bucket_cap_mb"] == 25.0
        assert ddp["gradient_as_bucket_view"] is True
        assert wait_share(facts) < wait_share(sick_facts) / 2
        # The workers keep up: most batches are ready when the step asks for them.
        assert loader["ready_share"] >= 0.6 and "collate_ms_mean" not in loader


def test_the_diagnosis_names_the_pathologies(sick):
    findings = report_from_run_dir(str(sick[2])).findings
    by_id = {f.id: f for f in findings}
    # Loading in the training process dominates, and the fix names the worker count the advice
    # computes from this run's own facts.
    dl2 = by_id["DL-2"]
    assert dl2.severity == "critical" and dl2.remedy == "dataloader.workers" and findings[0].id == "DL-2"
    waits = [100 * wait_share(f) for f in sick[1]]
    # Workers hide most of the wait, never more than it (the claims ledger caps it at the wait).
    assert 0.5 * min(waits) <= dl2.recoverable_pct <= max(waits) + 5
    from torchdoctor.remedies.select import choose

    (workers,) = [c.spec for c in choose(findings, "safe") if c.spec.id == "dataloader.workers"]
    n = int(workers.value)  # what `fix` applies is what the finding advises
    assert f"num_workers={n}" in dl2.fix.snippet
    # The demo's loading waits on latency (the training thread is blocked most of its wait), whatever
    # the machine's load; how many workers hide it, ceil(wait / rest of the step), does depend on
    # the machine's speed (a slower step leaves a longer rest): measured here 1 at 366 ms steps, 3 at 195.
    assert "latency-bound loading" in dl2.fix.text and n >= 1
    assert by_id["DI-7"].remedy == "ddp.find_unused_false" and by_id["DI-10"].remedy == "ddp.bucket_cap"
    collate = [f for f in findings if f.id == "HO-3" and "collate_fn" in f.title]
    assert collate and collate[0].recoverable_ms > 0  # priced from the probe's collate timing
    assert sum(f.recoverable_pct for f in findings if f.severity != "info") <= 100.0


def test_the_healthy_demo_raises_no_warning(healthy):
    findings = report_from_run_dir(str(healthy[2])).findings
    assert [f"{f.id}: {f.title}" for f in findings if f.severity != "info"] == []
