"""Post-import hooks: a class defined by a module that was still running when its hook went in."""

from __future__ import annotations

from torchdoctor.probe.imphook import when_subclassed


class Base:
    pass


class WithOwn:
    seen: list[tuple[str, object]] = []

    def __init_subclass__(cls, tag: object = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        WithOwn.seen.append((cls.__name__, tag))


def test_the_callback_gets_the_named_class_once_and_the_base_is_given_back() -> None:
    got: list[type] = []
    when_subclassed(Base, __name__, "Target", got.append)
    assert "__init_subclass__" in Base.__dict__

    class Other(Base):  # another subclass: no callback
        pass

    assert got == []
    Target = type("Target", (Base,), {"__module__": __name__})
    assert got == [Target] and "__init_subclass__" not in Base.__dict__
    type("Target", (Base,), {"__module__": __name__})  # defined again: the hook is gone
    assert got == [Target]


def test_a_base_s_own_init_subclass_runs_for_every_subclass_with_its_arguments() -> None:
    got: list[type] = []
    own = WithOwn.__dict__["__init_subclass__"]
    when_subclassed(WithOwn, __name__, "Target", got.append)
    WithOwn.seen.clear()

    class Other(WithOwn, tag=1):
        pass

    Target = type("Target", (WithOwn,), {"__module__": __name__}, tag=2)
    assert WithOwn.seen == [("Other", 1), ("Target", 2)] and got == [Target]
    assert WithOwn.__dict__["__init_subclass__"] is own


def test_two_hooks_on_one_base_both_fire() -> None:
    """The probe and a remedy both wait for torchdata's StatefulDataLoader on DataLoader."""
    first: list[type] = []
    second: list[type] = []
    when_subclassed(Base, __name__, "Target", first.append)
    when_subclassed(Base, __name__, "Target", second.append)
    Target = type("Target", (Base,), {"__module__": __name__})
    assert first == [Target] and second == [Target]
    assert "__init_subclass__" not in Base.__dict__  # given back once both came
    type("Target", (Base,), {"__module__": __name__})
    assert first == [Target] and second == [Target]


def test_a_hook_put_in_after_ours_stays_and_a_later_wait_still_fires() -> None:
    class Own:
        pass

    got: list[type] = []
    when_subclassed(Own, __name__, "X", got.append)
    ours = Own.__dict__["__init_subclass__"]
    seen: list[str] = []

    def theirs(cls, **kwargs):  # another library's hook, put in after ours, that calls ours
        seen.append(cls.__name__)
        ours.__get__(None, cls)(**kwargs)

    Own.__init_subclass__ = classmethod(theirs)
    X = type("X", (Own,), {"__module__": __name__})
    type("Y", (Own,), {"__module__": __name__})
    assert got == [X] and seen == ["X", "Y"]  # theirs was not taken out when ours was done
    later: list[type] = []
    when_subclassed(Own, __name__, "Z", later.append)  # ours is no longer the base's: a fresh one
    Z = type("Z", (Own,), {"__module__": __name__})
    assert later == [Z] and seen == ["X", "Y", "Z"]


def test_a_module_still_running_is_handed_over_once_its_body_ran(tmp_path, monkeypatch) -> None:
    """safetensors.torch imported before torch: torch's import hook asks for it while its body runs
    (it had no save_file yet); ``when_whole`` waits for the body, then the package is plain again."""
    import sys
    from types import ModuleType

    pkg = tmp_path / "td_whole_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "child.py").write_text("import td_whole_trigger\n\ndef save_file():\n    return 'saved'\n")
    (tmp_path / "td_whole_trigger.py").write_text(
        "from torchdoctor.probe import imphook\n"
        "import td_whole_seen\n"
        "imphook.when_whole('td_whole_pkg.child', lambda m: td_whole_seen.got.append(hasattr(m, 'save_file')))\n")
    (tmp_path / "td_whole_seen.py").write_text("got = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        import td_whole_pkg
        import td_whole_seen
        from td_whole_pkg.child import save_file  # the statement that binds the name comes after the callback

        assert td_whole_seen.got == [True] and save_file() == "saved"
        assert type(td_whole_pkg) is ModuleType  # no longer announcing
    finally:
        for name in ("td_whole_pkg", "td_whole_pkg.child", "td_whole_trigger", "td_whole_seen"):
            sys.modules.pop(name, None)
