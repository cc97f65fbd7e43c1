"""Numbers from the command line and the environment: finite, in range, or a usage error.

Why: a bound that an option or a variable can switch off is no bound.
``float("inf")``, ``float("nan")`` and ``1e309`` all parse, and a check such as
``value <= 0`` lets ``nan`` and ``inf`` through: a deadline of ``inf`` waits
forever, a size of ``nan`` compares false with everything.  Every number
dsv4patch takes from a user goes through :func:`parse_number` (an option's
argparse type is ``commands._common.number(...)``, an environment variable's
reader ``settings.Settings.from_environ``): it must be finite and between its bounds, and a
whole number where one is meant; anything else names the option or variable,
the range and an example.
"""

from __future__ import annotations

import math

from dsv4patch.errors import ParameterError


def parse_number(raw: str, *, what: str, low: float, high: float, low_inclusive: bool = False,
                 integer: bool = False, example: str = "") -> float:
    """``raw`` as a finite number with ``low < value <= high`` (``low <= value`` with ``low_inclusive``).

    ``integer``: a whole number (``3``, not ``3.5``); returned as a float that
    is integral (``int(...)`` it).  Anything else raises :class:`ParameterError`
    naming ``what``.
    """
    text = raw.strip()
    try:
        value = float(int(text)) if integer else float(text)
    except (ValueError, OverflowError):
        value = math.nan
    op = "<=" if low_inclusive else "<"
    ok = math.isfinite(value) and (low <= value if low_inclusive else low < value) and value <= high
    if not ok:
        kind = "a whole number" if integer else "a finite number"
        hint = f" (e.g. {example})" if example else ""
        raise ParameterError(f"{what}={raw!r}: must be {kind} with {low:g} {op} value <= {high:g}{hint}")
    return value
