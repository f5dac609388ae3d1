"""Device-agnostic graph hashes (probe/compile_cache.py): equal graphs hash equal whatever the
device, a changed shape or op changes the hash, and the probe records every captured graph."""

from __future__ import annotations

import torch

from torchdoctor.probe import compile_cache


def captured(fn, *inputs) -> list:
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*inputs)
    return graphs


def f(x, w):
    return torch.nn.functional.gelu(x @ w).sum(dim=-1)


def test_the_same_graph_hashes_equal_and_a_new_shape_or_op_does_not():
    (a,) = captured(f, torch.randn(4, 8), torch.randn(8, 3))
    (b,) = captured(f, torch.randn(4, 8), torch.randn(8, 3))
    (c,) = captured(f, torch.randn(5, 8), torch.randn(8, 3))
    (d,) = captured(lambda x, w: torch.relu(x @ w).sum(dim=-1), torch.randn(4, 8), torch.randn(8, 3))
    sa, sb, sc, sd = (compile_cache.graph_signature(g) for g in (a, b, c, d))
    assert sa["hash"] == sb["hash"] and sa["ops"] == 3
    assert sa["nodes"][:2] == ["input float32[4,8]", "input float32[8,3]"]
    assert sc["hash"] != sa["hash"] and "input float32[5,8]" in sc["nodes"]
    assert sd["hash"] != sa["hash"]
    # The device is not part of it: the same graph's values moved to another device hash the same.
    for node in a.graph.nodes:
        v = node.meta.get("example_value")
        if isinstance(v, torch.Tensor):
            node.meta["example_value"] = torch.empty(v.shape, dtype=v.dtype, device="meta")
    assert compile_cache.graph_signature(a)["hash"] == sa["hash"]


def test_each_node_s_op_is_kept_beside_its_line():
    """Node names are the user's variable names; the fusion report matches C++ kernels by the ops."""
    def g(x, w):
        y = x @ w
        z = torch.nn.functional.gelu(y) + y
        return z.sum(dim=-1)

    (gm,) = captured(g, torch.randn(4, 8), torch.randn(8, 3))
    sig = compile_cache.graph_signature(gm)
    ops = [sig["node_ops"][n] for n in sig["lines"] if n in sig["node_ops"]]
    assert ops == ["matmul", "gelu", "add", "sum"]
    assert set(sig["node_ops"]) <= set(sig["lines"])
