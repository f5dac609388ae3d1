from __future__ import annotations

import numpy as np
import pytest

from torchdoctor.metrics import intervals as iv


def brute(starts, ends, lo=0, hi=250):
    cover = np.zeros(hi - lo, bool)
    for s, e in zip(starts, ends, strict=True):
        cover[max(s, lo) - lo:max(min(e, hi), lo) - lo] = True
    return cover


def as_mask(ivs, lo=0, hi=250):
    return brute(ivs[0].tolist(), ivs[1].tolist(), lo, hi)


@pytest.mark.parametrize("seed", range(20))
def test_set_algebra_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    a_s = rng.integers(0, 190, 15)
    a_e = a_s + rng.integers(0, 20, 15)
    b_s = rng.integers(0, 190, 10)
    b_e = b_s + rng.integers(0, 20, 10)
    a, b = iv.union(a_s, a_e), iv.union(b_s, b_e)
    ma, mb = brute(a_s, a_e), brute(b_s, b_e)
    assert (as_mask(a) == ma).all()
    assert iv.total(a) == ma.sum()
    assert (as_mask(iv.intersect(a, b)) == (ma & mb)).all()
    assert (as_mask(iv.subtract(a, b)) == (ma & ~mb)).all()
    assert (as_mask(iv.complement(a, 30, 170), 0, 250)[30:170] == ~ma[30:170]).all()
    # Disjoint and sorted.
    s, e = iv.intersect(a, b)
    assert (e > s).all() and (s[1:] > e[:-1]).all()
    qs = rng.integers(0, 190, 8)
    qe = qs + rng.integers(0, 40, 8)
    got = iv.covered_by(qs, qe, a)
    want = [int(ma[s:min(e, 250)].sum()) for s, e in zip(qs, qe, strict=True)]
    assert got.tolist() == want


def test_zero_length_intervals_vanish_and_touching_ones_merge():
    s, e = iv.union(np.array([0, 5, 10, 10]), np.array([5, 10, 10, 12]))
    assert s.tolist() == [0] and e.tolist() == [12]
    assert iv.total(iv.union(np.array([3]), np.array([3]))) == 0
