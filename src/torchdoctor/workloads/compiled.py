"""Bundled torch.compile job: a small causal LM, compiled, with switchable compile pathologies.

``python -m torchdoctor.workloads.compiled [--healthy | --pathologies a,b] [--steps N]
[--backend B]``; ``torchdoctor demo --compile`` runs it under the probe.

The model is a causal ``nn.TransformerEncoder`` (LAYERS x D_MODEL) trained with AdamW on
next-token cross-entropy over token sequences of random length (MIN_LEN..SEQ) drawn from a seeded
Zipf-like vocabulary. The backend defaults to "aot_eager" on CPU (Dynamo and AOTAutograd, real
graphs and real graph breaks and recompiles, without Inductor's C++ code generation, which takes
minutes on a small CPU) and to "inductor" on a GPU.

Pathologies (all on by default, ``--healthy`` turns all off):

======================== ======================================================================
logging_in_forward       ``log.debug`` of the activations' shape in forward: silenced by the log
                         level, and still a graph break (Dynamo cannot trace Logger methods)
data_dependent_branch    ``if h.abs().max() > CLIP: h = h.clamp(...)`` in forward: a Python
                         branch on a tensor's value breaks the graph (healthy: the clamp always,
                         which is the same value either way)
changing_seq_len         batches padded to their longest sequence (a new length almost every
                         step) with ``torch.compile(dynamic=False)``: a recompile per length until
                         the recompile limit, then eager (healthy: padded to SEQ, one shape)
======================== ======================================================================
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from torchdoctor.workloads import _jobs

VOCAB = 512
SEQ = 64
MIN_LEN = 24
D_MODEL = 64
HEADS = 4
LAYERS = 2
BATCH = 16
CLIP = 8.0
PAD = 0
log = logging.getLogger(__name__)

SPEC = _jobs.JobSpec(
    prog="python -m torchdoctor.workloads.compiled",
    description=__doc__.splitlines()[0],
    pathologies=("logging_in_forward", "data_dependent_branch", "changing_seq_len"),
    default_steps=60,
)


class Tokens(Dataset):
    """Seeded token sequences of MIN_LEN..SEQ + 1 ids (no padding: the collate pads)."""

    def __init__(self, size: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        ranks = np.arange(1, VOCAB, dtype=np.float64)
        p = 1.0 / ranks / (1.0 / ranks).sum()
        self.rows = [torch.from_numpy(rng.choice(VOCAB - 1, int(n), p=p) + 1)
                     for n in rng.integers(MIN_LEN, SEQ + 2, size=size)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.rows[index]


def pad_to(length: int | None):
    """A collate that pads to ``length`` (None: to the batch's longest sequence) plus one target."""
    def collate(rows: list[torch.Tensor]) -> torch.Tensor:
        n = (max(len(r) for r in rows) if length is None else length) + 1
        out = torch.full((len(rows), n), PAD, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : min(len(r), n)] = r[:n]
        return out
    return collate


class TinyLM(nn.Module):
    def __init__(self, sick: set[str]) -> None:
        super().__init__()
        self.sick = sick
        self.embed = nn.Embedding(VOCAB, D_MODEL, padding_idx=PAD)
        self.pos = nn.Parameter(torch.randn(SEQ + 1, D_MODEL) * 0.02)
        layer = nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=4 * D_MODEL, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        n = ids.shape[1]
        h = self.embed(ids) + self.pos[:n]
        if "logging_in_forward" in self.sick:
            log.debug("forward: activations %s", tuple(h.shape))
        if "data_dependent_branch" in self.sick:
            if h.abs().max() > CLIP:
                h = h.clamp(-CLIP, CLIP)
        else:
            h = h.clamp(-CLIP, CLIP)
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=ids.device)
        return self.head(self.encoder(h, mask=mask, is_causal=True))


def loss_fn(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy over the real (non-padding) targets."""
    logits = model(ids[:, :-1])
    target = ids[:, 1:]
    per_token = F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1), reduction="none")
    weight = (target.reshape(-1) != PAD).float()
    return (per_token * weight).sum() / weight.sum().clamp(min=1.0)


def main(argv: list[str] | None = None) -> int:
    args = _jobs.parse_args(SPEC, argv, extra=_backend_option)
    sick = _jobs.chosen(SPEC, args)
    _jobs.configure_torch(set(), args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    backend = args.backend or ("inductor" if device == "cuda" else "aot_eager")
    dataset = Tokens(BATCH * args.steps, args.seed)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(args.seed),
                        collate_fn=pad_to(None if "changing_seq_len" in sick else SEQ), drop_last=True)
    model = TinyLM(sick).to(device)
    compiled = torch.compile(model, backend=backend, dynamic=False if "changing_seq_len" in sick else None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    result = _jobs.train(compiled, _on(loader, device), opt, loss_fn, args.steps)
    _jobs.report(SPEC, sick, result)
    return 0


def _backend_option(p) -> None:
    p.add_argument("--backend", help="torch.compile backend (default: aot_eager on CPU, inductor on GPU)")


def _on(loader: DataLoader, device: str):
    """The loader's batches on ``device`` (an iterable the training loop can restart)."""
    class OnDevice:
        def __iter__(self):
            return (b.to(device, non_blocking=True) for b in loader)
    return OnDevice() if device != "cpu" else loader


if __name__ == "__main__":
    sys.exit(main())
