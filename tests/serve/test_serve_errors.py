"""Bad input never gets a 500: every refusal is a 4xx with one clear JSON ``{"error": ...}``;
and the command's own errors (model, options, port) are one line and exit code 2."""
from __future__ import annotations

import http.client
import json
import subprocess
from urllib.parse import urlsplit

import pytest

from transformer.serve import ServeConfig

OK = {"text": "the dog runs"}

# id: (path, body: JSON-able object or raw bytes, content type, status, words the error must contain)
CASES = {
    "malformed-json": ("/translate", b'{"text": "a",', "application/json", 422, ["malformed JSON"]),
    "not-utf8": ("/translate", b'{"text": "caf\xe9"}', "application/json", 400, ["UTF-8", "0xe9"]),
    "empty-body": ("/translate", b"", "application/json", 422, ["JSON object"]),
    "array-body": ("/translate", [], "application/json", 422, ["JSON object"]),
    "string-body": ("/translate", "hello", "application/json", 422, ["JSON object"]),
    "text-not-string": ("/translate", {"text": 5}, "application/json", 422, ["text", "string"]),
    "texts-not-list": ("/translate", {"texts": "a b"}, "application/json", 422, ["texts", "list"]),
    "texts-item-not-string": ("/translate", {"texts": ["a", None]}, "application/json", 422, ["texts[1]", "string"]),
    "text-and-texts": ("/translate", {"text": "a", "texts": ["b"]}, "application/json", 422, ["exactly one"]),
    "neither": ("/translate", {}, "application/json", 422, ["exactly one"]),
    "unknown-field": ("/translate", {"txt": "a"}, "application/json", 422, ["txt", "not permitted"]),
    "beam-as-string": ("/translate", {**OK, "beam": "4"}, "application/json", 422, ["beam", "integer"]),
    "beam-zero": ("/translate", {**OK, "beam": 0}, "application/json", 422, ["beam", "greater than or equal to 1"]),
    "beam-too-big": ("/translate", {**OK, "beam": 1000}, "application/json", 422, ["beam", "at most 16"]),
    "n-best-over-beam": ("/translate", {**OK, "beam": 2, "n_best": 3}, "application/json", 422, ["n_best", "beam"]),
    "n-best-float": ("/translate", {**OK, "n_best": 1.5}, "application/json", 422, ["n_best", "integer"]),
    "lone-surrogate": ("/translate", b'{"text": "a \\ud800 b"}', "application/json", 422, ["surrogate"]),
    "lone-surrogate-in-texts": ("/translate", b'{"texts": ["a", "b \\udfff"]}', "application/json", 422,
                                ["texts[1]: contains an unpaired surrogate"]),  # which one: it said "texts"
    "text-too-long": ("/translate", {"text": "a" * 601}, "application/json", 413, ["601 characters", "600"]),
    "one-of-texts-too-long": ("/translate", {"texts": ["a", "b" * 700]}, "application/json", 413, ["text 1", "700"]),
    "too-many-texts": ("/translate", {"texts": ["a"] * 17}, "application/json", 413, ["17 texts", "16"]),
    "body-too-big": ("/translate", {"text": "a" * (2 << 20)}, "application/json", 413, ["bytes"]),
    "form-content-type": ("/translate", OK, "application/x-www-form-urlencoded", 415,
                          ["Content-Type: application/json"]),
    "attention-texts": ("/attention", {"texts": ["a"]}, "application/json", 422, ["text"]),
    "attention-too-long": ("/attention", {"text": "a" * 601}, "application/json", 413, ["601 characters"]),
    "attention-bad-beam": ("/attention", {**OK, "beam": -1}, "application/json", 422, ["beam"]),
}


