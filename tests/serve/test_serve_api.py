"""The JSON API of the real server (``transformer serve`` in a subprocess): the same
translations as ``transformer translate`` and the in-process Translator, n-best, input
order, empty and blank input, beams grouped apart, attention maps, health, stats and OpenAPI."""
from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from transformer import hardware
from transformer.decode.decoding_config import DecodingConfig
from transformer.serve.attention_maps import attention_maps


def test_one_text_equals_the_translator(server, translator, sentences):
    expected = translator.translate(sentences[:3])
    for text, want in zip(sentences[:3], expected):
        code, body = server.post("/translate", {"text": text})
        assert code == 200, body
        assert body["translation"] == want and body["translations"] == [want]
        assert body["beam"] == 4 and body["truncated"] == []


def test_many_texts_in_input_order_equal_the_cli(server, run_dir, sentences, tmp_path):
    texts = sentences + ["", "   "]
    done = subprocess.run([server.process.args[0], "translate", "--model", str(run_dir)],
                          input="".join(t + "\n" for t in texts), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    cli = done.stdout.split("\n")[:-1]
    code, body = server.post("/translate", {"texts": texts})
    assert code == 200, body
    assert body["translations"] == cli
    assert body["translations"][-2:] == ["", ""]  # empty in, empty out
    assert "translation" not in body  # only for a single "text"


def test_an_empty_list_of_texts_gets_an_empty_list(server):
    code, body = server.post("/translate", {"texts": []})
    assert code == 200, body
    assert body["translations"] == [] and body["n_best"] == []


def test_n_best_with_scores_equals_the_translator(server, translator, sentences):
    texts = sentences[:4]
    expected = translator.translate_nbest(texts, 3)
    code, body = server.post("/translate", {"texts": texts, "n_best": 3})
    assert code == 200, body
    for got, want in zip(body["n_best"], expected):
        assert [c["text"] for c in got] == [t.text for t in want]
        assert [c["score"] for c in got] == pytest.approx([t.score for t in want], abs=2e-4)
        assert got[0]["score"] >= got[1]["score"] >= got[2]["score"]


def test_concurrent_requests_with_different_beams_each_get_their_own_beam(server, run_dir, sentences):
    from transformer.inference.translator import load_translator

    greedy = load_translator(run_dir, beam=1).translate(sentences)
    beam4 = load_translator(run_dir, beam=4).translate(sentences)
    jobs = [(i, beam) for i in range(len(sentences)) for beam in (1, 4)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda job: server.post("/translate", {"text": sentences[job[0]], "beam": job[1]}),
                                jobs))
    for (i, beam), (code, body) in zip(jobs, answers):
        assert code == 200, body
        assert body["beam"] == beam
        assert body["translation"] == (greedy if beam == 1 else beam4)[i], (sentences[i], beam)


def test_a_text_over_the_model_limit_is_cut_and_flagged(server, translator):
    long_text = " ".join(["dog"] * 140)  # over 127 subwords, the most the toy model takes
    code, body = server.post("/translate", {"texts": ["the dog runs", long_text]})
    assert code == 200, body
    assert body["truncated"] == [1]
    with pytest.warns(UserWarning, match="longer than the model's limit"):
        assert body["translations"][1] == translator.translate([long_text])[0]


def test_attention_maps_have_the_documented_shapes(server, translator, sentences):
    text = sentences[1]
    code, body = server.post("/attention", {"text": text})
    assert code == 200, body
    assert body["translation"] == translator.translate([text])[0]
    src, tgt, tgt_in = body["source_tokens"], body["target_tokens"], body["target_input_tokens"]
    assert src[-1] == "</s>" and tgt[-1] == "</s>" and tgt_in[0] == "<s>"
    assert "".join(src[:-1]).replace("▁", " ").strip() == text
    assert "".join(tgt[:-1]).replace("▁", " ").strip() == body["translation"]
    assert tgt_in[1:] == tgt[:-1]
    L, H, S, T = body["n_layers"], body["n_heads"], len(src), len(tgt)
    for name, rows, cols in (("encoder_self", S, S), ("decoder_self", T, T), ("cross", T, S)):
        maps = body[name]
        assert len(maps) == L and all(len(layer) == H for layer in maps), name
        for layer in maps:
            for head in layer:
                assert len(head) == rows and all(len(r) == cols for r in head), name
                for r in head:
                    assert sum(r) == pytest.approx(1.0, abs=0.01)  # softmax rows, rounded to 3 decimals
    for layer in body["decoder_self"]:  # causal: no row looks ahead
        for head in layer:
            assert all(head[t][u] == 0 for t in range(T) for u in range(t + 1, T))


def test_attention_equals_the_maps_computed_in_process(server, translator, sentences):
    code, body = server.post("/attention", {"text": sentences[0], "beam": 2})
    assert code == 200, body
    from transformer.inference.translator import Translator

    beam2 = Translator(translator.model, translator.subwords, DecodingConfig(beam=2))
    want = attention_maps(beam2, sentences[0])
    for key in ("translation", "source_tokens", "target_tokens", "cross", "encoder_self"):
        assert body[key] == want[key], key


