"""The held-out accuracy proof (issue 18): recomputed on the CPU from the committed GPU data.

``benchmarks/gpu/heldout.py`` measured unmodified HF models on the device; ``benchmarks/heldout_report.py``
captures each on meta, simulates it and compares. Here the table is recomputed from the committed
data (``benchmarks/results/gpu/h100/heldout``), checked against the committed report, and the issue's
targets are asserted for the cost model that is the CLI's default. Before that data exists those
tests skip; the whole pipeline is still exercised on tiny fake data made on the CPU in a tmp folder
(``heldout.py --device cpu --tiny``: leaf aten ops stand in for kernels).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import REPO, skip_unless_captured_with

RESULTS = REPO / "benchmarks" / "results" / "gpu" / "h100" / "heldout"

# The issue's targets (issue 18, "Prove it"): on every case, GPU time within 5% and wall time within
# 10% (median of at least 9 runs); median per-op error within 10% (ops of 5 us or more).
GPU_TARGET = 0.05
WALL_TARGET = 0.10
MEDIAN_OP_TARGET = 0.10
MIN_RUNS = 9
MIN_CASES = 10
# The project's own benchmark cases, which a held-out case must not be: (preset, phase, batch, tokens).
BENCHMARK_CASES = {
    ("llama-3.1-8b", "prefill", 1, 2048),
    ("llama-3.1-8b", "decode", 8, 2048),
    ("qwen3-30b-a3b", "prefill", 1, 1024),
}
REL = 1e-6
"""Recomputed numbers must equal the committed report's (the pipeline is deterministic)."""


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


report_mod = _load("heldout_report", REPO / "benchmarks" / "heldout_report.py")
heldout_mod = _load("heldout_gpu", REPO / "benchmarks" / "gpu" / "heldout.py")


def _tokens(s: dict[str, Any]) -> int:
    return int(s["seq_len"] if s["phase"] == "prefill" else s["kv_len"])


def reproduction_gaps(recomputed: dict[str, Any], committed: dict[str, Any]) -> list[str]:
    """Where the recomputed table differs from the committed report (empty: reproduced)."""
    gaps: list[str] = []
    got = {r["case"]: r for r in recomputed["cases"]}
    want = {r["case"]: r for r in committed["cases"]}
    if set(got) != set(want):
        gaps.append(f"cases differ: {sorted(set(got) ^ set(want))}")
    for name in sorted(set(got) & set(want)):
        for label, w in want[name]["predicted"].items():
            g = got[name]["predicted"].get(label)
            if g is None:
                gaps.append(f"{name}: no {label} row recomputed")
                continue
            for key in ("gpu_err", "wall_err", "median_op_err"):
                a, b = g.get(key), w.get(key)
                if (a is None) != (b is None) or (a is not None and not math.isclose(a, b, rel_tol=REL, abs_tol=REL)):
                    gaps.append(f"{name} {label} {key}: recomputed {a}, committed {b}")
    return gaps


def target_misses(report: dict[str, Any], label: str) -> set[tuple[str, str]]:
    """(case, metric) where the ``label`` cost model misses a target; a per-op error that is n/a misses."""
    misses: set[tuple[str, str]] = set()
    for r in report["cases"]:
        p = r["predicted"].get(label, {})
        for metric, target in (("gpu_err", GPU_TARGET), ("wall_err", WALL_TARGET), ("median_op_err", MEDIAN_OP_TARGET)):
            value = p.get(metric)
            if value is None or abs(value) > target:
                misses.add((r["case"], metric))
    return misses


def gpu_misses(report: dict[str, Any], label: str | None = None) -> set[str]:
    """The cases where ``label`` (default: the report's CLI default cost model) misses the GPU-time target."""
    return {c for c, m in target_misses(report, label or report["cli_default_cost_model"]) if m == "gpu_err"}


# ---------------------------------------------------------------- the committed GPU data
DATA = RESULTS / "heldout.tar.gz"
"""What the lead committed from ``benchmarks/gpu/heldout_h100.sh`` (or the unpacked folder)."""

# What the committed data shows, per cost model: the (case, metric) pairs that miss the targets. The
# test fails when a target is newly missed and when a listed miss is met (then shorten the list), so
# it says what is true. The roofline misses nearly every target. With the profile (measured with
# transformers 5.24, the capturing version; its compute-bound points the median of three passes), every target
# is met (the fp16 Qwen3-MoE prefill's +5.2% came mostly from counting each fallback product's output slice as
# bytes read: +1.4% since capture records an ``out=`` argument as written; its random-weight router leaves
# about 25 of 256 expert products idle, which a meta capture's balanced routing charges: README).
ALL = "every case and metric"
KNOWN_MISSES: dict[str, str | set[tuple[str, str]]] = {
    "roofline": {
        ("llama1b_decode_b1_kv512_fp16_l4", "gpu_err"),
        ("llama1b_decode_b1_kv512_fp16_l4", "median_op_err"),
        ("llama1b_decode_b1_kv512_fp16_l4", "wall_err"),
        ("llama1b_prefill_b2_s8192_bf16_l4", "gpu_err"),
        ("llama1b_prefill_b2_s8192_bf16_l4", "median_op_err"),
        ("llama1b_prefill_b2_s8192_bf16_l4", "wall_err"),
        ("llama70b_decode_b8_kv4096_bf16_l2", "gpu_err"),
        ("llama70b_decode_b8_kv4096_bf16_l2", "median_op_err"),
        ("llama70b_decode_b8_kv4096_bf16_l2", "wall_err"),
        ("llama70b_prefill_b1_s2048_bf16_l2", "gpu_err"),
        ("llama70b_prefill_b1_s2048_bf16_l2", "median_op_err"),
        ("llama70b_prefill_b1_s2048_bf16_l2", "wall_err"),
        ("llama8b_decode_b32_kv1024_fp16_l4", "gpu_err"),
        ("llama8b_decode_b32_kv1024_fp16_l4", "median_op_err"),
        ("llama8b_decode_b32_kv1024_fp16_l4", "wall_err"),
        ("llama8b_prefill_b1_s4096_bf16_l4", "gpu_err"),
        ("llama8b_prefill_b1_s4096_bf16_l4", "median_op_err"),
        ("llama8b_prefill_b1_s4096_bf16_l4", "wall_err"),
        ("mixtral_decode_b16_kv2048_fp16_l2", "gpu_err"),
        ("mixtral_decode_b16_kv2048_fp16_l2", "wall_err"),
        ("mixtral_prefill_b1_s2048_bf16_l2", "gpu_err"),
        ("mixtral_prefill_b1_s2048_bf16_l2", "median_op_err"),
        ("mixtral_prefill_b1_s2048_bf16_l2", "wall_err"),
        ("qwen25_7b_decode_b4_kv8192_bf16_l4", "gpu_err"),
        ("qwen25_7b_decode_b4_kv8192_bf16_l4", "median_op_err"),
        ("qwen25_7b_decode_b4_kv8192_bf16_l4", "wall_err"),
        ("qwen25_7b_prefill_b4_s512_fp16_l4", "gpu_err"),
        ("qwen25_7b_prefill_b4_s512_fp16_l4", "median_op_err"),
        ("qwen25_7b_prefill_b4_s512_fp16_l4", "wall_err"),
        ("qwen3moe_decode_b8_kv1024_bf16_l2", "gpu_err"),
        ("qwen3moe_decode_b8_kv1024_bf16_l2", "median_op_err"),
        ("qwen3moe_decode_b8_kv1024_bf16_l2", "wall_err"),
        ("qwen3moe_prefill_b2_s1024_fp16_l2", "median_op_err"),
        ("qwen3moe_prefill_b2_s1024_fp16_l2", "wall_err"),
    },
}


@pytest.fixture(scope="module")
def committed() -> tuple[dict[str, Any], dict[str, Any]]:
    """(recomputed report, committed report) of the committed data."""
    data = DATA if DATA.is_file() else RESULTS
    if not (data.is_file() or (RESULTS / "summary.json").is_file()) or not (RESULTS / "report.json").is_file():
        pytest.skip(f"no committed held-out GPU data yet ({RESULTS.relative_to(REPO)}: heldout.tar.gz, report.json)")
    report = json.loads((RESULTS / "report.json").read_text())
    # The runs measured the models' code of one transformers release; a capture under another is another program.
    skip_unless_captured_with(report["versions"]["transformers"], "the held-out GPU runs and their predictions")
    return report_mod.build_report(data), report


def test_committed_report_is_reproduced_on_the_cpu(committed: tuple[dict[str, Any], dict[str, Any]]) -> None:
    recomputed, report = committed
    assert reproduction_gaps(recomputed, report) == []
    assert recomputed["cli_default_cost_model"] == report["cli_default_cost_model"]


