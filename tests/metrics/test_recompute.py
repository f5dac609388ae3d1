"""Activation checkpointing's recompute on traces the installed torch records (CPU): the nodes it
runs in and the ops it runs again are torch's own, not a code-built trace's guess."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kineto_builder import TraceBuilder
from torchdoctor.metrics.context import Context
from torchdoctor.metrics.recompute import recompute
from torchdoctor.metrics.steps import choose_window
from torchdoctor.trace.load import load_trace
from torchdoctor.trace.model import Cat

pytest.importorskip("torch")

BLOCKS, STEPS = 3, 6
# Three blocks of two large linears, a GELU, a LayerNorm and dropout (checkpointing must replay the
# dropout mask); checkpointed by torch.utils.checkpoint in the mode of argv[2].
RECORD = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    from torch.profiler import profile, ProfilerActivity
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0); torch.set_num_threads(1)
    mode, n_blocks, n_steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512), nn.LayerNorm(512),
                                         nn.Dropout(0.1)) for _ in range(n_blocks))
    x = torch.randn(256, 512)
    def step():
        h = x
        for b in blocks:
            if mode == "none":
                h = b(h)
            else:
                h = checkpoint(b, h, use_reentrant=(mode == "reentrant"))
        h.square().mean().backward()
    with torch.no_grad():
        x.requires_grad_(mode == "reentrant")  # a reentrant checkpoint needs an input that requires grad
    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(n_steps):
            step(); p.step()
    p.export_chrome_trace(sys.argv[1])
""")


def _ctx(tmp_path_factory, mode: str) -> Context:
    path = tmp_path_factory.mktemp(f"ckpt_{mode}") / "trace.json"
    subprocess.run([sys.executable, "-c", RECORD, str(path), mode, str(BLOCKS), str(STEPS)], check=True, capture_output=True, timeout=180)
    tr = load_trace(str(path))
    return Context(tr, choose_window(tr, None))


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    return {mode: _ctx(tmp_path_factory, mode) for mode in ("none", "non_reentrant", "reentrant")}


def _forward_ns(ctx: Context) -> int:
    """The blocks' forward time on the training thread, outside backward: the work a checkpoint runs twice."""
    tr = ctx.tr
    ops = ctx.host & tr.mask(Cat.CPU_OP) & ctx.in_window & tr.name_mask(
        lambda n: n in ("aten::linear", "aten::gelu", "aten::layer_norm", "aten::dropout"))
    bwd = ctx.backward_mask & ctx.in_window
    inside = np.zeros(len(tr), bool)
    for i in np.flatnonzero(bwd):
        inside |= (tr.ts >= tr.ts[i]) & (tr.end <= tr.end[i]) & (tr.tid == tr.tid[i])
    return int((tr.end - tr.ts)[ops & ~inside].sum())


def test_no_checkpoint_no_recompute(traces):
    assert recompute(traces["none"]) is None


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_every_segment_of_every_step_is_found_and_priced_as_its_forward(traces, mode):
    ctx = traces[mode]
    rc = recompute(ctx)
    steps = len(ctx.win.steps)
    assert steps >= 2 and rc is not None and rc.steps == steps
    assert rc.nodes == BLOCKS * steps  # one node per checkpointed block and step
    assert rc.reentrant == (rc.nodes if mode == "reentrant" else 0)
    assert rc.device_ns is None  # a CPU trace
    # The second forward costs about what the first did (same ops, same shapes): not the whole backward,
    # not a node's own formula.
    ratio = rc.host_ns / _forward_ns(ctx)
    assert 0.6 < ratio < 1.6, ratio
    if mode == "non_reentrant":
        assert rc.forward_ops["aten::linear"] == 2 * BLOCKS * steps
        assert rc.forward_ops["aten::layer_norm"] == BLOCKS * steps


