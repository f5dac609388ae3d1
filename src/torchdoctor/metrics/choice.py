"""Kernel choice: what the window's kernels were, against the family the kernel registry
(hardware/kernels.toml, hardware/registry.py) says a well-tuned job runs. One `KernelChoice` per rank.

Attention (`AttentionSite`, grouped by path, dtype, q/k shapes and mask):

- SDPA calls: each backend op (trace.model.SDPA_BACKEND_OPS) in the window is one call with that
  path; a composite `aten::scaled_dot_product_attention` with no backend op inside it is one call
  whose path is read from the kernels it launched ("fused" for flash/fmha/attention kernel names,
  else "unknown").
- Hand-written ("manual"): a top-level softmax (`top_level_aten`: no aten op holds it, so not
  inside an SDPA op) on a >= 3-D input [..., L, S] with a GEMM before it, within MANUAL_REACH
  top-level ops on its thread, whose operands are [..., L, D] x
  [..., D, S], and one after it whose operands are [..., L, S] x [..., S, Dv]: Q·Kᵀ, softmax, ·V.
- device_ns: forward device time of the kernels the calls launched (hand-written: every op from
  the first GEMM to the second); simt_ns of it in plain FP32 GEMM kernels and fusable_ns in
  elementwise/reduction kernels (the parts HW-1's and fusion's budgets hold too).
- flops: forward FLOPs, 2·B·L·S·D + 2·B·L·S·Dv with B the product of q's leading dims (the full
  matrix: the math path computes it even when causal); hand-written: the two GEMMs' FLOPs.
- expected_ns (math, manual and unknown paths only): the registry's attention family for the
  device and the calls' precision (hardware/registry.best) doing the FLOPs, forward plus
  BACKWARD_FLOPS x forward when the window has a backward pass, halved when is_causal (fused
  kernels skip the masked half). `with_backward` says a backward pass was counted: rules then
  compare with device_ns x (1 + BACKWARD_TIME).

Hand-written normalisations and activations (`ChainSite`): top-level aten ops in the window
outside backward passes, per thread in start order, written as their names without "aten::" (views
left out, casts written "to"); CHAIN_PATTERNS are regular expressions over that text. device_ns sums
the kernels the chain's ops launched; nbytes = the bytes of the chain's first tensor times the
passes one fused kernel makes over it (CHAIN_PASSES: 2, one read and one write; 3 for
bias-dropout-add, which also reads the residual); expected_ns: the registry family (norm / elementwise) moving
them on the memory roof.

GEMMs (from GEMM/convolution kernels with known work, metrics/work.py): device time and FLOPs by
precision (roofline.precision); `unsupported`: bf16/tf32/fp16 GEMMs on a device whose table entry
has no peak for that precision, priced as fp16 tensor-core GEMMs when the device has them;
`fp8`: bf16/fp16 GEMM ops with M, N and K all >= the FP8 family's min_dim on a device with an FP8
peak; `sparse24`: bf16/fp16 linear-layer GEMMs (mm, addmm, linear) with M, N, K >= the 2:4
family's min_dim and N, K multiples of 64 on a device with a 2:4 sparse peak. Each is priced at
its registry family; `fp32_simt`: plain FP32 GEMM/conv kernels with known FLOPs priced as TF32
(Ampere and later) or fp16 (before) tensor-core GEMMs. A GEMM candidate is priced at no more than
the share of the peak this rank's own GEMMs of the target precision reach (a job whose TF32 GEMMs
run at 19% of peak will not run its FP32 ones at 60% once they are TF32); FP8 and 2:4 candidates
at the registry's share scaled by the current precision's shortfall against the registry.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import msgspec
import numpy as np

from ..hardware.devices import DeviceSpec, Identification
from ..hardware.registry import Family, best
from ..trace.model import NO_KERNEL_OPS, SDPA_BACKEND_OPS, SDPA_OPS, Cat
from .classify import KernelKind, MathPath, math_path
from .context import Context
from .gemm import MATRIX_INPUTS, call_ranges, gemm_dims, innermost, launch_calls
from .model import AttentionSite, ChainSite, GemmCandidates, KernelChoice, PrecisionPath
from .opwork import DTYPE_BYTES, MAX_FLOPS, op_work
from .roofline import PRECISION, kernel_precisions
from .work import KernelWork

# FlashAttention-2's FLOP count: backward = 2.5 x forward (fa2 in kernels.toml).
BACKWARD_FLOPS = 2.5
# An unfused attention backward runs two GEMMs per forward GEMM plus the softmax backward: about
# twice the forward's device time (assumption; the trace cannot tie autograd's nodes to the call).
BACKWARD_TIME = 2.0
# How many leaf ops before / after a softmax its Q·Kᵀ and ·V GEMMs may sit (scale, mask, dropout).
MANUAL_REACH = 6
# (attn_mask / attn_bias, is_causal) argument positions of each SDPA op (torch 2.13's schemas).
SDPA_ARGS: dict[str, tuple[int | None, int]] = {
    "aten::scaled_dot_product_attention": (3, 5),
    "aten::_scaled_dot_product_attention_math": (3, 5),
    "aten::_scaled_dot_product_attention_math_for_mps": (3, 5),
    "aten::_scaled_dot_product_flash_attention": (None, 4),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (5, 4),
    "aten::_scaled_dot_product_efficient_attention": (3, 6),
    "aten::_scaled_dot_product_cudnn_attention": (3, 6),
    "aten::_scaled_dot_product_fused_attention_overrideable": (3, 5),
}
SOFTMAX_OPS = frozenset({"aten::softmax", "aten::_softmax", "aten::_safe_softmax"})
FUSED_ATTENTION_KERNEL = re.compile(r"flash|fmha|efficient_attention|cudnn.*(sdpa|mha)|attn_fwd", re.IGNORECASE)
# Hand-written chains one fused kernel replaces: pattern -> (registry op, regex over op names).
CHAIN_PATTERNS: dict[str, tuple[str, re.Pattern[str]]] = {
    "rms_norm": ("norm", re.compile(r"\b(?:to )?(?:pow|mul|square) mean add rsqrt mul (?:to )?mul\b")),
    "layer_norm": ("norm", re.compile(
        r"\bmean (?:sub (?:pow|mul) mean|var) (?:sub )?add (?:sqrt div|rsqrt mul) (?:mul add|add_?)\b")),
    "gelu_tanh": ("elementwise", re.compile(r"\bmul pow mul add mul tanh add mul\b")),
    "gelu_erf": ("elementwise", re.compile(r"\bmul div erf add mul\b")),
    # residual + dropout(x + bias): three passes over the activation where one fused kernel reads
    # x and the residual and writes the sum (Megatron's bias_dropout_add; Inductor fuses it).
    "bias_dropout_add": ("elementwise", re.compile(r"\badd dropout add\b")),
}
# Passes over the chain's first tensor that the fused kernel makes (reads + writes).
CHAIN_PASSES = {"bias_dropout_add": 3}
# Casts, written "to" in the chain text whichever op the trace recorded at the top.
CAST_OPS = {"aten::to": "to", "aten::_to_copy": "to", "aten::copy_": "to", "aten::type_as": "to"}
# Ops that launch no kernel even at the top of a call (views, metadata): left out of the chain text.
VIEW_OPS = (NO_KERNEL_OPS - {"aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone"}) | {
    "aten::resolve_conj", "aten::resolve_neg", "aten::type_as"}
TOP_SITES = 5
LINEAR_OPS = frozenset({"aten::mm", "aten::addmm", "aten::linear"})
SPARSE_ALIGN = 64
_any = msgspec.json.Decoder()


def kernel_choice(ctx: Context, work: KernelWork, dev: Identification) -> KernelChoice:
    """The rank's KernelChoice over its window (module docstring)."""
    device = dev.device
    out = KernelChoice(device_key=device.key if device else None, arch=device.arch if device else None,
                       supported=sorted(device.dense_tflops) if device else [])
    k = np.flatnonzero(ctx.tr.mask(Cat.KERNEL) & ctx.in_window)
    if k.size == 0:
        return out
    backward = bool((ctx.backward_mask & ctx.in_window).any())
    out.attention = attention_sites(ctx, device, backward)
    out.chains = chain_sites(ctx, device)
    gemm_mix(ctx, work, device, k, out)
    out.precision = precision_path(out, device)
    return out


