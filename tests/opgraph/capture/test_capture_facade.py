"""``opgraph.capture`` stays callable: the facade function shares its name with the subpackage that
Python binds to the package attribute on import, so each order is run in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")

CALL_TWICE = """
g1 = opgraph.capture("llama-3.2-1b", layers=1, seq_len=4)
g2 = opgraph.capture("llama-3.2-1b", layers=1, seq_len=4)
assert len(g1.ops) == len(g2.ops) > 0
assert callable(opgraph.capture) and callable(opgraph.tracing)
"""


def run_fresh(code: str) -> None:
    """Run ``code`` in a new interpreter and fail with its stderr if it fails."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    "prelude",
    [
        "import opgraph",  # the facade's lazy import on the first call
        "import opgraph\nopgraph.capture.__doc__",  # touched before any call
        "import opgraph\nimport opgraph.capture",  # the subpackage imported after the facade
        "import opgraph.capture\nimport opgraph",  # the subpackage imported first
        "from opgraph.capture import capture, tracing\nimport opgraph",
        "import opgraph\nopgraph.tracing\nimport opgraph.capture.api",  # another lazy name, a submodule
    ],
)
def test_capture_is_callable_on_every_call(prelude: str) -> None:
    run_fresh(prelude + "\n" + CALL_TWICE)


def test_capture_attribute_is_one_object_with_the_function_signature() -> None:
    run_fresh(
        """
        import inspect
        import opgraph
        first = opgraph.capture
        import opgraph.capture
        from opgraph.capture import capture
        assert opgraph.capture is first
        assert inspect.signature(opgraph.capture) == inspect.signature(capture)
        """
    )


def test_import_opgraph_stays_free_of_torch() -> None:
    run_fresh(
        """
        import sys
        import opgraph
        assert "torch" not in sys.modules and "opgraph.capture" not in sys.modules
        """
    )


def test_importing_the_presets_folder_leaves_the_presets_function() -> None:
    # The preset configs' folder, opgraph/capture/presets/, has no __init__.py: Python imports it as a
    # namespace package and used to bind it over the function `presets` of the same name.
    run_fresh(
        """
        import opgraph.capture
        import opgraph.capture.presets
        from opgraph.capture import presets
        from opgraph.capture.sources import presets as defined
        assert opgraph.capture.presets is presets is defined
        assert "llama-3.1-8b" in opgraph.capture.presets()
        """
    )


def test_no_submodule_import_rebinds_a_public_name() -> None:
    # Every package whose folder holds a module or folder named like one of its public names
    # (opgraph.capture.presets, opgraph.transforms.rebatch, validators.coverage, ...): each public name
    # is the same object after that submodule is imported as before.
    run_fresh(
        """
        import importlib
        from pathlib import Path

        packages = []
        for root in ("opgraph", "simulators", "validators", "hardware"):
            top = Path(importlib.import_module(root).__path__[0])
            for init in sorted(top.rglob("__init__.py")):
                packages.append(".".join((root, *init.parent.relative_to(top).parts)))
        checked = []
        for name in packages:
            package = importlib.import_module(name)
            folder = Path(package.__path__[0])
            children = {p.stem if p.suffix == ".py" else p.name for p in folder.iterdir()
                        if (p.suffix == ".py" or p.is_dir()) and p.name not in ("__init__.py", "__pycache__")}
            for child in sorted(children & set(getattr(package, "__all__", ()))):
                before = getattr(package, child)
                importlib.import_module(f"{name}.{child}")
                assert getattr(package, child) is before, f"import {name}.{child} rebound {name}.{child}"
                checked.append(f"{name}.{child}")
        assert "opgraph.capture.presets" in checked and len(checked) >= 3, checked
        """
    )
