"""Requests of a served workload: the model, a trace reader (JSONL/CSV) and a seeded Poisson generator.

Bad input is an error on one line that names the file, line and field (negative arrival times,
lengths below 1, missing columns); nothing is skipped silently.

>>> reqs = poisson_workload(rate=2.0, num_requests=3, prompt_len=LengthDist.parse("128"),
...                         output_len=LengthDist.parse("16..32"), seed=0)
>>> [r.prompt_tokens for r in reqs], all(16 <= r.output_tokens <= 32 for r in reqs)
([128, 128, 128], True)
"""

from __future__ import annotations

import csv
import json
import math
import random
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError

from opgraph.ir import OpgraphError
from opgraph.ir.tensor import FrozenModel

__all__ = ["MAX_ARRIVAL_S", "MAX_TOKENS", "LengthDist", "Request", "WorkloadError", "load_trace", "poisson_workload"]

MAX_ARRIVAL_S = 1e9
"""Latest arrival time in seconds (about 32 years): later, float64 times lose the sub-microsecond
resolution step durations need, and latencies come out 0."""
MAX_TOKENS = 100_000_000
"""Most tokens in a prompt or an output (ten times the longest context windows shipped today)."""


class WorkloadError(OpgraphError):
    """A request trace or workload setting is malformed."""


class Request(FrozenModel):
    """One request: when it arrives, its prompt and how many tokens it generates."""

    id: Annotated[int, Field(ge=0)]
    """Position in the workload (arrival order)."""
    arrival_s: Annotated[float, Field(ge=0, le=MAX_ARRIVAL_S, allow_inf_nan=False)]
    """Arrival time in seconds from the start of the run (at most :data:`MAX_ARRIVAL_S`)."""
    prompt_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    """Prompt length in tokens."""
    output_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    """Tokens to generate (the first comes out of the prefill)."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus output: the KV-cache footprint when it finishes."""
        return self.prompt_tokens + self.output_tokens


_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")


def _request(i: int, row: dict[str, object], where: str) -> Request:
    missing = [f for f in _FIELDS if f not in row or row[f] in (None, "")]
    if missing:
        raise WorkloadError(
            f"missing {', '.join(missing)}", where=where, hint=f"each request needs {', '.join(_FIELDS)}"
        )
    try:
        values = {
            "arrival_s": float(str(row["arrival_s"])),
            "prompt_tokens": row["prompt_tokens"],
            "output_tokens": row["output_tokens"],
        }
        for f in ("prompt_tokens", "output_tokens"):
            text = str(values[f])
            values[f] = int(float(text)) if re.fullmatch(r"-?\d+(\.0*)?", text) else text
        return Request.model_validate({"id": i, **values})
    except ValueError as exc:
        if isinstance(exc, ValidationError):
            err = exc.errors()[0]
            field = str(err["loc"][0]) if err["loc"] else "request"
            bad = err.get("input")
            limit = (err.get("ctx") or {}).get("ge", (err.get("ctx") or {}).get("le"))
            what = {
                "greater_than_equal": f"must be at least {limit}",
                "less_than_equal": f"must be at most {limit:g}"
                if isinstance(limit, float)
                else f"must be at most {limit}",
                "finite_number": "must be a finite number",
            }.get(err["type"], "must be a number")
            raise WorkloadError(f"{field} {what} (got {bad!r})", where=where) from None
        raise WorkloadError(f"arrival_s must be a number (got {row['arrival_s']!r})", where=where) from None


