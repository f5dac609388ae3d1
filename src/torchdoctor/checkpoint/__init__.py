"""Checkpoints: verify a DCP checkpoint directory (complete or torn), find the newest complete one,
and a commit-marker wrapper around DCP save for jobs that want the guarantee.

``verify`` reads files only (no torch import); ``commit`` imports torch when called.
"""
