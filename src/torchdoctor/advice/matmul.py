"""Where a projection's input is made contiguous: the library setting that chunks it, or the job's line.

Shared by HW-20's advice and `fix`'s permanent change for matmul.contiguous_input.
"""

from __future__ import annotations

# torchtune's recipes chunk the output for CEWithChunkedOutputLoss (recipes call
# model.set_num_output_chunks(loss_fn.num_output_chunks); TransformerDecoder.chunked_output splits the
# last hidden state along dim 1), torchtune 0.6.1.
TORCHTUNE = ("torchtune's recipes split the final hidden state along the sequence for CEWithChunkedOutputLoss, "
             "and the tied output projection is frozen in a LoRA fine-tune: each chunk copies the whole embedding "
             "once per sequence of the batch. In the config, torch.nn.CrossEntropyLoss computes the logits in one "
             "piece (more memory for them), or run with the remedy until torchtune makes the chunk contiguous.",
             "loss:\n  _component_: torch.nn.CrossEntropyLoss   # instead of CEWithChunkedOutputLoss: no chunks")
