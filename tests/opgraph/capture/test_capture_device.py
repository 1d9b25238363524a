"""The capture device: ``meta``, ``cpu``, ``cuda`` or ``cuda:N``, spelled right and present, and passed to every
place a capture uses it (model placement, the profiled run). No GPU needed: CUDA's presence is faked where a test
needs it, so that nothing depends on the machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch

from opgraph.capture import CaptureError, CaptureOptions
from opgraph.capture.phase import check_device, parse_device
from opgraph.cli.app import app
from opgraph.ir import OpgraphError
from tests.conftest import cli_runner, one_error_line


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with two visible CUDA devices, as torch reports them (nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


class Stop(OpgraphError):
    """Raised by a stub once it has seen what it was given: the command ends with one error line."""


# ---------------------------------------------------------------- spelling
@pytest.mark.parametrize(
    ("text", "device"),
    [("meta", "meta"), ("cpu", "cpu"), ("cuda", "cuda"), ("cuda:1", "cuda:1"), ("cuda:07", "cuda:7")],
)
def test_a_device_is_meta_cpu_cuda_or_cuda_n(text: str, device: str) -> None:
    assert parse_device(text) == device
    options = CaptureOptions(device=text)
    assert (options.device, options.device_type) == (device, device.partition(":")[0])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cuda:x", "--device: unknown device 'cuda:x': the N of cuda:N is a device index, a number"),
        ("cuda:", "--device: unknown device 'cuda:': the N of cuda:N is a device index"),
        ("cuda:-1", "--device: unknown device 'cuda:-1': the N of cuda:N is a device index"),
        ("cuda:1.5", "--device: unknown device 'cuda:1.5': the N of cuda:N is a device index"),
        ("cpu:0", "--device: unknown device 'cpu:0' (one of meta, cpu, cuda, cuda:N)"),
        ("gpu", "--device: unknown device 'gpu' (one of meta, cpu, cuda, cuda:N)"),
        ("CUDA", "--device: unknown device 'CUDA'"),
    ],
)
def test_a_misspelt_device_is_one_line_naming_the_option(text: str, message: str) -> None:
    for make in (lambda: parse_device(text), lambda: CaptureOptions(device=text)):
        with pytest.raises(CaptureError) as info:
            make()
        assert str(info.value).startswith(message) and "\n" not in str(info.value)


# ---------------------------------------------------------------- presence
@pytest.mark.usefixtures("two_gpus")
def test_cuda_n_must_be_a_visible_device() -> None:
    for ok in ("meta", "cpu", "cuda", "cuda:0", "cuda:1"):
        check_device(ok)
        CaptureOptions(device=ok).validate()
    with pytest.raises(CaptureError) as info:
        CaptureOptions(device="cuda:2").validate()
    assert str(info.value) == (
        "--device: cuda:2 does not exist: 2 CUDA devices visible (cuda:0, cuda:1) "
        "(pick one of those or check CUDA_VISIBLE_DEVICES)"
    )


@pytest.mark.usefixtures("no_cuda")
def test_cuda_without_cuda_is_refused_and_meta_or_cpu_are_always_here() -> None:
    for device in ("cuda", "cuda:1"):
        with pytest.raises(CaptureError, match=rf"^--device: cannot use {device}: "):
            check_device(device)
    check_device("meta")
    check_device("cpu")


# ---------------------------------------------------------------- the CLI
def test_capture_refuses_a_bad_device_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "g.json"
    line = one_error_line(cli_runner().invoke(app, ["capture", "llama-3.2-1b", "--device", "cuda:x", "-o", str(out)]))
    assert line.startswith("error: --device: unknown device 'cuda:x'")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    line = one_error_line(cli_runner().invoke(app, ["capture", "llama-3.2-1b", "--device", "cuda:1", "-o", str(out)]))
    assert line.startswith("error: --device: cuda:1 does not exist: 1 CUDA device visible (cuda:0)")
    assert not out.exists()


@pytest.mark.usefixtures("two_gpus")
@pytest.mark.parametrize("profile", [False, True])
def test_capture_passes_cuda_n_to_the_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, profile: bool) -> None:
    import opgraph.capture.api
    import opgraph.capture.profile

    seen: dict[str, Any] = {}

    def stub(model: str, **options: Any) -> Any:
        seen.update(options)
        raise Stop("stub")

    monkeypatch.setattr(opgraph.capture.api, "capture", stub)
    monkeypatch.setattr(opgraph.capture.profile, "profile_capture", stub)
    args = ["capture", "llama-3.2-1b", "--device", "cuda:1", "-o", str(tmp_path / "g.json")]
    assert one_error_line(cli_runner().invoke(app, [*args, *(["--profile"] if profile else [])])) == "error: stub"
    assert seen["device"] == "cuda:1"


# ---------------------------------------------------------------- where the capture uses it
@pytest.mark.usefixtures("two_gpus")
def test_the_model_is_built_on_cuda_n(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    from opgraph.capture.api import prepare

    built_on: list[torch.device] = []

    def from_config(*args: Any, **kwargs: Any) -> Any:
        built_on.append(torch.get_default_device())
        raise Stop("stub")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", from_config)
    with pytest.raises(Stop):
        prepare("llama-3.2-1b", CaptureOptions(device="cuda:1", layers=1, seq_len=8))
    assert built_on == [torch.device("cuda", 1)]
    with pytest.raises(CaptureError, match="cuda:2 does not exist"):  # checked before anything is built
        prepare("llama-3.2-1b", CaptureOptions(device="cuda:2", layers=1, seq_len=8))
    assert len(built_on) == 1


@pytest.mark.usefixtures("two_gpus")
def test_the_profiled_run_prepares_and_waits_for_cuda_n(monkeypatch: pytest.MonkeyPatch) -> None:
    import opgraph.capture.profile as profile

    prepared: list[CaptureOptions] = []

    def prepare(model: str, opts: CaptureOptions) -> Any:
        prepared.append(opts)
        raise Stop("stub")

    monkeypatch.setattr(profile, "prepare", prepare)
    with pytest.raises(Stop):
        profile.profile_capture("llama-3.2-1b", device="cuda:1", seq_len=8)
    assert [(o.device, o.device_type) for o in prepared] == [("cuda:1", "cuda")]
    synced: list[object] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    profile._sync("cuda:1")
    profile._sync("cpu")
    assert synced == ["cuda:1"]
