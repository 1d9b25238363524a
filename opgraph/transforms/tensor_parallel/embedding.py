"""Token embedding: vocab-parallel (``vocab / tp`` rows, masked lookup, an all-reduce) or replicated."""

from __future__ import annotations

from opgraph.ir import Embedding, OpBase, TensorSpec
from opgraph.transforms.tensor_parallel.sharder import Sharder, register_handler
from opgraph.transforms.tensor_parallel.tensors import Partial, reshard


@register_handler(Embedding)
def shard_embedding(sh: Sharder, op: Embedding, inputs: list[TensorSpec]) -> OpBase:
    """Vocab-parallel lookup (a partial sum the next reader all-reduces) or a replicated one."""
    if sh.embedding == "replicated":
        return sh.replicated(op, inputs)
    tp = sh.tp
    new_in = sh.all_whole(op, inputs)
    for j, s in enumerate(new_in):
        if s.shape and s.shape[0] == op.vocab and len(s.shape) == 2:
            new_in[j] = reshard(s, 0, tp, ceil=True)
    vocab = -(-op.vocab // tp)
    if op.vocab % tp:
        sh.notes.append(
            f"tensor parallel: the vocabulary of op {op.id} ({op.vocab}) is padded to {vocab * tp} for tp={tp}"
        )
    sh.set_outputs(op.outputs, [Partial(t) for t in op.outputs])
    return sh.rebuild(op, new_in, op.outputs, vocab=vocab)
