"""The Kineto JSON changes of 2026, on code-built traces (field names from pytorch/kineto's source):

- #1356: Stream Sync events on a row of their own, tid = stream + 1000000, "stream N (sync)";
- #1444/#1483: a collective's metadata (name, sizes, dtype, group, process group, seq) copied from
  its record_param_comms op onto the linked device row;
- #1420: "channel" / "channel_type" on kernel, memcpy and memset rows;
- #1460: no top-level WARNING/ERROR log arrays any more (older traces may still have them).
"""

from __future__ import annotations

import copy

import pytest

from kineto_builder import DEVICE_PID, TraceBuilder
from torchdoctor.metrics.rank import analyze_rank
from torchdoctor.session import analyze_paths
from torchdoctor.trace.load import load_trace
from torchdoctor.trace.model import Cat

SYNC_TID_OFFSET = 1_000_000  # kSyncStreamTidOffset in libkineto/src/output_json.cpp


def busy_job(b: TraceBuilder, steps: int = 3) -> TraceBuilder:
    for s in range(steps):
        t = 1000.0 * s
        b.step(s, t, 1000.0)
        b.kernel("ampere_sgemm_128x64_nn", t + 100, 400, launch_at=t + 50)
        b.sync_event("Stream Sync", t + 520, 300)
    return b


def move_stream_syncs_to_their_row(doc: dict) -> dict:
    """What Kineto 2026 writes: the same Stream Sync events on tid stream + 1e6, with the row's metadata."""
    doc = copy.deepcopy(doc)
    evs = doc["traceEvents"]
    for e in evs:
        if e.get("cat") == "cuda_sync" and e["name"] == "Stream Sync":
            e["tid"] = e["args"]["stream"] + SYNC_TID_OFFSET
    evs.insert(1, {"name": "thread_name", "ph": "M", "ts": 0, "pid": DEVICE_PID, "tid": 7 + SYNC_TID_OFFSET,
                   "args": {"name": "stream 7 (sync)"}})
    evs.insert(2, {"name": "thread_sort_index", "ph": "M", "ts": 0, "pid": DEVICE_PID,
                   "tid": 7 + SYNC_TID_OFFSET, "args": {"sort_index": 7}})
    return doc


def write(tmp_path, name: str, doc: dict):
    import json

    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_stream_sync_row_of_its_own_changes_no_number(tmp_path):
    old = busy_job(TraceBuilder()).document()
    new = move_stream_syncs_to_their_row(old)
    a = analyze_rank(load_trace(write(tmp_path, "old.json", old)))
    tr = load_trace(write(tmp_path, "new.json", new))
    b = analyze_rank(tr)
    syncs = tr.cat == Cat.SYNC
    assert syncs.sum() == 3 and set(tr.tid[syncs].tolist()) == {7 + SYNC_TID_OFFSET}
    assert set(tr.stream[syncs].tolist()) == {7}  # the stream comes from args, not from the row
    assert [s.stream for s in b.stream_idle] == [7] == [s.stream for s in a.stream_idle]
    assert b.metrics.busy_pct == a.metrics.busy_pct == 40.0
    assert b.syncs.device_sync_events == a.syncs.device_sync_events == {"Stream Sync": 3}


def test_channel_fields_and_no_log_arrays(tmp_path):
    b = busy_job(TraceBuilder())
    plain = analyze_rank(load_trace(str(b.write(tmp_path / "plain.json"))))
    doc = b.document()
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"].update(channel=3, channel_type=1)
    with_logs = dict(doc, WARNING=['Missing "\\u0000 \\u0001', "x"], ERROR=[])
    for name, d in (("channels.json", doc), ("logs.json", with_logs)):
        r = analyze_rank(load_trace(write(tmp_path, name, d)))
        assert r.metrics.busy_pct == plain.metrics.busy_pct == 40.0
        assert r.kernels == plain.kernels and r.warnings == []


