"""``etsdk serve PROGRAM.pte``: its arguments, the start-up checks and report, and uvicorn.

Binds 127.0.0.1 by default; any other address needs ``--api-key`` (or ``ETSDK_API_KEY``), refused at start
otherwise. Ctrl-C or SIGTERM stops accepting connections, lets the requests in flight finish (``--drain-seconds``),
saves the slots to ``--session-dir`` when given, and exits 0. Imports nothing heavy until it runs.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Iterator

from etsdk import EtsdkError

__all__ = ["configure_serve", "run_serve"]

#: the variable ``--api-key`` defaults to (a key on the command line shows in the process list)
API_KEY_ENV = "ETSDK_API_KEY"


def configure_serve(serve: argparse.ArgumentParser) -> None:
    from etsdk_hf_static.apps.commands import add_sampling_arguments

    serve.add_argument("program", help="the .pte")
    serve.add_argument("--data", default=None, help="its .ptd (default: <stem>.ptd beside the .pte, if there is one)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --api-key)")
    serve.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free port, printed)")
    serve.add_argument(
        "--slots", type=int, default=1, metavar="N",
        help="conversations served at once, each with its own caches (default 1; memory per slot is printed)",
    )
    serve.add_argument("--queue", type=int, default=16, metavar="N",
                       help="requests that may wait for a slot; more get 503 with Retry-After (default 16)")
    serve.add_argument("--api-key", default=None,
                       help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV})")
    serve.add_argument("--model-name", default=None, help="the model id clients name (default: the program's file stem)")
    serve.add_argument("--session-dir", default=None, metavar="DIR",
                       help="keep the slots' conversations here across restarts (saved at exit, restored at start)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="N",
                       help="largest request body accepted (default 1 MiB; larger: 413)")
    serve.add_argument("--drain-seconds", type=float, default=30.0, metavar="S",
                       help="at Ctrl-C / SIGTERM, how long requests in flight may take to finish (default 30)")
    add_sampling_arguments(serve)  # the defaults of fields a request leaves out
    serve.add_argument("--verbose", action="store_true", help="also show other libraries' warnings and uvicorn's access log")


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from etsdk_hf_static.apps.commands import sampling_from_args

    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    if not loopback(args.host) and not api_key:
        raise EtsdkError(
            f"--host {args.host} is reachable from other machines: give --api-key KEY (or set {API_KEY_ENV}), "
            "or bind 127.0.0.1"
        )
    for flag, value, low in (("--slots", args.slots, 1), ("--queue", args.queue, 0), ("--max-body-bytes", args.max_body_bytes, 1024)):
        if value < low:
            raise EtsdkError(f"{flag} must be at least {low}, found {value}")
    if not args.drain_seconds >= 0:
        raise EtsdkError(f"--drain-seconds must be 0 or more, found {args.drain_seconds}")
    if not 0 <= args.port <= 65535:
        raise EtsdkError(f"--port must be in 0..65535, found {args.port}")
    sampling = sampling_from_args(args)
    _check_address(args.host, args.port)  # before the program loads: seconds
    from etsdk_hf_static.apps.serve.app import MISSING_EXTRA, ServeConfig, create_app

    try:
        import uvicorn
    except ImportError:
        raise EtsdkError(MISSING_EXTRA) from None

    from etsdk_hf_static.apps.chat import chat_runner
    from etsdk_hf_static.apps.commands import open_runner

    runner = chat_runner(open_runner(args.program, args.data))
    config = ServeConfig(
        slots=args.slots, queue=args.queue, api_key=api_key, model_name=args.model_name,
        max_body_bytes=args.max_body_bytes, session_dir=Path(args.session_dir) if args.session_dir else None,
        sampling=sampling, drain_seconds=args.drain_seconds,
    )
    app = create_app(runner, config)
    meta = runner.metadata
    per_slot = app.state.engine.slot_bytes
    batch, spares = runner.decode_batch, app.state.engine.spare_count
    together = (
        f"; decode steps of up to {batch} requests run together (decode_batch){f', {spares} spare slot(s)' if spares else ''}"
        if batch and args.slots > 1 else
        "; one decode step per request (the program has no decode_batch: export it with --decode-batch 4 to batch them)"
        if args.slots > 1 else ""
    )
    print(
        f"etsdk serve: {app.state.model_name}: {args.slots} slot(s) of {meta.context_length} rows, "
        f"{_mib(per_slot)} of caches per slot ({_mib(per_slot * (args.slots + spares))} in all){together}; "
        f"queue {args.queue}",
        file=sys.stderr, flush=True,
    )
    server = uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning",
        access_log=args.verbose, timeout_graceful_shutdown=int(args.drain_seconds) + 1, lifespan="on",
    ))
    _announce(server, args.host)
    _drain_on_signals(server)
    server.run()
    if server.force_exit:  # a second Ctrl-C: the requests in flight were cut, the slots not saved
        print("etsdk serve: stopped without draining (the requests in flight were cut off, no slot saved)",
              file=sys.stderr, flush=True)
        return 130
    return 0 if server.started else 1


def _announce(server: object, host: str) -> None:
    """Print the address once uvicorn listens (with --port 0, the port it got)."""
    import uvicorn

    assert isinstance(server, uvicorn.Server)
    startup = server.startup

    async def announced(sockets: object = None) -> None:
        await startup(sockets=sockets)  # type: ignore[arg-type]
        for listener in server.servers:
            for sock in listener.sockets:
                port = sock.getsockname()[1]
                shown = f"[{host}]" if ":" in host else host
                print(f"etsdk serve: listening on http://{shown}:{port}/v1 (Ctrl-C stops after the requests in flight)",
                      file=sys.stderr, flush=True)

    server.startup = announced  # type: ignore[method-assign]


def _check_address(host: str, port: int) -> None:
    """Refuse an address this process cannot listen on (in use, not this machine's) in one line, before loading."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise EtsdkError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise EtsdkError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (another --port?)") from None


def _drain_on_signals(server: object) -> None:
    """Ctrl-C / SIGTERM: stop accepting, let the requests in flight finish, exit 0 (a second Ctrl-C: now).

    uvicorn's own handling re-raises the signal after its shutdown, which ends the process with status 130 / 143
    even after a clean drain; here the signal only asks the server to exit.
    """
    import contextlib
    import signal
    import threading

    import uvicorn

    assert isinstance(server, uvicorn.Server)

    def handle(signum: int, frame: object) -> None:
        if not server.should_exit:
            print(f"etsdk serve: {signal.Signals(signum).name}: finishing the requests in flight, then exiting "
                  "(Ctrl-C again: now)", file=sys.stderr, flush=True)
            server.should_exit = True
        elif signum == signal.SIGINT:
            server.force_exit = True

    @contextlib.contextmanager
    def capture() -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    server.capture_signals = capture  # type: ignore[method-assign]


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB"
