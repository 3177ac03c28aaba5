"""``transformer serve``: a translation or language-model service over HTTP and the attention
explorer page; the run's config says which kind of model it is."""
from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import secrets
import socket
import sys

from ._options import (SAMPLING_OPTIONS, SEARCH_OPTIONS, add_decoding_options, decoding_options, prepare_compiled,
                       refuse_options)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a translation or language model over HTTP (JSON API) and the attention "
                                     "explorer page", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="run directory or .safetensors file")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000,
                   help="port (default: %(default)s; 0: any free port, the address is printed)")
    p.add_argument("--max-batch", type=int, default=32, help="most texts decoded together (default: %(default)s)")
    p.add_argument("--max-wait-ms", type=float, default=5.0,
                   help="how long a request waits for others to batch with, in milliseconds (default: %(default)s)")
    p.add_argument("--no-batching", action="store_true", help="decode each request alone (for comparison)")
    p.add_argument("--max-chars", type=int, default=1000,
                   help="longest text (or prompt) accepted, in characters (default: %(default)s)")
    p.add_argument("--max-texts", type=int, default=64, help="most texts in one request (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--max-beam", type=int, help="the largest beam a request may ask for (translation; default: 16)")
    p.add_argument("--max-work", type=int, metavar="N",
                   help="the most work one request may ask for, in source tokens x beam (its texts' subword tokens, "
                        "summed, times the beam); a larger one is a 413 (translation; default: 20000)")
    p.add_argument("--new-tokens-limit", type=int, metavar="N",
                   help="the most tokens a /generate request may ask for (language model; default: 1024)")
    p.add_argument("--max-queue", type=int, default=128, metavar="N",
                   help="the most requests waiting for the model; beyond it 503 with Retry-After (default: 128)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="a request not answered within this many seconds gets 504 and is dropped (default: 60)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="a connection that has not sent a request's headers within this many seconds of opening "
                        "(or of its last answer) is closed (default: 10)")
    p.add_argument("--token", default=None,
                   help="require 'Authorization: Bearer TOKEN' on every route but /health and the page "
                        "(which takes it from #token= in its address) (default: "
                        "$TRANSFORMER_SERVE_TOKEN; the variable keeps it out of the process list; else none on "
                        "loopback, and a fresh one, printed, on any other address)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME", dest="allowed_hosts",
                   help="also answer requests whose Host header names NAME (repeatable); others get 403 (default: "
                        "the --host address, and localhost for a loopback one; on every address (0.0.0.0, ::): "
                        "localhost, this machine's name and any IP address)")
    p.add_argument("--docs", action="store_true",
                   help="serve FastAPI's API page at /docs; it loads its script and styles from a CDN "
                        "(cdn.jsdelivr.net), so the browser that opens it needs the network and tells that site "
                        "(default: off; /openapi.json describes the API either way)")
    p.add_argument("--max-attention", type=int, default=2_000_000, metavar="N",
                   help="the most attention weights one /attention answer may hold (layers x heads x the maps' "
                        "cells); a larger one is a 413 (default: 2000000)")
    p.add_argument("--max-lens", type=int, default=20_000_000, metavar="N",
                   help="the most logits one /lens request may compute (layers + 1 x positions x vocabulary); "
                        "more is a 413 (default: 20000000)")
    p.add_argument("--max-head-work", type=int, default=20_000, metavar="N",
                   help="the most heads x positions one /heads request may run; more is a 413 (default: 20000)")
    add_decoding_options(p, "beam", "alpha", "max_tokens", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
                         "precision", "device", "compile")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=run)


