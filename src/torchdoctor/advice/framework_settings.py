"""Where a DataLoader or DDP setting is changed: the user's own call, or the framework's knob.

Hugging Face's Trainer builds the DataLoader and wraps the model in DDP itself, from its
TrainingArguments (transformers/trainer.py: `get_train_dataloader` passes num_workers=args.
dataloader_num_workers, pin_memory=args.dataloader_pin_memory, persistent_workers=args.
dataloader_persistent_workers, prefetch_factor=args.dataloader_prefetch_factor; the DDP kwargs
handler takes find_unused_parameters, bucket_cap_mb, broadcast_buffers and static_graph from
args.ddp_*). A user of it has no DataLoader(...) or DDP(...) line to edit, and a patch to the
installed transformers is no fix: the advice names the TrainingArguments fields instead.

Other libraries build the object inside a function the user's code calls (timm's
`create_loader(dataset, ..., num_workers=..., persistent_workers=...)`): when that function takes
the settings as parameters of its own (the probe records its parameter names), the advice is that
call with those arguments, at the user's line that makes it.
"""

from __future__ import annotations

import re
from typing import Protocol

from ..rules.model import Fix

# The constructor's argument -> the TrainingArguments field that sets it (transformers >= 4.36;
# ddp_static_graph since 4.42). An argument missing here has no field.
TRAINING_ARGUMENTS = {
    "DataLoader": {
        "num_workers": "dataloader_num_workers",
        "pin_memory": "dataloader_pin_memory",
        "persistent_workers": "dataloader_persistent_workers",
        "prefetch_factor": "dataloader_prefetch_factor",
    },
    "DDP": {
        "find_unused_parameters": "ddp_find_unused_parameters",
        "bucket_cap_mb": "ddp_bucket_cap_mb",
        "broadcast_buffers": "ddp_broadcast_buffers",
        "static_graph": "ddp_static_graph",
    },
}
NOUN = {"DataLoader": "DataLoader", "DDP": "DistributedDataParallel wrapper"}
# Library functions that hand settings they do not name on to the constructor they call: (library,
# function) -> (the object, the parameter taking them as a dict or None for **kwargs, the settings it
# changes on the way). From their signatures and sources: Ignite's idist.auto_model(model,
# sync_bn=False, **kwargs) builds DistributedDataParallel(model, **kwargs), and auto_dataloader(dataset,
# **kwargs) DataLoader(dataset, **kwargs) after dividing batch_size and num_workers by the processes
# per node (ignite 0.5.5); Ray Train's prepare_model(model, ..., parallel_strategy_kwargs=None) builds
# DistributedDataParallel(model, **parallel_strategy_kwargs) (ray 2.60); speechbrain's Brain.fit(
# epoch_counter, train_set, ..., train_loader_kwargs={}) builds its loader in make_dataloader as
# SaveableDataLoader(dataset, **train_loader_kwargs), setting only collate_fn and a sampler for
# shuffle=True on the way (speechbrain 1.1, core.py and dataio/dataloader.py).
FORWARDS: dict[tuple[str, str], tuple[str, str | None, frozenset[str]]] = {
    ("ignite", "auto_model"): ("DDP", None, frozenset()),
    ("ignite", "auto_dataloader"): ("DataLoader", None, frozenset({"batch_size", "num_workers"})),
    ("ray", "prepare_model"): ("DDP", "parallel_strategy_kwargs", frozenset()),
    ("speechbrain", "fit"): ("DataLoader", "train_loader_kwargs", frozenset({"sampler", "collate_fn"})),
}
# Libraries that build the object from prefixed parameters of their own, set where the user creates
# the library's object: skorch's NeuralNet builds its DataLoaders in get_iterator from
# params_for("iterator_train") / params_for("iterator_valid") (skorch 1.4, net.py), so a setting is
# NeuralNetClassifier(module, ..., iterator_train__num_workers=2, iterator_valid__num_workers=2). A
# sampler is the training loader's alone.
PREFIXED: dict[tuple[str, str], tuple[str, ...]] = {
    ("skorch", "DataLoader"): ("iterator_train__", "iterator_valid__"),
}
# Libraries that build the object from a dict of its constructor's keyword arguments in their own
# configuration: mmengine's Runner (OpenMMLab's mmdet, mmseg, mmpretrain ... train on it) builds each
# loader in build_dataloader as DataLoader(dataset=..., sampler=..., batch_sampler=..., collate_fn=...,
# worker_init_fn=..., **cfg) from its train_dataloader / val_dataloader / test_dataloader dict (the
# Runner(...) arguments, or those keys of the config file), after building those five from the dict's
# own entries (mmengine 0.10.7, runner.py). The training loader is the one the advice is about.
CONFIG_DICTS: dict[tuple[str, str], tuple[str, frozenset[str]]] = {
    ("mmengine", "DataLoader"): ("train_dataloader", frozenset(
        {"dataset", "sampler", "batch_sampler", "collate_fn", "worker_init_fn"})),
}
# Where those libraries take the validation loader's settings apart from the training loader's (the
# advice names the training loader's; `fix` changed every loader they built).
VALIDATION_SETTINGS = {"mmengine": "val_dataloader", "speechbrain": "valid_loader_kwargs"}
# Libraries run from their own command line, with no line of the user's around the object: (library,
# object) -> the constructor's argument -> the option that sets it. OpenCLIP's training
# (`python -m open_clip_train.main`, 3.3) builds its DataLoaders with num_workers=args.workers and
# nothing else from its options (pin_memory=True; persistent workers only for webdataset).
# LitGPT's commands (`litgpt pretrain`, `litgpt finetune_lora`, ...) build their loaders in the data
# module given by --data, every one with num_workers=self.num_workers (a field of each module, 4 by
# default) and nothing else of the user's (litgpt 0.5.13, litgpt/data/*.py): `--data.num_workers N`.
CLI_OPTIONS: dict[tuple[str, str], dict[str, str]] = {
    ("open_clip_train", "DataLoader"): {"num_workers": "--workers"},
    ("litgpt", "DataLoader"): {"num_workers": "--data.num_workers"},
}
# How each of those command lines reads before the options (litgpt's --data.* options need the module named:
# its commands default data to None and pick one later).
CLI_COMMAND = {"open_clip_train": "python -m open_clip_train.main ...",
               "litgpt": "litgpt <command> ... --data <DataModule>"}
