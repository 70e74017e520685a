"""An operator using the dashboard: sign in with a token, read a butler's facts grouped by subject, correct a fact,
delete and restore one, promote a rule, filter episodes, search the fleet, and a butler token that sees only its
own scope and cannot edit. Every check waits for the page (polling with a deadline), never sleeps."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait
from sqlalchemy import Engine

from tests.api.conftest import Front, new_token
from tests.api.dashboard_client import events_about
from tests.browser.conftest import SHOTS, WAIT_S
from tests.dashboard_seed import Seeded


def wait(page: Any, condition: Callable[[Any], Any]) -> Any:
    """Poll ``condition`` until truthy; an element replaced while it was read (the page re-renders) is retried."""
    return WebDriverWait(
        page, WAIT_S, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
    ).until(condition)


def css(page: Any, selector: str) -> Any:
    return wait(page, ec.visibility_of_element_located((By.CSS_SELECTOR, selector)))


def sign_in(page: Any, front: Front, token: str, path: str) -> None:
    """Open ``path``: the page sends us to sign in, then back to ``path`` once the token is accepted."""
    page.get(front.base + path)
    css(page, "#token").send_keys(token)
    page.find_element(By.ID, "signin-button").click()
    wait(page, lambda p: p.current_url.endswith(path) and p.execute_script("return document.body.dataset.ready"))
    assert token not in page.current_url


def fact_card(page: Any, fact_id: object) -> Any:
    return css(page, f'.card.fact[data-id="{fact_id}"]')


def test_sign_in_and_see_facts_grouped_by_subject(
    page: Any, dashboard_front: Front, admin_token: str, seeded: Seeded
) -> None:
    sign_in(page, dashboard_front, admin_token, "/butlers/health/memory")
    groups = wait(page, lambda p: p.find_elements(By.CSS_SELECTOR, "#fact-list .group"))
    assert [g.get_attribute("data-subject") for g in groups] == ["dentist", "user"]
    user = page.find_element(By.CSS_SELECTOR, '.group[data-subject="user"]')
    assert "peanuts" in user.text and "grocery" not in page.find_element(By.ID, "fact-list").text  # finance scope
    allergy = fact_card(page, seeded.facts["allergy"])
    assert allergy.find_element(By.CSS_SELECTOR, ".bar span").get_attribute("class") == "green"
    assert "permanent" in allergy.text
    old = fact_card(page, seeded.facts["color_old"])
    assert "superseded" in old.get_attribute("class")
    assert old.find_element(By.CSS_SELECTOR, ".content").value_of_css_property("text-decoration-line") == "line-through"


def test_edit_a_fact_and_see_the_old_one_struck_through(
    page: Any, dashboard_front: Front, admin_token: str, engine: Engine, seeded: Seeded
) -> None:
    sign_in(page, dashboard_front, admin_token, "/butlers/health/memory")
    fact_card(page, seeded.facts["color"]).find_element(By.CSS_SELECTOR, "button.edit").click()
    area = css(page, "#edit-content")
    area.clear()
    area.send_keys("The user's favorite color is teal")
    page.find_element(By.ID, "edit-save").click()
    wait(page, lambda p: "teal" in p.find_element(By.ID, "drawer-content").text)
    chain = page.find_elements(By.CSS_SELECTOR, "#chain li")
    assert len(chain) == 3 and "current" in chain[-1].get_attribute("class")
    assert "fact.stored" in page.find_element(By.ID, "drawer").text
    wait(page, lambda p: "superseded" in fact_card(p, seeded.facts["color"]).get_attribute("class"))
    page.find_element(By.ID, "drawer-close").click()
    wait(
        page,
        lambda p: fact_card(p, seeded.facts["color"]).find_element(By.CSS_SELECTOR, "a.replacement").click() or True,
    )
    wait(page, lambda p: "teal" in p.find_element(By.ID, "drawer-content").text)
    assert [e["event_type"] for e in events_about(engine, seeded.tenant, seeded.facts["color"])][
        -1
    ] == "fact.superseded"


def test_delete_and_restore_a_fact(page: Any, dashboard_front: Front, admin_token: str, seeded: Seeded) -> None:
    sign_in(page, dashboard_front, admin_token, "/butlers/health/memory")
    fact_card(page, seeded.facts["dentist"]).find_element(By.CSS_SELECTOR, "button.delete").click()
    wait(page, ec.invisibility_of_element_located((By.CSS_SELECTOR, f'.card[data-id="{seeded.facts["dentist"]}"]')))
    css(page, "#undo").click()
    assert "dentist" in fact_card(page, seeded.facts["dentist"]).text.lower()


def test_promote_a_rule_and_see_it_move_sections(
    page: Any, dashboard_front: Front, admin_token: str, seeded: Seeded
) -> None:
    sign_in(page, dashboard_front, admin_token, "/butlers/health/memory")
    rule = f'[data-id="{seeded.rules["candidate"]}"]'
    css(page, f"#section-candidate {rule} button.promote").click()
    css(page, f"#section-established {rule}")
    assert not page.find_elements(By.CSS_SELECTOR, f"#section-candidate {rule}")
    anti = css(page, f'#section-anti_pattern [data-id="{seeded.rules["anti"]}"]')
    assert "⚠" in anti.text and not anti.find_element(By.CSS_SELECTOR, "button.promote").is_enabled()


def test_filter_episodes(page: Any, dashboard_front: Front, admin_token: str, seeded: Seeded) -> None:
    sign_in(page, dashboard_front, admin_token, "/butlers/health/memory")
    wait(page, lambda p: len(p.find_elements(By.CSS_SELECTOR, "#episode-list .episode")) == 2)
    Select(page.find_element(By.ID, "e-status")).select_by_value("consolidated")
    page.find_element(By.ID, "e-apply").click()
    css(page, "#episode-list .empty")
    Select(page.find_element(By.ID, "e-status")).select_by_value("pending")
    page.find_element(By.ID, "e-apply").click()
    rows = wait(page, lambda p: p.find_elements(By.CSS_SELECTOR, '#episode-list .episode[data-status="pending"]'))
    assert rows[0].get_attribute("data-id") == str(seeded.episodes["allergy"])  # newest first


def test_search_from_the_knowledge_browser(page: Any, dashboard_front: Front, admin_token: str, seeded: Seeded) -> None:
    sign_in(page, dashboard_front, admin_token, "/memory")
    assert "Facts" in css(page, "#card-facts").text and css(page, "#chart-confidence .chart")
    assert wait(page, lambda p: p.find_elements(By.CSS_SELECTOR, "#activity-list .event"))
    page.find_element(By.ID, "search-q").send_keys("peanut allergy")
    Select(page.find_element(By.ID, "search-type")).select_by_visible_text("fact")
    page.find_element(By.ID, "search-button").click()
    hit = css(page, "#search-results .hit")
    assert hit.get_attribute("data-id") == str(seeded.facts["allergy"])


def test_a_butler_token_sees_only_its_scope_and_cannot_edit(
    page: Any, dashboard_front: Front, engine: Engine, seeded: Seeded
) -> None:
    token = new_token(engine, seeded.tenant, ["health"])
    sign_in(page, dashboard_front, token, "/butlers/health/memory")
    fact_card(page, seeded.facts["allergy"])
    assert not page.find_elements(By.CSS_SELECTOR, "button.edit, button.delete, button.promote")
    assert "read-only" in page.find_element(By.ID, "who").text
    page.get(dashboard_front.base + "/butlers/finance/memory")
    assert "does not cover butler 'finance'" in css(page, "#errors .alert").text
    assert not page.find_elements(By.CSS_SELECTOR, ".card.fact")


def test_narrow_window_and_a_bad_token(page: Any, dashboard_front: Front, admin_token: str, seeded: Seeded) -> None:
    page.set_window_size(420, 800)
    sign_in(page, dashboard_front, admin_token, "/butlers/health/memory")
    facts, playbook = css(page, "#facts"), css(page, "#playbook")
    assert playbook.location["y"] > facts.location["y"]  # one column: the playbook comes under the facts
    page.find_element(By.ID, "sign-out").click()
    css(page, "#token").send_keys("mb_wrong")
    page.find_element(By.ID, "signin-button").click()
    assert "unknown or revoked" in css(page, "#errors .alert").text


def test_screenshots_for_the_docs(page: Any, dashboard_front: Front, admin_token: str, seeded: Seeded) -> None:
    """The three pictures README links (fleet page, butler page, fact drawer); DASHBOARD_DOCS_SHOTS=docs/img
    writes them into the docs, otherwise next to the failure screenshots."""
    out = Path(os.environ.get("DASHBOARD_DOCS_SHOTS", SHOTS / "docs"))
    out.mkdir(parents=True, exist_ok=True)
    sign_in(page, dashboard_front, admin_token, "/memory")
    wait(page, lambda p: p.find_elements(By.CSS_SELECTOR, "#activity-list .event"))
    page.find_element(By.ID, "search-q").send_keys("dentist appointment")
    page.find_element(By.ID, "search-button").click()
    css(page, "#search-results .hit")
    page.save_screenshot(str(out / "dashboard-fleet.png"))
    page.get(dashboard_front.base + "/butlers/health/memory")
    wait(page, lambda p: p.execute_script("return document.body.dataset.ready"))
    fact_card(page, seeded.facts["allergy"])
    page.save_screenshot(str(out / "dashboard-butler.png"))
    fact_card(page, seeded.facts["color"]).click()
    css(page, "#chain li")
    page.save_screenshot(str(out / "dashboard-fact-drawer.png"))
    assert all((out / f"dashboard-{n}.png").stat().st_size > 10_000 for n in ("fleet", "butler", "fact-drawer"))
