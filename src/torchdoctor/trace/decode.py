"""Streaming, typed decoding of Kineto JSON into columns.

Why streaming: a 620 MB trace must not be held in memory whole next to its decoded form (HTA
peaks at ~6x the JSON size). We read the file in blocks, cut the `traceEvents` array at event
boundaries and decode each piece with msgspec into small typed structs that carry only the
fields the analysis needs; unknown fields are skipped by the decoder without being built.

How the cut stays exact: a candidate boundary is a `}` followed by `,` and `{` (whitespace
allowed). The prefix up to it is decoded as a JSON array; if the candidate was inside a string
or a nested object the prefix is not valid JSON and msgspec reports the error at its very end,
so we back off to the previous candidate. An error before the end is a real defect of the file.

Telling those two apart reads msgspec's error text ("truncated", "trailing characters",
"(byte N)"). That wording is not an API: `streaming_supported()` checks it once per process
against inputs whose errors are known, and when it does not match (a msgspec release reworded
it) every file is decoded whole instead: slower and holding the file in memory, but exact.
pyproject also bounds msgspec to the minor versions whose wording was checked.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import math
import os
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import filterfalse, islice
from operator import attrgetter, itemgetter
from typing import Any

import msgspec
import numpy as np

from . import scanned
from .model import CATEGORY_NAMES, CONCRETE_OPS, IGNORED_CATEGORIES, Cat, keeps_shapes

BLOCK_BYTES = 16 << 20
# Timestamps beyond this (µs) are corrupt: 2^53 ns is ~104 days past 1970 in µs terms, Kineto
# writes µs since epoch (~1.7e15 µs) or since boot; anything above 1e17 µs cannot be real.
MAX_TS_US = 1e17
# One event lasting over a day is a corrupt field, not a slow kernel.
MAX_DUR_US = 86_400e6


class TraceFormatError(Exception):
    """The file is not a readable Kineto trace; the message names the problem (not the file)."""


_NO_RAW = msgspec.Raw()


class Args(msgspec.Struct, frozen=True, gc=False):
    # -1 stands for "absent" so that columns build without per-value None checks.
    stream: int = -1
    correlation: int = -1
    bytes: int = -1
    # Kernel launch figures (Kineto computes them from grid, block and the device's SM count);
    # NaN when absent.
    blocks_per_sm: float = msgspec.field(default=math.nan, name="blocks per SM")
    warps_per_sm: float = msgspec.field(default=math.nan, name="warps per SM")
    occupancy_pct: float = msgspec.field(default=math.nan, name="est. achieved occupancy %")
    # The launch grid ([x, y, z]): read only for kernels without `blocks per SM` (Kineto writes -1
    # there when the device's SM count is unknown), whose fill is then grid / the table's SMs.
    grid: msgspec.Raw = _NO_RAW
    # record_shapes=True: kept as raw JSON text (no list is built) and read only for the ops
    # model.keeps_shapes accepts (Concrete Inputs: for convolutions and attention only).
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    # Collective metadata of record_param_comms ops, and (Kineto 2026, pytorch/kineto #1444/#1483)
    # of the device rows linked to them. Raw: any JSON type decodes; only collectives are read.
    coll_name: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Collective name")
    coll_dtype: msgspec.Raw = msgspec.field(default=_NO_RAW, name="dtype")
    in_nelems: msgspec.Raw = msgspec.field(default=_NO_RAW, name="In msg nelems")
    out_nelems: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Out msg nelems")
    group_size: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Group size")
    pg_name: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Process Group Name")
    seq: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Seq")


NO_ARGS = Args()
_COLL_KEYS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size", "Process Group Name",
              "Seq")
# (Args field, JSON key) of the collective metadata, for the lenient path's keyword construction.
_COLL_FIELDS = tuple(zip(("coll_name", "coll_dtype", "in_nelems", "out_nelems", "group_size", "pg_name", "seq"),
                         _COLL_KEYS, strict=True))


# Padding, not data, for Event and ExactEvent: 7 slots make an event as big as an Args (both in
# pymalloc's 80-byte size class), so the two would share pools, interleaved in memory, and every
# pass over the decoded events would run 1.5-3x slower. Two unused slots move events to the
# 96-byte class. They pad the event rather than Args: an unknown key costs a scan over all
# fields, and args carry many unknown keys, events none. The key never occurs in a trace.
_PAD = msgspec.field(default=None, name="~torchdoctor padding")
_PAD2 = msgspec.field(default=None, name="~torchdoctor padding 2")


class Event(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """A complete event ("ph": "X"): the only kind the analysis reads fields of."""

    cat: str = ""
    name: str = ""
    ts: float = math.nan
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: Args = NO_ARGS
    pad1_: None = _PAD
    pad2_: None = _PAD2


class ExactEvent(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    """Like Event, but `ts` kept as the raw JSON number: used when float64 would lose ns.

    Epoch-based microsecond timestamps with ns decimals (1712195495519689.047) need 19
    significant digits; a float64 holds 15-16, so they are parsed as text instead.
    """

    cat: str = ""
    name: str = ""
    ts: msgspec.Raw = msgspec.Raw()
    dur: float = 0.0
    pid: int | str = 0
    tid: int | str = 0
    args: Args = NO_ARGS
    pad1_: None = _PAD
    pad2_: None = _PAD2


class Instant(msgspec.Struct, tag_field="ph", tag="i", gc=False):
    """An instant event ("ph": "i"): read only for the allocator's `[memory]` records."""

    name: Any = ""
    ts: Any = None
    args: Any = None


def _skipped(ph: str) -> type:
    # Flow, metadata, instant, counter ... events: decoded as empty structs, fields skipped unbuilt.
    return msgspec.defstruct(f"Skip_{ph}", [], tag_field="ph", tag=ph, gc=False)


SKIPPED_PH = ("s", "f", "t", "M", "I", "C", "b", "e", "n", "B", "E", "P", "O", "N", "D", "R")
_SKIP_TYPES = (Instant, *(_skipped(ph) for ph in SKIPPED_PH))
_INSTANT_TYPES = (Instant, *(t for t, ph in zip(_SKIP_TYPES[1:], SKIPPED_PH, strict=True) if ph == "I"))
MEMORY_EVENT = "[memory]"


def _union(first: type) -> Any:
    u: Any = first
    for t in _SKIP_TYPES:
        u = u | t
    return u


AnyEvent = _union(Event)
AnyExactEvent = _union(ExactEvent)
# Below 2^43 µs (~100 days) a float64 resolves 1 ns; above it, fractional µs need the exact path.
EXACT_FLOAT_LIMIT_US = float(2**43)


class Header(msgspec.Struct):
    """Top-level keys other than traceEvents that we use (they may come before or after it)."""

    distributedInfo: dict[str, Any] | None = None  # noqa: N815 (Kineto's spelling)
    deviceProperties: list[dict[str, Any]] | None = None  # noqa: N815
    # Kineto before mid-2021 wrote the same under this key, with CUDA's field names (`old_device_properties`).
    computeProperties: list[dict[str, Any]] | None = None  # noqa: N815
    traceEvents: list[AnyEvent] = []  # noqa: N815


    def fill(self, other: Header) -> None:
        """Take from `other` (the keys after the event array) every key this one lacks."""
        self.distributedInfo = self.distributedInfo or other.distributedInfo
        self.deviceProperties = self.deviceProperties or other.deviceProperties
        self.computeProperties = self.computeProperties or other.computeProperties


