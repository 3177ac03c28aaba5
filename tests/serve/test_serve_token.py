"""A server with a token: every API route wants ``Authorization: Bearer TOKEN`` (401 without
it, or with a wrong one), while ``/health`` and the explorer page with its files (no data in
them) answer without it, to reads only; ``transformer serve`` prints the page's address with
``#token=`` for the page to take. The page itself, in a browser, is in test_serve_browser.py.
"""
from __future__ import annotations

import asyncio
import importlib
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from urllib.parse import unquote, urlsplit

import httpx
import pytest

from transformer.serve import ServeConfig, create_app
from transformer.serve.serve_config import TOKEN_ENV
from transformer.serve.core import STATIC

TOKEN = "s3cret-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
OPEN = {"/health", "/", "/static"}  # the routes answered without the token (/static: the page's files)

# Every other route of each kind of server: a request to it, and its status with the token.
# A route missing here fails the test: a new route is a decision about the token.
CALLS = {
    "translation": {
        "/translate": ("POST", {"text": "the dog runs"}, 200),
        "/attention": ("POST", {"text": "the dog runs"}, 200),
        "/lens": ("POST", {"text": "the dog runs"}, 200),
        "/heads": ("POST", {"text": "the dog runs", "layers": [0]}, 200),
        "/generate": ("POST", {"prompt": "the"}, 404),  # the other kind's endpoint
        "/stats": ("GET", None, 200),
        "/openapi.json": ("GET", None, 200),
        "/docs": ("GET", None, 200),
        "/docs/oauth2-redirect": ("GET", None, 200),
    },
    "language-model": {
        "/generate": ("POST", {"prompt": "the cat", "max_new_tokens": 3, "seed": 1}, 200),
        "/attention": ("POST", {"text": "the cat"}, 200),
        "/lens": ("POST", {"text": "the cat"}, 200),
        "/heads": ("POST", {"text": "the cat", "layers": [0]}, 200),
        "/translate": ("POST", {"text": "the"}, 404),
        "/stats": ("GET", None, 200),
        "/openapi.json": ("GET", None, 200),
        "/docs": ("GET", None, 200),
        "/docs/oauth2-redirect": ("GET", None, 200),
    },
}


@asynccontextmanager
async def token_app(request, kind: str, token: str = TOKEN):
    """(app, client) of a kind's app in-process with ``token``, its batcher running."""
    if kind == "translation":
        model = request.getfixturevalue("translator")
    else:
        from transformer.inference.generator import Generator

        model = Generator.from_pretrained(request.getfixturevalue("lm_run"), warn=False)
    app = create_app(model, ServeConfig(token=token, docs=True))  # /docs too: its routes want the token as well
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as http:
            yield app, http


@pytest.mark.parametrize("kind", sorted(CALLS))
def test_every_api_route_wants_the_token(request, kind):
    calls = CALLS[kind]

    async def go():
        async with token_app(request, kind) as (app, http):
            routes = {route.path for route in app.routes}
            answers = {}
            for path, (method, body, _) in calls.items():
                for name, headers in [("none", {}), ("wrong", {"Authorization": "Bearer nope"}),
                                      ("no scheme", {"Authorization": TOKEN}), ("token", BEARER)]:
                    answers[path, name] = await http.request(method, path, json=body, headers=headers)
            return routes, answers

    routes, answers = asyncio.run(go())
    assert routes == OPEN | set(calls), "a route the test does not know: add it to CALLS (or OPEN)"
    for path, (_, _, status) in calls.items():
        for name in ("none", "wrong", "no scheme"):
            r = answers[path, name]
            assert r.status_code == 401, (path, name)
            assert "Bearer" in r.json()["error"] and r.headers["WWW-Authenticate"].startswith("Bearer")
        assert answers[path, "token"].status_code == status, (path, answers[path, "token"].text)
    if kind == "translation":
        translator = request.getfixturevalue("translator")
        assert answers["/translate", "token"].json()["translation"] == translator.translate(["the dog runs"])[0]
    assert TOKEN not in repr(ServeConfig(token=TOKEN))


