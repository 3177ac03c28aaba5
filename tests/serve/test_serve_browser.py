"""The explorer page in a real headless browser: Debian's Chromium (installed by
.ci/install-browser.sh) driven by Playwright. The page loads with no request leaving the
server, a typed sentence gets its translation, switching layer / head / kind redraws the
heatmap with other data, hovering a source token highlights what attends to it, and a
screenshot is saved (``explorer.png`` in the test's tmp dir; also to $EXPLORER_SCREENSHOT
when set)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]

if not Path(CHROMIUM).exists():
    if os.environ.get("CI"):  # CI installs it (make test runs .ci/install-browser.sh): missing is a failure
        raise RuntimeError(f"{CHROMIUM} is missing; .ci/install-browser.sh should have installed it")
    pytest.skip(f"{CHROMIUM} not installed (run .ci/install-browser.sh as root)", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture
def page(server, tmp_path):
    """A fresh browser profile and page; every request that does not go to the server is
    blocked and recorded (the page must need nothing from outside)."""
    outside: list[str] = []
    errors: list[str] = []
    host = urlsplit(server.url).netloc
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=ARGS,
            viewport={"width": 1100, "height": 900})
        try:
            def guard(route):
                if urlsplit(route.request.url).netloc == host or route.request.url.startswith("data:"):
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()

            context.route("**/*", guard)
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.set_default_timeout(30_000)
            page.outside, page.errors = outside, errors
            yield page
        finally:
            context.close()


def drawn(page) -> dict:
    """What the heatmap shows: its selection and every cell's weight, read from the DOM."""
    return page.evaluate("""() => {
        const t = document.getElementById("heatmap");
        return {kind: t.dataset.kind, layer: t.dataset.layer, head: t.dataset.head,
                cols: [...t.querySelectorAll("th.col")].map(th => th.textContent),
                rows: [...t.querySelectorAll("th.row")].map(th => th.textContent),
                cells: [...t.querySelectorAll("td")].map(td => td.dataset.w)};
    }""")


def test_explorer_translates_redraws_and_highlights(page, server, translator, sentences, tmp_path):
    text = sentences[1]
    page.goto(server.url + "/")
    assert page.title() == "Transformer explorer"
    page.wait_for_function("document.getElementById('model-info').textContent.includes('layers')")

    page.fill("#source", text)
    page.press("#source", "Enter")
    page.wait_for_selector("#heatmap td")
    want = translator.translate_nbest([text], 3)[0]
    assert page.text_content("#translation") == want[0].text
    assert page.locator("#nbest li").count() == 3

    # at first: cross-attention, layer 1, the heads' average: target rows, source columns
    first = drawn(page)
    assert first["kind"] == "cross" and first["layer"] == "1" and first["head"] == "avg"
    assert first["cols"][-1] == "</s>" and first["rows"][-1] == "</s>"
    assert len(first["cells"]) == len(first["rows"]) * len(first["cols"])

    page.select_option("#layer", value="2")
    second = drawn(page)
    assert second["layer"] == "2" and second["cells"] != first["cells"]

    page.select_option("#head", value="3")
    third = drawn(page)
    assert third["head"] == "3" and third["cells"] != second["cells"]
    maps = server.post("/attention", {"text": text})[1]
    assert third["cells"] == [f"{w:.3f}" for row in maps["cross"][1][2] for w in row]  # layer 2, head 3

    page.check('input[name="kind"][value="encoder"]')
    enc = drawn(page)
    assert enc["kind"] == "encoder" and enc["rows"] == enc["cols"] == first["cols"]

    page.check('input[name="kind"][value="decoder"]')
    dec = drawn(page)
    assert dec["kind"] == "decoder" and dec["rows"] == first["rows"] and dec["cols"][0] == "<s>"

    # hover a source token (cross-attention column): its column is outlined and the target
    # tokens are shaded by how much they attend to it
    page.check('input[name="kind"][value="cross"]')
    page.select_option("#head", value="avg")
    col = 1
    page.hover(f"#heatmap th.col[data-col='{col}']")
    outlined = page.locator("#heatmap td.hover")
    assert outlined.count() == len(first["rows"])
    assert set(page.eval_on_selector_all("#heatmap td.hover", "els => els.map(e => e.dataset.col)")) == {str(col)}
    shaded = page.eval_on_selector_all("#heatmap th.row", "els => els.map(e => e.style.backgroundColor)")
    assert all(shaded), "a target token was not shaded"
    assert first["cols"][col] in page.text_content("#hover-info")

    shot = tmp_path / "explorer.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("EXPLORER_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["EXPLORER_SCREENSHOT"])

    page.mouse.move(0, 0)  # leaving the table clears the highlight
    page.wait_for_function("document.querySelectorAll('#heatmap .hover').length === 0")

    assert page.outside == [], "the page asked for something outside the server"
    assert page.errors == []


def test_explorer_shows_errors_from_the_server(page, server):
    page.goto(server.url + "/")
    page.fill("#source", "a" * 601)  # over the server's --max-chars 600
    page.click("#translate")
    page.wait_for_selector("#status.error")
    assert "600" in page.text_content("#status")
    assert page.outside == []