class ExactHeader(Header):
    traceEvents: list[AnyExactEvent] = []  # noqa: N815


@dataclass(frozen=True)
class Decoders:
    events: msgspec.json.Decoder
    one: msgspec.json.Decoder
    header: msgspec.json.Decoder
    event_type: type


FAST = Decoders(msgspec.json.Decoder(list[AnyEvent]), msgspec.json.Decoder(AnyEvent),
                msgspec.json.Decoder(Header), Event)
EXACT = Decoders(msgspec.json.Decoder(list[AnyExactEvent]), msgspec.json.Decoder(AnyExactEvent),
                 msgspec.json.Decoder(ExactHeader), ExactEvent)
_header = FAST.header
_raw_list = msgspec.json.Decoder(list[msgspec.Raw])
_any = msgspec.json.Decoder()
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_DECIMAL = re.compile(r"-?[0-9]{1,19}")
_BYTE_POS = re.compile(r"\(byte (\d+)\)")
# A timestamp of 13+ integer digits (>= 2^43 µs) with decimals: a float64 would lose its ns, even
# when the float happens to look integral (…689.047 parses as …689.0).
_EXACT_TS = re.compile(rb'"ts"\s*:\s*\d{13,}\.\d')


@dataclass
class Columns:
    """Growing column lists for one file, turned into numpy arrays by `finish`."""

    names: dict[str, int] = field(default_factory=dict)
    cats: dict[str, int] = field(default_factory=dict)
    # Per piece: 9 dense columns, then the sparse rows (launch args, shapes; see `finish`).
    parts: list[tuple] = field(default_factory=list)
    # (Input Dims, Input type, Concrete Inputs) compact JSON texts of the ops model.keeps_shapes
    # accepts, interned; the shape rows hold ids into it.
    shapes: list[tuple[bytes, bytes, bytes]] = field(default_factory=list)
    _shape_ids: dict[bytes, int] = field(default_factory=dict)  # NUL-joined raw texts -> id
    # Collective descriptors (name, dtype, in nelems, out nelems, group size, process group),
    # interned; the collective rows hold ids into it and the sequence number of each call.
    colls: list[tuple[str, str, int, int, int, str]] = field(default_factory=list)
    _coll_ids: dict[tuple, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    instants: int = 0
    # The device allocator's `[memory]` records, per piece: (ts ns, bytes, allocated, reserved, device id).
    memory: list[np.ndarray] = field(default_factory=list)
    unknown_cats: dict[str, int] = field(default_factory=dict)
    # Complete events per category name as the file writes it (set by finish).
    category_counts: dict[str, int] = field(default_factory=dict)
    dec: Decoders = FAST
    # Set when float timestamps were too large for ns precision: the file is decoded again exactly.
    needs_exact: bool = False
    # Per interned category / name id: is it a kernel category / an op whose shapes are kept / a
    # convolution (grown lazily).
    _kernel_cats: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    _shape_names: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    _conv_names: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    _comm_names: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # The compiled scanner of this file's pieces (scanned.py; None when off or not built) and what
    # Python knows of its string tables.
    scanner: Any = field(default_factory=scanned.new_scanner)
    scanned_strings: scanned.Strings = field(default_factory=scanned.Strings)
    # Pieces read by the scanner / by msgspec through add_piece (tests and benchmarks read them).
    pieces_scanned: int = 0
    pieces_decoded: int = 0
    handed_over: int = 0

    def __getstate__(self) -> dict[str, Any]:
        # A worker's columns travel back pickled; the scanner (a C object) and its tables stay behind.
        return {**self.__dict__, "scanner": None, "scanned_strings": scanned.Strings()}

    @property
    def exact(self) -> bool:
        """Timestamps are read from their text (ns exact), not as float µs."""
        return self.dec.event_type is ExactEvent

    def add_piece(self, data: bytes | bytearray | memoryview) -> None:
        """Add the events of `data` ('[' events ']'): the compiled scanner's reading when it has one,
        msgspec's otherwise (the same columns). Raises msgspec's errors as `dec.events.decode` does."""
        if scanned.add_scanned(self, data):
            self.pieces_scanned += 1
            return
        self.pieces_decoded += 1
        try:
            self.add(self.dec.events.decode(data))
        except msgspec.ValidationError:
            _decode_events_lenient(data, self)
        if self.scanner is not None:
            # A readable piece the scanner handed over. Twice in one file (ROCm's string-typed
            # args in every block, say) and the rest of it goes to msgspec straight away rather
            # than being scanned first in vain.
            self.handed_over += 1
            if self.handed_over >= 2:
                self.scanner = None

    def drop(self, why: str, n: int = 1) -> None:
        self.dropped[why] = self.dropped.get(why, 0) + n

    def add(self, events: list) -> None:
        # map/filter with C-level callables throughout: a Python-level loop per event costs
        # more than decoding the JSON.
        etype = self.dec.event_type
        xs = list(filter(etype.__instancecheck__, events))
        if len(xs) != len(events):
            kinds = Counter(map(type, filterfalse(etype.__instancecheck__, events)))
            self.instants += sum(kinds[t] for t in _INSTANT_TYPES)
            if kinds[Instant]:
                self.memory_instants(list(filter(Instant.__instancecheck__, events)))
        n = len(xs)
        if not n:
            return
        name = _intern_ids(self.names, xs, _get_name, np.int32)
        cat = _intern_ids(self.cats, xs, _get_cat, np.int16)
        exact = etype is ExactEvent
        ts = raw_ts_to_ns(list(map(_get_ts, xs))) if exact else np.fromiter(map(_get_ts, xs), np.float64, n)
        dur_us = np.fromiter(map(_get_dur, xs), np.float64, n)
        pid = self._ids(list(map(_get_pid, xs)))
        tid = self._ids(list(map(_get_tid, xs)))
        args = list(map(_get_args, xs))
        stream = _arg_column(args, _get_stream)
        corr = _arg_column(args, _get_corr)
        nbytes = _arg_column(args, _get_bytes)
        k = self.kernel_positions(cat)
        picked = _pick(args, k)
        launch = launch_rows(k, *(np.fromiter(map(get, picked), np.float64, k.size)
                                  for get in (_get_blocks, _get_warps, _get_occ)),
                             lambda j: picked[j].grid)
        shape = self.shape_rows(name, lambda pos: _shape_keys(args, pos),
                                lambda pos: list(map(bytes, map(_get_concrete, _pick(args, pos)))))
        coll = self.coll_rows(cat, name, lambda pos: _pick(args, pos))
        self.add_rows(cat, name, ts, exact, dur_us, pid, tid, stream, corr, nbytes, launch, shape, coll)

    def add_rows(self, cat: np.ndarray, name: np.ndarray, ts: np.ndarray, exact: bool, dur_us: np.ndarray,
                 pid: np.ndarray, tid: np.ndarray, stream: np.ndarray, corr: np.ndarray, nbytes: np.ndarray,
                 launch: tuple, shape: tuple, coll: tuple) -> None:
        """Keep a piece's events as columns, dropping those with unusable times (counted by reason).

        `ts` is float µs, or int ns read from the text when `exact` (absent: the int64 minimum)."""
        if exact:
            ts_ns_exact = ts
            ts_us = np.where(ts == _MISSING_NS, math.nan, ts / 1000.0)
        else:
            ts_us = ts
            if not self.needs_exact:
                big = ts_us >= EXACT_FLOAT_LIMIT_US
                self.needs_exact = bool(big.any() and (ts_us[big] != np.floor(ts_us[big])).any())
        keep = np.isfinite(ts_us) & np.isfinite(dur_us)
        self.drop("missing or non-numeric ts/dur", int((~keep).sum()))
        bad_ts = keep & ((ts_us < 0) | (ts_us > MAX_TS_US))
        self.drop("negative or huge ts", int(bad_ts.sum()))
        huge = keep & (dur_us > MAX_DUR_US)
        self.drop("huge dur (over a day)", int(huge.sum()))
        neg = keep & (dur_us < 0)
        if neg.any():
            # A negative duration is clipped to zero rather than dropped: the event happened.
            self.drop("negative dur clipped to 0 (kept)", int(neg.sum()))
            dur_us = np.where(neg, 0.0, dur_us)
        keep &= ~bad_ts & ~huge
        ts_all = ts_ns_exact if exact else _us_to_ns(np.where(keep, ts_us, 0.0))
        if keep.all():
            end = ts_all + np.rint(dur_us * 1000.0).astype(np.int64)
            self.parts.append((cat, name, ts_all, end, pid, tid, stream, corr, nbytes, launch, shape, coll))
            return
        ts = ts_all[keep]
        end = ts + np.rint(dur_us[keep] * 1000.0).astype(np.int64)
        self.parts.append((cat[keep], name[keep], ts, end, pid[keep], tid[keep], stream[keep], corr[keep],
                           nbytes[keep], _keep_rows(launch, keep), _keep_rows(shape, keep),
                           _keep_rows(coll, keep)))

    def memory_instants(self, instants: list[Instant]) -> None:
        """Keep the device allocator's `[memory]` records (CPU ones and malformed ones left out)."""
        rows, ts = [], []
        for e in instants:
            if e.name != MEMORY_EVENT or not isinstance(e.args, dict):
                continue
            a = e.args
            vals = (a.get("Bytes"), a.get("Total Allocated"), a.get("Total Reserved"), a.get("Device Id", 0))
            dev = a.get("Device Type")
            if not (_int(dev) and dev > 0 and all(_int(v) for v in vals) and vals[1] >= 0 and vals[2] >= 0):
                continue
            if not isinstance(e.ts, (int, float)) or isinstance(e.ts, bool) or not 0 <= e.ts <= MAX_TS_US:
                continue
            rows.append((0, *vals))
            ts.append(float(e.ts))
        if rows:
            out = np.array(rows, np.int64)
            out[:, 0] = _us_to_ns(np.array(ts, np.float64))
            self.memory.append(out)

    def memory_rows(self) -> np.ndarray:
        """All `[memory]` records as an (n, 5) int64 array sorted by time (see `memory`)."""
        if not self.memory:
            return np.zeros((0, 5), np.int64)
        rows = np.concatenate(self.memory)
        return rows[np.argsort(rows[:, 0], kind="stable")]

    def kernel_flags(self) -> np.ndarray:
        """Per interned category id: is it a kernel category (grown as categories are seen)."""
        self._kernel_cats = _grow_flags(self._kernel_cats, self.cats, _is_kernel_cat)
        return self._kernel_cats

    def kernel_positions(self, cat: np.ndarray) -> np.ndarray:
        """Positions of the piece's kernels (by interned category id)."""
        is_kernel = self.kernel_flags()
        return np.flatnonzero(is_kernel[cat]) if is_kernel.any() else np.zeros(0, np.int64)

    def shape_rows(self, name: np.ndarray, keys_at, concrete_at) -> tuple[np.ndarray, np.ndarray]:
        """(positions, ids into `shapes`) of the piece's events with Input Dims whose names keep them.

        ``keys_at(positions)`` gives (the positions of those events that recorded Input Dims, their
        keys: the raw JSON texts of Input Dims and Input type joined by NUL, a byte no JSON text
        holds); ``concrete_at(positions)`` the raw Concrete Inputs texts (b"" when absent). C-level
        maps over the picked ops (a record_shapes trace has one per 10 events); only the distinct
        shapes run Python (`_new_shapes`)."""
        wanted = self._shape_names = _grow_flags(self._shape_names, self.names, keeps_shapes)
        conv = self._conv_names = _grow_flags(self._conv_names, self.names, CONCRETE_OPS.__contains__)
        k = np.flatnonzero(wanted[name]) if wanted.any() else np.zeros(0, np.int64)
        if not k.size:
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        k, keys = keys_at(k)
        # Concrete values only where read: other ops' would split the interning.
        at = np.flatnonzero(conv[name[k]])
        if at.size:
            for j, concrete in zip(at.tolist(), concrete_at(k[at]), strict=True):
                if concrete:
                    keys[j] += _NUL + concrete
        table = self._shape_ids
        self._new_shapes([key for key in dict.fromkeys(keys) if key not in table])
        return k, np.fromiter(map(table.__getitem__, keys), np.int32, k.size)

    def _new_shapes(self, keys: list[bytes]) -> None:
        for key in keys:
            dims, types, *concrete = key.split(_NUL)
            self._shape_ids[key] = len(self.shapes)
            self.shapes.append((_compact_json(dims), _compact_json(types),
                                _compact_json(concrete[0]) if concrete and concrete[0] else b""))

    def coll_rows(self, cat: np.ndarray, name: np.ndarray, args_at) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions, descriptor ids into `colls`, sequence numbers or -1) of the piece's collectives:
        record_param_comms ops and kernels whose args name a collective. ``args_at(positions)``
        gives those events' `Args` (NO_ARGS where they carry none of the collective keys)."""
        is_kernel = self.kernel_flags()
        comm = self._comm_names = _grow_flags(self._comm_names, self.names, COMM_RECORD_NAMES.__contains__)
        cand = np.zeros(cat.size, bool)
        if is_kernel.any():
            cand |= is_kernel[cat]
        if comm.any():
            cand |= comm[name]
        k = np.flatnonzero(cand)
        if not k.size:
            return np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64)
        pos: list[int] = []
        ids: list[int] = []
        seqs: list[int] = []
        picked = args_at(k)
        named = np.fromiter(map(bool, map(_get_coll_name, picked)), bool, k.size)  # C-level: most have none
        for j in np.flatnonzero(named).tolist():
            a = picked[j]
            key = (_raw_str(a.coll_name), _raw_str(a.coll_dtype), _raw_int(a.in_nelems), _raw_int(a.out_nelems),
                   _raw_int(a.group_size), _raw_str(a.pg_name))
            pos.append(int(k[j]))
            ids.append(self.coll_id(key))
            seqs.append(_raw_int(a.seq))
        return np.array(pos, np.int64), np.array(ids, np.int32), np.array(seqs, np.int64)

    def coll_id(self, key: tuple) -> int:
        got = self._coll_ids.get(key)
        if got is None:
            got = self._coll_ids[key] = len(self.colls)
            self.colls.append(key)
        return got

    def shape_id(self, dims: bytes, types: bytes, concrete: bytes = b"") -> int:
        key = _NUL.join((dims, types, concrete)) if concrete else _NUL.join((dims, types))
        got = self._shape_ids.get(key)
        if got is None:
            self._new_shapes([key])
            got = self._shape_ids[key]
        return got

    def _ids(self, vals: list) -> np.ndarray:
        """pid / tid column of msgspec's values (ints, or strings: see `thread_id`)."""
        if str not in set(map(type, vals)):
            try:
                return np.array(vals, dtype=np.int64)
            except OverflowError:
                pass
        # Rare: ids written as strings, or beyond int64. (numpy would convert a numeric string
        # itself, but only in pieces without a name among them: the same id must not read two ways.)
        return np.array([v if _is_int64(v) else self.thread_id(v) for v in vals], np.int64)

    def thread_id(self, v: int | str) -> int:
        """The id of a pid / tid written as a string or beyond int64.

        A decimal string is the thread it names: old profilers wrote a CPU op's tid as "25738"
        and the same thread's other events as 25738. Named pseudo-threads ("Spans", "PyTorch
        Profiler", "stream 7") become negative ids; an integer beyond int64 is corrupt (-1)."""
        if isinstance(v, int):
            return v if -(2**63) <= v < 2**63 else -1
        if _DECIMAL.fullmatch(v):
            n = int(v)
            if -(2**63) <= n < 2**63:
                return n
        return -1 - self.names.setdefault(v, len(self.names))

    def finish(self) -> tuple[list[str], list[np.ndarray], Sparse]:
        """Concatenate the parts, map category strings to `Cat` codes, sort by start time.

        Columns: cat, name, ts, end, pid, tid, stream, correlation, nbytes; then the sparse ones
        (`Sparse`: kernel launch args and GEMM shapes) with their event positions after the sort.
        """
        names = [""] * len(self.names)
        for s, i in self.names.items():
            names[i] = s
        if not self.parts:
            dtypes = (np.int8, np.int32) + (np.int64,) * 7
            return names, [np.zeros(0, dtype=d) for d in dtypes], Sparse.empty()
        sizes = [p[0].size for p in self.parts]
        offsets = np.cumsum([0, *sizes[:-1]])
        launch = [np.concatenate([p[9][0] + off for p, off in zip(self.parts, offsets, strict=True)])]
        launch += [np.concatenate([p[9][j] for p in self.parts]) for j in (1, 2, 3, 4)]
        shape_pos = np.concatenate([p[10][0] + off for p, off in zip(self.parts, offsets, strict=True)])
        shape_ids = np.concatenate([p[10][1] for p in self.parts])
        coll_pos = np.concatenate([p[11][0] + off for p, off in zip(self.parts, offsets, strict=True)])
        coll_ids = np.concatenate([p[11][1] for p in self.parts])
        coll_seq = np.concatenate([p[11][2] for p in self.parts])
        cols = [np.concatenate(c) for c in zip(*(p[:9] for p in self.parts), strict=True)]
        self.parts.clear()
        code_of = np.zeros(max(len(self.cats), 1), dtype=np.int8)
        for c, i in self.cats.items():
            code_of[i] = int(CATEGORY_NAMES.get(c.lower(), Cat.OTHER))
        counts = np.bincount(cols[0], minlength=len(self.cats))
        self.category_counts = {c: int(counts[i]) for c, i in self.cats.items() if counts[i]}
        self.unknown_cats.update({c: n for c, n in self.category_counts.items()
                                  if code_of[self.cats[c]] == Cat.OTHER and c not in IGNORED_CATEGORIES})
        cols[0] = code_of[cols[0]]
        order = np.argsort(cols[2], kind="stable")
        # Sparse rows follow their events through the sort: new position = rank of the old one.
        rank = np.empty(order.size, np.int64)
        rank[order] = np.arange(order.size)
        lo = np.argsort(rank[launch[0]], kind="stable")
        so = np.argsort(rank[shape_pos], kind="stable")
        co = np.argsort(rank[coll_pos], kind="stable")
        sparse = Sparse(rank[launch[0]][lo], launch[1][lo], launch[2][lo], launch[3][lo], launch[4][lo],
                        rank[shape_pos][so],
                        shape_ids[so], rank[coll_pos][co], coll_ids[co], coll_seq[co])
        return names, [c[order] for c in cols], sparse


