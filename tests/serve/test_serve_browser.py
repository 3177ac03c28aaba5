"""The explorer page in a real headless browser: Debian's Chromium (installed by
.ci/install-browser.sh) driven by Playwright. The page loads with no request leaving the
server, a typed sentence gets its translation, switching layer / head / kind redraws the
heatmap with other data, hovering a source token highlights what attends to it, and a
screenshot is saved (``explorer.png`` in the test's tmp dir; also to $EXPLORER_SCREENSHOT
when set). With a language model the page switches to generation: a typed prompt's
continuation arrives token by token, then its causal self-attention, where hovering a token
shades what it attends to (``generation.png``; also to $GENERATION_SCREENSHOT). Behind a
token, the address ``transformer serve`` prints (``/#token=...``) opens a working page that
drops the token from the address bar; without it, the page asks for the token in a field."""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
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


@contextmanager
def browser_page(server, profile: Path):
    """A fresh browser profile and page; every request that does not go to ``server`` is
    blocked and recorded (the page must need nothing from outside)."""
    outside: list[str] = []
    errors: list[str] = []
    dialogs: list[str] = []
    host = urlsplit(server.url).netloc
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=ARGS,
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
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.set_default_timeout(30_000)
            page.outside, page.errors, page.dialogs = outside, errors, dialogs
            yield page
        finally:
            context.close()


@pytest.fixture
def page(server, tmp_path):
    """The page of the translation server."""
    with browser_page(server, tmp_path / "profile") as page:
        yield page


@pytest.fixture
def lm_page(lm_server, tmp_path):
    """The page of the language-model server."""
    with browser_page(lm_server, tmp_path / "profile") as page:
        yield page


@pytest.fixture
def token_page(token_server, tmp_path):
    """A page of the translation server that wants a token, in a fresh profile (no token stored)."""
    with browser_page(token_server, tmp_path / "profile") as page:
        yield page


@pytest.fixture
def lm_token_page(lm_token_server, tmp_path):
    with browser_page(lm_token_server, tmp_path / "profile") as page:
        yield page


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


def test_explorer_draws_the_lens_and_the_head_map(page, server, sentences, tmp_path):
    """Beside the attention: the lens of the translation (a row per layer, the embeddings too,
    a cell per position holding its top token), then, asked for, every head's effect per kind,
    patched in from a corrupted sentence; a bad token is said in the view, in one line."""
    text, corrupt = sentences[9], "the dog sees the man"
    page.goto(server.url + "/")
    page.fill("#source", text)
    page.press("#source", "Enter")
    page.wait_for_selector("#lens-grid td")
    lens = server.post("/lens", {"text": text, "top": 3})[1]
    cells = page.eval_on_selector_all("#lens-grid td", "els => els.map(e => [e.dataset.row, e.textContent, "
                                                       "e.dataset.p])")
    assert len(cells) == len(lens["layers"]) * len(lens["positions"])
    want = {(str(r), t): (lens["top"][r][t][0][0], f"{lens['final_choice_prob'][r][t]:.3f}")
            for r in range(len(lens["layers"])) for t in range(len(lens["positions"]))}
    columns = len(lens["positions"])
    assert [tuple(c[1:]) for c in cells] == [want[(c[0], i % columns)] for i, c in enumerate(cells)]
    assert cells[0][0] == str(len(lens["layers"]) - 1)  # the last layer on top

    page.fill("#heads-corrupt", corrupt)
    page.click("#measure-heads")
    page.wait_for_selector(".head-map td")
    heads = server.post("/heads", {"text": text, "corrupt": corrupt})[1]
    shown = page.eval_on_selector_all(".head-map", "ts => ts.map(t => [t.dataset.kind, "
                                                   "[...t.querySelectorAll('td')].map(td => td.dataset.effect)])")
    assert shown == [[k["kind"], [f"{v:.3f}" for row in k["effects"] for v in row]] for k in heads["kinds"]]
    assert len(shown) == 3 and "patched" not in page.text_content("#heads-info")
    assert heads["score"] in page.text_content("#heads-info")
    page.screenshot(path=str(tmp_path / "inspect.png"), full_page=True)
    if os.environ.get("INSPECT_SCREENSHOT"):
        shutil.copyfile(tmp_path / "inspect.png", os.environ["INSPECT_SCREENSHOT"])

    page.fill("#heads-token", "qqqqzzzz")
    page.click("#measure-heads")
    page.wait_for_selector("#heads-info.error")
    assert page.text_content("#heads-info") == server.post("/heads", {"text": text, "token": "qqqqzzzz",
                                                                      "corrupt": corrupt})[1]["error"]
    assert page.locator(".head-map").count() == 0
    assert page.outside == []


