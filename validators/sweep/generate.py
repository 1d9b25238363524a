"""Write a pytest module that sweeps the configs of one op from a catalog (jinja2 template)."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

from opgraph.catalog import Catalog, load_catalog
from opgraph.ir import atomic_write
from validators.sweep.loader import DEFAULT_MAX_CASES, SweepCase, SweepError, SweepLoader

TEMPLATE = "sweep_module.py.j2"
"""Template file in ``validators/sweep/templates``."""

DEVICE_RE = re.compile(r"cpu|cuda(?::\d+)?")
"""Replay devices a sweep module may default to: ``cpu``, ``cuda`` or ``cuda:N`` (checked by spelling
only: the module usually runs on another machine)."""


def _test_name(op: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", op).strip("_").lower() or "op"
    return f"test_{name}_model_traced"


def _catalog_expr(catalog_path: Path, out: Path) -> str:
    cat = catalog_path.resolve()
    try:
        rel = os.path.relpath(cat, out.resolve().parent)
    except ValueError:  # another drive on Windows
        return f"Path({str(cat)!r})"
    return f"Path(__file__).resolve().parent / {Path(rel).as_posix()!r}"


def render_sweep_module(
    catalog_path: str | Path,
    op: str,
    out: str | Path,
    *,
    all_cases: bool = False,
    model: str | None = None,
    phase: str | None = None,
    limit: int | None = None,
    device: str = "cpu",
    embed: bool = False,
    max_cases: int = DEFAULT_MAX_CASES,
    catalog: Catalog | None = None,
) -> tuple[str, list[SweepCase]]:
    """The source of a sweep module for ``op`` and the cases it will run (checked now, not at test time).

    Without ``embed`` the module reads the catalog (by a path relative to itself) when pytest
    collects it, so it follows the catalog; with ``embed`` the cases are written into the module.
    ``device`` is the module's default replay device: ``cpu``, ``cuda`` or ``cuda:N``
    (:data:`DEVICE_RE`); any other is a :class:`SweepError`.
    """
    import jinja2

    if not DEVICE_RE.fullmatch(device):
        raise SweepError(f"unknown device {device!r}", where="--device", hint="use cpu, cuda or cuda:N")
    catalog_path, out = Path(catalog_path), Path(out)
    loader = SweepLoader(catalog if catalog is not None else load_catalog(catalog_path))
    cases = loader.cases(op, all_cases=all_cases, model=model, phase=phase, limit=limit, max_cases=max_cases)
    if not cases:
        raise SweepError(f"no cases of {op!r} in {catalog_path}", hint="check the op name with `opgraph ops`")
    argv = ["opgraph", "sweep", str(catalog_path), "--op", op, "-o", str(out)]
    argv += ["--all-cases"] if all_cases else []
    argv += ["--model", model] if model else []
    argv += ["--phase", phase] if phase else []
    argv += ["--limit", str(limit)] if limit is not None else []
    argv += ["--device", device] if device != "cpu" else []
    argv += ["--embed"] if embed else []
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("validators.sweep", "templates"),
        autoescape=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    cases_json = json.dumps([c.to_json() for c in cases], separators=(",", ":"))
    text = env.get_template(TEMPLATE).render(
        op=op,
        n_cases=len(cases),
        all_cases=all_cases,
        models=sorted({m for c in cases for m in c.models}),
        catalog_label=catalog_path.name,
        command=shlex.join(argv),
        device=device,
        embed=embed,
        cases_json=repr(cases_json),
        catalog_expr=_catalog_expr(catalog_path, out),
        model=model,
        phase=phase,
        limit=limit,
        test_name=_test_name(op),
    )
    return text, cases


def write_sweep_module(catalog_path: str | Path, op: str, out: str | Path, **kwargs: object) -> list[SweepCase]:
    """Render (see :func:`render_sweep_module`) and write the module atomically; returns its cases."""
    out = Path(out)
    if out.suffix != ".py":
        raise SweepError("the output must be a .py file", where=str(out), hint="name it test_<op>_traced.py")
    text, cases = render_sweep_module(catalog_path, op, out, **kwargs)  # type: ignore[arg-type]
    with atomic_write(out) as f:
        f.write(text.encode())
    return cases
