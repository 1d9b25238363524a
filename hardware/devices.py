"""Whether a CUDA device is here: the one check behind capture's and replay's ``--device``.

torch is imported only when the check runs, so importing this module stays cheap.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["CudaProblem", "cuda_problem"]


class CudaProblem(NamedTuple):
    """Why a CUDA device cannot be used here."""

    message: str
    """In words naming the device as the user wrote it."""
    no_cuda: bool
    """No CUDA at all (rather than an index past the visible devices): the hint is another device type."""


def cuda_problem(device: str, index: int | None) -> CudaProblem | None:
    """Why CUDA device ``index`` (``None``: the current one) cannot be used here, naming ``device`` as
    the user wrote it; ``None`` when it can.

    Without CUDA: ``"cannot use cuda:1: no CUDA GPU is visible (torch CUDA 13.0)"`` (or a torch built
    without CUDA); an index at or past the visible count: ``"cuda:2 does not exist: 2 CUDA devices
    visible (cuda:0, cuda:1)"``.
    """
    import torch

    if not torch.cuda.is_available():
        built = torch.version.cuda
        why = "this torch is built without CUDA" if not built else f"no CUDA GPU is visible (torch CUDA {built})"
        return CudaProblem(f"cannot use {device}: {why}", no_cuda=True)
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        visible = ", ".join(f"cuda:{i}" for i in range(count))
        return CudaProblem(
            f"{device} does not exist: {count} CUDA device{'s' if count != 1 else ''} visible ({visible})",
            no_cuda=False,
        )
    return None