def test_committed_cases_cover_the_issue(committed: tuple[dict[str, Any], dict[str, Any]]) -> None:
    recomputed, _ = committed
    rows = recomputed["cases"]
    assert len(rows) >= MIN_CASES
    assert not any(r["fake_device"] for r in rows)
    presets = {r["preset"] for r in rows}
    assert presets >= {"llama-3.2-1b", "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b", "qwen3-30b-a3b", "mixtral-8x7b"}
    settings = [r["settings"] for r in rows]
    assert {s["phase"] for s in settings} == {"prefill", "decode"}
    assert {s["dtype"] for s in settings} == {"bf16", "fp16"}
    assert all(1 <= s["batch"] <= 32 and 512 <= _tokens(s) <= 8192 for s in settings)
    assert all(r["measured"]["runs"] >= MIN_RUNS for r in rows)
    held = {(r["preset"], r["settings"]["phase"], r["settings"]["batch"], _tokens(r["settings"])) for r in rows}
    assert not held & BENCHMARK_CASES


def _check_misses(report: dict[str, Any], label: str) -> None:
    entry = KNOWN_MISSES.get(label, set())
    misses = target_misses(report, label)
    if isinstance(entry, str):  # ALL
        every = {(r["case"], m) for r in report["cases"] for m in ("gpu_err", "wall_err", "median_op_err")}
        assert misses == every
    else:
        assert sorted(misses - entry) == [], "newly missed targets"
        assert sorted(entry - misses) == [], "targets now met: take them off KNOWN_MISSES"


def test_targets_for_the_cli_default_cost_model(committed: tuple[dict[str, Any], dict[str, Any]]) -> None:
    # The issue's targets are asserted for what a user gets without -c; a model without a KNOWN_MISSES
    # entry must meet every target on every case.
    recomputed, _ = committed
    label = recomputed["cli_default_cost_model"]
    assert label in recomputed["cost_models"], recomputed["skipped_cost_models"]
    _check_misses(recomputed, label)


@pytest.mark.parametrize("label", sorted(KNOWN_MISSES))
def test_the_known_misses_are_what_the_data_shows(committed: tuple[dict[str, Any], dict[str, Any]], label: str) -> None:
    recomputed, _ = committed
    if label not in recomputed["cost_models"]:
        pytest.skip(f"{label} is not available here: {recomputed['skipped_cost_models'].get(label)}")
    _check_misses(recomputed, label)


SUSTAINED_RUNS = sorted((RESULTS.parent / "gemm-regimes").glob("burst_sustained_*.json.gz"))
"""``benchmarks/gpu/sustained_prefill.py`` runs: prefills profiled after idle and after seconds of
back-to-back forwards (the sustained state the device profile's sweep measured its points in)."""


