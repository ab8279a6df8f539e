"""Typed parameters: one frozen dataclass per method, the single source of its run-config keys.

A method's parameters are declared once, as fields of a :class:`Params` dataclass made with
:func:`param` (default, help, range)::

    @dataclass(frozen=True)
    class LSAParams(Params):
        eta: float = param(0.2, "Step size eta", low=0.0, low_open=True, key="lsa-eta")

From that class come the run-config schema (:meth:`Params.schema`, hetfed/config.py), ``hetfed
config``, pyproject.toml's table (``hetfed config --sync-pyproject``) and the settings every
message carries to the method's clients (:meth:`Params.to_config`); a client rebuilds the typed
object from its message (:meth:`Params.from_config`), so a mistyped name is a mypy error, not a
missing key at round 3.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Self, cast

Value = bool | int | float | str
INT64 = (-(2**63), 2**63 - 1)


class ConfigError(ValueError):
    """A run configuration that cannot run; the message names the key."""


@dataclass(frozen=True)
class Key:
    """One run-config key: default (which fixes its type), range and help."""

    default: Value
    help: str
    choices: Collection[str] | None = None  # a registry's keys view stays current (LOSSES)
    low: float | None = None  # inclusive lower bound
    high: float | None = None  # inclusive upper bound
    low_open: bool = False  # lower bound is exclusive (e.g. a step size > 0)
    names_folder: bool = False  # the value names folders on the server and every silo (check_name)

    @property
    def kind(self) -> type:
        return type(self.default)

    def check(self, name: str, value: Any) -> Value:
        """Return ``value`` converted to this key's type, or raise ConfigError."""
        kind = self.kind
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(
                f"run config '{name}': expected {kind.__name__}, got {type(value).__name__} {value!r}"
            )
        value = cast(Value, value)  # isinstance against a runtime type narrows to object only
        if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
            raise ConfigError(
                f"run config '{name}': {value} does not fit a signed 64-bit integer (Flower's records "
                f"hold [{INT64[0]}, {INT64[1]}])"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"run config '{name}': must be finite, got {value!r}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"run config '{name}': unknown value {value!r}; choose one of {list(self.choices)}"
            )
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            op = ">" if self.low_open else ">="
            raise ConfigError(f"run config '{name}': must be {op} {self.low:g}, got {value!r}")
        if self.high is not None and value > self.high:
            raise ConfigError(f"run config '{name}': must be <= {self.high:g}, got {value!r}")
        if self.names_folder and value:
            check_name(f"run config '{name}'", str(value))
        return value


def check_name(where: str, name: str) -> str:
    """A run name names a results folder and every silo's state folder: 1-200 bytes, no '/' or
    '\\', no control character (a newline), no blank at either end, not starting with '.'."""
    bad = sorted({c for c in name if c in "/\\" or unicodedata.category(c).startswith("C")})
    if len(name.encode()) > 200:
        why = f"{len(name.encode())} bytes (at most 200: it is part of file names)"
    elif bad:
        why = f"characters {''.join(bad)!r} not allowed"
    elif not name.strip():
        why = "empty or blank"
    elif name != name.strip():
        why = "a blank at either end"
    elif name.startswith("."):
        why = "must not start with '.'"
    else:
        return name
    shown = f"{name[:40]!r}{'...' if len(name) > 40 else ''}"
    raise ConfigError(f"{where}: {shown}: {why} (a run name names folders on the server and every silo)")


def param(
    default: Value,
    help: str,
    *,
    choices: Collection[str] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    key: str | None = None,
) -> Any:
    """A :class:`Params` field: its default, help and range, and its run-config name ``key``
    (default: the field's name with ``-`` for ``_``)."""
    spec = Key(default, help, choices, low, high, low_open)
    return field(default=default, metadata={"key": spec, "name": key})


@dataclass(frozen=True)
class Params:
    """Base of a method's parameters; subclasses are frozen dataclasses of :func:`param` fields."""

    def __post_init__(self) -> None:
        """Every field checked against its key (type, range, choices, finiteness), also when the
        object is built directly rather than from a run config."""
        specs = self.schema()
        for attr, key in self.keys().items():
            specs[key].check(key, getattr(self, attr))

    @classmethod
    def keys(cls) -> dict[str, str]:
        """Field name -> run-config key, in declaration order."""
        return {f.name: f.metadata.get("name") or f.name.replace("_", "-") for f in fields(cls)}

    @classmethod
    def schema(cls) -> dict[str, Key]:
        """Run-config key -> :class:`Key` of every field."""
        names = cls.keys()
        return {names[f.name]: f.metadata["key"] for f in fields(cls)}

    @classmethod
    def from_config(cls, values: Mapping[str, Any]) -> Self:
        """The parameters from a run config or a message's ConfigRecord (other keys are ignored;
        a missing key keeps its default; every value is checked against its key)."""
        specs = cls.schema()
        chosen = {
            attr: specs[key].check(key, values[key]) for attr, key in cls.keys().items() if key in values
        }
        return cls(**chosen)

    def to_config(self) -> dict[str, Value]:
        """Run-config key -> value (what a message carries to the method's clients)."""
        return {key: getattr(self, attr) for attr, key in self.keys().items()}
