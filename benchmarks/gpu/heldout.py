"""Held-out accuracy cases (issue 18, "Prove it"): measure models no profile or table has seen.

Run on a GPU machine from the repo root (``benchmarks/gpu/heldout_h100.sh`` wraps it)::

    python3 benchmarks/gpu/heldout.py --out $OUT/heldout --budget-s 400

Each case is an unmodified Hugging Face model (eager modules, SDPA attention, random weights, MoE
blocks with their own routing: opgraph's balanced-router patch is *not* installed) built from one
of opgraph's preset configs cut to a few layers. Per case:

1. build the model on the device (seeded random weights; with ``--weights-on cpu`` drawn on the CPU and
   moved, so that ``opgraph capture CONFIG --device cpu --seed 0`` builds the same weights and routes
   its MoE tokens as the measured model does: ``benchmarks/heldout_routing.py``), two warm-up runs;
2. ``--runs`` (>= 9) plain runs, each CUDA-synchronised before and after: the wall time per run
   (median and spread are reported);
3. the same number of runs under ``torch.profiler`` (CPU + CUDA), each run one profiler range:
   the GPU time per run is the *sum of the durations* of the device activities it launched
   (kernels, memcpy, memset), the definition of the ``gpu_time`` row of ``opgraph compare``
   (``Timeline.device_spans``); the union of their intervals (``busy_us``) is kept beside it.
   The trace of ONE run (the one with the median GPU time) is kept, trimmed to that run
   (``<case>.trace.json.gz``), for per-op errors computed on the CPU later; in the profiled runs every
   module call is a profiler range named by its module path, so the report can line the trace's
   aten calls up with a meta recording module by module;
4. PyTorch's ``RuntimeEstimator`` on the same phase (as ``benchmarks/gpu/accuracy.py`` computes it:
   roofline mode, FakeTensorMode, eager attention), a side-by-side baseline that needs the device.

``--settle-s S`` first runs each case's forward back to back for S seconds, so that it is timed in the
sustained power state a model of full depth runs in (the profile's sweep measures its points there);
without it, the two warm-ups leave a cut model's short forward in the power controller's transient from
idle, up to about 10% faster for GEMM-heavy prefills (``sustained_prefill.py``).

Prefill runs the prompt into an empty ``DynamicCache``; decode fills a ``DynamicCache`` with a
prefill of ``kv_len`` tokens outside the timed region (a fresh copy per run) and times one decode
forward. Token ids are seeded random, as in ``opgraph capture --device cuda``.

Writes ``<case>.json``, ``<case>.config.json`` (the exact config, which ``opgraph capture`` takes)
and ``<case>.trace.json.gz`` per case, and ``summary.json`` (rewritten after every case, so a run cut
short keeps what it measured). Cases run most-diverse first; a case whose estimate does not fit in
what is left of ``--budget-s`` is skipped with a note.

``--round-robin ROUNDS`` measures walls only, in rounds: every case's model is built first, then each
round starts with a host probe and times every case (:func:`round_robin_walls`; ``--train-walls`` adds
the host profile's training walls as a second group). The host of a shared GPU machine alternates
between speeds within seconds, so walls measured one case after another compare host states, not cases;
``benchmarks/heldout_pool.py --walls`` keeps the rounds whose probe ran near its fastest. Writes
``walls.json`` (rewritten after every round) beside the configs and ``summary.json``.

``--device cpu --tiny`` runs tiny configs on the CPU to test the pipeline without a GPU: there is no
device there, so every leaf aten op of the CPU trace stands in for a kernel (marked ``fake_device``
in the outputs). That data is for tests only.
"""

from __future__ import annotations

import argparse
import copy
import gc
import gzip
import inspect
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "opgraph" / "capture" / "presets"
CONFIGS = Path(__file__).resolve().parent / "configs"
"""Local ``config.json`` files (a user's own config, as ``opgraph capture CONFIG`` takes one) of families no
preset ships; a case's ``preset`` names one of them when no preset has that name."""

RUN_RANGE = "heldout_run_"
"""Profiler range around each profiled run (``heldout_run_<i>``)."""

# Most diverse first: families, phases, dtypes and batch sizes alternate, so a run cut short by the
# budget still covers them. ``est_s`` is a rough H100 estimate of the case's seconds (build + runs).
CASES: list[dict[str, Any]] = [
    {"case": "llama8b_prefill_b1_s4096_bf16_l4", "preset": "llama-3.1-8b", "phase": "prefill", "batch": 1,
     "seq_len": 4096, "dtype": "bf16", "layers": 4, "est_s": 20},
    {"case": "qwen3moe_decode_b8_kv1024_bf16_l2", "preset": "qwen3-30b-a3b", "phase": "decode", "batch": 8,
     "kv_len": 1024, "dtype": "bf16", "layers": 2, "est_s": 25},
    {"case": "mixtral_prefill_b1_s2048_bf16_l2", "preset": "mixtral-8x7b", "phase": "prefill", "batch": 1,
     "seq_len": 2048, "dtype": "bf16", "layers": 2, "est_s": 25},
    {"case": "llama1b_decode_b1_kv512_fp16_l4", "preset": "llama-3.2-1b", "phase": "decode", "batch": 1,
     "kv_len": 512, "dtype": "fp16", "layers": 4, "est_s": 15},
    {"case": "qwen25_7b_prefill_b4_s512_fp16_l4", "preset": "qwen2.5-7b", "phase": "prefill", "batch": 4,
     "seq_len": 512, "dtype": "fp16", "layers": 4, "est_s": 20},
    {"case": "llama70b_decode_b8_kv4096_bf16_l2", "preset": "llama-3.1-70b", "phase": "decode", "batch": 8,
     "kv_len": 4096, "dtype": "bf16", "layers": 2, "est_s": 25},
    {"case": "llama8b_decode_b32_kv1024_fp16_l4", "preset": "llama-3.1-8b", "phase": "decode", "batch": 32,
     "kv_len": 1024, "dtype": "fp16", "layers": 4, "est_s": 20},
    {"case": "llama70b_prefill_b1_s2048_bf16_l2", "preset": "llama-3.1-70b", "phase": "prefill", "batch": 1,
     "seq_len": 2048, "dtype": "bf16", "layers": 2, "est_s": 30},
    {"case": "mixtral_decode_b16_kv2048_fp16_l2", "preset": "mixtral-8x7b", "phase": "decode", "batch": 16,
     "kv_len": 2048, "dtype": "fp16", "layers": 2, "est_s": 25},
    {"case": "qwen25_7b_decode_b4_kv8192_bf16_l4", "preset": "qwen2.5-7b", "phase": "decode", "batch": 4,
     "kv_len": 8192, "dtype": "bf16", "layers": 4, "est_s": 20},
    {"case": "llama1b_prefill_b2_s8192_bf16_l4", "preset": "llama-3.2-1b", "phase": "prefill", "batch": 2,
     "seq_len": 8192, "dtype": "bf16", "layers": 4, "est_s": 25},
    {"case": "qwen3moe_prefill_b2_s1024_fp16_l2", "preset": "qwen3-30b-a3b", "phase": "prefill", "batch": 2,
     "seq_len": 1024, "dtype": "fp16", "layers": 2, "est_s": 30},
]  # fmt: skip

# Out-of-sample checks of the profile model's row-tile charge for grouped expert GEMMs (not in the held-out
# table; ``--cases`` names them): bf16 prefills whose loads sit on a tile boundary with the experts'
# weights bounding the kernel (Qwen3-MoE, 128 rows per expert), near the compute/memory balance (Mixtral,
# 256 rows) and compute-bound a tile off the profile's points (Mixtral, 1024 rows).
MOE_CHECK_CASES: list[dict[str, Any]] = [
    {"case": "check_qwen3moe_prefill_b1_s2048_bf16_l2", "preset": "qwen3-30b-a3b", "phase": "prefill",
     "batch": 1, "seq_len": 2048, "dtype": "bf16", "layers": 2, "est_s": 30},
    {"case": "check_mixtral_prefill_b1_s1024_bf16_l2", "preset": "mixtral-8x7b", "phase": "prefill",
     "batch": 1, "seq_len": 1024, "dtype": "bf16", "layers": 2, "est_s": 25},
    {"case": "check_mixtral_prefill_b1_s4096_bf16_l2", "preset": "mixtral-8x7b", "phase": "prefill",
     "batch": 1, "seq_len": 4096, "dtype": "bf16", "layers": 2, "est_s": 30},
]  # fmt: skip

