"""Graph transforms: rewrite an :class:`~opgraph.ir.OpGraph` into another (tensor-parallel sharding, rebatching).

The public names are those of the two transform facades, :mod:`.tensor_parallel` and :mod:`.rebatch`:
each keeps its own ``__all__``, and this package re-exports their union (one list of names, not two).
"""

import opgraph.transforms.rebatch as _rebatch
import opgraph.transforms.tensor_parallel as _tensor_parallel
from opgraph.transforms.rebatch import *  # noqa: F403  (the names in rebatch.__all__)
from opgraph.transforms.tensor_parallel import *  # noqa: F403  (the names in tensor_parallel.__all__)

__all__ = [*_tensor_parallel.__all__, *_rebatch.__all__]