@pytest.mark.skipif(not SUSTAINED_RUNS, reason="no committed sustained-state runs (gemm-regimes/burst_sustained_*)")
def test_every_held_out_prefill_is_within_the_gpu_target_in_the_sustained_state(
    committed: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    # The table's protocol lands its runs between the state after idle and the sustained one (its one
    # GPU-time miss, the Llama-70B prefill, sits near after-idle). Measured in the sustained state, every
    # device-bound held-out prefill (all but the host-bound fp16 Qwen3-MoE one) is within the GPU target of
    # the CLI default's prediction, on each run; after idle every one runs faster than sustained.
    recomputed, _ = committed
    label = recomputed["cli_default_cost_model"]
    predicted = {r["case"]: r["predicted"][label]["gpu_us"] for r in recomputed["cases"]}
    prefills = {c for c in predicted if "_prefill_" in c}
    for path in SUSTAINED_RUNS:
        with gzip.open(path, "rt") as f:
            run = {c["case"]: c for c in json.load(f)["cases"]}
        measured = prefills & set(run)
        assert len(measured) >= 5, path.name
        for case in measured:
            sustained = run[case]["sustained_profiled"]["gpu_us"]["median"]
            after_idle = run[case]["burst_profiled"]["gpu_us"]["median"]
            assert abs(predicted[case] / sustained - 1) <= GPU_TARGET, (path.name, case)
            assert after_idle < sustained, (path.name, case)


def reproduced(folder: Path, what: str, hardware: str = "h100") -> dict[str, Any]:
    """The report of a committed run in ``folder`` recomputed on the CPU, checked against the committed one
    (skips when the run is absent or was captured with another transformers release)."""
    if not (folder / "report.json").is_file():
        pytest.skip(f"no committed {what} ({folder.relative_to(REPO)})")
    report = json.loads((folder / "report.json").read_text())
    skip_unless_captured_with(report["versions"]["transformers"], f"the {what} and its predictions")
    recomputed: dict[str, Any] = report_mod.build_report(folder / "heldout.tar.gz", hardware=hardware)
    assert reproduction_gaps(recomputed, report) == []
    return recomputed


def reproduced_check(folder: Path, what: str, cases: list[dict[str, Any]], hardware: str = "h100") -> dict[str, Any]:
    """:func:`reproduced` for a check run of ``cases`` (``heldout.py``'s list): every case measured, each
    over at least :data:`MIN_RUNS` runs."""
    recomputed = reproduced(folder, what, hardware)
    assert {c["case"] for c in recomputed["cases"]} == {c["case"] for c in cases}
    assert all(r["measured"]["runs"] >= MIN_RUNS for r in recomputed["cases"])
    return recomputed


REPLICATION = RESULTS / "settled-1943"
"""The same 12 cases measured again on another H100 of the pool, hours later, with ``heldout.py --settle-s 3``
(3 s of back-to-back forwards before each case's timing); its walls met the host's slow state (no probes)."""


def test_gpu_time_replicates_on_another_machine_and_hour() -> None:
    # A second measurement of every case's GPU time, never fitted: the CLI default meets the GPU target on
    # every case (the fp16 Qwen3-MoE prefill, whose random-weight router leaves experts idle that balanced
    # routing charges, at +4.4%).
    recomputed = reproduced(REPLICATION, "replication run")
    assert len(recomputed["cases"]) == 12
    label = recomputed["cli_default_cost_model"]
    assert gpu_misses(recomputed, label) == set()


FRESH_RUNS = {
    "after-passes-0106": (
        "run after the three-pass profile",
        12,
        # the 12 cases once more (one pass, 2026-11-27 01:05 UTC) after the device profile's compute-bound
        # points became the median of three passes; walls: a tiny launch 7.6-12.0 us (median 10.5), where
        # the walls the host profile was fitted on ran at 6.4-7.0: 5 of 40 rounds quiet
    ),
    "fallback-check-0322": (
        "fp16 MoE check run",
        4,
        # four fp16 MoE shapes (torch's C++ fallback of _grouped_mm) chosen and measured after the host
        # profile gained the fallback's measured loop; walls (launch median 7.8 us) 10-17% under
    ),
    "after-fallback-0344": (
        "run after the fallback loop",
        12,
        # the 12 cases once more (one pass, 03:44 UTC) after the fallback loop, rebatch's mask fixes and
        # MLA's rope-key append; walls: launch median 10.7 us, some cases with 2 quiet rounds
    ),
    "t517": (
        "transformers 5.17 held-out run",
        12,
        # measured with transformers 5.17 (the GPU image's release), predicted from 5.17 captures (skips
        # under another release: 5.17's MoE experts code launches kernels a 5.24 capture lacks)
    ),
}
"""Runs measured after the changes they check, never fitted (each folder's README): GPU time and per-op
error meet the targets on every case; their walls met the GPU machine's host in its slow state and are
not judged."""


@pytest.mark.parametrize("folder", sorted(FRESH_RUNS))
def test_fresh_runs_meet_the_gpu_and_per_op_targets(folder: str) -> None:
    what, cases = FRESH_RUNS[folder]
    recomputed = reproduced(RESULTS / folder, what)
    assert len(recomputed["cases"]) == cases
    label = recomputed["cli_default_cost_model"]
    assert {(c, m) for c, m in target_misses(recomputed, label) if m != "wall_err"} == set()
    if folder == "fallback-check-0322":
        assert {c["case"] for c in recomputed["cases"]} == {c["case"] for c in heldout_mod.FALLBACK_CHECK_CASES}
        assert all(c["settings"]["dtype"] == "fp16" for c in recomputed["cases"])


CPU_WEIGHTS_RUNS = {
    # folder: (GPU-time misses of the CPU-routed prediction, of the meta capture's balanced routing)
    "cpu-weights-0501": (
        {"qwen3moe_decode_b8_kv1024_bf16_l2", "mixtral_decode_b16_kv2048_fp16_l2",
         "check_mixtral_decode_b4_kv1024_fp16_l2"},
        set(),
    ),
    "cpu-weights-0515": (set(), set()),
}  # fmt: skip
"""MoE cases measured with weights drawn on the CPU (``heldout.py --weights-on cpu``) and predicted from a CPU
capture of those weights (``heldout_routing.py``: ``opgraph capture --device cpu --seed 0``, the model's own
routing), the meta capture beside it (each folder's README)."""


@pytest.mark.parametrize("folder", sorted(CPU_WEIGHTS_RUNS))
def test_a_cpu_capture_of_the_weights_routes_as_the_gpu_run_where_tokens_are_many(folder: str) -> None:
    # The CPU reproduces the GPU run's routing in every first layer of a prefill (the trace shows it for fp16:
    # one mm per expert that got rows); deeper layers and decodes of few tokens differ by a few experts, as
    # CPU and GPU round the same fp16 model differently and a random-weight router meets near ties.
    recomputed = reproduced(RESULTS / folder, "CPU-weights run")
    routed_misses, balanced_misses = CPU_WEIGHTS_RUNS[folder]
    assert recomputed["routing"]
    checks = {r["case"]: r["routing_check"] for r in recomputed["cases"] if "routing_check" in r}
    assert checks and all(r["graph"].startswith("CPU capture") for r in recomputed["cases"])
    for case, check in checks.items():
        cpu, traced = check["graph_products"], check["traced_products"]
        assert len(cpu) == len(traced) == 2
        if "prefill" in case:
            assert cpu[0] == traced[0]
        # two products per expert (gate_up, down): the CPU's experts within one, or 10%, of the GPU's
        assert all(abs(a - b) / 2 <= max(1, 0.1 * b / 2) for a, b in zip(cpu, traced, strict=True))
    label = recomputed["cli_default_cost_model"]
    assert gpu_misses(recomputed, label) == routed_misses
    assert gpu_misses(recomputed, report_mod.BALANCED) == balanced_misses


ROUTING_CHECKS = {
    # folder: (GPU-time misses, {case: (experts over the layers in the graph, in the trace)})
    "routing-check-0534": (
        {"check_mixtral_decode_b3_kv2048_fp16_l4"},
        {"check_mixtral_decode_b4_kv1024_fp16_l8": (44, 42), "check_mixtral_decode_b3_kv2048_fp16_l4": (19, 21)},
    ),
    "routing-check-0544": (
        set(),
        {"check_mixtral_decode_b4_kv512_fp16_l16": (88, 86), "check_qwen3moe_decode_b2_kv512_fp16_l24": (372, 366)},
    ),
}
"""MoE decodes of 2-4 tokens chosen after balanced routing was realised over the layers (each folder's README)."""


@pytest.mark.parametrize("folder", sorted(ROUTING_CHECKS))
def test_balanced_routing_over_the_layers_on_decodes_chosen_after_it(folder: str) -> None:
    # The fp16 traces show each layer's experts: the random-weight routers' totals lie near the expectation the
    # graph's layers hold (rounded per layer: 40, 20, 80, 384); the b3 decode's router used 21 over 4 layers,
    # where uniform picks reach 18.5, and its GPU time is the one miss.
    recomputed = reproduced(RESULTS / folder, "routing check run")
    misses, experts = ROUTING_CHECKS[folder]
    label = recomputed["cli_default_cost_model"]
    assert gpu_misses(recomputed, label) == misses
    checks = {r["case"]: r["routing_check"] for r in recomputed["cases"] if "routing_check" in r}
    got = {c: (sum(x["graph_products"]) // 2, sum(x["traced_products"]) // 2) for c, x in checks.items()}
    assert got == experts


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_random_weight_qwen3_moe_router_leaves_experts_idle_in_every_draw(seed: int) -> None:
    # The main table's fp16 Qwen3-MoE prefill with other seeds of its random weights (README): the second
    # layer's router uses 98-106 of 128 experts each time, and balanced routing's prediction is 1.3-2.7% high
    # (5.1-6.6% before capture stopped counting the fallback's output slices as bytes read: every draw is
    # about as high as the main table's).
    recomputed = reproduced(RESULTS / "router-seeds-0558" / f"seed{seed}", "other-seed run")
    (case,) = recomputed["cases"]
    first, second = (n // 2 for n in case["routing_check"]["traced_products"])
    assert first == 128 and 96 <= second <= 110
    assert case["routing_check"]["graph_products"] == [256, 256]
    assert 0.01 <= case["predicted"][recomputed["cli_default_cost_model"]]["gpu_err"] <= 0.03


AFTER_WRITEBACK: dict[str, tuple[Path, set[str], float]] = {
    "h100": (
        RESULTS / "after-writeback-1622",
        {"llama70b_prefill_b1_s2048_bf16_l2"},
        -0.03,
    ),
    "h200": (REPO / "benchmarks" / "results" / "gpu" / "h200" / "heldout" / "after-writeback-1637", set(), -0.05),
}
"""The 12 cases measured once more on each GPU after the write-back charge was committed (three passes; READMEs
there), data the change never saw: the folder, the GPU-time misses and the lowest decode error."""


@pytest.mark.parametrize("hardware", sorted(AFTER_WRITEBACK))
def test_the_held_out_cases_measured_after_the_write_back_charge(hardware: str) -> None:
    # H100: GPU time within 5% on 11 of 12, every decode -2.7% to -1.0% (-4.9% to -2.0% without the charge), the
    # Llama-70B prefill over (its GEMMs from an idle GPU +5.2%); the fp16 Qwen3-MoE prefill's random router sits on
    # the line (+4.995%; +5.006% before the cost cache was keyed by tensor layouts). H200: 12 of 12, the decodes
    # -4.9% to -1.7% (10 of 12 without: two decodes -5.2% and -6.0%). Per-op 12 of 12 on each. Walls met the host's
    # slow state and are not judged.
    folder, misses, lowest = AFTER_WRITEBACK[hardware]
    recomputed = reproduced_check(folder, f"{hardware} run after the write-back charge", heldout_mod.CASES, hardware)
    assert gpu_misses(recomputed) == misses
    label = recomputed["cli_default_cost_model"]
    assert all(abs(r["predicted"][label]["median_op_err"]) <= 0.10 for r in recomputed["cases"])
    decodes = [r["predicted"][label]["gpu_err"] for r in recomputed["cases"] if "_decode_" in r["case"]]
    assert len(decodes) == 6 and all(lowest < e < 0 for e in decodes)


DEPTH = RESULTS / "depth-2003"
"""Deeper cuts of held-out shapes (``heldout.py --cases depth_...``, one pass): the Llama-70B prefill at 24
layers beside its 2-layer held-out case in the same run, a 24-layer 70B decode and the full 32-layer 8B
prefill; never fitted."""


def test_deeper_cuts_meet_the_gpu_target() -> None:
    # The Llama-70B prefill's shape at 2 and at 24 layers (forwards of 17 and 150 ms: after idle and a full
    # model's sustained state), a 24-layer 70B decode and the whole 32-layer 8B prefill, in one run on one
    # device: every GPU time within the target.
    recomputed = reproduced(DEPTH, "deeper-cut run")
    label = recomputed["cli_default_cost_model"]
    misses = target_misses(recomputed, label)
    # The decode's wall in this sequential pass met the host's slow state (README: its quiet rounds); the
    # 2-layer prefill's wall (+8.4%) is within, its GPU time +2.5%.
    assert misses == {("depth_llama70b_decode_b8_kv4096_bf16_l24", "wall_err")}
    assert {r["settings"]["layers"] for r in recomputed["cases"]} == {2, 24, 32}


NEW_FAMILIES = RESULTS / "new-families-0706"
"""Gemma 3, gpt-oss, DeepSeek-V3 and BLOOM cases, families no GPU measurement had touched (README there)."""


def _attention_err(report: dict[str, Any], case: str) -> float:
    row = next(r for r in report["cases"] if r["case"] == case)
    kinds = row["predicted"][report["cli_default_cost_model"]]["by_kind"]
    return float(next(k["err"] for k in kinds if k["kind"] == "attention"))


def test_families_the_profile_never_saw_show_where_it_does_not_transfer() -> None:
    # README there. Eager attention, priced as one fused kernel when these were measured (gpt-oss's
    # prefill attention -98%), is now priced kernel by kernel; the sweep measures repeat_kv copies, GEMVs
    # over unaligned rows and strided copies; capture keeps BLOOM's Python GELU as its kernels and
    # DeepSeek-V3's MLA key copies as copies (not a cache write): changes made after seeing these data, so
    # in sample for them (out of sample: eager-check-0727, eager-check2-0750, layout-check-0943,
    # rows-check-1015, broadcast-check-1032, and the checks after them). Left: BLOOM's prefill (-8.1%: its
    # half-input softmax and mask add run longer than the points give; its alibi copy and accumulating GEMM
    # are priced as they run since scalar-check-1150 and accumulate-check-1204); with the write-back charge
    # (its memory-bound kernels pay for the lines the kernel before left dirty) -4.8%. Any change shows up here.
    recomputed = reproduced(NEW_FAMILIES, "new-family run")
    assert {c["case"] for c in recomputed["cases"]} == {c["case"] for c in heldout_mod.NEW_FAMILY_CASES}
    assert gpu_misses(recomputed) == set()
    assert abs(_attention_err(recomputed, "new_gptoss_prefill_b1_s2048_bf16_l2")) < 0.1
    walls = {r["case"]: r["measured"].get("wall_source") for r in recomputed["cases"]}
    assert {c for c, w in walls.items() if w} == {
        "new_deepseekv3_decode_b8_kv2048_bf16_l4",
        "new_bloom_prefill_b4_s1024_fp16_l24",
    }


EAGER_CHECK = RESULTS / "eager-check-0727"
"""Eager attention priced kernel by kernel, on shapes chosen before it was run (README there)."""


def test_eager_attention_priced_by_its_kernels_out_of_sample() -> None:
    # Chosen and measured before any prediction of them (the sweep's eager matmuls in the same run): the
    # attention kinds' errors, -96% to -98% when eager attention was priced as the fused kernel, were -42%
    # to +62%, no GPU time within 5% (README there). The sweep then gained float32 softmax points over the
    # column count, repeat_kv copies and score-sized passes, chosen from what these data showed: on them
    # that is in sample, and the Llama-1B and Qwen2.5 eager prefills come within 5%; so are the later
    # unaligned-GEMV points and BLOOM's GELU as its kernels (layout-check-0943), which bring the Llama-8B
    # eager decode and the BLOOM decode within 5%, and the unaligned rows and half-to-float softmax
    # (rows-check-1015), the broadcast passes (broadcast-check-1032), and the scale by a number, casts by
    # the dtype they read, BLOOM's alibi copy and accumulating GEMM, half-input and masked softmaxes
    # (scalar-check-1150 to masked-check-1214): the Llama-1B eager prefill +0.1% (+7.0% before those), the
    # BLOOM prefill -9.7% (-34%).
    recomputed = reproduced(EAGER_CHECK, "eager-attention check")
    assert {c["case"] for c in recomputed["cases"]} | {"new2_gptoss_decode_b16_kv4096_bf16_l2"} == {
        c["case"] for c in heldout_mod.EAGER_CHECK_CASES
    }
    assert gpu_misses(recomputed) == {"new2_bloom_prefill_b1_s2048_fp16_l24"}
    errs = {r["case"]: _attention_err(recomputed, r["case"]) for r in recomputed["cases"]}
    assert all(-0.4 < e < 0.4 for e in errs.values()), errs


EAGER_CHECK2 = RESULTS / "eager-check2-0750"
"""The same check on new shapes, chosen before the sweep's softmax, repeat_kv and pass points ran."""


def test_eager_attention_after_the_sweep_covers_its_passes() -> None:
    # Out of sample for the softmax, repeat_kv and pass points (README there): the eager prefill within 5%,
    # the repeat_kv copies of the GQA decodes within 10% (priced 3x long from the cache-write points
    # before), the decodes' attention 30-50% short: batched GEMVs over kv + 1 keys, unaligned rows. The
    # sweep's unaligned points came after these data (in sample here; out of sample: layout-check-0943)
    # and bring both GQA decodes within 5%, their attention within 15%; with the later row and broadcast
    # changes (rows-check-1015, broadcast-check-1032) all five were within 5%; the masked-softmax points
    # (masked-check-1214) leave the small BLOOM prefill +6.8%. The write-back charge (the attention after
    # the value's repeat_kv copy pays for its dirty lines) takes the Qwen2.5 decode's attention from -5.5%
    # to -0.2% and the Llama-1B one's, priced +12% before, to +22%.
    recomputed = reproduced(EAGER_CHECK2, "second eager-attention check")
    assert {c["case"] for c in recomputed["cases"]} == {c["case"] for c in heldout_mod.EAGER_CHECK2_CASES}
    assert gpu_misses(recomputed) == {"new3_bloom_prefill_b2_s512_fp16_l24"}
    label = recomputed["cli_default_cost_model"]
    bounds = {"eager2_qwen25_decode_b4_kv4096_bf16_l4": 0.05, "eager2_llama1b_decode_b16_kv1024_fp16_l4": 0.25}
    for case, bound in bounds.items():
        row = next(r for r in recomputed["cases"] if r["case"] == case)
        memory = next(k for k in row["predicted"][label]["by_kind"] if k["kind"] == "memory")
        assert abs(memory["err"]) < 0.1
        assert abs(_attention_err(recomputed, case)) < bound


LAYOUT_CHECK = RESULTS / "layout-check-0943"
"""After the sweep measured unaligned GEMVs, strided copies and ungated activations, and capture kept
BLOOM's GELU as its kernels and MLA's key copies as copies: new shapes, chosen before (README there)."""


def test_layouts_the_models_run_out_of_sample() -> None:
    # Chosen before the points ran and before any prediction of them: GPU within 5% on 6 of 8 as first
    # predicted (README there: the eager GQA decodes -2.1% to -2.6%, where the aligned points left them
    # -8.8% and -9.5%; the misses DeepSeek-V3's and gpt-oss's few-token decodes, -7.0% and -7.6%).
    # Recomputed with the later row, half-to-float and broadcast changes (rows-check-1015,
    # broadcast-check-1032, and the eager rounds after them), 5 of 8: the gpt-oss decode -1.6%, the BLOOM
    # prefill -7.0%, the BLOOM decode +5.9% (not examined).
    recomputed = reproduced_check(LAYOUT_CHECK, "layout check", heldout_mod.LAYOUT_CHECK_CASES)
    assert gpu_misses(recomputed) == {
        "check3_deepseekv3_decode_b4_kv1024_bf16_l4",
        "check3_bloom_decode_b8_kv512_fp16_l24",
        "check3_bloom_prefill_b2_s1024_fp16_l24",
    }
    label = recomputed["cli_default_cost_model"]
    # Walls: the DeepSeek-V3 decode -10.5% since the host profile was refitted with the write-back charge (-9.4%).
    walls = {c for c, m in target_misses(recomputed, label) if m == "wall_err"}
    assert walls == {"check3_deepseekv3_decode_b4_kv1024_bf16_l4"}
    roofline = {r["case"]: r["predicted"]["roofline"]["gpu_err"] for r in recomputed["cases"]}
    assert sum(abs(e) <= GPU_TARGET for e in roofline.values()) == 0  # 1 as first predicted: BLOOM's cast


ROWS_CHECK = RESULTS / "rows-check-1015"
"""After eager attention's row-wise passes were priced over their true rows and the half-to-float softmax
folded: new shapes, chosen before (README there)."""


def test_unaligned_rows_out_of_sample() -> None:
    # Chosen before the points ran and before any prediction of them: gpt-oss's prefills -13.8% and -15.1%
    # (-22.9% and -29.9% with the model before: its sinks column's rows), the eager prefills of odd length
    # +6.4% (bf16) and +3.8% (fp16; +11.3% before the half-to-float fold). Recomputed with the broadcast
    # passes and the eager rounds after them (in sample here): gpt-oss -5.4% and -3.7%, the eager prefills
    # +4.2% and -0.3%; with the write-back charge (in sample) gpt-oss -4.2% and -3.3%. Walls are the passes'.
    recomputed = reproduced_check(ROWS_CHECK, "row-alignment check", heldout_mod.ROWS_CHECK_CASES)
    assert gpu_misses(recomputed) == set()
    label = recomputed["cli_default_cost_model"]
    roofline = [r["predicted"]["roofline"]["gpu_err"] for r in recomputed["cases"]]
    ours = [r["predicted"][label]["gpu_err"] for r in recomputed["cases"]]
    assert all(abs(a) < abs(b) for a, b in zip(ours, roofline, strict=True))


BROADCAST_CHECK = RESULTS / "broadcast-check-1032"
"""After the passes reading an operand broadcast over the scores were priced as strided kernels: new
shapes, chosen before (README there)."""


def test_broadcast_passes_out_of_sample() -> None:
    # Chosen before the points ran and before any prediction of them: GPU within 5% on 3 of 5, the gpt-oss
    # prefills +0.9% and -0.5% (-5.5% and -10.8% with the model before), the eager Llama-8B prefill +0.8%;
    # the eager Qwen2.5 prefill +7.6% (+5.6% before) and BLOOM's -8.5% (-12.8% before: its baddbmm) miss.
    # Recomputed since with inputs read through a stride of 0 as a regime of their own: within 0.2 points.
    recomputed = reproduced_check(BROADCAST_CHECK, "broadcast check", heldout_mod.BROADCAST_CHECK_CASES)
    # Recomputed with this session's later changes (in sample): all five within 5% (Qwen2.5 +3.7%, BLOOM -3.2%).
    assert gpu_misses(recomputed) == set()


CHECK_ROUNDS: dict[str, tuple[str, set[str]]] = {
    "scalar-check-1150": (
        "SCALAR_CHECK_CASES",
        {"check6_qwen25_prefill_b2_s1024_bf16_l4", "check6_bloom_prefill_b2_s2048_fp16_l24",
         "check6_bloom_prefill_b8_s512_fp16_l24"},
    ),
    "half-softmax-check-1156": (
        "HALF_SOFTMAX_CHECK_CASES",
        {"check7_bloom_prefill_b4_s2048_fp16_l24", "check7_bloom_prefill_b1_s4096_fp16_l24"},
    ),
    "accumulate-check-1204": (
        "ACCUMULATE_CHECK_CASES",
        {"check8_bloom_prefill_b2_s4096_fp16_l24", "check8_bloom_prefill_b16_s1024_fp16_l24",
         "check8_bloom_prefill_b1_s8192_fp16_l24"},
    ),
    "masked-check-1214": (
        "MASKED_CHECK_CASES",
        {"check9_bloom_prefill_b8_s1024_fp16_l24", "check9_bloom_prefill_b2_s3072_fp16_l24"},
    ),
    "final-check-1248": ("FINAL_CHECK_CASES", {"check10_bloom_decode_b8_kv1024_fp16_l24"}),
    "decode-check-1355": ("DECODE_CHECK_CASES", set()),
    "writeback-check-1530": ("WRITEBACK_CHECK_CASES", set()),
}  # fmt: skip
"""Each check of the eager-attention rounds (and of the fp16 decode attention points after them): its case list in
``heldout.py`` and the cases the current model misses on GPU time (as first predicted: 1 of 6, 3 of 5, 1 of 6, 4
of 6 within 5%; the final model's own check, chosen after its last change, 5 of 6; the decode check 3 of 6, its
misses 5.2-5.4% short, 6 of 6 with the write-back charge; the first write-back check 7 of 8 as first predicted, 8 of
8 with the charge as settled after it (the second: :data:`WRITEBACK_CHECK2`); READMEs there)."""


@pytest.mark.parametrize("folder", sorted(CHECK_ROUNDS))
def test_check_rounds_out_of_sample(folder: str) -> None:
    # Scale by a number, casts by the dtype they read and BLOOM's alibi copy; the half-input softmax; BLOOM's
    # accumulating GEMM; the masked softmax: each checked on cases written down before (READMEs there). Every
    # eager Llama, Vicuna and Qwen2.5 prefill is within 5% now but a bfloat16 Qwen2.5 one (+6.1%: its GEMMs);
    # BLOOM's prefills stay 6.5-12.6% short. The Vicuna decode over 4,096 cached tokens (4,097 positions, past
    # its max_position_embeddings, as transformers runs it) was predicted only once capture took it: -2.4%. The
    # fp16 decode attention points changed nothing (they run as the bf16 ones): three SDPA decodes 5.2-5.4% short,
    # within 5% with the write-back charge (the sweep's writeback points; the checks of it below).
    list_name, misses = CHECK_ROUNDS[folder]
    cases = getattr(heldout_mod, list_name)
    recomputed = reproduced(RESULTS / folder, folder)
    assert not recomputed["skipped_cases"]
    assert {c["case"] for c in recomputed["cases"]} == {c["case"] for c in cases}
    assert all(r["measured"]["runs"] >= MIN_RUNS for r in recomputed["cases"])
    assert gpu_misses(recomputed) == misses
    roofline = {r["case"]: r["predicted"]["roofline"]["gpu_err"] for r in recomputed["cases"]}
    assert not any(abs(e) <= GPU_TARGET for e in roofline.values())


WRITEBACK_CHECK2 = {
    "h100": (
        RESULTS / "writeback-check2-1547",
        {"check13_mixtral_decode_b16_kv1024_bf16_l2", "check13_llama70b_prefill_b1_s1024_bf16_l2"},
        {"check13_llama1b_decode_b16_kv4096_fp16_l4", "check13_mixtral_decode_b16_kv1024_bf16_l2",
         "check13_llama70b_prefill_b1_s1024_bf16_l2"},
    ),
    "h200": (
        REPO / "benchmarks" / "results" / "gpu" / "h200" / "heldout" / "writeback-check2-1550",
        {"check13_llama70b_prefill_b1_s1024_bf16_l2"},
        {"check13_llama70b_decode_b8_kv2048_fp16_l2", "check13_llama1b_decode_b16_kv4096_fp16_l4",
         "check13_vicuna_decode_b8_kv2048_fp16_l4", "check13_llama70b_prefill_b1_s1024_bf16_l2"},
    ),
}  # fmt: skip
"""The write-back charge's check on each GPU (cases written down before they were measured, after the charge was
settled: README there): the folder and the cases missing the GPU target with the charge and without it."""


@pytest.mark.parametrize("hardware", sorted(WRITEBACK_CHECK2))
def test_the_write_back_charge_out_of_sample(hardware: str) -> None:
    # Six SDPA decodes and two prefills: with the charge 6 of 8 within 5% on the H100 and 7 of 8 on the H200,
    # without it 5 and 4; the decodes' mean error halves. The misses: the Mixtral decode's few tokens per
    # expert (-5.1%), the Llama-70B prefill's GEMMs from an idle GPU (the profile's are a sustained one's).
    folder, misses, misses_without = WRITEBACK_CHECK2[hardware]
    recomputed = reproduced_check(folder, f"{hardware} write-back check", heldout_mod.WRITEBACK_CHECK2_CASES, hardware)
    assert gpu_misses(recomputed) == misses
    from hardware import ProfileModel, load_hardware

    hw = load_hardware(hardware)
    with tempfile.TemporaryDirectory() as tmp:
        data = report_mod.open_data(folder / "heldout.tar.gz", Path(tmp))
        _, cases = report_mod.load_cases(data)
        without = {
            c["case"]: report_mod.evaluate_case(data, c, hw, {"off": ProfileModel(writeback=False)}, [])["predicted"][
                "off"
            ]["gpu_err"]
            for c in cases
        }
    assert {c for c, e in without.items() if abs(e) > GPU_TARGET} == misses_without
    label = recomputed["cli_default_cost_model"]
    decodes = [r for r in recomputed["cases"] if "_decode_" in r["case"]]
    charged = statistics.fmean(abs(r["predicted"][label]["gpu_err"]) for r in decodes)
    plain = statistics.fmean(abs(without[r["case"]]) for r in decodes)
    assert charged < 0.65 * plain


FAMILY_CHECKS = {
    "family-check-1950": ("FAMILY_CHECK_CASES", {"check14_starcoder2_decode_b4_kv4096_bf16_l4"}),
    "family-check2-2005": ("FAMILY_CHECK2_CASES", set()),
    "falcon-check-2022": ("FALCON_CHECK_CASES", {"check16_falcon_decode_b16_kv1024_fp16_l4"}),
    "olmo2-check-2107": ("OLMO2_CHECK_CASES", {"check17_olmo2_decode_b16_kv1024_bf16_l4"}),
    "moe-family-check-2224": ("MOE_FAMILY_CHECK_CASES", set()),
    "moe-loop-check-2231": ("MOE_LOOP_CHECK_CASES", set()),
}  # fmt: skip
"""Families no measurement had seen, each from a local config.json (READMEs there), and the GPU-time misses of
each. The first run found where the profile did not transfer (6 of 12 within 5%: a cost cache that kept one layout
per op config, dense GEMMs over unaligned rows, decodes that fill a sliding window, SDPA's math path, OLMo 2's
float32 rotary tables), and the changes that followed are in sample for it. The second run's cases were written
down after the first three changes and before its measurement: out of sample for them (its 11 of 12 then; its
Falcon and OLMo 2 decodes are in sample for the later two). The Falcon run's were written down after the math path
was first priced; the keys' copy was then found to read their transpose, from the first run's trace but after the
Falcon run's errors were seen, so that run is in sample for it. The OLMo 2 run's were written down after the
float-tables rotary regime and before its points: out of sample for it (READMEs there). The MoE runs: fp16 prefills
after capture stopped counting an ``out=`` buffer as read, and Qwen2-MoE (6 of 8 first: its fp16 expert products
13-41% long, from loop points of two layers' shapes), then loop points of five layers on one row grid, the regime
along each product's bytes, and six new fp16 shapes written down before those points were measured (6 of 6)."""


@pytest.mark.parametrize("folder", sorted(FAMILY_CHECKS))
def test_families_no_measurement_had_seen(folder: str) -> None:
    # Left: StarCoder2's masked decode over 24 query heads per 2 key heads, a group of 12 the sweep's masked points
    # (1 and 4) do not reach (-9.6%); a Falcon decode of 16 sequences, whose math path's key copy over 1,025 keys the
    # points price above what it runs (+15%); an OLMo 2 decode (-5.2%: its q/k norms, which also compute in float32).
    list_name, misses = FAMILY_CHECKS[folder]
    recomputed = reproduced_check(RESULTS / folder, folder, getattr(heldout_mod, list_name))
    assert gpu_misses(recomputed) == misses
    roofline = {r["case"]: r["predicted"]["roofline"]["gpu_err"] for r in recomputed["cases"]}
    assert sum(abs(e) <= GPU_TARGET for e in roofline.values()) == 0


H200 = REPO / "benchmarks" / "results" / "gpu" / "h200" / "heldout"
"""The 12 held-out cases measured on an H200 and predicted with ``-H h200`` (its own profile)."""
H200_MISSES: set[tuple[str, str]] = set()
"""What the H200 data shows for the CLI default (README there: walls pooled over two round-robin runs, the
fp16 Mixtral decode -10.1% from the first alone, -7.6% pooled; the Mixtral prefill's GPU time, +6.2% with
the one-pass profile points, is +2.2% with the three-pass ones)."""


FRESH_SWEEPS = {
    "fresh-1724": ("h100", "h100-sxm"),
    "fresh-1743": ("h100", "h100-sxm"),
    "fresh-1804": ("h200", "h200"),
    "fresh-2209": ("h100", "h100-sxm"),
    "fresh-2245": ("h100", "h100-sxm"),
}
"""Whole sweeps measured from nothing (``benchmarks/gpu/profile_fresh.sh``; folder -> GPU folder, catalog
name): ``fresh-1724`` before the sweep timed a reference call beside each point's issue time, the others
after (commit 07260e8); ``fresh-2209`` of the 1,474-point plan, ``fresh-2245`` of the 1,504-point one."""


def _fresh_profile(name: str, tmp: Path, *, as_measured: bool = False) -> tuple[Path, Path, str]:
    """(profile file in ``tmp``, its folder, the GPU's catalog name) of the committed fresh sweep ``name``;
    ``as_measured``: its host times unscaled (no reference: the sweep's host as it ran, the aten issue
    time its launch points' median)."""
    gpu, catalog = FRESH_SWEEPS[name]
    folder = REPO / "benchmarks" / "results" / "gpu" / gpu / "profile" / name
    gz = folder / f"{catalog}.profile.json.gz"
    if not gz.is_file():
        pytest.skip(f"no committed fresh sweep {gz.relative_to(REPO)}")
    data = json.loads(gzip.decompress(gz.read_bytes()))
    if as_measured:
        launch = [p["host_s"] for p in data["points"] if p.get("tag") == "launch" and p.get("host_s")]
        data |= {"host_ref_us": None, "aten_issue_us": statistics.median(launch) * 1e6}
    path = tmp / f"{name}{'-as-measured' if as_measured else ''}.profile.json"
    path.write_text(json.dumps(data))
    return path, folder, catalog


def _held_out_data(gpu: str) -> Path:
    data = REPO / "benchmarks" / "results" / "gpu" / gpu / "heldout" / "heldout.tar.gz"
    if not data.is_file():
        pytest.skip(f"no committed held-out data {data.relative_to(REPO)}")
    return data


@pytest.mark.parametrize("name", list(FRESH_SWEEPS))
def test_a_whole_sweep_from_nothing_reproduces_the_shipped_profile_and_its_gpu_times(name: str, tmp_path: Path) -> None:
    """A user's own `opgraph profile --device cuda` on another GPU of the kind, hours after the shipped
    points: the same points within a few percent, and the held-out cases' GPU time within 5% on every case."""
    from hardware import load_profile
    from validators.profile import sweep_key

    path, folder, catalog = _fresh_profile(name, tmp_path)
    fresh, shipped = load_profile(path), load_profile(REPO / "hardware" / "catalog" / f"{catalog}.profile.json")
    assert fresh.complete and len(fresh.points) == fresh.planned
    theirs = {sweep_key(p): p.seconds for p in shipped.points}  # the same op measured, whatever its stored key
    ratios = sorted(p.seconds / theirs[sweep_key(p)] for p in fresh.points if sweep_key(p) in theirs)
    assert len(ratios) >= 0.95 * len(fresh.points)  # the shipped profile has grown since, and left a few out
    q = lambda f: ratios[int(f * (len(ratios) - 1))]  # noqa: E731
    assert 0.99 <= q(0.5) <= 1.01 and q(0.05) >= 0.96 and q(0.95) <= 1.04, (q(0.05), q(0.5), q(0.95))
    report = json.loads((folder / "report.json").read_text())
    skip_unless_captured_with(report["versions"]["transformers"], "the held-out GPU runs and their predictions")
    recomputed = report_mod.build_report(_held_out_data(FRESH_SWEEPS[name][0]), hardware=catalog, device_profile=path)
    assert reproduction_gaps(recomputed, report) == []
    within = recomputed["within_targets"]["profile"]
    assert within["gpu"] == within["per_op"] == len(recomputed["cases"]) == 12


@pytest.mark.parametrize("name", ["fresh-1743", "fresh-1804"])
def test_host_times_scaled_to_the_fast_host_give_every_held_out_wall(name: str, tmp_path: Path) -> None:
    """With each point's host time scaled by the reference call timed beside it, the sweeps of 17:43 (H100)
    and 18:04 (H200) predict every held-out wall within 10%. Their hosts drifted: the H200 sweep's launch
    points met it at 11.1 us per aten call as measured, 9.4 scaled, and its other points slower still; as
    measured (scaled at the aten call only, by the host profile's calibration) five of its six decodes'
    walls come out 11-19% high, every decode's 6-11 points higher."""
    path, _, catalog = _fresh_profile(name, tmp_path)
    data = _held_out_data(FRESH_SWEEPS[name][0])
    scaled = report_mod.build_report(data, hardware=catalog, device_profile=path)
    assert scaled["within_targets"]["profile"]["wall"] == 12
    if name == "fresh-1804":
        raw_path, _, _ = _fresh_profile(name, tmp_path, as_measured=True)
        raw = report_mod.build_report(data, hardware=catalog, device_profile=raw_path)
        assert raw["within_targets"]["profile"]["wall"] <= 8
        for a, b in zip(scaled["cases"], raw["cases"], strict=True):
            if a["settings"]["phase"] == "decode":
                assert b["predicted"]["profile"]["wall_err"] > a["predicted"]["profile"]["wall_err"] + 0.05, a["case"]


def test_pooled_sweeps_meet_the_table_but_miss_the_sustained_state_so_the_shipped_profile_stays(
    tmp_path: Path,
) -> None:
    """The shipped H100 profile pooled with the two fresh sweeps (`opgraph profile --pool`, each point the
    median of every pass): the held-out table's GPU time within 5% on 12 of 12 (the shipped profile: 11), but
    the Llama-70B prefill measured in the sustained state, which the shipped profile predicts within 5%, is
    predicted more than 5% short: why the pooled profile is not shipped (README, "Pooled sweeps")."""
    from hardware import load_profile
    from validators.profile import pool_profiles

    if not SUSTAINED_RUNS:
        pytest.skip("no committed sustained-state runs (gemm-regimes/burst_sustained_*)")
    fresh = [load_profile(_fresh_profile(name, tmp_path)[0]) for name in ("fresh-1724", "fresh-1743")]
    shipped = load_profile(REPO / "hardware" / "catalog" / "h100-sxm.profile.json")
    pooled = pool_profiles([shipped, *fresh]).save(tmp_path / "pooled.profile.json")
    report = json.loads((RESULTS / "report.json").read_text())
    skip_unless_captured_with(report["versions"]["transformers"], "the held-out GPU runs and their predictions")
    recomputed = report_mod.build_report(_held_out_data("h100"), device_profile=pooled)
    assert recomputed["within_targets"]["profile"]["gpu"] == 12
    case = "llama70b_prefill_b1_s2048_bf16_l2"
    predicted = next(r["predicted"]["profile"]["gpu_us"] for r in recomputed["cases"] if r["case"] == case)
    errors = []
    for path in SUSTAINED_RUNS:
        with gzip.open(path, "rt") as f:
            run = {c["case"]: c for c in json.load(f)["cases"]}
        if case in run:
            errors.append(predicted / run[case]["sustained_profiled"]["gpu_us"]["median"] - 1)
    assert errors and min(errors) < -GPU_TARGET, errors


def test_the_h200_cases_are_predicted_from_the_h200_profile() -> None:
    recomputed = reproduced(H200, "H200 held-out runs", hardware="h200")
    assert recomputed["measured_on"]["name"] == "NVIDIA H200" and recomputed["hardware"] == "h200"
    assert len(recomputed["cases"]) == 12 and all(r["measured"]["runs"] >= MIN_RUNS for r in recomputed["cases"])
    assert target_misses(recomputed, recomputed["cli_default_cost_model"]) == H200_MISSES


def test_deeper_cuts_on_the_h200() -> None:
    # The same deeper cuts on an H200, predicted from its profile. The 24-layer 70B prefill (150 ms
    # forwards, run after run: the sustained power state) is -6.7% with the three-pass profile points
    # (-4.5% with the one-pass ones, whose 70B GEMM points had been measured slow), its 2-layer cut +2.6%;
    # the 24-layer decode's wall in this sequential pass met the host's slow state (wall spread 54%).
    recomputed = reproduced(H200 / "depth-2132", "H200 deeper-cut run", hardware="h200")
    misses = target_misses(recomputed, recomputed["cli_default_cost_model"])
    assert misses == {
        ("depth_llama70b_prefill_b1_s2048_bf16_l24", "gpu_err"),
        ("depth_llama70b_decode_b8_kv4096_bf16_l24", "wall_err"),
    }


# ---------------------------------------------------------------- the pipeline, on fake CPU data
@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Tiny models 'measured' on the CPU by heldout.py, and the report built from them."""
    out = tmp_path_factory.mktemp("heldout")
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu" / "heldout.py"), "--device", "cpu", "--tiny", "--runs", "3",
         "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return out, report_mod.build_report(out)


def test_fake_data_goes_through_the_whole_report(fake: tuple[Path, dict[str, Any]]) -> None:
    out, report = fake
    summary = json.loads((out / "summary.json").read_text())
    assert [c["case"] for c in summary["cases"]] == [r["case"] for r in report["cases"]]
    assert "roofline" in report["cost_models"]
    for r in report["cases"]:
        case = json.loads((out / f"{r['case']}.json").read_text())
        roof = r["predicted"]["roofline"]
        # The errors are against the median of the measured runs, not the kept trace's run.
        assert roof["gpu_err"] == pytest.approx(roof["gpu_us"] / case["gpu_us"]["median"] - 1)
        assert roof["wall_err"] == pytest.approx(roof["wall_us"] / case["wall_us"]["median"] - 1)
        assert r["fake_device"]
    md = report_mod.render_markdown(report)
    assert all(r["case"] in md for r in report["cases"]) and "CPU smoke data" in md


MOE_PRESETS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-20b")
"""The tiny cases' MoE presets."""
EAGER_ONLY = ("gpt-oss-20b", "bloom-560m")
"""Presets whose transformers models have no SDPA path: heldout.py runs them with eager attention, as
``opgraph capture`` records them."""


def test_dense_models_kernels_are_attributed_to_ops(fake: tuple[Path, dict[str, Any]]) -> None:
    _, report = fake
    dense = [r for r in report["cases"] if r["preset"] not in (*MOE_PRESETS, *EAGER_ONLY)]
    assert dense
    for r in dense:
        att = r["attribution"]
        assert att["aligned"], att
        assert att["attributed_share"] > 0.9
        assert r["predicted"]["roofline"]["median_op_err"] is not None
        assert r["predicted"]["roofline"]["matched_ops"] > 0


def test_eager_only_models_run_with_eager_attention(fake: tuple[Path, dict[str, Any]]) -> None:
    out, report = fake
    eager = [r for r in report["cases"] if r["preset"] in EAGER_ONLY]
    assert {r["preset"] for r in eager} == set(EAGER_ONLY)
    for r in eager:
        assert json.loads((out / f"{r['case']}.json").read_text())["attention"].startswith("eager")
        assert r["predicted"]["roofline"]["gpu_us"] > 0
        # On the CPU the stand-in kernels of eager attention (leaf aten ops, more of them between the
        # matmuls than a GPU launches) are not typed as attention, so the trace shows no layers and the
        # comparison stays at step level; the GPU traces of these models line up (new-families-0706).
        assert not r["attribution"]["aligned"]


def test_moe_blocks_line_up_with_the_trace(fake: tuple[Path, dict[str, Any]]) -> None:
    _, report = fake
    # gpt-oss's eager attention leaves its CPU stand-in trace without layers (the eager test above)
    moe = [r for r in report["cases"] if r["preset"] in MOE_PRESETS and r["preset"] not in EAGER_ONLY]
    assert moe
    for r in moe:
        att = r["attribution"]
        # Capture runs the model's own experts code (issue 18 item 5), so the experts' calls pair with
        # the trace's like any other module's, by module ranges.
        assert att["method"].startswith("kernels attributed to ops by the trace's module ranges"), att
        assert "model.layers.0.mlp.experts" not in att["method"].split("not lined up:")[-1]
        assert att["aligned"]
        assert r["predicted"]["roofline"]["median_op_err"] is not None


def test_the_kept_trace_is_the_run_it_names(fake: tuple[Path, dict[str, Any]]) -> None:
    out, _ = fake
    for p in sorted(out.glob("*.json")):
        if p.name in ("summary.json",) or p.name.endswith(".config.json"):
            continue
        case = json.loads(p.read_text())
        with gzip.open(out / case["trace_file"], "rt") as f:
            trace = json.load(f)
        runs = heldout_mod.split_runs(trace)
        assert [r["index"] for r in runs] == [case["trace_run"]]
        assert runs[0]["gpu_us"] == pytest.approx(case["trace_gpu_us"])
        assert case["trace_gpu_us"] in case["gpu_us"]["runs"]
        assert len(case["gpu_us"]["runs"]) == len(case["wall_us"]["runs"]) == case["runs"]


def test_a_written_report_is_reproduced_and_the_checks_can_fail(
    fake: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, report = fake
    report_mod.write_report(report, tmp_path)
    written = json.loads((tmp_path / "report.json").read_text())
    assert reproduction_gaps(report_mod.build_report(out), written) == []
    first = written["cases"][0]["case"]
    written["cases"][0]["predicted"]["roofline"]["gpu_err"] += 0.01
    a, b = (
        report["cases"][0]["predicted"]["roofline"]["gpu_err"],
        written["cases"][0]["predicted"]["roofline"]["gpu_err"],
    )
    assert reproduction_gaps(report, written) == [f"{first} roofline gpu_err: recomputed {a}, committed {b}"]
    # The roofline against CPU stand-in kernels misses every target; a perfect prediction meets them.
    assert target_misses(report, "roofline")
    perfect = {"gpu_err": 0.0, "wall_err": 0.0, "median_op_err": 0.0}
    ok = {"cases": [{"case": r["case"], "predicted": {"roofline": perfect}} for r in report["cases"]]}
    assert target_misses(ok, "roofline") == set()


def test_moe_cases_are_predicted_from_a_cpu_capture_of_their_weights(
    fake: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    # heldout.py draws the weights on the CPU (here the device itself) with a known seed; heldout_routing.py
    # captures each MoE case on the CPU with that seed (opgraph capture --device cpu --seed), and the report
    # predicts those cases from that graph (the model's own routing) with the meta capture beside it.
    out, report = fake
    graphs = tmp_path / "routing_graphs.tar.gz"
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "heldout_routing.py"), str(out), "-o", str(graphs)],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    routed = report_mod.build_report(out, routing_graphs=graphs)
    assert routed["routing"] and report.get("routing") is None
    for before, after in zip(report["cases"], routed["cases"], strict=True):
        if before["preset"] in MOE_PRESETS:
            assert after["graph"].startswith("CPU capture of the measured weights (seed 0)")
            # the meta capture's prediction is the balanced column, the cost models' own the CPU graph's
            default = routed["cli_default_cost_model"]
            assert after["predicted"][report_mod.BALANCED]["gpu_us"] == before["predicted"][default]["gpu_us"]
            if before["preset"] not in EAGER_ONLY:
                assert after["predicted"]["roofline"]["median_op_err"] is not None
        else:  # a dense case is captured on meta as before
            assert after["predicted"] == before["predicted"] and after["graph"] == before["graph"]
    md = report_mod.render_markdown(routed)
    assert "on meta (balanced) GPU err" in md and "Routing: MoE cases predicted from" in md
    # Data whose MoE weights no CPU can redo (none drawn there, or no MoE case) is a one-line error.
    dense = tmp_path / "dense"
    dense.mkdir()
    moe_cases = {r["case"] for r in report["cases"] if r["preset"] in MOE_PRESETS}
    kept = [c for c in json.loads((out / "summary.json").read_text())["cases"] if c["case"] not in moe_cases]
    (dense / "summary.json").write_text(json.dumps({"cases": kept}))
    for c in kept:
        for suffix in (".json", ".config.json"):
            (dense / f"{c['case']}{suffix}").write_text((out / f"{c['case']}{suffix}").read_text())
    for data in (dense, tmp_path / "missing"):
        res = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "heldout_routing.py"), str(data)],
            capture_output=True, text=True, cwd=REPO, timeout=120,
        )  # fmt: skip
        assert res.returncode == 2 and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_report_cli_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "heldout_report.py"), str(tmp_path / "missing")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "missing" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "heldout_report.py"), str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2 and "summary.json" in res.stderr and "Traceback" not in res.stderr


