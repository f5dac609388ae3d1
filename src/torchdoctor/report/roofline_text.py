"""The roofline summary of one rank in sentences (console and HTML say the same thing).

"GEMMs run at 41% of bf16 peak; elementwise kernels at 62% of bandwidth": shares are the
time-weighted ones of metrics/rooflinesum.py; each sentence names what share of the kind's
time it covers when that is not all of it.
"""

from __future__ import annotations

from ..metrics.model import MemoryStats, PrecisionPath, RankResult, Roofline, RooflineRow

KIND_WORDS = {"gemm": "GEMMs", "conv": "convolutions", "elementwise": "elementwise kernels",
              "reduction": "reduction kernels"}


def roofline_lines(r: RankResult) -> list[str]:
    """Plain-text sentences (untrusted names are not in them: escape at the renderer anyway)."""
    roof = r.roofline
    if roof is None:
        return []
    if roof.device_key is None:
        return [f"unknown device: no roofline ({roof.device_note})" if roof.device_note
                else "unknown device: no roofline"]
    p = r.choice.precision if r.choice is not None else None
    said = [precision_text(p)] if p is not None and p.dominant else []
    if r.memory is not None:
        said.append(memory_text(r.memory))
    if not roof.rows:
        return [f"roofline: {roof.mfu_note}" if roof.mfu_note.startswith("no kernels") else
                "roofline: no FLOPs or bytes known for any kernel (record the trace with record_shapes=True)"] + said
    parts = [_row_text(x) for x in sorted(roof.rows, key=lambda x: -x.known_ns)]
    out = ["roofline: " + "; ".join(parts) + "."]
    out.append(mfu_text(roof))
    return out + said


def memory_text(m: MemoryStats) -> str:
    """'memory: tensors peak at 6.17 GiB, the allocator reserves 11.9 GiB (48% cache) of 31.7 GiB'."""
    of = f" of {m.total_memory / 2**30:.1f} GiB" if m.total_memory else ""
    return (f"memory: tensors peak at {m.peak_allocated / 2**30:.2f} GiB (floor {m.floor_allocated / 2**30:.2f} GiB), "
            f"the allocator reserves {m.peak_reserved / 2**30:.2f} GiB{of} ({m.cache_slack_pct:.0f}% of it cache).")


def precision_text(p: PrecisionPath) -> str:
    """'precision: GEMM time 80% fp32, 20% tf32; recommended tf32, then bf16 autocast (...)'."""
    mix = ", ".join(f"{v:g}% {k or 'unknown'}" for k, v in p.shares.items())
    how = f"remedy {p.remedy}" if p.remedy else ("a code change" if p.recommended not in ("keep", "unknown") else "")
    tail = f"; {how}" if how and "code change" not in p.recommended else ""
    return f"precision: GEMM time {mix}; recommended {p.recommended} ({p.why}{tail})."


def mfu_text(roof: Roofline) -> str:
    if roof.mfu_pct is None:
        return f"MFU: none ({roof.mfu_note})"
    per_step = f", {roof.flops_per_step / 1e12:.3g} TFLOP per step" if roof.flops_per_step else ""
    return f"MFU {roof.mfu_pct:.1f}%{per_step} ({roof.mfu_note})"


def _row_text(x: RooflineRow) -> str:
    who = KIND_WORDS.get(x.kind, x.kind)
    cover = "" if x.known_ns >= x.ns else f", over {100 * x.known_ns / x.ns:.0f}% of their time"
    if x.pct_of_peak is not None:
        return f"{who} run at {x.pct_of_peak:.1f}% of {x.precision} peak ({x.achieved_tflops:g} TFLOP/s{cover})"
    if x.pct_of_bandwidth is not None:
        return f"{who} at {x.pct_of_bandwidth:.1f}% of bandwidth ({x.achieved_gbps:g} GB/s{cover})"
    if x.achieved_tflops is not None:
        return f"{who} at {x.achieved_tflops:g} TFLOP/s (no {x.precision or 'known-precision'} peak in the table)"
    return f"{who} at {x.achieved_gbps:g} GB/s (no bandwidth in the table)"
