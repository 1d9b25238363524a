"""What ``compare`` and ``export`` accept as a timeline, and how they say no (issues: a ``.tar.gz`` that
``import`` reads was "not valid JSON" to compare; the whole trace was parsed just to tell its type; bad
input errors differed from ``analyze``'s).

Traces here are small Kineto files written by the tests (kernels and their runtime launches); the real
DLRM archive is used when the shared data is there.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from opgraph.cli.app import app
from opgraph.compare import Comparison
from opgraph.compare.loading import FileKind, load_any_timeline, sniff
from opgraph.ir import OpKind, Span, Stage, Timeline, TimelineKind, TimelineSource, save_timeline

TRACES = (Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces").resolve()
KERNELS = ["indexSelectSmallIndex", "void at::native::rms_norm_kernel", "nvjet_sm90_tst_64x8_TNT", "flash_fwd_kernel"]


def kineto(kernels: int = 8, *, pad: int = 0, t0: float = 100.0) -> dict[str, Any]:
    """A Kineto trace document: ``kernels`` kernels, each launched by a ``cudaLaunchKernel`` (``pad``: bytes
    of padding per kernel, in an argument, to make a large file)."""
    events: list[dict[str, Any]] = []
    t = t0
    for i in range(kernels):
        args: dict[str, Any] = {"correlation": i + 1}
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t - 5, "dur": 3, "args": args})  # fmt: skip
        kargs: dict[str, Any] = {"device": 0, "stream": 7, "correlation": i + 1}
        if pad:
            kargs["note"] = "x" * pad
        events.append({"ph": "X", "cat": "kernel", "name": KERNELS[i % len(KERNELS)], "pid": 0, "tid": 7,
                       "ts": t, "dur": 4.0, "args": kargs})  # fmt: skip
        t += 6
    return {"schemaVersion": 1, "deviceProperties": [{"name": "NVIDIA H100"}], "traceEvents": events}


def simulated() -> Timeline:
    spans = [
        Span(name="gemm", track="engine0", start_us=10.0 * i, dur_us=5.0, op_id=i, kind=OpKind.GEMM, layer=None,
             stage=Stage.PREFILL, step=0)
        for i in range(4)
    ]  # fmt: skip
    return Timeline(source=TimelineSource(kind=TimelineKind.SIMULATED, name="sim"), spans=tuple(spans))


def _ranks_tar(path: Path, ranks: int) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for r in range(ranks):
            data = json.dumps(kineto(t0=100.0 + r)).encode()
            info = tarfile.TarInfo(f"run/worker{r}_step_1.pt.trace.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_tar_of_rank_traces_is_compared_as_import_reads_it(tmp_path: Path) -> None:
    sim = save_timeline(simulated(), tmp_path / "sim.json")
    tar = _ranks_tar(tmp_path / "ranks.tar.gz", 2)
    out = tmp_path / "c.json"
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["compare", str(sim), str(tar), "--json", str(out)])
    assert res.exit_code == 0, res.output
    c = Comparison.model_validate_json(out.read_text())
    assert c.rank == 0 and any("rank 0 of the 2-rank trace" in n for n in c.notes)
    assert c.row("gpu_time").reference_us == pytest.approx(8 * 4.0)  # one rank's kernels, never both summed
    res = CliRunner().invoke(app, ["compare", str(sim), str(tar), "--rank", "1"])
    assert res.exit_code == 0, res.output
    assert load_any_timeline(tar).source.config["ranks"] == 2


def test_the_real_dlrm_archive_is_compared(tmp_path: Path) -> None:
    dlrm = TRACES / "param__dlrm_kineto.tar.gz"
    if not dlrm.exists():
        pytest.skip(f"real trace {dlrm.name} not found in {TRACES} (shared data lives beside the repo)")
    sim = save_timeline(simulated(), tmp_path / "sim.json")
    res = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["compare", str(sim), str(dlrm), "--rank", "3"])
    assert res.exit_code == 0, res.output
    assert "rank 3 of the 8-rank trace" in res.output


def test_the_type_is_told_from_the_start_and_the_trace_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a 3 MB trace: no single JSON parse may take the whole file (the importer streams it in chunks)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(kineto(2000, pad=1500)))
    size = path.stat().st_size
    assert size > 3_000_000
    seen: list[int] = []
    real = json.loads

    def spy(s: str | bytes, *a: Any, **k: Any) -> Any:
        seen.append(len(s))
        return real(s, *a, **k)

    monkeypatch.setattr(json, "loads", spy)
    tl = load_any_timeline(path)
    assert len(tl.device_spans()) == 2000
    assert max(seen) < size / 2
    seen.clear()
    res = CliRunner().invoke(app, ["export", str(path), "-o", str(tmp_path / "out.json")])
    assert res.exit_code == 0, res.output
    assert max(seen) < size / 2


def test_sniff_reads_the_start_only(tmp_path: Path) -> None:
    # what follows the first 64 KiB is never read to tell the kind
    doc = json.dumps(kineto(4))
    path = tmp_path / "t.json"
    path.write_bytes(doc.encode() + b" " * (1 << 17) + b"\xff garbage")
    assert sniff(path) is FileKind.TRACE
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(doc.encode()))
    assert sniff(gz) is FileKind.TRACE
    tl = save_timeline(simulated(), tmp_path / "sim.json.gz")
    assert sniff(tl) is FileKind.TIMELINE
    assert sniff(tmp_path) is FileKind.TRACE


def _bad_files(tmp: Path) -> dict[str, Path]:
    full = json.dumps(kineto(200), indent=1).encode()
    files = {
        "truncated trace": full[: len(full) // 2],
        "truncated gzip": gzip.compress(full)[:600],
        "array of numbers": b"[1, 2, 3]",
        "not JSON": b"hello world, not json",
        "null": b"null",
        "object of neither": b'{"a": [1, 2, 3]}',
        "traceEvents not an array": b'{"traceEvents": "x"}',
        "empty": b"",
        "binary": bytes(range(256)) * 4,
    }
    out = {}
    for name, data in files.items():
        p = tmp / (name.replace(" ", "_") + (".json.gz" if "gzip" in name else ".json"))
        p.write_bytes(data)
        out[name] = p
    return out


EXPECTED = {
    "truncated trace": ("truncated JSON", "cut short"),
    "truncated gzip": ("truncated or corrupt gzip", "cut short"),
    "array of numbers": ("neither an opgraph timeline nor a profiler trace", "a JSON array whose first item (1)"),
    "not JSON": ("neither an opgraph timeline nor a profiler trace", "not JSON"),
    "null": ("neither an opgraph timeline nor a profiler trace", "not JSON"),
    "object of neither": ("neither an opgraph timeline nor a profiler trace", "no traceEvents"),
    "traceEvents not an array": ("traceEvents is not an array",),
    "empty": ("the file is empty",),
    "binary": ("binary",),
}


@pytest.mark.parametrize("command", ["compare", "export"])
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_bad_input_is_one_line_naming_the_file_and_what_to_do(tmp_path: Path, case: str, command: str) -> None:
    path = _bad_files(tmp_path)[case]
    sim = save_timeline(simulated(), tmp_path / "sim.json")
    args = ["compare", str(sim), str(path)] if command == "compare" else ["export", str(path), "-o", "x.json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert "\n" not in line and "Traceback" not in res.output
    assert line.startswith(f"error: {path}: ")
    for needle in EXPECTED[case]:
        assert needle in line, line
    if case != "traceEvents not an array":
        assert line.endswith(")"), f"no hint of what to do: {line}"


@pytest.mark.parametrize("case", ["truncated trace", "truncated gzip", "traceEvents not an array"])
def test_a_broken_trace_gets_the_message_analyze_gives(tmp_path: Path, case: str) -> None:
    path = _bad_files(tmp_path)[case]
    sim = save_timeline(simulated(), tmp_path / "sim.json")
    ours = CliRunner().invoke(app, ["compare", str(sim), str(path)])
    theirs = CliRunner().invoke(app, ["analyze", str(path)])
    assert ours.exit_code == theirs.exit_code == 2
    assert ours.stderr == theirs.stderr


def test_a_truncated_timeline_says_it_was_cut(tmp_path: Path) -> None:
    whole = save_timeline(simulated(), tmp_path / "sim.json").read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(whole[: len(whole) // 2])
    res = CliRunner().invoke(app, ["compare", str(cut), str(cut)])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "truncated JSON: the file ends before the timeline does" in res.stderr and "re-create it" in res.stderr
