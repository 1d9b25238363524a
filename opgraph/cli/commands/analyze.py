"""``opgraph analyze TRACE``: kernel breakdown of a torch-profiler trace by type, stage and layer."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opgraph.cli.common import (
    check_distinct_outputs,
    check_output_path,
    cli_notes,
    command,
    console,
    new_table,
    print_notes,
)
from opgraph.fmt import fmt_us

if TYPE_CHECKING:
    from opgraph.ir.timeline import Timeline


_ATTENTION_LABEL = {"mha": "MHA/GQA"}
"""How the summary names the analysis's attention variant: ``mha`` only sets apart multi-head attention with
one key/value head per query head or shared ones (GQA, MQA), which the kernels do not tell apart, from MLA."""


def _parse_layers(text: str | None) -> list[int]:
    if not text:
        return []
    from opgraph.ir.errors import OpgraphError

    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise OpgraphError(
            f"--debug-layers expects comma-separated layer indices, got {text!r}", where="--debug-layers"
        ) from None


@command("analyze")
def analyze(
    trace: Path = typer.Argument(
        ...,
        metavar="TRACE",
        help="torch-profiler trace: .json, .json.gz, a folder of per-rank traces, or a .tar.gz of them.",
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose", help="List unknown kernels and the top unique kernels."),
    split_half_layers: bool = typer.Option(
        False, "--split-half-layers", help="Report attention and feed-forward halves of each layer separately."
    ),
    show_layers: bool = typer.Option(False, "--show-layers", help="Print one row per detected layer."),
    debug_layers: str | None = typer.Option(
        None, "--debug-layers", help="Print the kernels of these layers (global indices, e.g. 0,1)."
    ),
    patterns: list[Path] = typer.Option(
        [], "--patterns", help="Extra kernel pattern file (TOML) or folder; repeatable. Consulted first."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the analysis as JSON (the AnalysisResult model)."),
    json_out: Path | None = typer.Option(None, "--json-out", help="Also save the analysis JSON to this file."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Save the measured timeline (kernels labelled by layer/stage/pass) here."
    ),
    gantt: Path | None = typer.Option(None, "--gantt", help="Draw a Gantt chart PNG of the GPU kernels."),
    top: int = typer.Option(15, "--top", min=1, help="Unique kernels to list with -v."),
) -> None:
    """Classify every GPU kernel of a trace by type, stage (prefill/decode) and transformer layer."""
    from opgraph.ir import save_model
    from opgraph.trace import analyze_full, load_patterns, to_timeline

    debug = _parse_layers(debug_layers)
    check_output_path(json_out, "--json-out", inputs=[trace])
    check_output_path(output, "-o/--output", inputs=[trace])
    check_output_path(gantt, "--gantt", inputs=[trace])
    check_distinct_outputs([(json_out, "--json-out"), (output, "-o/--output"), (gantt, "--gantt")])
    ps = load_patterns(list(patterns))
    result, datas, labels = analyze_full(trace, patterns=ps, split_half_layers=split_half_layers)
    if debug:
        _check_layers(debug, len(result.layers))
    result = result.model_copy(update={"notes": cli_notes(result.notes)})
    if json_out is not None:
        save_model(result, json_out)
    if output is not None or gantt is not None:
        timelines = [to_timeline(d, cpu=output is not None, labels=lab) for d, lab in zip(datas, labels, strict=True)]
        if output is not None:
            if len(timelines) == 1:
                save_model(timelines[0], output)
            else:
                from opgraph.trace import load_trace

                save_model(load_trace(trace, patterns=ps), output)
        if gantt is not None:
            try:
                from opgraph.export import write_gantt
            except ImportError:
                print("warning: Gantt chart skipped (opgraph.export.write_gantt is not available)", file=sys.stderr)
            else:
                write_gantt(_by_kernel_type(timelines), gantt, title=f"{trace.name}: GPU kernels")
    if not result.complete:
        print(
            f"warning: {trace}: incomplete trace, events were skipped; numbers cover part of it "
            f"({'; '.join(n for n in result.notes if n.startswith('incomplete') or 'incomplete' in n)})",
            file=sys.stderr,
        )
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
        return
    _print(result, verbose=verbose, show_layers=show_layers, top=top)
    if debug:
        _debug(datas[0], labels[0], result, debug, ps)
    if output is not None:
        console.print(f"timeline written to {output}")
    if gantt is not None and gantt.exists():
        console.print(f"Gantt chart written to {gantt}")


def _check_layers(layers: list[int], count: int) -> None:
    """Refuse ``--debug-layers`` indices that no detected layer has, before anything is printed."""
    from opgraph.ir.errors import OpgraphError

    missing = [li for li in layers if not 0 <= li < count]
    if not missing:
        return
    which = f"layer {missing[0]}" if len(missing) == 1 else f"layers {', '.join(str(li) for li in missing)}"
    has = f"its layers are 0..{count - 1}" if count else "no layer was detected"
    hint = "--show-layers lists them" if count else None
    raise OpgraphError(f"no {which} in the trace: {has}", where="--debug-layers", hint=hint)


def _by_kernel_type(timelines: list[Timeline]) -> list[Timeline]:
    """The device spans of ``timelines`` without their op kind, so that a chart colours and labels them by
    kernel type (the span's category), the types the analysis reports: ``sampling``, not the ``topk`` op
    kind that a graph's sampling op has and the imported timeline gives such kernels."""
    return [
        tl.model_copy(
            update={
                "spans": tuple(
                    s.model_copy(update={"kind": None})
                    for s in tl.spans
                    if s.args.get("type") in ("kernel", "memcpy", "memset")
                )
            }
        )
        for tl in timelines
    ]


def _print(r: object, *, verbose: bool, show_layers: bool, top: int) -> None:
    from opgraph.trace import AnalysisResult

    assert isinstance(r, AnalysisResult)
    status = "" if r.complete else "  [red](INCOMPLETE: events skipped)[/red]"
    rank = f"  rank {r.rank}" if r.ranks else ""
    console.print(f"[bold]{r.source}[/bold]  {r.device or 'device unknown'}{rank}{status}")
    console.print(
        f"kernels: {r.kernels}  kernel time: {fmt_us(r.kernel_time_us)}  GPU busy: {fmt_us(r.gpu_busy_us)}  "
        f"span: {fmt_us(r.makespan_us)}  memcpy/memset: {r.memcpy} ({fmt_us(r.memcpy_time_us)})"
    )
    stages = ", ".join(f"{k} {v}" for k, v in r.stage_passes.items()) or "none"
    per_pass = sorted(set(r.layers_per_pass))
    lp = ",".join(str(x) for x in per_pass) if per_pass else "0"
    console.print(
        f"passes: {len(r.passes)} ({stages})  layers: {len(r.layers)} ({lp} per pass)  "
        f"attention: {_ATTENTION_LABEL.get(r.attention, r.attention.upper())}  "
        f"unknown: {r.unknown_pct:.1f}% of time, {r.unknown_count_pct:.1f}% of kernels"
        + ("  half-layers merged" if r.half_layers_merged else "")
    )
    t = new_table(title="by type", show_footer=False)
    for col in ("type", "count", "time", "%"):
        t.add_column(col, justify="left" if col == "type" else "right")
    for b in r.by_type:
        t.add_row(b.name, str(b.count), fmt_us(b.time_us), f"{b.pct:.1f}")
    console.print(t)
    st = new_table(title="by stage and type")
    for col in ("stage", "type", "count", "time"):
        st.add_column(col, justify="left" if col in ("stage", "type") else "right")
    for b in r.by_stage:
        st.add_row(f"[bold]{b.name}[/bold]", "all", str(b.count), fmt_us(b.time_us))
        for row in r.by_stage_type:
            if row.stage == b.name:
                st.add_row("", row.type, str(row.count), fmt_us(row.time_us))
    console.print(st)
    pt = new_table(title="passes")
    for col in ("pass", "stage", "source", "layers", "kernels", "time", "annotation"):
        pt.add_column(col, justify="right" if col in ("layers", "kernels", "time") else "left")
    for p in r.passes[:50]:
        pt.add_row(
            str(p.index), p.stage, p.stage_source, str(p.layers), str(p.kernels), fmt_us(p.time_us), p.annotation
        )
    if r.passes:
        console.print(pt)
    _stage_breakdown(r)
    if len(r.passes) > 50:
        console.print(f"... {len(r.passes) - 50} more passes (--json for all)")
    if show_layers and r.layers:
        lt = new_table(title="layers")
        for col in ("#", "pass", "layer", "kind", "stage", "kernels", "time", "attn", "gemm", "moe", "comm", "norms"):
            lt.add_column(col, justify="left" if col in ("kind", "stage") else "right")
        for i, x in enumerate(r.layers):
            if i and x.pass_index != r.layers[i - 1].pass_index:
                lt.add_section()  # layer rows grouped by pass (step)
            lt.add_row(
                str(x.index),
                str(x.pass_index),
                str(x.layer),
                x.kind,
                x.stage,
                str(x.kernels),
                fmt_us(x.time_us),
                fmt_us(x.attention_us),
                fmt_us(x.gemm_us),
                fmt_us(x.moe_us),
                fmt_us(x.communication_us),
                str(x.norms),
            )
        console.print(lt)
    if r.collectives:
        ct = new_table(title="collectives")
        for col in ("kernel", "count", "time"):
            ct.add_column(col, justify="left" if col == "kernel" else "right")
        for c in r.collectives:
            ct.add_row(c.name, str(c.count), fmt_us(c.time_us))
        console.print(ct)
    if r.ranks:
        rt = new_table(title="ranks")
        for col in ("rank", "kernels", "time", "collectives", "clock offset", "residual", "layers"):
            rt.add_column(col, justify="right")
        for rk in r.ranks:
            rt.add_row(
                str(rk.rank),
                str(rk.kernels),
                fmt_us(rk.time_us),
                str(sum(c.count for c in rk.collectives)),
                fmt_us(rk.offset_us),
                fmt_us(rk.residual_us),
                str(rk.layers),
            )
        console.print(rt)
    if verbose:
        if r.unknown_kernels:
            ut = new_table(title=f"unknown kernels ({r.unknown_pct:.2f}% of kernel time): add patterns for these")
            for col in ("count", "time", "%", "kernel"):
                ut.add_column(col, justify="left" if col == "kernel" else "right")
            for u in r.unknown_kernels:
                ut.add_row(str(u.count), fmt_us(u.total_us), f"{u.pct:.2f}", u.name)
            console.print(ut)
        else:
            console.print("unknown kernels: none")
        kt = new_table(title=f"unique kernels ({len(r.unique_kernels)}), top {top} by time")
        for col in ("count", "total", "mean", "%", "type", "kernel", "launched by"):
            kt.add_column(col, justify="left" if col in ("type", "kernel", "launched by") else "right")
        for u in r.unique_kernels[:top]:
            kt.add_row(
                str(u.count),
                fmt_us(u.total_us),
                fmt_us(u.mean_us),
                f"{u.pct:.1f}",
                u.type,
                u.short_name,
                ", ".join(u.launch_ops),
            )
        console.print(kt)
    print_notes(r.notes)


def _stage_breakdown(r: object) -> None:
    """Prefill/decode breakdown: passes, layers and kernel time per stage, per pass and per layer."""
    from opgraph.trace import AnalysisResult

    assert isinstance(r, AnalysisResult)
    stages = [s for s in ("prefill", "decode", "mixed", "idle", "unknown") if any(p.stage == s for p in r.passes)]
    if len(r.passes) < 2 and len(stages) < 2:
        return
    t = new_table(title="by stage (prefill/decode breakdown)")
    for col in ("stage", "passes", "layers", "kernel time", "per pass", "per layer", "attention", "gemm", "moe"):
        t.add_column(col, justify="left" if col == "stage" else "right")
    for s in stages:
        ps = [p for p in r.passes if p.stage == s]
        ls = [x for x in r.layers if x.pass_index in {p.index for p in ps}]
        time = sum(p.time_us for p in ps)
        t.add_row(
            s,
            str(len(ps)),
            str(len(ls)),
            fmt_us(time),
            fmt_us(time / len(ps)),
            fmt_us(sum(x.time_us for x in ls) / len(ls)) if ls else "-",
            fmt_us(sum(x.attention_us for x in ls)),
            fmt_us(sum(x.gemm_us for x in ls)),
            fmt_us(sum(x.moe_us for x in ls)),
        )
    console.print(t)


def _debug(
    data: object, labels: list[tuple[int | None, str | None, int | None]], r: object, layers: list[int], ps: object
) -> None:
    from opgraph.trace import AnalysisResult, PatternSet, TraceData

    assert isinstance(data, TraceData) and isinstance(r, AnalysisResult) and isinstance(ps, PatternSet)
    for li in layers:  # all valid (_check_layers)
        info = r.layers[li]
        console.print(
            f"[bold]layer {li}[/bold] (pass {info.pass_index}, layer {info.layer}, {info.kind}, "
            f"{info.stage} by {info.stage_source})"
        )
        for g, lab in zip(data.gpu, labels, strict=True):
            if lab[0] == li:
                mark = "*" if g.layer_start else " "
                kind = getattr(g.ktype, "value", g.ktype)
                console.print(
                    f"  {mark} {g.ts:12.2f} {g.dur:9.2f} us  {kind:<13} {ps.short_name(g.name)}  [{g.launch_op or ''}]",
                    markup=False,
                )
