"""The decoder's fast path: pieces of the event array read by the compiled scanner (`_scan.c`).

The scanner reads a piece ('[' events ']') once and writes one fixed-size record per complete
event: times, ids, the args the analysis reads, and where the raw texts it leaves to Python lie
(strings, shapes, grids, collective metadata). Python decodes each distinct string once, with
msgspec, and builds the same columns as `Columns.add` does from msgspec's structs, through the
same code (`Columns.add_rows`, `launch_rows`, `shape_rows`, `coll_rows`).

The scanner gives a piece up (None) on anything it is not sure to read as msgspec does; so does
this module when msgspec rejects one of the strings or instant events. The caller then decodes
that piece with msgspec alone, exactly as without the scanner. Where the extension was not built
(no C compiler at install time), or ``TORCHDOCTOR_PURE_DECODE=1`` is set, every piece goes that
way: same results, slower.
"""

from __future__ import annotations

import os
from itertools import repeat
from typing import Any

import msgspec
import numpy as np

try:
    from . import _scan
except ImportError:  # not built: msgspec alone
    _scan = None

# One record of _scan.c's `Rec`, field by field in its order (native byte order, no padding).
REC_DTYPE = np.dtype([
    ("ts", "=f8"), ("ts_ns", "=i8"), ("dur", "=f8"), ("pid", "=i8"), ("tid", "=i8"),
    ("stream", "=i8"), ("corr", "=i8"), ("nbytes", "=i8"), ("blocks", "=f8"), ("warps", "=f8"), ("occ", "=f8"),
    ("name", "=i4"), ("cat", "=i4"), ("pid_str", "=i4"), ("tid_str", "=i4"), ("shape", "=i4"), ("has_coll", "=i4"),
    ("grid_off", "=i8"), ("conc_off", "=i8"), ("args_off", "=i8"),
    ("grid_len", "=i4"), ("conc_len", "=i4"), ("args_len", "=i4"), ("pad_", "=i4"),
])
if _scan is not None and REC_DTYPE.itemsize != _scan.RECORD_BYTES:  # a stale build: never misread it
    _scan = None

_str = msgspec.json.Decoder(str)


def available() -> bool:
    """Whether pieces go through the compiled scanner in this process."""
    return _scan is not None and os.environ.get("TORCHDOCTOR_PURE_DECODE", "") in ("", "0")


def new_scanner() -> Any:
    """A scanner for one file (its string tables persist across the file's pieces), or None."""
    # A random key for the scanner's hash tables: a trace cannot be crafted to make them collide.
    return _scan.Scanner(int.from_bytes(os.urandom(8), "little")) if available() else None


class Strings:
    """What the Python side knows of a scanner's string tables: raw id -> interned id / text."""

    def __init__(self) -> None:
        self.name_ids = np.zeros(0, np.int32)
        self.cat_ids = np.zeros(0, np.int16)
        self.texts: list[str] = []  # the strings table (pid / tid written as strings)
        self.shapes: list[bytes] = []  # the shapes table: b"Input Dims NUL Input type" raw texts

    def sizes(self) -> tuple[int, int, int, int]:
        return self.name_ids.size, self.cat_ids.size, len(self.texts), len(self.shapes)


def add_scanned(cols: Any, data: Any) -> bool:
    """Add the events of `data` ('[' events ']', bytes-like) to `cols` through the scanner.

    False when the scanner is off or gave the piece up: nothing was added, and the caller decodes
    the piece with msgspec."""
    got = scan_piece(cols, data)
    if got is None:
        return False
    got.commit()
    return True


class Piece:
    """A piece the scanner read, checked and not yet added (`commit`) or given up (`give_up`)."""

    def __init__(self, cols: Any, view: Any, got: tuple, before: tuple[int, int, int]) -> None:
        from .decode import Args, Instant

        self.cols, self.view, self.before = cols, view, before
        recs, spans, new_names, new_cats, new_strs, self.new_shapes, self.n_instants, self.end = got
        self.rec = np.frombuffer(recs, REC_DTYPE)
        # Everything that can reject the piece runs here, before `cols` changes.
        self.names, self.cats, self.texts = ([_str.decode(b'"' + raw + b'"') for raw in new]
                                             for new in (new_names, new_cats, new_strs))
        self.instants = [msgspec.json.decode(view[o:o + n], type=Instant) for o, n in
                         np.frombuffer(spans, np.int64).reshape(-1, 2).tolist()]
        rec = self.rec
        with_coll = np.flatnonzero(rec["has_coll"])
        self.coll_args = {j: msgspec.json.decode(view[o:o + n], type=Args) for j, o, n in
                          zip(with_coll.tolist(), rec["args_off"][with_coll].tolist(),
                              rec["args_len"][with_coll].tolist(), strict=True)}

    def give_up(self) -> None:
        """Forget the strings the scanner learnt from this piece (it will be decoded by msgspec)."""
        self.cols.scanner.rollback(*self.before)

    def commit(self) -> None:
        cols, strings = self.cols, self.cols.scanned_strings
        strings.name_ids = np.concatenate([strings.name_ids, np.array(_intern_new(cols.names, self.names), np.int32)])
        strings.cat_ids = np.concatenate([strings.cat_ids, np.array(_intern_new(cols.cats, self.cats), np.int16)])
        strings.texts += self.texts
        strings.shapes += self.new_shapes
        cols.instants += self.n_instants
        if self.instants:
            cols.memory_instants(self.instants)
        if self.rec.size:
            _add_records(cols, self.rec, self.view, strings, self.coll_args)


