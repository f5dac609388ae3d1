"""The compile layer's shared readers: Dynamo's guards, compile records, TORCH_TRACE logs.

The live probe (probe/recompiles.py, probe/breaks.py) and the TORCH_TRACE reader both turn what
Dynamo recorded into the same ``CompileFacts``; the rules read only those. No torch import.
"""
