"""Checks for numbers that come from outside (command line, environment), written once.

Owns: turning operator text into a finite, bounded number, or a ValueError whose message
says what was wrong ("must be a finite number ..., got 'nan'"). Callers wrap the error in
their own type (argparse's ArgumentTypeError, ConfigError) and add the setting's name.

Why bounded as well as finite: NaN compares false with everything (a deadline that is NaN
is never reached, a loop waiting on it spins), infinity and huge values overflow the
C timeouts behind threading and sockets (OverflowError), and 0 or a negative count of
workers or an interval of 0 turns a periodic task into a busy loop or a crash.
"""

from __future__ import annotations

import math

# Above this, time.monotonic() + value and threading's timeouts stop being safe
# (threading.TIMEOUT_MAX is about 9.2e9 on 64-bit Linux); 10**9 s is over 31 years.
MAX_SECONDS = 1e9


def finite_number(value: str | float, *, allow_zero: bool = False,
                  maximum: float = MAX_SECONDS) -> float:
    """`value` as a float that is finite, > 0 (or >= 0 with allow_zero) and <= maximum."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"not a number: {value!r}") from None
    floor = "at least 0" if allow_zero else "greater than 0"
    if not math.isfinite(number) or number < 0 or (number == 0 and not allow_zero):
        raise ValueError(f"must be a finite number {floor}, got {value!r}")
    if number > maximum:
        raise ValueError(f"must be at most {maximum:g}, got {value!r}")
    return number


def positive_int(value: str | int, *, allow_zero: bool = False,
                 maximum: int = 10**6) -> int:
    """`value` as an int that is > 0 (or >= 0 with allow_zero) and <= maximum."""
    if isinstance(value, bool):
        raise ValueError(f"not an integer: {value!r}")
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"not an integer: {value!r}") from None
    if number < 0 or (number == 0 and not allow_zero):
        floor = "at least 0" if allow_zero else "at least 1"
        raise ValueError(f"must be {floor}, got {value!r}")
    if number > maximum:
        raise ValueError(f"must be at most {maximum}, got {value!r}")
    return number
