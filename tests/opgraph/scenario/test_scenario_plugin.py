"""The pytest plugin: ``*.scenario.toml`` files collected as tests, one item per expectation."""

from __future__ import annotations

import shutil
from importlib.metadata import entry_points
from pathlib import Path

import numpy  # noqa: F401
import pytest

# Inline pytester runs drop the modules they import afterwards; numpy cannot be imported twice in one
# process, so everything a scenario run needs is imported here, before any inline run.
import hardware  # noqa: F401
import opgraph.compare
import opgraph.export
import opgraph.scenario.runner  # noqa: F401
import simulators  # noqa: F401
import validators.coverage  # noqa: F401

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "tests" / "data" / "h100"
GRAPH = "llama-3.2-1b-l2-prefill256.graph.json.gz"
MEASURED = "llama-3.2-1b-l2-prefill256.h100.timeline.json.gz"
MODULE = "opgraph.scenario.pytest_plugin"


def plugin_args() -> list[str]:
    """``-p`` the plugin unless the installed entry point already loads it (pluggy refuses a second copy)."""
    if any(ep.value == MODULE for ep in entry_points(group="pytest11")):
        return []
    return ["-p", MODULE]


def scenario(pytester: pytest.Pytester, name: str, expect: str) -> None:
    shutil.copy(DATA / GRAPH, pytester.path / GRAPH)
    shutil.copy(DATA / MEASURED, pytester.path / MEASURED)
    # The roofline, named: these tests are about how the plugin reports expectations (one passing, one
    # failing), not about the default cost model, whose measured profiles meet the wall-time bound here.
    (pytester.path / f"{name}.scenario.toml").write_text(
        '[hardware]\ncost_model = "roofline"\n'
        f'[simulation]\nengines = [1, 2]\n[[phases]]\nname = "p"\ngraph = "{GRAPH}"\nmeasured = "{MEASURED}"\n'
        f"[expect]\n{expect}\n"
    )


def test_each_expectation_is_an_item(pytester: pytest.Pytester) -> None:
    scenario(
        pytester,
        "study",
        'operators = "llama"\nmakespan_us = { max = 10 }\nmax_error = { gpu_time = 0.5, wall_time = 0.1 }',
    )
    result = pytester.runpytest(*plugin_args(), str(pytester.path), "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*study.scenario.toml::p/operators PASSED*",
            "*study.scenario.toml::p/makespan_us FAILED*",
            "*study.scenario.toml::p/max_error.gpu_time PASSED*",
            "*study.scenario.toml::p/max_error.wall_time FAILED*",
        ]
    )
    # A failure shows its expectation, then every failure of the scenario.
    result.stdout.fnmatch_lines(
        [
            "p/makespan_us: makespan * is not <= 10 us",
            "*study.scenario.toml: 2 of 4 expectation(s) failed:",
            "  - p makespan_us: *",
            "  - p max_error.wall_time: *",
            "rerun with --scenario-out DIR*",
        ]
    )
    assert "Traceback" not in result.stdout.str()


def test_scenario_without_expectations_is_one_item(pytester: pytest.Pytester) -> None:
    scenario(pytester, "plain", "")
    result = pytester.runpytest(*plugin_args(), str(pytester.path), "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*plain.scenario.toml::run PASSED*"])


def test_scenario_out_keeps_artefacts(pytester: pytest.Pytester) -> None:
    scenario(pytester, "kept", "speedup = { min = 0.1 }")
    out = pytester.path / "artefacts"
    result = pytester.runpytest(
        *plugin_args(), str(pytester.path), "--scenario-out", str(out), "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=1)
    assert (out / "kept" / "summary.json").is_file() and (out / "kept" / "report.html").is_file()


def test_bad_scenario_is_a_one_line_collection_error(pytester: pytest.Pytester) -> None:
    (pytester.path / "bad.scenario.toml").write_text('[[phases]]\ngraph = "g.json"\nengines = 2\n')
    result = pytester.runpytest(*plugin_args(), str(pytester.path), "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["error: *bad.scenario.toml: phases[[]0[]].engines: unknown field*"])


def test_run_time_error_fails_every_item(pytester: pytest.Pytester) -> None:
    scenario(pytester, "hw", "speedup = { min = 0.1 }\nmakespan_us = { max = 1e9 }")
    path = pytester.path / "hw.scenario.toml"
    path.write_text(path.read_text().replace("[hardware]\n", '[hardware]\nname = "h900"\n'))
    result = pytester.runpytest(*plugin_args(), str(pytester.path), "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["scenario could not run: *hw.scenario.toml: hardware.name: *h900*"])


def test_other_toml_files_are_not_collected(pytester: pytest.Pytester) -> None:
    (pytester.path / "pyproject-like.toml").write_text("[x]\n")
    result = pytester.runpytest(*plugin_args(), str(pytester.path), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED


def test_found_scenarios_are_not_run_unless_asked(pytester: pytest.Pytester) -> None:
    # A scenario file is code (``file.py:Class``): a plain ``pytest`` must not run one it happens to find.
    (pytester.path / "evil.py").write_text(
        "from pathlib import Path\nPath(__file__).with_name('ran.txt').write_text('ran')\nclass Model: ...\n"
    )
    scenario(pytester, "found", "speedup = { min = 0.1 }")
    path = pytester.path / "found.scenario.toml"
    path.write_text(path.read_text() + '[hardware]\ncost_model = "evil.py:Model"\n')
    result = pytester.runpytest(*plugin_args(), "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert not (pytester.path / "ran.txt").exists()


def test_only_scenarios_under_given_paths_are_collected(pytester: pytest.Pytester) -> None:
    for folder in ("trusted", "elsewhere"):
        (pytester.path / folder).mkdir()
        (pytester.path / folder / f"{folder}.scenario.toml").write_text('[[phases]]\ngraph = "missing.json"\n')
    result = pytester.runpytest(*plugin_args(), "trusted", "--collect-only", "-q", "-p", "no:cacheprovider")
    text = result.stdout.str()
    assert "trusted.scenario.toml" in text and "elsewhere.scenario.toml" not in text


@pytest.mark.parametrize("opt_in", ["flag", "ini"])
def test_opt_in_collects_every_scenario(pytester: pytest.Pytester, opt_in: str) -> None:
    scenario(pytester, "opted", "speedup = { min = 0.1 }")
    args = ["--opgraph-scenarios"] if opt_in == "flag" else []
    if opt_in == "ini":
        pytester.makeini("[pytest]\nopgraph_scenarios = true\n")
    result = pytester.runpytest(*plugin_args(), *args, "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
