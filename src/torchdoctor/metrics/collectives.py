"""Collective calls of one rank, from the metadata torch records on them.

torch's profiler writes each collective's name, dtype, message sizes, group size, process group
and sequence number onto its `record_param_comms` CPU op; since 2026 Kineto copies them onto the
device row linked to that op as well, for any backend (pytorch/kineto #1444, field names in
#1483's MetadataFieldCatalog.h). Device rows are preferred: their duration is the time the
collective occupied the device. A trace without that metadata gives no `Collectives`.
"""

from __future__ import annotations

import numpy as np

from ..trace.model import DEVICE_WORK
from .context import Context
from .model import CollectiveKind, Collectives

# Bytes per element of the dtype names torch writes (c10::ScalarType names).
DTYPE_BYTES = {
    "Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Long": 8, "Int": 4, "Short": 2, "Char": 1,
    "Byte": 1, "Bool": 1, "ComplexFloat": 8, "ComplexDouble": 16, "Float8_e4m3fn": 1, "Float8_e5m2": 1,
    "UInt16": 2, "UInt32": 4, "UInt64": 8,
}  # fmt: skip


def collectives(ctx: Context) -> Collectives | None:
    """The collectives recorded in the window, from device rows when the trace has them."""
    tr = ctx.tr
    if not tr.coll_idx.size:
        return None
    idx, ids, seq = tr.coll_idx, tr.coll_ids, tr.coll_seq
    inside = ctx.in_window[idx]
    on_device = np.isin(tr.cat[idx], np.array([int(c) for c in DEVICE_WORK], tr.cat.dtype))
    source = "device" if (inside & on_device).any() else "host"
    pick = inside & (on_device if source == "device" else ~on_device)
    if not pick.any():
        return None
    idx, ids, seq = idx[pick], ids[pick], seq[pick]
    dur = tr.end[idx] - tr.ts[idx]
    out = Collectives(source=source)
    kinds: dict[tuple[str, str], CollectiveKind] = {}
    group_of: dict[str, int] = {}
    for desc, d, s in zip(ids.tolist(), dur.tolist(), seq.tolist(), strict=True):
        name, dtype, in_nelems, _out_nelems, _group_size, pg = tr.colls[desc]
        kind = kinds.setdefault((name, pg), CollectiveKind(name, pg, 0, 0, 0))
        kind.calls += 1
        kind.time_ns += d
        size = DTYPE_BYTES.get(dtype)
        kind.bytes = kind.bytes + in_nelems * size if size and in_nelems >= 0 and kind.bytes >= 0 else -1
        if s >= 0:
            out.call_group.append(group_of.setdefault(pg, len(group_of)))
            out.call_seq.append(s)
            out.call_dur_ns.append(d)
    out.kinds = sorted(kinds.values(), key=lambda k: -k.time_ns)
    out.groups = list(group_of)
    return out
