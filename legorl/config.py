"""TOML → validated config.

Each component owns its section model (a `config_base.Section` next to its code); this
module only reads TOML and turns pydantic's errors into one line per problem with the
field's dotted name and what was expected, so a typo fails at load time, not an hour into
a run.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from legorl.options import OptionError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names every bad field."""


def format_errors(err: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        cause = (e.get("ctx") or {}).get("error")
        if isinstance(cause, OptionError):  # a component's option: its own dotted name under the section
            lines.append(f"  {where}.{cause.path}: {cause.reason}" if e["loc"] else f"  {cause}")
        elif e["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown field")
        elif e["type"] == "missing":
            lines.append(f"  {where}: required field is missing")
        else:
            lines.append(f"  {where}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a config file (e.g. {path}/quickstart.toml)") from None
    except PermissionError:
        raise ConfigError(f"{path}: config file not readable (permission denied)") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 ({e.reason})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None


def validate(model: type[M], data: dict, source: str = "config") -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_errors(e, source)) from None


def load(model: type[M], path: Path) -> M:
    """Read `path` and validate it against `model`."""
    return validate(model, read_toml(path), str(path))
