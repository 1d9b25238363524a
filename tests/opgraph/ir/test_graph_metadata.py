"""Typed capture settings in a graph's metadata: old graph files load, typos are errors, the
mapping view older code reads still answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from opgraph.ir import CaptureSettings, GraphIdentity, GraphMetadata, HostTimingSummary, OpGraph, load_graph, save_graph

OLD_CAPTURE = {
    "batch": 2,
    "dtype": "bf16",
    "device": "meta",
    "attn_impl": "sdpa",
    "seq_len": 16,
    "host_timing_us": 812.5,
    "host_timing_cpu": "Some CPU @ 2.0GHz",
    "host_timing_clock_overhead_us": 0.25,
    "host_timing_from": "profiler",
    "tp": 2,
    "seed": 7,
}
"""The ``capture`` dict of a graph file written before the settings were typed."""


def test_an_older_graph_file_loads_with_typed_host_timing(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema_version": 1, "metadata": {"model": "m", "capture": OLD_CAPTURE}}))
    md = load_graph(path).metadata
    assert md.host_timing == HostTimingSummary(
        total_us=812.5, cpu="Some CPU @ 2.0GHz", clock_overhead_us=0.25, overhead_source="profiler"
    )
    assert (md.capture.batch, md.capture.seq_len, md.capture.kv_len, md.capture.tp) == (2, 16, None, 2)
    # Saved again, the timing is one nested object and unset settings are not written.
    saved = json.loads(save_graph(load_graph(path), tmp_path / "new.json").read_text())["metadata"]["capture"]
    assert saved["host_timing"]["cpu"] == "Some CPU @ 2.0GHz" and "host_timing_us" not in saved
    assert "kv_len" not in saved and saved["seed"] == 7
    assert load_graph(tmp_path / "new.json").metadata == md


def test_the_mapping_view_reads_as_the_old_dict() -> None:
    settings = CaptureSettings.model_validate(OLD_CAPTURE)
    assert dict(settings) == OLD_CAPTURE
    assert {**settings, "tp": 4}["tp"] == 4 and settings["host_timing_us"] == 812.5
    assert settings.get("kv_len") is None and "seq_len" in settings and "kv_len" not in settings
    # A metadata copied with a plain dict (as the tensor-parallel transform does) holds typed settings.
    md = GraphMetadata().model_copy(update={"capture": {**settings, "tp": 4}})
    assert isinstance(md.capture, CaptureSettings) and md.capture.tp == 4
    assert md.host_timing is not None and md.host_timing.total_us == 812.5
    assert GraphMetadata.model_validate_json(md.model_dump_json()) == md


@pytest.mark.parametrize(
    "capture",
    [
        {"batch": 0},
        {"seq_len": "sixteen"},
        {"tp": -2},
        {"moe_skew": -1.0},
        {"host_timing_us": -5.0, "host_timing_cpu": "x"},
        {"host_timing": {"total_us": 1.0}},  # no cpu
        {"seed": [1, 2]},  # extra settings are scalars
    ],
)
def test_a_bad_setting_is_a_validation_error(capture: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OpGraph.model_validate({"metadata": {"capture": capture}})


class _Record(GraphIdentity):
    """A record about a graph with fields of its own after the identity."""

    rows: int


def test_graph_identity_from_metadata_fills_the_three_fields_first() -> None:
    md = GraphMetadata(model="org/Tiny", architecture="LlamaForCausalLM", phase="decode", config_hash="abc")
    assert GraphIdentity.from_metadata(md) == GraphIdentity(
        model="org/Tiny", architecture="LlamaForCausalLM", phase="decode"
    )
    record = _Record.from_metadata(md, rows=3)
    assert list(record.model_dump().items()) == [  # in this order: saved files keep their field order
        ("model", "org/Tiny"),
        ("architecture", "LlamaForCausalLM"),
        ("phase", "decode"),
        ("rows", 3),
    ]
    assert _Record.from_metadata(GraphMetadata(), model="g.json", rows=0).model == "g.json"  # an override wins
    with pytest.raises(ValidationError):
        _Record.from_metadata(md, rows=1, phse="prefill")  # a typo is an error, not a silent extra field