@dataclass
class Sparse:
    """Columns only a few events carry, as (sorted event positions, values) (see `RankTrace`)."""

    launch_idx: np.ndarray  # kernels with any of the launch args below
    blocks_per_sm: np.ndarray  # float32, NaN when absent
    warps_per_sm: np.ndarray
    occupancy: np.ndarray
    grid_blocks: np.ndarray  # float32 blocks in the launch grid, only where blocks_per_sm is absent
    shape_idx: np.ndarray  # host ops with recorded shapes that model.keeps_shapes accepts
    shape_ids: np.ndarray  # int32 ids into Columns.shapes
    coll_idx: np.ndarray  # events that name a collective (record_param_comms, linked device rows)
    coll_ids: np.ndarray  # int32 ids into Columns.colls
    coll_seq: np.ndarray  # int64 sequence number of the call in its process group, -1 when absent

    @staticmethod
    def empty() -> Sparse:
        f = np.zeros(0, np.float32)
        i64, i32 = np.zeros(0, np.int64), np.zeros(0, np.int32)
        return Sparse(i64, f, f, f, f, i64, i32, i64, i32, i64)


def _grid_blocks(raw: msgspec.Raw | bytes) -> float:
    """Blocks in a kernel's launch grid ([x, y, z] as JSON), NaN when absent or not positive ints."""
    if not raw:
        return math.nan
    try:
        g = _any.decode(raw)
    except msgspec.DecodeError:
        return math.nan
    if not isinstance(g, list) or not g or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in g):
        return math.nan
    return float(math.prod(g))


