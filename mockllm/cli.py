"""The ``mock-llm`` command: serve until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from mockllm.config import MockConfig
from mockllm.service import MockService

DEFAULT_PORT = 8089


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mockllm", description="OpenAI-compatible mock LLM with fault injection.")
    defaults = MockConfig()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--latency-s", type=float, default=defaults.latency_s)
    parser.add_argument("--questions-per-reply", type=int, default=None)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--fault-rate", type=float, default=defaults.fault_rate)
    parser.add_argument("--faults", default=",".join(defaults.faults), help="comma-separated fault names")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--retry-after-s", type=float, default=defaults.retry_after_s)
    parser.add_argument("--stall-s", type=float, default=defaults.stall_s)
    return parser


async def _serve_until_signalled(service: MockService, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    bound_port = await service.listen(host, port)
    print(f"mock-llm listening on http://{host}:{bound_port}/v1", flush=True)
    await stop.wait()
    await service.close()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: serve until SIGTERM/SIGINT, then exit 0."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        config = MockConfig(
            latency_s=args.latency_s,
            questions_per_reply=args.questions_per_reply,
            api_key=args.api_key,
            fault_rate=args.fault_rate,
            faults=args.faults,
            seed=args.seed,
            retry_after_s=args.retry_after_s,
            stall_s=args.stall_s,
        )
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(_serve_until_signalled(MockService(config), args.host, args.port))
    except KeyboardInterrupt:  # a signal that beat the handler installation
        pass
    except OSError as exc:
        sys.stderr.write(f"mock-llm: cannot listen on {args.host}:{args.port}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
