"""A component's `options` table, checked against the component's own declaration.

`[harness] options` are the adapter dataclass's fields, `[engine] options` (and
`[warm_start.engine] options`) the fields of the engine's `Options` dataclass. They are
checked when the config loads, from those declarations (no second list to drift from the
code), so `{bogus = 1}` or `{config = 5}` fails at once with its dotted name instead of as
a traceback when the component is built an hour into a run.

`OptionError` carries the option's path relative to its section; `legorl.config` prefixes
the section's own dotted name (`harness`, `warm_start.engine`), so one check serves every
place a section appears.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

_TYPE_ERRORS = ("_type", "_parsing", "from_float", "literal_error", "enum")


class OptionError(ValueError):
    """One bad option: `path` (e.g. `options.bogus`) relative to its section, and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def declared(cls: type, *, supplied: tuple[str, ...] = ()) -> dict[str, Any]:
    """Option name → type hint of a dataclass's init fields, less those in `supplied`
    (set by the component's section itself, e.g. the harness's `model` and `max_turns`)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init and f.name not in supplied}


def type_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _why(err: ValidationError, hint: Any, value: Any) -> str:
    first = err.errors()[0]
    if any(first["type"].endswith(t) or first["type"] == t for t in _TYPE_ERRORS):
        return f"expected {type_name(hint)}, got {type(value).__name__} {value!r}"
    return f"{first['msg'][:1].lower()}{first['msg'][1:]} (got {value!r})"


def check_options(options: Mapping[str, Any], known: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """`options` validated against `known` (name → type hint): the validated values, or
    OptionError naming the first unknown or ill-typed option."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in known:
            listed = ", ".join(sorted(known)) if known else "none"
            raise OptionError(f"options.{key}", f"unknown option for {owner} (known: {listed})")
        try:
            out[key] = TypeAdapter(known[key]).validate_python(value)
        except ValidationError as e:
            raise OptionError(f"options.{key}", _why(e, known[key], value)) from None
    return out
