"""The permanent code change for kept remedies: a unified diff against the user's call site when
the job recorded it (``file:line`` of the DataLoader / DDP / optimizer constructor call), else a
snippet. The user's files are only read, never written.
"""

from __future__ import annotations

import ast
import difflib
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..advice import checkpointing, fsdp, optimizer
from ..advice.framework_settings import (
    CLI_OPTIONS,
    CONFIG_DICTS,
    PREFIXED,
    VALIDATION_SETTINGS,
    call_owner,
    cli_snippet,
    config_dict_snippet,
    entry_snippet,
    prefixed_snippet,
    trainer_snippet,
)
from ..advice.matmul import TORCHTUNE
from .catalogue import BY_ID, WITH_WORKERS_ONLY


@dataclass
class Change:
    ids: list[str]
    where: str  # "file:line" or "start-up"
    text: str
    language: str  # diff | python | shell | yaml


def _offsets(src: bytes) -> list[int]:
    starts = [0]
    for i, b in enumerate(src):
        if b == 10:
            starts.append(i + 1)
    return starts


def _call_at(tree: ast.AST, line: int) -> ast.Call | None:
    """The outermost call that starts on ``line`` (the line a frame reports for a call)."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno == line]
    return min(calls, key=lambda n: n.col_offset, default=None)


def as_code(value: Any) -> str:
    """A remedy's value as Python source: its repr, or the text of {"code": TEXT} (an enum member
    such as BackwardPrefetch.BACKWARD_PRE, which has no literal repr and must survive JSON)."""
    if isinstance(value, dict) and isinstance(value.get("code"), str):
        return value["code"]
    return repr(value)


def edited_call(src: bytes, call: ast.Call, changes: dict[str, Any]) -> bytes | None:
    """``src`` with ``changes`` set as keyword arguments of ``call``; None when it cannot say how."""
    starts = _offsets(src)

    def pos(line: int, col: int) -> int:
        return starts[line - 1] + col

    edits: list[tuple[int, int, bytes]] = []
    appended: list[str] = []
    for key, value in changes.items():
        kw = next((k for k in call.keywords if k.arg == key), None)
        if kw is not None:
            v = kw.value
            assert v.end_lineno is not None and v.end_col_offset is not None
            edits.append((pos(v.lineno, v.col_offset), pos(v.end_lineno, v.end_col_offset), as_code(value).encode()))
        elif any(k.arg is None for k in call.keywords):
            return None  # **kwargs may already carry it
        else:
            appended.append(f"{key}={as_code(value)}")
    if appended:
        assert call.end_lineno is not None and call.end_col_offset is not None
        close = pos(call.end_lineno, call.end_col_offset) - 1  # the closing parenthesis
        i = close - 1
        while i >= 0 and src[i:i + 1] in (b" ", b"\n", b"\t", b"\r"):
            i -= 1
        has_args = bool(call.args or call.keywords)
        sep = " " if src[i:i + 1] == b"," else (", " if has_args else "")
        tail = "," if src[i:i + 1] == b"," else ""
        edits.append((i + 1, i + 1, (sep + ", ".join(appended) + tail).encode()))
    out = src
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return out


def call_site_diff(site: str, changes: dict[str, Any]) -> str | None:
    path, _, line = site.rpartition(":")
    if not (path and line.isdigit() and os.path.isfile(path)):
        return None
    try:
        with open(path, "rb") as f:
            src = f.read()
        call = _call_at(ast.parse(src), int(line))
        new = edited_call(src, call, changes) if call is not None else None
    except (OSError, SyntaxError, ValueError):
        return None
    if new is None or new == src:
        return None
    rel = os.path.relpath(path)
    old_name, new_name = (f"a/{rel}", f"b/{rel}") if not rel.startswith("..") else (path, path)
    diff = difflib.unified_diff(src.decode(errors="replace").splitlines(keepends=True),
                                new.decode(errors="replace").splitlines(keepends=True), old_name, new_name, n=2)
    return "".join(diff)


def changes_for(kept: list[str], applied: dict[str, list[dict[str, Any]]], command: str | None = None) -> list[Change]:
    """The code changes that make the kept remedies permanent, grouped by call site; ``command``:
    the job's command line, for a change made on it (a library's command-line option)."""
    by_site: dict[tuple[str, str], dict[str, Any]] = {}
    ids_at: dict[tuple[str, str], list[str]] = {}
    flags: list[Change] = []
    notes: list[Change] = []
    for rid in kept:
        remedy = BY_ID[rid]
        entries = [e for e in applied.get(rid, []) if e.get("site") and remedy.target]
        idle = _unexercised(entries)
        if idle:
            entries = [e for e in entries if e["site"] not in idle]
            notes.append(Change([rid], "left out", "\n".join(
                f"# {site}: {IDLE_WHY.get(rid, 'the change never took effect in the measured runs')}"
                for site in sorted(idle)), "python"))
            if not entries:
                # Loaders a library built (no site of the user's) still get their settings' snippet.
                built = [e for e in applied.get(rid, []) if not e.get("site")]
                if built:
                    flags.append(_snippet(rid, built, command))
                continue
        for e in entries:
            key = (e["target"], e["site"])
            by_site.setdefault(key, {}).update(e["set"])
            ids_at.setdefault(key, [])
            if rid not in ids_at[key]:
                ids_at[key].append(rid)
        if not entries:
            flags.append(_snippet(rid, applied.get(rid, []), command))
    out = []
    for (target, site), kwargs in by_site.items():
        diff = call_site_diff(site, kwargs)
        args = ", ".join(f"{k}={as_code(v)}" for k, v in kwargs.items())
        out.append(Change(ids_at[(target, site)], site, diff or f"{target}(..., {args})",
                          "diff" if diff else "python"))
    return out + flags + notes


def _also(library: str | None) -> str:
    """A comment line naming the validation loader's settings, where the library has them apart."""
    key = VALIDATION_SETTINGS.get(library or "")
    return (f"\n# and {key}, if the job validates: fix changed every loader {library} built" if key else "")


