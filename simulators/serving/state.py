"""The server's state that schedulers read and change: waiting queue, running requests, KV reservations."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from simulators.serving.requests import Request

__all__ = ["Live", "Plan", "ServingState"]


@dataclass
class Live:
    """An admitted request and its progress."""

    request: Request
    admitted_s: float
    prefilled: int = 0
    """Prompt tokens in the KV cache."""
    generated: int = 0
    """Output tokens produced."""
    first_token_s: float | None = None

    @property
    def in_prefill(self) -> bool:
        """Prompt tokens remain."""
        return self.prefilled < self.request.prompt_tokens

    @property
    def context(self) -> int:
        """Tokens whose keys a decode of it attends (prompt plus output so far, the new one included)."""
        return self.request.prompt_tokens + self.generated


@dataclass
class Plan:
    """One step: prompt chunks (request, tokens) and the requests that decode one token."""

    prefill: list[tuple[Live, int]] = field(default_factory=list)
    decode: list[Live] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.prefill or self.decode)


@dataclass
class ServingState:
    """What a scheduler sees: the time, the queue, the running set and the KV cache limits."""

    now_s: float
    max_batch: int
    token_budget: int
    kv_capacity_tokens: int
    waiting: deque[Request] = field(default_factory=deque)
    running: list[Live] = field(default_factory=list)
    kv_reserved_tokens: int = 0

    def fits(self, request: Request) -> bool:
        """Whether ``request`` can be admitted now (a batch slot and its whole KV footprint)."""
        return (
            len(self.running) < self.max_batch
            and self.kv_reserved_tokens + request.total_tokens <= self.kv_capacity_tokens
        )

    def admit(self) -> Live:
        """Admit the head of the queue (the caller checked :meth:`fits`)."""
        req = self.waiting.popleft()
        self.kv_reserved_tokens += req.total_tokens
        live = Live(req, self.now_s)
        self.running.append(live)
        return live

    @property
    def kv_used_tokens(self) -> int:
        """Tokens in the cache now."""
        return sum(lv.prefilled + max(0, lv.generated - 1) for lv in self.running)
