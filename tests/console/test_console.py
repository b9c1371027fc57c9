"""The operator console in a real headless browser: Debian's chromium driven by Playwright (never a downloaded
browser), against the live server with the real model and database.

Sign in, open a session, pick a message, see the closure and the cost, confirm, read the receipt, see the message
gone; a wrong key is refused; another tenant's session stays unreachable; every console response carries the CSP, and
no page logs an error (a CSP violation would). Set LETHE_CONSOLE_SCREENSHOTS=docs/console to refresh the README's
screenshots (scripts/console-screenshots.sh).
"""

from __future__ import annotations

import os
import re
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from app.console.routes import STATIC
from tests.conftest import LiveServer
from tests.support import BOOTSTRAP_KEY, ROOT

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
VIEWPORT = {"width": 1440, "height": 900}
JOB_TIMEOUT_MS = 240_000  # a replay of two short turns; generous for a loaded 2-core machine


@pytest.fixture(scope="module")
def browser(other_tenant_key: str) -> Iterator[Browser]:
    # Playwright's sync API keeps an event loop running in this thread while the browser is open, so fixtures that
    # call asyncio.run (the second tenant's key) must be made before it starts.
    if not CHROMIUM.exists():
        pytest.fail("the console tests need Debian's chromium at /usr/bin/chromium: apt-get install -y chromium "
                    "(Playwright drives it; no browser is ever downloaded)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        yield launched
        launched.close()


class Tab:
    """A fresh browser context (its own sessionStorage) that records every page error and console error/warning."""

    def __init__(self, browser: Browser, base_url: str) -> None:
        self.context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
        self.context.set_default_timeout(30_000)
        self.page: Page = self.context.new_page()
        self.base_url = base_url
        self.problems: list[str] = []
        self.page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        self.page.on("console", lambda m: self.problems.append(f"{m.type}: {m.text}")
                     if m.type in ("error", "warning") else None)

    def open(self, fragment: str = "") -> Any:
        return self.page.goto(f"{self.base_url}/console/{fragment}")

    def sign_in(self, key: str) -> None:
        self.open()
        self.page.fill("#api-key", key)
        self.page.click("#sign-in")

    def unexpected(self, *allowed_statuses: int) -> list[str]:
        """Logged problems other than the browser's note about an HTTP status the test provoked on purpose."""
        allowed = [f"status of {status}" for status in allowed_statuses]
        return [p for p in self.problems if not any(a in p for a in allowed)]

    def shot(self, name: str, *, full_page: bool = False) -> None:
        folder = os.environ.get("LETHE_CONSOLE_SCREENSHOTS")
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=full_page)


@pytest.fixture
def tab(browser: Browser, live_server: LiveServer) -> Iterator[Tab]:
    opened = Tab(browser, live_server.base_url)
    yield opened
    opened.context.close()


def make_session(client: httpx.Client, turns: list[str], **create: Any) -> str:
    body = {"system_prompt": "You are a helpful assistant.",
            "sampling": {"temperature": 0, "max_tokens": 6, "seed": 11}, **create}
    r = client.post("/v1/sessions", json=body)
    assert r.status_code == 201, r.text
    sid: str = r.json()["id"]
    for text in turns:
        r = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [{"type": "user", "content": text}]})
        assert r.status_code == 200, r.text
    return sid


def test_console_files_carry_a_strict_policy(anon: httpx.Client) -> None:
    for path in ("/console/", "/console/js/app.js", "/console/console.css", "/console/favicon.svg"):
        r = anon.get(path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "script-src 'self';" in csp and "style-src 'self';" in csp
        assert "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
    assert anon.get("/console/js/app.js").headers["content-type"].startswith("text/javascript")
    assert anon.get("/console", follow_redirects=False).headers["location"] == "/console/"
    for outside in ("/console/../main.py", "/console/%2e%2e/routes.py", "/console/js", "/console/nope.js"):
        assert anon.get(outside).status_code == 404, outside
    # No inline script or style in any page, no HTML parsing of strings in the scripts, nothing from elsewhere.
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html) and "<style" not in html and "style=" not in html
    for script in STATIC.rglob("*.js"):
        code = script.read_text()
        assert "innerHTML" not in code and "eval(" not in code and "http://" not in code.replace(
            "http://www.w3.org/2000/svg", ""), script
    # Every file ships in a non-editable install: the package-data globs cover them all.
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["app.console"]
    assert all(any(f.relative_to(STATIC.parent).match(g) for g in globs) for f in STATIC.rglob("*") if f.is_file())


