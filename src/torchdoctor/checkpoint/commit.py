"""A DCP save with a commit marker: shards, then metadata (DCP), then an atomic marker.

``save_committed(state_dict, checkpoint_id)`` calls ``torch.distributed.checkpoint.save``; once
every rank has returned from it, rank 0 writes ``.torchdoctor-complete`` listing every file and
its size, through a temporary file and an atomic rename. ``torchdoctor checkpoint verify
--require-marker`` then counts a checkpoint as complete only with the marker, and checks the files
still match it: a save that died at any point before the rename is never reported complete.
"""

from __future__ import annotations

import json
import os
from typing import Any

from torchdoctor.checkpoint.verify import _TEMP, MARKER


def save_committed(state_dict: dict[str, Any], checkpoint_id: str, **kwargs: Any) -> Any:
    """dcp.save, a barrier, then rank 0 writes the commit marker. Returns dcp.save's result."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    result = dcp.save(state_dict, checkpoint_id=checkpoint_id, **kwargs)
    distributed = dist.is_available() and dist.is_initialized()
    if distributed:
        dist.barrier()
    if not distributed or dist.get_rank() == 0:
        write_marker(str(checkpoint_id))
    if distributed:
        dist.barrier()  # no rank moves on (and may be told the save is done) before the marker exists
    return result


def write_marker(path: str) -> None:
    """List every file of the checkpoint with its size, atomically (temporary file, fsync, rename)."""
    files = {n: os.path.getsize(os.path.join(path, n)) for n in sorted(os.listdir(path))
             if n != MARKER and not n.endswith(_TEMP) and os.path.isfile(os.path.join(path, n))}
    tmp = os.path.join(path, f"{MARKER}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MARKER))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