def test_explorer_shows_errors_from_the_server(page, server):
    page.goto(server.url + "/")
    page.fill("#source", "a" * 601)  # over the server's --max-chars 600
    page.click("#translate")
    page.wait_for_selector("#status.error")
    assert "600" in page.text_content("#status")
    assert page.outside == []


def lm_drawn(page) -> dict:
    """What the generation mode's attention shows, read from the DOM."""
    return page.evaluate("""() => {
        const t = document.getElementById("lm-heatmap");
        return {layer: t.dataset.layer, head: t.dataset.head,
                tokens: [...document.querySelectorAll("#lm-tokens .tok")].map(s => s.textContent),
                rows: [...t.querySelectorAll("th.row")].map(th => th.textContent),
                cells: [...t.querySelectorAll("td")].map(td => td.dataset.w)};
    }""")


def test_generation_mode_streams_a_continuation_and_draws_its_attention(lm_page, lm_server, tmp_path):
    page = lm_page
    page.goto(lm_server.url + "/")
    page.wait_for_function("document.getElementById('model-info').textContent.includes('language model')")
    assert page.is_hidden("#translate-form") and page.is_visible("#generate-form")

    prompt = "the cat"
    page.fill("#prompt", prompt)
    page.fill("#max-new-tokens", "20")
    page.fill("#seed", "")  # the server picks one and says which
    page.press("#prompt", "Enter")
    page.wait_for_selector("#lm-heatmap td")
    done = page.evaluate("window.generation.state.done")
    assert done["tokens"] == 20
    assert page.evaluate("window.generation.state.events") == 20  # one server-sent event per token, each shown
    assert page.text_content("#prompt-text") == prompt
    assert page.text_content("#continuation") == done["text"]
    assert f"seed {done['seed']}" in page.text_content("#status")
    # the same as the JSON API gives for that seed
    code, plain = lm_server.post("/generate", {"prompt": prompt, "max_new_tokens": 20, "seed": done["seed"],
                                               "temperature": 1.0, "top_k": 0, "top_p": 1.0})
    assert code == 200 and plain["text"] == done["text"]

    # the attention of prompt + continuation: layer 1, heads' average, one row and column per token
    text = prompt + done["text"]
    first = lm_drawn(page)
    visible = [c.replace(" ", "\u2423").replace("\n", "\u21b5") for c in text]
    assert first["layer"] == "1" and first["head"] == "avg"
    assert first["tokens"] == visible and first["rows"] == visible
    assert len(first["cells"]) == len(text) ** 2
    page.select_option("#lm-layer", value="2")
    page.select_option("#lm-head", value="2")
    second = lm_drawn(page)
    assert second["layer"] == "2" and second["head"] == "2" and second["cells"] != first["cells"]
    maps = lm_server.post("/attention", {"text": text})[1]
    assert second["cells"] == [f"{w:.3f}" for row in maps["self_attention"][1][1] for w in row]

    # hover a token: it is outlined, its row in the grid is marked, the tokens up to it are
    # shaded by how much it attends to them, and the later ones are not (causal)
    i = 10
    page.hover(f"#lm-tokens .tok[data-i='{i}']")
    shades = page.eval_on_selector_all("#lm-tokens .tok", "els => els.map(e => e.style.backgroundColor)")
    assert all(shades[: i + 1]) and not any(shades[i + 1:])
    assert page.eval_on_selector_all("#lm-tokens .tok.focus", "els => els.map(e => e.dataset.i)") == [str(i)]
    marked = page.eval_on_selector_all("#lm-heatmap td.hover", "els => els.map(e => e.dataset.row)")
    assert marked == [str(i)] * len(text)
    assert visible[i] in page.text_content("#lm-hover-info")
    page.hover("#lm-heatmap th.row[data-row='3']")  # hovering the grid's row does the same
    assert page.eval_on_selector_all("#lm-tokens .tok.focus", "els => els.map(e => e.dataset.i)") == ["3"]

    shot = tmp_path / "generation.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("GENERATION_SCREENSHOT"):
        shutil.copyfile(shot, os.environ["GENERATION_SCREENSHOT"])

    page.mouse.move(0, 0)
    page.wait_for_function("document.querySelectorAll('#lm-tokens .focus, #lm-heatmap .hover').length === 0")
    assert page.outside == [], "the page asked for something outside the server"
    assert page.errors == []


