"""Kernel choice on a trace the installed torch records (CPU): the op names, argument layouts
and nesting metrics/choice.py reads are torch's own, not the code-built traces' guesses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from torchdoctor.metrics.choice import attention_sites, chain_sites
from torchdoctor.metrics.context import Context
from torchdoctor.metrics.steps import choose_window
from torchdoctor.trace.load import load_trace

pytest.importorskip("torch")

RECORD = textwrap.dedent("""
    import sys, torch, torch.nn.functional as F
    from torch.profiler import profile, ProfilerActivity
    torch.manual_seed(0)
    q = torch.randn(2, 4, 128, 32, requires_grad=True); k = torch.randn(2, 4, 128, 32); v = torch.randn(2, 4, 128, 32)
    mask = torch.ones(128, 128, dtype=torch.bool).tril()
    x = torch.randn(64, 256); w = torch.ones(256)
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True); y = torch.randn(2, 128, 64)
    def step():
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        s = torch.softmax((q @ k.transpose(-2, -1)) * 0.17, dim=-1) @ v          # attention by hand
        r = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w          # RMSNorm by hand
        g = 0.5 * x * (1.0 + torch.tanh(0.79788456 * (x + 0.044715 * torch.pow(x, 3.0))))  # NewGELU
        m, _ = mha(y, y, y)  # need_weights=True (the default): matmul, softmax, matmul inside
        (a.sum() + b.sum() + s.sum() + r.sum() + g.sum() + m.sum()).backward()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(6):  # leading steps slowed by a busy machine read as warm-up: 2 or more stay
            step(); p.step()
    p.export_chrome_trace(sys.argv[1])
""")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    path = tmp_path_factory.mktemp("choice") / "trace.json"
    subprocess.run([sys.executable, "-c", RECORD, str(path)], check=True, capture_output=True, timeout=120)
    tr = load_trace(str(path))
    return Context(tr, choose_window(tr, None))


def test_sdpa_calls_by_backend_with_mask_and_causal_from_the_users_call(ctx):
    sites = {(s.path, s.has_mask, s.is_causal): s for s in attention_sites(ctx, None, True)}
    # torch's CPU flash backend takes the masked and the causal call; the mask is read from the
    # composite call (the CPU backend holds it at another position than the composite).
    masked, causal = sites[("flash", True, False)], sites[("flash", False, True)]
    n = len(ctx.win.steps)  # one call per step in the window
    assert n >= 2
    for s in (masked, causal):
        assert s.calls == n and s.q_dims == [2, 4, 128, 32] and s.kv_len == 128 and s.dtype == "float"
        assert s.flops == n * (2 * 8 * 128 * 128 * 32 * 2)


def test_attention_by_hand_is_found_at_the_users_matmul(ctx):
    manual = {tuple(s.q_dims): s for s in attention_sites(ctx, None, True) if s.path == "manual"}
    # nn.MultiheadAttention with need_weights=True computes it with bmm over batch x heads.
    mha = manual.pop((8, 128, 16))
    assert mha.calls == len(ctx.win.steps) and mha.kv_len == 128
    (m,) = manual.values()
    n = len(ctx.win.steps)
    assert m.calls == n and m.q_dims == [2, 4, 128, 32] and m.kv_len == 128
    assert m.flops == n * (2 * 8 * 128 * 128 * 32 * 2)  # the two aten::matmul calls


def test_hand_written_rms_norm_and_gelu_are_found(ctx):
    got = {c.pattern: c for c in chain_sites(ctx, None)}
    assert set(got) == {"rms_norm", "gelu_tanh"}
    assert got["rms_norm"].ops == ["pow", "mean", "add", "rsqrt", "mul", "mul"]
    assert got["rms_norm"].calls == got["gelu_tanh"].calls == len(ctx.win.steps)
    assert got["gelu_tanh"].ops == ["mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"]
    assert got["gelu_tanh"].input_dims == [64, 256] and got["gelu_tanh"].dtype == "float"
