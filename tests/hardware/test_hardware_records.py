"""Every pydantic record of the hardware package is frozen, rejects unknown fields and carries its
field docstrings (most through :class:`opgraph.ir.FrozenModel`)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
from pydantic import BaseModel, ValidationError

import hardware
from hardware.spec import HostOverhead
from opgraph.ir import FrozenModel

LENIENT = {"hardware.collective_fit.CollectiveSample"}
"""Records that read foreign files on purpose and so ignore unknown fields (a validators measurement)."""


def hardware_records() -> list[type[BaseModel]]:
    out: list[type[BaseModel]] = []
    for info in pkgutil.walk_packages(hardware.__path__, "hardware."):
        module = importlib.import_module(info.name)
        out += [
            c
            for c in vars(module).values()
            if inspect.isclass(c) and issubclass(c, BaseModel) and c.__module__ == module.__name__
        ]
    return out


@pytest.mark.parametrize("record", hardware_records(), ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_every_record_is_frozen_and_strict(record: type[BaseModel]) -> None:
    name = f"{record.__module__}.{record.__qualname__}"
    assert record.model_config.get("frozen") is True, name
    assert record.model_config.get("use_attribute_docstrings") is True, name
    assert record.model_config.get("extra") == ("ignore" if name in LENIENT else "forbid"), name


def test_a_record_subclass_cannot_be_changed_and_names_its_unknown_field() -> None:
    assert issubclass(HostOverhead, FrozenModel)
    host = HostOverhead()
    with pytest.raises(ValidationError, match="frozen"):
        host.eager_us = 1.0
    with pytest.raises(ValidationError, match="eager_ms"):
        HostOverhead(eager_ms=1.0)
    assert HostOverhead.model_fields["eager_us"].description  # its docstring
