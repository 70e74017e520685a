"""The dashboard in a real browser: the real front (uvicorn in this process, as the API tests run it) on the real
database, and Debian's headless Chromium driven through chromedriver by Selenium.

Every process started here (chromedriver and its Chromium) is stopped at the end of the session; a failing test
saves a screenshot to ``bench-out/browser/<test>.png`` (override with BROWSER_SCREENSHOTS).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from shared.config import Settings, load_settings
from tests.api.conftest import Front, new_tenant, new_token
from tests.dashboard_seed import Seeded, seed

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("BROWSER_SCREENSHOTS", ROOT / "bench-out" / "browser"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", shutil.which("chromedriver") or "/usr/bin/chromedriver")
WAIT_S = 15


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} is missing: run `bash deploy/dev.sh install` as root (installs chromium, chromium-driver)"
    return None


@pytest.fixture(scope="session")
def browser_settings(database_url: str, redis_url: str) -> Settings:
    return load_settings(database_url=database_url, redis_url=redis_url)


@pytest.fixture(scope="session")
def dashboard_front(browser_settings: Settings) -> Iterator[Front]:
    with Front(browser_settings) as running:
        yield running


@pytest.fixture(scope="session")
def driver() -> Iterator[object]:
    """One headless Chromium for the session (a new one costs ~1 s); each test starts from a blank tab."""
    missing = _missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,800",
        "--disable-extensions",
        "--no-first-run",
    ):
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()  # ends Chromium, then chromedriver


@pytest.fixture()
def page(driver: object, dashboard_front: Front) -> Iterator[object]:
    """The session's browser at 1280x800, signed out (sessionStorage is per tab: clear it)."""
    driver.set_window_size(1280, 800)  # type: ignore[attr-defined]
    driver.get(dashboard_front.base + "/static/app.css")  # type: ignore[attr-defined]
    driver.execute_script("sessionStorage.clear()")  # type: ignore[attr-defined]
    yield driver


@pytest.fixture()
def seeded(engine: Engine, browser_settings: Settings) -> Seeded:
    return seed(engine, new_tenant(engine), browser_settings)


@pytest.fixture()
def admin_token(engine: Engine, seeded: Seeded) -> str:
    return new_token(engine, seeded.tenant, ["*"], role="admin")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On a failed test body, save what the browser showed."""
    outcome = yield
    report = outcome.get_result()
    browser = item.funcargs.get("page") if hasattr(item, "funcargs") else None
    if report.when == "call" and report.failed and browser is not None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"{item.name}.png"
        try:
            browser.save_screenshot(str(path))
            report.sections.append(("screenshot", str(path)))
        except Exception:  # noqa: BLE001 - a dead browser must not hide the real failure
            pass
