"""The recipe contract: turn one op into a ready-to-run :class:`Case` on a device.

A recipe builds synthetic inputs for an op and a function that runs the op the way PyTorch runs
it in the model. The same function, given float64 copies of the inputs on the CPU and
``reference=True``, computes the reference for the numeric check (recipes that cast to float32
internally, as HF's RMSNorm does, cast to float64 instead in reference mode).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, Generic

from typing_extensions import TypeVar

from opgraph.ir import OpBase, TensorSpec

if TYPE_CHECKING:
    import torch


class Compare(str, Enum):
    """Which outputs the numeric check compares."""

    ALL = "all"
    """Every output; integer and boolean outputs must match exactly."""
    FLOAT_ONLY = "float_only"
    """Floating outputs only: indices of top-k, sort and argmax may differ on ties."""
    FIRST = "first"
    """The first output only (fused attention: the rest are softmax statistics)."""
    NONE = "none"
    """Nothing comparable: random ops, uninitialised memory."""


RunFn = Callable[[tuple[Any, ...], bool], Any]
"""``run(inputs, reference) -> outputs``."""


@dataclass
class BuildContext:
    """What a recipe needs besides the op: where to build, a seeded generator, graph assumptions."""

    device: torch.device
    """Device the op runs on."""
    gen: torch.Generator
    """Seeded generator on ``device``."""
    moe_skew: float = 0.0
    """MoE routing skew assumed by the graph (0: balanced)."""


@dataclass
class Case:
    """One op ready to run: its inputs on the device and the function that runs it."""

    inputs: tuple[Any, ...]
    """Tensors and constants passed to ``run``."""
    run: RunFn
    """Runs the op; ``reference=True`` for the float64 reference."""
    compare: Compare = Compare.ALL
    """Which outputs the numeric check compares."""
    note: str = ""
    """Why outputs are not (all) compared, or what the recipe assumed."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Recipe-specific data (kept alive with the case)."""

    def __call__(self) -> Any:
        """Run the op once on the device."""
        return self.run(self.inputs, False)


OpT = TypeVar("OpT", bound=OpBase, default=OpBase)
"""The op class a recipe builds (``Recipe[Gemm]``); ``OpBase`` for recipes of any op."""


class Recipe(ABC, Generic[OpT]):
    """A family of ops replay knows how to run. Subclasses set ``name`` and implement ``build``.

    :func:`~validators.recipes.register_recipe` registers a recipe by name and as the recipe of
    one op class; the selector passes it only ops of that class, so ``build`` and ``unsupported``
    receive the op already typed.
    """

    name: ClassVar[str] = ""
    """Registry name."""

    def unsupported(self, op: OpT) -> str | None:
        """Why this recipe cannot replay ``op`` of its class (``None`` when it can)."""
        return None

    @abstractmethod
    def build(self, op: OpT, ctx: BuildContext) -> Case:
        """Make inputs on ``ctx.device`` and the function that runs ``op``."""


def float_specs(op: OpBase, rank: int | None = None) -> list[TensorSpec]:
    """The op's floating-point input specs (of ``rank`` dims when given), in order."""
    return [t for t in op.inputs if t.dtype.is_float and (rank is None or len(t.shape) == rank)]