# --- which kernels an op launched ---------------------------------------------------------------

def launched_kernels(ctx: Context, ops: np.ndarray) -> list[np.ndarray]:
    """For each op: the kernel events its launch calls (on its thread, inside its span) queued."""
    tr = ctx.tr
    kern = np.flatnonzero(tr.mask(Cat.KERNEL) & (tr.correlation >= 0))
    calls = launch_calls(ctx)
    if ops.size == 0 or kern.size == 0 or calls.size == 0:
        return [np.zeros(0, np.int64) for _ in range(ops.size)]
    kern = kern[np.argsort(tr.correlation[kern], kind="stable")]
    kcorr = tr.correlation[kern]
    # Every call's kernels, concatenated in call order (a CSR layout: call c owns flat[at[c]:at[c + 1]]).
    kl = np.searchsorted(kcorr, tr.correlation[calls], "left")
    n = np.searchsorted(kcorr, tr.correlation[calls], "right") - kl
    at = np.concatenate([[0], np.cumsum(n)])
    flat = kern[np.repeat(kl - at[:-1], n) + np.arange(int(at[-1]))]
    lo, hi = call_ranges(ctx, ops, calls)
    return [flat[x:y] for x, y in zip(at[lo].tolist(), at[hi].tolist(), strict=True)]