def scan_piece(cols: Any, data: Any, rest_ok: bool = False) -> Piece | None:
    """The scanner's reading of `data` ('[' events ']'; with `rest_ok`, more may follow the array:
    `Piece.end` is where it does), or None when the scanner is off or gave the piece up."""
    sc = cols.scanner
    if sc is None:
        return None
    before = cols.scanned_strings.sizes()
    try:
        got = sc.scan(data, cols.exact, rest_ok)
    except MemoryError:
        got = None
    if got is None:
        return None
    view = data if isinstance(data, bytes) else memoryview(data).cast("B")
    try:
        return Piece(cols, view, got, before)
    except (msgspec.DecodeError, msgspec.ValidationError):
        sc.rollback(*before)
        return None


def _intern_new(table: dict[str, int], values: list[str]) -> list[int]:
    """Ids of `values` in `table`, unseen ones added in order (as `decode._intern`)."""
    return [table.setdefault(v, len(table)) for v in values]


def _add_records(cols: Any, rec: np.ndarray, view: Any, strings: Strings, coll_args: dict[int, Any]) -> None:
    """The piece's records as columns, through the code `Columns.add` uses for msgspec's structs."""
    exact = cols.exact
    name = strings.name_ids[rec["name"]]
    cat = strings.cat_ids[rec["cat"]]
    pid = _idents(cols, rec["pid"], rec["pid_str"], strings)
    tid = _idents(cols, rec["tid"], rec["tid_str"], strings)
    ts = rec["ts_ns"].copy() if exact else rec["ts"].copy()
    launch = _launch(cols.kernel_positions(cat), rec, view)
    shape = cols.shape_rows(name, lambda pos: _shape_keys(rec, pos, strings.shapes),
                            lambda pos: _texts(rec, "conc", pos, view))
    coll = cols.coll_rows(cat, name, lambda pos: _args(pos, coll_args))
    cols.add_rows(cat, name, ts, exact, rec["dur"].copy(), pid, tid, rec["stream"].copy(), rec["corr"].copy(),
                  rec["nbytes"].copy(), launch, shape, coll)


def _launch(k: np.ndarray, rec: np.ndarray, view: Any) -> tuple:
    """`launch_rows` of the kernels at `k`; a grid's raw text is sliced only where launch_rows asks
    (kernels without blocks per SM)."""
    from .decode import launch_rows

    kr = rec[k]
    offs, lens = kr["grid_off"].tolist(), kr["grid_len"].tolist()
    return launch_rows(k, kr["blocks"], kr["warps"], kr["occ"],
                       lambda j: bytes(view[offs[j]:offs[j] + lens[j]]) if lens[j] else b"")


def _shape_keys(rec: np.ndarray, pos: np.ndarray, shapes: list[bytes]) -> tuple[np.ndarray, list[bytes]]:
    """`Columns.shape_rows`' keys at `pos`: the scanner's shapes table gives them whole."""
    ids = rec["shape"][pos]
    has = ids >= 0
    if not has.all():  # the op recorded no shapes
        pos, ids = pos[has], ids[has]
    return pos, list(map(shapes.__getitem__, ids.tolist()))


def _texts(rec: np.ndarray, field: str, pos: np.ndarray, view: Any) -> list[bytes]:
    """The raw texts of one span field ("conc", "grid") at `pos` (b"" where absent: offset -1,
    length 0), C-level maps."""
    starts = rec[field + "_off"][pos]
    stops = starts + rec[field + "_len"][pos]
    parts = map(view.__getitem__, map(slice, starts.tolist(), stops.tolist()))
    return list(parts) if isinstance(view, bytes) else list(map(bytes, parts))


def _args(pos: np.ndarray, coll_args: dict[int, Any]) -> list:
    """The `Args` of the events at `pos`: decoded where they carry collective keys, NO_ARGS elsewhere
    (`coll_rows` reads nothing else of them)."""
    from .decode import NO_ARGS

    return list(map(coll_args.get, pos.tolist(), repeat(NO_ARGS, pos.size)))


def _idents(cols: Any, values: np.ndarray, str_ids: np.ndarray, strings: Strings) -> np.ndarray:
    """pid / tid column: ints as read; ids written as strings mapped as `Columns._ids` maps them,
    once per distinct string, in the order they first occur (which `thread_id` interns names in).
    Old profilers write every CPU op's tid as a string: no Python per event."""
    out = values.copy()
    at = np.flatnonzero(str_ids >= 0)
    if not at.size:
        return out
    ids = str_ids[at]
    distinct, first = np.unique(ids, return_index=True)
    mapped = np.empty(distinct.size, np.int64)
    for u in np.argsort(first, kind="stable").tolist():
        mapped[u] = cols.thread_id(strings.texts[distinct[u]])
    out[at] = mapped[np.searchsorted(distinct, ids)]
    return out
