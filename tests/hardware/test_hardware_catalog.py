"""The device catalog and user hardware files: every entry validates, lookups, clear errors."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from hardware import (
    CostTable,
    HardwareSpec,
    UnknownHardwareError,
    list_hardware,
    load_hardware,
    normalize_name,
    parse_quantity,
)
from hardware.loader import _catalog_files
from opgraph.ir import DType, LoadError

CATALOG = Path(__file__).resolve().parents[2] / "hardware" / "catalog"
REQUIRED = {"h100-sxm", "h100-pcie", "h200", "a100-80gb", "a6000", "l40s", "gtx-1080-ti", "mi300x", "b200"}


@pytest.mark.parametrize("path", sorted(CATALOG.glob("*.toml")), ids=lambda p: p.stem)
def test_every_catalog_file_validates_with_sources(path: Path) -> None:
    data = tomllib.loads(path.read_text())
    # ``profile`` is the loader's key for a measured profile shipped beside the TOML, not a spec field.
    profile = data.pop("profile", None)
    assert profile is None or (path.parent / profile).is_file()
    host_profile = data.pop("host_profile", None)  # the host profile of the CPU that measured it
    assert host_profile is None or (path.parent / host_profile).is_file()
    spec = HardwareSpec.model_validate(data)
    assert spec.name == path.stem, "the file name is the catalog name"
    assert spec.sources, "every catalog entry says where its numbers come from"
    assert spec.vendor and spec.description
    assert spec.peak_flops(DType.bf16) > 0 and spec.memory_bandwidth > 0 and spec.memory_bytes > 0
    assert spec.host.eager_us > spec.host.cuda_graph_us or spec.kind.value == "cpu"


def test_catalog_has_the_required_devices_and_a_cpu_host() -> None:
    specs = list_hardware()
    names = {s.name for s in specs}
    assert names >= REQUIRED
    assert any(s.kind.value == "cpu" for s in specs)
    assert [s.name for s in specs] == sorted(names)
    assert len(specs) == len(_catalog_files())


def test_h100_sxm_datasheet_numbers() -> None:
    hw = load_hardware("h100-sxm")
    assert hw.peak_flops(DType.bf16) == pytest.approx(989.4e12)
    assert hw.peak_flops(DType.fp8_e4m3) == pytest.approx(1978.9e12)
    assert hw.memory_bandwidth == pytest.approx(3.35e12)
    assert hw.l2_bytes == pytest.approx(50e6)
    assert hw.sm_count == 132
    assert hw.interconnect.bandwidth > hw.interconnect.pcie_bandwidth > 0
    assert hw.ridge_point() == pytest.approx(989.4e12 / 3.35e12)


def test_dense_not_sparse_and_relations_between_devices() -> None:
    h100, h200, a100, b200 = (load_hardware(n) for n in ("h100", "h200", "a100", "b200"))
    assert h200.peak_flops(DType.bf16) == h100.peak_flops(DType.bf16)
    assert h200.memory_bandwidth > h100.memory_bandwidth
    assert a100.peak_flops(DType.bf16) == pytest.approx(312e12)  # dense; sparse would be 624
    assert b200.peak_flops(DType.bf16) > 2 * h100.peak_flops(DType.bf16)
    # No tensor cores on Pascal: bf16 falls back to the vector units.
    assert load_hardware("1080ti").peak_flops(DType.bf16) == pytest.approx(11.34e12)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("h100", "h100-sxm"),
        ("H100", "h100-sxm"),
        ("NVIDIA H100", "h100-sxm"),
        ("h100_sxm", "h100-sxm"),
        ("GTX 1080 Ti", "gtx-1080-ti"),
        ("MI300X", "mi300x"),
        ("cpu", "xeon-8480"),
        ("a100", "a100-80gb"),
    ],
)
def test_names_and_aliases_are_case_insensitive(name: str, expected: str) -> None:
    assert load_hardware(name).name == expected


def test_aliases_are_unique_across_the_catalog() -> None:
    seen: dict[str, str] = {}
    for spec in list_hardware():
        for key in (spec.name, *spec.aliases):
            norm = normalize_name(key)
            assert norm not in seen, f"{key} of {spec.name} is also {seen[norm]}"
            seen[norm] = spec.name


def test_unknown_name_lists_the_catalog() -> None:
    with pytest.raises(UnknownHardwareError) as err:
        load_hardware("h1000")
    text = str(err.value)
    assert "unknown hardware 'h1000'" in text
    assert "h100-sxm" in text and "mi300x" in text and "did you mean" in text


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
name = "my-gpu"
memory_bytes = "24 GiB"
memory_bandwidth = "1 TB/s"
sm_count = 80
[tensor]
bf16 = "200 TFLOP/s"
"""