OWNER = {"skorch": "NeuralNet"}  # the class to name when the call's own class is unknown
_TRAINING_ONLY = frozenset({"sampler", "shuffle"})
# What the advice's snippet passes to locate the object, not a setting to change.
_NOT_SETTINGS = ("batch_size", "sampler", "device_ids", "dataset")


class Created(Protocol):
    call_site: str | None
    created_by: str | None
    library_call: str | None
    library_caller: str | None
    library_call_params: list[str]


def origin(objects: list) -> Created | None:
    """The first object with a known origin: the user's call, else the library that made it."""
    for d in objects:
        if d.call_site or d.created_by:
            return d
    return None


def where(kind: str, d: Created | None) -> str:
    """' (DataLoader created at FILE:LINE)' or ' (... built by PKG ...)', or ''."""
    if d is None:
        return ""
    if d.call_site:
        return f" ({kind} created at {d.call_site})"
    lib = d.created_by
    if lib == "transformers":
        return f" (the {NOUN[kind]} is built by transformers' Trainer from its TrainingArguments)"
    if lib and d.library_call and d.library_caller:
        return (f" (the {NOUN[kind]} is built inside {lib}'s {d.library_call}(), which {d.library_caller} "
                f"calls: change it through {lib}'s settings)")
    if lib:
        at = getattr(d, "library_site", None)
        # No line of the user's at all (`python -m open_clip_train.main`, `yolo train`): the package's
        # options may not have it (open_clip_train has --workers, nothing for persistent workers).
        return (f" (the {NOUN[kind]} is built by {lib}{f', at {at}' if at else ''}: change it through {lib}'s "
                f"settings if it has one{', or there' if at else ''})")
    return ""


