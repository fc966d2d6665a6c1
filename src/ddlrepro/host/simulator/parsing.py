"""Numbers read from trace and profile files: one check for both, its errors naming where the value came from."""

from __future__ import annotations

import math
from typing import SupportsFloat, SupportsIndex

from ddlrepro.host.errors import UserError


def parse_number(
    value: object, where: str, error: type[UserError], *, minimum: float, above: bool = False, whole: bool = False
) -> float:
    """`value` as a finite float ≥ `minimum` (> it when `above`), whole when `whole`; else `error` naming `where`."""
    if not isinstance(value, str | bytes | SupportsFloat | SupportsIndex):  # float()'s types (of a file's values)
        raise error(f"{where}: {value!r} is not a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise error(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise error(f"{where}: {value!r} is not a finite number")
    if number < minimum or (above and number == minimum):
        raise error(f"{where}: {number:g} is {'not above' if above else 'below'} {minimum:g}")
    if whole and not number.is_integer():
        raise error(f"{where}: {number:g} is not a whole number")
    return number
