"""The language-model service: POST /generate as JSON and as server-sent events (parsed here
event by event), the same text as ``Generator`` / ``transformer generate`` for a seed, alone
or batched with other requests, /attention over a text, /health's kind, and bad requests as
one-line JSON errors. Mostly in-process (Starlette's TestClient); the real server is checked
once for the command line's part."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from serve_lm import CONTEXT, lm_test_client

from transformer.inference.generator import Generator
from transformer.serve.attention_maps import lm_attention_maps

SSE = {"Accept": "text/event-stream"}


def expected(run, prompt: str, seed: int, n: int, **sampling) -> str:
    """What ``transformer generate --prompt P --seed S --max-new-tokens N`` continues with."""
    return Generator.from_pretrained(run, warn=False, seed=seed, max_new_tokens=n, **sampling).generate([prompt])[0]


def parse_events(raw: str) -> list[tuple[str, dict]]:
    """Server-sent events as (event name, JSON data); the name is "message" when none is given."""
    events = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        name, data = "message", []
        for line in block.split("\n"):
            field, _, value = line.partition(":")
            if field == "event":
                name = value.strip()
            elif field == "data":
                data.append(value.removeprefix(" "))
        events.append((name, json.loads("\n".join(data))))
    return events


def stream(client, body: dict, headers: dict | None = SSE) -> tuple[int, str, list[tuple[str, dict]]]:
    """(status, content type, events) of one streamed /generate, read chunk by chunk."""
    with client.stream("POST", "/generate", json=body, headers=headers) as resp:
        raw = "".join(resp.iter_text())
        return resp.status_code, resp.headers["content-type"], parse_events(raw)


def test_json_answer_equals_the_generator_for_its_seed(lm_client, lm_run):
    code_body = lm_client.post("/generate", json={"prompt": "the cat", "seed": 3, "max_new_tokens": 30})
    assert code_body.status_code == 200, code_body.text
    body = code_body.json()
    assert body == {"text": expected(lm_run, "the cat", 3, 30), "tokens": 30, "prompt_tokens": 7, "truncated": False,
                    "seed": 3}
    again = lm_client.post("/generate", json={"prompt": "the cat", "seed": 3, "max_new_tokens": 30}).json()
    assert again == body
    other = lm_client.post("/generate", json={"prompt": "the cat", "seed": 4, "max_new_tokens": 30}).json()
    assert other["text"] != body["text"]


def test_a_request_without_a_seed_gets_one_that_gives_its_text_again(lm_client):
    first = lm_client.post("/generate", json={"prompt": "a dog", "max_new_tokens": 20}).json()
    assert isinstance(first["seed"], int)
    again = lm_client.post("/generate", json={"prompt": "a dog", "max_new_tokens": 20, "seed": first["seed"]}).json()
    assert again == first


def test_defaults_come_from_the_runs_decoding_settings(lm_client, lm_run):
    body = lm_client.post("/generate", json={"prompt": "the", "seed": 0}).json()
    assert body["tokens"] == 256 == Generator.from_pretrained(lm_run).decoding.max_new_tokens  # DecodingConfig's
    greedy = lm_client.post("/generate", json={"prompt": "the", "temperature": 0, "max_new_tokens": 12}).json()
    assert greedy["text"] == expected(lm_run, "the", 0, 12, temperature=0.0)


def test_server_sent_events_one_per_token_then_done(lm_client, lm_run):
    code, kind, events = stream(lm_client, {"prompt": "the dog", "seed": 5, "max_new_tokens": 25, "top_k": 5})
    assert code == 200 and kind.startswith("text/event-stream")
    *tokens, (last, done) = events
    assert last == "done" and all(name == "message" for name, _ in tokens)
    assert len(tokens) == 25 == done["tokens"]  # characters: every token adds its text at once
    assert all(isinstance(t["token"], int) and len(t["text"]) == 1 for _, t in tokens)
    assert "".join(t["text"] for _, t in tokens) == done["text"] == expected(lm_run, "the dog", 5, 25, top_k=5)
    tokenizer = Generator.from_pretrained(lm_run).tokenizer
    assert tokenizer.decode([t["token"] for _, t in tokens]) == done["text"]
    # the JSON answer is the same as the final event
    plain = lm_client.post("/generate", json={"prompt": "the dog", "seed": 5, "max_new_tokens": 25, "top_k": 5})
    assert plain.json() == done


def test_stream_true_streams_and_false_does_not(lm_client):
    body = {"prompt": "a cat", "seed": 1, "max_new_tokens": 5}
    code, kind, events = stream(lm_client, {**body, "stream": True}, headers={})
    assert code == 200 and kind.startswith("text/event-stream") and events[-1][0] == "done"
    resp = lm_client.post("/generate", json={**body, "stream": False}, headers=SSE)  # the body wins over Accept
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json")
    assert resp.json() == events[-1][1]


def test_a_prompt_longer_than_the_context_is_continued_from_its_end(lm_client, lm_run):
    prompt = "the cat sat on the mat and then the dog ran under the log slowly."  # 65 characters > 47
    body = lm_client.post("/generate", json={"prompt": prompt, "seed": 2, "max_new_tokens": 10}).json()
    assert body["truncated"] is True and body["prompt_tokens"] == CONTEXT - 1
    assert body["text"] == expected(lm_run, prompt, 2, 10)
    assert body["text"] == expected(lm_run, prompt[-(CONTEXT - 1):], 2, 10)


def test_the_same_seed_gives_the_same_text_alone_or_batched(lm_run):
    """Concurrent requests (streaming and not, prompts of different lengths, windows that
    slide past the context) share decode calls, and each gets the text it gets alone."""
    jobs = [("the cat", 11), ("a", 12), ("the dog ran under the log", 13), ("then", 14), ("the cat", 15),
            ("slowly the mat", 16)]
    n = 45  # the longest prompt + 45 > 48: its window slides while the others' do not
    alone = [expected(lm_run, prompt, seed, n, top_p=0.9) for prompt, seed in jobs]

    def ask(i):
        prompt, seed = jobs[i]
        body = {"prompt": prompt, "seed": seed, "max_new_tokens": n, "top_p": 0.9}
        if i % 2:
            return stream(client, body)[2][-1][1]["text"]
        return client.post("/generate", json=body).json()["text"]

    with lm_test_client(lm_run, max_wait_ms=400, max_batch=8) as client:
        with ThreadPoolExecutor(len(jobs)) as pool:
            batched = list(pool.map(ask, range(len(jobs))))
        stats = client.get("/stats").json()
        assert stats["requests"] == len(jobs)
        assert stats["decode_calls"] < len(jobs) and stats["largest_batch"] > 1, stats
        # and one by one, each alone
        one_by_one = [ask(i) for i in range(len(jobs))]
    assert batched == alone
    assert one_by_one == alone


@pytest.mark.parametrize("body, status, mentions", [
    ({"prompt": ""}, 422, ["prompt", "empty"]),
    ({"prompt": "the", "temperature": -1}, 422, ["temperature", "greater than or equal to 0"]),
    ({"prompt": "the", "top_p": 0}, 422, ["top_p", "greater than 0"]),
    ({"prompt": "the", "top_p": 1.5}, 422, ["top_p", "less than or equal to 1"]),
    ({"prompt": "the", "top_k": -1}, 422, ["top_k"]),
    ({"prompt": "the", "max_new_tokens": 0}, 422, ["max_new_tokens"]),
    ({"prompt": "the", "max_new_tokens": 301}, 422, ["max_new_tokens", "at most 300", "301"]),
    ({"prompt": "the", "seed": -1}, 422, ["seed"]),
    ({"prompt": "the", "seed": "7"}, 422, ["seed", "integer"]),
    ({"prompt": "the", "temperature": "hot"}, 422, ["temperature", "number"]),
    ({"prompt": "the", "stream": "yes"}, 422, ["stream", "boolean"]),
    ({"prompt": 5}, 422, ["prompt", "string"]),
    ({"text": "the"}, 422, ["prompt", "Field required", "text", "not permitted"]),
    ({}, 422, ["prompt", "Field required"]),
    ([], 422, ["JSON object", '{"prompt"']),
    ({"prompt": "THE CAT"}, 422, ["prompt", "'T'", "not in the character vocabulary of this model"]),
    ({"prompt": "the " * 51}, 413, ["204 characters", "200"]),
], ids=["empty", "temperature", "top-p-0", "top-p-big", "top-k", "max-new-0", "max-new-over", "seed-negative",
        "seed-string", "temperature-string", "stream-string", "prompt-number", "text-not-prompt", "no-prompt",
        "array", "unknown-character", "too-long"])
def test_bad_requests_get_a_clear_json_error(lm_client, lm_run, body, status, mentions):
    for headers in ({}, SSE):  # streaming or not, the refusal comes before any event
        resp = lm_client.post("/generate", json=body, headers=headers)
        assert resp.status_code == status, resp.text
        assert resp.headers["content-type"].startswith("application/json")
        error = resp.json()
        assert set(error) == {"error"} and "\n" not in error["error"]
        for m in mentions:
            assert m in error["error"], (m, error["error"])
        assert str(lm_run) not in error["error"]  # no server paths



def test_an_infinite_temperature_is_refused(lm_client):
    """Python's JSON reads Infinity: a temperature that would make every logit 0 (uniform
    sampling, top_k ignored) is a 422, not a text."""
    resp = lm_client.post("/generate", content=b'{"prompt": "the", "temperature": Infinity, "top_k": 2}',
                          headers={"Content-Type": "application/json"})
    assert resp.status_code == 422 and "temperature" in resp.json()["error"], resp.text

def test_malformed_json_and_a_body_that_is_not_json(lm_client):
    resp = lm_client.post("/generate", content=b'{"prompt": "a",', headers={"Content-Type": "application/json"})
    assert resp.status_code == 422 and "malformed JSON" in resp.json()["error"]
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    resp = lm_client.post("/generate", content=b"prompt=a", headers=form)
    assert resp.status_code == 415 and "application/json" in resp.json()["error"]


def test_health_says_language_model_and_the_translation_endpoints_say_where_to_go(lm_client):
    health = lm_client.get("/health").json()
    assert health["status"] == "ok" and health["kind"] == "language-model" and health["model"] == "toy-lm"
    assert (health["n_layers"], health["n_heads"], health["max_len"]) == (2, 2, CONTEXT)
    assert health["max_new_tokens"] == 256 and health["new_tokens_limit"] == 300
    resp = lm_client.post("/translate", json={"text": "a dog"})
    assert resp.status_code == 404
    assert "language model" in resp.json()["error"] and "/generate" in resp.json()["error"]
    spec = lm_client.get("/openapi.json").json()
    assert {"/generate", "/attention", "/health", "/stats"} <= set(spec["paths"]) and "/translate" not in spec["paths"]
    assert "text/event-stream" in spec["paths"]["/generate"]["post"]["responses"]["200"]["content"]


def test_a_translation_server_says_it_serves_translate(server):
    code, health = server.get("/health")
    assert code == 200 and health["kind"] == "translation"
    code, body = server.post("/generate", {"prompt": "the dog"})
    assert code == 404 and "translation model" in body["error"] and "/translate" in body["error"]


def test_attention_over_prompt_and_continuation(lm_client, lm_run):
    text = "the cat sat on the mat"
    resp = lm_client.post("/attention", json={"text": text})
    assert resp.status_code == 200, resp.text
    maps = resp.json()
    assert maps["tokens"] == list(text) and maps["truncated"] is False
    L, H, T = maps["n_layers"], maps["n_heads"], len(text)
    weights = maps["self_attention"]
    assert len(weights) == L == 2 and all(len(layer) == H == 2 for layer in weights)
    for layer in weights:
        for head in layer:
            assert len(head) == T and all(len(row) == T for row in head)
            for t, row in enumerate(head):
                assert sum(row) == pytest.approx(1.0, abs=0.01)
                assert all(w == 0 for w in row[t + 1:])  # causal: nothing after t
    assert weights[0] != weights[1]
    assert maps == lm_attention_maps(Generator.from_pretrained(lm_run), text)


def test_attention_of_a_long_text_shows_its_end(lm_client):
    text = "the dog ran under the log and then the cat sat on the mat quickly."
    maps = lm_client.post("/attention", json={"text": text}).json()
    assert maps["truncated"] is True and maps["tokens"] == list(text[-CONTEXT:])
    assert len(maps["self_attention"][0][0]) == CONTEXT


@pytest.mark.parametrize("body, mentions", [
    ({"text": "the", "beam": 2}, ["beam", "not permitted"]),
    ({"texts": ["the"]}, ["text"]),
    ({"text": "Zebra"}, ["'Z'", "not in the character vocabulary of this model"]),
    ({"text": ""}, ["text: empty; give some text to look at"]),  # as /generate refuses an empty prompt
    ({"text": "  \n"}, ["text: only white space; give some text to look at"]),
])
def test_bad_attention_requests(lm_client, body, mentions):
    resp = lm_client.post("/attention", json=body)
    assert resp.status_code == 422, resp.text
    for m in mentions:
        assert m in resp.json()["error"]


def test_the_command_serves_a_language_model_run(lm_server, lm_run):
    """``transformer serve --model LM_RUN``: the kind is read from the run, and the tokens
    of a stream come over real HTTP as events, the same as the JSON answer."""
    import httpx

    code, health = lm_server.get("/health")
    assert code == 200 and health["kind"] == "language-model" and health["model"] == str(lm_run)
    assert "language model" in lm_server.log.read_text()
    body = {"prompt": "a dog", "seed": 9, "max_new_tokens": 40}
    code, plain = lm_server.post("/generate", body)
    assert code == 200 and plain["text"] == expected(lm_run, "a dog", 9, 40)
    with httpx.Client(base_url=lm_server.url, timeout=30) as http:
        with http.stream("POST", "/generate", json=body, headers=SSE) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            events = parse_events("".join(resp.iter_text()))
    assert len(events) == 41 and events[-1] == ("done", plain)


def test_a_client_leaving_a_stream_does_not_stop_the_server(lm_server):
    import httpx

    with httpx.Client(base_url=lm_server.url, timeout=30) as http:
        with http.stream("POST", "/generate", json={"prompt": "the", "max_new_tokens": 200}, headers=SSE) as resp:
            first = next(resp.iter_lines())
            assert first.startswith("data: ")
        # gone after the first event; the next request is answered in full
        code, body = lm_server.post("/generate", {"prompt": "the", "max_new_tokens": 5, "seed": 1})
    assert code == 200 and body["tokens"] == 5
    assert "Traceback" not in lm_server.log.read_text()