# Out-of-sample checks of the host profile's measured loop of torch's ``_grouped_mm`` fallback (fp16 MoE
# experts, one ``mm`` per expert after a host sync; not in the held-out table; ``--cases`` names them):
# fp16 MoE shapes no fit, profile or held-out case holds, chosen after that change was committed.
FALLBACK_CHECK_CASES: list[dict[str, Any]] = [
    {"case": "check_mixtral_decode_b4_kv1024_fp16_l2", "preset": "mixtral-8x7b", "phase": "decode",
     "batch": 4, "kv_len": 1024, "dtype": "fp16", "layers": 2, "est_s": 20},
    {"case": "check_qwen3moe_decode_b16_kv512_fp16_l2", "preset": "qwen3-30b-a3b", "phase": "decode",
     "batch": 16, "kv_len": 512, "dtype": "fp16", "layers": 2, "est_s": 20},
    {"case": "check_mixtral_prefill_b1_s512_fp16_l2", "preset": "mixtral-8x7b", "phase": "prefill",
     "batch": 1, "seq_len": 512, "dtype": "fp16", "layers": 2, "est_s": 25},
    {"case": "check_qwen3moe_prefill_b4_s256_fp16_l2", "preset": "qwen3-30b-a3b", "phase": "prefill",
     "batch": 4, "seq_len": 256, "dtype": "fp16", "layers": 2, "est_s": 25},
]  # fmt: skip

# Deeper cuts of held-out shapes (not in the held-out table; ``--cases`` names them): the same forwards
# with many layers, whose GEMMs run for hundreds of milliseconds as a full model's do, so that the device
# meets the power state of a whole model rather than the transient a 2-4 layer cut meets after idle.
DEPTH_CASES: list[dict[str, Any]] = [
    {"case": "depth_llama70b_prefill_b1_s2048_bf16_l24", "preset": "llama-3.1-70b", "phase": "prefill",
     "batch": 1, "seq_len": 2048, "dtype": "bf16", "layers": 24, "est_s": 60},
    {"case": "depth_llama70b_decode_b8_kv4096_bf16_l24", "preset": "llama-3.1-70b", "phase": "decode",
     "batch": 8, "kv_len": 4096, "dtype": "bf16", "layers": 24, "est_s": 40},
    {"case": "depth_llama8b_prefill_b1_s4096_bf16_l32", "preset": "llama-3.1-8b", "phase": "prefill",
     "batch": 1, "seq_len": 4096, "dtype": "bf16", "layers": 32, "est_s": 40},
]  # fmt: skip

# Out-of-sample checks of balanced routing realised over the layers (``expected_active``: 4 tokens picking 2 of
# 8 experts reach 5.47 in expectation, 5, 6, 5, 6, ... by layer where rounding each layer gave 5 everywhere;
# not in the held-out table; ``--cases`` names them): MoE decodes of 2-4 tokens, chosen after that change was
# made; an fp16 one shows each layer's experts in its trace (one mm per expert that got rows), and the 16- and
# 24-layer ones (measured after the first three) hold enough layers to compare the mean with the expectation.
ROUTING_CHECK_CASES: list[dict[str, Any]] = [
    {"case": "check_mixtral_decode_b4_kv1024_fp16_l8", "preset": "mixtral-8x7b", "phase": "decode",
     "batch": 4, "kv_len": 1024, "dtype": "fp16", "layers": 8, "est_s": 40},
    {"case": "check_mixtral_decode_b2_kv1024_bf16_l4", "preset": "mixtral-8x7b", "phase": "decode",
     "batch": 2, "kv_len": 1024, "dtype": "bf16", "layers": 4, "est_s": 30},
    {"case": "check_mixtral_decode_b3_kv2048_fp16_l4", "preset": "mixtral-8x7b", "phase": "decode",
     "batch": 3, "kv_len": 2048, "dtype": "fp16", "layers": 4, "est_s": 30},
    {"case": "check_mixtral_decode_b4_kv512_fp16_l16", "preset": "mixtral-8x7b", "phase": "decode",
     "batch": 4, "kv_len": 512, "dtype": "fp16", "layers": 16, "est_s": 60},
    {"case": "check_qwen3moe_decode_b2_kv512_fp16_l24", "preset": "qwen3-30b-a3b", "phase": "decode",
     "batch": 2, "kv_len": 512, "dtype": "fp16", "layers": 24, "est_s": 60},
]  # fmt: skip