def top_level_aten(ctx: Context) -> np.ndarray:
    """aten ops in the window that no other aten op holds on their thread (what the Python code
    called: `q @ k.T` is aten::matmul, not the bmm and resolve_conj inside it), views left out."""
    tr = ctx.tr
    ops = np.flatnonzero(ctx.host & ctx.in_window & tr.mask(Cat.CPU_OP) & tr.name_mask(lambda n: n.startswith("aten::")))
    keep = []
    for tid in np.unique(tr.tid[ops]).tolist():
        o = ops[tr.tid[ops] == tid]
        o = o[np.lexsort((-tr.end[o], tr.ts[o]))]
        reach = np.maximum.accumulate(tr.end[o])
        outer = np.ones(o.size, bool)
        outer[1:] = tr.ts[o][1:] >= reach[:-1]
        keep.append(o[outer])
    top = np.sort(np.concatenate(keep)) if keep else ops
    return top[~tr.name_mask(VIEW_OPS.__contains__)[top]]


def _split_ns(ctx: Context, kernels: np.ndarray) -> tuple[int, int, int]:
    """(device ns, ns in plain FP32 GEMM/conv kernels, ns in elementwise/reduction kernels)."""
    tr = ctx.tr
    if kernels.size == 0:
        return 0, 0, 0
    dur = tr.end[kernels] - tr.ts[kernels]
    kinds = ctx.kind[kernels]
    mm = np.isin(kinds, (KernelKind.GEMM, KernelKind.CONV, KernelKind.ATTENTION))
    simt = np.array([bool(m) and math_path(tr.names[n]) == MathPath.FP32_SIMT
                     for m, n in zip(mm.tolist(), tr.name[kernels].tolist(), strict=True)], bool)
    fusable = np.isin(kinds, (KernelKind.ELEMENTWISE, KernelKind.REDUCTION))
    return int(dur.sum()), int(dur[simt].sum()), int(dur[fusable].sum())


def _shapes(ctx: Context, op: int) -> tuple[list, list, list]:
    """(Input Dims, Input type, Concrete Inputs) of one host op, empty lists when not recorded."""
    sid = int(ctx.tr.shape_of(np.array([op]))[0])
    if sid < 0:
        return [], [], []
    dims, types, concrete = ctx.tr.shapes[sid]
    try:
        d, t = _any.decode(dims), _any.decode(types) if types else []
        c = _any.decode(concrete) if concrete else []
    except msgspec.DecodeError:
        return [], [], []
    return (d if isinstance(d, list) else [], t if isinstance(t, list) else [], c if isinstance(c, list) else [])


# --- attention ----------------------------------------------------------------------------------

def attention_sites(ctx: Context, device: DeviceSpec | None, backward: bool) -> list[AttentionSite]:
    """SDPA calls and hand-written attention in the window, grouped (module docstring)."""
    tr = ctx.tr
    host = ctx.host & ctx.in_window & tr.mask(Cat.CPU_OP)
    sdpa = np.flatnonzero(host & tr.name_mask(SDPA_OPS.__contains__))
    calls: list[tuple[int, str]] = []  # (op holding the shapes, path)
    if sdpa.size:
        comp_name = tr.names.index("aten::scaled_dot_product_attention") if "aten::scaled_dot_product_attention" in tr.names else -1
        backends = sdpa[tr.name[sdpa] != comp_name]
        composites = sdpa[tr.name[sdpa] == comp_name]
        calls += [(int(b), SDPA_BACKEND_OPS[tr.names[tr.name[b]]]) for b in backends.tolist()]
        bare = [int(c) for c in composites.tolist() if not _holds(tr, c, backends)]
        for c, ks in zip(bare, launched_kernels(ctx, np.array(bare, np.int64)), strict=True):
            fused = any(FUSED_ATTENTION_KERNEL.search(tr.names[n]) for n in tr.name[ks].tolist())
            calls.append((c, "fused" if fused else "unknown"))
    groups: dict[tuple, list[tuple[list[int], np.ndarray, float | None]]] = defaultdict(list)
    # The op whose span holds the call's kernels: the composite around a backend op when present.
    spans = [_outer(tr, op, sdpa) for op, _ in calls]
    for (op, path), span, ks in zip(calls, spans, launched_kernels(ctx, np.array(spans, np.int64)), strict=True):
        # The composite's arguments when the backend op sits inside one (the user's call), else its own.
        holder = span if tr.names[tr.name[span]] in SDPA_ARGS and _shapes(ctx, span)[0] else op
        dims, types, concrete = _shapes(ctx, holder)
        mask_at, causal_at = SDPA_ARGS.get(tr.names[tr.name[holder]], (None, None))
        q, kk, v = (_ints(dims[i]) if len(dims) > i else [] for i in range(3))
        has_mask = mask_at is not None and len(dims) > mask_at and isinstance(dims[mask_at], list) \
            and len(dims[mask_at]) > 0
        is_causal = _flag(concrete, causal_at)
        flops = _sdpa_flops(q, kk, v)
        dtype = str(types[0]) if types else ""
        key = (path, dtype, tuple(q), tuple(kk), has_mask, is_causal)
        groups[key].append(([op], ks, flops))
    for op, ks, flops, key in _manual(ctx, host, sdpa):
        groups[key].append(([op], ks, flops))
    sites = []
    for key, members in groups.items():
        path, dtype, q, kk, has_mask, is_causal = key
        ks = np.concatenate([m[1] for m in members]) if members else np.zeros(0, np.int64)
        ns, simt, fusable = _split_ns(ctx, ks)
        fl = [m[2] for m in members]
        prec = PRECISION.get(dtype)
        head_dim = int(q[-1]) if q else 0
        site = AttentionSite(
            path=path, calls=len(members), dtype=dtype, precision=prec, q_dims=list(q),
            kv_len=int(kk[-2]) if len(kk) >= 2 else 0, head_dim=head_dim, has_mask=has_mask, is_causal=is_causal,
            device_ns=ns, simt_ns=simt, fusable_ns=fusable,
            flops=float(sum(fl)) if fl and all(f is not None for f in fl) else None)
        if path in ("math", "manual", "unknown"):
            site.reasons = math_reasons(path, prec, has_mask, head_dim, device)
            _price_attention(site, device, backward)
        sites.append(site)
    sites.sort(key=lambda s: -s.device_ns)
    return sites[:TOP_SITES]


