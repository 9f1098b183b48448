"""The tier watcher's order-free rule (tests/support/tiers.py): a unit test module is listed when what it
imported leads to TensorFlow, whatever loaded TensorFlow first in the run."""

from __future__ import annotations

from types import ModuleType

from support.tiers import reaching_heavy


def module(name: str, **names: object) -> ModuleType:
    made = ModuleType(name)
    vars(made).update(names)
    return made


def test_imported_modules_functions_and_parent_packages_lead_to_tensorflow_and_siblings_do_not() -> None:
    tf = module("tensorflow")
    boxes = module("lib.boxes", tf=tf)
    anchors = module("lib.anchors", B=boxes)
    config = module("lib.config")
    plain = module("graphs.plain")  # its package imports tensorflow

    def decode() -> None: ...

    decode.__module__ = "lib.boxes"
    by_module = module("tests.by_module", A=anchors)
    found = {
        "tensorflow": tf,
        "lib": module("lib", boxes=boxes, anchors=anchors, config=config),  # as the import system sets them
        "lib.boxes": boxes,
        "lib.anchors": anchors,
        "lib.config": config,
        "graphs": module("graphs", tf=tf),
        "graphs.plain": plain,
        "tests": module("tests", by_module=by_module),  # a sibling of tests.config_only, not its import
        "tests.by_module": by_module,
        "tests.by_function": module("tests.by_function", decode=decode),
        "tests.by_package": module("tests.by_package", plain=plain),
        "tests.config_only": module("tests.config_only", config=config),
    }
    wanted = [name for name in found if name.startswith("tests.")]
    assert reaching_heavy(found, wanted) == {"tests.by_module", "tests.by_function", "tests.by_package"}
