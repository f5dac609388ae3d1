"""The kernel registry (kernels.toml, package data): which kernel family a well-tuned job runs for
an operation on a device and precision, and how fast that family is.

`expected_ns` prices the replacement an advisor proposes: the work (FLOPs or bytes from the trace)
at the family's efficiency times the device table's roof. The saving an advisor reports is the
measured device time minus that, never a fixed fraction of the measured time.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .devices import DeviceSpec

if sys.version_info >= (3, 11):
    import tomllib
else:  # pyproject requires tomli on 3.10
    import tomli as tomllib

TABLE = "kernels.toml"
ROOFS = ("compute", "sparse", "memory")


@dataclass(frozen=True)
class Family:
    """One registry entry (kernels.toml's header defines the fields)."""

    key: str
    op: str
    label: str
    vendor: str
    archs: tuple[str, ...]
    precisions: tuple[str, ...]
    kernels: re.Pattern[str]
    roof: str
    efficiency: float
    source: str
    note: str = ""
    min_dim: int = 0

    @property
    def assumed(self) -> bool:
        """The efficiency is this project's assumption, not a published measurement."""
        return self.source.startswith("torchdoctor assumption")

    def matches(self, device: DeviceSpec, precision: str) -> bool:
        return (self.vendor in ("*", device.vendor) and ("*" in self.archs or device.arch in self.archs)
                and ("*" in self.precisions or precision in self.precisions))

    def roof_of(self, device: DeviceSpec, precision: str) -> float | None:
        """The roof on `device`: FLOP/ns (compute, sparse) or bytes/ns (memory); None if unknown."""
        if self.roof == "memory":
            return device.mem_bw_gbs or None  # GB/s = bytes/ns
        peak = device.peak_tflops(precision, sparse=self.roof == "sparse")
        return peak * 1e3 if peak else None  # TFLOP/s = 1e3 FLOP/ns

    def expected_ns(self, work: float, device: DeviceSpec, precision: str,
                    efficiency: float | None = None) -> float | None:
        """Device time this family needs for `work` FLOPs (or bytes on the memory roof), at its
        efficiency or at `efficiency` (a share of the same roof) when given."""
        roof = self.roof_of(device, precision)
        eff = self.efficiency if efficiency is None else efficiency
        return work / (roof * eff) if roof and eff > 0 and work > 0 else None

    def cite(self) -> str:
        """'efficiency 60% of the bf16 dense peak (assumption: ...)' for evidence texts."""
        roof = {"compute": "dense peak", "sparse": "2:4 sparse peak", "memory": "memory bandwidth"}[self.roof]
        why = f"assumption: {self.note}" if self.assumed else self.source.split(":")[0]
        return f"{self.label} at {100 * self.efficiency:.0f}% of the {roof} ({why})"


@lru_cache(maxsize=1)
def families() -> tuple[Family, ...]:
    """Every entry of the packaged kernels.toml, in file order."""
    text = resources.files("torchdoctor.hardware").joinpath(TABLE).read_text(encoding="utf-8")
    doc = tomllib.loads(text)
    sources: dict[str, str] = doc["sources"]
    out = []
    for d in doc["families"]:
        eff = d["efficiency"]
        if d["roof"] not in ROOFS or not 0 < float(eff["value"]) <= 1:
            raise ValueError(f"{TABLE}: family {d['key']!r}: bad roof or efficiency")
        out.append(Family(
            key=d["key"], op=d["op"], label=d["label"], vendor=d["vendor"], archs=tuple(d["archs"]),
            precisions=tuple(d["precisions"]), kernels=re.compile(d["kernels"], re.IGNORECASE), roof=d["roof"],
            efficiency=float(eff["value"]), source=sources[eff["source"]], note=eff.get("note", ""),
            min_dim=int(d.get("min_dim", 0))))
    return tuple(out)


def best(op: str, device: DeviceSpec | None, precision: str) -> Family | None:
    """The first family for `op` on this device and precision (file order is preference order)."""
    if device is None:
        return None
    return next((f for f in families() if f.op == op and f.matches(device, precision)), None)
