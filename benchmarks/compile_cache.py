"""Cold vs warm compile of the bundled compiled demo, warm from a cache pack in an empty directory.

What it measures
    The compiled demo (torchdoctor.workloads.compiled, a small causal LM) with Inductor on this
    CPU, each run under ``torchdoctor run --profile-steps off`` in its own process tree:
    cold     an empty TORCHINDUCTOR_CACHE_DIR (A): every graph compiled, every C++ kernel built;
    pack     ``torchdoctor cache pack`` of the cold run;
    packed   another empty directory (B) with ``run --cache PACK``: the pack is all it has;
    again    A once more: a warm cache directory on the same machine (the best case);
    mega     another empty directory (C) loaded with the Mega-Cache artefacts alone (the pack
             without its kernel files): what ``torch.compiler.load_cache_artifacts`` gives by itself.
    Per run: torch.compile's seconds (the probe's compile_time_s, Dynamo + backend), the backend's
    share, the FX graph cache hits and misses, and the job's wall time. Ratios: cold / packed and
    cold / again of the compile seconds. Repeats (``-k``) rotate the order; the table shows each run.

How to run (from the repo root, nothing else running)
    .venv/bin/python benchmarks/compile_cache.py            # ~4 min, writes results/compile_cache.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
JOB = [PY, "-m", "torchdoctor.workloads.compiled", "--backend", "inductor", "--healthy", "--steps", "12"]


def td_run(out: str, cache_dir: str, *options: str) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache_dir, PYTHONPATH=os.path.join(ROOT, "src"))
    t = time.perf_counter()
    proc = subprocess.run([PY, "-m", "torchdoctor.runner", "--quiet", "--out", out, "--profile-steps", "off",
                           *options, "--", *JOB], env=env, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}): {proc.stderr[-2000:]}")
    with open(os.path.join(out, "run.json"), encoding="utf-8") as f:
        facts = next(e["facts"] for e in json.load(f)["ranks"] if e.get("facts"))
    c = facts.get("compile", {})
    counts = c.get("cache_counts", {})
    return {"wall_s": round(wall, 1), "compile_s": c.get("compile_time_s"), "backend_s": c.get("backend_s"),
            "hits": counts.get("fx_graph.hit", 0), "misses": counts.get("fx_graph.miss", 0),
            "pack": c.get("cache_pack")}


def mega_only(pack: str, out: str) -> str:
    """The pack without its kernel files."""
    with zipfile.ZipFile(pack) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            if not name.startswith("kernels/"):
                dst.writestr(name, src.read(name))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", "--repeats", type=int, default=1)
    ap.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results", "compile_cache.md"))
    a = ap.parse_args()
    rows = []
    started = time.time()
    for rep in range(a.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            d = {k: os.path.join(tmp, k) for k in ("A", "B", "C")}
            cold = td_run(os.path.join(tmp, "cold"), d["A"])
            pack = os.path.join(tmp, "pack.zip")
            subprocess.run([PY, "-m", "torchdoctor.cli", "cache", "pack", os.path.join(tmp, "cold"), pack], check=True,
                           env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")), capture_output=True)
            packed = td_run(os.path.join(tmp, "packed"), d["B"], "--cache", pack)
            again = td_run(os.path.join(tmp, "again"), d["A"])
            mega = td_run(os.path.join(tmp, "mega"), d["C"], "--cache", mega_only(pack, os.path.join(tmp, "mega.zip")))
            size = os.path.getsize(pack)
            rows.append({"repeat": rep, "pack_mb": round(size / 1e6, 2), "cold": cold, "packed": packed,
                         "again": again, "mega": mega})
            print(json.dumps(rows[-1]), flush=True)
            shutil.rmtree(tmp, ignore_errors=True)
    write(a.results, rows, time.time() - started)


def write(path: str, rows: list[dict], seconds: float) -> None:
    def ratio(kind: str) -> float:
        return statistics.median(r["cold"]["compile_s"] / r[kind]["compile_s"] for r in rows)

    lines = [
        "# Compile caches: cold, warm from a pack, warm in place (benchmarks/compile_cache.py)", "",
        f"Generated {_dt.datetime.now():%Y-%m-%d %H:%M} by `benchmarks/compile_cache.py -k {len(rows)}` in "
        f"{seconds / 60:.1f} min on {os.cpu_count()} CPUs, Python {platform.python_version()}; job: "
        f"`{' '.join(JOB[1:])}` under `torchdoctor run --profile-steps off`. compile s = torch.compile's "
        "seconds as the probe read them (Dynamo + AOTAutograd + Inductor).", "",
        "| repeat | run | cache directory | compile s | backend s | FX hits | FX misses | job wall s | pack |",
        "|---:|---|---|---:|---:|---:|---:|---:|---|",
    ]
    where = {"cold": "empty (A)", "packed": "empty (B) + the pack", "again": "A again (warm in place)",
             "mega": "empty (C) + Mega-Cache artefacts only"}
    for r in rows:
        for kind in ("cold", "packed", "again", "mega"):
            x = r[kind]
            lines.append(f"| {r['repeat']} | {kind} | {where[kind]} | {x['compile_s']:.1f} | {x['backend_s']:.1f} | "
                         f"{x['hits']} | {x['misses']} | {x['wall_s']} | {x['pack'] or '-'} |")
    lines += ["", f"Pack size: {rows[0]['pack_mb']} MB.", "",
              f"**Compile seconds, cold / warm from the pack: {ratio('packed'):.2f}x** (median over repeats); "
              f"cold / warm in place: {ratio('again'):.2f}x; cold / Mega-Cache artefacts alone: {ratio('mega'):.2f}x.", ""]
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    with open(path.replace(".md", ".json"), "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
