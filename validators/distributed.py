"""Replay under ``torchrun --nproc-per-node N``: configs sharded over ranks, results gathered on rank 0.

Every rank computes the same ordered config list (most expensive first), drops the ones already
done, and takes every N-th (rank r takes r, r+N, ...), which balances the expensive configs. Each
rank streams its results to its own part file (nothing is lost if a rank dies); at the end rank 0
gathers every rank's results over a gloo group (it works for CPU and CUDA runs alike) and writes
them to the output. Part files left by a crash are folded into the output on the next ``--resume``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from validators.results import ReplayResult

T = TypeVar("T")


@dataclass
class DistContext:
    """This process's place in a torchrun job."""

    rank: int
    world_size: int
    local_rank: int
    group: Any = None
    """A gloo process group for gathering results."""
    owns_init: bool = False
    """This module initialised the default group (and tears it down)."""

    @property
    def is_main(self) -> bool:
        """Rank 0."""
        return self.rank == 0


def env_world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside torchrun."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        return 0, 1, 0
    return rank, max(world, 1), local


def init(device_type: str) -> DistContext | None:
    """Join the torchrun job (``None`` when not under torchrun with more than one process).

    The default group uses NCCL for CUDA runs and gloo otherwise; results travel over a separate
    gloo group either way.
    """
    _, world, local = env_world()
    if world <= 1:
        return None
    import torch.distributed as dist

    owns = False
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" and dist.is_nccl_available() else "gloo"
        if device_type == "cuda":
            import torch

            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
        owns = True
    group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD
    return DistContext(
        rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local, group=group, owns_init=owns
    )


def shard(items: Sequence[T], rank: int, world_size: int) -> list[T]:
    """Rank ``rank``'s share of ``items``: every ``world_size``-th item starting at ``rank``."""
    return list(items[rank::world_size])


def gather_results(ctx: DistContext, results: list[ReplayResult]) -> list[ReplayResult]:
    """Every rank's results on rank 0 (rank order, then each rank's order); ``[]`` on other ranks."""
    import torch.distributed as dist

    payload = [r.model_dump_json() for r in results]
    gathered: list[list[str] | None] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(payload, gathered, dst=0, group=ctx.group)
    if not ctx.is_main or gathered is None:
        return []
    return [ReplayResult.model_validate_json(line) for part in gathered for line in (part or [])]


def barrier(ctx: DistContext) -> None:
    """Wait for every rank (over the gloo group)."""
    import torch.distributed as dist

    dist.barrier(group=ctx.group)


def finish(ctx: DistContext) -> None:
    """Leave the job (destroys the default group if this module created it)."""
    import torch.distributed as dist

    if ctx.owns_init and dist.is_initialized():
        dist.destroy_process_group()


def part_path(out: str | Path, rank: int) -> Path:
    """The part file rank ``rank`` streams to."""
    p = Path(out)
    return p.with_name(f"{p.name}.rank{rank}.part")


def part_files(out: str | Path) -> list[Path]:
    """Part files beside ``out`` (left by this or an interrupted run)."""
    p = Path(out)
    return sorted(p.parent.glob(f"{p.name}.rank*.part"))