DESCRIPTION = """\
Serve the model of a run over HTTP: POST /translate for a translation model, POST /generate
for a language model (the run's config says which; GET /health tells clients), POST
/attention for the explorer page at /. --beam, --alpha, --max-tokens, --max-beam and
--max-work apply to a translation model; --max-new-tokens, --temperature, --top-k, --top-p,
--seed and --new-tokens-limit to a language model (the defaults of requests that do not give
them, and their limits); one given for the other kind is a one-line error.

POST /generate takes {"prompt": "...", "max_new_tokens": N, "temperature": T, "top_k": K,
"top_p": P, "seed": S} (all but the prompt optional) and answers {"text": ..., "tokens": N,
"prompt_tokens": N, "truncated": false, "seed": S}; the same seed gives the same text. With
"Accept: text/event-stream" (or "stream": true) the tokens come as server-sent events as
they are made, "data: {"text": ..., "token": id}" each, then "event: done" with the answer:

    curl -N -H 'Accept: text/event-stream' -H 'Content-Type: application/json' \\
         -d '{"prompt": "ROMEO:", "seed": 1}' http://127.0.0.1:8000/generate

Under load it says no rather than drowning: more than --max-queue waiting requests get 503
with Retry-After, a request not answered within --timeout seconds gets 504 and is dropped (a
stream too, while it waits for its first token), and a request whose client went away is not
decoded. A translation request asks for at most --max-work source tokens x beam (413
beyond). A connection that has not sent a request's headers within --header-timeout seconds
is closed; such connections do not count against the connection limit.

It listens on 127.0.0.1 unless --host says otherwise. Elsewhere it wants a token: give one
(TRANSFORMER_SERVE_TOKEN=... or --token), or it makes one and prints it; clients send
"Authorization: Bearer TOKEN" (GET /health and the page stay open; the page takes the token
from #token=... in its address, which the start-up line prints). A request whose Host header
names another host than the one it listens on gets 403 (a page elsewhere reaching a local
server through DNS rebinding); --allow-host NAME adds a name. One /attention answer holds at
most --max-attention weights; a request may ask for some "layers" and "heads" only. /docs
(Swagger's page, from a CDN) is served with --docs only. POST /lens (the logit lens) and
POST /heads (each head's effect, ablated or patched in from a "corrupt" sentence) read one
sentence, bounded by --max-lens and --max-head-work.

Needs the serve extra (fastapi, uvicorn): pip install '.[serve]' (in the project's folder).
"""


def _given(args: argparse.Namespace, name: str, value) -> str:
    """A decoding setting as the user knows it: the option they gave, or the run's default
    (an imported model's comes from its generation_config.json)."""
    if getattr(args, name) is not None:
        return f"--{name.replace('_', '-')} {value}"
    return f"the run's default {name} ({value})"


def _remedy(args: argparse.Namespace, name: str, limit: str) -> str:
    if getattr(args, name) is not None:
        return ""
    return f"; give --{name.replace('_', '-')} N, or a larger --{limit.replace('_', '-')}"


