"""Bundled single-process transformer language-model job, with switchable pathologies.

``python -m torchdoctor.workloads.lm [--healthy | --pathologies a,b] [--steps N] [--seed S]``

The dataset holds raw text (sentences of words drawn from a seeded Zipf-like vocabulary) and
tokenises on read: each read waits TOKENIZE_MS (a tokenizer service / storage round trip), then
maps words to ids in Python, truncates and pads to SEQ + 1 tokens, and returns the ids with
their padding mask. The model is a causal ``nn.TransformerEncoder`` (LAYERS x d_model D_MODEL,
vocabulary VOCAB) trained with AdamW on next-token cross-entropy over the unpadded targets.

Measured on 2 quiet cores (torch 2.13): healthy ~23-30 ms per step; main_process_loader,
oversubscribed_threads and anomaly_detection each add ~50%; syncing_collate costs ~3 ms of CPU
per batch, which workers mostly hide (0-16% alone, noise-level) and the training process does
not (6-11% on top of main_process_loader).

Pathologies (all on by default, ``--healthy`` turns all off; see ``_jobs``):
main_process_loader, syncing_collate, oversubscribed_threads, anomaly_detection.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from torchdoctor.workloads import _jobs

VOCAB = 1000
SEQ = 64
D_MODEL = 64
HEADS = 4
LAYERS = 2
BATCH = 16
TOKENIZE_MS = 1.5  # per sample: 24 ms per batch in the training process
PAD, UNK = 0, 1

SPEC = _jobs.JobSpec(
    prog="python -m torchdoctor.workloads.lm",
    description=__doc__.splitlines()[0],
    pathologies=("main_process_loader", "syncing_collate", "oversubscribed_threads", "anomaly_detection"),
    default_steps=200,
)


class TextDataset(Dataset):
    """Sentences of words; a read waits TOKENIZE_MS, then tokenises in Python to SEQ + 1 ids."""

    def __init__(self, size: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        words = [f"w{i}" for i in range(VOCAB - 2)]
        self.vocab = {w: i + 2 for i, w in enumerate(words)}
        ranks = np.arange(1, VOCAB - 1, dtype=np.float64)
        p = 1.0 / ranks / (1.0 / ranks).sum()  # Zipf: a few frequent words, a long tail
        lengths = rng.integers(SEQ // 2, SEQ * 3 // 2, size=size)
        # 1 in 50 words is out of the vocabulary (it maps to UNK).
        self.texts = [" ".join(words[j] if rng.random() > 0.02 else "oov" for j in rng.choice(VOCAB - 2, n, p=p))
                      for n in lengths]
        self.tokenize_s = TOKENIZE_MS / 1e3

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(SEQ + 1 token ids, their mask: 1 for a real token, 0 for padding)."""
        time.sleep(self.tokenize_s)  # the tokenizer round trip
        ids = [self.vocab.get(w, UNK) for w in self.texts[index].split()][: SEQ + 1]
        real = len(ids)
        ids += [PAD] * (SEQ + 1 - real)
        return torch.tensor(ids, dtype=torch.long), (torch.arange(SEQ + 1) < real).float()


def syncing_collate(batch: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token collate through host values: ``.item()`` on every id and every mask entry.

    What a hand-written padding collate often looks like: it walks every token, checks the id
    against the vocabulary and the mask against the padding, one element at a time, then
    rebuilds the batch from Python lists (the healthy job stacks the tensors: default_collate).
    """
    rows, masks = [], []
    for ids, mask in batch:
        row = [int(ids[i].item()) for i in range(len(ids))]
        keep = [float(mask[i].item()) for i in range(len(mask))]
        assert all(tok < VOCAB and (tok != PAD) == bool(m) for tok, m in zip(row, keep, strict=True))
        rows.append(row)
        masks.append(keep)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(masks)


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=4 * D_MODEL, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(SEQ), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.pos
        return self.head(self.encoder(h, mask=self.mask, is_causal=True))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy over the real (unpadded) target tokens."""
    ids, mask = batch
    logits = model(ids[:, :-1])
    per_token = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1), reduction="none")
    weight = mask[:, 1:].reshape(-1)
    return (per_token * weight).sum() / weight.sum().clamp(min=1.0)


def main(argv: list[str] | None = None) -> int:
    args = _jobs.parse_args(SPEC, argv)
    sick = _jobs.chosen(SPEC, args)
    _jobs.configure_torch(sick, args.seed)
    dataset = TextDataset(BATCH * args.steps, args.seed)  # one epoch covers the run
    loader = _jobs.build_loader(dataset, BATCH, sick, args.seed, syncing_collate)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    _jobs.report(SPEC, sick, _jobs.train(model, loader, opt, loss_fn, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
