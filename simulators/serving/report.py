"""Views of a serving result: a Timeline of steps and requests (for the Perfetto exporter) and a plot.

Tracks: ``steps`` (one span per server step, named by its kind, with its shape in args),
``requests/queue`` style per-request tracks are too many for big runs, so each request is one span
on a ``request NNN`` track only for runs of at most :data:`MAX_REQUEST_TRACKS` requests; bigger runs
put requests on ``requests k`` lanes, packed so spans on one lane never overlap.
"""

from __future__ import annotations

import heapq
from pathlib import Path

from opgraph.ir import OpgraphError, Span, Timeline, TimelineKind, TimelineSource
from opgraph.ir.timeline import SpanCategory
from simulators.serving.result import ServingResult

__all__ = ["MAX_REQUEST_TRACKS", "PLOT_FORMATS", "check_plot_path", "serving_timeline", "write_serving_plot"]

MAX_REQUEST_TRACKS = 200
"""Requests above this share packed lanes instead of a track each."""


def serving_timeline(result: ServingResult) -> Timeline:
    """Steps and requests of ``result`` as a simulated :class:`~opgraph.ir.Timeline` (times in us)."""
    spans: list[Span] = []
    for s in result.steps:
        spans.append(
            Span(
                name=s.kind,
                track="steps",
                start_us=s.start_s * 1e6,
                dur_us=s.dur_us,
                category=SpanCategory.KERNEL,
                step=s.index,
                args={
                    "shape": s.key,
                    "prefill_tokens": s.prefill_tokens,
                    "decode_batch": s.decode_batch,
                    "kv_used_tokens": s.kv_used_tokens,
                },
            )
        )
    lanes: list[tuple[float, int]] = []  # (free from, lane)
    per_track = len(result.requests) <= MAX_REQUEST_TRACKS
    for r in sorted(result.requests, key=lambda r: r.arrival_s):
        if per_track:
            track = f"request {r.id:04d}"
        else:
            if lanes and lanes[0][0] <= r.arrival_s:
                _, lane = heapq.heappop(lanes)
            else:
                lane = len(lanes)
            heapq.heappush(lanes, (r.finished_s, lane))
            track = f"requests {lane:03d}"
        args = {"request": r.id, "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens}
        for name, a, b in (
            ("queued", r.arrival_s, r.admitted_s),
            ("prefill", r.admitted_s, r.first_token_s),
            ("decode", r.first_token_s, r.finished_s),
        ):
            if b > a:
                spans.append(
                    Span(
                        name=f"{name} r{r.id}",
                        track=track,
                        start_us=a * 1e6,
                        dur_us=(b - a) * 1e6,
                        category=SpanCategory.ANNOTATION,
                        args=args,
                    )
                )
    st = result.settings
    source = TimelineSource(
        kind=TimelineKind.SIMULATED,
        name=f"serve-sim {st.model} {st.scheduler}".strip(),
        device=st.hardware,
        config={"scheduler": st.scheduler, "max_batch": st.max_batch, "token_budget": st.token_budget, "tp": st.tp},
    )
    return Timeline(source=source, spans=tuple(spans), notes=result.notes)


PLOT_FORMATS = (".png", ".svg", ".pdf")
"""File suffixes :func:`write_serving_plot` writes (the image format follows the suffix)."""


def check_plot_path(path: Path, where: str = "--plot") -> None:
    """Raise :class:`~opgraph.ir.OpgraphError` unless ``path`` names a format of :data:`PLOT_FORMATS`
    (checked before a run, so a long simulation is not lost to a typo).

    >>> check_plot_path(Path("kv.png"))
    >>> check_plot_path(Path("p.txt"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    opgraph.ir.errors.OpgraphError: --plot: p.txt: 'txt' is not an image format this plot writes (give a path ...)
    """
    if path.suffix.lower() not in PLOT_FORMATS:
        kind = f"{path.suffix[1:]!r} is not" if path.suffix else "a path without a suffix is not"
        raise OpgraphError(
            f"{path}: {kind} an image format this plot writes",
            where=where,
            hint=f"give a path ending in {', '.join(PLOT_FORMATS[:-1])} or {PLOT_FORMATS[-1]}",
        )


def write_serving_plot(result: ServingResult, path: Path) -> Path:
    """An image (PNG, SVG or PDF, by ``path``'s suffix): KV-cache use over time, step durations, and the
    latency distributions."""
    check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(10, 9))
    t = [s.start_s + s.dur_us / 1e6 for s in result.steps]
    gb = result.settings.kv_bytes_per_token / 1e9
    axes[0].plot(t, [s.kv_used_tokens * gb for s in result.steps], label="used")
    axes[0].plot(t, [s.kv_reserved_tokens * gb for s in result.steps], label="reserved", alpha=0.6)
    axes[0].axhline(result.settings.kv_capacity_tokens * gb, color="k", ls="--", label="capacity")
    axes[0].set_ylabel("KV cache (GB)")
    axes[0].legend(loc="upper right")
    axes[1].scatter(t, [s.dur_us / 1e3 for s in result.steps], s=2)
    axes[1].set_ylabel("step (ms)")
    axes[1].set_xlabel("time (s)")
    data = [
        [r.ttft_ms for r in result.requests],
        [r.tpot_ms for r in result.requests if r.tpot_ms is not None],
        [r.e2e_ms for r in result.requests],
    ]
    axes[2].boxplot([d or [0.0] for d in data])
    axes[2].set_xticks([1, 2, 3], ["TTFT", "TPOT", "end-to-end"])
    axes[2].set_yscale("log")
    axes[2].set_ylabel("ms")
    st = result.settings
    fig.suptitle(f"{st.model} on {st.hardware} (tp={st.tp}), {st.scheduler} batching")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