def _holds(tr, op: int, inner: np.ndarray) -> bool:
    sel = (tr.tid[inner] == tr.tid[op]) & (tr.ts[inner] >= tr.ts[op]) & (tr.end[inner] <= tr.end[op])
    return bool(sel.any())


def _outer(tr, op: int, ops: np.ndarray) -> int:
    """The outermost op of `ops` on `op`'s thread whose span holds `op` (itself if none)."""
    sel = ops[(tr.tid[ops] == tr.tid[op]) & (tr.ts[ops] <= tr.ts[op]) & (tr.end[ops] >= tr.end[op])]
    return int(sel[np.argmin(tr.ts[sel])]) if sel.size else op


def _ints(x: object) -> list[int]:
    """A recorded shape as a list of ints; [] when it is not one (trace content is untrusted)."""
    if isinstance(x, list) and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in x):
        return x
    return []


def _flag(concrete: list, i: int | None) -> bool | None:
    if i is None or len(concrete) <= i:
        return None
    v = str(concrete[i]).strip().lower()
    return True if v == "true" else False if v == "false" else None


def _sdpa_flops(q: list, k: list, v: list) -> float | None:
    """Forward FLOPs of one attention call from q [..., L, D], k [..., S, D], v [..., S, Dv]."""
    if len(q) < 2 or len(k) < 2 or len(v) < 2 or not all(isinstance(x, int) and x > 0 for x in q + k + v):
        return None
    batch = math.prod(q[:-2])
    L, D, S, Dv = q[-2], q[-1], k[-2], v[-1]
    flops = 2 * batch * L * S * D + 2 * batch * L * S * Dv
    return float(flops) if flops <= MAX_FLOPS else None  # absurd shapes: no FLOPs, never a crash


def _manual(ctx: Context, host: np.ndarray, sdpa: np.ndarray):
    """Hand-written attention calls: (softmax op, kernels of the three steps, FLOPs, group key)."""
    tr = ctx.tr
    soft = np.flatnonzero(host & tr.name_mask(SOFTMAX_OPS.__contains__))
    if soft.size == 0:
        return
    soft = np.array([s for s in soft.tolist() if not (sdpa.size and _inside_any(tr, s, sdpa))], np.int64)
    if soft.size == 0:
        return
    leaves = top_level_aten(ctx)
    by_tid: dict[int, np.ndarray] = {}
    for tid in np.unique(tr.tid[soft]).tolist():
        mine = leaves[tr.tid[leaves] == tid]
        by_tid[tid] = mine[np.argsort(tr.ts[mine], kind="stable")]
    found = []
    for s in soft[np.isin(soft, leaves)].tolist():
        dims, types, _ = _shapes(ctx, s)
        x = _ints(dims[0]) if dims else []
        if len(x) < 3:
            continue
        L, S = x[-2], x[-1]
        seq = by_tid[int(tr.tid[s])]
        at = int(np.searchsorted(tr.ts[seq], tr.ts[s]))
        qk = _gemm_near(ctx, seq[max(0, at - MANUAL_REACH):at][::-1], lambda a, b, L=L, S=S: a[-2] == L and b[-1] == S)
        pv = _gemm_near(ctx, seq[at + 1:at + 1 + MANUAL_REACH],
                        lambda a, b, L=L, S=S: a[-2] == L and a[-1] == S and b[-2] == S)
        if qk is None or pv is None:
            continue
        first, last = qk[0], pv[0]
        span = seq[(tr.ts[seq] >= tr.ts[first]) & (tr.ts[seq] <= tr.ts[last])]
        flops = (qk[1] or 0.0) + (pv[1] or 0.0) if qk[1] is not None and pv[1] is not None else None
        dtype = str(types[0]) if types else ""
        q_dims = list(x[:-1]) + [qk[2]]
        k_dims = list(x[:-2]) + [S, qk[2]]
        found.append((s, span, flops, ("manual", dtype, tuple(q_dims), tuple(k_dims), False, None)))
    if not found:
        return
    kernels = launched_kernels(ctx, np.concatenate([f[1] for f in found]))
    i = 0
    for s, span, flops, key in found:
        ks = kernels[i:i + span.size]
        i += span.size
        yield s, (np.concatenate(ks) if ks else np.zeros(0, np.int64)), flops, key


