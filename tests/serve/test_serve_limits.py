"""What one request may cost the server, and who may reach it.

/attention: an answer holds at most ``max_attention`` weights (the chosen layers x heads x the
maps' cells) and the model computes at most ``COMPUTE_FACTOR`` times as many for it; a text
over either is a 413 that says what to do, refused before any map is computed. One
1,000-character request to a 4-layer, 8-head model with a 1,024-token context took the server
from 324 MB to 2 GB. A request may ask for some layers and heads only. The answer's JSON is
built in the batcher's thread, a row at a time, and equals the maps computed in-process.

/translate: a request asks for at most ``max_work`` source tokens x beam; one of 64
texts x 1,000 characters at beam 16 (46 s of the model, every request behind it waiting) is a
413 naming --max-work and what to lower, never decoded.

Host: a server on a loopback address answers only requests naming it (or localhost), so a web
page reaching it through DNS rebinding gets 403; --allow-host adds names; a server on every
address (0.0.0.0) answers its loopback names, the machine's name and any IP address.
"""
from __future__ import annotations

import json
import socket
import string
import threading

import pytest
import torch
from starlette.testclient import TestClient

from transformer import ModelConfig
from transformer.cli.serve import allowed_hosts
from transformer.data.chars import Chars
from transformer.inference.generator import Generator
from transformer.model import LanguageModel
from transformer.serve import ServeConfig, create_app
from transformer.serve.attention_maps import COMPUTE_FACTOR, Bounds, attention_maps_tensors, lm_attention_maps, maps_json

from conftest import request  # noqa: E402  (tests/serve/conftest.py)

CHARS = Chars(list(string.ascii_lowercase + " .\n"))


