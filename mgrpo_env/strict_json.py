"""JSON the way strict readers take it: every file and line the project writes goes through :func:`dumps`.

Python's ``json`` writes a float that is not finite as ``NaN`` / ``Infinity``, which is not JSON: jq,
browsers and ``JSON.parse`` refuse the whole file. The project uses NaN in memory for "not measured"
(a greedy EM with no greedy run, a loss of no step); on disk that is ``null``, and a reader that gets
``None`` back treats it as not measured (``experiments/report.py`` shows ``-``).

    >>> dumps({"em": 0.5, "greedy_em": float("nan"), "loss": [1.0, float("inf")]})
    '{"em": 0.5, "greedy_em": null, "loss": [1.0, null]}'
    >>> loads_strict('{"x": NaN}')
    Traceback (most recent call last):
    ...
    ValueError: not strict JSON: NaN (write null)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["finite", "dumps", "loads_strict"]


def finite(value: Any) -> Any:
    """``value`` with every float that is not finite (NaN, +-inf, numpy's too) replaced by None, through
    dicts, lists and tuples (a tuple comes back a list, as JSON writes it); anything else as it is."""
    if isinstance(value, float):  # numpy's float64 is a float
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return finite(value.item())  # float32 and other numpy scalars that are not Python floats
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` of :func:`finite` (``value``) with ``allow_nan=False``: what it writes is strict
    JSON, or it raises (a non-finite number that a ``default=`` hook returned)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)


def _refuse(constant: str) -> Any:
    raise ValueError(f"not strict JSON: {constant} (write null)")


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses ``NaN``, ``Infinity`` and ``-Infinity`` as strict readers do."""
    return json.loads(text, parse_constant=_refuse)
