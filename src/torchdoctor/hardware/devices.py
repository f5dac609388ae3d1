"""The device table (devices.toml, package data) and matching a trace's device to one entry.

A match is exact or nothing: an unknown name, a variant the table lacks, or properties that
contradict the name give no device, and callers say "unknown device: no roofline" instead of
guessing from a neighbour. Figures are the vendors' (each with its source in the table).

Matching a device name (and, when known, Kineto's ``deviceProperties``):

1. the name is normalised (``normalise_name``); a name listed by entries' ``names`` gives those
   entries as candidates;
2. a bare family name ("H100") gives the family's entries; a generic or missing name ("AMD
   Radeon Graphics", as ROCm 6 reports an MI250 GCD) gives every entry of the vendor: the
   properties then have to single one out;
3. any other name is unknown;
4. candidates are kept when ``computeMajor.computeMinor`` equals theirs, ``numSms`` equals the
   whole part's SMs/CUs or, for multi-die parts (``gcds``), one die's (then the peaks, bandwidth
   and memory are one die's share), and ``totalGlobalMem`` is within MEMORY_TOLERANCE of a
   nominal capacity (vendors quote GB, CUDA reports bytes with some reserved).

Exactly one candidate left is the match.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pyproject requires tomli on 3.10
    import tomli as tomllib

TABLE = "devices.toml"
# totalGlobalMem (GiB) against the nominal GB: H100 80GB reports 79.6 GiB, L4 24GB 22.5 GiB.
MEMORY_TOLERANCE = 0.12
# Words that say who made the device, not which device it is.
VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "AMD", "INSTINCT", "GEFORCE", "INTEL", "R", "TM"})
# Names that identify no device (ROCm 6 reports MI250 GCDs as "AMD Radeon Graphics").
GENERIC_NAMES = frozenset({"", "RADEON GRAPHICS"})
FIGURES = ("sms", "memory_gb", "mem_bw_gbs", "l2_mb", "interconnect_gbs")


@dataclass(frozen=True)
class DeviceSpec:
    """One entry of the table, possibly narrowed to one die of a multi-die part (`share` < 1).

    dense_tflops / sparse_tflops: peak TFLOP/s (TOP/s for int8) by precision key; sparse is 2:4
    structured sparsity. mem_bw_gbs: peak DRAM/HBM bandwidth, 1e9 bytes/s. memory_gb: nominal
    capacities. sources: figure path ("dense_tflops.bf16", "mem_bw_gbs") -> citation.
    """

    key: str
    label: str
    vendor: str
    arch: str
    family: str
    compute: tuple[int, int] | None = None
    gcds: int = 1
    sms: int | None = None
    memory_gb: tuple[float, ...] = ()
    mem_bw_gbs: float | None = None
    l2_mb: float | None = None
    interconnect: str = ""
    interconnect_gbs: float | None = None
    dense_tflops: dict[str, float] = field(default_factory=dict)
    sparse_tflops: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    share: float = 1.0
    scope: str = ""

    def peak_tflops(self, precision: str, sparse: bool = False) -> float | None:
        """Peak TFLOP/s for a precision key (fp32, tf32, bf16, ...), None when the table lacks it."""
        return (self.sparse_tflops if sparse else self.dense_tflops).get(precision)

    def ridge_flop_per_byte(self, precision: str) -> float | None:
        """Roofline ridge point: peak FLOP/s over peak bytes/s (below it a kernel is memory-bound)."""
        peak = self.peak_tflops(precision)
        if peak is None or not self.mem_bw_gbs:
            return None
        return peak * 1e12 / (self.mem_bw_gbs * 1e9)

    def one_die(self) -> DeviceSpec:
        """The share of one die (GCD) of a multi-die part, as one process sees it."""
        s = 1.0 / self.gcds
        return replace(
            self, sms=None if self.sms is None else self.sms // self.gcds,
            memory_gb=tuple(m * s for m in self.memory_gb),
            mem_bw_gbs=None if self.mem_bw_gbs is None else self.mem_bw_gbs * s,
            l2_mb=None if self.l2_mb is None else self.l2_mb * s,
            dense_tflops={k: v * s for k, v in self.dense_tflops.items()},
            sparse_tflops={k: v * s for k, v in self.sparse_tflops.items()},
            share=s, scope=f"one of {self.gcds} GCDs",
        )


@dataclass(frozen=True)
class Identification:
    """The matched device, or None and why (the reason is what a report shows)."""

    device: DeviceSpec | None
    reason: str = ""


def normalise_name(name: str) -> str:
    """Upper case, vendor words dropped, runs of punctuation/space as one space.

    "NVIDIA A100-SXM4-80GB" -> "A100 SXM4 80GB"; "AMD Instinct MI300X" -> "MI300X".
    """
    words = re.split(r"[^0-9A-Z]+", name.upper())
    return " ".join(w for w in words if w and w not in VENDOR_WORDS)


@lru_cache(maxsize=1)
def load_table() -> tuple[tuple[DeviceSpec, ...], dict[str, str], dict[str, tuple[str, ...]]]:
    """(entries, sources by key, normalised names by entry key) from the packaged devices.toml."""
    text = resources.files("torchdoctor.hardware").joinpath(TABLE).read_text(encoding="utf-8")
    doc = tomllib.loads(text)
    sources: dict[str, str] = doc["sources"]
    entries, names = [], {}
    for d in doc["devices"]:
        entries.append(_entry(d, sources))
        names[d["key"]] = tuple(normalise_name(n) for n in d.get("names", ()))
    return tuple(entries), sources, names


def _entry(d: dict[str, Any], sources: dict[str, str]) -> DeviceSpec:
    cites: dict[str, str] = {}

    def value(path: str, fig: dict[str, Any]) -> Any:
        cites[path] = sources[fig["source"]]
        return fig["value"]

    figs = {k: value(k, d[k]) for k in FIGURES if k in d}
    mem = figs.get("memory_gb", ())
    return DeviceSpec(
        key=d["key"], label=d["label"], vendor=d["vendor"], arch=d["arch"], family=normalise_name(d["family"]),
        compute=tuple(d["compute"]) if "compute" in d else None, gcds=int(d.get("gcds", 1)),  # type: ignore[arg-type]
        sms=figs.get("sms"), memory_gb=tuple(mem) if isinstance(mem, list) else (mem,),
        mem_bw_gbs=figs.get("mem_bw_gbs"), l2_mb=figs.get("l2_mb"), interconnect=d.get("interconnect", ""),
        interconnect_gbs=figs.get("interconnect_gbs"),
        dense_tflops={k: value(f"dense_tflops.{k}", f) for k, f in d.get("dense_tflops", {}).items()},
        sparse_tflops={k: value(f"sparse_tflops.{k}", f) for k, f in d.get("sparse_tflops", {}).items()},
        sources=cites,
    )


def identify(name: str | None, props: Mapping[str, Any] | None = None) -> Identification:
    """Match a device name and optional Kineto deviceProperties entry to one table entry."""
    props = props or {}
    raw = name if name is not None else str(props.get("name") or "")
    norm = normalise_name(raw)
    entries, _, names = load_table()
    vendor = _vendor(raw)
    listed = [e for e in entries if norm in names[e.key]]
    if listed:
        cands = listed
    elif norm in GENERIC_NAMES:
        cands = [e for e in entries if vendor in (None, e.vendor)]
    else:
        cands = [e for e in entries if e.family == norm]
    if not cands:
        return Identification(None, f"unknown device {raw!r}: not in the device table, no roofline")
    views = [v for e in cands for v in _views(e, props)]
    if len(views) == 1:
        return Identification(views[0])
    if len(views) > 1 and all(_same_figures(views[0], v) for v in views[1:]):
        # Parts that differ in name only, as far as a roofline goes (an MI250 die and an MI210): the
        # first, its scope naming the others.
        others = ", ".join(v.label for v in views[1:])
        scope = f"{views[0].scope} or {others}: the same figures" if views[0].scope else f"or {others}: the same figures"
        return Identification(replace(views[0], scope=scope))
    what = raw or "(no name)"
    if not views:
        return Identification(None, f"unknown device {what!r}: its properties match no table entry, no roofline")
    keys = ", ".join(sorted({v.key for v in views}))
    return Identification(None, f"unknown device {what!r}: could be {keys}; no roofline")


def match_device(name: str | None, props: Mapping[str, Any] | None = None) -> DeviceSpec | None:
    """identify(...).device: the entry, or None for an unknown or ambiguous device."""
    return identify(name, props).device


def from_trace_properties(device_properties: list[dict[str, Any]]) -> Identification:
    """The device of a trace from its `deviceProperties` (the first entry: a rank drives one device)."""
    if not device_properties:
        return Identification(None, "unknown device: the trace records no deviceProperties, no roofline")
    props = device_properties[0]
    return identify(str(props.get("name") or ""), props)


def _vendor(raw: str) -> str | None:
    up = raw.upper()
    for word, vendor in (("AMD", "amd"), ("RADEON", "amd"), ("NVIDIA", "nvidia"), ("INTEL", "intel")):
        if word in up:
            return vendor
    return None


def _views(e: DeviceSpec, props: Mapping[str, Any]) -> list[DeviceSpec]:
    """The entry, its one-die view, both or neither, as far as the properties allow."""
    major, minor = props.get("computeMajor"), props.get("computeMinor")
    if isinstance(major, int) and isinstance(minor, int) and e.compute is not None and e.compute != (major, minor):
        return []
    views = [e] if e.gcds == 1 else [e, e.one_die()]
    sms = props.get("numSms")
    if isinstance(sms, int) and sms > 0:
        views = [v for v in views if v.sms is None or v.sms == sms]
    mem = props.get("totalGlobalMem")
    if isinstance(mem, int) and mem > 0:
        views = [v for v in views if not v.memory_gb or _memory_fits(mem, v.memory_gb)]
    if len(views) > 1 and not props:
        views = views[:1]  # a bare name means the whole part
    return views


def _same_figures(a: DeviceSpec, b: DeviceSpec, rel: float = 0.02) -> bool:
    """Two entries nothing here tells apart: the same CUs/SMs, memory and link bandwidth and peaks
    (within `rel`). An A100 SXM4 and PCIe 40GB share their peaks but not their links: not the same."""
    def close(x: float | None, y: float | None) -> bool:
        return x is None and y is None or (x is not None and y is not None and abs(x - y) <= rel * max(x, y))

    return (a.sms == b.sms and close(a.mem_bw_gbs, b.mem_bw_gbs) and close(a.interconnect_gbs, b.interconnect_gbs)
            and a.dense_tflops.keys() == b.dense_tflops.keys()
            and all(close(a.dense_tflops[k], b.dense_tflops[k]) for k in a.dense_tflops)
            and a.sparse_tflops.keys() == b.sparse_tflops.keys()
            and all(close(a.sparse_tflops[k], b.sparse_tflops[k]) for k in a.sparse_tflops))


def _memory_fits(total_bytes: int, nominal_gb: tuple[float, ...]) -> bool:
    gib = total_bytes / 2**30
    return any(abs(gib - gb) <= MEMORY_TOLERANCE * gb for gb in nominal_gb)
