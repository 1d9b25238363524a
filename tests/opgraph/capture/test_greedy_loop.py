"""The capture's generate loop issues, between two forward passes, the aten calls that transformers'
own greedy ``generate`` issues there (checked on the CPU against the installed transformers)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import transformers
from packaging.version import Version
from torch.utils._python_dispatch import TorchDispatchMode

from opgraph.capture import GreedyLoop
from opgraph.capture.api import CaptureOptions, prepare
from opgraph.capture.phase import generate_keeps_all_ones_mask, run_phase
from opgraph.capture.recorder import Recorder

KEEPS_MASK = Version(transformers.__version__) < Version("5.18")
"""transformers before 5.18 keeps an all-ones attention mask through generate's loop; later ones drop it."""

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
    # Which branch ran: the mask grown every step (new_ones + cat) only where generate keeps it.
    assert ("new_ones" in ours[0]) is KEEPS_MASK


def test_the_loop_holds_a_mask_iff_the_installed_generate_keeps_it() -> None:
    assert generate_keeps_all_ones_mask() is KEEPS_MASK
    loop = GreedyLoop(torch.tensor([[5, 6], [7, 8]]), _tiny(eos=2).config, max_length=10)
    assert (loop.attention_mask is not None) is KEEPS_MASK
    loop.step(torch.zeros(2, 1, VOCAB))
    if KEEPS_MASK:
        assert loop.attention_mask.dtype == torch.long and loop.attention_mask.tolist() == [[1, 1, 1]] * 2
    else:
        assert loop.attention_mask is None


def test_captured_forward_passes_get_the_mask_iff_generate_passes_it(tiny_config: str) -> None:
    opts = CaptureOptions(phase="generate", seq_len=5, new_tokens=3, batch=2)
    prepared = prepare(tiny_config, opts)
    masks: list[tuple[int, ...] | None] = []

    def pre(_: Any, args: Any, kwargs: dict[str, Any]) -> None:
        mask = kwargs.get("attention_mask")
        masks.append(None if mask is None else tuple(mask.shape))

    rec = Recorder()
    rec.add_root(prepared.model)
    hook = prepared.model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        run_phase(prepared, opts, rec)
    finally:
        hook.remove()
    assert masks == ([(2, 5 + step) for step in range(4)] if KEEPS_MASK else [None] * 4)


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
