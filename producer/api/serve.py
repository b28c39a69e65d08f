"""`python -m producer serve`: the refusal to run open to the network, and uvicorn."""

from __future__ import annotations

import ipaddress
import sys
from typing import Any

import uvicorn

from examforge.errors import ConfigError
from examforge.settings import Settings
from producer.api import create_app


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_binding(settings: Settings, host: str, no_auth: bool, named_tokens: int = 0) -> None:
    """Without tokens the API would be open to whoever reaches it: allowed only when bound
    to a loopback address and asked for with --no-auth. Without any token (none named in the
    database, `named_tokens`, and API_TOKENS unset) it would refuse every request: said now.
    ConfigError (exit 2) otherwise."""
    if no_auth and not is_loopback(host):
        raise ConfigError(f"--no-auth is only allowed on a loopback address (--host "
                          f"127.0.0.1), not {host}: set API_TOKENS instead")
    if not no_auth and not settings.api_token_list() and not named_tokens:
        raise ConfigError("API_TOKENS is not set and the database has no named token: add "
                          "one (python -m producer token add NAME --role ROLE) or set "
                          "API_TOKENS, or bind to a loopback address with --no-auth")


def serve(settings: Settings, host: str, port: int, *, local: bool, no_auth: bool) -> None:
    app = create_app(settings, local, no_auth=no_auth)
    mode = "work done in this process" if local else "work enqueued to Celery"
    where = f"http://{'[' + host + ']' if ':' in host else host}:{port}"

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:  # bound: say where (uvicorn's own line is below its log level)
                print(f"examforge API on {where} ({mode}{', no auth' if no_auth else ''}); "
                      f"the page is {where}/, Ctrl-C stops it", file=sys.stderr, flush=True)

    # Open event streams would hold a graceful shutdown forever: they get a few seconds.
    Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          timeout_graceful_shutdown=5, lifespan="on")).run()
