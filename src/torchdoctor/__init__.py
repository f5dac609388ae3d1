"""torchdoctor: why does my PyTorch training job leave the accelerator idle, and what fixes it."""

__version__ = "0.1.0"
