"""Fuzz the compiled trace scanner (src/torchdoctor/trace/_scan.c) under AddressSanitizer and UBSan.

Not part of the test suite (pytest collects test_*.py only): it needs gcc's sanitizer runtimes and
runs for as long as it is told. It builds a sanitized copy of the scanner in a scratch folder, then
re-runs itself with that copy first on the path, the sanitizers preloaded and Python's own allocator
off (PYTHONMALLOC=malloc), so that every input, copied into an exactly sized numpy buffer, has a
malloc'd block of its own and a read one byte past its end is reported.

    .venv/bin/python tests/trace/fuzz_scan.py --seconds 120 --seed 1

Inputs: pieces of the real traces in tests/data and a built trace with every field the scanner
reads, damaged at random (bytes replaced by JSON's own characters, control and high bytes, runs
inserted or deleted, and cut anywhere: inside strings, escapes and numbers), scanned in fast and
exact mode, with and without a rest after the array. Exit 0 with a count of inputs when no sanitizer
reported; a report aborts the run with the sanitizer's stack.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TRACES = ["hta/a100_8rank_rank3.json.gz", "public/tbplugin_resnet50_workers0.json.gz",
          "hta/mi250_rocm_minitoy.json.gz", "hta/v100_2rank_rank1_memory.json.gz"]
SPECIAL = b'{}[]",:0123456789.-+eE \\u/nXtrfals\x00\x1f\x80\xff'


def build(scratch: Path) -> Path:
    """A sanitized build of _scan.c inside a copy of src/ under `scratch`; returns that src/."""
    src = scratch / "src"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(REPO / "src", src, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    out = src / "torchdoctor" / "trace" / ("_scan" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                    "-I" + sysconfig.get_paths()["include"], str(src / "torchdoctor" / "trace" / "_scan.c"),
                    "-o", str(out)], check=True)
    return src


def seeds() -> list[bytes]:
    sys.path.insert(0, str(REPO / "tests"))
    from kineto_builder import TraceBuilder

    out = []
    for name in TRACES:
        raw = gzip.decompress((REPO / "tests" / "data" / name).read_bytes())
        i = raw.index(b"[", raw.index(b'"traceEvents"'))
        for start in range(i + 1, min(len(raw), i + 400_000), 50_000):
            a = raw.find(b"{", start)
            b = raw.rfind(b"}, {", a, a + 6000)
            if 0 < a < b:
                out.append(b"[" + raw[a:b + 1] + b"]")
    tb = TraceBuilder(world_size=2)
    tb.gemm("aten::mm", 110.25, 20.5, [[64, 128], [128, 32]])
    tb.kernel("k", 300.001, 0.4, launch_at=280.0, blocks_per_sm=0.5, warps_per_sm=2.0, occupancy=6, grid=[1, 2, 3])
    tb.memory(320.0, 4096, 8192, 1 << 21)
    out.append(json.dumps(tb.document(as_list=True)).encode())
    out.append(b'[{"ph":"X","name":"a\\u00e9\\n","ts":1712195495519689.047,"dur":1e3,"pid":"x","tid":"25",'
               b'"args":{"Seq":"1","Input Dims":[[1]],"Input type":["f"]}}]')
    return out


def damage(doc: bytes, rng: random.Random) -> bytes:
    d = bytearray(doc)
    for _ in range(rng.randint(0, 6)):
        r, i = rng.random(), rng.randrange(len(d) + 1)
        if r < 0.4 and d:
            d[min(i, len(d) - 1)] = rng.choice(SPECIAL)
        elif r < 0.6:
            d[i:i] = bytes([rng.choice(SPECIAL)]) * rng.randint(1, 3)
        elif r < 0.8 and d:
            del d[i:i + rng.randint(1, 8)]
        else:
            d = d[:i]
    return bytes(d)


def fuzz(seconds: float, seed: int) -> int:
    import numpy as np

    from torchdoctor.trace import _scan

    # The sanitized copy, not the project's own build (an editable install's finder could win).
    assert _scan.__file__.startswith(os.environ["PYTHONPATH"]), _scan.__file__
    rng = random.Random(seed)
    docs = seeds()
    deadline = time.monotonic() + seconds
    n = read = 0
    while time.monotonic() < deadline:
        data = damage(rng.choice(docs), rng)
        # An exactly sized malloc'd block (numpy's data, PYTHONMALLOC=malloc): no slack past the end.
        buf = np.frombuffer(data, np.uint8).copy() if data else np.zeros(0, np.uint8)
        sc = _scan.Scanner(rng.getrandbits(64))
        got = sc.scan(memoryview(buf), rng.random() < 0.3, rng.random() < 0.3)
        n += 1
        read += got is not None
        if rng.random() < 0.05:  # the tables after a rollback, scanned again
            sc.rollback(0, 0, 0, 0)
            sc.scan(memoryview(buf), False)
    print(f"fuzz_scan: {n} inputs ({read} read, {n - read} given up), no sanitizer report")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scratch", default="/tmp/torchdoctor-fuzz-scan")
    a = ap.parse_args()
    if os.environ.get("TORCHDOCTOR_FUZZ") == "sanitized":
        return fuzz(a.seconds, a.seed)
    src = build(Path(a.scratch))
    runtimes = [subprocess.run(["gcc", f"-print-file-name={lib}"], capture_output=True, text=True, check=True)
                .stdout.strip() for lib in ("libasan.so", "libubsan.so")]
    env = {**os.environ, "TORCHDOCTOR_FUZZ": "sanitized", "PYTHONPATH": str(src), "PYTHONMALLOC": "malloc",
           "LD_PRELOAD": " ".join(runtimes), "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    return subprocess.run([sys.executable, __file__, "--seconds", str(a.seconds), "--seed", str(a.seed)],
                          env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
