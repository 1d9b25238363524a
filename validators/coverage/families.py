"""Coverage expectations: which operators a model family must (and may) contain, kept as TOML data.

``expectations/operators.toml`` defines the operators (which ops of a graph count as each);
``expectations/<family>.toml`` lists a family's required and optional operators, the architectures
and model names it applies to, and may add operators of its own. A user's file is passed by path.
"""

from __future__ import annotations

import tomllib
from fnmatch import fnmatchcase
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from opgraph.ir import OpBase, OpGraph, OpgraphError
from opgraph.ir.tensor import FrozenModel


class ExpectationError(OpgraphError):
    """An expectation file is missing, malformed, or none fits the graph."""


class MatchClause(FrozenModel):
    """Conditions that must all hold for an op to count as an operator."""

    kind: str | None = None
    """IR kind (``gemm``, ``attention``)."""
    definition: str | None = None
    """Glob on the op's definition name."""
    target: str | None = None
    """Glob on the aten overload or module the op came from."""
    fn: str | None = None
    """Glob on the op's ``fn`` field (activations, elementwise, memory ops)."""
    fields: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """Exact values of the op's own fields (``{variant = "mla"}``)."""

    def matches(self, op: OpBase) -> bool:
        """True when ``op`` satisfies every condition."""
        if self.kind is not None and op.kind.value != self.kind:
            return False
        if self.definition is not None and not fnmatchcase(op.definition, self.definition):
            return False
        if self.target is not None and not fnmatchcase(op.target, self.target):
            return False
        values = op.__dict__
        if self.fn is not None and not fnmatchcase(str(values.get("fn", "")), self.fn):
            return False
        for name, want in self.fields.items():
            have = values.get(name)
            have = getattr(have, "value", have)
            if have != want:
                return False
        return True


class OperatorSpec(FrozenModel):
    """An operator of the coverage report and the ops that count as it."""

    description: str = ""
    """What it is, for the verbose report."""
    match: tuple[MatchClause, ...]
    """Any one clause counts an op."""

    def matches(self, op: OpBase) -> bool:
        """True when any clause matches ``op``."""
        return any(c.matches(op) for c in self.match)


class Expectation(FrozenModel):
    """The operators a model family must contain (required) and may contain (optional)."""

    family: str
    """Family name (``llama``)."""
    description: str = ""
    """Which models it covers."""
    architectures: tuple[str, ...] = ()
    """transformers architecture classes that pick this family under ``--expect auto``."""
    models: tuple[str, ...] = ()
    """Globs on model names (case-insensitive) that pick it when the architecture does not."""
    required: tuple[str, ...]
    """Operators the graph must contain; a missing one fails verification."""
    optional: tuple[str, ...] = ()
    """Operators reported when present, never a failure."""
    operators: dict[str, OperatorSpec] = Field(default_factory=dict)
    """Operator definitions: the shared ``operators.toml`` overlaid with the family's own."""
    source: str = ""
    """File it was read from."""

    @model_validator(mode="after")
    def _check(self) -> Expectation:
        both = set(self.required) & set(self.optional)
        if both:
            raise ValueError(f"operators both required and optional: {', '.join(sorted(both))}")
        unknown = [o for o in (*self.required, *self.optional) if o not in self.operators]
        if unknown:
            raise ValueError(
                f"unknown operator(s) {', '.join(unknown)}; define them under [operators.NAME] "
                f"or use one of: {', '.join(sorted(self.operators))}"
            )
        return self


def _builtin_dir() -> Path:
    return Path(str(resources.files("validators.coverage") / "expectations"))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ExpectationError("no such file", where=str(path)) from None
    except IsADirectoryError:
        raise ExpectationError("is a folder, not a TOML file", where=str(path)) from None
    except UnicodeDecodeError:
        raise ExpectationError(
            "not a text file (TOML is UTF-8 text)", where=str(path), hint="give an expectations .toml file"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationError(f"not valid TOML: {exc}", where=str(path)) from None


def _operators(raw: dict[str, Any], where: str) -> dict[str, OperatorSpec]:
    try:
        return {name: OperatorSpec.model_validate(spec) for name, spec in raw.items()}
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise ExpectationError(f"bad operator definition at {loc}: {first['msg']}", where=where) from None


@cache
def builtin_operators() -> dict[str, OperatorSpec]:
    """The shared operator definitions of ``operators.toml``."""
    path = _builtin_dir() / "operators.toml"
    return _operators(_read_toml(path), str(path))


def available_families() -> list[str]:
    """Names of the built-in families (the ``--expect`` values besides ``auto`` and paths)."""
    return sorted(p.stem for p in _builtin_dir().glob("*.toml") if p.stem != "operators")


def load_expectation_file(path: str | Path) -> Expectation:
    """An expectation from a TOML file (built-in or a user's), its operators overlaid on the shared ones."""
    path = Path(path)
    raw = _read_toml(path)
    ops = dict(builtin_operators())
    ops.update(_operators(raw.pop("operators", {}), str(path)))
    raw.setdefault("family", path.stem)
    try:
        return Expectation.model_validate({**raw, "operators": ops, "source": str(path)})
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
        raise ExpectationError(f"{loc}: {first['msg']}", where=str(path)) from None


def load_expectation(name: str) -> Expectation:
    """A built-in family by name (``llama``) or a TOML file by path."""
    path = _builtin_dir() / f"{name}.toml"
    if name != "operators" and "/" not in name and path.is_file():
        return load_expectation_file(path)
    if name.endswith(".toml") or Path(name).exists():
        return load_expectation_file(name)
    raise ExpectationError(
        f"unknown model family {name!r}",
        where="--expect",
        hint=f"use auto, a .toml file, or one of: {', '.join(available_families())}",
    )


def auto_expectation(graph: OpGraph) -> Expectation:
    """The family whose architectures include the graph's; else whose model glob fits its name best.

    Among model-name matches the longest (most specific) pattern wins, so ``qwen3-30b-a3b`` picks
    ``qwen-moe`` over ``qwen``. Raises :class:`ExpectationError` when no family fits.
    """
    md = graph.metadata
    families = [load_expectation(f) for f in available_families()]
    if md.architecture:
        for e in families:
            if md.architecture in e.architectures:
                return e
    name = md.model.lower()
    best: tuple[int, Expectation] | None = None
    if name:
        for e in families:
            for pattern in e.models:
                if fnmatchcase(name, pattern.lower()) and (best is None or len(pattern) > best[0]):
                    best = (len(pattern), e)
    if best is not None:
        return best[1]
    raise ExpectationError(
        f"no model family fits model {md.model or '?'!r} (architecture {md.architecture or '?'!r})",
        where="--expect auto",
        hint=f"pass --expect with one of: {', '.join(available_families())}, or a .toml file",
    )
