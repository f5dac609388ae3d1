"""Rank summaries held by the driver of a large analysis: compressed, decoded a field at a time.

Above SUMMARY_RANKS ranks (metrics/summary.py) each rank's summary is put here as it arrives from its
worker and a `StoredResult` handle stands for it. A GPU rank's 12 KB summary takes 28 KB as Python
objects; here it takes about 6 KB: each field of the `RankResult` encoded on its own (msgpack) and,
past COMPRESS_BYTES, zlib-compressed. 4,096 ranks hold ~25 MB instead of ~115 MB.

Two ways to read a rank:
- `StoredResult.view()`: a read-only `ResultView` that decodes a field the first time it is read.
  The rules read a few fields of every rank, one rule after the other (rules/_common.View): each
  read costs the fields it touches (~10 us), not the whole result (~100 us).
- `StoredResult.load()`: the whole `RankResult` (renderers, the JSON report).
The store keeps the last CACHE_RANKS of each, so a rule or a renderer reading one rank many times
in a row decodes it once, and nothing holds thousands of decoded ranks.

What the driver sets on a rank after it arrived (the file name the user gave, the rank number
`session.assign_ranks` assigns) lives on the handle and shows in every view and load.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Any

import msgspec

from .model import RankResult

# Decoded results (and views) kept for reuse: a reader reads one rank many times in a row, then moves on.
CACHE_RANKS = 64
# Fields encoded in fewer bytes stay uncompressed (zlib's own cost and header outweigh the gain).
COMPRESS_BYTES = 128
_LEVEL = 1  # zlib: level 1 is 2x faster than 6 and within 5% of its size on rank summaries
_FIELDS = msgspec.structs.fields(RankResult)
_NAMES = tuple(f.name for f in _FIELDS)
_INDEX = {name: i for i, name in enumerate(_NAMES)}
_DECODERS = tuple(msgspec.msgpack.Decoder(f.type) for f in _FIELDS)


class SummaryStore:
    """Rank summaries appended once, each as its fields' encodings, read as views or whole results."""

    def __init__(self, cache: int = CACHE_RANKS) -> None:
        self._parts: list[tuple[bytes, ...]] = []
        self._packed: list[int] = []  # per rank: bit i set when field i is compressed
        self._small: dict[bytes, bytes] = {}  # one copy of each short encoding (None, [], 0.0 ...)
        self._results: OrderedDict[int, RankResult] = OrderedDict()
        self._views: OrderedDict[int, ResultView] = OrderedDict()
        self._size = max(1, cache)
        self._encoder = msgspec.msgpack.Encoder()
        self.decodes = 0  # fields decoded (for the tests and benchmarks)

    def put(self, r: RankResult) -> StoredResult:
        """Store `r` (the caller drops it) and return the handle that stands for it."""
        parts, packed = [], 0
        for i, name in enumerate(_NAMES):
            data = self._encoder.encode(getattr(r, name))
            if len(data) >= COMPRESS_BYTES:
                data, packed = zlib.compress(data, _LEVEL), packed | (1 << i)
            else:
                data = self._small.setdefault(data, data)
            parts.append(data)
        self._parts.append(tuple(parts))
        self._packed.append(packed)
        return StoredResult(self, len(self._parts) - 1, r)

    def field(self, index: int, name: str) -> Any:
        """One field of rank `index`, decoded."""
        i = _INDEX[name]
        data = self._parts[index][i]
        self.decodes += 1
        return _DECODERS[i].decode(zlib.decompress(data) if self._packed[index] >> i & 1 else data)

    def view(self, index: int) -> ResultView:
        v = self._views.get(index)
        if v is None:
            v = self._views[index] = ResultView(self, index)
            if len(self._views) > self._size:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(index)
        return v

    def get(self, index: int) -> RankResult:
        """The whole result of rank `index` (shared with the cache: read it, do not change it)."""
        r = self._results.get(index)
        if r is None:
            r = self._results[index] = RankResult(**{name: self.field(index, name) for name in _NAMES})
            if len(self._results) > self._size:
                self._results.popitem(last=False)
        else:
            self._results.move_to_end(index)
        return r

    def __len__(self) -> int:
        return len(self._parts)

    @property
    def nbytes(self) -> int:
        """Bytes held in the fields' encodings (shared short ones counted once)."""
        seen = {id(b) for b in self._small.values()}
        return sum(len(b) for parts in self._parts for b in parts if id(b) not in seen) + sum(map(len, self._small))


class ResultView:
    """A stored rank's `RankResult` to read, field by field: each field is decoded when first read
    and kept while the view is (the store keeps the last CACHE_RANKS views). Read-only."""

    __slots__ = ("_store", "_index", "_got")

    def __init__(self, store: SummaryStore, index: int) -> None:
        self._store, self._index = store, index
        self._got: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        got = self._got
        if name in got:
            return got[name]
        if name not in _INDEX:
            raise AttributeError(f"RankResult has no field {name!r}")
        value = got[name] = self._store.field(self._index, name)
        return value


class StoredResult:
    """A rank's summary in a `SummaryStore`, with the fields the driver reads or sets without
    decoding it (rank, rank_source, file, warnings, device_kind)."""

    __slots__ = ("_store", "_index", "rank", "rank_source", "file", "warnings", "device_kind")

    def __init__(self, store: SummaryStore, index: int, r: RankResult) -> None:
        self._store, self._index = store, index
        self.rank, self.rank_source, self.file = r.rank, r.rank_source, r.file
        self.warnings, self.device_kind = list(r.warnings), r.device_kind

    @property
    def store(self) -> SummaryStore:
        return self._store

    def load(self) -> RankResult:
        """The whole decoded result (read-only: shared with the store's cache), with the handle's fields."""
        r = self._store.get(self._index)
        r.rank, r.rank_source, r.file = self.rank, self.rank_source, self.file
        return r

    def view(self) -> ResultView:
        """The result to read field by field (read-only), with the handle's fields."""
        v = self._store.view(self._index)
        v._got.update(rank=self.rank, rank_source=self.rank_source, file=self.file)
        return v


def headline(r: RankResult) -> RankResult:
    """A copy of `r` with only what a table of many ranks shows (rank, file, device, window, headline
    metrics): a few hundred bytes to keep per rank where the whole result would be 28 KB."""
    return RankResult(r.rank, r.file, r.device, r.device_kind, r.window, r.metrics, r.world_size, r.backend,
                      r.rank_source)


def loaded(r: RankResult | StoredResult | None) -> RankResult | None:
    """`r` itself, or the result its handle stands for."""
    return r.load() if isinstance(r, StoredResult) else r


__all__ = ["CACHE_RANKS", "ResultView", "StoredResult", "SummaryStore", "headline", "loaded"]