def random_lm(n_layers: int, n_heads: int, max_len: int) -> Generator:
    """An untrained character model of the given shape (its weights do not matter here)."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset("nanogpt-char", vocab_size=CHARS.vocab_size, d_model=8 * n_heads, n_heads=n_heads,
                             d_ff=32, n_layers=n_layers, max_len=max_len)
    return Generator(LanguageModel(cfg).eval(), CHARS, warn=False)


def client(generator: Generator, **settings) -> TestClient:
    return TestClient(create_app(generator, ServeConfig(**settings), model_name="random"))


TEXT = "the cat sat on the mat. " * 2  # 48 characters: 48 tokens


def test_the_attack_request_is_refused_before_anything_is_computed(monkeypatch):
    """The review's request: 1,000 characters to a 4 x 8 model with a context of 1,024 (32
    million weights). Now a 413 naming the limit, and the model is never run for it."""
    generator = random_lm(4, 8, 1024)
    monkeypatch.setattr(generator.model, "decode", lambda *a, **k: pytest.fail("the maps were computed"))
    with client(generator, max_chars=1000) as http:
        r = http.post("/attention", json={"text": ("a cat sat on the mat. " * 50)[:1000]})
        assert r.status_code == 413
        assert r.json() == {"error": 'text: the attention of a text of 1000 tokens is 32,000,000 weights (4 layers x '
                                     '8 heads x 1,000,000); this server returns at most 2,000,000 in one answer: ask '
                                     'for fewer "layers" or "heads" (e.g. "layers": [0], "heads": [0]), or send a '
                                     "shorter text (the server's --max-attention)"}
        assert http.get("/health").status_code == 200


def test_an_answer_at_the_limit_is_given_and_one_weight_more_is_refused():
    generator = random_lm(2, 2, 64)
    full = 2 * 2 * 48 * 48  # layers x heads x T x T
    with client(generator, max_attention=full) as http:
        r = http.post("/attention", json={"text": TEXT})
        assert r.status_code == 200, r.text
        assert r.json() == lm_attention_maps(generator, TEXT)  # the same maps as in-process, rounded alike
    with client(generator, max_attention=full - 1) as http:
        r = http.post("/attention", json={"text": TEXT})
        assert r.status_code == 413 and "9,216 weights (2 layers x 2 heads x 2,304)" in r.json()["error"]
        assert "this server returns at most 9,215" in r.json()["error"]


def test_chosen_layers_and_heads_fit_where_all_would_not():
    generator = random_lm(2, 2, 64)
    everything = lm_attention_maps(generator, TEXT)
    with client(generator, max_attention=48 * 48) as http:  # one map
        r = http.post("/attention", json={"text": TEXT, "layers": [1], "heads": [1]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["layers"], body["heads"]) == ([1], [1])
        assert body["self_attention"] == [[everything["self_attention"][1][1]]]
        assert body["tokens"] == everything["tokens"]
        r = http.post("/attention", json={"text": TEXT, "layers": [1, 0], "heads": [0]})
        assert r.status_code == 413 and "(2 layers x 1 head x 2,304)" in r.json()["error"]


def test_the_model_computes_at_most_compute_factor_times_the_answer():
    """One head of one layer out of 16 x 2: the answer fits, but the pass computes 32 maps."""
    generator = random_lm(16, 2, 64)
    one_map = 48 * 48
    with client(generator, max_attention=one_map * 32 // COMPUTE_FACTOR) as http:  # the pass exactly at the bound
        r = http.post("/attention", json={"text": TEXT, "layers": [3], "heads": [0]})
        assert r.status_code == 200, r.text
    with client(generator, max_attention=one_map * 32 // COMPUTE_FACTOR - 1) as http:
        r = http.post("/attention", json={"text": TEXT, "layers": [3], "heads": [0]})
        assert r.status_code == 413
        assert r.json()["error"].startswith("text: the attention of a text of 48 tokens takes 73,728 weights to "
                                            "compute (16 layers x 2 heads x 2,304); this server computes at most")
        assert r.json()["error"].endswith(": send a shorter text (the server's --max-attention)")


@pytest.mark.parametrize("body, mentions", [
    ({"text": TEXT, "layers": [2]}, "layers: 2 is out of range; the model has 2 layers (0 to 1)"),
    ({"text": TEXT, "heads": [0, 5]}, "heads: 5 is out of range; the model has 2 heads (0 to 1)"),
    ({"text": TEXT, "heads": [0, 0]}, "give each index once"),
    ({"text": TEXT, "layers": []}, "give each index once"),
    ({"text": TEXT, "layers": [-1]}, "greater than or equal to 0"),
    ({"text": TEXT, "layers": ["0"]}, "valid integer"),
])
def test_bad_choices_of_layers_and_heads(body, mentions):
    with client(random_lm(2, 2, 64)) as http:
        r = http.post("/attention", json=body)
        assert r.status_code == 422 and mentions in r.json()["error"], r.text


def test_a_translation_servers_attention_is_bounded_too(translator, sentences):
    from transformer.serve.attention_maps import attention_maps

    everything = attention_maps(translator, sentences[1])
    cells = sum(len(m[0][0]) * len(m[0][0][0]) for m in (everything["encoder_self"], everything["decoder_self"],
                                                         everything["cross"]))
    n = translator.model.cfg.n_layers * translator.model.cfg.n_heads * cells
    app = create_app(translator, ServeConfig(max_attention=n))
    with TestClient(app) as http:
        r = http.post("/attention", json={"text": sentences[1]})
        assert r.status_code == 200 and r.json()["cross"] == everything["cross"]
        r = http.post("/attention", json={"text": sentences[1], "layers": [0], "heads": [1]})
        assert r.json()["cross"] == [[everything["cross"][0][1]]]
    with TestClient(create_app(translator, ServeConfig(max_attention=n - 1))) as http:
        r = http.post("/attention", json={"text": sentences[1]})
        assert r.status_code == 413 and "its translation of" in r.json()["error"]


def test_the_json_built_a_row_at_a_time_is_the_whole_answers():
    generator = random_lm(2, 2, 64)
    answer = attention_maps_tensors(generator, TEXT, Bounds(heads=[1]))
    assert json.loads(maps_json(answer, 4)) == lm_attention_maps(generator, TEXT, 4, Bounds(heads=[1]))
    assert json.loads(maps_json(attention_maps_tensors(generator, ""))) == lm_attention_maps(generator, "")


def test_health_is_answered_while_the_largest_allowed_attention_is_built(tmp_path):
    """The largest answer the default limit allows on a 4 x 8 model (250 tokens: 2,000,000
    weights), while /health is asked again and again from another thread: every one is
    answered (how fast: benchmarks/serve/attention_limits.py)."""
    generator = random_lm(4, 8, 1024)
    text = ("the cat sat on the mat. " * 20)[:250]
    answers, stop = [], threading.Event()
    with client(generator, max_chars=1000) as http:
        def poll():
            while not stop.is_set():
                answers.append(http.get("/health").status_code)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            r = http.post("/attention", json={"text": text})
        finally:
            stop.set()
            poller.join()
    assert r.status_code == 200 and len(r.json()["self_attention"][3][7]) == 250
    assert answers and set(answers) == {200}


@pytest.mark.parametrize("host, extra, names", [
    ("127.0.0.1", [], ("127.0.0.1", "localhost", "::1")),
    ("localhost", [], ("localhost", "127.0.0.1", "::1")),
    ("::1", ["Box.local"], ("::1", "localhost", "127.0.0.1", "box.local")),
    ("192.168.1.5", [], ("192.168.1.5",)),
    ("0.0.0.0", [], ("0.0.0.0", "localhost", "127.0.0.1", "::1", "box")),
    ("::", [], ("::", "localhost", "127.0.0.1", "::1", "box")),
    ("0.0.0.0", ["example.org"], ("0.0.0.0", "localhost", "127.0.0.1", "::1", "box", "example.org")),
])
def test_the_names_a_server_answers_to(host, extra, names, monkeypatch):
    """A server on every address checked no Host at all; it answers the loopback names, the
    machine's name, --allow-host's and (in the guard) any IP address."""
    monkeypatch.setattr(socket, "gethostname", lambda: "Box")
    assert allowed_hosts(host, extra) == names


def test_a_server_on_every_address_answers_ip_addresses_and_its_names_only(lm_run):
    generator = Generator.from_pretrained(lm_run, warn=False)
    with client(generator, allowed_hosts=allowed_hosts("0.0.0.0", ["example.org"])) as http:
        for host in ("192.168.1.5:8000", "10.0.0.1", "[fe80::1]:8000", "localhost:8000", "example.org",
                     socket.gethostname()):
            assert http.get("/health", headers={"Host": host}).status_code == 200, host
        for host in ("rebound.example", "192.168.1.5.rebound.example:8000", "example.org.evil"):
            r = http.post("/generate", json={"prompt": "the"}, headers={"Host": host})
            assert r.status_code == 403, host
            assert "or an IP address); start it with --allow-host" in r.json()["error"]
            assert "0.0.0.0" not in r.json()["error"]


def test_a_request_naming_another_host_is_refused(lm_run):
    generator = Generator.from_pretrained(lm_run, warn=False)
    with client(generator, allowed_hosts=("127.0.0.1", "localhost", "::1")) as http:
        for host in ("127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:8000"):
            assert http.get("/health", headers={"Host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8000", "127.0.0.1.evil.example", "[::2]:8000"):
            r = http.post("/generate", json={"prompt": "the"}, headers={"Host": host})
            assert r.status_code == 403, host
            assert r.json()["error"].startswith(f"Host {host.split(':8000')[0].strip('[]')!r} is not a name this "
                                                "server answers to (127.0.0.1, ::1, localhost); start it with "
                                                "--allow-host")


def test_the_real_server_answers_its_address_and_refuses_another_name(server):
    assert request(server.url + "/health")[0] == 200  # urllib sends Host: 127.0.0.1:PORT
    code, body = request(server.url + "/health", headers={"Host": "rebound.example"})
    assert code == 403 and "--allow-host rebound.example" in body["error"]


# ---- the work of one translation request -------------------------------------------------

LONG = ("the big red dog runs near the house with a small cat " * 20)[:1000]


def test_64_long_texts_at_beam_16_are_refused_before_they_are_decoded(translator, sentences):
    """64 texts x 1,000 characters at beam 16 with n_best 16: within every other limit, it held
    the model 46 s. Now a 413 naming the limit; the model never sees it, and a few sentences
    at beam 5 pass."""
    app = create_app(translator, ServeConfig())
    service = app.state.service
    tokens = sum(service.source_tokens(LONG) for _ in range(64))
    decoded = []
    decode = service.batcher.decode
    service.batcher.decode = lambda key, texts: decoded.append(texts) or decode(key, texts)
    with TestClient(app) as http:
        r = http.post("/translate", json={"texts": [LONG] * 64, "beam": 16, "n_best": 16})
        assert r.status_code == 413
        assert r.json() == {"error": f"this request asks for {tokens * 16:,} source tokens x beam ({tokens:,} tokens x "
                                     "beam 16); the limit is 20,000 (the server's --max-work): send fewer or shorter "
                                     "texts, or a smaller beam"}
        assert decoded == []
        r = http.post("/translate", json={"texts": sentences[:5], "beam": 5})
        assert r.status_code == 200 and r.json()["translations"] == translator.with_decoding(beam=5).translate(
            sentences[:5])


def test_a_request_at_the_work_limit_is_decoded_and_one_token_more_is_refused(translator, sentences):
    texts = sentences[:3]
    app = create_app(translator, ServeConfig())
    work = sum(app.state.service.source_tokens(t) for t in texts) * 4
    with TestClient(create_app(translator, ServeConfig(max_work=work))) as http:
        assert http.post("/translate", json={"texts": texts, "beam": 4}).status_code == 200
        r = http.post("/translate", json={"texts": texts, "beam": 4, "n_best": 4})
        assert r.status_code == 200 and len(r.json()["n_best"][0]) == 4
        assert http.post("/attention", json={"text": texts[0], "beam": 4}).status_code == 200
    with TestClient(create_app(translator, ServeConfig(max_work=work - 1))) as http:
        r = http.post("/translate", json={"texts": texts, "beam": 4})
        assert r.status_code == 413 and f"asks for {work:,} source tokens x beam" in r.json()["error"]
        assert http.post("/translate", json={"texts": texts, "beam": 3}).status_code == 200


def test_a_text_longer_than_the_model_counts_what_the_model_reads(translator):
    """A text is cut to the model's length before it is decoded: its work is that length, so
    a long text at a small beam is not refused for characters the model never reads."""
    service = create_app(translator, ServeConfig()).state.service
    assert service.source_tokens(LONG) == translator.model.cfg.max_len
    assert service.source_tokens("the dog runs") == len(translator.subwords.encode("the dog runs")) + 1