def test_forget_a_message_from_the_console(tab: Tab, client: httpx.Client) -> None:
    ns = "console-" + uuid.uuid4().hex[:8]
    for key, value in (("diet", "vegetarian"), ("city", "Lyon")):
        r = client.put(f"/v1/memory/{ns}/{key}", json={"value": value}, headers={"If-None-Match": "*"})
        assert r.status_code == 201, r.text
    assert client.delete(f"/v1/memory/{ns}/city").status_code == 200
    sid = make_session(client, ["My dog is called Rex.", "I live in Paris.", "What is my dog's name?"],
                       memory_namespace=ns)
    artifacts = client.get(f"/v1/sessions/{sid}/artifacts").json()["artifacts"]
    message = next(a for a in artifacts if a["content"] == "My dog is called Rex.")
    closure = {a["id"] for a in client.get(f"/v1/sessions/{sid}/artifacts/{message['id']}/descendants").json()[
        "artifacts"]}

    response = tab.open()
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    page = tab.page
    page.fill("#api-key", BOOTSTRAP_KEY)
    page.click("#sign-in")
    page.wait_for_selector(f"#sessions-table a[href='#/sessions/{sid}']")
    assert page.evaluate("sessionStorage.getItem('lethe.apiKey')") == BOOTSTRAP_KEY
    tab.shot("sessions")

    page.click(f"a[href='#/sessions/{sid}']")
    page.wait_for_selector(".node")
    assert page.locator(".node").count() == len(artifacts)
    page.click(f".node[data-id='{message['id']}']")
    page.click("#preview")
    summary = page.wait_for_selector("#plan-summary")
    assert summary is not None and "τ = 1" in summary.inner_text()
    assert page.locator(".node.target").get_attribute("data-id") == message["id"]
    highlighted = {page.locator(".node.closure").nth(i).get_attribute("data-id")
                   for i in range(page.locator(".node.closure").count())}
    assert highlighted | {message["id"]} == closure
    assert page.locator("#trace li").count() == len(closure)
    assert re.search(r"selective replay\s*\d+ tokens", page.inner_text("#plan"))
    assert re.search(r"full reset\s*\d+ tokens", page.inner_text("#plan"))
    tab.shot("plan")

    page.select_option("#strategy", "selective_replay")
    page.click("#confirm")
    page.wait_for_selector("#receipt", timeout=JOB_TIMEOUT_MS)
    receipt = page.inner_text("#receipt")
    assert "succeeded" in receipt
    before, after = page.inner_text(".sha-before"), page.inner_text(".sha-after")
    assert re.fullmatch(r"[0-9a-f]{64}", before) and re.fullmatch(r"[0-9a-f]{64}", after) and before != after
    assert page.inner_text("td.replayed") == "3"
    tab.shot("receipt", full_page=True)

    page.wait_for_selector(f".node[data-id='{artifacts[-1]['id']}']", state="detached")
    page.click("#tab-transcript")
    transcript = page.inner_text("#transcript")
    assert "My dog is called Rex." not in transcript and "I live in Paris." in transcript
    assert page.locator(f".msg[data-id='{message['id']}']").count() == 0
    tab.shot("transcript")

    page.click("a[data-nav='jobs']")
    page.wait_for_selector("#jobs-table")
    page.wait_for_selector("#cost-chart svg.chart circle")
    tab.shot("jobs", full_page=True)

    page.goto(f"{tab.base_url}/console/#/memory/{ns}/city")
    page.wait_for_selector("#history")
    assert "Lyon" not in page.inner_text("main") and "tombstone" in page.inner_text("#history")
    assert "forgotten" in page.inner_text("#keys")
    tab.shot("memory")
    page.click("a[data-nav='webhooks']")
    page.wait_for_selector("h1:has-text('Detector-webhook deliveries')")
    assert tab.unexpected() == []


