"""Portable compile caches: a run's Mega-Cache artefacts and compiled kernels in one file, with the
fingerprint of the environment that made them (compile/fingerprint.py).

Why both: `torch.compiler.save_cache_artifacts()` carries the FX graph and AOTAutograd entries
(and Triton kernels, bundled into them on GPU), but not the C++ kernels Inductor builds on a CPU:
loaded alone on a fresh machine, every C++ kernel is compiled again on first use (measured on a
small MLP here: 26 s after loading the artefacts, 5 s with a warm cache directory, 38 s cold). The
pack adds the content-addressed kernel modules of the run's cache directory (`<2 chars>/c<hash>.*`).

Format: a zip file (stdlib; nothing in it is executed by torchdoctor) holding `manifest.json`
(FORMAT, the fingerprint, the source run's compile seconds and cache counters), `megacache.bin` and
`kernels/<2 chars>/<file>`. No torch here: `load_into` gets torch's loader from the caller.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from collections.abc import Callable
from typing import Any

from . import fingerprint

FORMAT = "torchdoctor-cache-pack/1"
# Kernel files packed at most (a cache directory shared by many jobs can hold gigabytes).
MAX_KERNEL_BYTES = 1 << 30
KERNEL_SUFFIXES = (".so", ".cpp", ".py", ".h", ".json")
RUN_CACHES = "caches"  # the run directory's folder the probe writes into (probe/compile_cache.py)


class PackError(Exception):
    """A pack, or a run directory, that cannot be used: the message is one line naming the file."""


class ForeignPack(PackError):
    """A well-formed pack made for another environment (INCOMPATIBLE fingerprint fields)."""


def kernel_files(cache_dir: str) -> list[tuple[str, str]]:
    """(path, name inside the pack) of the content-addressed kernel modules under `cache_dir`:
    files of its two-character folders (Inductor's code cache), up to MAX_KERNEL_BYTES."""
    out, total = [], 0
    try:
        folders = sorted(d for d in os.listdir(cache_dir) if len(d) == 2 and os.path.isdir(os.path.join(cache_dir, d)))
    except OSError:
        return []
    for d in folders:
        for name in sorted(os.listdir(os.path.join(cache_dir, d))):
            path = os.path.join(cache_dir, d, name)
            if not name.endswith(KERNEL_SUFFIXES) or not os.path.isfile(path):
                continue
            total += os.path.getsize(path)
            if total > MAX_KERNEL_BYTES:
                return out
            out.append((path, f"kernels/{d}/{name}"))
    return out


def read_run(run_dir: str) -> dict[str, Any]:
    """The compile-cache record the probe wrote for the run's first rank that compiled."""
    folder = os.path.join(run_dir, RUN_CACHES)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    except OSError:
        raise PackError(f"{run_dir}: no compile caches recorded (the job did not compile, or ran without "
                        "`torchdoctor run`)") from None
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError) as exc:
            raise PackError(f"{os.path.join(folder, name)}: unreadable ({exc})") from None
        if isinstance(record, dict) and record.get("megacache"):
            record["_dir"] = folder
            return record
        if isinstance(record, dict) and record.get("megacache_skipped"):
            raise PackError(f"{run_dir}: its Mega-Cache artefacts were not kept ({record['megacache_skipped']})")
    raise PackError(f"{run_dir}: the run saved no Mega-Cache artefacts (torch without "
                    "torch.compiler.save_cache_artifacts, or nothing compiled)")


def pack(run_dir: str, out: str) -> dict[str, Any]:
    """Write the pack of `run_dir` to `out`; returns its manifest."""
    record = read_run(run_dir)
    blob_path = os.path.join(record["_dir"], record["megacache"])
    kernels = kernel_files(record["cache_dir"]) if record.get("cache_dir") else []
    manifest = {"format": FORMAT, "fingerprint": record.get("fingerprint", {}),
                "compile_time_s": record.get("compile_time_s"), "counters": record.get("counters", {}),
                "artifacts": record.get("artifacts", {}), "kernels": len(kernels), "source_run": os.path.abspath(run_dir),
                "graphs": record.get("graphs", [])}
    tmp = f"{out}.tmp{os.getpid()}"
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("manifest.json", json.dumps(manifest, indent=1, sort_keys=True))
            z.write(blob_path, "megacache.bin")
            for path, name in kernels:
                z.write(path, name)
        os.replace(tmp, out)
    except OSError as exc:
        raise PackError(f"{out}: {exc.strerror or exc}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return manifest


def open_pack(path: str) -> tuple[zipfile.ZipFile, dict[str, Any]]:
    """The pack's zip and manifest; PackError for anything that is not a complete pack."""
    try:
        z = zipfile.ZipFile(path)
        manifest = json.loads(z.read("manifest.json"))
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise PackError(f"{path}: not a torchdoctor cache pack (format {manifest.get('format')!r})"
                            if isinstance(manifest, dict) else f"{path}: not a torchdoctor cache pack")
        if z.testzip() is not None or "megacache.bin" not in z.namelist():
            raise PackError(f"{path}: truncated or damaged cache pack")
        return z, manifest
    except PackError:
        raise
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, EOFError) as exc:
        raise PackError(f"{path}: not a usable cache pack ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def load_into(path: str, here: dict[str, str], cache_dir: str, load_artifacts: Callable[[bytes], Any]
              ) -> dict[str, Any]:
    """Check the pack against this environment's fingerprint `here`, then load its artefacts (with
    torch's `load_artifacts`) and copy its kernels into `cache_dir`. Returns what was loaded;
    PackError (naming the first incompatible field) when it must not be used here."""
    z, manifest = open_pack(path)
    with z:
        theirs = manifest.get("fingerprint", {})
        # A field one side could not read is unknown, not different.
        bad = [d for d in fingerprint.incompatible(theirs, here) if d[1] is not None and d[2] is not None]
        if bad:
            raise ForeignPack(f"{path}: made for another environment: " + "; ".join(fingerprint.explain(d) for d in bad))
        load_artifacts(z.read("megacache.bin"))
        copied = 0
        for name in z.namelist():
            parts = name.split("/")
            # Only kernels/<2 chars>/<file>: a crafted name cannot write outside the cache directory.
            if len(parts) != 3 or parts[0] != "kernels" or len(parts[1]) != 2 or parts[2] in ("", ".", ".."):
                continue
            if not parts[1].isalnum() or os.sep in parts[2] or (os.altsep and os.altsep in parts[2]):
                continue
            dest_dir = os.path.join(cache_dir, parts[1])
            dest = os.path.join(dest_dir, parts[2])
            if os.path.exists(dest):
                continue
            os.makedirs(dest_dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=".td-")
            with os.fdopen(fd, "wb") as f:
                f.write(z.read(name))
            os.chmod(tmp, 0o755 if parts[2].endswith(".so") else 0o644)
            os.replace(tmp, dest)  # atomic: ranks loading the same pack race harmlessly
            copied += 1
    soft = [d for d in fingerprint.diff(theirs, here) if d[0] not in fingerprint.INCOMPATIBLE
            and d[1] is not None and d[2] is not None and fingerprint.invalidates(d[0])]
    return {"file": path, "kernels": copied, "artifacts": manifest.get("artifacts", {}),
            "cold_compile_s": manifest.get("compile_time_s"), "expect_misses": [fingerprint.explain(d) for d in soft]}
