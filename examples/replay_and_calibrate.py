"""Replay a model's unique ops on the CPU, then calibrate a cost table from the measurements.

Scenario: before trusting a simulation of a device, measure what its kernels really take. The
graph of one Llama-3.2-1B decoder layer (a short prefill of 16 tokens, meta capture) is folded into
its unique op configs; the embedding and the lm_head (128256-row vocabulary: a GB each in fp32)
stay out to keep the example quick. Each config is replayed on this machine's CPU with synthetic inputs of the
right shapes, checked against a float64 reference and timed; ``fit_cost_table`` turns the timings
into a calibrated cost table for the CPU spec (exact entries per config, per-kind roofline scales
for shapes it has not seen, launch and host overheads). The table then costs the same graph.

Timings depend on the machine, so the script prints only what does not: how many configs there
are, how each replay ended, and what the table holds. Run it as
``python examples/replay_and_calibrate.py [calibrated.json]`` (with a path it saves the table, which
``opgraph simulate GRAPH --hardware calibrated.json --cost-model calibrated.json`` takes).
"""

from __future__ import annotations

import sys
from collections import Counter

from hardware import Measurement, TableModel, cost_graph, fit_cost_table, load_hardware
from opgraph.capture import capture
from validators import ReplayOptions, TimingConfig, replay_graph, unique_configs

MODEL = "llama-3.2-1b"  # a shipped preset (config only)
LAYERS = 1  # decoder layers kept: a tiny graph replays in seconds
SEQ_LEN = 16  # prefill tokens
DEVICE = "cpu"  # where the ops are replayed
HARDWARE = "cpu"  # the catalog spec of the replay device (alias of the host CPU entry)
SEED = 0  # seed of the synthetic inputs
TIMING = TimingConfig(warmup_ms=2.0, min_warmup=1, min_samples=3, max_samples=5, max_time_s=0.05)
"""Few, short samples per config: enough for an example, not for a real calibration."""


def main(table_path: str | None = None) -> None:
    """Capture, replay every unique config on the CPU, fit and use the table."""
    graph = capture(MODEL, phase="prefill", seq_len=SEQ_LEN, layers=LAYERS, dtype="fp32")
    configs = unique_configs(graph)
    in_layers = [c for c in configs if c.op.layer is not None]
    print(
        f"{MODEL}: prefill of {SEQ_LEN} tokens, {LAYERS} layer(s): {len(graph.ops)} ops, {len(configs)} unique configs"
    )
    print(f"  {len(in_layers)} of them inside the decoder layers are replayed")

    options = ReplayOptions(timing=TIMING, seed=SEED, energy=False)
    results = list(replay_graph(graph, device=DEVICE, options=options, select=lambda c: c.op.layer is not None))
    statuses = Counter(r.status.value for r in results)
    print(f"replayed on {DEVICE}: " + ", ".join(f"{s} {n}" for s, n in sorted(statuses.items())))
    for r in sorted(results, key=lambda r: r.definition):
        print(f"  {r.kind.value:<11} {r.definition:<38} {r.status.value}")

    hw = load_hardware(HARDWARE)
    measurements = [
        Measurement(op=r.op, seconds=r.timing.median_us * 1e-6, samples=r.timing.samples)
        for r in results
        if r.timing is not None and r.timing.median_us > 0
    ]
    table = fit_cost_table(measurements, hw, source={"example": "replay_and_calibrate"})
    calibrated = table.hardware or hw  # the spec with the fitted launch and host overheads
    kinds = Counter(e.kind.value for e in table.entries)
    print(f"calibrated table for {calibrated.name}: {len(table.entries)} entries")
    print("  entries by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    print("  roofline scales fitted for: " + ", ".join(sorted(k.value for k in table.roofline.time_scale)))

    costs = cost_graph(graph, TableModel(table), calibrated)
    print(f"the table costs {len(costs.costs)} of {len(graph.ops)} ops ({len(costs.uncosted)} uncosted)")
    if table_path:
        table.save(table_path)
        print(f"wrote {table_path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