# Why a remedy's change at a call site that never exercised it is not suggested there.
IDLE_WHY = {
    "dataloader.persistent_workers": "not iterated a second time in the measured runs, so persistent workers "
                                     "changed nothing there (they only keep its worker processes alive between "
                                     "iterations); a loader read once would keep them idle. If the whole job "
                                     "iterates it again, measure it with more --steps",
}


def _unexercised(entries: list[dict[str, Any]]) -> set[str]:
    """Sites of a tracked remedy (entries carry `exercised`) where no process exercised its change."""
    tracked = [e for e in entries if "exercised" in e]
    return {e["site"] for e in tracked} - {e["site"] for e in tracked if e["exercised"]}


def _snippet(rid: str, entries: list[dict[str, Any]], command: str | None = None) -> Change:
    remedy = BY_ID[rid]
    if rid == "threads.affinity" and entries:
        n = entries[0]["set"].get("torch.set_num_threads")
        if n:
            return Change([rid], "start-up", f"torch.set_num_threads({n})  # per rank, or OMP_NUM_THREADS={n}",
                          "python")
    if rid == "debug.off":
        names = [k for e in entries if e.get("target") == "environment" for k in e["set"]]
        lines = [f"unset {' '.join(names)}"] if names else []
        if any(e.get("target") == "torch.autograd" for e in entries):
            lines.append("# remove torch.autograd.set_detect_anomaly(True) / detect_anomaly() from the job")
        return Change([rid], "start-up", "\n".join(lines) or remedy.snippet, "shell")
    if rid == "memory.expandable_segments":
        return Change([rid], "start-up", remedy.snippet, "shell")
    if rid == "memory.no_checkpoint":
        return _no_checkpoint(entries)
    if rid == "matmul.contiguous_input" and entries:
        return _contiguous_input(entries)
    if rid == "fsdp.keep_unsharded" and entries and not any(e.get("site") for e in entries):
        libraries = {e.get("library") for e in entries}
        if len(libraries) == 1 and (lib := next(iter(libraries))) in fsdp.RESHARD_SETTINGS:
            where, change = fsdp.RESHARD_SETTINGS[lib]
            return Change([rid], f"{lib} calls fully_shard: {where}", change, "yaml")
    if rid == "optim.fused" and entries and not any(e.get("site") for e in entries):
        libraries = {e.get("library") for e in entries}
        targets = {e.get("target") for e in entries}
        if len(libraries) == 1 and len(targets) == 1:
            library = next(iter(libraries))
            lib = optimizer.library_fix(library, next(iter(targets)), command or "python train.py ...")
            if lib is not None:
                return Change([rid], f"{library}'s setting (it builds the optimizer)", f"# {lib[0]}\n{lib[1]}",
                              lib[2])
    if remedy.target and entries:
        kwargs = {k: v for e in entries for k, v in e["set"].items()}
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        libraries = {e.get("library") for e in entries}
        kind = {"DataLoader": "DataLoader", "DistributedDataParallel": "DDP"}.get(remedy.target)
        if kind and libraries == {"transformers"}:
            code = trainer_snippet(f"{kind}(..., {args})", kind)
            if code is not None:  # the Trainer builds the loader / wraps the model from these fields
                return Change([rid], f"TrainingArguments (transformers' Trainer builds the {remedy.target})", code,
                              "python")
        if len(libraries) == 1 and (lib := next(iter(libraries))) and (lib, remedy.target) in PREFIXED:
            owners = {call_owner(e.get("entry")) for e in entries} - {None}
            owner = owners.pop() if len(owners) == 1 else None  # NeuralNetClassifier, from its fit / predict
            code = prefixed_snippet(f"{remedy.target}(..., {args})", remedy.target, lib, owner)
            if code is not None:
                return Change([rid], f"{lib} builds the {remedy.target}: its {owner or lib}(...) parameters", code,
                              "python")
        if len(libraries) == 1 and (lib := next(iter(libraries))) and (lib, remedy.target) in CLI_OPTIONS:
            # Without workers the remedy turned off what torch refuses without them (litdata's loader had a
            # prefetch_factor of its own): the library sets those from its worker count, not an option to give.
            said = {k: v for k, v in kwargs.items() if not (kwargs.get("num_workers") == 0 and k in WITH_WORKERS_ONLY)}
            code = cli_snippet(f"{remedy.target}(..., {', '.join(f'{k}={v!r}' for k, v in said.items())})",
                               remedy.target, lib)
            if code is not None:  # open_clip_train: num_workers=args.workers
                return Change([rid], f"{lib} builds the {remedy.target}: its command line", code, "shell")
        if len(libraries) == 1 and (lib := next(iter(libraries))) and (lib, remedy.target) in CONFIG_DICTS:
            code = config_dict_snippet(f"{remedy.target}(..., {args})", remedy.target, lib)
            if code is not None:  # mmengine's Runner: DataLoader(..., **train_dataloader)
                key = CONFIG_DICTS[(lib, remedy.target)][0]
                return Change([rid], f"{lib} builds the {remedy.target}: its {key} dict (the config, or Runner(...))",
                              code + _also(lib), "python")
        made = {(e.get("library"), e.get("entry")) for e in entries}
        if kind and len(made) == 1 and (lib_call := next(iter(made)))[1]:
            # A library function that passes its keyword arguments (or a dict of them) on to the
            # constructor: speechbrain's Brain.fit(..., train_loader_kwargs={...}) (FORWARDS).
            called = SimpleNamespace(created_by=lib_call[0], library_call=lib_call[1], library_caller=None,
                                     call_site=None, library_call_params=[])
            code = entry_snippet(f"{kind}(..., {args})", kind, called)
            if code is not None:
                return Change([rid], f"{lib_call[0]}'s {lib_call[1]}() passes it on to the {remedy.target}",
                              code + _also(lib_call[0]), "python")
        # The first loader a library builds is where its settings are (a copy, accelerate's, comes later).
        built = next((e["library_site"] for e in entries if e.get("library_site")), None)
        where = (f"inside {', '.join(sorted(x for x in libraries if x))} (change it through its settings"
                 + (f" if it has one, or where it builds the {remedy.target}, at {built})" if built else ")")
                 if all(libraries) else "unknown call site")
        return Change([rid], where, f"{remedy.target}(..., {args})", "python")
    return Change([rid], "start-up", remedy.snippet or remedy.changes, "python")


