"""DATABASE_READ_URL and [butler.replicas]: one or more replica URLs, refused clearly when malformed."""

from __future__ import annotations

import pytest

from shared.config import ConfigError, load_settings

PRIMARY = "postgresql://memory:secret@db:5432/butler_memory"


def test_no_read_url_means_every_read_goes_to_the_primary():
    assert load_settings(database_url=PRIMARY).read_urls == ()


def test_one_or_more_replicas_comma_separated():
    settings = load_settings(
        database_url=PRIMARY,
        database_read_url=(
            "postgresql://memory:secret@replica-1:5432/butler_memory, postgres://memory:secret@replica-2/butler_memory"
        ),
    )
    assert settings.read_urls == (
        "postgresql://memory:secret@replica-1:5432/butler_memory",
        "postgres://memory:secret@replica-2/butler_memory",
    )


def test_the_environment_variable_is_read(monkeypatch):
    monkeypatch.setenv("DATABASE_READ_URL", "postgresql://r1/db,postgresql://r2/db")
    assert load_settings().read_urls == ("postgresql://r1/db", "postgresql://r2/db")


@pytest.mark.parametrize("value", ["mysql://u:secret@h/db", "postgresql://r1/db,redis://r2", " , "])
def test_a_bad_read_url_names_the_key_and_hides_the_password(value):
    with pytest.raises(ConfigError) as caught:
        load_settings(database_url=PRIMARY, database_read_url=value)
    assert "database_read_url" in str(caught.value)
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize("key,value", [("max_lag_seconds", 0), ("check_interval_seconds", 0.001)])
def test_replica_bounds_are_checked(key, value):
    with pytest.raises(ConfigError, match=f"replicas.{key}"):
        load_settings(replicas={key: value})
