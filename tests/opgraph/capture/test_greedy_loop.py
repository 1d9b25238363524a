"""The capture's generate loop issues, between two forward passes, the aten calls that transformers'
own greedy ``generate`` issues there (checked on the CPU against the installed transformers)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from opgraph.capture import GreedyLoop

VOCAB = 97


class _Calls(TorchDispatchMode):
    """Every aten call, with a marker at each forward pass of ``model``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.depth = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.depth == 0:
            self.calls.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def _tiny(eos: int | None) -> Any:
    config = transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=VOCAB,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def _hf_between_forwards(model: Any, prompt: torch.Tensor, new: int) -> list[list[str]]:
    """The aten calls ``generate`` makes between consecutive forward passes."""
    mode = _Calls()

    def pre(*_: Any) -> None:
        mode.calls.append("<forward>")
        mode.depth += 1

    def post(*_: Any) -> None:
        mode.depth -= 1

    hooks = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
    try:
        with torch.no_grad(), mode:
            model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False)
    finally:
        for h in hooks:
            h.remove()
    segments: list[list[str]] = []
    for call in mode.calls:
        if call == "<forward>":
            segments.append([])
        elif segments:
            segments[-1].append(call)
    return segments[:-1]  # after the last forward pass: the loop's exit, which no later pass follows


def _ours(model: Any, prompt: torch.Tensor, new: int) -> list[list[str]]:
    loop = GreedyLoop(prompt, model.config, prompt.shape[1] + new)
    segments = []
    for _ in range(new - 1):
        logits = torch.randn(prompt.shape[0], 1, VOCAB)
        mode = _Calls()
        with torch.no_grad(), mode:
            loop.step(logits)
        segments.append(mode.calls)
    return segments


@pytest.mark.parametrize("eos", [2, None], ids=["eos", "no-eos"])
def test_greedy_loop_issues_what_generate_issues(eos: int | None) -> None:
    model = _tiny(eos)
    prompt = torch.randint(3, VOCAB, (3, 5), generator=torch.Generator().manual_seed(1))
    hf = _hf_between_forwards(model, prompt, 4)
    ours = _ours(model, prompt, 4)
    assert len(hf) == 3
    assert ours == hf
    assert ("isin" in ours[0]) is (eos is not None)
    assert "_local_scalar_dense" in ours[0]  # the stop flag the host reads every step


def test_greedy_loop_appends_the_argmax_token_and_stops_rows_at_eos() -> None:
    model = _tiny(eos=2)
    prompt = torch.tensor([[5, 6], [7, 8]])
    loop = GreedyLoop(prompt, model.config, max_length=10)
    logits = torch.full((2, 1, VOCAB), -1.0)
    logits[0, 0, 2] = 1.0  # row 0 picks EOS
    logits[1, 0, 9] = 1.0
    assert loop.step(logits).tolist() == [[2], [9]]
    assert loop.unfinished.tolist() == [0, 1]
    logits = torch.full((2, 1, VOCAB), -1.0)
    logits[:, 0, 11] = 1.0
    assert loop.step(logits).tolist() == [[2], [11]]  # a finished row gets the pad token (EOS here)
    assert loop.input_ids.tolist() == [[5, 6, 2, 2], [7, 8, 9, 11]]
    assert loop.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
