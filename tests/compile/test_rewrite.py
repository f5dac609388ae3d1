"""Data-dependent branches rewritten with torch.where (compile/rewrite.py) and validated in a child
Python (compile/rewrite_check.py), on source files written here."""

from __future__ import annotations

import textwrap

import pytest

from torchdoctor.compile.rewrite import rewrite
from torchdoctor.compile.rewrite_check import check

SOURCE = '''
import torch
CLIP = 8.0
SCALE = -2


class M(torch.nn.Module):
    def forward(self, h, g):
        if h.abs().max() > CLIP:           # line 8: one branch
            h = h.clamp(-CLIP, CLIP)
        if g.mean() > 0:                   # line 10: two names, both branches
            a = g * SCALE
            b = h + 1
        else:
            a = g
            b = h - 1
        if a.sum() > 0:                    # line 16: returns
            return a + b
        else:
            return a - b


def sick(x, y):
    if x.sum() > 0:                        # line 23: a print: not rewritten
        print("positive")
        y = x
    if x.max() > 1:                        # line 26: in place: not rewritten
        y.add_(1)
    if x.sum() > 0:                        # line 28: shapes differ: the rewrite broadcasts
        y = x.sum()
    else:
        y = x
    if x.sum() > 0:                        # line 32: reads self: cannot be checked alone
        y = self.scale * x
    return y
'''


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(SOURCE).lstrip("\n"))
    return str(path)


def test_assignments_and_returns_become_torch_where(source):
    one = rewrite(source, 8)
    assert one.rewritten == "h = torch.where(h.abs().max() > CLIP, h.clamp(-CLIP, CLIP), h)"
    assert one.names == ["h"] and one.constants == {"CLIP": 8.0} and one.result == ["h"]
    assert "-        if h.abs().max() > CLIP:" in one.diff and "+        h = torch.where(" in one.diff
    two = rewrite(source, 10)
    assert two.rewritten.splitlines() == ["a = torch.where(g.mean() > 0, g * SCALE, g)",
                                          "b = torch.where(g.mean() > 0, h + 1, h - 1)"]
    assert two.constants == {"SCALE": -2}
    ret = rewrite(source, 16)
    assert ret.rewritten == "return torch.where(a.sum() > 0, a + b, a - b)" and ret.result == ["return"]


def test_side_effects_are_never_rewritten(source):
    assert rewrite(source, 23) is None and rewrite(source, 26) is None
    assert rewrite(source, 3) is None and rewrite("/nonexistent.py", 1) is None


def test_the_check_validates_refutes_or_says_why_not(source):
    pytest.importorskip("torch")
    ok, why = check(rewrite(source, 8))
    assert ok is True and "both branches" in why and "fullgraph=True" in why
    ok, why = check(rewrite(source, 28))
    assert ok is False and "different values" in why
    ok, why = check(rewrite(source, 32))
    assert ok is None and why.startswith("not validated")