def test_the_page_and_its_files_need_no_token(request, translator):
    files = sorted(p.name for p in STATIC.iterdir() if p.is_file())
    assert {"index.html", "explorer.js", "explorer.css", "generate.js"} <= set(files)

    async def go():
        async with token_app(request, "translation") as (app, http):
            got = {"/": await http.get("/"), "HEAD": await http.head("/static/explorer.js"), "/health": await http.get("/health")}
            for name in files:
                got[name] = await http.get(f"/static/{name}")
            got["missing"] = await http.get("/static/nothing.js")
            got["POST /"] = await http.post("/", json={})
            got["POST /health"] = await http.post("/health", json={})
            got["escape"] = await raw_get(app, "/static/../stats")
            return got

    got = asyncio.run(go())
    assert got["/"].status_code == 200 and got["/"].headers["content-type"].startswith("text/html")
    assert got["/"].content == (STATIC / "index.html").read_bytes()
    assert got["HEAD"].status_code == 200
    assert got["/health"].status_code == 200 and got["/health"].json()["status"] == "ok"
    for name in files:
        assert got[name].status_code == 200, name
        assert got[name].content == (STATIC / name).read_bytes(), name
    assert got["missing"].status_code == 404  # nothing there, with or without a token
    # open to reads only: the same paths wanting anything else want the token
    assert got["POST /"].status_code == 401 and got["POST /health"].status_code == 401
    # a path under /static/ that climbs out reaches the static folder only, never the API
    status, body = got["escape"]
    assert status == 404 and b"decode_calls" not in body


async def raw_get(app, path: str) -> tuple[int, bytes]:
    """GET ``path`` as the server would route it, undecoded and unnormalised (a client library
    would resolve the ``..`` itself), without a token: (status, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80), "headers": []}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_the_real_server_serves_the_page_without_the_token_and_the_api_with_it(token_server):
    """uvicorn in front: the same answers as in-process."""
    base = token_server.url

    def fetch(path: str, data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json",
                                                                      **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    bearer = {"Authorization": f"Bearer {token_server.token}"}
    body = b'{"text": "the dog runs"}'
    assert fetch("/")[0] == 200 and b"/static/explorer.js" in fetch("/")[1]
    for name in ("explorer.js", "explorer.css", "generate.js"):
        assert fetch(f"/static/{name}") == (200, (STATIC / name).read_bytes()), name
    assert fetch("/translate", body)[0] == 401 and fetch("/attention", body)[0] == 401 and fetch("/stats")[0] == 401
    assert fetch("/translate", body, bearer)[0] == 200 and fetch("/attention", body, bearer)[0] == 200
    assert fetch("/stats", headers=bearer)[0] == 200


# ---- the start-up line: the page's address, with the token for the page to take ----------

class FakeSocket:
    """What ``_listen`` returns, without opening anything."""

    def getsockname(self):
        return ("127.0.0.1", 8000)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("option, env, address", [
    (None, None, "http://127.0.0.1:8000/"),
    ("s3cret", None, "http://127.0.0.1:8000/#token=s3cret"),
    ("a+b/c&d%e#f=", None, "http://127.0.0.1:8000/#token=a%2Bb%2Fc%26d%25e%23f%3D"),
    ("s3cret", "from-env", "http://127.0.0.1:8000/#token=s3cret"),  # --token wins
    (None, "from-env", "http://127.0.0.1:8000/#token=..."),
], ids=["none", "option", "escaped", "option-over-env", "env"])
def test_the_start_up_line_gives_the_pages_address_with_the_token(run_dir, monkeypatch, capsys, option, env,
                                                                     address):
    import uvicorn

    from transformer.cli import main

    serve_cli = importlib.import_module("transformer.cli.serve")
    monkeypatch.setattr(uvicorn.Server, "run", lambda server, sockets=None: None)
    monkeypatch.setattr(serve_cli, "_listen", lambda h, p: FakeSocket())
    if env is None:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(TOKEN_ENV, env)
    assert main(["serve", "--model", str(run_dir), *(["--token", option] if option else [])]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("transformer serve:")]
    assert len(lines) == 1, lines  # one line
    line = lines[0]
    assert line.split()[2] == address
    if option:  # what the page reads from the fragment (URLSearchParams decodes the same way)
        assert unquote(urlsplit(address).fragment.removeprefix("token=")) == option
    # a token from the variable is never printed; the line says what goes in place of "..."
    assert "from-env" not in line
    assert (f"${TOKEN_ENV} goes in place of ..." in line) == (option is None and env is not None)


def test_the_scheme_name_is_case_insensitive(request):
    """HTTP's authentication scheme names are case-insensitive (RFC 9110 11.1): clients that
    send "bearer TOKEN" or "BEARER  TOKEN" are let in (they got 401); the token itself is
    compared exactly."""
    async def go():
        async with token_app(request, "translation") as (app, http):
            return {value: (await http.get("/stats", headers={"Authorization": value})).status_code
                    for value in (f"bearer {TOKEN}", f"BEARER  {TOKEN}", f"Bearer {TOKEN.upper()}",
                                  f"Bearer{TOKEN}", f"Basic {TOKEN}", f"Bearer {TOKEN} x")}

    got = asyncio.run(go())
    assert got == {f"bearer {TOKEN}": 200, f"BEARER  {TOKEN}": 200, f"Bearer {TOKEN.upper()}": 401,
                   f"Bearer{TOKEN}": 401, f"Basic {TOKEN}": 401, f"Bearer {TOKEN} x": 401}
