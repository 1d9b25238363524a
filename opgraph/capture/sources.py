"""Where a model comes from: a shipped preset, a local ``config.json`` or model folder, or a hub id
already in the local Hugging Face cache. Nothing is downloaded; ``trust_remote_code`` is off unless
the caller turns it on.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from opgraph.ir.errors import OpgraphError


class CaptureError(OpgraphError):
    """A model that cannot be found, built or captured as asked."""


class ConfigError(CaptureError):
    """A model config with values transformers rejects or cannot build a model from."""


class LayersError(CaptureError):
    """``layers`` asks for more layers than the model has."""


@dataclass(frozen=True)
class Preset:
    """A shipped model config (shapes from the published ``config.json``; no weights)."""

    name: str
    hf_id: str
    config: dict[str, Any]
    aliases: tuple[str, ...] = ()
    source: str = ""
    note: str = ""

    @property
    def architecture(self) -> str:
        """The transformers class the config names."""
        archs = self.config.get("architectures") or ["?"]
        return str(archs[0])


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: its name, where it came from, and its raw config."""

    name: str
    origin: str
    """``preset``, ``config``, ``folder`` or ``hf-cache``."""
    config: dict[str, Any] = field(repr=False)
    path: str | None = None
    """Folder holding the config (for remote code), when local."""

    @property
    def config_hash(self) -> str:
        """A stable short hash of the config."""
        text = json.dumps(self.config, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@cache
def presets() -> dict[str, Preset]:
    """Every shipped preset by key."""
    out: dict[str, Preset] = {}
    folder = resources.files("opgraph.capture") / "presets"
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if not entry.name.endswith(".json"):
            continue
        data = json.loads(entry.read_text())
        p = Preset(
            name=data["name"],
            hf_id=data["hf_id"],
            config=data["config"],
            aliases=tuple(data.get("aliases", ())),
            source=data.get("source", ""),
            note=data.get("note", ""),
        )
        out[p.name] = p
    return out


def find_preset(name: str) -> Preset | None:
    """The preset called ``name`` (its key, HF id or an alias, case-insensitive)."""
    key = name.strip().lower()
    for p in presets().values():
        if key in (p.name, p.hf_id.lower(), *(a.lower() for a in p.aliases)):
            return p
    return None


def hf_cache_dirs() -> list[Path]:
    """Local Hugging Face hub caches to look in (``HF_HUB_CACHE``, ``HF_HOME/hub``, the default)."""
    dirs: list[Path] = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HUGGINGFACE_HUB_CACHE"):
        dirs.append(Path(os.environ["HUGGINGFACE_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]) / "hub")
    dirs.append(Path.home() / ".cache" / "huggingface" / "hub")
    return dirs


def find_in_hf_cache(hub_id: str) -> Path | None:
    """The snapshot folder with ``config.json`` of ``org/name`` in a local cache, or None."""
    if hub_id.count("/") != 1:
        return None
    repo = "models--" + hub_id.replace("/", "--")
    for base in hf_cache_dirs():
        root = base / repo
        if not root.is_dir():
            continue
        ref = root / "refs" / "main"
        if ref.is_file():
            snap = root / "snapshots" / ref.read_text().strip()
            if (snap / "config.json").is_file():
                return snap
        snaps = sorted((root / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        if snaps:
            return snaps[0].parent
    return None


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise CaptureError(f"cannot read the config: {exc}", where=str(path)) from None
    except json.JSONDecodeError as exc:
        raise CaptureError(f"not valid JSON: {exc.msg} at line {exc.lineno}", where=str(path)) from None
    if not isinstance(data, dict):
        raise CaptureError("a model config must be a JSON object", where=str(path))
    return data


def resolve(model: str) -> ModelSource:
    """Find ``model``: a preset, a ``config.json`` path, a model folder, or a cached hub id."""
    p = find_preset(model)
    if p is not None:
        return ModelSource(p.name, "preset", p.config)
    path = Path(model).expanduser()
    if path.is_file():
        return ModelSource(str(path), "config", _read_config(path), str(path.parent))
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise CaptureError(
                "the folder has no config.json",
                where=str(path),
                hint="give a model folder with a config.json, or the config file itself",
            )
        return ModelSource(str(path), "folder", _read_config(cfg), str(path))
    snap = find_in_hf_cache(model)
    if snap is not None:
        return ModelSource(model, "hf-cache", _read_config(snap / "config.json"), str(snap))
    names = ", ".join(sorted(presets()))
    raise CaptureError(
        f"unknown model {model!r}: not a preset, not a local config.json or model folder, "
        "and not in the local Hugging Face cache (nothing is downloaded)",
        where="MODEL",
        hint=f"presets: {names}; or a path to config.json / a model folder; or a hub id already cached "
        "(e.g. by `huggingface-cli download ORG/NAME config.json`)",
    )


def build_config(source: ModelSource, *, layers: int | None = None, trust_remote_code: bool = False) -> Any:
    """A transformers ``PretrainedConfig`` for the source, cut to ``layers`` layers when given."""
    import transformers

    raw = dict(source.config)
    text_cfg = raw.get("text_config")
    if isinstance(text_cfg, dict) and "model_type" in text_cfg and not _is_causal_lm(raw):
        raw = dict(text_cfg)  # the text decoder of a multimodal checkpoint
    model_type = raw.get("model_type")
    if not model_type:
        raise CaptureError(
            "the config has no model_type", where=source.name, hint="a transformers config.json names its model_type"
        )
    try:
        if trust_remote_code and source.path and raw.get("auto_map"):
            config = transformers.AutoConfig.from_pretrained(source.path, trust_remote_code=True, local_files_only=True)
        else:
            kwargs = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version")}
            config = transformers.AutoConfig.for_model(model_type, **kwargs)
    except Exception as exc:  # transformers' own checks raise ValueError, TypeError or huggingface_hub's errors
        msg = " ".join(str(exc).split())[:300]
        hint = (
            "pass --trust-remote-code for a model with its own code"
            if raw.get("auto_map")
            else "fix the config's values (sizes must be positive, hidden_size a multiple of the heads)"
        )
        raise ConfigError(f"transformers cannot build this config ({msg})", where=source.name, hint=hint) from None
    check_sizes(config, source.name)
    if layers is not None:
        if layers < 1:
            raise CaptureError("must be at least 1", where="--layers")
        total = getattr(config, "num_hidden_layers", None)
        if total is not None and layers > total:
            raise LayersError(
                f"{layers} layers asked for, but {source.name} has {total}",
                where="--layers",
                hint=f"pass --layers {total} or fewer, or leave it out for all {total}",
            )
        if total is not None and layers < total:
            config.num_hidden_layers = layers
            lt = getattr(config, "layer_types", None)
            if isinstance(lt, list):
                config.layer_types = lt[:layers]
    return config


SIZE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
)
"""Config sizes that must be positive integers when present."""


def check_sizes(config: Any, where: str) -> None:
    """Raise :class:`ConfigError` on a size a model cannot be built with (one transformers does not
    reject itself: a negative size, key/value heads that do not divide the query heads)."""
    names: dict[str, str] = dict(getattr(config, "attribute_map", None) or {})

    def key(attr: str) -> str:  # the name in the config file (GPT-2's n_embd for hidden_size)
        return names.get(attr, attr)

    for attr in SIZE_FIELDS:
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise ConfigError(
                f"{key(attr)} must be a positive integer (got {value})",
                where=where,
                hint=f"fix {key(attr)} in the config",
            )
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise ConfigError(
            f"{key('num_attention_heads')} ({heads}) is not a multiple of {key('num_key_value_heads')} ({kv})",
            where=where,
            hint=f"fix {key('num_key_value_heads')} in the config: each key/value head serves a whole group of heads",
        )


def _is_causal_lm(raw: dict[str, Any]) -> bool:
    return any(str(a).endswith("ForCausalLM") for a in raw.get("architectures") or ())
