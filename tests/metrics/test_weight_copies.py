"""Matmuls that copy their weight, on traces the installed torch records (CPU): torchtune's LoRA output projection
(a sequence chunk of the last hidden state against the frozen tied embedding), and the same with the chunk made
contiguous, with a weight that needs a gradient, and a batched matmul of two 3-D operands."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from torchdoctor.metrics.context import Context
from torchdoctor.metrics.steps import choose_window
from torchdoctor.metrics.weight_copies import weight_copies
from torchdoctor.trace.load import load_trace

pytest.importorskip("torch")

STEPS = 3
MODES = ("chunked", "contiguous", "trained", "bmm", "attention", "batch1")
# One process records a trace per mode (importing torch once): argv[1] is the directory.
RECORD = textwrap.dedent("""
    import sys, torch
    from torch.profiler import profile, ProfilerActivity
    torch.manual_seed(0); torch.set_num_threads(1)
    proj = torch.randn(128, 128, dtype=torch.bfloat16, requires_grad=True)
    def step(mode, emb):
        h = (torch.randn(4, 64, 128, dtype=torch.bfloat16) @ proj)  # requires grad, like a LoRA model's output
        if mode == "bmm":  # two 3-D operands
            out = [torch.matmul(c, c.transpose(1, 2)) for c in h.chunk(4, dim=1)]
        elif mode == "attention":  # heads transposed out of a [B, S, H * D] projection: matmul's reshape copies them
            x = torch.randn(8, 32, 512, requires_grad=True)
            q = x.view(8, 32, 8, 64).transpose(1, 2)
            out = [q @ q.transpose(-2, -1)]
        elif mode == "batch1":  # one sequence: each chunk is contiguous, and matmul still does not fold it
            out = [torch.nn.functional.linear(c, emb) for c in h[:1].chunk(4, dim=1)]
        else:
            out = [torch.nn.functional.linear(c.contiguous() if mode == "contiguous" else c, emb)
                   for c in h.chunk(4, dim=1)]
        sum(o.float().sum() for o in out).backward()
    for mode in sys.argv[3:]:
        emb = torch.randn(8192, 128, dtype=torch.bfloat16, requires_grad=(mode == "trained"))
        step(mode, emb)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
            for _ in range(int(sys.argv[2])):
                step(mode, emb); p.step()
        p.export_chrome_trace(f"{sys.argv[1]}/{mode}.json")
""")


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Context]:
    out = tmp_path_factory.mktemp("weight_copies")
    subprocess.run([sys.executable, "-c", RECORD, str(out), str(STEPS), *MODES], check=True, capture_output=True,
                   timeout=300)
    ctxs = {}
    for mode in MODES:
        tr = load_trace(str(out / f"{mode}.json"))
        ctxs[mode] = Context(tr, choose_window(tr, None))
    return ctxs


def test_a_chunk_against_a_frozen_weight_copies_it_every_call(traces):
    ctx = traces["chunked"]
    wc = weight_copies(ctx)
    steps = len(ctx.win.steps)
    assert steps >= 2 and wc is not None and wc.steps == steps
    assert wc.calls == 4 * steps  # every chunk's projection, every step
    assert wc.copy_ns >= 0.5 * wc.matmul_ns and wc.device_ns is None
    assert list(wc.shapes) == ["[[4,16,128],[128,8192]]"]  # the matmul's operands, as recorded


def test_a_batch_of_one_is_found_too(traces):
    ctx = traces["batch1"]
    wc = weight_copies(ctx)
    assert wc is not None and wc.calls == 4 * len(ctx.win.steps)


@pytest.mark.parametrize("mode", ["contiguous", "trained", "bmm", "attention"])
def test_no_weight_copy_when_matmul_folds_or_both_operands_are_batched(traces, mode):
    assert weight_copies(traces[mode]) is None
