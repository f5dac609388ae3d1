"""Decode one large uncompressed trace in several processes, one byte range each.

Range starts are event boundaries found by a deterministic search (the first `}, {` candidate
after the range's nominal offset from which a run of events decodes), so neighbouring workers
agree on where one range ends and the next begins. Any inconsistency — a range that does not
decode cleanly — makes the caller fall back to the sequential decoder, never to a wrong result.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor

import msgspec
import numpy as np

from .decode import (
    _BOUNDARY,
    EXACT,
    FAST,
    Columns,
    Decoders,
    Document,
    Header,
    TraceFormatError,
    _intern,
    _read_blocks,
    decode_middle,
    decode_tail,
    open_document,
    scan_events,
)

# Below this size one process is as fast as several (start-up and result transfer dominate).
MIN_PARALLEL_BYTES = 48 << 20
PROBE_BYTES = 2 << 20


def decode_parallel(path: str, dec: Decoders, jobs: int) -> tuple[Header, Columns] | None:
    """Decode `path` in up to `jobs` processes; None when the file is not suitable (caller goes sequential)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                return None
    except OSError:
        return None
    if size < MIN_PARALLEL_BYTES:
        return None
    doc = open_document(path, _read_blocks(path))
    if not isinstance(doc, Document):
        return None
    starts = [doc.start]
    for k in range(1, jobs):
        b = find_boundary(path, doc.start + (size - doc.start) * k // jobs, dec)
        if b is None or b <= starts[-1]:
            return None
        starts.append(b)
    ranges = list(zip(starts, starts[1:] + [size], strict=True))
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    try:
        with ProcessPoolExecutor(max_workers=len(ranges), mp_context=ctx) as pool:
            parts = list(pool.map(_decode_range, [path] * len(ranges), ranges,
                                  [i == len(ranges) - 1 for i in range(len(ranges))],
                                  [doc.is_list] * len(ranges), [dec is EXACT] * len(ranges)))
    except TraceFormatError:
        return None
    header = doc.header
    for _cols, tail_header in parts:
        if tail_header is not None:
            header.fill(tail_header)
    return header, merge([c for c, _ in parts], dec)


def find_boundary(path: str, offset: int, dec: Decoders) -> int | None:
    """File offset of the first event start at or after `offset` (see module docstring)."""
    with open(path, "rb") as f:
        f.seek(offset)
        window = f.read(PROBE_BYTES)
    matches = list(_BOUNDARY.finditer(window))
    if len(matches) < 2:
        return None
    last = matches[-1].start() + 1
    for m in matches[:-1]:
        first = m.end() - 1  # the '{' opening the next event
        try:
            dec.events.decode(b"[" + window[first:last] + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        return offset + first
    return None


def _decode_range(path: str, rng: tuple[int, int], last: bool, is_list: bool, exact: bool):
    lo, hi = rng
    cols = Columns(dec=EXACT if exact else FAST)
    blocks = _read_blocks(path, lo, None if last else hi)
    buf, consumed = scan_events(bytearray(b"["), blocks, cols, lo - 1)
    header = None
    if last:
        doc = Document(Header(), lo, is_list, bytearray())
        decode_tail(buf, doc, cols, consumed)
        header = doc.header
    else:
        decode_middle(buf, cols, consumed)
    cols.dec = None  # decoders stay in the worker
    return cols, header


def merge(parts: list[Columns], dec: Decoders) -> Columns:
    """One Columns from per-range ones: string ids re-interned into shared tables."""
    out = Columns(dec=dec)
    for c in parts:
        local_names = sorted(c.names, key=c.names.__getitem__)
        name_map = np.array(_intern(out.names, local_names) or [0], np.int32)
        local_cats = sorted(c.cats, key=c.cats.__getitem__)
        cat_map = np.array(_intern(out.cats, local_cats) or [0], np.int16)
        shape_map = np.array([out.shape_id(*sh) for sh in c.shapes], np.int32)
        coll_map = np.array([out.coll_id(k) for k in c.colls] or [0], np.int32)
        for (cat, name, ts, end, pid, tid, stream, corr, nbytes, launch, (shape_pos, shape_ids),
             (coll_pos, coll_ids, coll_seq)) in c.parts:
            out.parts.append((cat_map[cat], name_map[name], ts, end, _remap_ids(pid, name_map),
                              _remap_ids(tid, name_map), stream, corr, nbytes, launch,
                              (shape_pos, shape_map[shape_ids]), (coll_pos, coll_map[coll_ids], coll_seq)))
        for why, n in c.dropped.items():
            out.drop(why, n)
        out.instants += c.instants
        out.memory += c.memory
        out.needs_exact |= c.needs_exact
    return out


def _remap_ids(ids: np.ndarray, name_map: np.ndarray) -> np.ndarray:
    """Named pseudo-threads are stored as -1 - name id: move them to the shared name ids."""
    neg = np.flatnonzero(ids < 0)
    if neg.size == 0:
        return ids
    local = -1 - ids[neg]
    ok = local < name_map.size
    ids = ids.copy()
    ids[neg[ok]] = -1 - name_map[local[ok]].astype(np.int64)
    return ids
