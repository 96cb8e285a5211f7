"""``jupyter-gpu-gov``: the command line. Each subcommand imports what it needs when it runs, so
``--help`` and ``replay`` stay light (no tornado, jupyter_server or jupyterhub)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING

from ._version import __version__

if TYPE_CHECKING:
    from .replay import Sample

EXIT_USAGE = 2  # bad input: a malformed trace, a bad policy, a bad option


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jupyter-gpu-gov",
        description="GPU governance for JupyterHub.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_replay(commands)
    args = parser.parse_args(argv)
    return args.run(args)


# -- replay ------------------------------------------------------------------------------------

BASELINES = ("idle-culler", "kernel-culler")


def _add_replay(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "replay",
        help="replay a trace through the policy (or a stock culler) and print its actions",
        description=(
            "Replay a trace (JSON Lines, one sample per server per step) through the same\n"
            "policy code as the hub service. Prints one JSON line per action to stdout, in\n"
            'time order: {"t": seconds, "server": "user/name", "action": "warn|checkpoint|cull",\n'
            '"reason": "..."}; then a JSON summary of the run to stderr. A bad trace or policy\n'
            "prints no actions and exits with status 2."
        ),
        epilog=(
            "examples:\n"
            "  jupyter-gpu-gov replay trace.jsonl\n"
            "  jupyter-gpu-gov replay trace.jsonl --config jupyterhub_config.py\n"
            "  jupyter-gpu-gov replay trace.jsonl --baseline idle-culler --timeout 1h\n"
            "  jupyter-gpu-gov replay trace.jsonl --summary-json run.json | wc -l"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", metavar="TRACE.jsonl", help="the trace to replay ('-': stdin)")
    parser.add_argument(
        "--config",
        metavar="FILE.py",
        help="traitlets config file with c.GpuGovernor.policies (a list of dicts) and "
        "c.GpuGovernor.policy_defaults (a dict), as the hub service reads them "
        "(default: the shipped default policy)",
    )
    parser.add_argument(
        "--baseline",
        choices=BASELINES,
        help="replay a stock culler instead of the policy: jupyterhub-idle-culler (Hub "
        "last_activity) or jupyter-server's kernel culler (cull_connected and cull_busy off)",
    )
    parser.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_duration("--timeout"),
        help="the baseline's idle timeout, in seconds or e.g. '1h' (default: 3600)",
    )
    parser.add_argument(
        "--interval",
        metavar="SECONDS",
        type=_duration("--interval"),
        help="how often the baseline checks (default: idle-culler timeout/2, kernel culler 300)",
    )
    parser.add_argument(
        "--summary-json",
        metavar="PATH",
        help="also write the summary to PATH",
    )
    parser.set_defaults(run=_replay, parser=parser)


def _duration(option: str):
    def parse(text: str) -> float:
        from .core.durations import parse_duration

        try:
            return parse_duration(text, option).total_seconds()
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def _replay(args: argparse.Namespace) -> int:
    from .core.policy import PolicyError
    from .replay import (
        ConfigError,
        TraceError,
        idle_culler,
        kernel_culler,
        policies_from_config,
        replay,
        score,
    )
    from .replay.baselines import IDLE_CULLER_TIMEOUT_S

    if args.baseline and args.config:
        args.parser.error("--config sets the policy; a --baseline does not use one")
    if not args.baseline and (args.timeout is not None or args.interval is not None):
        args.parser.error("--timeout and --interval apply to a --baseline only")

    timeout = IDLE_CULLER_TIMEOUT_S if args.timeout is None else args.timeout
    if args.baseline == "idle-culler":
        run = partial(idle_culler, timeout=timeout, cull_every=args.interval)
    elif args.baseline == "kernel-culler":
        run = partial(kernel_culler, timeout=timeout, cull_interval=args.interval)
    else:
        try:
            policies = policies_from_config(args.config)
        except ConfigError as error:
            return _fail(f"cannot load --config: {error}")
        except PolicyError as error:
            return _fail(f"bad policy: {error}")
        run = partial(replay, policies=policies)

    # The whole trace is checked before anything is printed: no partial output for a bad file.
    try:
        samples = _trace(args.trace)
        actions = sorted(run(samples()), key=lambda action: action.t)
    except (TraceError, OSError) as error:
        return _fail(str(error))

    for action in actions:
        print(json.dumps(action.as_dict()))
    summary = {"by": args.baseline or "policy", **score(samples(), actions).as_dict()}
    text = json.dumps(summary)
    print(text, file=sys.stderr)
    if args.summary_json:
        try:
            with open(args.summary_json, "w", encoding="utf-8") as file:
                file.write(text + "\n")
        except OSError as error:
            return _fail(f"cannot write the summary: {error}")
    return 0


def _trace(path: str) -> Callable[[], Iterator[Sample]]:
    """Samples, as often as asked: replay reads the trace once and scoring once more. A file is
    streamed each time; stdin or a pipe can be read only once, so its lines are kept."""
    from .replay import parse_lines, read_trace

    if path != "-" and os.path.isfile(path):
        return lambda: read_trace(path)
    if path == "-":
        lines, source = sys.stdin.readlines(), "<stdin>"
    else:
        with open(path, encoding="utf-8") as file:
            lines, source = file.readlines(), path
    return lambda: parse_lines(lines, source=source)


def _fail(message: str) -> int:
    print(f"jupyter-gpu-gov replay: error: {message}", file=sys.stderr)
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