def nccl_job(b: TraceBuilder, rank: int, ag_us: float, ar_us: float, steps: int = 3, extra_us: float = 0.0,
             metadata: bool = True) -> TraceBuilder:
    """Per step one all_gather then one all_reduce (seq 2s, 2s+1) on the default group; with
    `extra_us`, one more all_reduce on a second group that only this rank records."""
    for s in range(steps):
        t = 10_000.0 * s
        b.step(s, t, 10_000.0)
        b.kernel("ampere_sgemm_128x64_nn", t + 100, 3000, launch_at=t + 50)
        calls = [("ncclDevKernel_AllGather_RING_LL", "_allgather_base", 4096 * 4, 2 * s, ag_us, "0"),
                 ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "allreduce", 1 << 20, 2 * s + 1, ar_us, "0")]
        if extra_us:
            calls.append(("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "allreduce", 256, s, extra_us, "7"))
        at = t + 3200
        for kernel, coll, nelems, seq, dur, pg in calls:
            b.op("record_param_comms", at - 40, 20)
            b.kernel(kernel, at, dur, stream=22, launch_at=at - 30)
            if metadata:
                b.events[-1]["args"].update({
                    "Collective name": coll, "In msg nelems": nelems, "Out msg nelems": nelems * 2,
                    "Group size": 2, "dtype": "Float", "Process Group Name": pg,
                    "Process Group Description": "default_pg" if pg == "0" else "undefined",
                    "Process Group Ranks": "[0, 1]", "Seq": seq, "Rank": rank})
            at += dur + 10
    return b


def test_collective_metadata_on_device_rows(tmp_path):
    tr = load_trace(str(nccl_job(TraceBuilder(rank=0, world_size=2), 0, 300, 900).write(tmp_path / "r0.json")))
    assert tr.coll_idx.size == 6 and (tr.cat[tr.coll_idx] == Cat.KERNEL).all()
    assert sorted(tr.coll_seq.tolist()) == [0, 1, 2, 3, 4, 5]
    assert set(tr.colls) == {("_allgather_base", "Float", 4096 * 4, 4096 * 8, 2, "0"),
                             ("allreduce", "Float", 1 << 20, 1 << 21, 2, "0")}
    c = analyze_rank(tr).collectives
    assert c is not None and c.source == "device"
    by = {k.name: k for k in c.kinds}
    assert by["allreduce"].calls == 3 and by["allreduce"].bytes == 3 * (1 << 20) * 4
    assert by["allreduce"].time_ns == 3 * 900_000 and by["_allgather_base"].time_ns == 3 * 300_000
    assert c.groups == ["0"] and sorted(c.call_seq) == [0, 1, 2, 3, 4, 5]


def test_collective_metadata_on_host_rows_when_no_device_row_has_it(tmp_path):
    """gloo, or a Kineto before 2026: the record_param_comms CPU op carries the metadata."""
    b = TraceBuilder(rank=0, device_name=None)
    for s in range(3):
        b.step(s, 1000.0 * s, 1000.0)
        b.op("record_param_comms", 1000.0 * s + 100, 250)
        b.events[-1]["args"].update({"Collective name": "allreduce", "In msg nelems": "64", "dtype": "BFloat16",
                                     "Group size": 2, "Process Group Name": "0", "Seq": str(s)})
    c = analyze_rank(load_trace(str(b.write(tmp_path / "cpu.json")))).collectives
    assert c is not None and c.source == "host" and c.call_seq == [0, 1, 2]
    assert c.kinds[0].bytes == 3 * 64 * 2 and c.kinds[0].time_ns == 3 * 250_000


@pytest.mark.parametrize("matched", [True, False])
def test_cross_rank_matching_by_sequence_number(tmp_path, matched):
    """Rank 1 arrives late at every collective, so rank 0 waits: rank 0's calls last longer.

    Rank 1 also runs a long collective on a second process group that rank 0 never joins. Summing
    all collective time per rank then makes rank 1 look like the waiter and blames rank 0; matching
    the same calls by (group, seq) compares like with like and names rank 1."""
    r0 = nccl_job(TraceBuilder(rank=0, world_size=2), 0, ag_us=700, ar_us=1500, metadata=matched)
    r1 = nccl_job(TraceBuilder(rank=1, world_size=2), 1, ag_us=100, ar_us=300, extra_us=2500, metadata=matched)
    rep = analyze_paths([str(r0.write(tmp_path / "rank0.json")), str(r1.write(tmp_path / "rank1.json"))])
    x = rep.cross_rank
    if matched:
        assert (x.matched_by, x.matched_calls) == ("seq", 6)
        assert x.straggler == 1 and x.victims == [0]
        waits = {w.rank: w.comm_wait_ms for w in x.per_rank}
        assert waits == {0: pytest.approx(2.2), 1: pytest.approx(0.4)}
        assert x.straggler_lead_ms == pytest.approx(1.8)
    else:
        # Without the metadata only the totals exist, and they mislead exactly as described.
        assert x.matched_by == "aggregate" and x.matched_calls == 0
        assert x.straggler == 0