def _inside_any(tr, op: int, ops: np.ndarray) -> bool:
    return bool(((tr.tid[ops] == tr.tid[op]) & (tr.ts[ops] <= tr.ts[op]) & (tr.end[ops] >= tr.end[op])).any())


def _gemm_near(ctx: Context, ops: np.ndarray, fits) -> tuple[int, float | None, int] | None:
    """The first GEMM op of `ops` whose two matrix operands `fits`: (op, FLOPs, its K or N dim)."""
    tr = ctx.tr
    for o in ops.tolist():
        name = tr.names[tr.name[o]]
        if name not in MATRIX_INPUTS:
            continue
        dims, types, _ = _shapes(ctx, o)
        a_i, b_i = MATRIX_INPUTS[name]
        if len(dims) <= b_i or not isinstance(dims[a_i], list) or not isinstance(dims[b_i], list):
            continue
        a, b = _ints(dims[a_i]), _ints(dims[b_i])
        if len(a) < 2 or len(b) < 2 or not fits(a, b):
            continue
        w = op_work(name, *tr.shapes[int(tr.shape_of(np.array([o]))[0])])
        return o, (float(w.flops) if w.flops is not None else None), int(a[-1])
    return None


def math_reasons(path: str, prec: str | None, has_mask: bool, head_dim: int, device: DeviceSpec | None) -> list[str]:
    """Why no fused attention kernel ran, as far as the trace shows (PyTorch's SDPA backend rules)."""
    out = []
    if path == "manual":
        out.append("attention is computed as matmul, softmax, matmul (by hand, or by nn.MultiheadAttention called "
                   "with need_weights=True): no fused kernel can run; "
                   "F.scaled_dot_product_attention picks one")
    if prec not in ("fp16", "bf16"):
        out.append(f"{prec or 'unknown'} inputs: the flash backend takes fp16/bf16 only "
                   "(the memory-efficient one takes fp32)")
    if has_mask:
        out.append("an explicit attn_mask: the flash backend takes none (is_causal=True covers causal masks; "
                   "the memory-efficient backend takes masks)")
    if head_dim > 256:
        out.append(f"head dim {head_dim} > 256: the fused backends stop at 256")
    elif head_dim and head_dim % 8:
        out.append(f"head dim {head_dim} is not a multiple of 8: the fused backends need aligned heads")
    if device is not None and device.vendor == "nvidia" and device.compute is not None and device.compute < (8, 0):
        out.append(f"{device.label} (compute capability {device.compute[0]}.{device.compute[1]}) has no flash "
                   "backend (sm80 and later)")
    if path in ("math", "unknown") and len(out) == 0:
        out.append("nothing in the trace excludes a fused backend: it was probably disabled "
                   "(torch.backends.cuda.enable_flash_sdp(False), sdpa_kernel(SDPBackend.MATH)) or the inputs "
                   "are non-contiguous")
    return out


def _price_attention(site: AttentionSite, device: DeviceSpec | None, backward: bool) -> None:
    """The registry family for these calls and its forward (+ backward) device time."""
    prec = site.precision  # fp32 calls are priced on the fp32 roof (the efficient backend's)
    fam = best("attention", device, prec) if prec else None
    if fam is None or device is None or site.flops is None:
        return
    work = site.flops * (1.0 + (BACKWARD_FLOPS if backward else 0.0)) * (0.5 if site.is_causal else 1.0)
    site.family, site.family_note = fam.key, fam.cite()
    site.expected_ns = fam.expected_ns(work, device, prec)
    site.with_backward = backward


# --- hand-written norms and activations ---------------------------------------------------------

