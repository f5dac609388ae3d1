"""Bundled training jobs: the `torchdoctor demo` job (``demo``) and its command (``cli``)."""
