"""Command line: thin. Arguments -> validated settings -> run.

Every ``serve`` flag is generated from the :class:`~sidecar.config.Settings` model, so a
new setting is a flag, an ``LLM_SIDECAR_*`` variable and a YAML key at once.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, NoReturn, get_args, get_origin

from pydantic.fields import FieldInfo

from . import __version__
from .config import (
    ENV_PREFIX,
    ConfigError,
    Settings,
    did_you_mean,
    load_settings,
    parse_host_port,
)

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """No abbreviations (``--metrics`` is not ``--metrics-listen``: a later ``--metrics-*``
    flag would change what a script means), and a misspelt command gets the closest one.
    Subcommands' parsers are of this class too (argparse makes them ``type(parser)``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        if message.startswith("argument ") and "invalid choice: '" in message:
            given = message.split("invalid choice: '", 1)[1].split("'", 1)[0]
            choices = [
                name
                for action in self._actions
                if isinstance(action, argparse._SubParsersAction)
                for name in action.choices
            ]
            message += did_you_mean(given, choices)
        super().error(message)


def flag(name: str) -> str:
    """The ``serve`` flag of setting ``name``."""
    return "--" + name.replace("_", "-")


def _metavar(name: str, info: FieldInfo) -> str | None:
    """What the value of a setting's flag looks like (None: argparse's own, e.g. choices)."""
    kind = info.annotation
    if name == "upstream":
        return "URL"
    if name in ("listen", "metrics_listen"):
        return "HOST:PORT"
    if name.endswith("_path"):
        return "PATH"
    if name == "tenant_header":
        return "HEADER"
    if name == "workers":
        return "{N,auto}"
    if get_origin(kind) is Literal:
        return None
    if kind is bool:
        return "BOOL"
    if kind is float:
        return "SECONDS"
    if kind is int:
        return "BYTES" if name.endswith("_bytes") else "N"
    if get_origin(kind) is dict:
        return "JSON"
    if get_origin(kind) is list:
        return "N1,N2" if get_args(kind) == (int,) else "A,B"
    return "TEXT"