def test_user_toml_and_json_files(tmp_path: Path) -> None:
    spec = load_hardware(str(write(tmp_path, "mine.toml", GOOD)))
    assert spec.name == "my-gpu" and spec.memory_bytes == 24 * 2**30 and spec.memory_bandwidth == 1e12
    as_json = write(tmp_path, "mine.json", spec.model_dump_json())
    assert load_hardware(str(as_json)) == spec
    assert load_hardware(as_json) == spec  # a Path works too


def test_user_file_based_on_a_catalog_entry(tmp_path: Path) -> None:
    path = write(tmp_path, "fast_h100.toml", 'base = "h100"\nmemory_bandwidth = "6.7 TB/s"\n[host]\neager_us = 2\n')
    spec = load_hardware(str(path))
    h100 = load_hardware("h100")
    assert spec.name == "fast_h100", "a derived device does not pass for its base"
    assert spec.memory_bandwidth == 6.7e12 and spec.host.eager_us == 2
    assert spec.host.cuda_graph_us == h100.host.cuda_graph_us and spec.tensor == h100.tensor
    assert spec.aliases == () and any("derived from" in s for s in spec.sources)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('name = "x"\nmemory_bandwidth = "1 TB/s"\n', "memory_bytes: missing required field"),
        ('name = "x"\nmemory_bytes = 1e9\nmemory_bandwidth = -5\n', "memory_bandwidth: Input should be greater than 0"),
        (GOOD.replace('"200 TFLOP/s"', "-1"), "tensor.bf16: Input should be greater than 0"),
        ("sm_cont = 3\n" + GOOD, "sm_cont: unknown field (did you mean 'sm_count'?)"),
        (GOOD + "bf61 = 3\n", "tensor.bf61: unknown field (did you mean 'bf16'?)"),
        (GOOD.replace('"1 TB/s"', '"1 TB"'), "memory_bandwidth"),
        (GOOD.replace("sm_count = 80", "sm_count = 0"), "sm_count: Input should be greater than or equal to 1"),
        ("name = [\n", "not valid TOML"),
        ('base = "nope"\n', "base: unknown hardware 'nope'"),
        ('name = ""\nmemory_bytes = 1\nmemory_bandwidth = 1\n', "name"),
    ],
)
def test_bad_hardware_file_names_the_file_and_field(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, "bad.toml", text)
    with pytest.raises(LoadError) as err:
        load_hardware(str(path))
    message = str(err.value)
    assert message.startswith(str(path)), message
    assert fragment in message, message


def test_missing_file_and_wrong_json(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="no such hardware file"):
        load_hardware(str(tmp_path / "absent.toml"))
    with pytest.raises(LoadError, match="expected a table"):
        load_hardware(str(write(tmp_path, "list.json", "[1, 2]")))


def test_calibrated_cost_table_carries_its_hardware(tmp_path: Path) -> None:
    hw = load_hardware("h100").model_copy(update={"launch_latency_us": 3.1})
    path = CostTable(hardware=hw).save(tmp_path / "calib.json")
    assert load_hardware(str(path)).launch_latency_us == 3.1
    bare = CostTable().save(tmp_path / "bare.json")
    with pytest.raises(LoadError, match="carries no hardware spec"):
        load_hardware(str(bare))
    broken = json.loads(path.read_text())
    broken["hardware"]["memory_bandwidth"] = -1
    with pytest.raises(LoadError, match=r"calib2.json \(hardware\): memory_bandwidth"):
        load_hardware(str(write(tmp_path, "calib2.json", json.dumps(broken))))


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("3.35 TB/s", "bandwidth", 3.35e12),
        ("80 GiB", "bytes", 80 * 2**30),
        ("989.4 TFLOP/s", "flops", 989.4e12),
        ("1979 TOPS", "flops", 1979e12),
        ("2816 KiB", "bytes", 2816 * 1024),
        ("1.5e12", "flops", 1.5e12),
        (7.0, "bytes", 7.0),
    ],
)
def test_units(value: object, kind: str, expected: float) -> None:
    assert parse_quantity(value, kind) == pytest.approx(expected)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "kind"), [("3 TB", "bandwidth"), ("3 TB/s", "bytes"), ("fast", "flops")])
def test_units_of_the_wrong_kind_are_errors(value: str, kind: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(value, kind)  # type: ignore[arg-type]


def test_import_hardware_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, hardware; hardware.load_hardware('h100'); sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
