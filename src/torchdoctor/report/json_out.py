"""JSON renderer: the `torchdoctor.report/1` schema (docs/json-schema.md), written atomically."""

from __future__ import annotations

import os

import msgspec

from .model import Report

_encoder = msgspec.json.Encoder()


def to_json(report: Report) -> bytes:
    return msgspec.json.format(_encoder.encode(report), indent=1)


def write_json(report: Report, path: str) -> None:
    data = to_json(report)
    if path == "-":
        os.write(1, data + b"\n")
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_json(path: str) -> Report:
    with open(path, "rb") as f:
        return msgspec.json.decode(f.read(), type=Report)
