"""Simulation settings as data: engine groups, the host thread, policy, tensor parallelism, noise.

Everything here is a frozen pydantic model, so a configuration can be saved, diffed and carried
in a timeline's provenance.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from opgraph.ir import OpKind, Scalar
from opgraph.ir.tensor import FrozenModel

NonNegFloat = Annotated[float, Field(ge=0)]
"""A float of zero or more."""


class EngineRole(str, Enum):
    """What an engine group does."""

    COMPUTE = "compute"
    """Runs kernels (SMs, compute units). One compute group takes every kind no other group claims."""
    COPY = "copy"
    """Copy engines (DMA): MEMORY ops by default."""
    LINK = "link"
    """Communication links: COLLECTIVE ops, shared by the ranks of one communicator."""


_DEFAULT_KINDS: dict[EngineRole, tuple[OpKind, ...]] = {
    EngineRole.COMPUTE: (),
    EngineRole.COPY: (OpKind.MEMORY,),
    EngineRole.LINK: (OpKind.COLLECTIVE,),
}


class EngineGroup(FrozenModel):
    """A group of identical engines that run ops of some kinds, one op per engine at a time.

    An engine is a place where one op runs at a time: a CUDA stream's worth of concurrency, not a
    share of the hardware. On a real device the ops that run at once on several engines of one rank
    share that device's peak FLOP/s and memory bandwidth (see
    :attr:`SimulationConfig.independent_engines`).
    """

    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")]
    """Track prefix in the timeline (``compute`` gives tracks ``compute0``, ``compute1``, ...)."""
    role: EngineRole = EngineRole.COMPUTE
    """Compute, copy or link."""
    count: Annotated[int, Field(ge=1, le=4096)] = 1
    """Engines in the group."""
    kinds: tuple[OpKind, ...] = ()
    """Op kinds routed here; empty on the one catch-all compute group. Copy groups default to
    MEMORY, link groups to COLLECTIVE."""

    @model_validator(mode="before")
    @classmethod
    def _default_kinds(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("kinds"):
            role = EngineRole(data.get("role", EngineRole.COMPUTE))
            data = {**data, "kinds": _DEFAULT_KINDS[role]}
        return data


class HostMode(str, Enum):
    """How the host issues ops."""

    EAGER = "eager"
    """Eager PyTorch: Python and dispatcher overhead per op (``HardwareSpec.host.eager_us``)."""
    CUDA_GRAPH = "cuda_graph"
    """Replay of a captured CUDA graph (``HardwareSpec.host.cuda_graph_us`` per op)."""
    NONE = "none"
    """No host cost: every op is issued at time zero (an ideal launcher)."""


def host_time_conflict(mode: HostMode | str, per_op_us: float | None) -> str | None:
    """Why a host time of ``per_op_us`` per op cannot go with host ``mode``, or ``None`` when it can.

    Host mode ``none`` means no host (every op issued at time zero), so a host time per op above 0
    with it is a contradiction, not a setting to apply or drop silently. :class:`HostConfig` refuses
    it with this message; the CLI (``--host none --host-us``) and scenario files (``host = 'none'``,
    ``host_us``) refuse it with the same one, naming their own option or field.

    >>> host_time_conflict(HostMode.NONE, 30.0)
    '30 us per op has no host to spend it: host mode none issues every op at time zero'
    >>> host_time_conflict("none", 0.0) is None, host_time_conflict(HostMode.EAGER, 30.0) is None
    (True, True)
    """
    if HostMode(mode) is not HostMode.NONE or not per_op_us:
        return None
    return f"{per_op_us:g} us per op has no host to spend it: host mode none issues every op at time zero"


class HostConfig(FrozenModel):
    """The host thread: issues ops in program order, spending ``per_op_us`` on each; launches are
    asynchronous, so the host runs ahead of the device except at sync points."""

    mode: HostMode = HostMode.EAGER
    """Eager, CUDA graph, or none."""
    per_op_us: NonNegFloat | None = None
    """Host time per op; ``None`` takes it from the hardware spec for ``mode``. Above 0 only with a
    host: mode ``none`` refuses it (:func:`host_time_conflict`)."""
    free_ops: bool = False
    """Charge host time for ops that launch no kernel (views) too."""
    framework: bool = True
    """Eager mode: add the framework's host time before each op to the op's issue time: the graph's
    own (captured with ``--host-timing``, ``OpBase.host_gap_us``) when it has it, else the host
    profile's prediction (:attr:`host_profile`); off, neither."""
    host_profile: str | None = None
    """Host profile file (``.host.json``, :mod:`hardware.hostprofile`) for graphs without host timing;
    ``None``: the one the hardware's catalog entry names (``host_profile = ...``), if any, when the
    cost model is the device's measured profile (``simulators.api.HOST_PROFILE_COST_MODELS``); other
    cost models then keep the spec's host time per op and no framework time."""
    sync_each_step: bool = True
    """The host waits for the last op of each forward step (``op.step``) before issuing the next
    step, as a generate loop that reads the sampled token does."""
    sync_ops: tuple[int, ...] = ()
    """Op ids after which the host waits for the device (``.item()``, ``.cpu()``)."""
    record: bool = True
    """Record host spans on a ``host`` track."""

    @model_validator(mode="after")
    def _host_to_spend_it(self) -> HostConfig:
        conflict = host_time_conflict(self.mode, self.per_op_us)
        if conflict is not None:
            # Raised at ``per_op_us``, not at the model, so that an error names the field
            # (``host.per_op_us`` in a SimulationConfig file); a custom error keeps pydantic's
            # ``Value error,`` prefix off the message.
            error = PydanticCustomError("host_time_without_host", conflict)
            detail = InitErrorDetails(type=error, loc=("per_op_us",), input=self.per_op_us)
            raise ValidationError.from_exception_data(type(self).__name__, [detail])
        return self