def _gpu_trace(tmp_path):
    """Two steps on the autograd thread of a GPU job, each with: a clean MmBackward0 launching 1 ms of
    kernels; a non-reentrant recompute in another MmBackward0 (an aten::linear launching 5 ms, then
    the node's own 1 ms); a reentrant CheckpointFunctionBackward whose forward launches 4 ms and whose
    nested backward (an AddmmBackward0) launches 2 ms."""
    b, bw = TraceBuilder(), 77  # the device's autograd thread
    node = "autograd::engine::evaluate_function: "
    for s in range(2):
        t = 1_000 + s * 100_000
        b.step(s, t, 100_000)
        b.op("aten::linear", t + 100, 1_000)  # the forward's own, outside every node: not recompute
        b.op(node + "MmBackward0", t + 10_000, 2_000, tid=bw)
        b.launching("aten::mm", t + 10_100, 500, "gemm", t + 10_200, 1_000, tid=bw)
        b.op(node + "MmBackward0", t + 20_000, 9_000, tid=bw)
        # FSDP's all-gather of the segment's parameters, before its forward again: needed either way.
        b.launching("nccl:_all_gather_base", t + 20_010, 80, "ncclDevKernel_AllGather_RING_LL", t + 20_050, 3_000,
                    tid=bw)
        b.launching("aten::linear", t + 20_100, 6_000, "gemm", t + 21_000, 5_000, tid=bw)
        b.launching("aten::mm", t + 26_500, 500, "gemm", t + 27_000, 1_000, tid=bw)
        b.op(node + "CheckpointFunctionBackward", t + 40_000, 20_000, tid=bw)
        b.launching("aten::add", t + 40_100, 5_000, "elementwise", t + 41_000, 4_000, tid=bw)
        b.op(node + "AddmmBackward0", t + 50_000, 6_000, tid=bw)
        b.launching("aten::mm", t + 50_100, 3_000, "gemm", t + 51_000, 2_000, tid=bw)
    path = b.write(tmp_path / "gpu.json")
    tr = load_trace(str(path))
    return Context(tr, choose_window(tr, "0:2"))


def test_device_time_launched_again_less_the_clean_nodes_and_the_nested_backward(tmp_path):
    rc = recompute(_gpu_trace(tmp_path))
    assert (rc.nodes, rc.reentrant, rc.steps) == (4, 2, 2)
    # Non-reentrant: 6 ms launched less the clean MmBackward0's 1 ms (the all-gather left out); reentrant:
    # 4 ms, the nested 2 ms not.
    assert rc.device_ns == 2 * (5_000_000 + 4_000_000)
    # Host: 9 ms less the clean node's 2 ms; the reentrant node's 20 ms less its nested 6 ms.
    assert rc.host_ns == 2 * (7_000_000 + 14_000_000)
    assert rc.forward_ops == {"aten::linear": 2}


# A gradient penalty (double backward, no checkpoint), and a reentrant checkpoint around a custom autograd
# Function whose backward is heavy: neither is recompute.
OTHERS = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    from torch.profiler import profile, ProfilerActivity
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0); torch.set_num_threads(1)
    mode = sys.argv[2]
    class Heavy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w
        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            for _ in range(12):
                gx = g @ w.t()
            return gx, x.t() @ g
    conv, lin = nn.Conv2d(3, 16, 3), nn.Linear(512, 512)
    w = nn.Parameter(torch.randn(512, 512) / 23)
    def step():
        if mode == "penalty":
            x = torch.randn(8, 3, 32, 32, requires_grad=True)
            out = conv(x).relu().sum()
            g, = torch.autograd.grad(out, x, create_graph=True)
            (out + g.pow(2).sum()).backward()
        else:
            x = torch.randn(256, 512, requires_grad=True)
            h = x
            for _ in range(2):
                h = checkpoint(lambda t: Heavy.apply(torch.relu(lin(t)), w), h, use_reentrant=True)
            h.sum().backward()
    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(4):
            step(); p.step()
    p.export_chrome_trace(sys.argv[1])
""")


def _other(tmp_path, mode: str) -> Context:
    path = tmp_path / f"{mode}.json"
    subprocess.run([sys.executable, "-c", OTHERS, str(path), mode], check=True, capture_output=True, timeout=180)
    tr = load_trace(str(path))
    return Context(tr, choose_window(tr, None))


def test_a_gradient_penalty_is_not_a_recompute(tmp_path):
    ctx = _other(tmp_path, "penalty")
    # The double backward's ConvolutionBackwardBackward0 calls aten::convolution as its own formula.
    assert any(n.endswith("ConvolutionBackwardBackward0") for n in ctx.tr.names)
    assert recompute(ctx) is None


def test_a_custom_function_s_backward_inside_a_reentrant_segment_is_its_own(tmp_path):
    ctx = _other(tmp_path, "custom")
    rc = recompute(ctx)
    steps = len(ctx.win.steps)
    assert rc is not None and rc.nodes == rc.reentrant == 2 * steps
    tr = ctx.tr
    heavy = ctx.backward_mask & ctx.in_window & tr.name_mask(lambda n: n.endswith(": HeavyBackward"))
    heavy_ns = int((tr.end - tr.ts)[heavy].sum())
    # The segment's forward again (a linear, a relu, one matmul) is a fraction of the heavy backward (13
    # matmuls of the same size) nested in it: that backward is not counted in.
    assert 0 < rc.host_ns < 0.35 * heavy_ns, (rc.host_ns, heavy_ns)
    assert rc.forward_ops["aten::matmul"] == 2 * steps  # Heavy's forward again, none of its backward's


# torchtune with compile=True and activation checkpointing: each block compiled inside its checkpoint. The
# forward run again is the compiled block's (AOTAutograd's CompiledFunction) inside its CompiledFunctionBackward.
COMPILED = textwrap.dedent("""
    import sys, torch, torch.nn as nn
    from torch.profiler import profile, ProfilerActivity
    from torch.utils.checkpoint import checkpoint
    torch.manual_seed(0); torch.set_num_threads(1)
    mode, n_blocks, n_steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    blocks = [torch.compile(nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512), nn.LayerNorm(512)),
                            backend="aot_eager") for _ in range(n_blocks)]
    x = torch.randn(256, 512)
    def step():
        h = x
        for b in blocks:
            h = b(h) if mode == "compiled" else checkpoint(b, h, use_reentrant=False)
        h.square().mean().backward()
    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(n_steps):
            step(); p.step()
    p.export_chrome_trace(sys.argv[1])
