"""What every step of a scenario run shares: the scenario, where its paths are relative to, the output folder.

:class:`RunContext` resolves the paths a scenario names (relative to its file), turns a library
error into a :class:`ScenarioError` naming the scenario's file and field, and records each
artefact written into the output folder.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from opgraph.ir import OpgraphError
from opgraph.scenario.model import Scenario, ScenarioError


class ScenarioPaths(TypedDict, total=False):
    """Where a scenario came from, as :meth:`RunContext.create` and :class:`~opgraph.scenario.ScenarioRun` take it."""

    path: str | Path | None
    """The scenario file (default: none)."""
    base_dir: str | Path | None
    """The folder the scenario's paths are relative to (default: the file's folder, else the current one)."""


@dataclass
class RunContext:
    """The scenario of a run, its file, the folder its paths are relative to, and the output folder."""

    scenario: Scenario
    path: Path | None
    """The scenario file, when the scenario came from one."""
    base: Path
    """The folder paths in the scenario are relative to."""
    out: Path
    """The folder artefacts are written to (while running: the fresh folder that replaces the output)."""
    artefacts: list[str] = field(default_factory=list)
    """The names of the files written into ``out``, in order."""

    @classmethod
    def create(
        cls,
        scenario: Scenario,
        out_dir: str | Path,
        *,
        path: str | Path | None = None,
        base_dir: str | Path | None = None,
    ) -> RunContext:
        """A context for ``scenario``: paths relative to ``base_dir``, else its file's folder, else the current one."""
        file = Path(path) if path is not None else None
        if base_dir is not None:
            base = Path(base_dir)
        else:
            base = file.resolve().parent if file is not None else Path.cwd()
        return cls(scenario, file, base, Path(out_dir))

    @property
    def file(self) -> str:
        """The scenario's file as errors name it (``scenario`` when it has none)."""
        return str(self.path) if self.path is not None else "scenario"

    def err(self, exc: OpgraphError, field: str) -> ScenarioError:
        """``exc`` as a scenario error naming the file and the field."""
        return ScenarioError(exc.message, where=f"{self.file}: {field}", hint=exc.hint)

    def path_of(self, text: str) -> Path:
        """A path named in the scenario, relative to the scenario file."""
        p = Path(text).expanduser()
        return p if p.is_absolute() else self.base / p

    def maybe_path(self, text: str, suffixes: tuple[str, ...]) -> str:
        """``text`` resolved against the scenario folder when it names a file there (or has a file suffix)."""
        rel = self.path_of(text)
        if rel.exists() or text.endswith(suffixes):
            return str(rel)
        return text  # a preset, catalog name or hub id (``org/name``)

    def code_spec(self, spec: str) -> str:
        """A ``file.py:Class`` spec (a cost model, a policy) with its file relative to the scenario; others as given."""
        head, sep, cls = spec.rpartition(":")
        if sep and head.endswith(".py"):
            return f"{self.path_of(head)}:{cls}"
        return spec

    def cost_spec(self, spec: str) -> str:
        """A cost-model spec with its file (``file.py:Class``, a table ``.json``) relative to the scenario."""
        if spec.endswith((".json", ".json.gz", ".toml")) and not spec.rpartition(":")[0].endswith(".py"):
            return str(self.path_of(spec))
        return self.code_spec(spec)

    def write(self, name: str) -> Path:
        """The path of artefact ``name`` in the output folder, recorded as written."""
        if name not in self.artefacts:
            self.artefacts.append(name)
        return self.out / name