def _pick(seq: list | tuple, idx: np.ndarray) -> tuple:
    """The items of `seq` at `idx`, as a tuple (one C-level call)."""
    if idx.size > 1:
        return itemgetter(*idx.tolist())(seq)
    return (seq[int(idx[0])],) if idx.size else ()


def _keep_rows(rows: tuple[np.ndarray, ...], keep: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sparse rows of a piece after dropping events: positions renumbered, dropped events' rows gone."""
    pos = rows[0]
    if not pos.size:
        return rows
    new_pos = np.cumsum(keep) - 1
    sel = keep[pos]
    return (new_pos[pos[sel]], *(r[sel] for r in rows[1:]))


def launch_rows(k: np.ndarray, b: np.ndarray, w: np.ndarray, o: np.ndarray, grid_at) -> tuple[np.ndarray, ...]:
    """(positions, blocks per SM, warps per SM, est. achieved occupancy %, grid blocks) of a piece's
    kernels at positions `k`, from their float64 args (NaN when absent).

    Sparse: only kernels carry these args, so only their rows are kept (float32, NaN for an absent
    value). Blocks/warps <= 0 (Kineto writes -1 without the device's SM count) and a negative
    occupancy count as absent; an occupancy of 0 is real (Kineto rounds it to whole percent). Grid
    blocks (the product of `grid`, whose raw JSON ``grid_at(j)`` gives for the j-th kernel) only
    where blocks per SM is absent (rare: parsed per kernel).
    """
    if not k.size:
        return (k, *(np.zeros(0, np.float32) for _ in range(4)))
    b = np.where(b > 0, b, np.nan).astype(np.float32)
    w = np.where(w > 0, w, np.nan).astype(np.float32)
    o = np.where(o >= 0, o, np.nan).astype(np.float32)
    g = np.full(k.size, np.nan, np.float32)
    for j in np.flatnonzero(np.isnan(b)).tolist():
        g[j] = _grid_blocks(grid_at(j))
    some = np.isfinite(b) | np.isfinite(w) | np.isfinite(o) | np.isfinite(g)
    return k[some], b[some], w[some], o[some], g[some]


_MISSING_NS = np.iinfo(np.int64).min
_MAX_NS = np.iinfo(np.int64).max
# CPU ops whose args carry the collective's metadata (torch's profiler names them so).
COMM_RECORD_NAMES = frozenset({"record_param_comms"})


def _raw_str(raw: msgspec.Raw) -> str:
    """A JSON string's text ("" for anything else)."""
    try:
        v = _any.decode(raw) if raw else ""
    except msgspec.DecodeError:
        return ""
    return v if isinstance(v, str) else ""


def _raw_int(raw: msgspec.Raw) -> int:
    """A JSON integer (also one written as a string); -1 for anything else."""
    try:
        v = _any.decode(raw) if raw else -1
    except msgspec.DecodeError:
        return -1
    if isinstance(v, str) and v.strip().lstrip("-").isdigit():
        v = int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 else -1


def _compact_json(text: bytes) -> bytes:
    """JSON text without whitespace (each distinct shape is seen once: the cost is per shape, not per event)."""
    try:
        return msgspec.json.encode(_any.decode(text))
    except msgspec.DecodeError:
        return text


def _grow_flags(flags: np.ndarray, table: dict[str, int], test) -> np.ndarray:
    """`test` of every string of an interning table, by id; only strings added since the last call are tested."""
    if flags.size == len(table):
        return flags
    new = np.fromiter(map(test, islice(table, flags.size, None)), bool, len(table) - flags.size)
    return np.concatenate([flags, new])


def _is_kernel_cat(c: str) -> bool:
    return CATEGORY_NAMES.get(c.lower()) == Cat.KERNEL


def _is_int64(v: object) -> bool:
    return type(v) is int and -(2**63) <= v < 2**63  # type: ignore[operator]


def _intern(table: dict[str, int], values: list[str]) -> list[int]:
    """Ids of `values` in `table`, adding unseen strings (C-level lookups; new strings are rare)."""
    get = table.get
    ids = list(map(get, values))
    if None in ids:
        for v in dict.fromkeys(values):  # first-seen order keeps ids stable
            if v not in table:
                table[v] = len(table)
        ids = list(map(get, values))
    return ids


def _intern_ids(table: dict[str, int], events: list, attr: attrgetter, dtype: type) -> np.ndarray:
    """`_intern` of each event's `attr` straight into an array (one C-level pass when no string is new)."""
    get, n = table.get, len(events)
    try:
        return np.fromiter(map(get, map(attr, events)), dtype, n)
    except TypeError:  # an unseen string: get() gave None
        return np.array(_intern(table, list(map(attr, events))), dtype)


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**62


def _us_to_ns(ts_us: np.ndarray) -> np.ndarray:
    """Float µs to int ns without a float product: the whole µs scale in integers (exact)."""
    whole = np.floor(ts_us)
    return whole.astype(np.int64) * 1000 + np.rint((ts_us - whole) * 1000.0).astype(np.int64)


def _raw_to_ns(raw: msgspec.Raw) -> int:
    """Exact ns from a JSON number's text in µs ("1712195495519689.047" -> 1712195495519689047)."""
    text = bytes(raw)
    if not text:
        return _MISSING_NS
    whole, _, frac = text.partition(b".")
    try:
        if b"e" in frac or b"E" in frac or b"e" in whole or b"E" in whole:
            return int((Decimal(text.decode()) * 1000).to_integral_value())
        ns = int(whole or b"0") * 1000 + int((frac + b"000")[:3] or b"0")
        if len(frac) > 3 and frac[3:4] >= b"5":
            ns += 1 if not whole.startswith(b"-") else -1
        return ns
    except (ValueError, ArithmeticError):
        return _MISSING_NS


# numpy 2's string ufuncs; numpy 1's np.char has the same functions (slower, same results).
_strings = getattr(np, "strings", np.char)
# Whole µs digits the vectorised parse takes: 16 (epoch µs are 16 digits) keep ns inside int64.
_MAX_WHOLE_US = (np.iinfo(np.int64).max - 1000) // 1000


def raw_ts_to_ns(raws: list[msgspec.Raw]) -> np.ndarray:
    """`_raw_to_ns` of every text in ``raws``, vectorised with numpy's string functions. Modern
    Kineto writes every timestamp as µs with ns decimals, so this runs on each event of such a
    trace (6.4 M events: 12.8 s one by one, about 5x less this way). Rows that are not plain
    ``digits[.digits]`` within int64's range go through ``_raw_to_ns`` one by one.
    """
    n = len(raws)
    if n == 0:
        return np.zeros(0, np.int64)
    texts = list(map(bytes, raws))
    same = _same_shape_ts_to_ns(texts)
    if same is not None:
        return same
    return _any_shape_ts_to_ns(raws, np.array(texts))


def _same_shape_ts_to_ns(texts: list[bytes]) -> np.ndarray | None:
    """The common case, all texts ``digits.digits`` of one length with the point in one place
    (a trace's timestamps): a digit matrix and a dot product. None when the texts differ."""
    first = texts[0]
    width, point = len(first), first.find(b".")
    if not 1 <= point <= 16 or width > 40 or len(set(map(len, texts))) != 1:
        return None
    m = np.frombuffer(b"".join(texts), np.uint8).reshape(len(texts), width)
    digits = np.delete(m, point, axis=1) - np.uint8(48)  # uint8: a non-digit wraps to >= 10
    if not ((m[:, point] == 46).all() and (digits < 10).all()):
        return None
    d = digits.astype(np.int64)
    whole = d[:, :point] @ (10 ** np.arange(point - 1, -1, -1, dtype=np.int64))
    if (whole > _MAX_WHOLE_US).any():
        return None
    decimals = width - point - 1
    ns = whole * 1000
    for k in range(min(decimals, 3)):  # the first three decimals are the ns
        ns += d[:, point + k] * 10 ** (2 - k)
    if decimals > 3:  # the fourth rounds half up, as `_raw_to_ns`
        ns += d[:, point + 3] >= 5
    return ns


def _any_shape_ts_to_ns(raws: list[msgspec.Raw], texts: np.ndarray) -> np.ndarray:
    """`raw_ts_to_ns` for texts of any shape, with numpy's string functions."""
    n = len(raws)
    if texts.dtype.kind != "S" or texts.dtype.itemsize > 40:
        return _raw_to_ns_each(raws, np.ones(n, bool), np.zeros(n, np.int64))
    whole, point, frac = _strings.partition(texts, b".")
    plain = _strings.isdigit(whole) & (_strings.str_len(whole) <= 16)
    plain &= (_strings.str_len(frac) == 0) | _strings.isdigit(frac)
    plain &= (point != b"") | (_strings.str_len(frac) == 0)
    whole_us = np.where(plain, whole, b"0").astype(np.int64)
    plain &= whole_us <= _MAX_WHOLE_US
    # The first three decimals are the ns; the fourth rounds half up (as `_raw_to_ns`).
    four = _strings.ljust(np.where(plain, frac, b""), 4, b"0").astype("S4").astype(np.int64)
    ns = whole_us * 1000 + four // 10 + (four % 10 >= 5)
    return _raw_to_ns_each(raws, ~plain, ns)


def _raw_to_ns_each(raws: list[msgspec.Raw], rows: np.ndarray, ns: np.ndarray) -> np.ndarray:
    """`_raw_to_ns` on ``rows`` of ``raws`` into ``ns``; a value outside int64 reads as missing."""
    for i in np.flatnonzero(rows):
        one = _raw_to_ns(raws[i])
        ns[i] = one if _MISSING_NS < one <= _MAX_NS else _MISSING_NS
    return ns


_get_name = attrgetter("name")
_get_cat = attrgetter("cat")
_get_ts = attrgetter("ts")
_get_dur = attrgetter("dur")
_get_pid = attrgetter("pid")
_get_tid = attrgetter("tid")
_get_args = attrgetter("args")
_get_stream = attrgetter("stream")
_get_corr = attrgetter("correlation")
_get_bytes = attrgetter("bytes")
_get_blocks = attrgetter("blocks_per_sm")
_get_warps = attrgetter("warps_per_sm")
_get_occ = attrgetter("occupancy_pct")
_get_coll_name = attrgetter("coll_name")
_get_dims = attrgetter("input_dims")
_get_types = attrgetter("input_type")
_get_concrete = attrgetter("concrete")
_NUL = b"\0"


def _shape_keys(args: list[Args], k: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """`Columns.shape_rows`' keys of msgspec's Args at positions `k` (those without Input Dims left out)."""
    picked = _pick(args, k)
    dims = list(map(bytes, map(_get_dims, picked)))
    has = np.fromiter(map(len, dims), np.int64, k.size) > 0
    if not has.all():  # the op recorded no shapes
        at = np.flatnonzero(has)
        picked, dims, k = _pick(picked, at), _pick(dims, at), k[has]
    return k, list(map(_NUL.join, zip(dims, map(bytes, map(_get_types, picked)), strict=True)))


def _arg_column(args: list[Args], get: attrgetter) -> np.ndarray:
    try:
        return np.fromiter(map(get, args), np.int64, len(args))
    except OverflowError:
        # An id beyond int64 is corrupt; keep the event, drop the id.
        return np.array([v if -(2**63) <= v < 2**63 else -1 for v in map(get, args)], dtype=np.int64)


def _open_stream(path: str):
    with open(path, "rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


class _Blocks:
    """The (decompressed) file's bytes, [start, stop) for uncompressed files: iterated, blocks of
    BLOCK_BYTES as bytes; or read into a caller's buffer (`readinto`), which saves a copy and a fresh
    block per read (scan_events). Opened at the first read, closed at the end."""

    def __init__(self, path: str, start: int = 0, stop: int | None = None) -> None:
        self.path, self.start = path, start
        self.left = None if stop is None else stop - start
        self.f = None
        self.done = False
        self.short = False

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        block = self._read(lambda f, n: f.read(n), BLOCK_BYTES)
        if not block:
            raise StopIteration
        return block

    def readinto(self, out: memoryview) -> int:
        """Bytes read into `out` (at most its length); 0 at the end."""
        return self._read(lambda f, n: f.readinto(out[:n]), len(out))

    def remaining(self) -> int | None:
        """Bytes left to read where the file says so (opened and uncompressed), else None."""
        if self.done or self.short:  # a read that returned less than asked reached the end
            return 0
        if self.f is None or isinstance(self.f, gzip.GzipFile):
            return None
        try:
            left = os.fstat(self.f.fileno()).st_size - self.f.tell()
        except (OSError, ValueError):
            return None
        return max(0, left if self.left is None else min(left, self.left))

    def _read(self, read, n: int):
        if self.done:
            return b""
        try:
            if self.f is None:
                self.f = _open_stream(self.path)
                if self.start:
                    self.f.seek(self.start)
            want = n if self.left is None else min(n, self.left)
            got = read(self.f, want) if self.left != 0 else b""
        except EOFError as e:
            self.close()
            raise TraceFormatError("truncated gzip stream (file cut short)") from e
        except (OSError, zlib.error) as e:
            self.close()
            raise TraceFormatError(f"cannot decompress: {e}") from e
        size = got if isinstance(got, int) else len(got)
        # Buffered files and gzip streams fill a read to its size unless the data ends.
        self.short = self.short or 0 < size < want
        if self.left is not None:
            self.left -= size
        if not size:
            self.close()
        return got

    def close(self) -> None:
        self.done = True
        if self.f is not None:
            self.f.close()
            self.f = None


def _read_blocks(path: str, start: int = 0, stop: int | None = None) -> _Blocks:
    """Blocks of the (decompressed) file; [start, stop) byte ranges only for uncompressed files."""
    return _Blocks(path, start, stop)


def _decode_events_lenient(data: bytes | memoryview, cols: Columns) -> None:
    """Slow path for a piece that failed typed validation: decode event by event, drop bad ones."""
    events = []
    for raw in _raw_list.decode(data):
        try:
            events.append(cols.dec.one.decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError):
            try:
                obj = _any.decode(raw)
            except msgspec.DecodeError:  # a number beyond float64 ("Number out of range")
                obj = None
            if isinstance(obj, dict) and obj.get("ph") == "X":
                events.append(_coerce_event(obj, cols.dec.event_type))
            else:
                cols.drop("malformed or unknown-phase event")
    cols.add(events)


def _coerce_event(obj: dict[str, Any], etype: type) -> Any:
    """Best-effort typed event from an object with wrongly typed fields (bad fields become absent)."""

    def num(v: Any) -> float:
        if isinstance(v, bool):
            return math.nan
        if isinstance(v, int | float):
            return float(v)
        if isinstance(v, str):
            try:
                return float(v)
            except ValueError:
                return math.nan
        return math.nan

    def ident(v: Any) -> int | str:
        return v if isinstance(v, int | str) and not isinstance(v, bool) else 0

    a = obj.get("args") if isinstance(obj.get("args"), dict) else {}

    def iarg(k: str) -> int:
        v = a.get(k)
        return v if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63 else -1

    def farg(k: str) -> float:
        v = a.get(k)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan

    def rawarg(k: str) -> msgspec.Raw:
        v = a.get(k)
        return msgspec.Raw(msgspec.json.encode(v)) if isinstance(v, list) else _NO_RAW

    def anyarg(k: str) -> msgspec.Raw:
        return msgspec.Raw(msgspec.json.encode(a[k])) if k in a else _NO_RAW

    ts = num(obj.get("ts"))
    if etype is ExactEvent:
        ts = msgspec.Raw(msgspec.json.encode(ts) if math.isfinite(ts) else b"")
    return etype(
        cat=str(obj.get("cat", "")),
        name=str(obj.get("name", "")),
        ts=ts,
        dur=num(obj["dur"]) if "dur" in obj else 0.0,
        pid=ident(obj.get("pid")),
        tid=ident(obj.get("tid")),
        # By keyword: a field added to Args must not shift the others.
        args=Args(stream=iarg("stream"), correlation=iarg("correlation"), bytes=iarg("bytes"),
                  blocks_per_sm=farg("blocks per SM"), warps_per_sm=farg("warps per SM"),
                  occupancy_pct=farg("est. achieved occupancy %"), grid=rawarg("grid"),
                  input_dims=rawarg("Input Dims"), input_type=rawarg("Input type"),
                  concrete=rawarg("Concrete Inputs"), **{f: anyarg(k) for f, k in _COLL_FIELDS}),
    )


def _describe(e: msgspec.DecodeError, offset: int) -> str:
    msg = str(e)
    m = _BYTE_POS.search(msg)
    if m:
        msg = _BYTE_POS.sub(f"(near byte {offset + int(m.group(1))})", msg)
    return f"invalid JSON: {msg}"


@functools.cache
def streaming_supported() -> bool:
    """Whether this msgspec words its decode errors the way `_error_at_end` reads them.

    Three inputs with known errors: an array cut inside an event (the cut was not a boundary), an
    array followed by more text (the cut lay past the array's end), and a defect at a known byte.
    """
    def message(doc: bytes) -> str:
        try:
            _raw_list.decode(doc)
        except msgspec.DecodeError as e:
            return str(e)
        return ""

    cut = b'[{"ph": "X", "args": {"a": 1}'
    defect = b'[{"ph": "X"}, }, {"ph": "X"}]'
    pos = _BYTE_POS.search(message(defect))
    return (_error_at_end_text(message(cut), len(cut))
            and "trailing characters" in message(b'[{"ph": "X"}], "x": 1}')
            and pos is not None and int(pos.group(1)) == defect.index(b", }") + 2
            and not _error_at_end_text(message(defect), len(defect)))


def _error_at_end(e: msgspec.DecodeError, length: int) -> bool:
    return _error_at_end_text(str(e), length)


def _error_at_end_text(msg: str, length: int) -> bool:
    """True when a decode error sits at the end of the piece, i.e. our cut was not a boundary."""
    if "truncated" in msg or "trailing characters" in msg:
        # "trailing": the cut lay past the end of traceEvents, in the top-level keys after it.
        return True
    m = _BYTE_POS.search(msg)
    return bool(m) and int(m.group(1)) >= length - 2


def decode_file(path: str, jobs: int = 1) -> tuple[Header, Columns]:
    """Decode one Kineto trace file (JSON or gzip; top level a dict or a list) into columns.

    `jobs` > 1 lets a large uncompressed file be decoded in that many processes (byte ranges).
    Raises TraceFormatError with a one-line reason when the file cannot be read as a trace.
    """
    header, cols = _decode_file(path, FAST, jobs)
    if cols.needs_exact:
        header, cols = _decode_file(path, EXACT, jobs)
    return header, cols


@dataclass
class Document:
    """Where a file's event array starts, and what came before it."""

    header: Header
    start: int  # file offset just past the '[' that opens the event array
    is_list: bool  # top level is the array itself (no surrounding object)
    head: bytearray  # the bytes read so far (from offset 0)


def open_document(path: str, blocks: Iterator[bytes]) -> Document | bytearray:
    """Read until the event array opens. Returns the bytes read instead when the file is a dict
    without a literal `"traceEvents": [` (decoded whole by the caller)."""
    head = bytearray()
    for block in blocks:
        head += block
        if _KEY.search(head) or len(head) > 4 * BLOCK_BYTES:
            break
    stripped = bytes(head[:64]).lstrip()
    if not stripped:
        raise TraceFormatError("empty file")
    if stripped[:1] == b"[":
        return Document(Header(), head.index(b"[") + 1, True, head)
    if stripped[:1] != b"{":
        raise TraceFormatError("not JSON (does not start with '{' or '[')")
    m = _KEY.search(head)
    if not m:
        return head
    prefix = bytes(head[: m.start()]).rstrip()
    header_doc = prefix[:-1] + b"}" if prefix.endswith(b",") else prefix + b"}"
    header = Header()
    if header_doc != b"{}":
        try:
            header = _header.decode(header_doc)
        except msgspec.ValidationError:  # one key of an odd shape: keep the others
            try:
                header = _header_of_raw(_top_level(header_doc) or {})
            except msgspec.DecodeError:  # and the text breaks later on
                header = Header()
        except msgspec.DecodeError:
            # Header keys we don't understand are not fatal: the events still are a trace.
            header = Header()
    return Document(header, m.end(), False, head)


def scan_events(buf: bytearray, blocks: _Blocks, cols: Columns, consumed: int) -> tuple[bytearray, int]:
    """Decode every complete event of `buf` + `blocks` except the last block's remainder.

    `buf` starts with '['; returns the undecoded rest (also starting with '[') and its file offset.
    One buffer serves the whole file: each block is read into its free end, and what follows a cut
    moves to its front (a fresh block appended to a fresh buffer per read cost 0.15 s more per
    600 MB, 2026-12-06). The buffer is no larger than what is left of the file needs: two blocks
    (32 MiB) zeroed for every 1.6 MB rank were 8,600 page faults each, 9.9 of 13.8 s at 512 ranks.
    """
    store = bytearray(len(buf) + _room(blocks, 2 * BLOCK_BYTES))
    store[:len(buf)] = buf
    fill = len(buf)
    while True:
        if fill >= BLOCK_BYTES:
            cut = _cut_and_decode(store, cols, consumed, fill)
            if cut:
                consumed += cut - 1
                rest = bytes(store[cut:fill])  # a copy: the two ranges may overlap
                store[1:1 + len(rest)] = rest
                fill = 1 + len(rest)
        if len(store) - fill < _room(blocks, BLOCK_BYTES):  # no cut yet (an event longer than a block): more room
            store += bytes(BLOCK_BYTES)
        with memoryview(store) as free:
            got = blocks.readinto(free[fill:fill + BLOCK_BYTES])
        if not got:
            return store[:fill], consumed
        fill += got


def _room(blocks: _Blocks, most: int) -> int:
    """Free bytes the reads want: `most`, or what is left of the file and one more when that is less
    (so that the read at its end finds room and returns 0)."""
    left = blocks.remaining()
    return most if left is None else min(most, left + 1)


def decode_tail(buf: bytearray, doc: Document, cols: Columns, consumed: int) -> None:
    """Decode the last events, the closing ']' and any top-level keys after the array."""
    dec = cols.dec
    if not doc.is_list and _scanned_tail(buf, doc, cols):
        return
    tail_doc = bytes(buf) if doc.is_list else b'{"traceEvents":' + bytes(buf)
    try:
        if doc.is_list:
            cols.add_piece(tail_doc)
        else:
            cols.pieces_decoded += 1
            tail = dec.header.decode(tail_doc)
            cols.add(tail.traceEvents)
            doc.header.fill(tail)
    except msgspec.ValidationError:
        try:
            _decode_tail_lenient(tail_doc, doc.is_list, doc.header, cols)
        except msgspec.DecodeError as e:
            raise _json_error(e, consumed - 15) from None
    except msgspec.DecodeError as e:
        raise _json_error(e, consumed - 15) from None


def _json_error(e: msgspec.DecodeError, offset: int) -> TraceFormatError:
    """The one-line error of a document msgspec could not read (`offset`: where its text starts)."""
    if "truncated" in str(e):
        return TraceFormatError("invalid JSON: file ends in the middle of the trace")
    return TraceFormatError(_describe(e, offset))


def _scanned_tail(buf: bytearray, doc: Document, cols: Columns) -> bool:
    """The last events and the top-level keys after them, the events through the scanner: True when
    done. False (nothing added) when the scanner is off or gave up, or the keys after the array do
    not decode as they are: then `decode_tail` reads it all with msgspec, errors worded as ever."""
    piece = scanned.scan_piece(cols, buf, rest_ok=True)
    if piece is None:
        return False
    after = bytes(buf[piece.end:])
    try:
        rest = cols.dec.header.decode(b'{"traceEvents": []' + after)
    except (msgspec.DecodeError, msgspec.ValidationError):
        rest = None
    if rest is None or b'"traceEvents"' in after:  # a second event array: msgspec's reading decides
        piece.give_up()
        return False
    piece.commit()
    cols.pieces_scanned += 1
    doc.header.fill(rest)
    return True


def decode_middle(buf: bytearray, cols: Columns, consumed: int) -> None:
    """Decode a range that ends just before another event: '[' + events + ', '."""
    body = bytes(buf).rstrip()
    if body.endswith(b","):
        body = body[:-1]
    try:
        cols.add_piece(body + b"]")
    except msgspec.DecodeError as e:
        raise TraceFormatError(_describe(e, consumed)) from None


def _decode_file(path: str, dec: Decoders, jobs: int = 1) -> tuple[Header, Columns]:
    if not streaming_supported():
        return _decode_whole(path, dec)
    if jobs > 1:
        from .parallel import decode_parallel

        done = decode_parallel(path, dec, jobs)
        if done is not None:
            return done
    blocks = _read_blocks(path)
    doc = open_document(path, blocks)
    if not isinstance(doc, Document):
        return _decode_small_document(bytes(doc), blocks, dec)
    if dec is FAST and _EXACT_TS.search(doc.head):
        dec = EXACT  # epoch-scale µs with decimals: read the text, skip the float pass
    cols = Columns(dec=dec)
    buf, consumed = scan_events(bytearray(b"[") + doc.head[doc.start:], blocks, cols, doc.start - 1)
    decode_tail(buf, doc, cols, consumed)
    return doc.header, cols


def _cut_and_decode(buf: bytearray, cols: Columns, offset: int, size: int) -> int:
    """Decode the longest prefix of complete events in `buf` (its first `size` bytes); return where
    the rest starts (0: none)."""
    limit = size
    for _attempt in range(64):
        p = buf.rfind(b"}", 1, limit)
        if p < 0:
            return 0
        m = _BOUNDARY.match(buf, p, size)
        if not m:
            limit = p
            continue
        saved = buf[p + 1]
        buf[p + 1] = ord("]")
        view = memoryview(buf)[: p + 2]
        try:
            cols.add_piece(view)
        except msgspec.DecodeError as e:
            if not _error_at_end(e, p + 2):
                raise TraceFormatError(_describe(e, offset)) from None
            limit = p
            continue
        finally:
            view.release()
            buf[p + 1] = saved
        return m.end() - 1
    return 0


def _decode_tail_lenient(doc: bytes, is_list: bool, header: Header, cols: Columns) -> None:
    """The tail when some event in it failed typed validation: the events one by one, and the
    top-level keys after the array still read (a ROCm trace's string-typed `bytes` must not cost
    it its device and rank)."""
    if is_list:
        _decode_events_lenient(doc, cols)
        return
    top = _top_level(doc)
    events = bytes(top["traceEvents"]) if top and "traceEvents" in top else b""
    if not events.startswith(b"["):
        raise TraceFormatError("traceEvents is not a list")
    _decode_events_lenient(events, cols)
    header.fill(_header_of_raw(top))


_top = msgspec.json.Decoder(dict[str, msgspec.Raw])
_HEADER_KEYS = ("distributedInfo", "deviceProperties", "computeProperties")


def _top_level(doc: bytes) -> dict[str, msgspec.Raw] | None:
    """A document's top-level keys with their values undecoded (Raw: a value msgspec would reject
    when built, such as a number beyond float64, rejects only itself), or None when the document
    is not an object. Raises msgspec.DecodeError when it is not JSON."""
    try:
        return _top.decode(doc)
    except msgspec.ValidationError:
        return None


def _header_of_raw(top: dict[str, msgspec.Raw]) -> Header:
    """`_header_of` the Header keys of `_top_level`'s result, a key that does not decode left out."""
    obj = {}
    for key in _HEADER_KEYS:
        if key in top:
            with contextlib.suppress(msgspec.DecodeError):
                obj[key] = _any.decode(top[key])
    return _header_of(obj)


def _header_of(obj: dict[str, Any]) -> Header:
    """The Header keys of a decoded top-level object, each kept only when it has the right shape."""
    info = obj.get("distributedInfo")

    def dicts(key: str) -> list[dict[str, Any]] | None:
        v = obj.get(key)
        return [p for p in v if isinstance(p, dict)] if isinstance(v, list) else None

    return Header(distributedInfo=info if isinstance(info, dict) else None,
                  deviceProperties=dicts("deviceProperties"), computeProperties=dicts("computeProperties"))


# CUDA's cudaDeviceProp names in old Kineto's computeProperties -> today's deviceProperties names.
_OLD_PROPERTY_NAMES = {"major": "computeMajor", "minor": "computeMinor", "multiProcessorCount": "numSms",
                       "maxThreadsPerMultiProcessor": "maxThreadsPerMultiprocessor"}


def old_device_properties(props: list[Any]) -> list[dict[str, Any]]:
    """Old Kineto's computeProperties entries with today's deviceProperties field names."""
    return [{_OLD_PROPERTY_NAMES.get(k, k): v for k, v in p.items()} for p in props if isinstance(p, dict)]


def _schema(top: dict[str, msgspec.Raw]) -> str:
    """', schema X' of an execution trace's top level, '' when it is not a short string."""
    try:
        value = msgspec.json.decode(top["schema"])
    except msgspec.DecodeError:
        return ""
    return f", schema {value}" if isinstance(value, str) and len(value) <= 40 and value.isprintable() else ""


def _decode_small_document(head: bytes, blocks: Iterator[bytes], dec: Decoders) -> tuple[Header, Columns]:
    """A dict without a literal "traceEvents": [ ... ] (odd spacing, missing key): decode it whole."""
    data = head + b"".join(blocks)
    try:
        top = _top_level(data)
    except msgspec.DecodeError as e:
        raise _json_error(e, 0) from None
    if top is not None and "nodes" in top and "schema" in top and "traceEvents" not in top:
        raise TraceFormatError(f"a PyTorch execution trace (ExecutionTraceObserver{_schema(top)}), not a Kineto trace: "
                               "analyse the torch.profiler trace recorded beside it (*.pt.trace.json)")
    if top is None or "traceEvents" not in top:
        raise TraceFormatError("no traceEvents key: not a Kineto trace")
    events = bytes(top["traceEvents"])
    if not events.startswith(b"["):
        raise TraceFormatError("traceEvents is not a list")
    cols = Columns(dec=dec)
    _decode_events_lenient(events, cols)
    return _header_of_raw(top), cols


def _decode_whole(path: str, dec: Decoders) -> tuple[Header, Columns]:
    """The exact fallback of the streaming decoder: the whole file in memory, decoded at once
    (`_decode_small_document`'s path for an object, the per-event path for a bare array)."""
    data = b"".join(_read_blocks(path))
    stripped = data[:64].lstrip()
    if not stripped:
        raise TraceFormatError("empty file")
    if stripped[:1] == b"{":
        return _decode_small_document(data, iter(()), dec)
    if stripped[:1] != b"[":
        raise TraceFormatError("not JSON (does not start with '{' or '[')")
    cols = Columns(dec=dec)
    try:
        _decode_events_lenient(data, cols)
    except msgspec.DecodeError as e:
        raise _json_error(e, 0) from None
    return Header(), cols