def test_generation_mode_shows_errors_from_the_server(lm_page, lm_server):
    page = lm_page
    page.goto(lm_server.url + "/")
    page.wait_for_function("document.getElementById('model-info').textContent.includes('language model')")
    page.fill("#prompt", "THE CAT")  # upper case: not in the toy model's characters
    page.click("#generate")
    page.wait_for_selector("#status.error")
    assert "not in the character vocabulary" in page.text_content("#status")
    assert page.outside == []


# ---- behind a token ----------------------------------------------------------------------

def translate_on(page, text: str) -> str:
    """Translate ``text`` on the page; its translation once shown."""
    page.evaluate("document.getElementById('translation').textContent = ''")
    page.fill("#source", text)
    page.press("#source", "Enter")
    page.wait_for_function("document.getElementById('translation').textContent !== ''")
    return page.text_content("#translation")


def test_explorer_opened_at_the_printed_address_uses_the_token_and_hides_it(token_page, token_server, translator,
                                                                            sentences):
    page = token_page
    assert "#token=" in token_server.page  # the address the start-up line printed
    page.goto(token_server.page)
    page.wait_for_function("document.getElementById('model-info').textContent.includes('layers')")
    assert page.url == token_server.url + "/", "the token is still in the address bar"
    assert token_server.token in page.evaluate("Object.values(sessionStorage)")

    assert translate_on(page, sentences[0]) == translator.translate([sentences[0]])[0]
    page.wait_for_selector("#heatmap td")  # /attention went with the token too
    assert page.is_hidden("#token-form") and page.text_content("#status") == ""

    page.reload()  # the tab keeps its token
    page.wait_for_function("document.getElementById('model-info').textContent.includes('layers')")
    assert translate_on(page, sentences[2]) == translator.translate([sentences[2]])[0]
    assert page.is_hidden("#token-form") and token_server.token not in page.url
    assert page.errors == [] and page.dialogs == [] and page.outside == []


def test_explorer_without_the_token_asks_for_it_once(token_page, token_server, translator, sentences):
    page = token_page
    page.goto(token_server.url + "/")
    page.wait_for_selector("#token-form", state="visible")  # at once, before anything is asked
    assert "wants a token" in page.text_content("#token-message")
    assert "#token=" in page.text_content("#token-message")

    page.fill("#source", sentences[0])  # trying anyway: the same message, nothing more
    page.click("#translate")
    page.wait_for_function("!document.getElementById('translate').disabled")
    assert page.is_visible("#token-form") and page.locator("#status.error").count() == 0
    assert page.is_hidden("#result")

    page.fill("#token", "wrong")
    page.click("#use-token")
    page.wait_for_function("document.getElementById('token-message').textContent.includes('refused')")
    assert page.is_visible("#token-form")

    page.fill("#token", token_server.token)
    page.click("#use-token")
    page.wait_for_function("document.getElementById('status').textContent.includes('took the token')")
    assert page.is_hidden("#token-form")
    assert translate_on(page, sentences[0]) == translator.translate([sentences[0]])[0]
    assert page.dialogs == [] and page.outside == []
    # the console's only complaints are the refused calls themselves
    assert page.errors and all("401" in e for e in page.errors), page.errors


def test_generation_behind_a_token_streams_with_it(lm_token_page, lm_token_server):
    page = lm_token_page
    page.goto(lm_token_server.page)
    page.wait_for_function("document.getElementById('model-info').textContent.includes('language model')")
    assert page.url == lm_token_server.url + "/"
    page.fill("#prompt", "the cat")
    page.fill("#max-new-tokens", "8")
    page.fill("#seed", "3")
    page.press("#prompt", "Enter")
    page.wait_for_selector("#lm-heatmap td")  # the stream (POST /generate), then POST /attention
    done = page.evaluate("window.generation.state.done")
    assert done["tokens"] == 8 and page.evaluate("window.generation.state.events") == 8
    code, plain = lm_token_server.post("/generate", {"prompt": "the cat", "max_new_tokens": 8, "seed": 3,
                                                     "temperature": 1.0, "top_k": 0, "top_p": 1.0},
                                       headers={"Authorization": f"Bearer {lm_token_server.token}"})
    assert code == 200 and plain["text"] == done["text"]
    assert page.is_hidden("#token-form")
    assert page.errors == [] and page.dialogs == [] and page.outside == []