def send(url: str, method: str, path: str, body: bytes = b"", content_type: str | None = None):
    """(status, headers, raw body) over one plain HTTP/1.1 connection."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        headers = {"Content-Type": content_type} if content_type else {}
        conn.request(method, path, body=body if method == "POST" else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_requests_get_a_clear_json_error(server, case):
    path, body, content_type, status, mentions = CASES[case]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    code, headers, raw = send(server.url, "POST", path, data, content_type)
    assert code == status, raw[:300]
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(raw)
    assert set(error) == {"error"} and isinstance(error["error"], str)
    assert "\n" not in error["error"]
    for m in mentions:
        assert m in error["error"], (m, error["error"])


def test_many_unknown_fields_are_one_short_error(server):
    """A 1 MB body of 90,000 unknown keys was 90,000 errors, built on the event loop (0.7 s),
    answered in one 3.6 MB line. Now one error naming three of them and the count."""
    body = {"text": "the dog runs", **{f"{i:x}": 0 for i in range(90_000)}}
    data = json.dumps(body, separators=(",", ":")).encode()
    assert len(data) <= ServeConfig().max_body_bytes
    code, _, raw = send(server.url, "POST", "/translate", data, "application/json")
    assert code == 422
    assert json.loads(raw) == {"error": "90,000 unknown fields ('0', '1', '2', ...); the fields are text, texts, "
                                        "beam, n_best"}
    assert server.post("/translate", OK)[0] == 200


@pytest.mark.parametrize("model, body, error", [
    ("TranslateRequest", {"texts": [0] * 100_000}, "texts[0]: Input should be a valid string"),
    ("TranslateRequest", {"texts": ["a", "b", 3, 4, 5]}, "texts[2]: Input should be a valid string"),
    ("AttentionRequest", {"text": "a", "layers": [-1] * 100_000},
     "layers[0]: Input should be greater than or equal to 0"),
    ("LMAttentionRequest", {"text": "a", "heads": ["0"] * 100_000}, "heads[0]: Input should be a valid integer"),
    ("GenerateRequest", {"prompt": "a", **{f"k{i}": 0 for i in range(4)}},
     "4 unknown fields ('k0', 'k1', 'k2', ...); the fields are prompt, max_new_tokens, temperature, top_k, top_p, "
     "seed, stream"),
    ("GenerateRequest", {"prompt": "a", **{f"k{i}": 0 for i in range(3)}},
     "k0: Extra inputs are not permitted; k1: Extra inputs are not permitted; k2: Extra inputs are not permitted"),
])
def test_a_request_has_few_errors_however_many_items_are_wrong(model, body, error):
    """Every list stops at its first bad item, and more than three unknown fields are one error:
    what the event loop builds for a 422 does not grow with the body."""
    from pydantic import ValidationError

    from transformer.serve import schemas
    from transformer.serve.errors import validation_message

    with pytest.raises(ValidationError) as e:
        getattr(schemas, model).model_validate(body)
    assert e.value.error_count() == (3 if "k2: Extra" in error else 1)
    assert validation_message(e.value.errors()) == error


def test_a_422_names_the_first_five_errors_and_counts_the_rest():
    from transformer.serve.errors import validation_message

    errors = [{"type": "string_type", "loc": ("body", "texts", i), "msg": "Input should be a valid string"}
              for i in range(12)] + [{"type": "extra_forbidden", "loc": ("body", "x" * 1000), "msg": "no"}]
    assert validation_message(errors) == ("; ".join(f"texts[{i}]: Input should be a valid string" for i in range(5))
                                          + "; and 8 more (13 errors)")
    assert validation_message(errors[-1:]) == "x" * 37 + "...: no"


def test_wrong_method_and_unknown_path_are_json_too(server):
    for method, path, status in (("GET", "/translate", 405), ("GET", "/nowhere", 404), ("POST", "/health", 405)):
        code, _, raw = send(server.url, method, path)
        assert code == status, (method, path)
        assert "error" in json.loads(raw)


def test_the_server_still_works_after_bad_requests(server):
    code, body = server.post("/translate", OK)
    assert code == 200 and body["translation"]
    assert "Traceback" not in server.log.read_text()


# ---- the command -----------------------------------------------------------------------

@pytest.fixture
def serve_cmd(capsys, monkeypatch):
    """``serve_cmd(*args)`` -> (exit code, stderr) of ``transformer serve ARGS`` run in-process;
    every case here must be refused before the server starts, so starting it fails the test."""
    import uvicorn

    from transformer.cli import main

    def started(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(uvicorn.Server, "run", started)

    def run(*args):
        capsys.readouterr()
        try:
            code = main(["serve", *map(str, args)])
        except SystemExit as e:
            code = e.code
        return code, capsys.readouterr().err

    return run


def assert_one_line_error(code, err, *mentions):
    assert code == 2, (code, err)
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("transformer serve: error: "), lines[0]
    for m in mentions:
        assert str(m) in lines[0], (m, lines[0])


def test_missing_model_dir_from_the_console_script(server, tmp_path):
    done = subprocess.run([server.process.args[0], "serve", "--model", str(tmp_path / "missing"), "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert_one_line_error(done.returncode, done.stderr, "missing")


def test_corrupt_model(serve_cmd, run_dir, tmp_path):
    bad = tmp_path / "run"
    bad.mkdir()
    (bad / "subwords.model").write_bytes((run_dir / "subwords.model").read_bytes())
    (bad / "best.safetensors").write_bytes((run_dir / "best.safetensors").read_bytes()[:4000])
    assert_one_line_error(*serve_cmd("--model", bad, "--port", 0), "best.safetensors")


def test_model_without_subwords(serve_cmd, run_dir, tmp_path):
    bad = tmp_path / "run"
    bad.mkdir()
    (bad / "best.safetensors").write_bytes((run_dir / "best.safetensors").read_bytes())
    assert_one_line_error(*serve_cmd("--model", bad, "--port", 0), "subwords.model")


def test_port_in_use(serve_cmd, run_dir, server):
    taken = urlsplit(server.url).port
    assert_one_line_error(*serve_cmd("--model", run_dir, "--port", taken), f"127.0.0.1:{taken}")


@pytest.mark.parametrize("args, mentions", [
    (["--port", "70000"], ["--port"]),
    (["--beam", "0"], ["--beam"]),
    (["--max-batch", "0"], ["--max-batch"]),
    (["--max-wait-ms", "-1"], ["--max-wait-ms"]),
    (["--max-chars", "0"], ["--max-chars"]),
    (["--threads", "-1"], ["--threads"]),
    (["--host", "no.such.host.invalid"], ["--host"]),
    (["--precision", "fp8"], ["--precision", "fp8"]),
    (["--max-queue", "0"], ["--max-queue must be positive, got 0"]),
    (["--timeout", "0"], ["--timeout must be a positive number of seconds"]),
    (["--token", ""], ["--token must be printable ASCII"]),
    (["--token", "two words"], ["--token must be printable ASCII"]),
    (["--max-work", "0"], ["--max-work must be positive, got 0"]),
    (["--header-timeout", "0"], ["--header-timeout must be a positive number of seconds"]),
    (["--header-timeout", "nan"], ["--header-timeout must be a positive number of seconds, got nan"]),
    # waits past the deadline: a request alone was answered 504, never translated
    (["--max-wait-ms", "inf"], ["--max-wait-ms must be at least 0 and below the timeout (60 s), got inf"]),
    (["--max-wait-ms", "nan"], ["--max-wait-ms", "got nan"]),
    (["--max-wait-ms", "2000", "--timeout", "2"], ["--max-wait-ms", "(2 s), got 2000"]),
], ids=["port", "beam", "max-batch", "max-wait", "max-chars", "threads", "host", "precision", "max-queue", "timeout",
        "token-empty", "token-space", "max-work", "header-timeout", "header-timeout-nan", "max-wait-inf",
        "max-wait-nan", "max-wait-timeout"])
def test_bad_options(serve_cmd, run_dir, args, mentions):
    assert_one_line_error(*serve_cmd("--model", run_dir, *args), *mentions)


def test_binds_loopback_by_default(server):
    from transformer.cli import build_parser

    assert urlsplit(server.url).hostname == "127.0.0.1"
    assert build_parser().parse_args(["serve", "--model", "x"]).host == "127.0.0.1"


@pytest.mark.parametrize("args, mentions", [
    (["--max-new-tokens", "2000"], ["--max-new-tokens 2000", "--new-tokens-limit 1024"]),
    (["--new-tokens-limit", "0"], ["--new-tokens-limit"]),
    (["--temperature", "-1"], ["--temperature"]),
    (["--top-p", "0"], ["--top-p"]),
], ids=["over-limit", "limit-zero", "temperature", "top-p"])
def test_bad_language_model_options(serve_cmd, lm_run, args, mentions):
    assert_one_line_error(*serve_cmd("--model", lm_run, *args), *mentions)


@pytest.mark.parametrize("args", [["--beam", "2"], ["--alpha", "0.5"], ["--max-tokens", "100"], ["--max-beam", "4"],
                                  ["--max-work", "1000"]], ids=lambda args: args[0])
def test_translation_options_on_a_language_model_are_refused(serve_cmd, lm_run, args):
    assert_one_line_error(*serve_cmd("--model", lm_run, *args), f"{args[0]} is for a translation model",
                          "a language model", f"(remove {args[0]})")


@pytest.mark.parametrize("args", [["--max-new-tokens", "8"], ["--temperature", "0"], ["--top-k", "0"],
                                  ["--top-p", "0.9"], ["--seed", "1"], ["--new-tokens-limit", "64"]],
                         ids=lambda args: args[0])
def test_language_model_options_on_a_translation_model_are_refused(serve_cmd, run_dir, args):
    assert_one_line_error(*serve_cmd("--model", run_dir, *args), f"{args[0]} is for a language model",
                          "a translation model", f"(remove {args[0]})")


def test_a_language_model_run_without_its_characters(serve_cmd, lm_run, tmp_path):
    bad = tmp_path / "run"
    bad.mkdir()
    for name in ("best.safetensors", "config.yaml"):
        (bad / name).write_bytes((lm_run / name).read_bytes())
    assert_one_line_error(*serve_cmd("--model", bad, "--port", 0), "chars.json")