def _cases(tag: str, rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Cases from ``(family, preset, phase, batch, tokens, dtype, layers, est_s[, attn_impl])`` rows, each
    named ``{tag}_{family}_{phase}_b{batch}_{kv|s}{tokens}_{dtype}_l{layers}`` (no tag: no prefix)."""
    cases = []
    for fam, preset, phase, b, tokens, dt, layers, est_s, *attn in rows:
        tokens_key, mark = ("kv_len", "kv") if phase == "decode" else ("seq_len", "s")
        case = {
            "case": f"{tag + '_' if tag else ''}{fam}_{phase}_b{b}_{mark}{tokens}_{dt}_l{layers}",
            "preset": preset, "phase": phase, "batch": b, tokens_key: tokens, "dtype": dt, "layers": layers,
            "est_s": est_s,
        }  # fmt: skip
        cases.append({**case, "attn_impl": attn[0]} if attn else case)
    return cases


# Families no GPU measurement of this project had seen when these were chosen (2026-11-27), cut from the
# presets: Gemma 3 (five sliding-window layers of 1024 keys and one full, GeGLU, q/k norms), gpt-oss (eager
# attention with sinks, its SDPA being unsupported; 32 experts, top 4), DeepSeek-V3 (MLA; three dense
# layers, then 256 routed experts, top 8, and a shared one) and BLOOM (ALiBi, eager attention). Not in
# the held-out table (``--cases`` names them); measured as its cases are.
NEW_FAMILY_CASES: list[dict[str, Any]] = _cases("new", [
    ("gemma3", "gemma-3-27b", "prefill", 1, 2048, "bf16", 6, 30),
    ("gptoss", "gpt-oss-20b", "decode", 8, 2048, "bf16", 2, 25),
    ("deepseekv3", "deepseek-v3", "prefill", 1, 1024, "bf16", 4, 40),
    ("bloom", "bloom-560m", "decode", 16, 1024, "fp16", 24, 30),
    ("gemma3", "gemma-3-27b", "decode", 8, 4096, "bf16", 6, 30),
    ("gptoss", "gpt-oss-20b", "prefill", 1, 2048, "bf16", 2, 25),
    ("deepseekv3", "deepseek-v3", "decode", 8, 2048, "bf16", 4, 40),
    ("bloom", "bloom-560m", "prefill", 4, 1024, "fp16", 24, 30),
])  # fmt: skip

# Eager attention priced kernel by kernel (opgraph.ir.eager_parts, the sweep's eager-matmul series), checked
# on shapes chosen before that model was run on any of them: families whose other ops the profile
# predicts, run with eager attention (``attn_impl``: opgraph capture --attn-impl eager records them
# alike), and new shapes of the eager-only gpt-oss and BLOOM.
EAGER_CHECK_CASES: list[dict[str, Any]] = _cases("eager", [
    ("llama1b", "llama-3.2-1b", "prefill", 1, 2048, "bf16", 4, 20, "eager"),
    ("llama8b", "llama-3.1-8b", "decode", 8, 2048, "bf16", 4, 20, "eager"),
    ("qwen25", "qwen2.5-7b", "prefill", 2, 1024, "fp16", 4, 20, "eager"),
]) + _cases("new2", [
    ("gptoss", "gpt-oss-20b", "prefill", 2, 1024, "bf16", 2, 25),
    ("gptoss", "gpt-oss-20b", "decode", 16, 4096, "bf16", 2, 25),
    ("bloom", "bloom-560m", "decode", 4, 2048, "fp16", 24, 30),
    ("bloom", "bloom-560m", "prefill", 1, 2048, "fp16", 24, 30),
])  # fmt: skip

# The same check after the sweep gained float32 softmax points over the column count, repeat_kv copies and
# elementwise passes the size of the scores: new shapes, chosen before that sweep ran.
EAGER_CHECK2_CASES: list[dict[str, Any]] = _cases("eager2", [
    ("llama8b", "llama-3.1-8b", "prefill", 1, 1024, "bf16", 4, 20, "eager"),
    ("qwen25", "qwen2.5-7b", "decode", 4, 4096, "bf16", 4, 20, "eager"),
    ("llama1b", "llama-3.2-1b", "decode", 16, 1024, "fp16", 4, 20, "eager"),
]) + _cases("new3", [
    ("gptoss", "gpt-oss-20b", "decode", 4, 1024, "bf16", 2, 25),
    ("bloom", "bloom-560m", "prefill", 2, 512, "fp16", 24, 30),
])  # fmt: skip

# After the sweep measured what these models launch in their own layouts (batched GEMVs over kv + 1 keys,
# unaligned; strided copies such as MLA's key assembly; ungated activations) and capture kept BLOOM's
# Python GELU as its kernels and MLA's key copies as copies: new shapes, chosen before any of it ran.
LAYOUT_CHECK_CASES: list[dict[str, Any]] = _cases("check3", [
    ("qwen25", "qwen2.5-7b", "decode", 8, 2048, "bf16", 4, 20, "eager"),
    ("llama8b", "llama-3.1-8b", "decode", 2, 8192, "bf16", 4, 20, "eager"),
    ("llama1b", "llama-3.2-1b", "decode", 32, 512, "bf16", 4, 20, "eager"),
    ("bloom", "bloom-560m", "decode", 8, 512, "fp16", 24, 30),
    ("bloom", "bloom-560m", "prefill", 2, 1024, "fp16", 24, 30),
    ("deepseekv3", "deepseek-v3", "decode", 4, 1024, "bf16", 4, 40),
    ("deepseekv3", "deepseek-v3", "prefill", 2, 512, "bf16", 4, 40),
    ("gptoss", "gpt-oss-20b", "decode", 2, 2048, "bf16", 2, 25),
])  # fmt: skip

# After eager attention's row-wise passes were priced over their true rows (gpt-oss's sinks column makes them
# 2049 long; a prompt of odd length makes every row unaligned) and the sweep measured softmax, row maximum
# and the sinks cat over unaligned rows: new shapes, chosen before any of it ran.
ROWS_CHECK_CASES: list[dict[str, Any]] = _cases("check4", [
    ("gptoss", "gpt-oss-20b", "prefill", 1, 1024, "bf16", 2, 25),
    ("gptoss", "gpt-oss-20b", "prefill", 2, 2048, "bf16", 2, 25),
    ("qwen25", "qwen2.5-7b", "prefill", 1, 1001, "bf16", 4, 20, "eager"),
    ("llama1b", "llama-3.2-1b", "prefill", 4, 777, "fp16", 4, 20, "eager"),
])  # fmt: skip

# After the passes that read an operand broadcast over the scores (a mask over the heads, a row maximum,
# gpt-oss's expanded sinks) were priced as the strided kernels they run, from points measured that way: new
# shapes, chosen before any of it ran.
BROADCAST_CHECK_CASES: list[dict[str, Any]] = _cases("check5", [
    ("gptoss", "gpt-oss-20b", "prefill", 1, 512, "bf16", 2, 25),
    ("gptoss", "gpt-oss-20b", "prefill", 4, 1024, "bf16", 2, 25),
    ("llama8b", "llama-3.1-8b", "prefill", 2, 512, "bf16", 4, 20, "eager"),
    ("qwen25", "qwen2.5-7b", "prefill", 1, 2048, "bf16", 4, 20, "eager"),
    ("bloom", "bloom-560m", "prefill", 1, 1024, "fp16", 24, 30),
])  # fmt: skip

# After eager attention's casts were priced from points of their own direction (its passes carry the dtype
# they read, as a graph's casts do; the sweep measured large narrowing casts), a scale by a Python number
# from points of one tensor read, and BLOOM's alibi ``baddbmm`` as the copy and GEMM it launches: new shapes,
# chosen before any of it ran.
SCALAR_CHECK_CASES: list[dict[str, Any]] = _cases("check6", [
    ("llama8b", "llama-3.1-8b", "prefill", 1, 2048, "bf16", 4, 20, "eager"),
    ("qwen25", "qwen2.5-7b", "prefill", 2, 1024, "bf16", 4, 20, "eager"),
    ("llama1b", "llama-3.2-1b", "prefill", 2, 2048, "fp16", 4, 20, "eager"),
    ("vicuna", "vicuna-7b", "prefill", 1, 2048, "fp16", 4, 20, "eager"),
    ("bloom", "bloom-560m", "prefill", 2, 2048, "fp16", 24, 30),
    ("bloom", "bloom-560m", "prefill", 8, 512, "fp16", 24, 30),
])  # fmt: skip

# After the softmax of half scores taken in float32 (one CUDA kernel that reads them; past 1024 columns a
# block-per-row kernel, not the warp kernel float32 scores run) was priced from points measured that way: new
# fp16 shapes, chosen before any of it ran.
HALF_SOFTMAX_CHECK_CASES: list[dict[str, Any]] = _cases("check7", [
    ("llama8b", "llama-3.1-8b", "prefill", 1, 4096, "fp16", 4, 20, "eager"),
    ("qwen25", "qwen2.5-7b", "prefill", 1, 2048, "fp16", 4, 20, "eager"),
    ("llama1b", "llama-3.2-1b", "prefill", 4, 1024, "fp16", 4, 20, "eager"),
    ("bloom", "bloom-560m", "prefill", 4, 2048, "fp16", 24, 30),
    ("bloom", "bloom-560m", "prefill", 1, 4096, "fp16", 24, 30),
    ("vicuna", "vicuna-7b", "decode", 8, 4096, "fp16", 4, 20, "eager"),
])  # fmt: skip

# After BLOOM's alibi ``baddbmm`` GEMM was priced from points that accumulate onto the scores as it does, and
# the half-input softmax measured up to 2^28 scores: new BLOOM and fp16 shapes, chosen before any of it ran.
ACCUMULATE_CHECK_CASES: list[dict[str, Any]] = _cases("check8", [
    ("bloom", "bloom-560m", "prefill", 2, 4096, "fp16", 24, 30),
    ("bloom", "bloom-560m", "prefill", 16, 1024, "fp16", 24, 30),
    ("bloom", "bloom-560m", "prefill", 1, 8192, "fp16", 24, 30),
    ("llama1b", "llama-3.2-1b", "prefill", 4, 2048, "fp16", 4, 20, "eager"),
    ("qwen25", "qwen2.5-7b", "prefill", 2, 4096, "fp16", 4, 20, "eager"),
    ("llama8b", "llama-3.1-8b", "prefill", 2, 2048, "bf16", 4, 20, "eager"),
])  # fmt: skip

# After the softmax of a causal prefill's scores was priced from points measured on causally masked scores
# (CUDA's softmax kernels run 1.2-1.35x longer on them than on random ones): new shapes, chosen before any of it ran.
MASKED_CHECK_CASES: list[dict[str, Any]] = _cases("check9", [
    ("llama8b", "llama-3.1-8b", "prefill", 1, 2048, "fp16", 4, 20, "eager"),
    ("qwen25", "qwen2.5-7b", "prefill", 4, 1024, "fp16", 4, 20, "eager"),
    ("vicuna", "vicuna-7b", "prefill", 2, 2048, "fp16", 4, 20, "eager"),
    ("llama1b", "llama-3.2-1b", "prefill", 1, 4096, "bf16", 4, 20, "eager"),
    ("bloom", "bloom-560m", "prefill", 8, 1024, "fp16", 24, 30),
    ("bloom", "bloom-560m", "prefill", 2, 3072, "fp16", 24, 30),
])  # fmt: skip

# The session's final model checked on shapes and families of every eager path, chosen after its last change
# and before it predicted any of them: no change followed.
FINAL_CHECK_CASES: list[dict[str, Any]] = _cases("check10", [
    ("gptoss", "gpt-oss-20b", "prefill", 1, 4096, "bf16", 2, 25),
    ("llama8b", "llama-3.1-8b", "decode", 4, 2048, "fp16", 4, 20, "eager"),
    ("qwen25", "qwen2.5-7b", "decode", 16, 1024, "fp16", 4, 20, "eager"),
    ("bloom", "bloom-560m", "decode", 8, 1024, "fp16", 24, 30),
    ("llama1b", "llama-3.2-1b", "prefill", 8, 1024, "bf16", 4, 20, "eager"),
    ("vicuna", "vicuna-7b", "prefill", 4, 1024, "bf16", 4, 20, "eager"),
])  # fmt: skip

# SDPA decodes in fp16 (and one bf16 control), written down before the sweep's fp16 decode attention points
# were measured or predicted on them (2026-11-27 13:53 UTC).
DECODE_CHECK_CASES: list[dict[str, Any]] = _cases("check11", [
    ("llama8b", "llama-3.1-8b", "decode", 16, 2048, "fp16", 4, 20),
    ("qwen25", "qwen2.5-7b", "decode", 8, 4096, "fp16", 4, 20),
    ("llama70b", "llama-3.1-70b", "decode", 4, 2048, "fp16", 2, 25),
    ("mixtral", "mixtral-8x7b", "decode", 8, 1024, "fp16", 2, 25),
    ("llama1b", "llama-3.2-1b", "decode", 32, 2048, "fp16", 4, 20),
    ("llama8b", "llama-3.1-8b", "decode", 8, 8192, "bf16", 4, 20),
])  # fmt: skip

# Pre-registered at 15:28 UTC on 2026-11-27 (before the sweep's write-back points are measured or predicted
# from): SDPA decodes and prefills of shapes no run measured, to check the write-back charge
# (hardware.models.profile.ProfileModel.after_write) out of sample.
WRITEBACK_CHECK_CASES: list[dict[str, Any]] = _cases("check12", [
    ("llama8b", "llama-3.1-8b", "decode", 4, 4096, "bf16", 4, 20),
    ("qwen25", "qwen2.5-7b", "decode", 16, 2048, "fp16", 4, 20),
    ("llama70b", "llama-3.1-70b", "decode", 16, 1024, "bf16", 2, 25),
    ("llama1b", "llama-3.2-1b", "decode", 8, 8192, "bf16", 4, 20),
    ("mixtral", "mixtral-8x7b", "decode", 4, 2048, "bf16", 2, 25),
    ("llama8b", "llama-3.1-8b", "prefill", 1, 4096, "fp16", 4, 20),
    ("qwen25", "qwen2.5-7b", "prefill", 2, 2048, "bf16", 4, 20),
    ("llama1b", "llama-3.2-1b", "prefill", 4, 2048, "fp16", 4, 20),
])  # fmt: skip

# Pre-registered at 15:46 UTC on 2026-11-27, after the write-back charge was settled on the sweep's points, two
# probes (writeback_probe.py, own_input_probe.py) and the earlier checks (check12 among them), before these cases
# were measured or predicted: SDPA decodes and prefills of shapes no run measured, on the H100 and on an H200.
WRITEBACK_CHECK2_CASES: list[dict[str, Any]] = _cases("check13", [
    ("llama8b", "llama-3.1-8b", "decode", 32, 2048, "bf16", 4, 20),
    ("qwen25", "qwen2.5-7b", "decode", 8, 8192, "bf16", 4, 20),
    ("llama70b", "llama-3.1-70b", "decode", 8, 2048, "fp16", 2, 25),
    ("llama1b", "llama-3.2-1b", "decode", 16, 4096, "fp16", 4, 20),
    ("mixtral", "mixtral-8x7b", "decode", 16, 1024, "bf16", 2, 25),
    ("vicuna", "vicuna-7b", "decode", 8, 2048, "fp16", 4, 20),
    ("llama8b", "llama-3.1-8b", "prefill", 2, 1024, "bf16", 4, 20),
    ("llama70b", "llama-3.1-70b", "prefill", 1, 1024, "bf16", 2, 25),
])  # fmt: skip

# Pre-registered at 19:50 UTC on 2026-11-27, before any of them was measured or predicted: ten families no
# measurement of this project had seen and no preset ships, each from a local config.json written after its
# published one (benchmarks/gpu/configs/; as a user passes ``opgraph capture config.json``): Qwen3 dense (per-head
# q/k norms), Phi-3 (fused qkv and gate/up, a sliding window its decode crosses), Mistral, Gemma 2 (soft-capped
# eager attention), OLMo 2 (q/k norms over the whole width), Pythia/GPT-NeoX (partial rotary, parallel residual,
# LayerNorm), GPT-2 (Conv1D addmm, learned positions), Falcon (71 heads, one KV head), Phi-2 (partial rotary, a
# parallel block) and StarCoder2 (biases, a window its decode crosses). The model and profile stay as they were.
FAMILY_CHECK_CASES: list[dict[str, Any]] = _cases("check14", [
    ("qwen3", "qwen3-8b", "prefill", 1, 2048, "bf16", 4, 20),
    ("phi3", "phi-3-mini-4k", "decode", 8, 2048, "bf16", 4, 20),
    ("mistral", "mistral-7b-v0.1", "prefill", 2, 1024, "fp16", 4, 20),
    ("gemma2", "gemma-2-9b", "decode", 4, 1024, "bf16", 4, 20),
    ("olmo2", "olmo-2-7b", "prefill", 1, 4096, "bf16", 4, 20),
    ("pythia", "pythia-1.4b", "decode", 16, 1024, "fp16", 8, 20),
    ("gpt2", "gpt2-medium", "prefill", 4, 1024, "fp16", 24, 20),
    ("falcon", "falcon-7b", "decode", 8, 2048, "bf16", 4, 20),
    ("phi2", "phi-2", "prefill", 2, 2048, "fp16", 4, 20),
    ("starcoder2", "starcoder2-3b", "decode", 4, 4096, "bf16", 4, 20),
    ("qwen3", "qwen3-8b", "decode", 16, 1024, "fp16", 4, 20),
    ("falcon", "falcon-7b", "prefill", 1, 2048, "bf16", 4, 20),
])  # fmt: skip

# Pre-registered at 20:00 UTC on 2026-11-27, after family-check-1950 showed where the families above do not
# transfer and three changes were written from it (a cost cache that kept one layout per op config, dense GEMMs
# over unaligned rows, one-token decodes past a sliding window), before the sweep's new points were measured or
# these cases run: new shapes of the same families. The Falcon decode keeps its SDPA math fallback (heads of the
# keys unlike the queries'), which nothing models yet.
FAMILY_CHECK2_CASES: list[dict[str, Any]] = _cases("check15", [
    ("gpt2", "gpt2-medium", "decode", 8, 512, "fp16", 24, 20),
    ("gpt2", "gpt2-medium", "prefill", 1, 1024, "bf16", 24, 20),
    ("pythia", "pythia-1.4b", "decode", 32, 1536, "bf16", 8, 20),
    ("phi2", "phi-2", "decode", 8, 1024, "fp16", 4, 20),
    ("starcoder2", "starcoder2-3b", "decode", 16, 8192, "bf16", 4, 20),
    ("mistral", "mistral-7b-v0.1", "decode", 8, 8192, "fp16", 4, 20),
    ("phi3", "phi-3-mini-4k", "decode", 16, 3072, "bf16", 4, 20),
    ("qwen3", "qwen3-8b", "prefill", 2, 1024, "fp16", 4, 20),
    ("olmo2", "olmo-2-7b", "decode", 8, 2048, "bf16", 4, 20),
    ("falcon", "falcon-7b", "decode", 1, 1024, "bf16", 4, 20),
    ("gemma2", "gemma-2-9b", "prefill", 1, 2048, "bf16", 4, 20),
    ("mistral", "mistral-7b-v0.1", "prefill", 1, 8192, "bf16", 4, 20),
])  # fmt: skip

# Pre-registered at 20:20 UTC on 2026-11-27, after SDPA's math path was priced kernel by kernel
# (``opgraph.ir.Attention.math``, from family-check-1950's Falcon cases) and before the sweep measured its points
# or these cases ran: Falcon shapes no run measured.
FALCON_CHECK_CASES: list[dict[str, Any]] = _cases("check16", [
    ("falcon", "falcon-7b", "prefill", 2, 1024, "bf16", 4, 20),
    ("falcon", "falcon-7b", "decode", 16, 1024, "fp16", 4, 20),
    ("falcon", "falcon-7b", "prefill", 1, 4096, "fp16", 2, 20),
    ("falcon", "falcon-7b", "decode", 4, 4096, "bf16", 4, 20),
])  # fmt: skip

# Pre-registered at 21:05 UTC on 2026-11-27, after a rotary embedding under wider cos/sin tables was priced from
# points measured that way (``rope:float_tables``, from family-check-1950's OLMo 2 prefill) and before those points
# were measured or these cases ran: OLMo 2 shapes no run measured.
OLMO2_CHECK_CASES: list[dict[str, Any]] = _cases("check17", [
    ("olmo2", "olmo-2-7b", "prefill", 2, 2048, "bf16", 4, 20),
    ("olmo2", "olmo-2-7b", "decode", 16, 1024, "bf16", 4, 20),
    ("olmo2", "olmo-2-7b", "prefill", 1, 1024, "fp16", 4, 20),
])  # fmt: skip

# Pre-registered at 22:23 UTC on 2026-11-27, after capture stopped counting an ``out=`` buffer as bytes read
# (``opgraph.capture.recorder.Event.written``: torch's fp16 ``_grouped_mm`` fallback writes each expert's product
# into a slice of one output; the main table's fp16 Qwen3-MoE prefill +5.2% -> +1.4%, in sample), before these
# cases ran: fp16 MoE prefills of shapes no run measured, and Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B: a
# shared expert beside 60 or 64 routed ones, its sigmoid gate), an MoE family no measurement had seen, from
# local configs. The profile and the models stay as they are.
MOE_FAMILY_CHECK_CASES: list[dict[str, Any]] = _cases("check18", [
    ("qwen3moe", "qwen3-30b-a3b", "prefill", 1, 4096, "fp16", 2, 25),
    ("qwen3moe", "qwen3-30b-a3b", "prefill", 4, 1024, "fp16", 2, 25),
    ("mixtral", "mixtral-8x7b", "prefill", 2, 2048, "fp16", 2, 25),
    ("qwen15moe", "qwen1.5-moe-a2.7b", "prefill", 1, 2048, "bf16", 4, 20),
    ("qwen15moe", "qwen1.5-moe-a2.7b", "decode", 8, 1024, "bf16", 4, 20),
    ("qwen15moe", "qwen1.5-moe-a2.7b", "prefill", 2, 1024, "fp16", 4, 20),
    ("qwen2moe", "qwen2-57b-a14b", "decode", 16, 2048, "bf16", 2, 25),
    ("qwen2moe", "qwen2-57b-a14b", "prefill", 1, 2048, "fp16", 2, 25),
])  # fmt: skip

# Pre-registered at 22:29 UTC on 2026-11-27, after check18 (moe-family-check-2224) priced the fp16 Qwen2-MoE
# prefills' expert products 13-41% long (the loop points, of two layers' shapes, interpolated over n, k and the
# experts' count) and the expert-loop regime was redrawn along each product's bytes at its rows, with loop points
# of three more layers' shapes on one row grid, before those points were measured or these cases ran: fp16 MoE
# prefills and a decode of shapes no run measured, Mixtral-8x22B and Qwen3-Coder-480B from local configs.
MOE_LOOP_CHECK_CASES: list[dict[str, Any]] = _cases("check19", [
    ("qwen15moe", "qwen1.5-moe-a2.7b", "prefill", 1, 4096, "fp16", 4, 20),
    ("qwen2moe", "qwen2-57b-a14b", "prefill", 2, 1024, "fp16", 2, 25),
    ("mixtral22b", "mixtral-8x22b", "prefill", 1, 2048, "fp16", 2, 30),
    ("qwen3coder", "qwen3-coder-480b-a35b", "prefill", 1, 2048, "fp16", 2, 30),
    ("qwen3coder", "qwen3-coder-480b-a35b", "decode", 8, 1024, "fp16", 2, 30),
    ("qwen3moe", "qwen3-30b-a3b", "prefill", 2, 2048, "fp16", 2, 25),
])  # fmt: skip

CHECKS: dict[str, list[dict[str, Any]]] = {
    "MOE_CHECK_CASES": MOE_CHECK_CASES,
    "FALLBACK_CHECK_CASES": FALLBACK_CHECK_CASES,
    "ROUTING_CHECK_CASES": ROUTING_CHECK_CASES,
    "DEPTH_CASES": DEPTH_CASES,
    "NEW_FAMILY_CASES": NEW_FAMILY_CASES,
    "EAGER_CHECK_CASES": EAGER_CHECK_CASES,
    "EAGER_CHECK2_CASES": EAGER_CHECK2_CASES,
    "LAYOUT_CHECK_CASES": LAYOUT_CHECK_CASES,
    "ROWS_CHECK_CASES": ROWS_CHECK_CASES,
    "BROADCAST_CHECK_CASES": BROADCAST_CHECK_CASES,
    "SCALAR_CHECK_CASES": SCALAR_CHECK_CASES,
    "HALF_SOFTMAX_CHECK_CASES": HALF_SOFTMAX_CHECK_CASES,
    "ACCUMULATE_CHECK_CASES": ACCUMULATE_CHECK_CASES,
    "MASKED_CHECK_CASES": MASKED_CHECK_CASES,
    "FINAL_CHECK_CASES": FINAL_CHECK_CASES,
    "DECODE_CHECK_CASES": DECODE_CHECK_CASES,
    "WRITEBACK_CHECK_CASES": WRITEBACK_CHECK_CASES,
    "WRITEBACK_CHECK2_CASES": WRITEBACK_CHECK2_CASES,
    "FAMILY_CHECK_CASES": FAMILY_CHECK_CASES,
    "FAMILY_CHECK2_CASES": FAMILY_CHECK2_CASES,
    "FALCON_CHECK_CASES": FALCON_CHECK_CASES,
    "OLMO2_CHECK_CASES": OLMO2_CHECK_CASES,
    "MOE_FAMILY_CHECK_CASES": MOE_FAMILY_CHECK_CASES,
    "MOE_LOOP_CHECK_CASES": MOE_LOOP_CHECK_CASES,
}
"""Every check run's cases by list name (``--cases`` picks from them by case name)."""

# The training cases whose walls fit the host profile's in-context terms (benchmarks/gpu/host_profile.sh
# TRAIN, the lines measured on the GPU: dense decodes, fp16 MoE whose experts torch's C++ fallback issues,
# and prefills whose device work outlasts the host's): ``--round-robin --train-walls`` measures them in the
# same rounds as the held-out cases, so both meet the same host states. The b64 decode first: its cache
# fill needs the most memory.
TRAIN_WALL_CASES: list[dict[str, Any]] = _cases("", [
    ("qwen25_7b", "qwen2.5-7b", "decode", 64, 4096, "fp16", 3, 10),
    ("llama1b", "llama-3.2-1b", "decode", 4, 2048, "bf16", 1, 10),
    ("llama1b", "llama-3.2-1b", "decode", 4, 2048, "bf16", 5, 10),
    ("qwen25_7b", "qwen2.5-7b", "decode", 2, 1024, "fp16", 3, 10),
    ("llama8b", "llama-3.1-8b", "decode", 16, 2048, "bf16", 1, 10),
    ("llama8b", "llama-3.1-8b", "decode", 16, 2048, "bf16", 5, 10),
    ("llama8b", "llama-3.1-8b", "decode", 32, 8192, "bf16", 1, 10),
    ("llama8b", "llama-3.1-8b", "decode", 32, 8192, "bf16", 3, 10),
    ("qwen3moe", "qwen3-30b-a3b", "decode", 4, 512, "fp16", 1, 10),
    ("qwen25_7b", "qwen2.5-7b", "decode", 16, 4096, "bf16", 1, 10),
    ("qwen25_7b", "qwen2.5-7b", "decode", 16, 4096, "bf16", 5, 10),
    ("llama8b", "llama-3.1-8b", "decode", 1, 4096, "fp16", 3, 10),
    ("mixtral", "mixtral-8x7b", "prefill", 2, 512, "fp16", 1, 10),
    ("llama1b", "llama-3.2-1b", "decode", 16, 256, "fp16", 3, 10),
    ("qwen3moe", "qwen3-30b-a3b", "prefill", 1, 512, "fp16", 1, 10),
    ("qwen3moe", "qwen3-30b-a3b", "prefill", 1, 512, "fp16", 3, 10),
    ("llama8b", "llama-3.1-8b", "prefill", 1, 2048, "bf16", 3, 10),
    ("llama1b", "llama-3.2-1b", "prefill", 1, 1024, "bf16", 3, 10),
    ("qwen25_7b", "qwen2.5-7b", "prefill", 1, 2048, "bf16", 1, 10),
    ("llama8b", "llama-3.1-8b", "prefill", 2, 512, "fp16", 5, 10),
    ("mixtral", "mixtral-8x7b", "prefill", 1, 1024, "bf16", 1, 10),
    ("qwen3moe", "qwen3-30b-a3b", "prefill", 1, 512, "bf16", 3, 10),
])  # fmt: skip

# CPU smoke cases: tiny shapes of the same families (the config keys present in the preset shrunk).
TINY_CASES: list[dict[str, Any]] = [
    {"case": "tiny_llama_prefill_b1_s32_bf16", "preset": "llama-3.1-8b", "phase": "prefill", "batch": 1,
     "seq_len": 32, "dtype": "bf16", "layers": 2, "est_s": 5},
    {"case": "tiny_llama_decode_b2_kv64_fp16", "preset": "llama-3.2-1b", "phase": "decode", "batch": 2,
     "kv_len": 64, "dtype": "fp16", "layers": 2, "est_s": 5},
    {"case": "tiny_mixtral_prefill_b1_s16_bf16", "preset": "mixtral-8x7b", "phase": "prefill", "batch": 1,
     "seq_len": 16, "dtype": "bf16", "layers": 1, "est_s": 5},
    {"case": "tiny_qwen2_prefill_b2_s16_fp16", "preset": "qwen2.5-7b", "phase": "prefill", "batch": 2,
     "seq_len": 16, "dtype": "fp16", "layers": 1, "est_s": 5},
    {"case": "tiny_qwen3moe_decode_b2_kv32_bf16", "preset": "qwen3-30b-a3b", "phase": "decode", "batch": 2,
     "kv_len": 32, "dtype": "bf16", "layers": 1, "est_s": 5},
    {"case": "tiny_gemma3_prefill_b1_s24_bf16", "preset": "gemma-3-27b", "phase": "prefill", "batch": 1,
     "seq_len": 24, "dtype": "bf16", "layers": 6, "est_s": 5},
    {"case": "tiny_gptoss_decode_b2_kv24_bf16", "preset": "gpt-oss-20b", "phase": "decode", "batch": 2,
     "kv_len": 24, "dtype": "bf16", "layers": 2, "est_s": 5},
    {"case": "tiny_deepseekv3_prefill_b1_s16_bf16", "preset": "deepseek-v3", "phase": "prefill", "batch": 1,
     "seq_len": 16, "dtype": "bf16", "layers": 2, "est_s": 5, "tiny_config": {"first_k_dense_replace": 1}},
    {"case": "tiny_bloom_decode_b2_kv16_fp16", "preset": "bloom-560m", "phase": "decode", "batch": 2,
     "kv_len": 16, "dtype": "fp16", "layers": 2, "est_s": 5},
]  # fmt: skip
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "num_local_experts": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "n_routed_experts": 8,
    "n_group": 2,
    "topk_group": 1,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "sliding_window": 16,
    "n_head": 4,
}
"""The config keys a tiny case shrinks (those its preset has); a case's ``tiny_config`` sets more."""

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def case_config(case: dict[str, Any], tiny: bool) -> dict[str, Any]:
    """The raw config (``model_type`` and the keys ``AutoConfig.for_model`` takes), cut to the case's layers:
    the preset's, else the local config of that name in :data:`CONFIGS`."""
    preset = PRESETS / f"{case['preset']}.json"
    raw = dict(json.loads(preset.read_text())["config"] if preset.exists() else _local_config(case["preset"]))
    if tiny:
        raw.update({k: v for k, v in TINY.items() if k in raw})
        if "kv_lora_rank" in raw:  # MLA: one key/value head per query head
            raw["num_key_value_heads"] = raw["num_attention_heads"]
        raw.update(case.get("tiny_config", {}))
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):  # ids past the shrunk vocabulary
            if isinstance(raw.get(key), int) and raw[key] >= raw.get("vocab_size", 0):
                raw.pop(key)
        raw.pop("rope_scaling", None)
    raw["num_hidden_layers"] = int(case["layers"])
    if isinstance(raw.get("layer_types"), list):
        raw["layer_types"] = raw["layer_types"][: case["layers"]]
    if "max_window_layers" in raw:
        raw["max_window_layers"] = int(case["layers"])
    return raw