@pytest.fixture(scope="module")
def client(translator):
    """The translation app in-process, in Starlette's TestClient."""
    from starlette.testclient import TestClient

    from transformer.serve import ServeConfig, create_app

    with TestClient(create_app(translator, ServeConfig())) as c:
        yield c


@pytest.mark.parametrize("path, what", [("/attention", "a sentence to look at"),
                                        ("/translate", "a sentence to translate")])
@pytest.mark.parametrize("text, says", [("", "empty"), ("   ", "only white space"), ("\t\n", "only white space")])
def test_a_blank_text_is_a_422_that_says_so(client, path, what, text, says):
    """Nothing to translate or look at: a 422 naming the field, not a 200 with empty maps
    (as /generate refuses an empty prompt). In a list of "texts" a blank one stays a blank line."""
    resp = client.post(path, json={"text": text})
    assert resp.status_code == 422, resp.text
    assert resp.json() == {"error": f"text: {says}; give {what}"}
    resp = client.post("/translate", json={"texts": ["red dog", text]})
    assert resp.status_code == 200 and resp.json()["translations"][1] == ""


def test_health_stats_and_openapi(server):
    code, health = server.get("/health")
    assert code == 200 and health["status"] == "ok"
    assert health["n_layers"] == 2 and health["n_heads"] == 4 and health["precision"] == hardware.resolve("auto")
    code, stats = server.get("/stats")
    assert code == 200 and stats["batching"] is True and stats["max_batch"] == 32
    assert {"requests", "decode_calls", "largest_batch"} <= set(stats)
    code, spec = server.get("/openapi.json")
    assert code == 200
    assert {"/translate", "/attention", "/health", "/stats"} <= set(spec["paths"])
    assert "TranslateRequest" in spec["components"]["schemas"]


def test_the_api_pages_that_load_from_a_cdn_are_off_unless_asked_for(server, translator):
    """/docs loaded Swagger's script and styles from a CDN: it failed offline and told that
    site who used it. Off by default (/openapi.json stays); --docs serves it, as it is."""
    import urllib.error
    import urllib.request

    from starlette.testclient import TestClient

    from transformer.cli import build_parser
    from transformer.serve import ServeConfig, create_app

    for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server.url + path, timeout=10)
        assert e.value.code == 404 and "error" in json.loads(e.value.read()), path
    assert server.get("/openapi.json")[0] == 200
    assert build_parser().parse_args(["serve", "--model", "m"]).docs is False
    assert build_parser().parse_args(["serve", "--model", "m", "--docs"]).docs is True
    with TestClient(create_app(translator, ServeConfig(docs=True))) as http:
        page = http.get("/docs")
        assert page.status_code == 200 and "cdn.jsdelivr.net" in page.text  # what --docs's help says
        assert http.get("/redoc").status_code == 404


def test_the_explorer_page_and_its_files_are_served_without_external_urls(server):
    import re
    import urllib.request

    for path, kind in (("/", "text/html"), ("/static/explorer.js", "javascript"), ("/static/generate.js", "javascript"),
                       ("/static/explorer.css", "text/css")):
        with urllib.request.urlopen(server.url + path, timeout=10) as resp:
            assert resp.status == 200 and kind in resp.headers["Content-Type"]
            text = resp.read().decode()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), f"external URL in {path}"


def test_keep_alive_responses_are_not_held_back_by_nagle(server):
    """With Nagle's algorithm on, each response on a reused connection waited ~40 ms for a
    delayed ACK (the listening socket must be created as TCP for asyncio to turn it off)."""
    import http.client
    import socket
    import time
    from urllib.parse import urlsplit

    from transformer.cli.serve import _listen

    sock = _listen("127.0.0.1", 0)
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == socket.IPPROTO_TCP
    finally:
        sock.close()

    parts = urlsplit(server.url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    times = []
    for _ in range(6):
        start = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        times.append(time.perf_counter() - start)
    conn.close()
    assert min(times[1:]) < 0.03, times


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_lower_precision_serves_what_the_translator_gives(run_dir, sentences, start_another, precision):
    """--precision converts the served model as for translate: each text alone (int8's
    dynamic scales depend on the batch) gets the in-process Translator's translation at
    that precision, the attention explorer works too, and /health says which precision."""
    from transformer.inference.translator import load_translator

    reference = load_translator(run_dir, beam=4, precision=precision)
    server = start_another("--precision", precision, "--no-batching")
    assert server.get("/health")[1]["precision"] == precision
    for text in sentences[:4]:
        code, body = server.post("/translate", {"text": text})
        assert code == 200, body
        assert body["translation"] == reference.translate([text])[0]
    code, maps = server.post("/attention", {"text": sentences[0]})
    assert code == 200 and maps["translation"] == reference.translate([sentences[0]])[0]
