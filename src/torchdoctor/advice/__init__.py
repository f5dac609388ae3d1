"""Advice shared by the diagnosis (rules) and the remedies: one answer to "how many workers?"."""