def _settings(args: argparse.Namespace):
    from ..errors import UserError
    from ..serve import ServeConfig
    from ..serve.serve_config import TOKEN_ENV

    if not 0 <= args.port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {args.port}")
    if args.threads < 0:
        raise UserError(f"--threads must be at least 0, got {args.threads}")
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    limits = {name: getattr(args, name) for name in ("max_beam", "max_work", "new_tokens_limit")
              if getattr(args, name) is not None}
    try:
        return ServeConfig(**limits, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                           batching=not args.no_batching, max_chars=args.max_chars, max_texts=args.max_texts,
                           max_queue=args.max_queue, timeout=args.timeout,
                           header_timeout=args.header_timeout, token=token, max_attention=args.max_attention,
                           max_lens=args.max_lens, max_head_work=args.max_head_work,
                           allowed_hosts=allowed_hosts(args.host, args.allowed_hosts), docs=args.docs)
    except ValueError as e:  # the message names the setting; give it its option's spelling
        raise UserError("--" + str(e).replace("_", "-")) from None


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def allowed_hosts(host: str, extra: list[str]) -> tuple[str, ...]:
    """The names a request's Host header may give a server listening on ``host`` (see
    serve.guard): that address, the loopback names for a loopback one, and ``extra``
    (--allow-host). A server on every address (0.0.0.0, ::) cannot know all the names it is
    reached by: it answers the loopback names, this machine's name and, because its own
    address is among its names, any IP address (serve.guard)."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    everywhere = address is not None and address.is_unspecified
    loopback = host == "localhost" or (address is not None and address.is_loopback)
    names = [host.strip("[]"), *(LOOPBACK_NAMES if loopback or everywhere else ()),
             *((socket.gethostname(),) if everywhere else ()), *extra]
    return tuple(dict.fromkeys(n.lower() for n in names if n))


def _listen(host: str, port: int) -> socket.socket:
    """Bind before loading anything big, so a taken port is a one-line error, not a log."""
    from ..errors import UserError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UserError(f"--host {host}: cannot resolve it ({e.strerror})") from None
    family, kind, proto, _, addr = infos[0]
    # proto must say TCP (not 0): asyncio turns Nagle's algorithm off only on sockets that
    # do, and with it on every keep-alive response waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _loopback(sock: socket.socket) -> bool:
    """Whether ``sock`` listens on a loopback address only (not 0.0.0.0, ::, or a LAN address)."""
    try:
        return ipaddress.ip_address(sock.getsockname()[0].split("%")[0]).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from ..extras import require

    require("fastapi", "serve", "the server")
    uvicorn = require("uvicorn", "serve", "the server")
    import torch

    from ..errors import UserError
    from ..inference.front_door import run_decoding
    from ..hardware import device_line, slow_precision_warning
    from ..run import read_model_config
    from ..serve import create_app
    from ..serve.connections import protocol
    from ..serve.serve_config import TOKEN_ENV

    # checked before the port is taken
    lm = read_model_config(args.model).decoder_only
    if lm:
        refuse_options(args, (*SEARCH_OPTIONS, "max_tokens", "max_beam", "max_work"), "for a translation model",
                       f"{args.model} is a language model, served on /generate")
    else:
        refuse_options(args, (*SAMPLING_OPTIONS, "new_tokens_limit"), "for a language model",
                       f"{args.model} is a translation model, served on /translate")
    cfg = _settings(args)
    decoding = run_decoding(args.model, decoding_options(args))
    if lm and decoding.max_new_tokens > cfg.new_tokens_limit:
        raise UserError(f"{_given(args, 'max_new_tokens', decoding.max_new_tokens)} is larger than --new-tokens-limit "
                        f"{cfg.new_tokens_limit}{_remedy(args, 'max_new_tokens', 'new_tokens_limit')}")
    if not lm and decoding.beam > cfg.max_beam:
        raise UserError(f"{_given(args, 'beam', decoding.beam)} is larger than --max-beam {cfg.max_beam}"
                        f"{_remedy(args, 'beam', 'max_beam')}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if note := slow_precision_warning(decoding.precision, decoding.device):
        print(f"warning: {note}", file=sys.stderr, flush=True)
    sock = _listen(args.host, args.port)
    made = cfg.token is None and not _loopback(sock)
    if made:  # anyone who can reach the address could use the model: a token for this run, printed, as Jupyter does
        cfg = dataclasses.replace(cfg, token=secrets.token_urlsafe(24))
    try:
        loaded = _load(args.model, decoding, lm)
        app = create_app(loaded, cfg, model_name=str(args.model))
        host, port = sock.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        how = (f"language model; up to {decoding.max_new_tokens} new tokens; temperature {decoding.temperature}"
               if lm else f"beam {decoding.beam}")
        shows_token = args.token is not None or made  # see _page_url
        note = ""
        if made:
            note = (f"; a token made for this run, as {args.host} is not a loopback address: clients send "
                    f"'Authorization: Bearer TOKEN'; set {TOKEN_ENV} to choose it")
        elif cfg.token is not None and not shows_token:
            note = f"; ${TOKEN_ENV} goes in place of ..."
        print(f"transformer serve: {_page_url(shown, port, cfg.token, shows_token)} (model {args.model}; {how}; "
              f"{loaded.decoding.precision} on {device_line(loaded.device)}; "
              f"{'batching up to ' + str(cfg.max_batch) if cfg.batching else 'no batching'}{note})",
              file=sys.stderr, flush=True)
        # limit_concurrency: uvicorn's own 503 for a flood of requests (above the queue's); the
        # protocol keeps connections waiting for their headers out of it and closes them at
        # --header-timeout (serve.connections); timeout_keep_alive: idle ones close sooner
        server = uvicorn.Server(uvicorn.Config(app, http=protocol(cfg), log_level="warning",
                                               access_log=args.access_log, limit_concurrency=cfg.connection_limit,
                                               timeout_keep_alive=5, timeout_graceful_shutdown=5))
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0


def _page_url(host: str, port: int, token: str | None, show_token: bool) -> str:
    """The explorer page's address for the start-up line; with a token, ending in ``#token=``
    as Jupyter's does, so opening it is all it takes (the page reads the token from the
    fragment, which browsers never send, and drops it from the address bar).

    A token given with --token is shown: it is on the command line already (the process
    list, the shell's history); so is one made for the run (nobody would know it otherwise,
    and it lives as long as the process). One from TRANSFORMER_SERVE_TOKEN is not (``#token=...``, to
    fill in, as Jupyter prints a token it did not make itself): the variable is how a user
    keeps it out of sight, and this line often lands in a log more people read (a service
    manager's, a container's).
    """
    from urllib.parse import quote

    url = f"http://{host}:{port}/"
    if token is None:
        return url
    return f"{url}#token={quote(token, safe='') if show_token else '...'}"


def _load(model: str, decoding, lm: bool):
    """The run's model, ready to serve: a language model's Generator or a Translator."""
    from ..inference.generator import Generator
    from ..inference.translator import load_translator

    loaded = (Generator.from_pretrained(model, warn=False, **decoding.to_dict()) if lm
              else load_translator(model, **decoding.to_dict()))
    prepare_compiled(loaded)  # before the first request
    return loaded