def _local_config(name: str) -> dict[str, Any]:
    path = CONFIGS / f"{name}.json"
    if not path.exists():
        raise SystemExit(f"error: no preset or local config named {name!r} (benchmarks/gpu/configs/)")
    return dict(json.loads(path.read_text()))


WEIGHT_SEED = 0
"""Default seed of every case's random weights (``torch.manual_seed`` just before the model is built; ``--seed``)."""


def build_model(
    raw: dict[str, Any],
    dtype: str,
    device: str,
    weights_on: str | None = None,
    seed: int = WEIGHT_SEED,
    attn: str = "sdpa",
) -> tuple[Any, Any]:
    """The unmodified HF causal LM (eager modules, SDPA) with seeded random weights, on ``device``.

    The weights are drawn on ``weights_on`` (default: ``device``). Drawn on the CPU (``--weights-on
    cpu``) they are those ``opgraph capture CONFIG --device cpu --seed 0`` builds, so a CPU capture
    reproduces the routing of the model the GPU runs (a GPU's random draws differ from the CPU's)."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    kwargs = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version")}
    config = transformers.AutoConfig.for_model(raw["model_type"], **kwargs)
    for attempt in dict.fromkeys((attn, "eager")):  # as opgraph capture picks: --attn-impl, else eager
        torch.manual_seed(seed)
        try:
            with torch.device(weights_on or device):
                model = transformers.AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                    config, dtype=getattr(torch, DTYPES[dtype]), attn_implementation=attempt
                )
            break
        except ValueError as exc:
            if attempt == "eager" or "does not support an attention implementation" not in str(exc):
                raise
    model.to(device).eval()
    return model, config


def token_ids(vocab: int, batch: int, length: int, seed: int, device: str) -> Any:
    """Seeded random token ids (as ``opgraph.capture.api.token_ids``)."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen, dtype=torch.long).to(device)


