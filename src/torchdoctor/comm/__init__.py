"""`torchdoctor comm`: what the fabric does, measured with the job's own backend and launcher.

``bench`` runs inside every rank (it imports torch); ``cli`` launches it and renders the result
(no torch import). Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time,
busbw = algbw x the op's factor, so that busbw compares with the link's peak whatever the op.
"""
