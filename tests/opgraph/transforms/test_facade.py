"""The ``opgraph.transforms`` facade: one list of public names, taken from its two parts."""

import importlib

import opgraph.transforms as facade


def test_the_facade_exports_every_public_name_of_both_transforms_and_nothing_else() -> None:
    parts = [importlib.import_module(f"opgraph.transforms.{name}") for name in ("tensor_parallel", "rebatch")]
    expected = [name for part in parts for name in part.__all__]
    assert sorted(facade.__all__) == sorted(expected)
    for part in parts:
        for name in part.__all__:
            assert getattr(facade, name) is getattr(part, name), name