class Phase:
    """One case's phase: ``fresh()`` makes the cache a run starts from (untimed), ``run(cache)`` the forward."""

    def __init__(self, model: Any, config: Any, case: dict[str, Any], device: str) -> None:
        import transformers

        self.model, self.config, self.case, self.device = model, config, case, device
        self.cache_cls = transformers.DynamicCache
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"  # as opgraph's capture
        vocab = int(config.vocab_size)
        b = int(case["batch"])
        self.copies = True
        if case["phase"] == "decode":
            self.ids = token_ids(vocab, b, 1, 2, device)
            self.fill = token_ids(vocab, b, int(case["kv_len"]), 1, device)
            self.base = self._filled()
        else:
            self.ids = token_ids(vocab, b, int(case["seq_len"]), 0, device)
            self.base = None

    def _new_cache(self) -> Any:
        try:
            return self.cache_cls(config=self.config)
        except TypeError:
            return self.cache_cls()

    def _forward(self, ids: Any, cache: Any, **extra: Any) -> Any:
        import torch

        with torch.no_grad():
            return self.model(input_ids=ids, use_cache=True, **{self.cache_kw: cache}, **extra)

    def _filled(self) -> Any:
        cache = self._new_cache()
        self._forward(self.fill, cache, logits_to_keep=1)  # only the cache is kept: no full logits
        return cache

    def fresh(self) -> Any:
        """An empty cache (prefill) or a filled one (decode: a copy of the one filled once, else filled again)."""
        if self.base is None:
            return self._new_cache()
        if self.copies:
            try:
                return copy.deepcopy(self.base)
            except Exception:  # a cache class that cannot be copied: fill a new one each time
                self.copies = False
        return self._filled()

    def run(self, cache: Any) -> None:
        out = self._forward(self.ids, cache)
        del out


