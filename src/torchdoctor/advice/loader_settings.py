"""Where a DataLoader setting is changed: the user's DataLoader(...) call, or the framework's knob.

Hugging Face's Trainer builds its DataLoader from TrainingArguments (transformers/trainer.py
`get_train_dataloader`: num_workers=args.dataloader_num_workers, pin_memory=args.
dataloader_pin_memory, persistent_workers=args.dataloader_persistent_workers, prefetch_factor=
args.dataloader_prefetch_factor). A user of it has no DataLoader(...) line to edit, and a patch to
the installed transformers is no fix: the advice names the TrainingArguments fields instead.
"""

from __future__ import annotations

import re

from ..facts import DataLoaderFacts
from ..rules.model import Fix

# DataLoader argument -> TrainingArguments field (transformers >= 4.36 has all four).
TRAINING_ARGUMENTS = {
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
}
_KWARG = re.compile(r"\b(\w+)=([^,()\n]+|\([^()]*\))")
_ARG_NAME = re.compile(r"(?<![\w.])(" + "|".join(TRAINING_ARGUMENTS) + r")\b")


def training_loader(loaders: list[DataLoaderFacts]) -> DataLoaderFacts | None:
    """The first loader with a known origin: the user's call, else the library that built it."""
    for d in loaders:
        if d.call_site or d.created_by:
            return d
    return None


def where(d: DataLoaderFacts | None) -> str:
    """' (DataLoader created at FILE:LINE)' or ' (the DataLoader is built by PKG ...)', or ''."""
    if d is None:
        return ""
    if d.call_site:
        return f" (DataLoader created at {d.call_site})"
    if d.created_by == "transformers":
        return " (the DataLoader is built by transformers' Trainer from its TrainingArguments)"
    if d.created_by:
        return f" (the DataLoader is built by {d.created_by}, at {d.library_site}: change it through {d.created_by}'s settings)"
    return ""


def trainer_snippet(snippet: str) -> str | None:
    """A DataLoader(...) snippet as the TrainingArguments that make the Trainer build it, or None
    when it sets nothing TrainingArguments has."""
    start = snippet.find("DataLoader(")
    if start < 0:
        return None
    fields = [f"{TRAINING_ARGUMENTS[k]}={v.strip()}" for k, v in _KWARG.findall(snippet[start:])
              if k in TRAINING_ARGUMENTS]
    if not fields:
        return None
    return "TrainingArguments(..., " + ", ".join(fields) + ")"


def loader_fix(loaders: list[DataLoaderFacts], text: str, snippet: str) -> Fix:
    """A DataLoader fix told where the job builds its loader: `text` gets the site; for a loader
    that transformers' Trainer built, the snippet becomes TrainingArguments fields."""
    d = training_loader(loaders)
    if d is not None and not d.call_site and d.created_by == "transformers":
        code = trainer_snippet(snippet)
        if code is not None:
            text = _ARG_NAME.sub(lambda m: TRAINING_ARGUMENTS[m.group(1)], text)
            return Fix(text.replace("{where}", where(d)), code)
    return Fix(text.replace("{where}", where(d)), snippet)
