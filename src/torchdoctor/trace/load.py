"""Find trace files and load one of them into a `RankTrace`."""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass

from .decode import TraceFormatError, decode_file, old_device_properties
from .model import RankTrace
from .remote import RemoteError, discover_url, is_url

TRACE_SUFFIXES = (".json", ".json.gz")
# Files a run directory holds next to its traces that are not traces.
NOT_TRACES = ("run.json",)
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[_\-]?(\d+)", re.IGNORECASE)


@dataclass
class InputError:
    """A path that yielded no trace: reported as one line naming the file and the problem."""

    file: str
    message: str


def is_trace_name(name: str) -> bool:
    """Whether a file found in a directory is taken as a trace (by its base name)."""
    return name.endswith(TRACE_SUFFIXES) and name not in NOT_TRACES and not name.startswith(".")


def discover(paths: list[str]) -> tuple[list[str], list[InputError]]:
    """Expand files, directories (recursively), glob patterns and URLs (trace/remote.py) into trace
    files, in stable order."""
    found: list[str] = []
    errors: list[InputError] = []
    for p in paths:
        if is_url(p):
            try:
                hits = discover_url(p, is_trace_name)
            except RemoteError as e:
                errors.append(InputError(p, str(e)))
                continue
            if not hits:
                errors.append(InputError(p, "no .json or .json.gz trace at this URL"))
            found.extend(hits)
        elif os.path.isdir(p):
            hits = sorted(os.path.join(root, f) for root, _dirs, files in os.walk(p) for f in files if is_trace_name(f))
            if not hits:
                errors.append(InputError(p, "directory holds no .json or .json.gz trace"))
            found.extend(hits)
        elif os.path.exists(p):
            found.append(p)
        else:
            hits = sorted(h for h in glob.glob(p, recursive=True) if os.path.isfile(h))
            if not hits:
                errors.append(InputError(p, "no such file, directory or matching glob"))
            found.extend(hits)
    seen: set[str] = set()
    unique = []
    for f in found:
        key = f if is_url(f) else os.path.realpath(f)
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, errors


def rank_from_filename(path: str) -> int | None:
    m = _RANK_IN_NAME.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def load_trace(path: str, jobs: int = 1) -> RankTrace:
    """Decode `path` into a RankTrace. Raises TraceFormatError with a one-line reason.

    `jobs` > 1 decodes a large uncompressed file in that many processes.
    """
    try:
        header, cols = decode_file(path, jobs)
    except OSError as e:
        raise TraceFormatError(f"cannot read: {e.strerror or e}") from None
    names, (cat, name, ts, end, pid, tid, stream, corr, nbytes), sparse = cols.finish()
    memory = cols.memory_rows()
    if ts.size == 0 and not memory.size:
        # Instants alone ("Record Window End", which every torch.profiler trace has) record no
        # activity; the allocator's [memory] records alone still show the device's memory.
        raise TraceFormatError("traceEvents holds no complete ('X') events: the profiler recorded no activity")
    info = header.distributedInfo or {}
    rank, source = None, "order"
    if isinstance(info.get("rank"), int) and not isinstance(info.get("rank"), bool):
        rank, source = info["rank"], "distributedInfo"
    elif (r := rank_from_filename(path)) is not None:
        rank, source = r, "filename"
    props = [p for p in (header.deviceProperties or []) if isinstance(p, dict)] \
        or old_device_properties(header.computeProperties or [])
    warnings = [f"{n} events dropped: {why}" if "kept" not in why else f"{n} events: {why}"
                for why, n in cols.dropped.items() if n]
    if cols.unknown_cats:
        listed = ", ".join(f"{c} ({n})" for c, n in sorted(cols.unknown_cats.items()))
        warnings.append(f"events of unknown category ignored: {listed}")
    ws = info.get("world_size")
    backend = info.get("backend")
    return RankTrace(
        path=path, names=names, cat=cat, name=name, ts=ts, end=end, pid=pid, tid=tid, stream=stream,
        correlation=corr, nbytes=nbytes, launch_idx=sparse.launch_idx, launch_blocks=sparse.blocks_per_sm,
        launch_warps=sparse.warps_per_sm, launch_occupancy=sparse.occupancy, launch_grid=sparse.grid_blocks,
        shape_idx=sparse.shape_idx,
        shape_ids=sparse.shape_ids, shapes=cols.shapes, coll_idx=sparse.coll_idx, coll_ids=sparse.coll_ids,
        coll_seq=sparse.coll_seq, colls=cols.colls, rank=rank, rank_source=source,
        world_size=ws if isinstance(ws, int) else None,
        backend=backend if isinstance(backend, str) else None,
        device_name=_device_name(props), device_properties=props, warnings=warnings,
        instant_events=cols.instants, memory=memory, categories=cols.category_counts,
    )


def _device_name(props: list[dict]) -> str | None:
    names = [p.get("name") for p in props if isinstance(p.get("name"), str)]
    return names[0] if names else None
