"""Five-field cron schedules (`minute hour day-of-month month day-of-week`) in a time zone.

Owns: parsing (`Cron.parse`, ValueError naming the bad field), matching, and finding the
next start after / the last start at or before a moment (`next_after`, `last_at_or_before`),
for maintenance windows and drift budget windows. Syntax: `*`, numbers, `a-b` ranges,
`/step` on `*` or a range, comma lists; month and day-of-week names (jan, mon; any case);
day-of-week 0-7 with 0 and 7 both Sunday. As in Vixie cron, when both day-of-month and
day-of-week are restricted, a day matching either one matches. Times are seconds since the
epoch; the fields are read in `timezone` (an IANA name, `UTC` by default), so a window at
02:00 Europe/Berlin follows daylight saving time.

Written here instead of depending on `croniter`: the launcher needs only these two searches
over five plain fields, and one small pure module is easier to keep correct and dependency
free than a general library (seconds fields, hashing, and its own DST rules we do not want).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass

_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, lowest, highest, names starting at `lowest`)
_FIELDS = (("minute", 0, 59, ()), ("hour", 0, 23, ()), ("day-of-month", 1, 31, ()),
           ("month", 1, 12, _MONTHS), ("day-of-week", 0, 7, _DAYS))
# How far the searches look: a schedule such as "0 0 30 2 *" never matches.
SEARCH_DAYS = 366 * 5


def zone(name: str) -> dt.tzinfo:
    """The tzinfo for an IANA name (ValueError if unknown); UTC needs no tz database."""
    if name.upper() == "UTC":
        return dt.timezone.utc
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as UTC or"
                         " Europe/Berlin)") from None


def _number(text: str, low: int, high: int, names: tuple[str, ...], field: str) -> int:
    lowered = text.lower()
    if lowered in names:
        return low + names.index(lowered)
    if not text.isdigit():
        raise ValueError(f"{field}: {text!r} is not a number"
                         + (f" or a name ({', '.join(names)})" if names else ""))
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{field}: {value} is outside {low}-{high}")
    return value


def _field(text: str, field: str, low: int, high: int, names: tuple[str, ...]) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise ValueError(f"{field}: empty list item in {text!r}")
        base, _, step_text = part.partition("/")
        step = 1
        if step_text:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"{field}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start = _number(first, low, high, names, field)
            end = _number(last, low, high, names, field)
            if start > end:
                raise ValueError(f"{field}: range {base!r} runs backwards")
        else:
            start = end = _number(base, low, high, names, field)
            if step_text:
                end = high
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # day-of-month is `*`
    any_weekday: bool  # day-of-week is `*`
    tz: dt.tzinfo

    @classmethod
    def parse(cls, text: str, timezone: str = "UTC") -> "Cron":
        parts = text.split()
        if len(parts) != 5:
            raise ValueError(f"expected 5 fields (minute hour day-of-month month day-of-week),"
                             f" got {len(parts)} in {text!r}")
        sets = [_field(part, name, low, high, names)
                for part, (name, low, high, names) in zip(parts, _FIELDS)]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(text, sets[0], sets[1], sets[2], sets[3], weekdays,
                   parts[2].startswith("*"), parts[4].startswith("*"), zone(timezone))

    def _day_matches(self, day: dt.date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days
        in_week = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_month and in_week
        return in_month or in_week

    def _starts_on(self, day: dt.date) -> list[float]:
        """Epoch seconds of every match on a local calendar day, ascending."""
        out = []
        for hour in sorted(self.hours):
            for minute in sorted(self.minutes):
                local = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=self.tz)
                out.append(local.timestamp())
        return sorted(out)

    def next_after(self, now: float) -> float | None:
        """The first start strictly after `now` (None if none within SEARCH_DAYS)."""
        day = dt.datetime.fromtimestamp(now, self.tz).date()
        for offset in range(SEARCH_DAYS):
            current = day + dt.timedelta(days=offset)
            if self._day_matches(current):
                for start in self._starts_on(current):
                    if start > now:
                        return start
        return None

    def last_at_or_before(self, now: float) -> float | None:
        """The latest start at or before `now` (None if none within SEARCH_DAYS)."""
        day = dt.datetime.fromtimestamp(now, self.tz).date()
        for offset in range(SEARCH_DAYS):
            current = day - dt.timedelta(days=offset)
            if self._day_matches(current):
                for start in reversed(self._starts_on(current)):
                    if start <= now:
                        return start
        return None


def parse_duration(value: object) -> float:
    """Seconds from a number or a text such as `90`, `45m`, `2h`, `1d`, `1h30m`."""
    if isinstance(value, bool):
        raise ValueError(f"expected seconds or a duration like '2h', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text, seconds, number = value.strip().lower(), 0.0, ""
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        if not text:
            raise ValueError("empty duration")
        for char in text:
            if char.isdigit() or char == ".":
                number += char
            elif char in units and number:
                seconds += float(number) * units[char]
                number = ""
            else:
                raise ValueError(f"{value!r} is not a duration (like 90, '45m', '2h', '1h30m')")
        if number:
            seconds += float(number)
    else:
        raise ValueError(f"expected seconds or a duration like '2h', got {value!r}")
    if not seconds > 0 or seconds != seconds:
        raise ValueError(f"a duration must be more than 0 seconds, got {value!r}")
    return seconds
