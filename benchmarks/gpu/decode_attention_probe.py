"""Where does SDPA decode attention's time leave the profile's points? The decode as transformers runs it (one
query per sequence, the KV cache contiguous, ``enable_gqa``) measured exactly as the profile sweep measures its
points (``validators.profile.run_profile``: cold L2, the kernels timer), over cache lengths of a power of two
and one more (a decode right after a prefill of N tokens attends over N + 1 keys) and over every batch from
1 to 32, for a Llama-8B layout (32 query heads, 8 KV heads of 128) and a Qwen2.5-7B one (28 of 4).

Run on the GPU machine: ``python3 benchmarks/gpu/decode_attention_probe.py OUT`` writes ``OUT/probe.profile.json``
(the points, with the sweep's provenance) and prints microseconds per case.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LAYOUTS = {"llama8b": (32, 8, 128), "qwen25_7b": (28, 4, 128)}
BATCHES = (1, 2, 4, 8, 16, 32)
LENGTHS = (512, 1024, 2048, 8192)


def points() -> list[object]:
    """The probe's sweep points: every layout x batch x (N, N + 1) for N in :data:`LENGTHS`."""
    from validators.profile import SweepPoint, _attention

    out = []
    for name, heads in LAYOUTS.items():
        for b in BATCHES:
            for n in LENGTHS:
                for kv in (n, n + 1):
                    op = _attention(b, 1, kv, heads, causal=False, window=None)
                    out.append(SweepPoint(op, f"probe.decode.{name}.b{b}", 0, (0,)))
    return out


def main() -> None:
    from validators.profile import run_profile

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    prof = run_profile(out / "probe.profile.json", "cuda", points=points(), hardware="h100-sxm")  # type: ignore[arg-type]
    for p in prof.points:
        op = p.op
        print(f"{p.seconds * 1e6:8.1f} us  b{op.batch} kv{op.kv_len} h{op.heads}/{op.kv_heads} d{op.head_dim}")


if __name__ == "__main__":
    main()