def chain_sites(ctx: Context, device: DeviceSpec | None) -> list[ChainSite]:
    """Runs of ops matching CHAIN_PATTERNS (module docstring)."""
    tr = ctx.tr
    back = ctx.clipped_union(ctx.backward_mask)
    leaves = top_level_aten(ctx)
    if leaves.size == 0:
        return []
    if back[0].size:
        at = np.searchsorted(back[0], tr.ts[leaves], side="right") - 1
        inside = (at >= 0) & (tr.ts[leaves] < back[1][np.maximum(at, 0)])
        leaves = leaves[~inside]
    found: dict[tuple, list[np.ndarray]] = defaultdict(list)
    for tid in np.unique(tr.tid[leaves]).tolist():
        seq = leaves[tr.tid[leaves] == tid]
        seq = seq[np.argsort(tr.ts[seq], kind="stable")]
        words = [CAST_OPS.get(tr.names[n], tr.names[n].removeprefix("aten::")) for n in tr.name[seq].tolist()]
        text = " ".join(words)
        starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
        for pattern, (_, rx) in CHAIN_PATTERNS.items():
            for m in rx.finditer(text):
                a = int(np.searchsorted(starts, m.start()))
                b = a + len(m.group(0).split())
                dims, types, _ = _shapes(ctx, int(seq[a]))
                x = _ints(dims[0]) if dims else []
                key = (pattern, tuple(words[a:b]), str(types[0]) if types else "", tuple(x))
                found[key].append(seq[a:b])
    sites = []
    for (pattern, words, dtype, x), runs in found.items():
        ops = np.concatenate(runs)
        kernels = launched_kernels(ctx, ops)
        ns = _split_ns(ctx, np.concatenate(kernels) if kernels else np.zeros(0, np.int64))[0]
        size = DTYPE_BYTES.get(dtype)
        numel = math.prod(x) if x and all(isinstance(d, int) for d in x) else None
        nbytes = float(CHAIN_PASSES.get(pattern, 2) * numel * size * len(runs)) if numel and size else None
        site = ChainSite(pattern=pattern, calls=len(runs), ops=list(words),
                         kernels_per_call=round(sum(k.size for k in kernels) / len(runs), 2),
                         dtype=dtype, input_dims=list(x), device_ns=ns, nbytes=nbytes)
        fam = best(CHAIN_PATTERNS[pattern][0], device, PRECISION.get(dtype, "fp32"))
        if fam is not None and device is not None and nbytes:
            site.family, site.family_note = fam.key, fam.cite()
            site.expected_ns = fam.expected_ns(nbytes, device, PRECISION.get(dtype, "fp32"))
        sites.append(site)
    sites.sort(key=lambda s: -s.device_ns)
    return sites[:TOP_SITES]


# --- GEMM precision mix and cheaper formats -----------------------------------------------------

def gemm_mix(ctx: Context, work: KernelWork, device: DeviceSpec | None, k: np.ndarray, out: KernelChoice) -> None:
    """gemm_ns / gemm_flops by precision and the fp32_simt / unsupported / fp8 / sparse24 candidates."""
    tr = ctx.tr
    mm = k[np.isin(ctx.kind[k], (KernelKind.GEMM, KernelKind.CONV))]
    if mm.size == 0:
        return
    dur = tr.end[mm] - tr.ts[mm]
    pa = kernel_precisions(tr.names, tr.name, work, mm)
    prec = pa.tolist()
    flops = work.flops[mm]
    ns: dict[str, int] = defaultdict(int)
    known_ns: dict[str, int] = defaultdict(int)
    fl: dict[str, float] = defaultdict(float)
    for p, d, f in zip(prec, dur.tolist(), flops.tolist(), strict=True):
        ns[p] += int(d)
        if math.isfinite(f):
            fl[p] += float(f)
            known_ns[p] += int(d)
    out.gemm_ns, out.gemm_flops = dict(ns), {p: v for p, v in fl.items() if v}
    if device is None:
        return
    # The share of each precision's peak this rank's own GEMMs reach (module docstring: priced at
    # no more than that, so small or skinny GEMMs are not priced as large ones).
    achieved = {p: fl[p] / known_ns[p] / (device.peak_tflops(p) * 1e3)
                for p in fl if p and known_ns[p] and device.peak_tflops(p)}
    # Plain FP32 GEMM/conv kernels (HW-1): priced as TF32 tensor-core GEMMs, or fp16 before Ampere.
    simt = np.array([math_path(tr.names[n]) == MathPath.FP32_SIMT for n in tr.name[mm].tolist()]) & np.isfinite(flops)
    target = next((p for p in ("tf32", "fp16") if p in device.dense_tflops), None)
    if simt.any() and target is not None:
        out.fp32_simt = _candidates(target, "fp32", int(simt.sum()), int(dur[simt].sum()), float(flops[simt].sum()),
                                    [], best("gemm", device, target), device, achieved=achieved)
    # Precisions the device lacks tensor cores for (bf16 on V100): priced as fp16 GEMMs.
    lacking = [p for p in ("bf16", "tf32") if p in ns and p not in device.dense_tflops]
    if lacking and "fp16" in device.dense_tflops:
        sel = np.isin(pa, lacking) & np.isfinite(flops)
        if sel.any():
            out.unsupported = _candidates("fp16", lacking[0], int(sel.sum()), int(dur[sel].sum()),
                                          float(flops[sel].sum()), [], best("gemm", device, "fp16"), device,
                                          achieved=achieved)
    gemms = _half_gemms(ctx) if "fp8" in device.dense_tflops or device.sparse_tflops else []
    out.fp8 = _lowp(ctx, device, "gemm_fp8", "fp8", achieved, gemms, lambda name, d: True)
    out.sparse24 = _lowp(ctx, device, "gemm_sparse24", "sparse24", achieved, gemms,
                         lambda name, d: name in LINEAR_OPS and d["N"] % SPARSE_ALIGN == 0 and d["K"] % SPARSE_ALIGN == 0)


