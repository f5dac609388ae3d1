"""callsite.py: the user's line that created an object, or the library that created it."""

from __future__ import annotations

import linecache
import os

from torchdoctor.callsite import Site, caller_frame, creation_site, editable_site, library_of, user_frames

LIB = os.sep.join(["", "venv", "lib", "python3.11", "site-packages"])


def code_at(path: str, src: str, ns: dict) -> None:
    """Define `src`'s functions as if they lived in the file `path` (their frames say so, and
    linecache serves their source lines)."""
    linecache.cache[path] = (len(src), None, src.splitlines(True), path)
    exec(compile(src, path, "exec"), ns)


def build() -> dict:
    ns: dict = {"creation_site": creation_site, "caller_frame": caller_frame}
    # The constructor that records where it was called from (what the probe's shim does).
    code_at("/opt/torch/utils/data.py", "def DataLoader():\n    return creation_site(caller_frame(0), "
            "lambda n: n.startswith('/opt/torch/'))\n", ns)
    code_at(f"{LIB}/accelerate/data_loader.py", "def prepare():\n    return DataLoader()\n", ns)
    code_at(f"{LIB}/transformers/trainer.py", "def train():\n    return prepare()\n", ns)
    code_at("/home/me/job/train.py", "def direct():\n    return DataLoader()\n\ndef through():\n    return train()\n", ns)
    return ns


def test_the_users_own_call_is_the_site():
    assert build()["direct"]() == Site(user="/home/me/job/train.py:2")


def test_a_library_call_names_the_library_the_user_called_not_a_line_to_edit():
    got = build()["through"]()
    assert got.user is None  # no diff into an installed package
    assert got.library == "transformers"  # the user called the Trainer; accelerate built the loader
    assert got.library_site == f"{LIB}/accelerate/data_loader.py:2"
    assert got.caller == "/home/me/job/train.py:5"


def test_a_library_function_that_builds_the_loader_is_named_with_its_parameters():
    # timm's create_loader(dataset, ..., num_workers=1, persistent_workers=True) calls DataLoader.
    ns = build()
    code_at(f"{LIB}/timm/data/loader.py", "def create_loader(dataset, *, num_workers=1, persistent_workers=True):\n"
            "    helper = 1\n    return DataLoader()\n", ns)
    code_at("/home/me/job/train_timm.py", "def main():\n    return create_loader(None, num_workers=4)\n", ns)
    got = ns["main"]()
    assert (got.library, got.entry, got.caller) == ("timm", "create_loader", "/home/me/job/train_timm.py:2")
    assert got.entry_params == ("dataset", "num_workers", "persistent_workers")  # not its locals
    # A permanent change edits the user's create_loader(...) call when it takes every key ...
    assert editable_site(got, "DataLoader", ["num_workers"]) == ("create_loader", "/home/me/job/train_timm.py:2")
    # ... and has no line to edit when one key is not among its parameters.
    assert editable_site(got, "DataLoader", ["num_workers", "prefetch_factor"]) == ("DataLoader", None)
    assert editable_site(Site(user="/a.py:3"), "DataLoader", ["x"]) == ("DataLoader", "/a.py:3")


def test_a_decorators_wrapper_is_not_the_library_call():
    """Keras wraps Model.fit in filter_traceback.<locals>.error_handler(*args, **kwargs): the advice
    named "keras's filter_traceback.<locals>.error_handler()" and its parameters, none."""
    ns = build()
    code_at(f"{LIB}/keras/src/utils/traceback_utils.py", "def filter_traceback(fn):\n"
            "    def error_handler(*args, **kwargs):\n        return fn(*args, **kwargs)\n"
            "    return error_handler\n", ns)
    code_at(f"{LIB}/keras/src/trainer.py", "def fit(x=None, y=None, batch_size=None):\n    return DataLoader()\n"
            "fit = filter_traceback(fit)\n", ns)
    code_at("/home/me/job/mnist.py", "def main():\n    return fit(1, 2)\n", ns)
    got = ns["main"]()
    assert (got.library, got.entry, got.caller) == ("keras", "fit", "/home/me/job/mnist.py:2")
    assert got.entry_params == ("x", "y", "batch_size")


def test_a_notebook_cell_is_the_users_code():
    ns = build()
    code_at("<ipython-input-3-5f2a>", "def cell():\n    return DataLoader()\n", ns)
    assert ns["cell"]() == Site(user="<ipython-input-3-5f2a>:2")


def test_frozen_standard_library_frames_are_transparent():
    # `python -m pkg` on 3.11+: runpy runs frozen, between the library and nothing of the user's.
    ns = build()
    code_at("<frozen runpy>", "def run_module():\n    return train()\n", ns)
    got = ns["run_module"]()
    assert got.user is None and got.library == "transformers"
    assert got.caller is not None and not got.caller.startswith("<frozen")  # the walk went past it


STUB = """import re
import sys
from ultralytics.cfg import entrypoint
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(entrypoint())
"""