MODULE_RANGE = "heldout_mod:"
"""Profiler range around each module call of a profiled run (``heldout_mod:model.layers.0.mlp``): the
module scope of every aten call, which lets the report line the trace up with a recording module by
module (a module whose calls differ, such as an MoE block run as the model routes, stays apart)."""


@contextmanager
def module_ranges(model: Any) -> Iterator[None]:
    """While inside: every call of a submodule of ``model`` is a profiler range named by its path."""
    import torch

    names = {id(m): n for n, m in model.named_modules()}
    open_ranges: list[Any] = []

    def pre(module: Any, _args: Any) -> None:
        name = names.get(id(module))
        rf = torch.autograd.profiler.record_function(f"{MODULE_RANGE}{name}") if name is not None else None
        if rf is not None:
            rf.__enter__()  # type: ignore[no-untyped-call]
        open_ranges.append(rf)

    def post(module: Any, _args: Any, _out: Any) -> None:
        rf = open_ranges.pop() if open_ranges else None
        if rf is not None:
            rf.__exit__(None, None, None)

    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    h2 = torch.nn.modules.module.register_module_forward_hook(post)
    try:
        yield
    finally:
        h1.remove()
        h2.remove()
        while open_ranges:  # a forward that raised left its ranges open
            rf = open_ranges.pop()
            if rf is not None:
                rf.__exit__(None, None, None)


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def host_probe(device: str, launches: int = 2000, loops: int = 200_000) -> dict[str, float]:
    """The host's speed now: us per tiny kernel launch (host side only) and us per pure-Python loop step."""
    import torch

    x = torch.zeros(1, device=device)
    for _ in range(50):
        x.add_(1)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(launches):
        x.add_(1)
    t1 = time.perf_counter()
    sync(device)
    acc = 0
    t2 = time.perf_counter()
    for i in range(loops):
        acc += i & 7
    t3 = time.perf_counter()
    return {"launch_us": (t1 - t0) * 1e6 / launches, "python_loop_ns": (t3 - t2) * 1e9 / loops}


def round_order(n: int, r: int) -> list[int]:
    """The cases' order in round ``r``: rotated by ``r``, reversed every other round (each case meets the
    host's drift at every position)."""
    order = [(i + r) % n for i in range(n)]
    return order[::-1] if r % 2 else order


def _nested(events: list[dict[str, Any]]) -> list[bool]:
    """For cpu ops sorted by (tid, ts, -dur): whether each has a child (another op inside it)."""
    has_child = [False] * len(events)
    stack: list[int] = []
    last_tid: Any = object()
    for i, e in enumerate(events):
        if e.get("tid") != last_tid:
            stack, last_tid = [], e.get("tid")
        while stack and events[stack[-1]]["ts"] + events[stack[-1]].get("dur", 0) < e["ts"] + e.get("dur", 0) - 1e-6:
            stack.pop()
        if stack:
            has_child[stack[-1]] = True
        stack.append(i)
    return has_child


_FREE = frozenset(
    [
        "view",
        "reshape",
        "as_strided",
        "transpose",
        "unsqueeze",
        "squeeze",
        "expand",
        "slice",
        "select",
        "permute",
        "detach",
        "alias",
        "empty",
        "t",
        "_unsafe_view",
        "resolve_conj",
        "resolve_neg",
        "lift_fresh",
    ]
)


def fake_device_events(trace: dict[str, Any]) -> int:
    """CPU smoke mode: give every leaf aten op that computes a stand-in kernel (same span) and launch."""
    evs = trace["traceEvents"]
    ops = sorted(
        (e for e in evs if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
        key=lambda e: (str(e.get("tid")), e["ts"], -e.get("dur", 0)),
    )
    leaf = [not c for c in _nested(ops)]
    corr = 10_000_000
    added = 0
    for e, is_leaf in zip(ops, leaf, strict=True):
        name = str(e.get("name", "")).removeprefix("aten::")
        if not is_leaf or name in _FREE or e.get("dur", 0) <= 0:
            continue
        corr += 1
        mid = e["ts"] + e["dur"] / 2
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": e.get("pid"),
                    "tid": e.get("tid"), "ts": mid, "dur": 0, "args": {"correlation": corr}})  # fmt: skip
        evs.append({"ph": "X", "cat": "kernel", "name": f"fake_{name}", "pid": 0, "tid": 7, "ts": mid,
                    "dur": e["dur"], "args": {"correlation": corr, "device": 0, "stream": 7}})  # fmt: skip
        added += 1
    return added


def split_runs(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """Per profiled run (``heldout_run_<i>`` range): its range, GPU time (sum), busy time (union), kernels."""
    evs = trace["traceEvents"]
    ranges = sorted(
        (e for e in evs if e.get("ph") == "X" and str(e.get("name", "")).startswith(RUN_RANGE)
         and e.get("cat") in ("user_annotation", "cpu_op")),
        key=lambda e: e["ts"],
    )  # fmt: skip
    from opgraph.ir.timeline import union_length
    from opgraph.trace.kineto import is_device_event, launch_times

    launch = launch_times(evs)
    runs = [
        {"index": int(r["name"][len(RUN_RANGE) :]), "start": float(r["ts"]), "end": float(r["ts"]) + float(r["dur"]),
         "tid": r.get("tid"), "spans": []}
        for r in ranges
    ]  # fmt: skip
    starts = [r["start"] for r in runs]
    import bisect

    for e in evs:
        if not is_device_event(e):
            continue
        t = launch.get(e.get("args", {}).get("correlation"))
        if t is None:
            continue
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t <= runs[i]["end"]:
            runs[i]["spans"].append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), float(e.get("dur", 0))))
    out = []
    for r in runs:
        spans = r.pop("spans")
        busy = union_length((s, e) for s, e, _ in spans)
        out.append({**r, "gpu_us": sum(d for _, _, d in spans), "busy_us": busy, "device_events": len(spans)})
    return out


