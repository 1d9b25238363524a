"""Device profiles: what ``opgraph profile`` measured on one GPU, as a file the ``profile`` cost model reads.

A :class:`DeviceProfile` holds one :class:`ProfilePoint` per synthetic op config the sweep replayed
(the op itself, its median device time, spread and host issue time), the device's launch floor
and host time per aten call, and provenance (GPU, clocks, driver, CUDA, torch, date, host CPU).
The sweep streams points to a JSONL *parts* file as they complete (:func:`read_parts` reads what
is valid of one cut short) and writes the profile JSON at the end.

Catalog devices name their profile in their TOML (``profile = "h100-sxm.profile.json"``, a path
relative to the TOML); :func:`hardware_profile` finds it for a loaded spec. The name is kept
beside the spec, not in it, so a spec's fields (and the files that carry one) stay as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from hardware.spec import HardwareSpec, NonNegFloat
from hardware.versioned import FileKind
from opgraph.ir import LoadError, Op, Scalar, save_model
from opgraph.ir.tensor import FrozenModel, NonNegInt

PROFILE_FORMAT = "opgraph.device_profile"
"""The ``format`` marker of a profile file."""
PROFILE_SCHEMA_VERSION = 1
"""The profile file format version this opgraph reads and writes."""
PROFILE_SUFFIX = ".profile.json"
"""File names ending so are read as device profiles (``-c h100.profile.json``)."""


class ProfileDevice(FrozenModel):
    """Where a profile was measured: the device, its clocks and software, the host, the date."""

    name: str = ""
    """Device name as the driver reports it (``NVIDIA H100 80GB HBM3``), or ``cpu``."""
    hardware: str = ""
    """Catalog name of the device (``h100-sxm``): the ``--hardware`` the profile predicts for."""
    device_type: str = "cuda"
    """``cuda`` or ``cpu``."""
    sm_clock_mhz: NonNegFloat | None = None
    """Median SM clock over the timed points (NVML)."""
    max_sm_clock_mhz: NonNegFloat | None = None
    """The SM clock limit the driver reports."""
    memory_clock_mhz: NonNegFloat | None = None
    """Memory clock the driver reports."""
    driver: str = ""
    """GPU driver version."""
    cuda: str = ""
    """CUDA version torch was built with."""
    torch: str = ""
    """torch version."""
    host_cpu: str = ""
    """Model name of the host CPU (the host times are its)."""
    python: str = ""
    """Python version."""
    date: str = ""
    """When the sweep started (ISO 8601, UTC)."""


class ProfilePoint(FrozenModel):
    """One measured synthetic op config."""

    key: str
    """The config key (:func:`validators.config_key`), unique in a profile."""
    op: Op
    """The op replayed (its shape fields decide where it sits in the profile)."""
    seconds: NonNegFloat
    """Median device time of one call (sum of its kernels)."""
    spread_s: NonNegFloat = 0.0
    """Interquartile range of the samples."""
    samples: Annotated[int, Field(ge=1)] = 1
    """Timed samples behind the median."""
    host_s: NonNegFloat | None = None
    """Median host time to issue one call (eager PyTorch), when measured, as the host ran then
    (:meth:`DeviceProfile.issue_s` scales it to the host at its fastest)."""
    host_ref_s: NonNegFloat | None = None
    """The issue time of a reference call (a one-element in-place add) timed in the same bursts as
    ``host_s``: the host's speed at that moment (a shared host's drifts by half within seconds)."""
    sm_clock_mhz: NonNegFloat | None = None
    """Median SM clock while the point was timed."""
    tag: str = ""
    """A role beyond the op (``launch``: the empty-ish kernel that measures the launch floor)."""
    passes: tuple[NonNegFloat, ...] = ()
    """Device time of one call in each pass, when the sweep measured the point more than once (a
    compute-bound point: its time moves with the GPU's power state); ``seconds`` is their median."""
    dirty_bytes: NonNegInt = 0
    """Bytes written (left dirty in L2) after the flush before each timed call, as the op before an op
    leaves its output in a model: the ``writeback`` points measure what an op pays to write them back."""


HOST_REF_QUANTILE = 0.1
"""Which quantile of a sweep's reference issue times is the host at its fastest (its quiet state:
the GPU machines measured alternate between two speeds within seconds)."""


def fastest_ref(points: Iterable[ProfilePoint]) -> float | None:
    """The :data:`HOST_REF_QUANTILE` quantile of the points' reference issue times (seconds), ``None``
    when none holds one."""
    refs = sorted(p.host_ref_s for p in points if p.host_ref_s)
    return refs[int(HOST_REF_QUANTILE * (len(refs) - 1))] if refs else None


class DeviceProfile(FrozenModel):
    """A device's measured profile (see the module docstring)."""

    format: Literal["opgraph.device_profile"] = "opgraph.device_profile"
    """Marks the file as a device profile."""
    schema_version: int = PROFILE_SCHEMA_VERSION
    """Format version (:data:`PROFILE_SCHEMA_VERSION`)."""
    device: ProfileDevice = Field(default_factory=ProfileDevice)
    """Provenance."""
    timing: dict[str, Scalar] = Field(default_factory=dict)
    """The timing settings of the sweep (sessions, cold L2...)."""
    launch_us: NonNegFloat | None = None
    """Device time of an empty-ish kernel: the floor of every op's time."""
    aten_issue_us: NonNegFloat | None = None
    """Host time to issue one aten call (eager PyTorch), for ops whose kind the profile lacks (scaled
    to ``host_ref_us`` where the points hold their reference)."""
    host_ref_us: NonNegFloat | None = None
    """The reference call's issue time at the host's fastest (the :data:`HOST_REF_QUANTILE` quantile of
    the points' ``host_ref_s``), to which :meth:`issue_s` scales every point's host time; ``None`` in a
    profile measured before the sweep timed the reference (its host times are taken as measured)."""
    points: tuple[ProfilePoint, ...] = ()
    """Measured configs."""
    planned: Annotated[int, Field(ge=0)] = 0
    """Points the sweep planned (more than ``points`` when it stopped at its budget)."""
    complete: bool = True
    """The sweep measured every planned point."""
    notes: tuple[str, ...] = ()
    """Remarks (budget stop, failed points)."""

    def issue_s(self, point: ProfilePoint) -> float | None:
        """``point``'s host time to issue one call, scaled from the host's speed when it was measured to
        its fastest (``host_ref_us / host_ref_s``), so that a sweep of a host that slowed down for a
        while gives the host times a sweep of the same host at its fastest gives."""
        if point.host_s is None or self.host_ref_us is None or not point.host_ref_s:
            return point.host_s
        return point.host_s * self.host_ref_us * 1e-6 / point.host_ref_s

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON, atomically."""
        return save_model(self, path)

    @classmethod
    def load(cls, path: str | Path) -> DeviceProfile:
        """Read a profile (alias of :func:`load_profile`)."""
        return load_profile(path)


PROFILE_FILE = FileKind(
    "device profile",
    PROFILE_FORMAT,
    PROFILE_SCHEMA_VERSION,
    "opgraph profile",
    "re-measure it with `opgraph profile` of this opgraph",
)
"""How a device profile file is checked and read."""


def load_profile(path: str | Path) -> DeviceProfile:
    """Read a :class:`DeviceProfile`; a missing, truncated, foreign or other-version file is a one-line
    :class:`~opgraph.ir.LoadError` naming it (:class:`~opgraph.ir.SchemaVersionError` for the version)."""
    parts = Path(f"{path}.parts.jsonl")
    hint = (
        f"the sweep's points are in {parts}: rerun `opgraph profile --resume` to rewrite the profile"
        if parts.exists()
        else "re-measure it with `opgraph profile`"
    )
    return PROFILE_FILE.load(path, DeviceProfile, unreadable_hint=hint)


def parts_path(profile_path: str | Path) -> Path:
    """The JSONL parts file the sweep streams points to, next to the profile (``OUT.parts.jsonl``)."""
    return Path(f"{profile_path}.parts.jsonl")


def read_parts(path: str | Path) -> tuple[dict[str, object] | None, list[dict[str, object]], int]:
    """The header and the record dicts of a parts file, and how many lines were unreadable.

    A sweep killed mid-write leaves a cut last line: it and any other line that is not a JSON
    object are skipped (and counted), the rest is kept. The header is the first record with a
    ``header`` key.
    """
    header: dict[str, object] | None = None
    records: list[dict[str, object]] = []
    bad = 0
    for line in _lines(Path(path)):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if not isinstance(rec, dict):
            bad += 1
        elif "header" in rec:
            if header is None and isinstance(rec["header"], dict):
                header = rec["header"]
        else:
            records.append(rec)
    return header, records, bad


def _lines(path: Path) -> Iterator[str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LoadError(f"cannot read: {exc}", where=str(path)) from None
    for line in text.splitlines():
        if line.strip():
            yield line


# -- which profile a device ships with --------------------------------------------------------------


def hardware_profile(hw: HardwareSpec | str) -> Path | None:
    """The profile file the device's TOML names (``profile = ...``), or ``None`` when it ships none.

    >>> hardware_profile("a6000") is None
    True
    """
    from hardware.loader import list_hardware, load_hardware, named_profile

    list_hardware()  # the catalog registers its profiles as it loads (once)
    return named_profile(hw.name if isinstance(hw, HardwareSpec) else load_hardware(hw).name)
