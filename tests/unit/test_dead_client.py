"""shared.db.dead_client_settings: the server settings that end a vanished client's session in about the timeout."""

from __future__ import annotations

import pytest

from shared.db import dead_client_settings


@pytest.mark.parametrize("timeout_s", [5, 6, 10, 60, 61, 300, 3600])
def test_keepalives_give_up_within_the_timeout_and_unacked_data_at_it(timeout_s: float):
    # given a timeout, when the settings are made
    settings = dead_client_settings(timeout_s)

    # then keepalive probes start after `idle` and give up after `count` unanswered ones, about the timeout in all
    idle, interval, count = (
        int(settings[k]) for k in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")
    )
    assert idle >= 1 and interval >= 1 and count == 3
    assert abs(idle + count * interval - timeout_s) <= 1
    # and data the server sent that stays unacknowledged ends the session at the timeout (milliseconds)
    assert int(settings["tcp_user_timeout"]) == timeout_s * 1000


def test_the_default_minute():
    assert dead_client_settings(60) == {
        "tcp_keepalives_idle": "30",
        "tcp_keepalives_interval": "10",
        "tcp_keepalives_count": "3",
        "tcp_user_timeout": "60000",
    }
