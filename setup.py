"""The one compiled part: trace/_scan.c, the fast path of the trace decoder (see its header).

Optional: where it cannot be built (no C compiler, no Python headers) the install goes on and
decode.py uses msgspec alone, with the same results, slower. Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("torchdoctor.trace._scan", ["src/torchdoctor/trace/_scan.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"])])
