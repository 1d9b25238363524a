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


def _training(path: Path) -> list[tuple[str, str, int, int, str, int, bool]]:
    block = re.search(r'^TRAIN="\n(.*?)^"', path.read_text(), re.S | re.M)
    assert block is not None, 'no TRAIN="..." in the script'
    rows = []
    for line in block.group(1).strip().splitlines():
        _, preset, phase, batch, tokens, dtype, layers, wall = line.split()
        rows.append((preset, phase, int(batch), int(tokens), dtype, int(layers), wall == "1"))
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
    walls = [t for t in _training(SCRIPT) if t[6]]
    dense = [t for t in walls if t[0] not in ("qwen3-30b-a3b", "mixtral-8x7b")]
    assert len(dense) >= 6
    assert {t[1] for t in dense} == {"decode"}  # host-bound: their wall is the host's
    assert len({t[5] for t in dense}) >= 3  # per forward vs per layer
    assert len({t[2] for t in dense}) >= 3  # light and heavy device work per layer
    # MoE walls in fp16, where torch's C++ fallback of _grouped_mm issues the expert products (nested
    # calls): of two layer counts at least, so the nested scale is told from the per-forward time.
    moe = [t for t in walls if t not in dense]
    assert moe and {t[4] for t in moe} == {"fp16"}
    assert len({t[5] for t in moe if t[0] == "qwen3-30b-a3b"}) >= 2


def test_round_robin_training_walls_are_the_scripts_measured_decodes() -> None:
    # heldout.py --round-robin --train-walls measures the walls the in-context terms are fitted on (REFIT
    # with WALLS=...): the same decodes as the script's TRAIN lines marked for a wall.
    walls = [t[:6] for t in _training(SCRIPT) if t[6]]
    rr = [
        (c["preset"], c["phase"], c["batch"], c.get("kv_len", c.get("seq_len")), c["dtype"], c["layers"])
        for c in _heldout_module().TRAIN_WALL_CASES
    ]
    assert sorted(rr) == sorted(walls) and len(rr) == len(set(rr))
