"""The host profile's training set (benchmarks/gpu/host_profile.sh) is none of the held-out cases, and
its measured walls can tell the per-forward time from the per-op scale."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "gpu" / "host_profile.sh"


def _heldout_module() -> Any:
    spec = importlib.util.spec_from_file_location("heldout_for_host", REPO / "benchmarks" / "gpu" / "heldout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["heldout_for_host"] = module
    spec.loader.exec_module(module)
    return module


def _heldout_cases() -> list[dict[str, object]]:
    return list(_heldout_module().CASES)


def _training(path: Path) -> list[tuple[str, str, int, int, str, int, str]]:
    """The script's TRAIN lines: preset, phase, batch, tokens, dtype, layers and the wall mark (0 none, 1
    fitted, 2 checked)."""
    block = re.search(r'^TRAIN="\n(.*?)^"', path.read_text(), re.S | re.M)
    assert block is not None, 'no TRAIN="..." in the script'
    rows = []
    for line in block.group(1).strip().splitlines():
        _, preset, phase, batch, tokens, dtype, layers, wall = line.split()
        rows.append((preset, phase, int(batch), int(tokens), dtype, int(layers), wall))
    return rows


def test_no_training_shape_is_a_held_out_case() -> None:
    train = _training(SCRIPT)
    assert len(train) >= 10
    held = _heldout_cases()
    held_keys = {
        (c["preset"], c["phase"], int(c["batch"]), int(c["kv_len"] if c["phase"] == "decode" else c["seq_len"]))  # type: ignore[call-overload]
        for c in held
    }
    overlap = [t for t in train if t[:4] in held_keys]
    assert overlap == []
    # not even the layer counts: the fit never sees a graph of a held-out case's depth
    assert {t[5] for t in train}.isdisjoint({int(c["layers"]) for c in held})  # type: ignore[call-overload]
    # both phases and every family the held-out set has, but Llama-3.1-70B
    assert {t[1] for t in train} == {"prefill", "decode"}
    assert {str(c["preset"]) for c in held} - {t[0] for t in train} == {"llama-3.1-70b"}


def test_measured_walls_tell_each_term_apart() -> None:
    walls = [t for t in _training(SCRIPT) if t[6] == "1"]
    moe_presets = ("qwen3-30b-a3b", "mixtral-8x7b")
    dense = [t for t in walls if t[0] not in moe_presets and t[1] == "decode"]  # host-bound: the host's wall
    assert len(dense) >= 6
    assert len({t[5] for t in dense}) >= 3  # per forward vs per layer
    assert len({t[2] for t in dense}) >= 3  # light and heavy device work per layer
    # MoE walls in fp16, where torch's C++ fallback of _grouped_mm issues the expert products (nested
    # calls): of two layer counts at least, so the nested scale is told from the per-forward time.
    nested = [t for t in walls if t[0] in moe_presets]
    assert nested and {t[4] for t in nested} == {"fp16"}
    assert len({t[5] for t in nested if t[0] == "qwen3-30b-a3b"}) >= 2
    assert [t for t in walls if t not in dense and t not in nested] == []  # host-bound forwards only


def test_checked_walls_are_device_bound_prefills_dense_and_moe() -> None:
    # Walls measured to check the fitted terms where the device hides host time, never fitted.
    checks = [t for t in _training(SCRIPT) if t[6] == "2"]
    assert {t[1] for t in checks} == {"prefill"}
    assert {t[0] in ("qwen3-30b-a3b", "mixtral-8x7b") for t in checks} == {True, False}
    assert max(t[3] * t[2] for t in checks) >= 2048


def test_round_robin_training_walls_are_the_scripts_measured_walls() -> None:
    # heldout.py --round-robin --train-walls measures the walls the in-context terms are fitted on and
    # checked against (REFIT with WALLS=...): the script's TRAIN lines marked for a wall.
    walls = [t[:6] for t in _training(SCRIPT) if t[6] != "0"]
    rr = [
        (c["preset"], c["phase"], c["batch"], c.get("kv_len", c.get("seq_len")), c["dtype"], c["layers"])
        for c in _heldout_module().TRAIN_WALL_CASES
    ]
    assert sorted(rr) == sorted(walls) and len(rr) == len(set(rr))