class SimulationConfig(FrozenModel):
    """Everything that decides a simulated schedule besides the graph, the hardware and the costs.

    **What an engine is.** An engine runs one op at a time, like a CUDA stream: several compute
    engines let independent ops (the q, k and v projections) run at the same time. They do not add
    hardware. By default the ops running at once on one rank share its device: an op alone runs
    for the time its cost model gives, and while a set of ops runs together each progresses at the
    rate ``s = min(1, 1 / sum(c), 1 / sum(m))`` of its own, where ``c`` and ``m`` are the fractions of
    the device's peak FLOP/s and memory bandwidth the op uses alone (its FLOPs and bytes at peak over
    its duration, :func:`hardware.base.peak_times`). So overlapping a compute-bound GEMM with a
    memory-bound copy gains, two compute-bound GEMMs gain nothing, and no schedule beats the
    device's roofline. Collectives run on links and are not shared this way.

    With :attr:`independent_engines` each engine is a whole device of its own: the model of a
    hypothetical accelerator with several independent compute units (the seed project's study of
    how many engines a decoder layer can use).
    """

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version, optional in a file written by hand (read as 1); the loader refuses newer versions with a
    clear message."""
    groups: tuple[EngineGroup, ...] = (
        EngineGroup(name="compute", role=EngineRole.COMPUTE, count=1),
        EngineGroup(name="link", role=EngineRole.LINK, count=1),
    )
    """Engine groups of one device (one rank)."""
    policy: str = "earliest"
    """Scheduling policy: a registered name, ``package.module:Class`` or ``path/to/file.py:Class``."""
    host: HostConfig = Field(default_factory=HostConfig)
    """The host thread."""
    tp: Annotated[int, Field(ge=1, le=1024)] = 1
    """Tensor-parallel ranks; each runs the graph, and collectives synchronise them."""
    jitter: Annotated[float, Field(ge=0, le=2)] = 0.0
    """Relative run-to-run noise of op durations (sigma of a log-normal factor); 0 is deterministic."""
    seed: int = 0
    """Seed of the noise (per rank: ``f"{seed}:{rank}"``)."""
    skip_uncosted: bool = False
    """Simulate ops the cost model declines as free instead of failing (they are still listed)."""
    independent_engines: bool = False
    """Engines that each have a whole device's peak FLOP/s and bandwidth (a hypothetical accelerator
    with independent compute units). Off: the ops running at once on one rank share the device's
    peaks, so more engines never beat the device's roofline. Sharing needs the ops' FLOPs and bytes
    at the device's peaks, which a problem costed on hardware carries; a problem built from plain
    durations has none, and its engines are independent either way."""

    @field_validator("groups")
    @classmethod
    def _check_groups(cls, groups: tuple[EngineGroup, ...]) -> tuple[EngineGroup, ...]:
        # A field validator, so that an error names ``groups`` rather than the whole config.
        if not groups:
            raise ValueError(
                "no engine group given: give at least the catch-all compute group, "
                'e.g. [{"name": "compute", "count": 1}]'
            )
        names = [g.name for g in groups]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"engine group names must be unique, {sorted(dup)[0]!r} repeats")
        catch_all = [g for g in groups if not g.kinds]
        if len(catch_all) != 1 or catch_all[0].role is not EngineRole.COMPUTE:
            rule = "exactly one compute group must have no kinds (it takes every unclaimed kind)"
            found = ", ".join(f"{g.name!r} ({g.role.value})" for g in catch_all)
            raise ValueError(f"{rule}; these have none: {found}" if found else f"{rule}; every group names kinds")
        claimed: dict[OpKind, str] = {}
        for g in groups:
            for k in g.kinds:
                if k in claimed:
                    raise ValueError(f"kind {k.value!r} is claimed by groups {claimed[k]!r} and {g.name!r}")
                claimed[k] = g.name
            if g.role is EngineRole.LINK and set(g.kinds) != {OpKind.COLLECTIVE}:
                raise ValueError(f"link group {g.name!r} must take only collective ops")
            if g.role is not EngineRole.LINK and OpKind.COLLECTIVE in g.kinds:
                raise ValueError(f"collective ops must go to a link group, not {g.name!r}")
        if sum(g.role is EngineRole.LINK for g in groups) > 1:
            raise ValueError("at most one link group")
        return groups

    @classmethod
    def standard(cls, engines: int = 1, *, copy_engines: int = 0, links: int = 1, **settings: Any) -> SimulationConfig:
        """``engines`` compute engines, optional copy engines for MEMORY ops, and ``links`` links."""
        groups = [EngineGroup(name="compute", role=EngineRole.COMPUTE, count=engines)]
        if copy_engines:
            groups.append(EngineGroup(name="copy", role=EngineRole.COPY, count=copy_engines))
        groups.append(EngineGroup(name="link", role=EngineRole.LINK, count=links))
        return cls(groups=tuple(groups), **settings)

    @property
    def compute_group(self) -> EngineGroup:
        """The catch-all compute group."""
        return next(g for g in self.groups if not g.kinds)

    @property
    def engines(self) -> int:
        """Engines in the catch-all compute group."""
        return self.compute_group.count

    def with_engines(self, engines: int) -> SimulationConfig:
        """A copy with ``engines`` engines in the catch-all compute group."""
        groups = tuple(g.model_copy(update={"count": engines}) if not g.kinds else g for g in self.groups)
        return self.model_copy(update={"groups": groups})

    def with_copy_engines(self, copy_engines: int) -> SimulationConfig:
        """A copy with ``copy_engines`` copy engines: the copy group's count set, the group added
        (named ``copy``, taking MEMORY ops) when there is none, or removed for 0 (MEMORY ops then run
        where the other groups route them). Raises ``ValueError`` for several copy groups, as which
        one is meant is unclear.

        >>> SimulationConfig.standard(2).with_copy_engines(3).provenance()["engines.copy"]
        3
        >>> "engines.copy" in SimulationConfig.standard(copy_engines=2).with_copy_engines(0).provenance()
        False
        """
        if copy_engines < 0:
            raise ValueError(f"copy engine count {copy_engines} is negative")
        copies = [g for g in self.groups if g.role is EngineRole.COPY]
        if len(copies) > 1:
            names = ", ".join(repr(g.name) for g in copies)
            raise ValueError(f"the config has {len(copies)} copy groups ({names}); set their counts in it")
        if copies:
            old = copies[0]
            groups = tuple(
                g.model_copy(update={"count": copy_engines}) if g is old else g
                for g in self.groups
                if g is not old or copy_engines
            )
        elif copy_engines:
            copy = EngineGroup(name="copy", role=EngineRole.COPY, count=copy_engines)
            groups = (*self.groups, copy)
        else:
            return self
        return type(self).model_validate({**self.model_dump(), "groups": [g.model_dump() for g in groups]})

    def with_links(self, links: int) -> SimulationConfig:
        """A copy with ``links`` communication links: the link group's count set, or a link group
        (named ``link``) added when there is none.

        >>> SimulationConfig().with_links(4).provenance()["engines.link"]
        4
        """
        if links < 1:
            raise ValueError(f"link count {links} is below 1")
        has_link = any(g.role is EngineRole.LINK for g in self.groups)
        if has_link:
            groups = tuple(
                g.model_copy(update={"count": links}) if g.role is EngineRole.LINK else g for g in self.groups
            )
        else:
            groups = (*self.groups, EngineGroup(name="link", role=EngineRole.LINK, count=links))
        return type(self).model_validate({**self.model_dump(), "groups": [g.model_dump() for g in groups]})

    def provenance(self) -> dict[str, Scalar]:
        """Flat settings for a timeline's source config."""
        out: dict[str, Scalar] = {
            "policy": self.policy,
            "tp": self.tp,
            "host_mode": self.host.mode.value,
            "jitter": self.jitter,
            "seed": self.seed,
            "skip_uncosted": self.skip_uncosted,
        }
        if self.independent_engines:
            out["independent_engines"] = True
        if self.host.per_op_us is not None:
            out["host_per_op_us"] = self.host.per_op_us
        if self.host.host_profile is not None:
            out["host_profile"] = self.host.host_profile
        for g in self.groups:
            out[f"engines.{g.name}"] = g.count
        return out
