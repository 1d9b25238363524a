"""``opgraph capture MODEL -o graph.json``: capture a causal LM into a typed op graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from opgraph.cli.common import check_distinct_outputs, check_output_path, command, console
from opgraph.fmt import fmt_bytes, fmt_count, fmt_us


def _list_presets() -> None:
    from opgraph.capture.sources import presets
    from opgraph.cli.common import new_table

    table = new_table(title="presets (configs only, no weights)")
    table.add_column("preset")
    table.add_column("Hugging Face id")
    table.add_column("architecture")
    table.add_column("layers", justify="right")
    for p in presets().values():
        layers = p.config.get("num_hidden_layers") or p.config.get("n_layer") or "?"
        table.add_row(p.name, p.hf_id, p.architecture, str(layers))
    console.print(table)
    console.print("MODEL may also be a config.json, a model folder, or a hub id in the local Hugging Face cache.")


_PHASE_SIZES: dict[str, tuple[str, tuple[str, ...], str]] = {
    # parameter: (its flag, the phases that use it, what to do instead)
    "seq_len": ("--seq-len", ("prefill", "generate"), "a decode step's context is --kv-len"),
    "kv_len": ("--kv-len", ("decode",), "the prompt of a prefill or a generation is --seq-len"),
    "new_tokens": ("--new-tokens", ("generate",), "use --phase generate to decode steps after the prefill"),
}
"""Size options that only some phases read: giving one to another phase is an error, not ignored."""


def _check_phase_options(ctx: typer.Context, phase: str, profile: bool, device: str, weights: bool) -> None:
    """Refuse options given on the command line that this capture would ignore (one-line errors)."""
    from opgraph.ir.errors import OpgraphError

    def given(name: str) -> bool:
        source = ctx.get_parameter_source(name)  # typer's own click: compare by name
        return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")

    for name, (flag, phases, instead) in _PHASE_SIZES.items():
        if phase in ("prefill", "decode", "generate") and phase not in phases and given(name):
            raise OpgraphError(
                f"only applies to --phase {' or '.join(phases)}, not {phase}",
                where=flag,
                hint=f"leave it out: {instead}",
            )
    for name, flag in (("timeline", "--timeline"), ("trace", "--trace"), ("wall_repeats", "--wall-repeats")):
        if not profile and given(name):
            raise OpgraphError("only applies with --profile", where=flag, hint="add --profile, or leave it out")
    if device == "meta" and given("seed"):
        raise OpgraphError(
            "only applies to a model built on cpu or cuda (meta has no weights)",
            where="--seed",
            hint="add --device cpu for the routing of seeded weights, or leave it out",
        )
    if weights and given("seed"):
        raise OpgraphError(
            "only applies to random weights, and --weights loads the checkpoint's",
            where="--seed",
            hint="leave one of them out",
        )


@command("capture")
def capture(
    ctx: typer.Context,
    model: str = typer.Argument(
        None,
        metavar="MODEL",
        help="Preset (see --list), HF id of a preset, config.json, model folder, or a hub id in the local HF cache.",
    ),
    output: Path = typer.Option(None, "-o", "--output", help="Graph file to write (.json or .json.gz)."),
    phase: str = typer.Option("prefill", help="prefill, decode or generate."),
    batch: int = typer.Option(1, help="Sequences."),
    seq_len: int = typer.Option(512, help="Prompt tokens per sequence (prefill, generate)."),
    kv_len: int = typer.Option(2048, help="Tokens already in the KV cache (decode)."),
    new_tokens: int = typer.Option(
        4,
        help="Decode steps after the prefill (generate): N steps make N + 1 tokens, as HF's "
        "generate(max_new_tokens=N + 1).",
    ),
    dtype: str = typer.Option("bf16", help="bf16, fp16 or fp32."),
    layers: int = typer.Option(None, help="Cut the model to its first N layers."),
    attn_impl: str = typer.Option("sdpa", help="Attention implementation: sdpa or eager."),
    device: str = typer.Option(
        "meta", help="meta (no weights), cpu, cuda or cuda:N (seeded random weights, or --weights)."
    ),
    moe_skew: float = typer.Option(None, help="Zipf exponent of MoE expert loads (0 or unset: balanced)."),
    seed: int = typer.Option(
        0, help="Seed of the random weights on cpu/cuda: the same seed gives the same weights and MoE routing."
    ),
    weights: bool = typer.Option(
        False,
        "--weights",
        help="Load the model's own weights (a model folder or cached hub id with its weight files) on cpu/cuda: "
        "its trained MoE routing.",
    ),
    trust_remote_code: bool = typer.Option(False, help="Allow a local model's own modelling code."),
    host_timing: bool = typer.Option(
        False, help="Also time the framework's host work before each op on this machine (for eager wall time)."
    ),
    profile: bool = typer.Option(
        False, help="Run under torch.profiler (cuda, cuda:N or cpu) and write a measured timeline."
    ),
    timeline: Path = typer.Option(None, help="Timeline file for --profile (default: OUTPUT with .timeline.json)."),
    trace: Path = typer.Option(None, help="Also keep the raw profiler trace here (--profile)."),
    wall_repeats: int = typer.Option(
        3, "--wall-repeats", help="Plain runs timed for --profile's wall time (their median, after one warm-up run)."
    ),
    list_presets: bool = typer.Option(False, "--list", help="List the shipped presets and exit."),
) -> None:
    """Capture a causal LM into a typed op graph (no GPU and no weights needed on the meta device)."""
    from opgraph.ir.errors import OpgraphError

    if list_presets:
        _list_presets()
        return
    if model is None:
        raise OpgraphError("missing MODEL", hint="give a preset (opgraph capture --list), a config.json or a folder")
    if output is None:
        raise OpgraphError("missing output file", where="-o/--output", hint="e.g. -o graph.json.gz")
    if not (output.name.endswith(".json") or output.name.endswith(".json.gz")):
        raise OpgraphError("must end in .json or .json.gz", where="-o/--output")
    check_output_path(output, "-o/--output")
    check_output_path(timeline, "--timeline")
    check_output_path(trace, "--trace")
    check_distinct_outputs([(output, "-o/--output"), (timeline, "--timeline"), (trace, "--trace")])
    _check_phase_options(ctx, phase, profile, device, weights)
    if wall_repeats < 1:
        raise OpgraphError(f"{wall_repeats} is out of range", where="--wall-repeats", hint="give 1 or more")
    opts: dict[str, Any] = dict(
        phase=phase,
        batch=batch,
        seq_len=seq_len,
        kv_len=kv_len,
        new_tokens=new_tokens,
        dtype=dtype,
        layers=layers,
        attn_impl=attn_impl,
        device=device,
        moe_skew=moe_skew,
        trust_remote_code=trust_remote_code,
        host_timing=host_timing,
        seed=seed,
        weights=weights,
    )
    from opgraph.capture.api import CaptureOptions

    CaptureOptions(**opts).validate()  # the device's spelling and presence too, before the model is built
    from opgraph.ir.io import save_graph, save_timeline

    if profile:
        from opgraph.capture.profile import profile_capture

        result = profile_capture(model, keep_trace=trace, wall_repeats=wall_repeats, **opts)
        graph = result.graph
        tl_path = timeline or output.with_name(output.name.split(".json")[0] + ".timeline.json")
        save_graph(graph, output)
        save_timeline(result.timeline, tl_path)
    else:
        from opgraph.capture.api import capture as run_capture

        graph = run_capture(model, **opts)
        save_graph(graph, output)
    s = graph.summary()
    md = graph.metadata
    console.print(f"[bold]{md.model}[/bold] {md.architecture} phase={md.phase} layers={md.num_layers} -> {output}")
    by_kind = s["by_kind"]
    assert isinstance(by_kind, dict)
    kinds = ", ".join(f"{k} {v['ops']}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1]["flops"]))
    console.print(f"{s['ops']} ops ({kinds}); {s['edges']} edges")
    console.print(f"{fmt_count(float(s['flops']), 'FLOP')}  {fmt_bytes(float(s['bytes']))} moved")  # type: ignore[arg-type]
    if md.host_timing is not None:
        console.print(f"host time between ops: {md.host_timing.total_us} us on {md.host_timing.cpu}")
    from opgraph.ir import OpKind

    others = graph.ops_of(OpKind.OTHER)  # no decode step is built just to look (a planned generation)
    if others:
        console.print(f"unrecognised ops left as 'other': {len(others)}")
    for note in md.assumptions:
        console.print(f"assumed: {note}")
    if profile:
        tl = result.timeline
        attributed = sum(1 for sp in tl.spans if sp.op_id is not None)
        console.print(
            f"timeline -> {tl_path}: {len(tl.spans)} spans ({attributed} attributed to ops); wall "
            f"{fmt_us(result.wall_us)} without profiler, {fmt_us(result.wall_profiled_us)} with"
        )