""")


@pytest.mark.parametrize("mode", ["compiled", "compiled_checkpoint"])
def test_a_compiled_segment_run_again_in_its_backward_is_priced_as_its_forward(tmp_path, mode):
    path = tmp_path / f"{mode}.json"
    subprocess.run([sys.executable, "-c", COMPILED, str(path), mode, str(BLOCKS), str(STEPS)], check=True,
                   capture_output=True, timeout=300)
    tr = load_trace(str(path))
    ctx = Context(tr, choose_window(tr, None))
    rc = recompute(ctx)
    if mode == "compiled":  # compiled, not checkpointed: its backward node runs no forward
        assert rc is None
        return
    steps = len(ctx.win.steps)
    assert steps >= 2 and rc is not None
    assert (rc.nodes, rc.reentrant, rc.forward_ops) == (BLOCKS * steps, 0, {"CompiledFunction": BLOCKS * steps})
    forward = ctx.host & ctx.in_window & tr.name_mask("CompiledFunction".__eq__) & ~ctx.backward_mask
    inside = np.zeros(len(tr), bool)
    for i in np.flatnonzero(ctx.backward_mask & ctx.in_window):
        inside |= (tr.ts >= tr.ts[i]) & (tr.end <= tr.end[i]) & (tr.tid == tr.tid[i])
    first = int((tr.end - tr.ts)[forward & ~inside].sum())
    assert np.count_nonzero(forward & ~inside) == BLOCKS * steps
    assert 0.6 < rc.host_ns / first < 1.6, (rc.host_ns, first)


def _built(tmp_path, nodes) -> Context:
    """Two steps on the autograd thread; ``nodes``: (name, start, length, [(op, start, length, [(inner op, start,
    length)])]) per step, in µs from the step's start."""
    b, bw = TraceBuilder(), 77
    for s in range(2):
        t = 1_000 + s * 100_000
        b.step(s, t, 100_000)
        for name, start, length, ops in nodes:
            b.op("autograd::engine::evaluate_function: " + name, t + start, length, tid=bw)
            for op, o_start, o_len, inner in ops:
                b.op(op, t + o_start, o_len, tid=bw)
                for i_op, i_start, i_len in inner:
                    b.op(i_op, t + i_start, i_len, tid=bw)
    path = b.write(tmp_path / "built.json")
    tr = load_trace(str(path))
    return Context(tr, choose_window(tr, "0:2"))


def test_a_compiled_segment_s_node_prices_its_eager_forward_ops_too(tmp_path):
    """A checkpointed layer whose compiled code breaks its graph: its backward node (20 ms) runs an eager linear
    (8 ms) and the compiled piece (2 ms, an extern linear inside it) again: 10 ms, the inner linear not named apart."""
    ctx = _built(tmp_path, [("CompiledFunctionBackward", 10_000, 20_000, [
        ("aten::linear", 10_100, 8_000, []),
        ("CompiledFunction", 18_500, 2_000, [("aten::linear", 18_600, 1_000)])])])
    rc = recompute(ctx)
    assert (rc.nodes, rc.compiled, rc.host_ns) == (2, 2, 2 * 10_000_000)
    assert rc.forward_ops == {"aten::linear": 2, "CompiledFunction": 2}


def test_nodes_that_ran_a_compiled_forward_again_are_not_the_clean_baseline(tmp_path):
    """Three MmBackward0 a step: one (10 ms) runs a linear again, two (8 ms) a 6 ms compiled forward. None ran
    nothing, so the first is its whole 10 ms (not 10 - 8), the others their compiled forwards."""
    ctx = _built(tmp_path, [("MmBackward0", 10_000, 10_000, [("aten::linear", 10_100, 8_000, [])]),
                            ("MmBackward0", 30_000, 8_000, [("CompiledFunction", 30_100, 6_000, [])]),
                            ("MmBackward0", 50_000, 8_000, [("CompiledFunction", 50_100, 6_000, [])])])
    rc = recompute(ctx)
    assert (rc.nodes, rc.compiled) == (6, 4)
    assert rc.host_ns == 2 * (10_000_000 + 2 * 6_000_000)
