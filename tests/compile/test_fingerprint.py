"""Fingerprints and packs without torch: what differs, what it invalidates, what a pack may write."""

from __future__ import annotations

import json
import zipfile

import pytest

from torchdoctor.compile import cachepack, fingerprint

HERE = {"torch": "2.13.0", "python": "3.11.7", "threads": "2", "cpu_isa": "AVX2", "inductor.max_autotune": "False"}


def test_differences_name_the_caches_they_invalidate():
    there = dict(HERE, threads="1", **{"inductor.max_autotune": "True", "env.OMP_NUM_THREADS": "1"})
    found = fingerprint.diff(HERE, there)
    assert [d[0] for d in found] == ["env.OMP_NUM_THREADS", "inductor.max_autotune", "threads"]
    text = [fingerprint.explain(d) for d in found]
    assert text[2] == "threads: 2 -> 1 (invalidates fx_graph, aot_autograd, dynamo)"
    assert text[0] == "env.OMP_NUM_THREADS: (unset) -> 1 (invalidates fx_graph, aot_autograd)"
    assert fingerprint.incompatible(HERE, there) == []  # misses, not harm
    assert fingerprint.incompatible(HERE, dict(HERE, cpu_isa="AVX512")) == [("cpu_isa", "AVX2", "AVX512")]


def make_pack(path, fp, names):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("manifest.json", json.dumps({"format": cachepack.FORMAT, "fingerprint": fp, "artifacts": {}}))
        z.writestr("megacache.bin", b"blob")
        for name in names:
            z.writestr(name, b"x")


def test_a_pack_writes_only_kernel_files_inside_the_cache_directory(tmp_path):
    pack = tmp_path / "p.zip"
    make_pack(pack, HERE, ["kernels/ab/cab.so", "kernels/../evil.so", "kernels/ab/../../evil2.so", "../evil3",
                           "kernels/a/b/c.so", "kernels/ab/.."])
    loaded = []
    got = cachepack.load_into(str(pack), HERE, str(tmp_path / "cache"), loaded.append)
    assert loaded == [b"blob"] and got["kernels"] == 1
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "cache/ab/cab.so", "p.zip"]


def test_foreign_damaged_and_unknown_packs_are_refused_in_one_line(tmp_path):
    foreign = tmp_path / "f.zip"
    make_pack(foreign, dict(HERE, torch="2.14.1"), [])
    with pytest.raises(cachepack.PackError, match=r"made for another environment: torch: 2.14.1 -> 2.13.0 \(invalidates"):
        cachepack.load_into(str(foreign), HERE, str(tmp_path / "c"), lambda b: None)
    # A field this side could not read is unknown, not different.
    partial = {k: v for k, v in HERE.items() if k != "cpu_isa"}
    assert cachepack.load_into(str(_ok(tmp_path)), partial, str(tmp_path / "c"), lambda b: None)["kernels"] == 0
    cut = tmp_path / "cut.zip"
    cut.write_bytes(foreign.read_bytes()[:40])
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("manifest.json", json.dumps({"format": "something/9"}))
    for path, why in ((cut, "not a usable cache pack"), (other, "not a torchdoctor cache pack"),
                      (tmp_path / "missing.zip", "not a usable cache pack")):
        with pytest.raises(cachepack.PackError, match=why) as e:
            cachepack.open_pack(str(path))
        assert str(path) in str(e.value) and "\n" not in str(e.value)


def _ok(tmp_path):
    path = tmp_path / "ok.zip"
    make_pack(path, HERE, [])
    return path


def test_packing_a_run_without_compile_caches_says_so(tmp_path):
    with pytest.raises(cachepack.PackError, match="no compile caches recorded"):
        cachepack.pack(str(tmp_path), str(tmp_path / "x.zip"))


def test_a_run_whose_artefacts_were_too_large_to_keep_says_so(tmp_path):
    (tmp_path / "caches").mkdir()
    (tmp_path / "caches" / "rank0.json").write_text(json.dumps({"megacache_skipped": "900 MB, above 512 MiB"}))
    with pytest.raises(cachepack.PackError, match=r"not kept \(900 MB, above 512 MiB\)"):
        cachepack.pack(str(tmp_path), str(tmp_path / "x.zip"))
