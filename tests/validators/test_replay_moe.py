"""MoE routing replay recipes run what transformers' grouped_mm experts run for dispatch and combine
(the aten calls the capture records before the first and after the last expert GEMM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from opgraph.capture.api import record  # noqa: E402
from opgraph.capture.moe_model import is_experts_module  # noqa: E402
from opgraph.capture.phase import CaptureOptions  # noqa: E402
from opgraph.ir import OpKind  # noqa: E402
from tests.opgraph.capture.test_capture_architectures import tiny_config  # noqa: E402
from validators import BuildContext, RecipeSelector  # noqa: E402

_FREE = {"view", "_unsafe_view", "reshape", "unsqueeze", "expand", "t", "transpose", "select", "slice", "empty_like"}


def _aten_calls(fn: Any) -> list[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class Names(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    with Names():
        fn()
    return [n for n in seen if n not in _FREE]


def _captured_steps(path: str) -> tuple[set[str], set[str]]:
    rec = record(path, CaptureOptions(device="meta", seq_len=12)).recorder
    call = next(i for i, c in enumerate(rec.calls) if c.module is not None and is_experts_module(c.module))
    evs = [e.fn for e in rec.events if e.call == call and not e.alias]
    gemms = [i for i, fn in enumerate(evs) if fn in ("_grouped_mm", "grouped_mm")]
    return set(evs[: gemms[0]]) - _FREE, set(evs[gemms[-1] + 1 :]) - _FREE


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("fn", ["dispatch", "combine"])
def test_routing_recipes_run_the_calls_the_model_makes(tmp_path: Path, model_type: str, fn: str) -> None:
    from opgraph.capture import capture

    path = tiny_config(tmp_path, model_type)
    dispatch, combine = _captured_steps(path)
    op = next(o for o in capture(path, device="meta", seq_len=12).ops_of(OpKind.MOE_ROUTING) if o.fn == fn)  # type: ignore[attr-defined]
    ctx = BuildContext(device="cpu", gen=torch.Generator().manual_seed(0))
    recipe = RecipeSelector().select(op).recipe
    assert recipe is not None
    case = recipe.build(op, ctx)
    assert set(_aten_calls(case)) == (dispatch if fn == "dispatch" else combine)
