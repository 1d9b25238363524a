"""A pytest plugin that collects ``*.scenario.toml`` files as tests: one item per expectation.

Enable it with ``-p opgraph.scenario.pytest_plugin`` (or the ``opgraph_scenarios`` entry point in
the ``pytest11`` group, which loads it automatically). Each scenario runs once, when its first item
runs; every item then reports one expectation (``default.scenario.toml::prefill/makespan_us``). A
failing item shows its expectation and the list of every failure of the scenario. A scenario with
no expectations is one item that passes when the run succeeds. Bad input (bad TOML, an unknown
field or model) is a collection error of one line.

A scenario file is code: it may name ``file.py:Class`` for a cost model or a policy, which the run
imports and executes. So the plugin collects a ``*.scenario.toml`` only when the user asked for
it: the file is under a path given on pytest's command line (``pytest studies/``), or scenario
collection is switched on with ``--opgraph-scenarios`` or the ini option ``opgraph_scenarios =
true``. A plain ``pytest`` (arguments from ``testpaths`` or the current folder) ignores scenario
files found on its way.

Options: ``--scenario-out DIR`` keeps each scenario's artefacts (trace, report) in ``DIR/<name>``;
without it they go to a temporary folder, without the trace and report, removed at the end.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from opgraph.ir import OpgraphError
from opgraph.scenario.model import SCENARIO_SUFFIX, Scenario, load_scenario, scenario_name
from opgraph.scenario.result import ExpectationResult, ScenarioSummary
from opgraph.scenario.runner import ScenarioRun, failure_lines, planned_checks

if TYPE_CHECKING:
    from _pytest._code.code import TerminalRepr


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--scenario-out``, ``--opgraph-scenarios`` and the ini option ``opgraph_scenarios``."""
    group = parser.getgroup("opgraph", "opgraph scenarios")
    group.addoption(
        "--opgraph-scenarios",
        action="store_true",
        default=False,
        help="Collect every *.scenario.toml found (scenario files can run code: only for files you trust). "
        "Without it, only scenario files under paths given on the command line are collected.",
    )
    parser.addini(
        "opgraph_scenarios",
        type="bool",
        default=False,
        help="Collect every *.scenario.toml found, as --opgraph-scenarios does.",
    )
    group.addoption(
        "--scenario-out",
        action="store",
        default=None,
        metavar="DIR",
        help="Keep each *.scenario.toml run's artefacts (graphs, timelines, trace, report) in DIR/<name>.",
    )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> ScenarioFile | None:
    """Collect ``*.scenario.toml`` files the user asked for (see :func:`scenario_collection_allowed`)."""
    if file_path.name.endswith(SCENARIO_SUFFIX) and scenario_collection_allowed(parent.config, file_path):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


def scenario_collection_allowed(config: pytest.Config, file_path: Path) -> bool:
    """Whether ``file_path`` may be collected: opted in, or under a path given on the command line.

    Paths pytest chose by itself (``testpaths``, the current folder) do not count: a scenario file
    can run code, so finding one is not a reason to run it.
    """
    if config.getoption("opgraph_scenarios") or config.getini("opgraph_scenarios"):
        return True
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        return False
    target = file_path.resolve()
    for arg in config.args:
        given = Path(config.invocation_params.dir, arg.split("::", 1)[0]).resolve()
        if target == given or given in target.parents:
            return True
    return False


class ScenarioRunError(Exception):
    """The scenario could not run (bad input found while running); the message is one line."""


class ExpectationFailed(Exception):
    """An expectation of the scenario does not hold."""

    def __init__(self, result: ExpectationResult | None, summary: ScenarioSummary, where: str) -> None:
        self.result = result
        self.summary = summary
        self.where = where
        super().__init__(result.message if result is not None else "expectations failed")


class ScenarioFile(pytest.File):
    """A scenario file: runs once, yields one item per expectation."""

    _summary: ScenarioSummary | None = None
    _error: str | None = None
    _scenario: Scenario | None = None

    def collect(self) -> Iterator[ScenarioItem]:
        """One item per planned expectation (or one ``run`` item when there are none)."""
        self._scenario = load_scenario(self.path)
        checks = planned_checks(self._scenario)
        for check in checks or ["run"]:
            yield ScenarioItem.from_parent(self, name=check, check=None if check == "run" else check)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> str | TerminalRepr:  # type: ignore[override]
        """Bad input is one line, not a traceback."""
        if isinstance(excinfo.value, OpgraphError):
            return f"error: {excinfo.value.one_line()}"
        return super().repr_failure(excinfo)

    def out_dir(self) -> tuple[Path, bool]:
        """The output folder and whether to keep it (``--scenario-out``)."""
        assert self._scenario is not None
        name = scenario_name(self._scenario, self.path)
        root = self.config.getoption("scenario_out")
        if root:
            return Path(root) / name, True
        tmp = Path(tempfile.mkdtemp(prefix=f"opgraph-scenario-{name}-"))
        self.config.add_cleanup(lambda: shutil.rmtree(tmp, ignore_errors=True))
        return tmp, False

    def summary(self) -> ScenarioSummary:
        """Run the scenario once; later calls return the same summary (or raise the same error)."""
        if self._error is not None:
            raise ScenarioRunError(self._error)
        if self._summary is None:
            assert self._scenario is not None
            out, keep = self.out_dir()
            try:
                self._summary = ScenarioRun(self._scenario, out, path=self.path, reports=keep).run()
            except OpgraphError as exc:
                self._error = exc.one_line()
                raise ScenarioRunError(self._error) from None
            self._out = out if keep else None
        return self._summary


class ScenarioItem(pytest.Item):
    """One expectation of a scenario (or the whole run when it declares none)."""

    def __init__(self, *, check: str | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check

    @property
    def scenario_file(self) -> ScenarioFile:
        """The collector this item belongs to."""
        parent = self.parent
        assert isinstance(parent, ScenarioFile)
        return parent

    def runtest(self) -> None:
        """Fail when the expectation does not hold."""
        summary = self.scenario_file.summary()
        where = str(self.path)
        if self.check is None:
            if not summary.passed:
                raise ExpectationFailed(None, summary, where)
            return
        found = [e for e in summary.expectations if e.id == self.check]
        if not found:
            raise ScenarioRunError(f"expectation {self.check} was not evaluated")
        if not found[0].passed:
            raise ExpectationFailed(found[0], summary, where)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException]) -> str | TerminalRepr:  # type: ignore[override]
        """The failed expectation and every failure of the scenario, without a traceback."""
        exc = excinfo.value
        if isinstance(exc, ScenarioRunError):
            return f"scenario could not run: {exc}"
        if isinstance(exc, ExpectationFailed):
            lines = []
            if exc.result is not None:
                lines.append(f"{exc.result.id}: {exc.result.message}")
                lines.append("")
            failed = failure_lines(exc.summary)
            lines.append(f"{exc.where}: {len(failed)} of {len(exc.summary.expectations)} expectation(s) failed:")
            lines += [f"  - {line}" for line in failed]
            out = getattr(self.scenario_file, "_out", None)
            lines.append(
                f"artefacts: {out}" if out else "rerun with --scenario-out DIR to keep the trace, report and summary"
            )
            return "\n".join(lines)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Where the item comes from, for pytest's report."""
        return self.path, None, f"scenario {self.path.name}: {self.name}"