def test_a_console_script_is_no_line_of_the_users(tmp_path, monkeypatch):
    """`yolo train ...` runs pip's stub <venv>/bin/yolo, which calls ultralytics.cfg.entrypoint(): the
    loader was 'built inside ultralytics's entrypoint(), which <venv>/bin/yolo:8 calls'. A script of
    the user's own in the same directory (a Docker image's /usr/local/bin) stays the user's."""
    import torchdoctor.callsite as callsite

    scripts = tmp_path / "bin"
    scripts.mkdir()
    monkeypatch.setattr(callsite, "_SCRIPTS", (str(scripts),))
    stub, own = scripts / "yolo", scripts / "train.py"
    stub.write_text(STUB)
    own.write_text("import torch\n\ndef main():\n    return entrypoint()\n" + "# the user's training code\n" * 30)
    ns = build()
    code_at(f"{LIB}/ultralytics/cfg/__init__.py", "def entrypoint():\n    return DataLoader()\n", ns)
    code_at(str(stub), "def main():\n    return entrypoint()\n", ns)
    got = ns["main"]()  # (this test's own frame plays the interpreter's: the caller beyond the stub)
    assert (got.user, got.library, got.entry) == (None, "ultralytics", "entrypoint")
    assert got.library_site == f"{LIB}/ultralytics/cfg/__init__.py:2" and not got.caller.startswith(str(stub))
    code_at(str(own), "def main():\n    return entrypoint()\n", ns)
    assert ns["main"]().caller == f"{own}:2"


def test_library_of():
    assert library_of(f"{LIB}/transformers/trainer.py") == "transformers"
    assert library_of("/usr/lib/python3/dist-packages/six.py") == "six"
    assert library_of("/home/me/job/train.py") is None
    # The bundled demo jobs are the user's code, installed or not.
    assert library_of(f"{LIB}/torchdoctor/workloads/demo.py") is None


def test_a_library_that_only_wraps_the_users_own_call_leaves_it_the_users():
    # Lightning patches DataLoader.__init__ to record its arguments: its wrapper frame sits between
    # the user's DataLoader(...) line and the constructor.
    ns: dict = {"creation_site": creation_site, "caller_frame": caller_frame}
    code_at("/opt/torch/utils/data.py", "def DataLoader():\n    return creation_site(caller_frame(0), "
            "lambda n: n.startswith('/opt/torch/'), called='DataLoader')\n", ns)
    code_at(f"{LIB}/lightning/fabric/utilities/data.py", "def wrapper():\n    return DataLoader()\n", ns)
    code_at("/home/me/job/lit.py", "def train_dataloader():\n    return wrapper()  # DataLoader(ds) here\n\n"
            "def other():\n    return wrapper()\n", ns)
    assert ns["train_dataloader"]() == Site(user="/home/me/job/lit.py:2")
    assert ns["other"]().library == "lightning"  # a line that does not call DataLoader( itself


def test_user_frames_name_the_library_between_them():
    # Lightning: the user's validation_step runs the forward; Lightning's fit(), which the user's
    # line called, calls it. A helper of the user's own (CleanRL's get_action_and_value) is not a library.
    ns: dict = {"user_frames": user_frames, "caller_frame": caller_frame}
    code_at("/opt/torch/nn/module.py", "def call():\n    return user_frames(caller_frame(0), "
            "lambda n: n.startswith('/opt/torch/'), 2)\n", ns)
    code_at("/home/me/job/train.py", "class Net:\n    def validation_step(self):\n        return call()\n"
            "def helper():\n    return call()\ndef main():\n    return fit(Net())\ndef rollout():\n"
            "    return helper()\n", ns)
    code_at(f"{LIB}/lightning/pytorch/trainer/trainer.py", "def fit(model):\n    return _loop(model)\n"
            "def _loop(model):\n    return model.validation_step()\n", ns)
    assert ns["main"]() == ["/home/me/job/train.py:3 (Net.validation_step)",
                            "lightning's fit() at /home/me/job/train.py:7 (main)"]
    assert ns["rollout"]() == ["/home/me/job/train.py:5 (helper)", "/home/me/job/train.py:9 (rollout)"]


def test_display_name_is_the_distribution_of_a_differently_named_package(monkeypatch):
    """torchtune installs its built-in recipes as the top-level package "recipes"; a package named
    like its distribution (normalised: open-clip-torch's open_clip_torch) or one that several
    distributions share keeps its own name, and so does one nothing installed provides."""
    from torchdoctor import callsite

    monkeypatch.setattr(callsite, "_distributions", lambda: {
        "recipes": ["torchtune"], "pytorch_lightning": ["pytorch-lightning"], "shared": ["a", "b"]})
    assert callsite.display_name("recipes") == "torchtune"
    assert callsite.display_name("pytorch_lightning") == "pytorch_lightning"
    assert callsite.display_name("shared") == "shared" and callsite.display_name("train") == "train"
