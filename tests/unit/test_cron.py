"""shared.cron.period_seconds: a schedule's longest gap between firings, for the skipped-schedule alert."""

from shared.cron import period_seconds


def test_the_default_schedules():
    assert period_seconds("0 */6 * * *") == 6 * 3600  # consolidation
    assert period_seconds("0 3 * * *") == 24 * 3600  # decay sweep
    assert period_seconds("*/5 * * * *") == 300


def test_uneven_schedules_take_their_longest_gap():
    assert period_seconds("0 9,17 * * *") == 16 * 3600  # 17:00 -> 09:00
    assert period_seconds("30 2 * * 1-5") == 3 * 24 * 3600  # Friday -> Monday
    assert period_seconds("0 4 * * 0") == period_seconds("0 4 * * 7") == 7 * 24 * 3600  # 0 and 7 are Sunday


def test_day_of_month_and_day_of_week_combine_as_cron_does():
    # both restricted: either matches (the 1st of the month or any Monday)
    assert period_seconds("0 0 1 * 1") <= 7 * 24 * 3600
    assert period_seconds("0 0 1 * *") == 31 * 24 * 3600
