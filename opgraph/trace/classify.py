"""Kernel classification: type, stage vote and layer-start marker of every device event."""

from __future__ import annotations

from collections import defaultdict

from opgraph.trace.events import GpuEvent
from opgraph.trace.patterns import KernelType, PatternSet

_MEMORY = KernelType.MEMORY


class KernelClassifier:
    """Classifies kernel names with a :class:`PatternSet`, caching the answer per distinct name."""

    def __init__(self, patterns: PatternSet) -> None:
        self.patterns = patterns
        self._cache: dict[str, tuple[KernelType, KernelType | None, str | None, bool, bool]] = {}
        self._mla: dict[str, bool] = {}

    def is_mla(self, name: str) -> bool:
        """The kernel belongs to multi-head latent attention (cached per name)."""
        hit = self._mla.get(name)
        if hit is None:
            hit = self._mla[name] = self.patterns.is_mla(name)
        return hit

    def lookup(self, name: str) -> tuple[KernelType, KernelType | None, str | None, bool, bool]:
        """(type, type outside layers, stage vote, extra layer-start marker, extra FFN marker) of a name."""
        hit = self._cache.get(name)
        if hit is None:
            ps = self.patterns
            kt, outside = ps.kernel_type(name)
            hit = (
                kt,
                outside,
                ps.stage_vote(name),
                ps.is_layer_start(name),
                ps.is_ffn(name),
            )
            self._cache[name] = hit
        return hit

    def outside_type(self, name: str) -> KernelType | None:
        """The type a kernel takes when it lies outside every layer, if its rule gives one."""
        return self.lookup(name)[1]

    def is_ffn(self, name: str) -> bool:
        """An extra FFN marker from ``[layers] ffn``."""
        return self.lookup(name)[4]

    def classify(self, gpu: list[GpuEvent]) -> None:
        """Set ``ktype``, ``vote`` and ``layer_start`` on every event (sorted by start time)."""
        for ev in gpu:
            if ev.kind != "kernel":
                ev.ktype = _MEMORY
                continue
            kt, _, vote, start, _ = self.lookup(ev.name)
            ev.ktype = kt
            ev.vote = vote
            ev.layer_start = start
        if self.patterns.sequences:
            by_stream: dict[tuple[int, int], list[GpuEvent]] = defaultdict(list)
            for ev in gpu:
                if ev.kind == "kernel":
                    by_stream[(ev.device, ev.stream)].append(ev)
            for kernels in by_stream.values():
                self._sequences(kernels)

    def _sequences(self, kernels: list[GpuEvent]) -> None:
        match_cache: dict[tuple[int, int, str], bool] = {}

        def hit(r: int, s: int, name: str) -> bool:
            key = (r, s, name)
            v = match_cache.get(key)
            if v is None:
                v = self.patterns.sequences[r].steps[s].search(name) is not None
                match_cache[key] = v
            return v

        n = len(kernels)
        i = 0
        while i < n:
            matched = 0
            for r, rule in enumerate(self.patterns.sequences):
                if not hit(r, 0, kernels[i].name):
                    continue
                j = i + 1
                ok = True
                for s in range(1, len(rule.steps)):
                    if j < n and hit(r, s, kernels[j].name):
                        j += 1
                    elif not rule.optional[s]:
                        ok = False
                        break
                if ok:
                    for ev in kernels[i:j]:
                        ev.ktype = rule.ktype
                    if rule.layer_start:
                        kernels[i].layer_start = True
                    matched = j - i
                    break
            i += matched or 1
