"""`torchdoctor cache`: compile caches that CI can trust.

- ``cache pack RUN_DIR FILE``: the Mega-Cache artefacts and kernels a `torchdoctor run` of a compiled
  job saved, with its environment's fingerprint, in one file (compile/cachepack.py). No torch.
- ``cache load FILE``: load a pack into this machine's Inductor cache directory before a job runs
  (or use ``torchdoctor run --cache FILE``); refused with one line when made for another environment.
- ``cache diff A B``: two runs (or packs): the fingerprint fields that differ and the caches each
  invalidates, and the hits and misses of each run. No torch.

Exit codes: 0 done (diff: same fingerprint), 1 refused (diff: they differ), 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from . import cachepack, fingerprint, history

EXIT_OK, EXIT_DIFFERENT, EXIT_BAD = 0, 1, 2


def add_cache_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="pack, load and compare torch.compile caches (for CI and many ranks)",
                       description=__doc__.split("\n\n")[1] if __doc__ else None)
    verbs = p.add_subparsers(dest="verb", required=True)
    a = verbs.add_parser("pack", help="pack a run's compile caches and fingerprint into FILE")
    a.add_argument("run_dir")
    a.add_argument("file")
    a.set_defaults(func=cmd_pack)
    b = verbs.add_parser("load", help="load a pack into this machine's Inductor cache (imports torch)")
    b.add_argument("file")
    b.set_defaults(func=cmd_load)
    c = verbs.add_parser("diff", help="what differs between two runs' (or packs') compile environments")
    c.add_argument("a")
    c.add_argument("b")
    c.set_defaults(func=cmd_diff)


def _fail(message: str, code: int = EXIT_BAD) -> int:
    print(f"torchdoctor: cache: {message}", file=sys.stderr)
    return code


def cmd_pack(args: argparse.Namespace) -> int:
    try:
        m = cachepack.pack(args.run_dir, args.file)
    except cachepack.PackError as exc:
        return _fail(str(exc))
    arts = ", ".join(f"{n} {k}" for k, n in sorted(m["artifacts"].items())) or "no artefact counts"
    print(f"{args.file}: {arts} entries, {m['kernels']} kernel files; fingerprint of {len(m['fingerprint'])} fields "
          f"(torch {m['fingerprint'].get('torch', '?')}, python {m['fingerprint'].get('python', '?')})")
    return EXIT_OK


def cmd_load(args: argparse.Namespace) -> int:
    try:
        import torch
        import torch._inductor.codecache  # noqa: F401  (torch_key: the sources' hash in the fingerprint)
        import torch._inductor.runtime.cache_dir_utils  # noqa: F401
    except ImportError as exc:
        return _fail(f"{args.file}: loading needs torch with Inductor ({exc})")
    loader = getattr(torch.compiler, "load_cache_artifacts", None)
    where = fingerprint.cache_dir(torch)
    if loader is None or not where:
        return _fail(f"{args.file}: this torch cannot load cache artefacts (torch.compiler.load_cache_artifacts, 2.7+)")
    try:
        got = cachepack.load_into(args.file, fingerprint.collect(torch), where, loader)
    except cachepack.ForeignPack as exc:
        return _fail(str(exc), EXIT_DIFFERENT)
    except cachepack.PackError as exc:
        return _fail(str(exc))
    print(f"{args.file}: loaded into {where} ({got['kernels']} kernel files copied)")
    for line in got["expect_misses"]:
        print(f"  expect misses: {line}")
    return EXIT_OK


def side(path: str) -> dict[str, Any]:
    """A run directory's (first compiling rank's) or a pack's compile record."""
    if os.path.isdir(path):
        got = history.record(path)
        if got is None:
            raise cachepack.PackError(f"{path}: no compile caches recorded (a `torchdoctor run` of a job "
                                      "that compiled writes them)")
        return got[0]
    z, manifest = cachepack.open_pack(path)
    z.close()
    return manifest


def counts_text(record: dict[str, Any]) -> str:
    c = record.get("counters") or {}
    parts = [f"{k} {c[k]}" for k in sorted(c)]
    s = record.get("compile_time_s")
    return (", ".join(parts) or "no cache counters") + (f"; compile {s:.1f} s" if isinstance(s, (int, float)) else "")


def graphs_text(a: list[dict], b: list[dict]) -> tuple[bool | None, str]:
    """(same graphs?, in words) from the runs' device-agnostic graph records; None: not recorded."""
    if not a or not b:
        return None, "graphs: not recorded on both sides"
    if [g["hash"] for g in a] == [g["hash"] for g in b]:
        return True, f"same {len(a)} graph(s) (device-agnostic hashes equal)"
    for i, (ga, gb) in enumerate(zip(a, b, strict=False)):
        if ga["hash"] != gb["hash"]:
            at = next((k for k, (x, y) in enumerate(zip(ga["nodes"], gb["nodes"], strict=False)) if x != y),
                      min(len(ga["nodes"]), len(gb["nodes"])))
            x = ga["nodes"][at] if at < len(ga["nodes"]) else "(end)"
            y = gb["nodes"][at] if at < len(gb["nodes"]) else "(end)"
            return False, f"graph {i + 1} differs at node {at + 1}: A `{x}`, B `{y}`"
    return False, f"A captured {len(a)} graph(s), B {len(b)}; the first {min(len(a), len(b))} are equal"


DEVICE_FIELDS = ("device", "cuda", "hip", "triton", "cpu_isa")


def cmd_diff(args: argparse.Namespace) -> int:
    try:
        a, b = side(args.a), side(args.b)
    except cachepack.PackError as exc:
        return _fail(str(exc))
    fa, fb = a.get("fingerprint") or {}, b.get("fingerprint") or {}
    found = fingerprint.diff(fa, fb)
    print(f"A {args.a}: {counts_text(a)}")
    print(f"B {args.b}: {counts_text(b)}")
    same_graphs, text = graphs_text(a.get("graphs") or [], b.get("graphs") or [])
    print(text)
    if same_graphs and found and all(d[0] in DEVICE_FIELDS for d in found):
        print("same graphs, different device: safe to share the graphs, not the compiled kernels")
    if not found:
        print(f"same environment: {len(fa)} fingerprint fields equal")
        da, db = a.get("cache_dir"), b.get("cache_dir")
        misses = (b.get("counters") or {}).get("fx_graph.miss", 0)
        if misses and da and db and da != db:
            print(f"B's {misses} FX graph miss(es) with the same fingerprint: another cache directory ({db}, A used {da}); "
                  "load A's pack there (`torchdoctor cache pack` / `run --cache`) or share the directory")
        return EXIT_OK if same_graphs is not False else EXIT_DIFFERENT
    print(f"{len(found)} field(s) differ:")
    for d in found:
        print(f"  {fingerprint.explain(d)}")
    return EXIT_DIFFERENT
