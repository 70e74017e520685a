"""The longest gap between two firings of a 5-field cron expression: a schedule's period for the
"no run within two periods" alert. Pure; supports what butler.toml's schedules use (``*``, ``*/n``, ``a-b``,
``a-b/n``, lists, numbers; day-of-week 0-7 with 0 and 7 both Sunday)."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache

FIELD_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
# Two months: enough for any daily, weekly or monthly schedule.
HORIZON = timedelta(days=62)
ORIGIN = datetime(2024, 1, 1)  # a Monday; any fixed instant serves


def _field(spec: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in spec.split(","):
        rng, _, step = part.partition("/")
        if rng == "*":
            start, end = low, high
        elif "-" in rng:
            start, end = (int(x) for x in rng.split("-", 1))
        else:
            start = end = int(rng)
            if step:
                end = high
        values.update(range(start, end + 1, int(step) if step else 1))
    return frozenset(values)


@lru_cache(maxsize=64)
def period_seconds(expr: str) -> float:
    """The longest interval between consecutive firings of ``expr`` (cron's day-of-month/day-of-week OR rule)."""
    minute, hour, dom, month, dow = (_field(f, lo, hi) for f, (lo, hi) in zip(expr.split(), FIELD_RANGES))
    dow = frozenset(d % 7 for d in dow)
    dom_any, dow_any = expr.split()[2] == "*", expr.split()[4] == "*"
    firings: list[datetime] = []
    for offset in range(HORIZON.days):  # day by day, then only the hours and minutes that fire
        day = ORIGIN + timedelta(days=offset)
        day_dom, day_dow = day.day in dom, (day.isoweekday() % 7) in dow
        if day.month in month and ((day_dom and day_dow) if (dom_any or dow_any) else (day_dom or day_dow)):
            firings += [day.replace(hour=h, minute=m) for h in sorted(hour) for m in sorted(minute)]
    if len(firings) < 2:
        return HORIZON.total_seconds()
    return max((b - a).total_seconds() for a, b in zip(firings, firings[1:]))