def entry_snippet(snippet: str, kind: str, d: Created) -> str | None:
    """The snippet with its `kind(...)` call as the call of the library function that builds the
    object (timm's `create_loader(..., num_workers=N)`), when that function takes every setting the
    snippet sets as a parameter of its own; else None."""
    start = snippet.find(f"{kind}(")
    if start < 0 or not d.library_call:
        return None
    inner, end = _call_args(snippet, start + len(kind))
    keys = [k.strip() for k, _, v in (a.partition("=") for a in _top_level(inner)) if v]
    # A sampler= here is the change itself (DL-1's longer epochs), not what locates the call.
    settings = [k for k in keys if k not in _NOT_SETTINGS or k == "sampler"]
    name = d.library_call.rpartition(".")[2]
    forward = _forwarding(kind, d)
    # A setting the function changes on the way (auto_dataloader's num_workers, per node) would be
    # another number at the constructor than the snippet says: the generic advice then.
    passes_on = forward is not None and not set(settings) & forward[2]
    if not settings or not (passes_on or set(settings) <= set(d.library_call_params)):
        return None
    args = [a for a in _top_level(inner) if a.partition("=")[0].strip() in settings]
    if passes_on and forward[1]:  # a dict parameter: prepare_model(..., parallel_strategy_kwargs={...})
        pairs = (a.partition("=") for a in args)
        args = [f"{forward[1]}={{" + ", ".join(f'"{k.strip()}": {v.strip()}' for k, _, v in pairs) + "}"]
    return snippet[:start] + f"{name}(..., " + ", ".join(args) + ")" + snippet[end:]


def trainer_snippet(snippet: str, kind: str = "DataLoader") -> str | None:
    """The snippet with its `kind(...)` call as the TrainingArguments that make the Trainer build
    it (arguments without a field said in a comment; the snippet's other lines kept), or None
    when the call sets nothing TrainingArguments has."""
    return _rewrite_call(snippet, kind, TRAINING_ARGUMENTS[kind], "{}={}", ("TrainingArguments(..., ", ", ", ")"),
                         "no TrainingArguments field")


def _rewrite_call(snippet: str, kind: str, names: dict[str, str], form: str, frame: tuple[str, str, str],
                  none: str) -> str | None:
    """The snippet with its `kind(...)` call's settings renamed by ``names`` and written ``form``
    (the new name, the value), joined and framed by ``frame`` (before, between, after); settings
    without a name said in a comment (``none``); the snippet's other lines kept, a trailing comment
    on the call's line (it named an alternative of the call) dropped. None when none has a name."""
    start = snippet.find(f"{kind}(")
    if start < 0:
        return None
    inner, end = _call_args(snippet, start + len(kind))
    pairs = [(k.strip(), v.strip()) for k, _, v in (a.partition("=") for a in _top_level(inner)) if v]
    mapped = [form.format(names[k], v) for k, v in pairs if k in names]
    if not mapped:
        return None
    missing = [k for k, _ in pairs if k not in names and k not in _NOT_SETTINGS]
    note = f"  # {', '.join(missing)}: {none}" if missing else ""
    rest = snippet[end:]
    rest = rest[rest.index("\n"):] if "\n" in rest else ""
    before, between, after = frame
    return snippet[:start] + before + between.join(mapped) + after + note + rest


def call_owner(call: str | None) -> str | None:
    """The class of a library call's qualified name ("NeuralNetClassifier.fit" -> NeuralNetClassifier)."""
    return call.split(".")[0] if call and "." in call else None