def _half_gemms(ctx: Context) -> list[tuple[str, dict[str, int], str, float, np.ndarray]]:
    """bf16/fp16 leaf GEMM ops in the window with shapes, one row per distinct (op, shapes):
    (op name, {M, K, N}, precision, FLOPs of one call, the calls)."""
    tr = ctx.tr
    ops = innermost(ctx, np.flatnonzero(tr.mask(Cat.CPU_OP) & ctx.in_window & tr.name_mask(MATRIX_INPUTS.__contains__)))
    sid = tr.shape_of(ops)
    ops, sid = ops[sid >= 0], sid[sid >= 0]
    key = tr.name[ops].astype(np.int64) * (len(tr.shapes) + 1) + sid
    keys, inv = np.unique(key, return_inverse=True)
    groups = np.split(ops[np.argsort(inv, kind="stable")], np.cumsum(np.bincount(inv))[:-1]) if ops.size else []
    rows = []
    for j, kk in enumerate(keys.tolist()):
        name, shape = tr.names[kk // (len(tr.shapes) + 1)], tr.shapes[kk % (len(tr.shapes) + 1)]
        try:
            dims, types = _any.decode(shape[0]), _any.decode(shape[1]) if shape[1] else []
        except msgspec.DecodeError:
            continue
        got = gemm_dims(name, dims, types) if isinstance(dims, list) and isinstance(types, list) else None
        p = PRECISION.get(got[0]) if got else None
        if got is None or p not in ("bf16", "fp16"):
            continue
        w = op_work(name, *shape)
        if w.flops is not None:
            rows.append((name, got[1], p, float(w.flops), groups[j]))
    return rows


def _lowp(ctx: Context, device: DeviceSpec, op: str, target: str, achieved: dict[str, float],
          gemms: list[tuple[str, dict[str, int], str, float, np.ndarray]], eligible) -> GemmCandidates | None:
    """The GEMMs of `gemms` the `op` family could run (all dims >= its min_dim and `eligible`)."""
    tr = ctx.tr
    roof_prec = "fp8" if target == "fp8" else None
    picked, shapes, flops, prec_of = [], defaultdict(int), 0.0, ""
    for name, d, p, call_flops, calls in gemms:
        fam = best(op, device, roof_prec or p)
        if fam is None or min(d.values()) < fam.min_dim or not eligible(name, d):
            continue
        picked.append(calls)
        flops += call_flops * calls.size
        prec_of = p
        shapes[f"{d['M']}x{d['K']}x{d['N']}"] += int(calls.size)
    if not picked:
        return None
    ops = np.sort(np.concatenate(picked))
    kernels = launched_kernels(ctx, ops)
    gemm_k = [ks[np.isin(ctx.kind[ks], (KernelKind.GEMM,))] for ks in kernels]
    ns = int(sum(int((tr.end[g] - tr.ts[g]).sum()) for g in gemm_k))
    fam = best(op, device, roof_prec or prec_of)
    top = [f"{s} x{n}" for s, n in sorted(shapes.items(), key=lambda x: -x[1])[:3]]
    # The new format's kernels reach the registry's share of their roof scaled by how far this
    # rank's GEMMs of the current precision fall short of the registry's share of theirs.
    now = best("gemm", device, prec_of)
    scale = min(1.0, achieved[prec_of] / now.efficiency) if now is not None and prec_of in achieved else 1.0
    eff = fam.efficiency * scale if fam is not None else None
    return _candidates(roof_prec or prec_of, prec_of, int(ops.size), ns, flops, top, fam, device, target=target,
                       efficiency=eff)


def _candidates(roof_prec: str, prec: str, calls: int, ns: int, flops: float, shapes: list[str],
                fam: Family | None, device: DeviceSpec, target: str | None = None,
                achieved: dict[str, float] | None = None, efficiency: float | None = None) -> GemmCandidates:
    """Candidates priced at `fam` on `roof_prec`: at `efficiency` when given, else at the lower of the
    family's efficiency and what this rank's `roof_prec` GEMMs achieve (`achieved`)."""
    c = GemmCandidates(target=target or roof_prec, calls=calls, ns=ns, flops=flops, precision=prec, shapes=shapes)
    if fam is None:
        return c
    own = (achieved or {}).get(roof_prec)
    eff = efficiency if efficiency is not None else min(fam.efficiency, own) if own else fam.efficiency
    c.family, c.efficiency = fam.key, round(eff, 4)
    c.family_note = fam.cite() if eff == fam.efficiency else (
        f"{fam.label} at {100 * eff:.0f}% of the {roof_prec} dense peak: "
        + (f"what this rank's own {roof_prec} GEMMs reach" if efficiency is None
           else f"the registry's {100 * fam.efficiency:.0f}% scaled by this rank's {prec} GEMMs' shortfall"))
    c.expected_ns = fam.expected_ns(flops, device, roof_prec, eff)
    return c


# --- the precision advisor ----------------------------------------------------------------------

def precision_path(c: KernelChoice, device: DeviceSpec | None) -> PrecisionPath | None:
    """The recommended precision for the rank's GEMMs on its device (one answer, shared by HW-1,
    HW-15 and HW-16): from the precision holding most GEMM/conv time and what the device table
    says the device supports.

    - fp32 in plain FP32 kernels, TF32 supported: TF32 (a flag, remedy precision.tf32), then bf16;
    - fp32/TF32 with bf16 supported: bf16 autocast (remedy precision.autocast, numerics checked by fix);
    - fp32 or bf16 on a device with fp16 tensor cores only (V100, T4): fp16 autocast + GradScaler, a
      code change (the autocast remedy is bf16-only);
    - bf16/fp16 on an FP8 device with FP8-eligible GEMMs: FP8 for those (torchao), a code change;
    - otherwise: keep the precision.
    None without GEMM time or a matched device.
    """
    total = sum(c.gemm_ns.values())
    if device is None or not total:
        return None
    shares = {p: round(100.0 * ns / total, 1) for p, ns in sorted(c.gemm_ns.items(), key=lambda x: -x[1])}
    known = {p: ns for p, ns in c.gemm_ns.items() if p}
    dominant = max(known, key=lambda p: known[p]) if known else None
    has = set(device.dense_tflops)
    out = PrecisionPath(shares=shares, dominant=dominant)
    if dominant is None:
        out.recommended, out.why = "unknown", "the trace does not say which precision the GEMMs ran in (record_shapes=True)"
    elif dominant == "fp32" and "tf32" in has:  # "fp32" GEMM time ran on plain FP32 kernels (else "tf32")
        out.recommended, out.remedy, out.numerics = "tf32, then bf16 autocast", "precision.tf32", True
        out.why = f"FP32 GEMMs run without {cores(device)}; {device.label} runs TF32 (a flag) and bf16 on them"
    elif dominant in ("fp32", "tf32") and "bf16" in has:
        out.recommended, out.remedy, out.numerics = "bf16 autocast", "precision.autocast", True
        out.why = f"{device.label} has bf16 {cores(device)} at {device.dense_tflops['bf16']:g} TFLOP/s"
    elif dominant in ("fp32", "bf16", "tf32") and "fp16" in has and "bf16" not in has:
        out.recommended, out.numerics = "fp16 autocast + GradScaler (a code change)", True
        out.why = f"{device.label} has fp16 {cores(device)} only: no bf16, no TF32"
    elif dominant in ("bf16", "fp16") and c.fp8 is not None and "fp8" in has:
        out.recommended, out.numerics = "fp8 for the large GEMMs (torchao float8, a code change)", True
        out.why = f"{c.fp8.calls} GEMM calls are large enough for {device.label}'s FP8 {cores(device)}"
    else:
        out.recommended, out.why = "keep", _keep_why(c, device, dominant)
    unknown = shares.get("", 0.0)
    if dominant is not None and unknown > 50.0:
        out.why += f"; judged on the {100.0 - unknown:g}% of GEMM time whose precision the trace names"
    return out


def cores(device: DeviceSpec) -> str:
    """What the vendor calls its matrix units: AMD's are matrix cores (MFMA), NVIDIA's tensor cores."""
    return "matrix cores" if device.vendor == "amd" else "tensor cores"


def _keep_why(c: KernelChoice, device: DeviceSpec, dominant: str) -> str:
    """Why the rank's dominant GEMM precision stays: what the device offers beyond it, and why it
    does not apply here (an H100 has FP8; a bf16 GEMM of 768 columns is too small to gain from it)."""
    has = device.dense_tflops
    if dominant in ("fp8", "fp4"):
        return f"{dominant} GEMMs already run on {device.label}'s low-precision {cores(device)}"
    if dominant in ("bf16", "fp16") and "fp8" in has:
        if not c.gemm_flops.get(dominant):
            return f"the trace gives no {dominant} GEMM shapes to judge {device.label}'s FP8 by (record_shapes=True)"
        fam = best("gemm_fp8", device, "fp8")
        size = f"M, N and K of {fam.min_dim} or more" if fam is not None else "a size FP8 is known to pay at"
        return (f"no {dominant} GEMM with recorded shapes has {size}, below which FP8's casts cost more than "
                f"{device.label}'s faster FP8 GEMMs save")
    if dominant in ("bf16", "fp16"):
        return f"{dominant} is the fastest training format of {device.label}'s {cores(device)}"
    return f"{dominant} is the fastest path {device.label} offers these GEMMs"