def test_a_wrong_key_is_refused(tab: Tab) -> None:
    tab.sign_in("not-a-key-of-anyone")
    error = tab.page.wait_for_selector("#login-error")
    assert error is not None and "401" in error.inner_text()
    assert tab.page.evaluate("sessionStorage.getItem('lethe.apiKey')") is None
    assert tab.page.locator("#nav").is_hidden()
    assert tab.unexpected(401) == []


def test_another_tenants_session_is_not_reachable(tab: Tab, client: httpx.Client, other_tenant_key: str) -> None:
    sid = make_session(client, [])
    tab.sign_in(other_tenant_key)
    tab.page.wait_for_selector("h1:has-text('Sessions')")
    assert sid not in tab.page.inner_text("main")
    tab.page.goto(f"{tab.base_url}/console/#/sessions/{sid}")
    alert = tab.page.wait_for_selector("[role=alert]")
    assert alert is not None and "404" in alert.inner_text()
    assert tab.page.locator(".node").count() == 0
    assert tab.unexpected(404) == []


def test_a_memory_record_plan_shows_the_other_sessions_it_reaches(tab: Tab, client: httpx.Client) -> None:
    ns = "console-cascade-" + uuid.uuid4().hex[:8]
    r = client.put(f"/v1/memory/{ns}/pet", json={"value": "a cat named Tom"}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text
    first, second = (make_session(client, [], memory_namespace=ns) for _ in range(2))
    record = next(a for a in client.get(f"/v1/sessions/{first}/artifacts").json()["artifacts"] if a["kind"] == "memory")
    tab.sign_in(BOOTSTRAP_KEY)
    tab.page.wait_for_selector("#sessions-table")
    tab.page.goto(f"{tab.base_url}/console/#/sessions/{first}")
    tab.page.click(f".node[data-id='{record['id']}']")
    tab.page.select_option("#target-kind", "memory")
    tab.page.click("#preview")
    tab.page.wait_for_selector("#other-sessions")
    assert second in tab.page.inner_text("#other-sessions")
    assert f"{ns}/pet" in tab.page.inner_text("#plan")
    assert client.get(f"/v1/memory/{ns}/pet").status_code == 200  # a plan changes nothing
    assert tab.unexpected() == []


def test_the_graph_draws_hundreds_of_artifacts_with_zoom_and_pan(tab: Tab, client: httpx.Client) -> None:
    sid = make_session(client, [])
    for turn in range(6):  # observations only: no model call, so 300 artifacts cost a few requests
        inputs = [{"type": "document", "content": f"note {turn}.{i}"} for i in range(50)]
        r = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": inputs, "generate": False})
        assert r.status_code == 200, r.text
    count = len(client.get(f"/v1/sessions/{sid}/artifacts").json()["artifacts"])
    assert count > 300
    tab.sign_in(BOOTSTRAP_KEY)
    tab.page.wait_for_selector("#sessions-table")
    tab.page.goto(f"{tab.base_url}/console/#/sessions/{sid}")
    tab.page.wait_for_selector(f".node >> nth={count - 1}", state="attached")
    assert tab.page.locator(".node").count() == count
    fitted = tab.page.get_attribute("g.world", "transform")
    box = tab.page.locator("svg.graph").bounding_box()
    assert box is not None
    tab.page.mouse.move(box["x"] + 300, box["y"] + 200)
    for _ in range(4):
        tab.page.mouse.wheel(0, -200)
    zoomed = tab.page.get_attribute("g.world", "transform")
    tab.page.mouse.down()
    tab.page.mouse.move(box["x"] + 500, box["y"] + 400, steps=8)
    tab.page.mouse.up()
    panned = tab.page.get_attribute("g.world", "transform")
    assert fitted and zoomed and panned and len({fitted, zoomed, panned}) == 3
    assert zoomed.split("scale(")[1] == panned.split("scale(")[1]  # a drag moves, it does not zoom
    tab.shot("graph-large")
    assert tab.unexpected() == []


def test_a_text_span_selected_in_the_transcript_is_planned(tab: Tab, client: httpx.Client) -> None:
    sid = make_session(client, ["My locker code is 4417 and I like tea."])
    tab.sign_in(BOOTSTRAP_KEY)
    tab.page.wait_for_selector("#sessions-table")
    tab.page.goto(f"{tab.base_url}/console/#/sessions/{sid}")
    tab.page.wait_for_selector(".node")
    tab.page.click("#tab-transcript")
    message = tab.page.locator(".msg.kind-user .content", has_text="4417")
    # Select "4417" inside the message the way a drag would, then release the mouse over the transcript.
    message.evaluate("""el => {
        const node = el.firstChild, at = node.textContent.indexOf("4417");
        const range = document.createRange();
        range.setStart(node, at);
        range.setEnd(node, at + 4);
        const selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        el.dispatchEvent(new MouseEvent("mouseup", {bubbles: true}));
    }""")
    assert tab.page.input_value("#target-kind") == "text" and tab.page.input_value("#target-text") == "4417"
    tab.page.click("#preview")
    summary = tab.page.wait_for_selector("#plan-summary")
    assert summary is not None and "τ = 1" in summary.inner_text()
    assert tab.page.locator(".msg.target").count() == 1
    assert tab.unexpected() == []


def test_a_subject_is_exported_held_and_erased_from_the_console(tab: Tab, client: httpx.Client) -> None:
    subject, ns = "console-" + uuid.uuid4().hex[:8], "subj-" + uuid.uuid4().hex[:8]
    sid = make_session(client, ["My order number is 5521."], subject_id=subject)
    r = client.put(f"/v1/memory/{ns}/order", json={"value": "5521", "source": "user"}, headers={"If-None-Match": "*"})
    assert r.status_code == 201, r.text
    assert client.put(f"/v1/subjects/{subject}", json={"memory_namespaces": [ns]}).status_code == 200
    tab.sign_in(BOOTSTRAP_KEY)
    page = tab.page
    page.click('a[data-nav="subjects"]')
    page.fill("#subject-id", subject)
    page.click("#subject-form button[type=submit]")
    assert sid in page.inner_text("#subject-sessions") and ns in page.inner_text("#subject-namespaces")

    page.click("#export")
    assert page.inner_text("#export-summary").startswith("1 session(s), 3 artifact(s), 1 memory value(s)")

    page.fill("#hold-reason", "case 2026-9")
    page.click("#place-hold")
    page.wait_for_selector("#holds")
    [hold] = client.get(f"/v1/subjects/{subject}").json()["holds"]
    assert hold["subject_id"] == subject and hold["reason"] == "case 2026-9"
    page.click("#plan-erase")
    assert "2 part(s)" in page.inner_text("#plan-held")  # the session and the namespace, both under the hold
    page.click("#confirm-erase")
    assert hold["id"] in page.inner_text("#subject-status .error")  # 409 legal_hold, naming the hold
    assert client.get(f"/v1/sessions/{sid}").status_code == 200

    page.click(f"#release-{hold['id']}")
    page.wait_for_selector("#no-holds")
    page.click("#plan-erase")
    page.click("#confirm-erase")
    assert "1 session(s) and 1 memory key(s) erased" in page.inner_text("#erase-receipt")
    assert client.get(f"/v1/sessions/{sid}").status_code == 404
    assert tab.unexpected(409) == []
