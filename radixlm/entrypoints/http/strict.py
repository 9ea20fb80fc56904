"""The base of every request model: strict JSON types, finite floats."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A request model whose types are not coerced: a string is never a number or a
    boolean, a boolean never an integer, and floats are finite. A subclass's own
    `model_config` adds to this one (pydantic merges them)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False)