def prefixed_snippet(snippet: str, kind: str, library: str, owner: str | None) -> str | None:
    """The snippet with its `kind(...)` call as the library object's prefixed parameters (PREFIXED:
    `NeuralNetClassifier(..., iterator_train__persistent_workers=True, ...)`); None when the library
    has no such parameters or the call sets nothing."""
    prefixes = PREFIXED.get((library, kind))
    start = snippet.find(f"{kind}(")
    if prefixes is None or start < 0:
        return None
    inner, end = _call_args(snippet, start + len(kind))
    pairs = [(k.strip(), v.strip()) for k, _, v in (a.partition("=") for a in _top_level(inner)) if v]
    pairs = [(k, v) for k, v in pairs if k not in _NOT_SETTINGS or k == "sampler"]
    if not pairs:
        return None
    args = [f"{p}{k}={v}" for p in prefixes for k, v in pairs if p == prefixes[0] or k not in _TRAINING_ONLY]
    return snippet[:start] + f"{owner or OWNER.get(library, library)}(..., " + ", ".join(args) + ")" + snippet[end:]


def config_dict_snippet(snippet: str, kind: str, library: str) -> str | None:
    """The snippet with its `kind(...)` call as the library's configuration dict (CONFIG_DICTS:
    `train_dataloader = dict(..., num_workers=2, persistent_workers=True)`); None when the library
    has no such dict or the call sets nothing it passes on as it is (a sampler the library builds
    from a dict of its own)."""
    entry = CONFIG_DICTS.get((library, kind))
    start = snippet.find(f"{kind}(")
    if entry is None or start < 0:
        return None
    key, built = entry
    inner, end = _call_args(snippet, start + len(kind))
    args = [a for a in _top_level(inner) if a.partition("=")[2]]
    names = {a.partition("=")[0].strip() for a in args}
    settings = [a for a in args if a.partition("=")[0].strip() not in _NOT_SETTINGS]
    if not settings or names & built - {"dataset"}:
        return None
    rest = snippet[end:]
    rest = rest[rest.index("\n"):] if "\n" in rest else ""  # a trailing "# or ..." named another form
    return (snippet[:start] + f"{key} = dict(..., " + ", ".join(settings) + ")"
            + f"  # the config's {key}, or Runner(..., {key}=dict(...))" + rest)


def cli_snippet(snippet: str, kind: str, library: str) -> str | None:
    """The snippet with its `kind(...)` call as the library's command-line options (CLI_OPTIONS:
    `--workers 1`), settings without an option said in a comment; None when it sets none that has one."""
    options = CLI_OPTIONS.get((library, kind))
    if options is None:
        return None
    return _rewrite_call(snippet, kind, options, "{} {}", (f"{CLI_COMMAND[library]} ", " ", ""),
                         f"no {library} option")


def _top_level(args: str) -> list[str]:
    """`args` split at the commas outside brackets: `n=min(4, os.cpu_count()), pin=True` is two."""
    out, depth, cur = [], 0, []
    for ch in args:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [a for a in (x.strip() for x in out) if a]


def _call_args(snippet: str, open_at: int) -> tuple[str, int]:
    """The text between the parenthesis at `open_at` and its match, and the index after the match
    (a trailing `# or ...` comment names an alternative, not one more argument)."""
    depth = 0
    for i in range(open_at, len(snippet)):
        depth += {"(": 1, ")": -1}.get(snippet[i], 0)
        if depth == 0:
            return snippet[open_at + 1:i], i + 1
    return snippet[open_at + 1:], len(snippet)


