"""``opgraph serve-sim MODEL``: simulate a served workload (requests, a batching scheduler, a KV cache)
whose step costs come from op-graph simulations of the model's batch shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from opgraph.cli.common import (
    check_distinct_outputs,
    check_host_time,
    check_output_path,
    command,
    console,
    fmt_bytes,
    fmt_us,
    new_table,
    print_notes,
)
from opgraph.ir import OpgraphError

if TYPE_CHECKING:
    from simulators.serving import Request, ServingResult


class ServeSimOptionError(OpgraphError):
    """A ``serve-sim`` option is missing, conflicting or out of range."""


def _requests(
    trace: Path | None, rate: float | None, num: int, prompt_len: str, output_len: str, seed: int
) -> list[Request]:
    from simulators.serving import LengthDist, load_trace, poisson_workload

    if (trace is None) == (rate is None):
        raise ServeSimOptionError(
            "give either --requests TRACE or --poisson RATE", where="workload", hint="one of the two, not both"
        )
    if trace is not None:
        return load_trace(trace)
    assert rate is not None
    return poisson_workload(
        rate=rate,
        num_requests=num,
        prompt_len=LengthDist.parse(prompt_len, "--prompt-len"),
        output_len=LengthDist.parse(output_len, "--output-len"),
        seed=seed,
    )


def _check_lengths(model: str, window: int | None, prompt_len: str, output_len: str) -> None:
    """A Poisson workload whose longest request exceeds the model's context window is one error line
    (requests of an unbounded ``exp:`` length past it are dropped and listed instead)."""
    from simulators.serving import LengthDist

    prompt, out = LengthDist.parse(prompt_len, "--prompt-len"), LengthDist.parse(output_len, "--output-len")
    if window is None or prompt.largest is None or out.largest is None:
        return
    if prompt.largest + out.largest > window:
        raise ServeSimOptionError(
            f"requests of up to {prompt.largest + out.largest} tokens ({prompt.largest} prompt + {out.largest} "
            f"output) exceed {model}'s context window of {window} positions",
            where="--output-len" if out.largest >= window else "--prompt-len",
            hint=f"give --prompt-len and --output-len whose longest lengths add up to at most {window}",
        )


@command("serve-sim")
def serve_sim(
    model: str = typer.Argument(..., metavar="MODEL", help="A preset, config.json or model folder (captured on meta)."),
    hardware: str = typer.Option("h100", "--hardware", "-H", help="Catalog name or a hardware .toml/.json file."),
    cost_model: str | None = typer.Option(
        None,
        "--cost-model",
        "-c",
        help="roofline, formula, table, profile, a calibrated or profile JSON, module:Class "
        "(default: the device's measured profile when it ships one, else roofline).",
    ),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel ranks (step graphs sharded Megatron-style)."),
    scheduler: str = typer.Option("continuous", "--scheduler", "-s", help="static, continuous or chunked."),
    max_batch: int = typer.Option(64, "--max-batch", help="Most requests running at once."),
    token_budget: int = typer.Option(8192, "--token-budget", help="Most new tokens one step processes."),
    trace: Path | None = typer.Option(
        None, "--requests", help="Request trace: JSONL or CSV with arrival_s, prompt_tokens, output_tokens."
    ),
    rate: float | None = typer.Option(None, "--poisson", help="Synthetic Poisson arrivals at RATE requests/s."),
    num_requests: int = typer.Option(1000, "--num-requests", "-n", help="Requests of the Poisson workload."),
    prompt_len: str = typer.Option("512", "--prompt-len", help="Poisson prompt tokens: N, LOW..HIGH or exp:MEAN."),
    output_len: str = typer.Option("128", "--output-len", help="Poisson output tokens: N, LOW..HIGH or exp:MEAN."),
    seed: int = typer.Option(0, "--seed", help="Seed of the Poisson workload."),
    utilisation: float = typer.Option(
        0.9, "--memory-utilisation", help="Share of device memory for weights and KV cache."
    ),
    layers: int | None = typer.Option(None, "--layers", help="Keep only the first N layers (quick looks)."),
    dtype: str = typer.Option("bf16", "--dtype", help="Model dtype: bf16, fp16 or fp32."),
    host: str = typer.Option("eager", "--host", help="Host issue model of each step: eager, cuda-graph or none."),
    host_us: float | None = typer.Option(
        None, "--host-us", help="Host time per op in us (default: the spec's); not with --host none."
    ),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the ServingResult as JSON."),
    perfetto: Path | None = typer.Option(
        None, "--perfetto", help="Write a Perfetto trace of steps and requests (.json/.json.gz)."
    ),
    plot: Path | None = typer.Option(
        None, "--plot", help="Write a PNG (or .svg/.pdf) of KV-cache use, step times and latencies."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON instead of tables."),
) -> None:
    """Simulate serving MODEL: TTFT/TPOT/latency percentiles, throughput, KV-cache use."""
    import time

    for value, where in ((tp, "--tp"), (max_batch, "--max-batch"), (token_budget, "--token-budget")):
        if value < 1:
            raise ServeSimOptionError(f"must be at least 1 (got {value})", where=where)
    if not 0 < utilisation <= 1:
        raise ServeSimOptionError(f"must be in (0, 1] (got {utilisation})", where="--memory-utilisation")
    if host_us is not None and host_us < 0:
        raise ServeSimOptionError(f"{host_us} is negative", where="--host-us")
    mode = host.strip().lower().replace("-", "_")
    if mode not in ("eager", "cuda_graph", "none"):
        raise ServeSimOptionError(f"unknown host mode {host!r}", where="--host", hint="eager, cuda-graph or none")
    inputs = [trace]
    check_output_path(output, "-o/--output", inputs=inputs)
    check_output_path(perfetto, "--perfetto", inputs=inputs)
    check_output_path(plot, "--plot", inputs=inputs)
    check_distinct_outputs([(output, "-o/--output"), (perfetto, "--perfetto"), (plot, "--plot")])
    from opgraph.study import study_config

    check_host_time(mode, host_us)
    config = study_config(tp=tp, host_mode=mode, host_us=host_us)
    from hardware import load_hardware, resolve_cost_model
    from simulators.serving import check_plot_path, get_scheduler

    if plot is not None:
        check_plot_path(plot)
    get_scheduler(scheduler)  # an unknown name fails before the capture
    requests = _requests(trace, rate, num_requests, prompt_len, output_len, seed)
    hw = load_hardware(hardware)
    default_note: tuple[str, ...] = ()
    if cost_model is None:  # as `opgraph simulate` chooses: the device's shipped profile, else the roofline
        from hardware import default_cost_model

        cm, uncalibrated = default_cost_model(hw)
        cost_model = "profile" if uncalibrated is None else "roofline"
        default_note = (uncalibrated,) if uncalibrated else ()
    else:
        cm = resolve_cost_model(cost_model)
    t0 = time.perf_counter()
    from opgraph.scenario.serving import capture_serving_model, context_window, simulate_serving

    if rate is not None:  # a synthetic workload longer than the model's context window is a mistake
        _check_lengths(model, context_window(model, layers), prompt_len, output_len)
    templates = capture_serving_model(model, dtype=dtype, layers=layers)
    result = simulate_serving(
        templates,
        requests,
        hardware=hw,
        cost_model=cm,
        config=config,
        scheduler=scheduler,
        max_batch=max_batch,
        token_budget=token_budget,
        utilisation=utilisation,
        cost_model_name=cost_model,
    )
    result = result.model_copy(update={"wall_s": time.perf_counter() - t0, "notes": (*default_note, *result.notes)})
    if output is not None:
        from opgraph.ir.io import save_model

        save_model(result, output)
    if perfetto is not None:
        from opgraph.export import write_perfetto
        from simulators.serving import serving_timeline

        write_perfetto([serving_timeline(result)], perfetto, counter_bins=0)
    if plot is not None:
        from simulators.serving import write_serving_plot

        write_serving_plot(result, plot)
    if as_json:
        print(json.dumps(result.summary.model_dump(), indent=2))
    else:
        _print(result)
    for path, what in ((output, "result"), (perfetto, "perfetto"), (plot, "plot")):
        if path is not None:
            console.print(f"{what}: {path}")


def _print(result: ServingResult) -> None:
    s, st = result.summary, result.settings
    console.print(
        f"{st.model} on {st.hardware} (tp={st.tp}, cost model {st.cost_model or '-'}), {st.scheduler} batching, "
        f"max batch {st.max_batch}, "
        f"token budget {st.token_budget}: {s.completed} requests served, {s.dropped} dropped, "
        f"{s.steps} steps, {fmt_us(s.makespan_s * 1e6)} simulated"
    )
    table = new_table("latency (ms)", "p50", "p90", "p99", "mean", "max")
    for name, p in (("TTFT", s.ttft_ms), ("TPOT", s.tpot_ms), ("end-to-end", s.e2e_ms)):
        table.add_row(name, *(f"{v:.2f}" for v in (p.p50, p.p90, p.p99, p.mean, p.max)))
    console.print(table)
    thr = new_table("throughput", "value")
    thr.add_row("output tokens/s", f"{s.output_tokens_per_s:.1f}")
    thr.add_row("total tokens/s", f"{s.total_tokens_per_s:.1f}")
    thr.add_row("requests/s", f"{s.requests_per_s:.3f}")
    thr.add_row(
        "peak KV cache",
        f"{s.peak_kv_tokens} of {st.kv_capacity_tokens} tokens ({fmt_bytes(s.peak_kv_bytes)} of "
        f"{fmt_bytes(st.kv_capacity_tokens * st.kv_bytes_per_token)})",
    )
    thr.add_row("step shapes simulated", str(s.step_shapes_simulated))
    console.print(thr)
    for d in result.dropped[:10]:
        console.print(f"dropped request {d.id}: {d.reason}")
    if len(result.dropped) > 10:
        console.print(f"... and {len(result.dropped) - 10} more dropped (listed in the result JSON)")
    print_notes(result.notes)
