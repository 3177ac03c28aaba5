"""The dataset registry: data-folder resolution, local Multi30k, and (fake) downloads."""

import hashlib
from pathlib import Path

import pytest

from transformer.data import MULTI30K, find_data_dir, load_multi30k
from transformer.errors import UserError


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No $TRANSFORMER_DATA and a throwaway home directory."""
    monkeypatch.delenv("TRANSFORMER_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_find_data_dir_resolution_order(clean_env, monkeypatch):
    home = clean_env / "home"
    assert find_data_dir(None) == home / ".cache" / "transformer" / "data"
    monkeypatch.setenv("TRANSFORMER_DATA", str(clean_env / "from_env"))
    assert find_data_dir(None) == clean_env / "from_env"
    assert find_data_dir(clean_env / "option") == clean_env / "option"
    assert find_data_dir("~/x") == home / "x"


class FakeFetcher:
    """Serves file bytes by URL from a dict and records the URLs asked for."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.urls: list[str] = []

    def __call__(self, url: str) -> bytes:
        self.urls.append(url)
        return self.files[url]


def _published(root: Path, split: str, lang: str) -> tuple[str, bytes]:
    name = MULTI30K.file_name(split, lang)
    return MULTI30K.url.format(split=split, lang=lang), (root / "multi30k" / name).read_bytes()


def test_checksum_table_matches_local_copy(multi30k_root):
    for name, digest in MULTI30K.sha256.items():
        assert hashlib.sha256((multi30k_root / "multi30k" / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("split", MULTI30K.splits)
def test_load_local_multi30k(multi30k_root, split):
    pairs = load_multi30k(split, "de", "en", data_dir=multi30k_root, download=False,
                          fetch=lambda url: pytest.fail(f"tried to download {url}"))
    assert len(pairs) == MULTI30K.line_counts[split]
    if split == "train":
        assert pairs[0] == ("Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
                            "Two young, White males are outside near many bushes.")


def test_env_var_is_used_when_no_option(multi30k_root, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_DATA", str(multi30k_root))
    assert len(load_multi30k("val", "en", "fr", download=False)) == 1014


def test_download_with_fake_fetcher(multi30k_root, clean_env):
    urls = dict(_published(multi30k_root, "val", lang) for lang in ("en", "cs"))
    fetch = FakeFetcher(urls)
    cache = clean_env / "cache"
    pairs = load_multi30k("val", "en", "cs", data_dir=cache, fetch=fetch)
    assert len(pairs) == 1014
    assert sorted(fetch.urls) == sorted(urls)
    assert all(u.startswith("https://raw.githubusercontent.com/multi30k/dataset/") for u in fetch.urls)
    assert sorted(p.name for p in (cache / "multi30k").iterdir()) == ["val.cs.gz", "val.en.gz"]
    # Second call: files are cached, nothing is fetched.
    assert load_multi30k("val", "en", "cs", data_dir=cache, fetch=FakeFetcher({})) == pairs


def test_checksum_mismatch_writes_nothing(clean_env):
    url = MULTI30K.url.format(split="val", lang="en")
    cache = clean_env / "cache"
    with pytest.raises(UserError, match="checksum mismatch.*val.en.gz"):
        load_multi30k("val", "en", "de", data_dir=cache, fetch=FakeFetcher({url: b"tampered"}))
    assert not (cache / "multi30k").exists() or list((cache / "multi30k").iterdir()) == []


def test_missing_files_without_download(clean_env):
    with pytest.raises(UserError, match="val.en.gz.*not found"):
        load_multi30k("val", "en", "de", data_dir=clean_env, download=False)


@pytest.mark.parametrize("args, listed", [
    (("dev", "en", "de"), "train, val, test_2016_flickr"),
    (("val", "xx", "de"), "en, de, fr, cs"),
    (("val", "en", "ja"), "en, de, fr, cs"),
])
def test_unknown_split_or_language_lists_valid_ones(clean_env, args, listed):
    with pytest.raises(UserError, match=listed):
        load_multi30k(*args, data_dir=clean_env, fetch=FakeFetcher({}))


def test_same_language_twice_is_rejected(clean_env):
    with pytest.raises(UserError, match="different languages"):
        load_multi30k("val", "en", "en", data_dir=clean_env, fetch=FakeFetcher({}))


def test_failed_download_names_where_the_file_goes(clean_env, monkeypatch):
    """Offline: the error names the path a copy made by hand must have (the data folder's
    multi30k/ and the file name), not just "the data folder"."""
    import urllib.error
    import urllib.request

    def offline(*args, **kwargs):
        raise urllib.error.URLError("Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    cache = clean_env / "cache"
    with pytest.raises(UserError, match="check the network") as e:
        load_multi30k("val", "en", "de", data_dir=cache)
    assert str(e.value).endswith(f"or place the file at {cache / 'multi30k' / 'val.en.gz'}")


def test_size_table_matches_local_copy(multi30k_root):
    assert MULTI30K.sizes.keys() == MULTI30K.sha256.keys()
    for name, size in MULTI30K.sizes.items():
        assert (multi30k_root / "multi30k" / name).stat().st_size == size, name


@pytest.fixture
def endless_server():
    """An HTTP server on 127.0.0.1 whose every answer is endless (1 MiB chunks of zeros until
    the client hangs up, or 256 MiB: a client that reads it all still ends, in bounded memory);
    yields (base URL, a queue of the bytes each answer managed to send)."""
    import http.server
    import queue
    import threading

    sent: queue.Queue[int] = queue.Queue()

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the library's name)
            self.send_response(200)
            self.end_headers()
            total, chunk = 0, bytes(1 << 20)
            try:
                while total < 256 << 20:
                    self.wfile.write(chunk)
                    total += len(chunk)
            except OSError:  # the client hung up
                pass
            sent.put(total)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", sent
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


def test_a_download_that_passes_the_published_size_is_stopped_and_nothing_kept(clean_env, endless_server,
                                                                                monkeypatch):
    """fetch_url read a whole download into memory: a server (or a man in the middle of a
    mirror) that never stops sending took all of it. Now the download streams into a
    temporary file and stops once it passes the file's published size: one line, nothing kept."""
    import dataclasses

    import transformer.data.registry as registry

    base, sent = endless_server
    monkeypatch.setattr(registry, "MULTI30K", dataclasses.replace(MULTI30K, url=base + "/{split}.{lang}.gz"))
    cache = clean_env / "cache"
    with pytest.raises(UserError) as caught:
        registry.multi30k_path("val", "en", data_dir=cache)
    target = cache / "multi30k" / "val.en.gz"
    assert str(caught.value) == (f"could not download {base}/val.en.gz: it passed 21,650 bytes, the size of the "
                                 f"published file, and was stopped there; retry, or place a verified copy at {target}")
    assert list((cache / "multi30k").iterdir()) == []  # no temporary either
    assert sent.get(timeout=30) < 64 << 20  # the connection was closed there (the server sent what the buffers held)


def test_fetch_url_stops_at_its_limit(endless_server):
    """Called alone (no published size), fetch_url gives chunks up to its limit (1 GiB unless
    told) and then a one-line error."""
    from transformer.data import fetch_url

    base, _ = endless_server
    got = 0
    with pytest.raises(UserError) as caught:
        for chunk in fetch_url(base + "/any", limit=300_000):
            assert len(chunk) <= 1 << 16
            got += len(chunk)
    assert got <= 300_000
    assert str(caught.value) == (f"could not download {base}/any (it passed 300,000 bytes, more than any file this "
                                 "downloads; stopped there)")