def _origins(entries: list[dict[str, Any]]) -> tuple[list[str], list[str], str]:
    """(the job's lines a remedy changed, the libraries whose code made the calls without such a line, those
    lines as text: the first three)."""
    sites = sorted({e["site"] for e in entries if e.get("site")})
    libraries = sorted({e["library"] for e in entries if e.get("library") and not e.get("site")})
    return sites, libraries, ", ".join(sites[:3]) + (" ..." if len(sites) > 3 else "")


def _contiguous_input(entries: list[dict[str, Any]]) -> Change:
    """Where the projection runs: torchtune's loss setting when torchtune's code made the call (its chunked
    output, rules/weight_copies.py), else the job's lines that call F.linear with such an input."""
    rid = "matmul.contiguous_input"
    sites, libraries, listed = _origins(entries)
    if libraries == ["torchtune"] and not sites:
        # Not the change `fix` measured (that is torchtune's chunk, folded): the nearest one a config can make.
        return Change([rid], "torchtune's config (its chunked output loss; not what fix measured: the logits in "
                      "one piece take batch x sequence x vocabulary of memory)", TORCHTUNE[1], "yaml")
    where = listed or (
        f"inside {', '.join(libraries)} (its code calls F.linear with the input)" if libraries else "start-up")
    return Change([rid], where, BY_ID[rid].snippet, "python")


def _no_checkpoint(entries: list[dict[str, Any]]) -> Change:
    """Where the job checkpoints: the library's setting when a library's code made the calls
    (advice/checkpointing.py); torch's checkpoint_wrapper or checkpoint_sequential, which the job's
    line reached (the site skips torch's frames); else the job's own call, made a plain call."""
    rid = "memory.no_checkpoint"
    sites, libraries, where = _origins(entries)
    via = {e["set"].get("via") for e in entries} - {None}
    if len(libraries) == 1 and not sites and libraries[0] in checkpointing.SETTINGS:
        why, code = checkpointing.SETTINGS[libraries[0]]
        return Change([rid], f"the setting that turns it on in {libraries[0]}", f"# {why}\n{code}",
                      checkpointing.LANGUAGE.get(libraries[0], "python"))
    if sites and via:
        code = "\n".join(checkpointing.VIA[v] for v in sorted(via) if v in checkpointing.VIA)
        return Change([rid], f"{where} (through torch's {' and '.join(sorted(via))})", code, "python")
    if sites:
        return Change([rid], where, "# call the segment directly where memory allows:\n" + checkpointing.OWN_CALL[1],
                      "python")
    where = f"inside {', '.join(libraries)} (its activation checkpointing setting)" if libraries else "start-up"
    return Change([rid], where, BY_ID[rid].snippet, "python")
