"""The annotated trace: a streamed copy with torchdoctor's events on an extra track."""

from __future__ import annotations

import gzip
import io
import json
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
from report_helpers import hostile_trace, sample_findings

from torchdoctor.report import annotate as A
from torchdoctor.report.labels import cause_label
from torchdoctor.report.model import Report
from torchdoctor.session import analyze_paths
from torchdoctor.trace.load import load_trace

_exact = msgspec.json.Decoder(float_hook=Decimal)


def read_events(path: Path, how: str = "exact") -> list[dict]:
    """All events of a trace, parsed as strict JSON: "exact" (msgspec, numbers with a fraction as
    Decimal) or "stdlib" (the standard library's json, a second opinion on validity)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw, parse_float=Decimal) if how == "stdlib" else _exact.decode(raw)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def ours(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("pid") == A.TD_PID]


def us(ns: int) -> Decimal:
    return Decimal(ns) / 1000


def check_annotations(rep: Report, out: Path, rank_index: int = 0, events: list[dict] | None = None
                      ) -> list[dict]:
    """Added events sit exactly where the analysis saw the gaps, findings and steps."""
    r = rep.ranks[rank_index].analysis
    assert r is not None
    mine = ours(read_events(out) if events is None else events)
    meta = {(e["name"], e["tid"]): e["args"] for e in mine if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "torchdoctor"}
    assert meta[("thread_name", A.TID_IDLE)]["name"].startswith("device idle")
    lo, hi = r.window.start_ns, r.window.end_ns

    gaps = [e for e in mine if e["ph"] == "X" and e["tid"] == A.TID_IDLE]
    assert len(gaps) == len(r.timeline_gaps)
    for e, (s, end, cause) in zip(gaps, r.timeline_gaps, strict=True):
        assert e["ts"] == us(lo + s) and e["dur"] == us(end - s)
        assert e["name"].startswith(f"idle: {cause_label(cause)}, ") and e["name"].endswith(" ms")
        assert e["args"]["cause"] == cause and e["cat"] == A.TD_CAT

    found = [e for e in mine if e["ph"] == "X" and e["tid"] == A.TID_FINDINGS]
    expect = [f for f in rep.findings if not f.ranks or r.rank in f.ranks]
    assert [e["args"]["id"] for e in found] == [f.id for f in expect]
    for e in found:
        assert e["ts"] == us(lo) and e["dur"] == us(hi - lo)

    steps = [e for e in mine if e["ph"] == "X" and e["tid"] == A.TID_WINDOW and e["name"].startswith("step ")]
    assert [e["args"]["step"] for e in steps] == [s.step for s in r.steps]
    for e, s in zip(steps, r.steps, strict=True):
        assert e["ts"] == us(s.start_ns)
    return mine


def test_real_trace_gz_roundtrip(real_report: Report, tmp_path: Path):
    rep = msgspec.structs.replace(real_report, findings=sample_findings())
    out = A.write_annotated_trace(rep, tmp_path / "annotated.json.gz")
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    src = real_report.ranks[0].analysis.file
    mine = check_annotations(rep, out, events=read_events(out))
    # The original bytes are all there, unchanged: ours are spliced in after `"traceEvents": [`.
    before, after = gzip.decompress(Path(src).read_bytes()), gzip.decompress(out.read_bytes())
    at = A._KEY.search(before).end()
    assert after.startswith(before[:at]) and after.endswith(before[at:])
    middle = after[at: len(after) - (len(before) - at)].strip()
    assert middle.endswith(b",")  # the array had events: ours are followed by a comma
    assert json.loads(b"[" + middle[:-1] + b"]", parse_float=Decimal) == mine
    # Findings here do not name ranks; an annotated finding carries its evidence and fix.
    dl1 = next(e for e in mine if e.get("args", {}).get("id") == "DL-1")
    assert dl1["name"].startswith("[critical] DL-1: The GPU waits for the DataLoader")
    assert dl1["args"]["fix"].startswith("Load batches")
    # torchdoctor's own loader reads the copy; the analysis is unchanged by the extra track.
    tr = load_trace(str(out))
    assert tr.rank == 3
    again = analyze_paths([str(out)]).ranks[0].analysis
    before = real_report.ranks[0].analysis
    assert again.metrics == before.metrics and again.steps == before.steps
    assert again.window == before.window and again.timeline_gaps == before.timeline_gaps


def test_plain_json_and_exact_ns_timestamps(tmp_path: Path):
    # Epoch µs with ns decimals need 19 digits: the added events must not round them.
    src = tmp_path / "epoch.json"
    # (.613: a float64 cannot hold it at this magnitude, so the loader switches to exact decoding.)
    hostile_trace(src, ["k_a", "k_b"], t0_us="1712195495519689.613")
    rep = analyze_paths([str(src)])
    assert rep.ranks, rep.errors
    assert rep.ranks[0].analysis.window.start_ns == 1712195495519689613
    rep = msgspec.structs.replace(rep, findings=sample_findings())
    out = A.write_annotated_trace(rep, tmp_path / "epoch.annotated.json")
    assert out.read_bytes()[:1] == b"{"
    mine = check_annotations(rep, out)
    assert read_events(out, "stdlib")[: len(mine)] == mine
    assert any(str(e.get("ts")) == "1712195495519689.613" for e in mine)
    load_trace(str(out))


def test_multi_rank_picks_the_requested_rank(multi_report: Report, tmp_path: Path):
    rep = msgspec.structs.replace(multi_report, findings=sample_findings())
    idx = next(i for i, r in enumerate(rep.ranks) if r.rank == 1)
    out = A.write_annotated_trace(rep, tmp_path / "r1.json", rank=1)
    mine = check_annotations(rep, out, idx)
    # DIST-2 names ranks 0–2: rank 1 gets it; a rank outside that list would not.
    assert any(e.get("args", {}).get("id") == "DIST-2" for e in mine)
    with pytest.raises(A.AnnotateError, match="rank 77"):
        A.write_annotated_trace(rep, tmp_path / "r77.json", rank=77)
    assert not list(tmp_path.glob(".r77*"))  # no temporary file left behind


def test_nothing_to_annotate():
    with pytest.raises(A.AnnotateError, match="no analysed trace"):
        A.write_annotated_trace(Report(), "/nonexistent/out.json")


def test_annotate_onto_its_own_path(tmp_path: Path):
    src = hostile_trace(tmp_path / "self.json.gz", ["k"])
    rep = analyze_paths([str(src)])
    before = read_events(src)
    A.write_annotated_trace(rep, src)  # written aside, then renamed over the original
    after = read_events(src)
    n = len(ours(after))
    assert n > 0 and after[n:] == before


@pytest.mark.parametrize("doc", [
    b'{"schemaVersion": 1, "traceEvents": [{"ph": "X"}], "x": 1}',
    b'{"deviceProperties": [], "traceEvents"  :\n  [ ]}',
    b'  [{"ph": "X"}]',
    b"[]",
])
def test_splice_every_shape_and_block_boundary(doc: bytes, monkeypatch: pytest.MonkeyPatch):
    """Events go first in the array, with a comma only when the array had events; whatever block
    size cuts the `"traceEvents": [` token."""
    payload = b'{"ph": "M", "name": "td"}'
    for block in (1, 3, 7, 4096):
        monkeypatch.setattr(A, "BLOCK", block)
        out = io.BytesIO()
        A._splice(io.BytesIO(doc), out, payload)
        parsed = json.loads(out.getvalue())
        events = parsed["traceEvents"] if isinstance(parsed, dict) else parsed
        original = json.loads(doc)
        rest = original["traceEvents"] if isinstance(original, dict) else original
        assert events == [{"ph": "M", "name": "td"}, *rest], (block, out.getvalue())


def test_not_a_trace(tmp_path: Path):
    with pytest.raises(A.AnnotateError, match="traceEvents"):
        A._splice(io.BytesIO(b'{"other": 1}'), io.BytesIO(), b"{}")
