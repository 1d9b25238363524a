"""The kinds of file a user may hand opgraph, told apart by their contents: one table for every error that
names a file given in the wrong place.

A JSON file is recognised by the ``format`` it carries (cost tables, device and host profiles) or else by
top-level keys every file of its kind holds; a JSON-lines file by the keys of its first record. The
loaders (:func:`opgraph.ir.load_model`) and the readers of replay results
(:func:`validators.results.describe_file`) both read this table, so a kind is described the same way
wherever it turns up.

>>> known_file({"ops": [], "edges": []}).description
'an op graph (`opgraph capture`)'
>>> known_file({"format": "opgraph.cost_table", "entries": []}).model
'CostTable'
>>> known_file({"anything": 1}) is None
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class KnownFile:
    """One kind of file: how to recognise it and what to call it."""

    noun: str
    """What one is, with its article: ``an op graph``."""
    made_by: str = ""
    """Where one comes from, for the description (``\\`opgraph capture\\```); empty when the hint says it."""
    model: str = ""
    """The class a file of this kind loads as (``OpGraph``); empty for other tools' files."""
    keys: frozenset[str] = frozenset()
    """Top-level keys every file (every record, for JSON lines) of this kind holds."""
    format: str = ""
    """The ``format`` value it carries; when set, it alone recognises the kind."""
    json_lines: bool = False
    """One record per line (``keys`` are a record's), not one JSON document."""

    @property
    def description(self) -> str:
        """The noun with where one comes from: ``an op graph (`opgraph capture`)``."""
        return self.describe()

    def describe(self, note: str = "") -> str:
        """The description with ``note`` (what to do with such a file) added inside its parentheses."""
        said = ": ".join(part for part in (self.made_by, note) if part)
        return f"{self.noun} ({said})" if said else self.noun

    def matches(self, record: Mapping[str, object]) -> bool:
        """True when ``record`` (a file's top-level object, or a JSON-lines file's first record) is of this kind."""
        if self.format:
            return record.get("format") == self.format
        return bool(self.keys) and self.keys <= record.keys()


KNOWN_FILES: tuple[KnownFile, ...] = (
    KnownFile("a calibrated cost table", "`opgraph calibrate`", "CostTable", format="opgraph.cost_table"),
    KnownFile("a device profile", "`opgraph profile`", "DeviceProfile", format="opgraph.device_profile"),
    KnownFile("a host profile", "`python -m hardware.hostfit`", "HostProfile", format="opgraph.host_profile"),
    KnownFile("a torch-profiler trace", keys=frozenset({"traceEvents"})),
    KnownFile("an op graph", "`opgraph capture`", "OpGraph", frozenset({"ops", "edges"})),
    KnownFile("a timeline", "", "Timeline", frozenset({"source", "spans"})),
    KnownFile(
        "a scenario summary",
        "the summary.json of `opgraph run`",
        "ScenarioSummary",
        frozenset({"phases", "expectations"}),
    ),
    KnownFile(
        "simulation statistics", "`opgraph simulate --stats`", "SimulationStats", frozenset({"makespan_us", "engines"})
    ),
    KnownFile(
        "a comparison",
        "`opgraph compare --json`",
        "Comparison",
        frozenset({"predicted", "reference", "join", "end_to_end"}),
    ),
    KnownFile(
        "a serving result", "`opgraph serve-sim -o`", "ServingResult", frozenset({"settings", "summary", "requests"})
    ),
    KnownFile(
        "a validation summary",
        "the summary.json of `opgraph validate`",
        "ValidationSummary",
        frozenset({"model", "device", "hardware", "steps"}),
    ),
    KnownFile("host issue times", "`opgraph replay --issue-only`", "SequenceIssue", frozenset({"us_by_key"})),
    KnownFile(
        "replay results",
        "JSON lines from `opgraph replay`",
        "ReplayResult",
        frozenset({"key", "status"}),
        json_lines=True,
    ),
    KnownFile(
        "collective measurements",
        "`opgraph replay --collectives`",
        "CollectiveMeasurement",
        frozenset({"collective", "group_size"}),
        json_lines=True,
    ),
)
"""Every kind, first match wins: those marked by a ``format`` first, then by keys."""


def known_file(record: Mapping[str, object]) -> KnownFile | None:
    """The kind of file whose top-level object (or first JSON-lines record) is ``record``; None when unknown."""
    return next((kind for kind in KNOWN_FILES if kind.matches(record)), None)


def describe_json(value: object) -> str:
    """What a parsed JSON document is, in a few words: a known kind's description, else its type and keys.

    >>> describe_json({"source": {}, "spans": []})
    'a timeline'
    >>> describe_json({"a": 1, "b": 2})
    'a JSON object (keys a, b)'
    >>> describe_json([1, 2])
    'a JSON list'
    """
    if not isinstance(value, Mapping):
        return f"a JSON {type(value).__name__}"
    kind = known_file(value)
    if kind is not None:
        return kind.description
    shown = ", ".join(str(k) for k in list(value)[:5]) + (", ..." if len(value) > 5 else "")
    return f"a JSON object (keys {shown})"
