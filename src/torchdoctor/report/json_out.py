"""JSON renderer: the `torchdoctor.report/1` schema (docs/json-schema.md), written atomically.

A file is written rank by rank (`chunks`): the report of 4,096 ranks is ~100 MB of JSON, and encoding
it whole, then indenting it, would hold two copies of it in memory. The bytes are the same as
`to_json`'s.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import msgspec

from .model import Report

_encoder = msgspec.json.Encoder()
_RANKS = b'\n "ranks": [],'  # the top-level key, one space in; deeper keys are indented further


def to_json(report: Report) -> bytes:
    return msgspec.json.format(_encoder.encode(report), indent=1)


def chunks(report: Report) -> Iterator[bytes]:
    """`to_json(report)` in pieces: the report around its ranks, then one rank at a time."""
    head = to_json(msgspec.structs.replace(report, ranks=[]))
    at = head.find(_RANKS)
    if not report.ranks or at < 0:
        yield to_json(report)
        return
    yield head[: at] + b'\n "ranks": [\n'
    for i, rank in enumerate(report.ranks):
        body = msgspec.json.format(_encoder.encode(rank), indent=1)
        yield (b",\n" if i else b"") + b"  " + body.replace(b"\n", b"\n  ")
    yield b"\n ]," + head[at + len(_RANKS):]


def write_json(report: Report, path: str) -> None:
    if path == "-":
        out = sys.stdout.buffer  # not os.write: it may write part of a large piece to a pipe
        for piece in chunks(report):
            out.write(piece)
        out.write(b"\n")
        out.flush()
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        for piece in chunks(report):
            f.write(piece)
    os.replace(tmp, path)


def read_json(path: str) -> Report:
    with open(path, "rb") as f:
        return msgspec.json.decode(f.read(), type=Report)
