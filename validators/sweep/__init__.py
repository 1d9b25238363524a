"""Sweeps over traced configs: catalog configs as pytest parametrisations, and generated test modules.

>>> # in a test module
>>> # @pytest.mark.parametrize("op", sweep_params("catalog.json", "gemm"))
>>> # def test_gemm(op): check_replay(replay_op(op, device="cpu"))
"""

from validators.sweep.check import PASSING, SKIPPING, check_replay, status_of
from validators.sweep.generate import render_sweep_module, write_sweep_module
from validators.sweep.loader import (
    DEFAULT_MAX_CASES,
    SweepCase,
    SweepError,
    SweepLoader,
    case_id,
    params_from_json,
    sweep_params,
    to_params,
)

__all__ = [
    "DEFAULT_MAX_CASES",
    "PASSING",
    "SKIPPING",
    "SweepCase",
    "SweepError",
    "SweepLoader",
    "case_id",
    "check_replay",
    "params_from_json",
    "render_sweep_module",
    "status_of",
    "sweep_params",
    "to_params",
    "write_sweep_module",
]
