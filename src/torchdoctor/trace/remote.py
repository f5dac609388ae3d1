"""Traces named by URL (`s3://bucket/run/`, `gs://...`, `file:///...`): listed on the driver, read by
the worker that analyses them, through fsspec (an optional dependency, imported only for URLs).

The decoder reads local files (it seeks and splits large files into byte ranges), so a worker copies a
remote trace to a temporary file next to it, analyses it and deletes it; only the rank's summary
travels back. A `file://` URL is read in place.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Callable, Iterator

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*://")


def is_url(path: str) -> bool:
    return bool(_SCHEME.match(path))


class RemoteError(Exception):
    """A URL that could not be listed or read; the message is one line."""


def _fs(url: str):
    try:
        import fsspec
    except ImportError:
        raise RemoteError("reading URLs needs fsspec: pip install 'torchdoctor[remote]'") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:  # e.g. s3:// without s3fs installed
        raise RemoteError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def discover_url(url: str, is_trace_name: Callable[[str], bool]) -> list[str]:
    """The trace files under a URL (a file, a directory searched recursively for base names that
    `is_trace_name` accepts, or a glob), as URLs."""
    fs, root = _fs(url)
    try:
        if fs.isdir(root):
            hits = [p for p in fs.find(root) if is_trace_name(os.path.basename(p))]
        elif fs.exists(root):
            hits = [root]
        else:
            hits = [p for p in fs.glob(root) if fs.isfile(p)]
    except OSError as e:
        raise RemoteError(f"cannot list: {e.strerror or e}") from None
    return [fs.unstrip_protocol(p) for p in sorted(hits)]


@contextlib.contextmanager
def local_path(url: str) -> Iterator[str]:
    """A local file holding the trace at `url` for as long as the context lasts."""
    fs, path = _fs(url)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        yield path
        return
    suffix = ".json.gz" if path.endswith(".gz") else ".json"
    fd, tmp = tempfile.mkstemp(prefix="torchdoctor-", suffix=suffix)
    os.close(fd)
    try:
        try:
            fs.get_file(path, tmp)
        except OSError as e:
            raise RemoteError(f"cannot read: {e.strerror or e}") from None
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