def test_measurement_needs_nine_runs() -> None:
    res = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu" / "heldout.py"), "--out", "/nonexistent", "--runs", "5"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2 and "--runs" in res.stderr


def test_settling_runs_the_forward_back_to_back_for_the_time_asked() -> None:
    # heldout.py --settle-s: the sustained power state before a case's timing (a fresh cache each forward).
    class Counting:
        fresh_calls = runs = 0

        def fresh(self) -> None:
            self.fresh_calls += 1

        def run(self, cache: None) -> None:
            self.runs += 1

    phase = Counting()
    got = heldout_mod.settle(phase, 0.05, "cpu")  # type: ignore[arg-type]
    assert got["forwards"] == phase.runs == phase.fresh_calls >= 2 and got["seconds"] >= 0.05
    assert got["sm_clock"] is None  # read only on a GPU
    phase = Counting()
    assert heldout_mod.settle(phase, 0.0, "cpu")["forwards"] == 2  # at least two, whatever the time


def test_a_real_gpu_trace_splits_into_runs_whose_kept_trace_opgraph_imports(traces_dir: Path, tmp_path: Path) -> None:
    from opgraph.trace import load_trace

    trace = json.loads(gzip.decompress((traces_dir / "hf-llama-1b-like-h200-prefill512-decode8.json.gz").read_bytes()))
    evs = trace["traceEvents"]
    host = [e for e in evs if e.get("cat") == "cpu_op"]
    first, last = min(e["ts"] for e in host), max(e["ts"] + e["dur"] for e in host)
    cut = sorted(e["ts"] for e in host)[len(host) // 2]
    where = {"ph": "X", "cat": "user_annotation", "pid": host[0]["pid"], "tid": host[0]["tid"]}
    evs.append({**where, "name": "heldout_run_0", "ts": first, "dur": cut - first - 1e-3})
    evs.append({**where, "name": "heldout_run_1", "ts": cut, "dur": last - cut})
    runs = heldout_mod.split_runs(trace)
    assert [r["index"] for r in runs] == [0, 1]
    device = sum(e["dur"] for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    assert all(r["gpu_us"] > 0 for r in runs)
    assert sum(r["gpu_us"] for r in runs) == pytest.approx(device, rel=1e-9)
    for r in runs:
        path = tmp_path / f"run{r['index']}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(heldout_mod.trim_to_run(trace, r)).encode()))
        timeline = load_trace(path)
        # What opgraph compare counts as device time is the run's GPU time.
        assert sum(s.dur_us for s in timeline.device_spans()) == pytest.approx(r["gpu_us"], rel=1e-6)
        assert len(timeline.device_spans()) == r["device_events"]


def test_a_real_hf_trace_lines_up_with_a_meta_recording_made_here(traces_dir: Path, tmp_path: Path) -> None:
    # The H200 trace was made with torch 2.11 + transformers 5.17 (as the GPU machine runs) and without
    # module ranges, the capture here with whatever this machine has: opgraph compare --graph (the report's
    # per-op method) still gives the flash kernels to the attention ops and nothing of another kind to an op.
    from hardware import load_hardware
    from opgraph.capture.api import CaptureOptions, record
    from opgraph.compare import compare_timelines
    from opgraph.trace import load_trace

    config = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    rec = record(str(tmp_path / "config.json"), CaptureOptions(phase="prefill", seq_len=512, dtype="bf16"))
    hw = load_hardware("h200")
    tl, *_ = report_mod.predict(rec.graph, hw, report_mod.resolve_model("roofline", hw))
    trace = load_trace(traces_dir / "hf-llama-1b-like-h200-prefill512-decode8.json.gz")
    c = compare_timelines(tl, trace, graph=rec.graph)
    assert c.level == "op", c.notes
    assert any(n.startswith("kernels attributed to ops") for n in c.notes)
    attention = next(g for g in c.by_kind if g.group == "attention")
    assert attention.ops == config["num_hidden_layers"] and attention.reference_us > 0


def test_a_case_capture_refuses_is_listed_as_not_predicted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A measured case whose shape ``opgraph capture`` refuses is reported as not predicted, with the capture's
    message, and the other cases are reported as before."""
    from opgraph.capture.api import CaptureError

    folder = RESULTS / "final-check-1248"
    if not (folder / "heldout.tar.gz").is_file():
        pytest.skip(f"no committed final check ({folder.relative_to(REPO)})")
    skip_unless_captured_with(json.loads((folder / "report.json").read_text())["versions"]["transformers"], "it")
    evaluate = report_mod.evaluate_case
    refused = "check10_bloom_decode_b8_kv1024_fp16_l24"

    def refusing(data: Path, case: dict[str, Any], *args: Any) -> dict[str, Any]:
        if case["case"] == refused:
            raise CaptureError("1025 positions exceed the model's learned position table", where="--kv-len")
        return evaluate(data, case, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(report_mod, "evaluate_case", refusing)
    report = report_mod.build_report(folder / "heldout.tar.gz", hardware="h100")
    assert report["skipped_cases"] == [
        {
            "case": refused,
            "status": "not predicted",
            "note": "opgraph capture: --kv-len: 1025 positions exceed the model's learned position table",
        }
    ]
    assert len(report["cases"]) == len(heldout_mod.FINAL_CHECK_CASES) - 1
    assert f"- {refused}: not predicted (opgraph capture: --kv-len: 1025" in report_mod.render_markdown(report)


def test_eager_attention_gets_its_kernels_in_a_real_trace(tmp_path: Path) -> None:
    """``opgraph compare``'s per-op view of an eager Llama prefill (the final check's, 4 layers): each eager
    attention op gets all of its kernels, from the score GEMM to the weighted values (none left unowned in
    the attention group), and each rope its own, though ``matmul`` launches the query's layout copy before the
    GEMM it is called for (units in kernel order) and capture keeps that copy out of the query's rope."""
    from hardware import load_hardware
    from opgraph.compare import compare_timelines
    from opgraph.compare.loading import load_any_timeline

    final = RESULTS / "final-check-1248"
    data = final / "heldout.tar.gz"
    if not data.is_file():
        pytest.skip(f"no committed final check ({final.relative_to(REPO)})")
    skip_unless_captured_with(json.loads((final / "report.json").read_text())["versions"]["transformers"], "it")
    folder = report_mod.open_data(data, tmp_path)
    _, cases = report_mod.load_cases(folder)
    case = next(c for c in cases if c["case"] == "check10_llama1b_prefill_b8_s1024_bf16_l4")
    graph = report_mod.case_graph(folder, case)
    hw = load_hardware("h100")
    timeline, *_ = report_mod.predict(graph, hw, report_mod.resolve_model(report_mod.cli_default_cost_model(hw), hw))
    cmp = compare_timelines(timeline, load_any_timeline(folder / case["trace_file"]), graph=graph)
    (group,) = (g for g in cmp.by_kind if g.group == "attention")
    assert group.unmatched_reference_us == 0
    rows = [r for r in cmp.ops if r.kind == "attention"]
    assert len(rows) == 4 and all(r.reference_us > 0.24 * group.reference_us for r in rows)
    for r in (r for r in cmp.ops if r.kind == "rope"):
        assert r.reference_us == pytest.approx(r.predicted_us, rel=0.1), r.definition