def framework_fix(kind: str, objects: list, text: str, snippet: str) -> Fix:
    """A fix told where the job builds its `kind` ("DataLoader" or "DDP"): `{where}` in `text`
    takes the site; for one transformers' Trainer built, the snippet becomes TrainingArguments
    fields and the argument names in the text their field names."""
    d = origin(objects)
    if d is not None and not d.call_site and d.created_by == "transformers":
        code = trainer_snippet(snippet, kind)
        if code is not None:
            names = re.compile(r"(?<![\w.])(" + "|".join(TRAINING_ARGUMENTS[kind]) + r")\b")
            text = names.sub(lambda m: TRAINING_ARGUMENTS[kind][m.group(1)], text)
            return Fix(text.replace("{where}", where(kind, d)), code)
        return Fix(text.replace("{where}", f" (the {NOUN[kind]} is built by transformers' Trainer, and "
                                "TrainingArguments has no field for this setting)"), snippet)
    if d is not None and not d.call_site and d.created_by and (d.created_by, kind) in PREFIXED:
        owner = call_owner(d.library_call)
        code = prefixed_snippet(snippet, kind, d.created_by, owner)
        if code is not None:
            params = "/".join(f"{p}*" for p in PREFIXED[(d.created_by, kind)])
            called = f" ({d.library_call}() at {d.library_caller})" if d.library_call and d.library_caller else ""
            return Fix(text.replace("{where}", f" (the {NOUN[kind]} is built by {d.created_by}{called} from its "
                                    f"{params} parameters: set them where the "
                                    f"{owner or OWNER.get(d.created_by, d.created_by)} is created)"),
                       code)
    if d is not None and not d.call_site and d.created_by and (d.created_by, kind) in CONFIG_DICTS:
        code = config_dict_snippet(snippet, kind, d.created_by)
        if code is not None:
            key = CONFIG_DICTS[(d.created_by, kind)][0]
            called = f"; {d.library_call}() at {d.library_caller}" if d.library_call and d.library_caller else ""
            return Fix(text.replace("{where}", f" (the {NOUN[kind]} is built by {d.created_by}'s "
                                    f"{call_owner(d.library_call) or 'Runner'} from its {key} dict: set it in the "
                                    f"config or the Runner(...) call{called})"), code)
    if d is not None and not d.call_site and not d.library_caller and (d.created_by, kind) in CLI_OPTIONS:
        code = cli_snippet(snippet, kind, d.created_by)
        if code is not None:
            options = CLI_OPTIONS[(d.created_by, kind)]
            names = re.compile(r"(?<![\w.])(" + "|".join(options) + r")=")
            text = names.sub(lambda m: options[m.group(1)] + " ", text)
            return Fix(text.replace("{where}", f" (the {NOUN[kind]} is built by {d.created_by} from its command line: "
                                    f"{', '.join(options.values())})"), code)
    if d is not None and not d.call_site and d.library_caller:
        code = entry_snippet(snippet, kind, d)
        if code is not None:
            return Fix(text.replace("{where}", f" (the {NOUN[kind]} is built inside {d.created_by}'s "
                                    f"{d.library_call}(), which {_takes(kind, d)}: at {d.library_caller})"), code)
        # (A function that passes settings on, but changes one on the way, keeps the generic text.)
        if d.created_by and d.library_call and f"{kind}(" in snippet and _forwarding(kind, d) is None:
            return Fix(text.replace("{where}", _no_parameter(kind, d)), snippet)
    return Fix(text.replace("{where}", where(kind, d)), snippet)


def _no_parameter(kind: str, d: Created) -> str:
    """Where a library function the user calls builds the `kind` without a parameter for the setting
    (denoising-diffusion-pytorch's Trainer(...) makes its DataLoader with num_workers=cpu_count() and
    nothing else): its own settings, if it has some elsewhere (a config, a CLI), or its line."""
    lib, site = d.created_by, getattr(d, "library_site", None)
    return (f" (the {NOUN[kind]} is built inside {lib}'s {d.library_call}(), which {d.library_caller} calls and "
            f"which takes no such setting by name: change it through {lib}'s settings if it has one"
            + (f", or where {lib} builds it, at {site})" if site else ")"))


def _forwarding(kind: str, d: Created) -> tuple[str, str | None, frozenset[str]] | None:
    """The FORWARDS entry of the library function that built the `kind`, if it passes settings on to it."""
    forward = FORWARDS.get((d.created_by or "", (d.library_call or "").rpartition(".")[2]))
    return forward if forward is not None and forward[0] == kind else None


def _takes(kind: str, d: Created) -> str:
    """How the library function gets the settings: as its own parameters, or passed on (FORWARDS)."""
    forward = _forwarding(kind, d)
    if forward is None:
        return "takes these settings"
    return f"passes {'its ' + forward[1] if forward[1] else 'its keyword arguments'} on to it"


def loader_fix(loaders: list, text: str, snippet: str) -> Fix:
    """framework_fix for the job's DataLoaders."""
    return framework_fix("DataLoader", loaders, text, snippet)
