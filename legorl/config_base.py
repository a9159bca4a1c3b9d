"""Base class for every config section: strict, documented, failing early.

Each component defines its own section as a `Section` subclass next to its code; field
docstrings become the documentation (`use_attribute_docstrings`), unknown keys are an
error (`extra="forbid"`), so a typo in a TOML file fails at load time with its dotted name.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=False)