def trim_to_run(trace: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The trace of one run: metadata, host events inside its range, and the device events it launched."""
    from opgraph.trace.kineto import is_device_event, is_launch_event

    lo, hi = run["start"], run["end"]
    keep_corr: set[Any] = set()
    host: list[dict[str, Any]] = []
    meta: list[dict[str, Any]] = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "M":
            meta.append(e)
        elif is_device_event(e) or str(e.get("cat", "")).startswith("gpu_"):
            continue
        elif "ts" in e and lo <= float(e["ts"]) <= hi:
            if e.get("cat") in ("cpu_op", "user_annotation") and isinstance(e.get("args"), dict):
                # Keep the trace small: host ops keep only the id that links them to their kernels.
                e = {**e, "args": {k: v for k, v in e["args"].items() if k == "External id"}}
            host.append(e)
            if is_launch_event(e):
                keep_corr.add(e["args"]["correlation"])
    dev = [
        e for e in trace["traceEvents"]
        if is_device_event(e) and e.get("args", {}).get("correlation") in keep_corr
    ]  # fmt: skip
    out = {k: v for k, v in trace.items() if k != "traceEvents"}
    out["traceEvents"] = meta + host + dev
    return out


def stats(xs: list[float]) -> dict[str, Any]:
    """Median, min, max, relative spread ((max - min) / median) and IQR of ``xs``."""
    xs = [float(x) for x in xs]
    med = statistics.median(xs)
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return {
        "median": med,
        "min": min(xs),
        "max": max(xs),
        "spread": (max(xs) - min(xs)) / med if med else 0.0,
        "iqr": q[2] - q[0],
        "runs": xs,
    }


def gpu_info(device: str) -> dict[str, Any]:
    """GPU name, driver and clocks (nvidia-smi), or the CPU."""
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if device != "cuda":
        info["name"] = "cpu"
        return info
    import torch

    info["name"] = torch.cuda.get_device_name()
    props = torch.cuda.get_device_properties(0)
    info["sm_count"] = props.multi_processor_count
    info["memory_gib"] = round(props.total_memory / 2**30, 1)
    fields = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.limit,temperature.gpu"
    try:
        res = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True, text=True, timeout=15
        )
        vals = [v.strip() for v in res.stdout.strip().splitlines()[0].split(",")]
        info.update(dict(zip(fields.split(","), vals, strict=False)))
    except Exception as exc:  # provenance is best effort
        info["nvidia_smi"] = f"{type(exc).__name__}: {exc}"[:200]
    return info


def sm_clock() -> str | None:
    try:
        res = subprocess.run(
            ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
        return res.stdout.strip().splitlines()[0].strip()
    except Exception:
        return None


def runtime_estimator(config_path: Path, case: dict[str, Any], device: str) -> dict[str, Any]:
    """PyTorch's RuntimeEstimator on the same phase, as ``benchmarks/gpu/accuracy.py`` runs it."""
    sys.path.insert(0, str(REPO / "benchmarks" / "gpu"))
    try:
        from accuracy import runtime_estimator_ms
    finally:
        sys.path.pop(0)
    kw: dict[str, Any] = {k: case[k] for k in ("phase", "batch", "seq_len", "kv_len", "dtype") if k in case}
    ms, why = runtime_estimator_ms(str(config_path), kw, device)
    return {"total_us": None if ms is None else ms * 1e3, "note": why}


def timed_wall(phase: Phase, device: str) -> float:
    """The wall time (us) of one forward of ``phase`` from a fresh cache, after ``gc.collect()``,
    synchronised before and after."""
    cache = phase.fresh()
    gc.collect()
    sync(device)
    t0 = time.perf_counter()
    phase.run(cache)
    sync(device)
    return (time.perf_counter() - t0) * 1e6


def timed_walls(phase: Phase, runs: int, device: str) -> list[float]:
    """Wall times (us) of ``runs`` forwards of ``phase`` (:func:`timed_wall`) after two warm-up runs
    (allocator growth, library init, autotuning). How the held-out cases and the host profile's training
    walls were measured one case after another."""
    for _ in range(2):
        phase.run(phase.fresh())
    sync(device)
    return [timed_wall(phase, device) for _ in range(runs)]


def settle(phase: Phase, seconds: float, device: str) -> dict[str, Any]:
    """Run ``phase``'s forward back to back (a fresh cache and a synchronize between) for ``seconds``:
    the device's clock and power then sit where a model of full depth holds them (a cut model's
    forward after a short warm-up meets the power controller's transient from idle instead, see
    ``sustained_prefill.py``). Returns the forwards run, the seconds taken and the SM clock after."""
    t0 = time.perf_counter()
    n = 0
    while n < 2 or time.perf_counter() - t0 < seconds:
        phase.run(phase.fresh())
        sync(device)
        n += 1
    return {"seconds": round(time.perf_counter() - t0, 3), "forwards": n,
            "sm_clock": sm_clock() if device == "cuda" else None}  # fmt: skip


def round_robin_walls(
    groups: list[tuple[str, list[dict[str, Any]]]], args: argparse.Namespace, out: Path, t_start: float
) -> dict[str, Any]:
    """Walls of every case measured in rounds (the host of a shared GPU machine drifts in speed within
    minutes, so cases measured one after another meet different host states).

    Per group (``role``, cases): every case's model is built and warmed up (a case that does not fit in
    the device's memory is skipped with a note), then ``args.round_robin`` rounds each start with a
    host probe (:func:`host_probe`) and run every case in :func:`round_order`: one untimed forward
    (the case's code and data warm again after the others ran), then ``args.timed_per_round`` timed
    ones (:func:`timed_wall`). Rounds are numbered across the groups, so the report can keep the
    rounds whose probe ran near the fastest seen. ``walls.json`` is rewritten after every round."""
    import torch

    device = args.device
    data: dict[str, Any] = {"rounds_per_group": args.round_robin, "timed_per_round": args.timed_per_round,
                            "host_probes": [], "cases": [], "notes": []}  # fmt: skip

    def save() -> None:
        data["elapsed_s"] = time.perf_counter() - t_start
        (out / "walls.json").write_text(json.dumps(data, indent=1))

    next_round = 0
    for gi, (role, cases) in enumerate(groups):
        # Each group gets an equal share of what is left of the budget.
        now = time.perf_counter() - t_start
        deadline = now + (args.budget_s - now) / (len(groups) - gi)
        built: list[tuple[dict[str, Any], Phase]] = []
        for case in cases:
            if time.perf_counter() - t_start > deadline:
                data["notes"].append(f"{case['case']}: not built, past the group's share of the budget")
                continue
            raw = case_config(case, args.tiny)
            (out / f"{case['case']}.config.json").write_text(json.dumps(raw, indent=1))
            t0 = time.perf_counter()
            try:
                model, config = build_model(
                    raw, case["dtype"], device, args.weights_on, args.seed, case.get("attn_impl", "sdpa")
                )
                phase = Phase(model, config, case, device)
                for _ in range(2):
                    phase.run(phase.fresh())
                sync(device)
                if device == "cuda" and torch.cuda.mem_get_info()[0] < args.free_gib * 2**30:
                    raise torch.OutOfMemoryError(f"less than {args.free_gib} GiB left")
            except torch.OutOfMemoryError:
                model = config = phase = None
                gc.collect()
                torch.cuda.empty_cache()
                data["notes"].append(f"{case['case']}: skipped, out of device memory with {len(built)} models built")
                log(data["notes"][-1])
                continue
            settings = {k: case[k] for k in ("phase", "batch", "seq_len", "kv_len", "dtype", "layers") if k in case}
            row = {"case": case["case"], "role": role, "preset": case["preset"], "settings": settings,
                   "config_file": f"{case['case']}.config.json", "build_s": time.perf_counter() - t0,
                   "walls": []}  # fmt: skip
            data["cases"].append(row)
            built.append((row, phase))
        log(f"{role}: {len(built)} of {len(cases)} cases built")
        done = 0
        for r in range(args.round_robin if built else 0):
            if time.perf_counter() - t_start > deadline:
                data["notes"].append(f"{role}: stopped after {r} rounds, past the group's share of the budget")
                break
            data["host_probes"].append({"round": next_round, "group": role, "t_s": time.perf_counter() - t_start,
                                        **host_probe(device)})  # fmt: skip
            for i in round_order(len(built), r):
                row, phase = built[i]
                phase.run(phase.fresh())
                sync(device)
                for _ in range(args.timed_per_round):
                    row["walls"].append({"round": next_round, "us": round(timed_wall(phase, device), 1)})
            next_round += 1
            done += 1
            save()
        log(f"{role}: {done} rounds; probe " + ", ".join(
            f"{k} {min(p[k] for p in data['host_probes']):.2f}-{max(p[k] for p in data['host_probes']):.2f}"
            for k in ("launch_us", "python_loop_ns")))  # fmt: skip
        built.clear()
        model = config = phase = None  # type: ignore[assignment]
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    save()
    return data


def measure(case: dict[str, Any], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Measure one case; writes its config, trimmed trace and JSON; returns the JSON."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    name, device = case["case"], args.device
    t_case = time.perf_counter()
    raw = case_config(case, args.tiny)
    cfg_path = out / f"{name}.config.json"
    cfg_path.write_text(json.dumps(raw, indent=1))
    model, config = build_model(raw, case["dtype"], device, args.weights_on, args.seed, case.get("attn_impl", "sdpa"))
    params = sum(p.numel() for p in model.parameters())
    attention = str(model.config._attn_implementation)
    phase = Phase(model, config, case, device)
    settled = settle(phase, args.settle_s, device) if args.settle_s > 0 else None
    walls = timed_walls(phase, args.runs, device)
    clock_after_runs = sm_clock() if device == "cuda" else None

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts, record_shapes=False) as prof, module_ranges(model):
        for i in range(args.runs):
            cache = phase.fresh()
            sync(device)
            with record_function(f"{RUN_RANGE}{i}"):
                phase.run(cache)
                sync(device)
            del cache
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(p))
        trace = json.loads(p.read_text())
    fake = fake_device_events(trace) if device != "cuda" else 0
    runs = split_runs(trace)
    if len(runs) != args.runs or any(r["device_events"] == 0 for r in runs):
        raise RuntimeError(f"profiled runs not found in the trace ({len(runs)} ranges)")
    gpu = [r["gpu_us"] for r in runs]
    med = statistics.median_low(gpu)
    chosen = next(r for r in runs if r["gpu_us"] == med)
    trimmed = trim_to_run(trace, chosen)
    trace_name = f"{name}.trace.json.gz"
    with gzip.open(out / trace_name, "wt", compresslevel=9) as f:
        json.dump(trimmed, f, separators=(",", ":"))
    del trace, trimmed, prof
    measured_s = time.perf_counter() - t_case
    del phase, model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    est = runtime_estimator(cfg_path, case, device) if not args.no_estimator else {"total_us": None, "note": "off"}
    settings = {k: case[k] for k in ("phase", "batch", "seq_len", "kv_len", "dtype", "layers") if k in case}
    result: dict[str, Any] = {
        "case": name,
        "preset": case["preset"],
        "config_file": cfg_path.name,
        "settings": settings,
        "parameters": params,
        "device": gpu_info(device)["name"] if device != "cuda" else torch.cuda.get_device_name(),
        "fake_device": device != "cuda",
        "attention": f"{attention} (HF eager modules)",
        "moe_routing": "the model's own router (unmodified)",
        "weights": {"seed": args.seed, "drawn_on": args.weights_on or device},
        "experts_implementation": str(getattr(config, "_experts_implementation", None)),
        "runs": args.runs,
        "wall_us": stats(walls),
        "gpu_us": stats(gpu),
        "gpu_time_definition": "sum of device activity durations (kernels, memcpy, memset) launched in one run "
        "(opgraph compare's gpu_time)",
        "busy_us": stats([r["busy_us"] for r in runs]),
        "device_events_per_run": [r["device_events"] for r in runs],
        "trace_file": trace_name,
        "trace_run": chosen["index"],
        "trace_gpu_us": chosen["gpu_us"],
        "sm_clock_after_runs": clock_after_runs,
        "settled": settled,
        "runtime_estimator": est,
        "seconds": {"measure": measured_s, "total": time.perf_counter() - t_case},
        "notes": ["CPU smoke data: leaf aten ops stand in for kernels"] if fake else [],
    }
    (out / f"{name}.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="tiny configs (CPU smoke test of the pipeline)")
    ap.add_argument("--runs", type=int, default=9, help="timed runs (and profiled runs) per case, at least 9")
    ap.add_argument("--budget-s", type=float, default=400.0, help="skip cases that would end after this")
    ap.add_argument(
        "--cases",
        default="",
        help=f"comma-separated case names (default: the held-out CASES; {', '.join(CHECKS)} and TRAIN_WALL_CASES "
        "by name)",
    )
    ap.add_argument("--no-estimator", action="store_true", help="skip PyTorch's RuntimeEstimator")
    ap.add_argument(
        "--round-robin",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="walls only, measured in ROUNDS rounds over the cases with a host probe each (walls.json)",
    )
    ap.add_argument("--timed-per-round", type=int, default=2, help="with --round-robin: timed forwards per case")
    ap.add_argument(
        "--train-walls",
        action="store_true",
        help="with --round-robin: the host profile's training walls too (TRAIN_WALL_CASES)",
    )
    ap.add_argument(
        "--settle-s",
        type=float,
        default=0.0,
        help="run each case back to back this long before timing it (the sustained power state; 0: the two "
        "warm-ups only)",
    )
    ap.add_argument("--free-gib", type=float, default=6.0, help="with --round-robin: device memory to keep free")
    ap.add_argument(
        "--seed",
        type=int,
        default=WEIGHT_SEED,
        help="seed of the random weights (another seed: another draw of a random-weight model, its router's too)",
    )
    ap.add_argument(
        "--weights-on",
        choices=("cpu",),
        default=None,
        help="draw the seeded random weights on the CPU, then move them to --device: a CPU capture with the same "
        "seed (opgraph capture --device cpu --seed 0) then routes as the measured model does",
    )
    args = ap.parse_args()
    t_start = time.perf_counter()
    if args.runs < 9 and not args.tiny:
        ap.error("--runs must be at least 9 (the targets are medians of at least 9 runs)")
    if args.round_robin < 0 or args.timed_per_round < 1:
        ap.error("--round-robin must be 0 or more and --timed-per-round at least 1")
    import torch
    import transformers

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: CUDA is not available here (--device): use --device cpu --tiny for a smoke run", file=sys.stderr)
        return 2
    cases = TINY_CASES if args.tiny else CASES
    if args.cases:
        checks = [c for group in CHECKS.values() for c in group]
        known = cases if args.tiny else [*CASES, *checks, *TRAIN_WALL_CASES]
        wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
        unknown = sorted(set(wanted) - {c["case"] for c in known})
        if unknown:
            print(f"error: unknown case(s) {', '.join(unknown)} (--cases)", file=sys.stderr)
            return 2
        cases = [c for c in known if c["case"] in wanted]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "what": "held-out accuracy cases (issue 18): unmodified HF models measured on the device",
        "gpu": gpu_info(args.device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "runs_per_case": args.runs,
        "settle_s": args.settle_s,
        "budget_s": args.budget_s,
        "tiny": args.tiny,
        "cases": [],
    }

    def save() -> None:
        summary["elapsed_s"] = time.perf_counter() - t_start
        (out / "summary.json").write_text(json.dumps(summary, indent=1))

    save()
    if args.round_robin:
        groups = [("heldout", cases)]
        if args.train_walls:
            groups.append(("train", TINY_CASES[:2] if args.tiny else TRAIN_WALL_CASES))
        walls = round_robin_walls(groups, args, out, t_start)
        summary.update(finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), gpu_after=gpu_info(args.device))
        save()
        measured = sum(bool(c["walls"]) for c in walls["cases"])
        rounds = len(walls["host_probes"])
        log(f"done: walls of {measured} cases in {rounds} rounds, {time.perf_counter() - t_start:.0f} s")
        return 0 if measured else 1
    for case in cases:
        elapsed = time.perf_counter() - t_start
        entry: dict[str, Any] = {"case": case["case"], "est_s": case["est_s"]}
        if elapsed + case["est_s"] > args.budget_s:
            entry.update(status="skipped", note=f"over budget ({elapsed:.0f} s used, ~{case['est_s']} s needed)")
            log(f"{case['case']}: skipped, {entry['note']}")
            summary["cases"].append(entry)
            save()
            continue
        log(f"{case['case']}: measuring")
        try:
            res = measure(case, args, out)
            entry.update(
                status="ok",
                gpu_us=res["gpu_us"]["median"],
                wall_us=res["wall_us"]["median"],
                wall_spread=res["wall_us"]["spread"],
                seconds=res["seconds"]["total"],
            )
            log(
                f"{case['case']}: gpu {res['gpu_us']['median'] / 1e3:.3f} ms (spread "
                f"{100 * res['gpu_us']['spread']:.1f}%), wall {res['wall_us']['median'] / 1e3:.3f} ms (spread "
                f"{100 * res['wall_us']['spread']:.1f}%), {res['seconds']['total']:.1f} s; "
                f"RuntimeEstimator {res['runtime_estimator']}"
            )
        except Exception as exc:  # one case failing must not lose the others
            traceback.print_exc()
            entry.update(status="failed", note=f"{type(exc).__name__}: {exc}"[:400])
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
        summary["cases"].append(entry)
        save()
    summary["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    summary["gpu_after"] = gpu_info(args.device)
    save()
    ok = sum(c["status"] == "ok" for c in summary["cases"])
    log(f"done: {ok}/{len(summary['cases'])} cases measured in {time.perf_counter() - t_start:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