def _comma_list(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def _add_settings_flags(parser: argparse.ArgumentParser) -> None:
    for name, info in Settings.model_fields.items():
        help_text = (info.description or "").replace("%", "%%")
        env = ENV_PREFIX + name.upper()
        default = (
            ""
            if info.is_required()
            else f" (default: {info.get_default(call_default_factory=True)!r})"
        )
        kwargs: dict[str, Any] = {
            "dest": name,
            "default": None,
            "help": f"{help_text}{default} [env {env}]",
            "metavar": _metavar(name, info),
        }
        if name == "model_allowlist":
            kwargs["type"] = _comma_list
        if get_origin(info.annotation) is Literal:
            kwargs["choices"] = get_args(info.annotation)
        parser.add_argument(flag(name), **kwargs)
    parser.add_argument(
        "--config",
        dest="config",
        default=None,
        metavar="FILE",
        help=f"YAML settings file [env {ENV_PREFIX}CONFIG]",
    )


SIMULATOR_HEADERS_HELP = """\
per-request headers (any x-sim-* header makes the whole request exact: means, no jitter,
no random failures):
  x-sim-ttft: SECONDS        time to first token
  x-sim-tpot: SECONDS        time per output token
  x-sim-tokens: N            exact output tokens per choice (not capped by max_tokens)
  x-sim-reasoning: N         reasoning tokens first (chat, Responses, Anthropic, Ollama)
  x-sim-fail: MODE           500 | drop (cut mid-stream) | stream (in-stream error event) |
                             reset (abort before any header; every route); on
                             /v1/chat/completions and /v1/completions also truncate (no
                             [DONE]) | stall (hold the connection) | longline
  x-sim-line-bytes: N        length of the longline fault's one line (default 4 MiB)
  x-sim-tool-calls: N        the answer is N parallel tool calls (0-16), streamed as each
                             API does (chat, Responses, Anthropic, Ollama /api/chat);
                             each call takes at least 2 of the tokens
  x-sim-cached-tokens: N     prompt tokens the usage reports as read from the prefix cache
                             (chat's prompt_tokens_details, Responses, Anthropic)
"""


class _DefaultsAndRawEpilog(
    argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter
):
    """Each option's default in its help, and the epilog's table kept as written."""


def _env(name: str, default: object) -> object:
    return os.environ.get(ENV_PREFIX + name.upper(), default)


def _env_option(parser: argparse.ArgumentParser) -> Callable[[str, type, object, str], None]:
    """``add(flag, kind, default, help)``: an option whose default the environment may set
    (``--tokens-spread``: ``LLM_SIDECAR_TOKENS_SPREAD``), read as ``kind``."""

    def add(option: str, kind: type, default: object, help: str) -> None:
        parser.add_argument(
            option,
            type=kind,
            default=kind(_env(option[2:].replace("-", "_"), default)),
            help=help,
        )

    return add


def _version_text() -> str:
    """``llm-sidecar 0.1.0 (Python 3.11.2, C speedups on)``; a warning line when they are off."""
    from .base.speedups import IN_C, SPEEDUPS_MISSING  # noqa: PLC0415 - loads the extension

    text = f"llm-sidecar {__version__} (Python {platform.python_version()}, C speedups {'on' if IN_C else 'off'})"
    return text if IN_C else f"{text}\nwarning: {SPEEDUPS_MISSING}"


class _Version(argparse.Action):
    """argparse's version action, without its re-wrapping of the text into one paragraph."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str = argparse.SUPPRESS,
        default: object = argparse.SUPPRESS,
        help: str | None = None,
    ) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(_version_text())
        parser.exit()


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="llm-sidecar",
        description="Latency observability sidecar for LLM inference servers.",
    )
    parser.add_argument(
        "--version",
        action=_Version,
        help="show the version (and whether the C speedups are loaded) and exit",
    )
    # Not required: a bare `llm-sidecar` prints this help (the commands), not an error.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    # --upstream is required, but may come from the environment or --config instead of a
    # flag, so argparse cannot enforce it; the usage line says so and load_settings checks.
    serve = sub.add_parser(
        "serve",
        help="run the measuring reverse proxy",
        usage="llm-sidecar serve --upstream URL [options]",
    )
    _add_settings_flags(serve)

    sim = sub.add_parser(
        "simulate",
        help="run a simulated inference server (OpenAI/vLLM, Responses, Anthropic, TGI, Ollama, llama.cpp, Triton wire formats)",
        formatter_class=_DefaultsAndRawEpilog,
        epilog=SIMULATOR_HEADERS_HELP,
    )
    sim_option = _env_option(sim)
    sim_option("--listen", str, "0.0.0.0:8000", "HOST:PORT")
    sim_option("--ttft", float, 0.2, "mean seconds to first token")
    sim_option("--tpot", float, 0.02, "mean seconds per output token")
    sim_option(
        "--tokens",
        int,
        64,
        "mean output tokens per choice, spread by --tokens-spread; a request's max_tokens caps it",
    )
    sim_option(
        "--tokens-spread",
        float,
        0.5,
        "relative spread of output length (lognormal); 0 gives exactly --tokens",
    )
    sim_option("--jitter", float, 0.1, "relative spread of TTFT and token gaps; 0 = exact")
    sim_option("--model", str, "sim-llama-3-8b", "served model name; others get 404")
    sim.add_argument("--seed", type=int, default=None, help="random seed for reproducible runs")
    sim_option("--fail-rate", float, 0.0, "share of 500s")
    sim_option("--drop-rate", float, 0.0, "share of streams cut mid-way")
    sim_option("--reasoning-tokens", int, 0, "reasoning deltas before the answer")
    sim_option(
        "--batch-alpha",
        float,
        0.0,
        "continuous batching: with n streams decoding each gap is tpot * (1 + alpha * (n - 1))",
    )
    sim_option(
        "--batch-knee",
        int,
        0,
        "streams beyond this many slow the others --batch-knee-factor times more (0 = no knee)",
    )
    sim_option("--batch-knee-factor", float, 4.0, "slow-down beyond the knee")
    sim_option(
        "--max-body-bytes",
        int,
        128 << 20,
        "largest request body read, else 413 (above the sidecar's own 64 MiB limit)",
    )
    sim.add_argument(
        "--enable-force-include-usage",
        action="store_true",
        help="as vLLM's flag: every stream carries usage (on each chunk and in a last chunk) "
        "whatever the client asked, so the sidecar counts tokens from usage, not estimates",
    )

    demo = sub.add_parser("demo", help="simulated server + sidecar + load, with live figures")
    demo.add_argument(
        "--duration",
        type=float,
        default=None,
        help="stop after this many seconds (default: until Ctrl-C)",
    )
    demo.add_argument("--concurrency", type=int, default=8, help="concurrent client streams")
    demo.add_argument("--port", type=int, default=8080, help="sidecar proxy port")
    demo.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="sidecar admin (metrics) port (default: --port + 1)",
    )
    slo = sub.add_parser("slo", help="SLO spec -> Prometheus recording and burn-rate alert rules")
    slo_sub = slo.add_subparsers(dest="slo_command", metavar="SLO_COMMAND")
    render = slo_sub.add_parser("render", help="render a spec's rules (YAML) to stdout or --output")
    render.add_argument("spec", help="SLO spec YAML file (see deploy/slo/)")
    render.add_argument("--output", "-o", default=None, help="write here instead of stdout")
    render.add_argument(
        "--runbook-url",
        default=None,
        help="where your team reads docs/runbooks.md (its URL; #runbook-<alert> is appended); "
        "default: the spec's alerts.runbook_url",
    )
    return parser


def serve_parser() -> argparse.ArgumentParser:
    """The ``serve`` command's parser (its flags: the settings reference reads them)."""
    return _command_parser(_build_parser(), argparse.Namespace(command="serve"))


def _die(message: str) -> int:
    print(f"llm-sidecar: {message}", file=sys.stderr)
    return 2


def _parse(argv: Sequence[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse; the parser of the command given, and the arguments. An unknown flag is reported
    with the usage of the command it was given to (argparse's own check runs at the top level
    and prints the top-level usage) and the closest flag that command has."""
    parser = _build_parser()
    args, extras = parser.parse_known_args(argv)
    command = _command_parser(parser, args)
    if extras:
        known = [o for a in command._actions for o in a.option_strings if o.startswith("--")]
        unknown = next((e.partition("=")[0] for e in extras if e.startswith("--")), None)
        hint = did_you_mean(unknown, known) if unknown else ""
        command.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    return command, args


def _command_parser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub)parser of the deepest command ``args`` names."""
    for dest in ("command", "slo_command"):
        name = getattr(args, dest, None)
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if name is None or not subs:
            break
        parser = subs[0].choices[name]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    command, args = _parse(argv)
    if args.command is None or (args.command == "slo" and args.slo_command is None):
        command.print_help()  # a bare command lists its subcommands
        return 0
    if args.command == "serve":
        flags = {name: getattr(args, name) for name in Settings.model_fields}
        try:
            settings = load_settings(flags, config_file=args.config)
        except ConfigError as exc:
            return _die(str(exc))
        from .app import serve  # noqa: PLC0415 - keep `--help` fast
        from .export.logs import configure_logging  # noqa: PLC0415
        from .fleet.cpus import worker_count  # noqa: PLC0415
        from .fleet.process import prepare_process  # noqa: PLC0415

        configure_logging(settings.log_format, settings.log_level)
        prepare_process()
        workers = worker_count(settings.workers)
        try:
            if workers == 1:
                asyncio.run(serve(settings))
            else:
                from .fleet.supervisor import supervise  # noqa: PLC0415

                asyncio.run(supervise(settings, workers))
        except OSError as exc:  # e.g. the port is taken; serve's ListenError names the flag
            return _die(
                str(exc.strerror)
                if getattr(exc, "flag", None)
                else f"cannot listen: {exc.strerror or exc}"
            )
        return 0
    if args.command == "simulate":
        from .tools.sim.core import SimulatorConfig  # noqa: PLC0415
        from .tools.sim.server import run_simulator  # noqa: PLC0415

        try:
            host, port = parse_host_port(args.listen)
            config = SimulatorConfig(
                ttft=args.ttft,
                tpot=args.tpot,
                tokens=args.tokens,
                tokens_spread=args.tokens_spread,
                jitter=args.jitter,
                model=args.model,
                seed=args.seed,
                fail_rate=args.fail_rate,
                drop_rate=args.drop_rate,
                reasoning_tokens=args.reasoning_tokens,
                batch_alpha=args.batch_alpha,
                batch_knee=args.batch_knee,
                batch_knee_factor=args.batch_knee_factor,
                max_body_bytes=args.max_body_bytes,
                force_include_usage=args.enable_force_include_usage,
            )
        except ValueError as exc:
            return _die(f"invalid simulate option: {exc}")
        from .fleet.process import install_fast_loop  # noqa: PLC0415

        install_fast_loop()
        try:
            asyncio.run(run_simulator(config, host, port))
        except KeyboardInterrupt:
            pass
        except OSError as exc:
            return _die(f"cannot listen: {exc.strerror or exc}")
        return 0
    if args.command == "demo":
        from .fleet.process import install_fast_loop  # noqa: PLC0415
        from .tools.demo import run_demo  # noqa: PLC0415

        install_fast_loop()
        return run_demo(
            duration=args.duration,
            concurrency=args.concurrency,
            port=args.port,
            metrics_port=args.metrics_port,
        )
    if args.command == "slo":
        from .tools.slo.cli import render_command  # noqa: PLC0415

        return render_command(args.spec, args.output, runbook_url=args.runbook_url)
    return _die(f"unknown command {args.command!r}")  # pragma: no cover - argparse guards it


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