def load_trace(path: Path) -> list[Request]:
    """Requests from a JSONL (one object a line) or CSV (header row) file with ``arrival_s``,
    ``prompt_tokens`` and ``output_tokens``; sorted by arrival (ties keep file order)."""
    if not path.is_file():
        raise WorkloadError("no such file", where=str(path), hint="give a .jsonl or .csv request trace")
    rows: list[tuple[dict[str, object], str]] = []
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise WorkloadError(
            "not a text file (a graph, image or compressed file?)",
            where=str(path),
            hint="give a .jsonl or .csv request trace with arrival_s, prompt_tokens, output_tokens",
        ) from None
    except OSError as exc:
        raise WorkloadError(f"cannot be read ({exc.strerror or exc})", where=str(path)) from None
    if "\0" in text:
        raise WorkloadError("not a text file (it holds NUL bytes)", where=str(path), hint="give a .jsonl or .csv trace")
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        for n, row in enumerate(reader, start=2):
            rows.append(({k.strip(): (v or "").strip() for k, v in row.items() if k}, f"{path}:{n}"))
    else:
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(
                    f"not JSON ({exc.msg})", where=f"{path}:{n}", hint="one JSON object per line"
                ) from None
            if not isinstance(obj, dict):
                raise WorkloadError("not a JSON object", where=f"{path}:{n}")
            rows.append((obj, f"{path}:{n}"))
    if not rows:
        raise WorkloadError("the trace holds no requests", where=str(path))
    reqs = [_request(i, row, where) for i, (row, where) in enumerate(rows)]
    order = sorted(range(len(reqs)), key=lambda i: (reqs[i].arrival_s, i))
    return [reqs[j].model_copy(update={"id": i}) for i, j in enumerate(order)]


class LengthDist(FrozenModel):
    """A token-length distribution: ``N`` (fixed), ``LO..HI`` (uniform) or ``exp:MEAN`` (geometric, at least 1)."""

    kind: str
    """``fixed``, ``uniform`` or ``exp``."""
    low: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    """The value (fixed), the low end (uniform) or the mean (exp)."""
    high: Annotated[int, Field(ge=1, le=MAX_TOKENS)]
    """The high end (uniform); equal to ``low`` otherwise."""

    @property
    def largest(self) -> int | None:
        """The longest length it gives (``None`` for ``exp``, which has no bound below :data:`MAX_TOKENS`)."""
        return None if self.kind == "exp" else self.high

    @classmethod
    def parse(cls, text: str, where: str = "length") -> LengthDist:
        """Parse ``512``, ``128..1024`` or ``exp:256``."""
        t = text.strip()
        try:
            if m := re.fullmatch(r"(\d+)\s*\.\.\s*(\d+)", t):
                lo, hi = int(m.group(1)), int(m.group(2))
                if lo < 1 or hi < lo:
                    raise ValueError
                return cls(kind="uniform", low=lo, high=hi)
            if m := re.fullmatch(r"exp:(\d+)", t):
                return cls(kind="exp", low=int(m.group(1)), high=int(m.group(1)))
            return cls(kind="fixed", low=int(t), high=int(t))
        except (ValueError, ValidationError):
            raise WorkloadError(
                f"bad token length {text!r}",
                where=where,
                hint=f"give N, LOW..HIGH or exp:MEAN with values of 1 to {MAX_TOKENS}",
            ) from None

    def sample(self, rng: random.Random) -> int:
        """One length drawn with ``rng``."""
        if self.kind == "uniform":
            return rng.randint(self.low, self.high)
        if self.kind == "exp":
            return min(MAX_TOKENS, max(1, round(rng.expovariate(1.0 / self.low))))
        return self.low


def poisson_workload(
    *, rate: float, num_requests: int, prompt_len: LengthDist, output_len: LengthDist, seed: int = 0
) -> list[Request]:
    """``num_requests`` requests arriving as a Poisson process of ``rate`` per second (seeded)."""
    if not (rate > 0 and math.isfinite(rate)):
        raise WorkloadError(f"the arrival rate must be positive (got {rate})", where="--poisson")
    if num_requests < 1:
        raise WorkloadError(f"need at least one request (got {num_requests})", where="--num-requests")
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(num_requests):
        t += rng.expovariate(rate)
        if t > MAX_ARRIVAL_S:
            raise WorkloadError(
                f"{num_requests} arrivals at {rate:g}/s run past {MAX_ARRIVAL_S:g} s",
                where="--poisson",
                hint="give a higher rate or fewer requests",
            )
        out.append(
            Request(id=i, arrival_s=t, prompt_tokens=prompt_len.sample(rng), output_tokens=output_len.sample(rng))
        )
    return out
