"""Rank summaries held compressed on the driver: the same report as decoded results, without holding them."""

from __future__ import annotations

import gc
import io

import msgspec
import pytest
from rich.console import Console

from torchdoctor.metrics.model import Headline, RankResult, WindowInfo
from torchdoctor.metrics.store import StoredResult, SummaryStore
from torchdoctor.metrics.summary import compact
from torchdoctor.report.console import print_report
from torchdoctor.report.html import render_html
from torchdoctor.report.json_out import chunks
from torchdoctor.report.model import LazyRanks
from torchdoctor.rules import RankInputs
from torchdoctor.session import analyze_rank_file, assign_ranks, build_report

TRACES = ["a100_16rank_rank0.json.gz", "a100_2rank_rank0_nccl.json.gz", "a100_8rank_rank3.json.gz",
          "sampled_128rank_rank0.json.gz", "v100_2rank_rank1_diff.json.gz", "v100_resnet_rank0.json.gz"]
MARK = "stored://"


@pytest.fixture(scope="module")
def summaries(traces_dir) -> list[RankResult]:
    """Twelve ranks: the real traces twice over, as summaries, ranks 0-11, as they arrive from
    workers (msgpack: a float field that held an int is a float)."""
    base = [compact(analyze_rank_file(str(traces_dir / n))) for n in TRACES]
    trip = [msgspec.msgpack.decode(msgspec.msgpack.encode(r), type=RankResult) for r in base]
    return [msgspec.structs.replace(trip[i % len(trip)], rank=i, file=f"{MARK}{i}") for i in range(2 * len(trip))]


def _stored(summaries: list[RankResult], cache: int) -> tuple[SummaryStore, list[RankInputs]]:
    store = SummaryStore(cache=cache)
    return store, [RankInputs(r.rank, result=store.put(r)) for r in summaries]


def _console(report) -> str:
    out = io.StringIO()
    print_report(report, Console(file=out, width=150, highlight=False), verbose=True)
    return out.getvalue()


def test_stored_ranks_give_the_same_report(summaries):
    """Every number, finding and line of every renderer is the one the decoded results give."""
    plain = build_report([RankInputs(r.rank, result=r) for r in summaries])
    store, inputs = _stored(summaries, cache=3)
    stored = build_report(inputs)
    assert isinstance(stored.ranks, LazyRanks) and len(stored.ranks) == len(summaries)
    assert stored.findings and stored.cross_rank is not None
    assert b"".join(chunks(stored)) == b"".join(chunks(plain))
    assert _console(stored) == _console(plain)
    assert render_html(stored) == render_html(plain)
    # Decoded when read, never kept: far fewer bytes held than the decoded results would take.
    assert store.decodes > len(summaries) and store.nbytes < sum(len(msgspec.msgpack.encode(r)) for r in summaries)


def test_a_stored_report_holds_no_decoded_results(summaries):
    """After the diagnosis and every renderer, no rank's decoded result is alive beyond the store's
    cache: not in the views, the ledger, the findings or the report."""
    _, inputs = _stored(summaries, cache=2)
    report = build_report(inputs)
    for _ in chunks(report):
        pass
    _console(report)
    render_html(report)
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o) is RankResult and o.file.startswith(MARK)
             and not any(o is s for s in summaries)]
    assert len(alive) <= 2, len(alive)


def test_a_handle_carries_what_the_driver_sets():
    """The rank the session assigns and the file name the user gave live on the handle, and every
    load, after an eviction too, shows them."""
    store = SummaryStore(cache=1)
    r = RankResult(None, "a.json", None, "cpu", WindowInfo(0, 1, [], "trace"), Headline(), warnings=["odd"])
    h = store.put(r)
    other = store.put(msgspec.structs.replace(r, rank=0, file="b.json"))
    assign_ranks([h, other], ["a.json", "b.json"], [])
    h.file = "given/a.json"
    assert isinstance(h, StoredResult) and (h.rank, h.rank_source) == (1, "order") and h.warnings == ["odd"]
    got = h.load()
    assert (got.rank, got.rank_source, got.file, got.warnings) == (1, "order", "given/a.json", ["odd"])
    assert other.load().rank == 0 and h.load().file == "given/a.json"  # evicted and decoded again
    fields = len(msgspec.structs.fields(RankResult))
    assert store.decodes == 3 * fields


def test_a_view_decodes_only_the_fields_read(summaries):
    store = SummaryStore(cache=4)
    h = store.put(summaries[0])
    h.rank = 7
    v = h.view()
    assert v.rank == 7 and v.file == summaries[0].file and store.decodes == 0  # the handle's own fields
    assert msgspec.to_builtins(v.metrics) == msgspec.to_builtins(summaries[0].metrics)
    assert v.signals == summaries[0].signals and v.kernels == summaries[0].kernels
    assert v.metrics is v.metrics and store.decodes == 3
    with pytest.raises(AttributeError):
        v.not_a_field  # noqa: B018
    # Large fields are compressed, short ones shared: far fewer bytes than the encoded result.
    assert store.nbytes < 0.6 * len(msgspec.msgpack.encode(summaries[0]))
