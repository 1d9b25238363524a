"""The saved catalog: deduplicated op configs with provenance (which models, phases, hardware)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import Field, model_validator

from opgraph.ir import GraphIdentity, Op, OpBase
from opgraph.ir.configs import CONFIG_HASH_VERSION, config_dict, hash_config_dict
from opgraph.ir.tensor import FrozenModel, NonNegInt


class ConfigSource(GraphIdentity):
    """Where a config was seen and how often: one model, phase, op stage and device."""

    stage: str = ""
    """Stage of the ops themselves (``prefill`` or ``decode``), empty when unknown."""
    device: str = ""
    """Capture device: ``meta``, ``cpu``, ``cuda``."""
    hardware: str = ""
    """Hardware the graph was captured or traced on (``H100``), empty when not recorded."""
    count: int = Field(ge=1)
    """Ops with this config in the graphs of this source."""

    def key(self) -> tuple[str, str, str, str, str, str]:
        """Everything but the count: sources with equal keys are merged by adding counts."""
        return (self.model, self.architecture, self.phase, self.stage, self.device, self.hardware)


class CatalogEntry(FrozenModel):
    """One deduplicated op config and everywhere it was seen."""

    hash: str
    """sha256 of the config's canonical JSON (see :func:`opgraph.catalog.config_hash`)."""
    operation: str
    """Operation name (``gemm``, ``rmsnorm``, ``silu``), as :func:`opgraph.catalog.operation_name`."""
    op: Op
    """The op with its identity stripped (id 0, no scope/layer/stage, no tensor ids)."""
    sources: tuple[ConfigSource, ...]
    """Provenance, sorted by model, phase, stage, device, hardware."""

    @model_validator(mode="after")
    def _check_hash(self) -> CatalogEntry:
        actual = hash_config_dict(config_dict(self.op))
        if actual != self.hash:
            raise ValueError(
                f"config hash {self.hash[:12]} does not match its op (computed {actual[:12]}); "
                "the entry was edited or written by another version"
            )
        if not self.sources:
            raise ValueError("a catalog entry needs at least one source")
        return self

    @property
    def uses(self) -> int:
        """Total times the config was seen."""
        return sum(s.count for s in self.sources)

    @property
    def models(self) -> tuple[str, ...]:
        """Distinct models it came from, sorted."""
        return tuple(sorted({s.model for s in self.sources}))

    @property
    def phases(self) -> tuple[str, ...]:
        """Distinct stages (or graph phases, where ops carry none), sorted."""
        return tuple(sorted({s.stage or s.phase for s in self.sources if s.stage or s.phase}))

    @property
    def hardware(self) -> tuple[str, ...]:
        """Distinct hardware names, sorted (empty names left out)."""
        return tuple(sorted({s.hardware for s in self.sources if s.hardware}))

    @property
    def definition(self) -> str:
        """The op's definition name."""
        return self.op.definition

    def restricted(self, sources: Iterable[ConfigSource]) -> CatalogEntry | None:
        """The entry with only ``sources`` (a subset of its own), or ``None`` when none are left."""
        kept = tuple(sources)
        if not kept:
            return None
        return self.model_copy(update={"sources": kept})


class GraphRecord(FrozenModel):
    """A graph merged into the catalog; its fingerprint makes adding the same graph twice a no-op."""

    fingerprint: str
    """sha256 of the graph's serialised form."""
    model: str
    """Model name from the graph's metadata."""
    architecture: str = ""
    """transformers architecture class."""
    phase: str = ""
    """Phase of the graph."""
    device: str = ""
    """Capture device."""
    hardware: str = ""
    """Hardware name, when known."""
    path: str = ""
    """File the graph was read from (as given), empty for graphs added in memory."""
    ops: NonNegInt = 0
    """Ops in the graph that went into the catalog (views excluded unless asked for)."""
    configs: NonNegInt = 0
    """Distinct configs among them."""


class Catalog(FrozenModel):
    """A deduplicated catalog of op configs from many graphs, with provenance.

    Entries are sorted by operation, definition and hash so the saved file is stable.
    """

    schema_version: Literal[1] = 1
    """Format version; loaders refuse other versions with a clear message."""
    hash_version: int = CONFIG_HASH_VERSION
    """Version of the config normalisation rules the hashes were made with."""
    graphs: tuple[GraphRecord, ...] = ()
    """Graphs merged in, in the order they were added."""
    entries: tuple[CatalogEntry, ...] = ()
    """Distinct configs."""

    @model_validator(mode="after")
    def _check(self) -> Catalog:
        if self.hash_version != CONFIG_HASH_VERSION:
            raise ValueError(
                f"hash_version {self.hash_version} differs from this opgraph's {CONFIG_HASH_VERSION}; "
                "rebuild the catalog with `opgraph ops add`"
            )
        seen: set[str] = set()
        for e in self.entries:
            if e.hash in seen:
                raise ValueError(f"config {e.hash[:12]} appears twice")
            seen.add(e.hash)
        return self

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def operations(self) -> tuple[str, ...]:
        """Distinct operation names, sorted."""
        return tuple(sorted({e.operation for e in self.entries}))

    @property
    def models(self) -> tuple[str, ...]:
        """Distinct models over all entries, sorted."""
        return tuple(sorted({s.model for e in self.entries for s in e.sources}))

    def entry(self, config_hash: str) -> CatalogEntry:
        """The entry whose hash is or starts with ``config_hash``; ``KeyError`` if none or ambiguous."""
        hits = [e for e in self.entries if e.hash.startswith(config_hash)]
        if len(hits) != 1:
            raise KeyError(config_hash)
        return hits[0]

    def ops(self) -> list[OpBase]:
        """The stored op of every entry, in catalog order."""
        return [e.op for e in self.entries]
