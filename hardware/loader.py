"""Finding a :class:`HardwareSpec`: the built-in catalog by name or alias, or a user's TOML/JSON file.

A user file is a TOML (or JSON) table with the fields of :class:`HardwareSpec`; rates and sizes may
carry units (``memory_bandwidth = "3.35 TB/s"``). ``base = "h100"`` starts from a catalog entry and
overrides only the fields the file gives, for studies of hypothetical devices. A calibrated cost
table (``opgraph calibrate``) carries the spec it was measured on, so its JSON loads here too.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hardware.spec import HardwareSpec
from opgraph.ir import LoadError, OpgraphError, check_schema_version, read_json_bytes

HARDWARE_SUFFIXES = (".toml", ".json", ".gz")
"""File suffixes that :func:`load_hardware` reads as files rather than catalog names."""

_VENDOR_PREFIXES = ("nvidia-", "amd-", "intel-", "geforce-")


class UnknownHardwareError(OpgraphError):
    """A hardware name that is neither in the catalog nor a file."""


def normalize_name(name: str) -> str:
    """The catalog key form of a name: lower case, ``-`` for spaces and ``_``, no vendor prefix."""
    key = "-".join(name.strip().lower().replace("_", " ").split())
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            key = key[len(prefix) :]
    return key


def _format_validation(exc: ValidationError) -> str:
    """Pydantic errors as ``field.path: message (got value)``, up to three, with a did-you-mean."""
    parts = []
    errors = exc.errors()
    fields = set(HardwareSpec.model_fields)
    for err in errors[:3]:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "missing":
            msg = "missing required field"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field"
            known = fields
            if len(err["loc"]) == 2 and str(err["loc"][0]) in HardwareSpec.model_fields:
                sub = HardwareSpec.model_fields[str(err["loc"][0])].annotation
                known = set(getattr(sub, "model_fields", {}))
            guess = difflib.get_close_matches(str(err["loc"][-1]), sorted(known), n=1)
            if guess and len(err["loc"]) <= 2:
                msg += f" (did you mean {guess[0]!r}?)"
        value = err.get("input")
        shown = ""
        if isinstance(value, float):
            shown = f" (got {value:g})"
        elif err["type"] not in ("missing", "extra_forbidden") and (
            isinstance(value, (int, str, bool)) or value is None
        ):
            shown = f" (got {value!r})"[:70]
        parts.append(f"{loc}: {msg}{shown}")
    more = f"; and {len(errors) - 3} more" if len(errors) > 3 else ""
    return "; ".join(parts) + more


def _read_table(path: Path) -> dict[str, Any]:
    """The raw table of a TOML or JSON file; one-line :class:`LoadError` on every failure."""
    if not path.exists():
        raise LoadError("no such hardware file", where=str(path))
    if path.suffix == ".toml":
        try:
            data: object = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise LoadError(f"not valid TOML: {exc}", where=str(path)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise LoadError(f"cannot read: {exc}", where=str(path)) from None
    else:
        raw = read_json_bytes(path)
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise LoadError(f"not valid JSON: {exc}", where=str(path)) from None
    if not isinstance(data, dict):
        raise LoadError(f"expected a table of hardware fields, got {type(data).__name__}", where=str(path))
    return data


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def spec_from_table(
    data: dict[str, Any], where: str, *, default_name: str = "", root: Path | None = None
) -> HardwareSpec:
    """Validate a raw table into a :class:`HardwareSpec`, resolving ``base = NAME`` first.

    ``profile = FILE`` names the device's measured profile, relative to ``root`` (the folder of the
    TOML); it is registered for the spec (:func:`hardware.profile.hardware_profile`), not a field of it.
    ``host_profile = FILE`` names the host profile of the CPU that measured it, the same way
    (:func:`hardware.hostprofile.hardware_host_profile`).
    Errors name ``where`` (the file) and the field at fault; a ``schema_version`` newer than this
    opgraph reads is refused (:func:`opgraph.ir.check_schema_version`), and a table without one, as
    users write them, reads as version 1.
    """
    check_schema_version(data, HardwareSpec, where)
    data = dict(data)
    profile = data.pop("profile", None)
    if profile is not None and (not isinstance(profile, str) or not profile.strip()):
        raise LoadError(f"profile: expected a file name, got {profile!r}", where=where)
    host_profile = data.pop("host_profile", None)
    if host_profile is not None and (not isinstance(host_profile, str) or not host_profile.strip()):
        raise LoadError(f"host_profile: expected a file name, got {host_profile!r}", where=where)
    base_name = data.pop("base", None)
    if base_name is not None:
        if not isinstance(base_name, str):
            raise LoadError(f"base: expected a catalog name, got {base_name!r}", where=where)
        try:
            base = catalog_spec(base_name)
        except UnknownHardwareError as exc:
            raise LoadError(f"base: {exc.message}", where=where, hint=exc.hint) from None
        inherited = base.model_dump(mode="json", exclude={"aliases"})
        inherited["sources"] = [*inherited["sources"], f"derived from catalog entry {base.name!r} by {where}"]
        own_name = data.get("name")
        if "description" not in data:
            data["description"] = f"{base.description}, changed by {where}"
        data = _merge(inherited, data)
        # A derived device must not pass for the catalog entry it started from.
        data["name"] = own_name or default_name or f"{base.name}-custom"
    elif "name" not in data and default_name:
        data["name"] = default_name
    try:
        spec = HardwareSpec.model_validate(data)
    except ValidationError as exc:
        raise LoadError(_format_validation(exc), where=where) from None
    if profile is not None:
        register_hardware_profile(spec.name, _relative(profile, root))
    if host_profile is not None:
        register_host_profile(spec.name, _relative(host_profile, root))
    return spec


def _relative(name: str, root: Path | None) -> Path:
    path = Path(name.strip())
    return root / path if not path.is_absolute() and root is not None else path


_PROFILES: dict[str, Path] = {}
"""Device name (normalised) to the profile file its TOML names."""


def register_hardware_profile(hw_name: str, path: str | Path) -> None:
    """Make ``path`` the measured profile of the device named ``hw_name`` (``profile = ...`` in a TOML does it)."""
    _PROFILES[normalize_name(hw_name)] = Path(path)


def named_profile(hw_name: str) -> Path | None:
    """The profile file registered for the device named ``hw_name``, or ``None``."""
    return _PROFILES.get(normalize_name(hw_name))


_HOST_PROFILES: dict[str, Path] = {}
"""Device name (normalised) to the host profile file its TOML names."""


def register_host_profile(hw_name: str, path: str | Path) -> None:
    """Make ``path`` the host profile of the device named ``hw_name`` (``host_profile = ...`` in a TOML)."""
    _HOST_PROFILES[normalize_name(hw_name)] = Path(path)


def named_host_profile(hw_name: str) -> Path | None:
    """The host profile file registered for the device named ``hw_name``, or ``None``."""
    return _HOST_PROFILES.get(normalize_name(hw_name))


def load_hardware_file(path: str | Path) -> HardwareSpec:
    """A :class:`HardwareSpec` from a TOML/JSON file, the spec inside a calibrated cost table, or the
    catalog device a device profile (``opgraph profile``) was measured on."""
    p = Path(path)
    data = _read_table(p)
    if data.get("format") == "opgraph.cost_table" or "entries" in data:
        hw = data.get("hardware")
        if not isinstance(hw, dict):
            raise LoadError(
                "this cost table carries no hardware spec",
                where=str(p),
                hint="give --hardware NAME as well, or re-run `opgraph calibrate`",
            )
        return spec_from_table(hw, f"{p} (hardware)")
    if data.get("format") == "opgraph.device_profile":
        device = data.get("device")
        hw_name = device.get("hardware") if isinstance(device, dict) else None
        if not isinstance(hw_name, str) or not hw_name:
            raise LoadError(
                "this device profile names no catalog device",
                where=str(p),
                hint="give --hardware NAME (the device it was measured on) and -c with the profile",
            )
        try:
            return catalog_spec(hw_name)
        except UnknownHardwareError as exc:
            raise LoadError(f"the profile's device: {exc.message}", where=str(p), hint=exc.hint) from None
    name = p.name.split(".")[0]
    return spec_from_table(data, str(p), default_name=name, root=p.parent)


def _catalog_files() -> list[tuple[str, str]]:
    """(file name, text) of every catalog TOML."""
    root = resources.files("hardware.catalog")
    return sorted(
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in root.iterdir()
        if entry.name.endswith(".toml") and entry.is_file()
    )


def _catalog_root() -> Path | None:
    """The catalog folder on disk (where its profile files lie), when the package is a folder."""
    root = Path(str(resources.files("hardware.catalog")))
    return root if root.is_dir() else None


@lru_cache(maxsize=1)
def _catalog() -> tuple[tuple[HardwareSpec, ...], dict[str, HardwareSpec]]:
    specs: list[HardwareSpec] = []
    index: dict[str, HardwareSpec] = {}
    for filename, text in _catalog_files():
        where = f"hardware/catalog/{filename}"
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise LoadError(f"not valid TOML: {exc}", where=where) from None
        spec = spec_from_table(data, where, root=_catalog_root())
        for key in (spec.name, *spec.aliases):
            norm = normalize_name(key)
            if norm in index:
                raise LoadError(f"name or alias {key!r} is also used by {index[norm].name!r}", where=where)
            index[norm] = spec
        specs.append(spec)
    return tuple(sorted(specs, key=lambda s: s.name)), index


def list_hardware() -> list[HardwareSpec]:
    """Every device of the built-in catalog, sorted by name."""
    return list(_catalog()[0])


def catalog_spec(name: str) -> HardwareSpec:
    """The catalog entry for ``name`` or one of its aliases (case-insensitive)."""
    specs, index = _catalog()
    key = normalize_name(name)
    if key in index:
        return index[key]
    names = [s.name for s in specs]
    guess = difflib.get_close_matches(key, list(index), n=1, cutoff=0.6)
    hint = f"did you mean {index[guess[0]].name!r}? " if guess else ""
    raise UnknownHardwareError(
        f"unknown hardware {name!r}",
        hint=f"{hint}catalog: {', '.join(names)}; or give a .toml/.json file (`opgraph hardware list`)",
    )


def _looks_like_path(text: str) -> bool:
    return text.endswith(HARDWARE_SUFFIXES) or "/" in text or "\\" in text


def load_hardware(name_or_path: str | Path) -> HardwareSpec:
    """A device by catalog name or alias (``h100`` -> ``h100-sxm``), or from a user ``.toml``/``.json`` file.

    Raises :class:`UnknownHardwareError` (listing the catalog) for an unknown name and
    :class:`~opgraph.ir.LoadError` naming the file and the field for a bad file.

    Examples
    --------
    >>> load_hardware("H100").name
    'h100-sxm'
    >>> round(load_hardware("h100").memory_bandwidth / 1e12, 2)
    3.35
    """
    if isinstance(name_or_path, Path) or _looks_like_path(name_or_path):
        return load_hardware_file(name_or_path)
    try:
        return catalog_spec(name_or_path)
    except UnknownHardwareError:
        if Path(name_or_path).is_file():  # a file without a telling suffix
            return load_hardware_file(name_or_path)
        raise
