"""``jupyter-gpu-gov``: the command line. Each subcommand imports what it needs when it runs, so
``--help`` and ``replay`` stay light (no tornado, jupyter_server or jupyterhub)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import IO, TYPE_CHECKING

from ._version import __version__
from .core.text import cut, escape_table

if TYPE_CHECKING:
    from .replay import Sample

EXIT_USAGE = 2  # bad input: a malformed trace, a bad policy, a bad option

# What a terminal acts on rather than shows (``core.text.CONTROLS``): newline and tab it shows.
_NOT_SHOWN = escape_table(keep="\n\t")


def shown(text: str) -> str:
    """``text`` as a terminal shows it, whatever names users chose in it (a project, a server):
    each control character written as its escape, as ``repr`` writes it."""
    return text.replace("\r\n", "\n").translate(_NOT_SHOWN)  # CSV's lines end in CRLF


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jupyter-gpu-gov",
        description="GPU governance for JupyterHub.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_replay(commands)
    _add_what_if(commands)
    _add_export_trace(commands)
    _add_estimate(commands)
    _add_diagnose(commands)
    _add_usage(commands)
    args = parser.parse_args(argv)
    try:
        status = args.run(args)
        sys.stdout.flush()  # here, where a reader gone is caught, not at exit
        return status
    except BrokenPipeError:
        # Whoever reads stdout has read what it wanted (``| head``): nothing to report. What
        # is left unwritten goes nowhere, or Python's last flush raises again (Python's docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


# -- replay ------------------------------------------------------------------------------------

BASELINES = ("idle-culler", "kernel-culler")


def _add_replay(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "replay",
        help="replay a trace through the policy (or a stock culler) and print its actions",
        description=(
            "Replay a trace (JSON Lines, one sample per server per step) through the same\n"
            "policy code as the hub service. Prints one JSON line per action to stdout, in\n"
            'time order: {"t": seconds, "server": "user/name", "action": "warn|notice|\n'
            'checkpoint|interrupt|cull", "reason": "..."} (and "started" where the trace\n'
            "says when each run started); then a JSON summary of the run to stderr. A bad\n"
            "trace or policy prints no actions and exits with status 2."
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


def _no_file(path: str | None) -> str | None:
    """``path: no such file`` when a config file is named but missing (traitlets would only
    say where it did not find it), else None."""
    return f"{path}: no such file" if path is not None and not os.path.isfile(path) else None


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
    elif missing := _no_file(args.config):
        return _fail(f"cannot load --config: {missing}")
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
            with written(args.summary_json) as file:
                file.write(text + "\n")
        except OSError as error:
            return _fail(f"cannot write the summary: {error}")
    return 0


def _trace(path: str) -> Callable[[], Iterator[Sample]]:
    """Samples, as often as asked: replay reads the trace once and scoring once more. A file is
    streamed each time; stdin or a pipe can be read only once, so it is copied, a piece at a
    time, to a temporary file streamed as a file is (its lines were kept in memory: a month's
    trace piped in is gigabytes)."""
    import tempfile

    from .replay import parse_lines, read_trace
    from .replay.trace import lines_of

    if path != "-" and os.path.isfile(path):
        return lambda: read_trace(path)
    copy = tempfile.TemporaryFile(  # noqa: SIM115 (read until the command ends; gone then)
        "w+", encoding="utf-8", errors="surrogateescape", newline=""
    )
    # Copied a bounded line at a time: a line too long (``/dev/zero``) is named as it comes.
    if path == "-":
        sys.stdin.reconfigure(errors="surrogateescape")  # a byte not UTF-8: its line is named
        source = "<stdin>"
        copy.writelines(lines_of(sys.stdin, source))
    else:
        with open(path, encoding="utf-8", errors="surrogateescape") as file:
            copy.writelines(lines_of(file, path))
        source = path

    def samples() -> Iterator[Sample]:
        copy.seek(0)
        return parse_lines(lines_of(copy, source), source=source)

    return samples


@contextlib.contextmanager
def written(path: str, mode: str = "w") -> Iterator[IO]:
    """The file a command writes (``replay --summary-json``, ``export-trace -o``, ``diagnose
    --save-model``): the one place the command line writes a path it was given. An admin may
    run a command as root in a folder a user can write, where the user put a symbolic link (or
    a hard link) to a file of the admin's (``/etc/shadow``): ``open(path, "w")`` truncated and
    wrote that file. Here a symbolic link is refused (``ELOOP``: name the file itself); a
    regular file, or none, is written as a new file beside it (created exclusively, never
    through a link) and renamed over the name when whole, so nothing but the name changes,
    never what a link or another name of it points to, and a failed command leaves the file
    as it was. A device or a pipe (``/dev/null``) is written as it is. The new file has the
    umask's mode, as one ``open`` creates."""
    import errno
    import secrets
    import stat

    text = {} if "b" in mode else {"encoding": "utf-8"}
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    if found is not None and stat.S_ISLNK(found.st_mode):
        raise OSError(errno.ELOOP, "a symbolic link: not written through (name its target)", path)
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if found is not None and not stat.S_ISREG(found.st_mode):
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # (a link since: refused)
        with os.fdopen(fd, mode, **text) as file:
            yield file
        return
    folder, name = os.path.split(path)
    while True:  # (a name taken, by chance or by a user who guessed: another)
        partial_path = os.path.join(folder, f".{name[:200]}.{secrets.token_hex(8)}.partial")
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(partial_path, flags, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as error:  # (no such folder, not allowed): said of the path given
            raise OSError(error.errno, error.strerror, path) from None
    try:
        with os.fdopen(fd, mode, **text) as file:
            yield file
        os.replace(partial_path, path)  # (a directory there: IsADirectoryError)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial_path)
        raise


def _fail(message: str, command: str = "replay") -> int:
    # A message quotes what it read (a file's value, a service's answer): of any size.
    print(f"jupyter-gpu-gov {command}: error: {shown(cut(message))}", file=sys.stderr)
    return EXIT_USAGE


# -- what-if -----------------------------------------------------------------------------------


def _add_what_if(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "what-if",
        help="replay a trace through the current and a candidate policy, side by side",
        description=(
            "Replay a trace through the current policy and a candidate (and their tier\n"
            "catalogues) with the same policy code as the hub service, and compare: GPU-hours\n"
            "reclaimed and idle left, warnings, culls, interruptions (the owner back within\n"
            "4 h of a cull), running work killed, right-sizing freed, queue waits and\n"
            "utilisation, overall and per team. The trace as recorded stands beside them.\n"
            "A config file is a traitlets file as the hub reads it (a jupyterhub_config.py\n"
            "will do): c.GpuGovernor.policies, policy_defaults, timeout and max_age give the\n"
            "policies; c.GpuProfiles.tiers, capacity and cards the tiers. A bad policy or\n"
            "tier is refused with the hub's own start-up error, exit status 2. The figures\n"
            "are defined in docs/api.md (History and what-if)."
        ),
        epilog=(
            "examples:\n"
            "  jupyter-gpu-gov what-if trace.jsonl --policy candidate.py\n"
            "  jupyter-gpu-gov what-if trace.jsonl --policy candidate.py \\\n"
            "      --current jupyterhub_config.py --tiers tiers.py\n"
            "  jupyter-gpu-gov what-if trace.jsonl --policy candidate.py --json > what-if.json\n"
            "  jupyter-gpu-gov what-if trace.jsonl --policy jupyterhub_config.py --current idle-culler"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", metavar="TRACE.jsonl", help="the trace to replay ('-': stdin)")
    parser.add_argument(
        "--policy",
        metavar="CANDIDATE.py",
        required=True,
        help="the candidate: a config file with its policies (and, optionally, its tiers)",
    )
    parser.add_argument(
        "--current",
        metavar="CONFIG.py",
        help="the service's config file (default: the shipped default policy); or "
        "'idle-culler' (or e.g. 'idle-culler:8h'): jupyterhub-idle-culler as deployed today",
    )
    parser.add_argument(
        "--tiers",
        metavar="TIERS.py",
        help="c.GpuProfiles.tiers (and capacity) for a side whose config sets no tiers: "
        "GPU-equivalents, maximum ages, right-sizing and queue capacity (default: none; "
        "every GPU server then counts 1)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=_what_if, parser=parser)


def _what_if(args: argparse.Namespace) -> int:
    from .core.durations import format_duration
    from .core.policy import PolicyError, load_policies
    from .replay import TraceError, replay
    from .replay.engine import ConfigError, load_config, policies_of
    from .replay.whatif import Setup, compare, report, table

    fail = partial(_fail, command="what-if")
    culler = _idle_culler_of(args.current)
    if isinstance(culler, str):
        return fail(culler)
    current = None if culler else args.current
    for option, path in (
        ("--policy", args.policy),
        ("--current", current),
        ("--tiers", args.tiers),
    ):
        if missing := _no_file(path):
            return fail(f"cannot load {option}: {missing}")
    setups = []
    try:
        fallback = load_config(args.tiers) if args.tiers else None
        if culler:
            setups.append(
                Setup("current", culler, _what_if_tiers(None, fallback), ("idle-culler",))
            )
        for name, path in (("current", current), ("candidate", args.policy)):
            if name == "current" and culler:
                continue
            config = load_config(path) if path else None
            if name == "candidate" and config and not {"GpuGovernor", "GpuProfiles"} & set(config):
                # e.g. c.Governor.policies: traitlets ignores a class nobody has, so the file
                # would silently be the default policy.
                sections = ", ".join(f"c.{section}" for section in sorted(config))
                return fail(
                    f"{path} sets no c.GpuGovernor or c.GpuProfiles settings, only {sections}: "
                    "the candidate would be the default policy"
                )
            try:
                policies = policies_of(config) if config is not None else load_policies([])
            except PolicyError as error:
                # The service's own start-up error (hub/app.py: build_policies).
                return fail(f"{path}: bad policy configuration: {error}")
            tiers = _what_if_tiers(config, fallback)
            run = partial(replay, policies=policies)
            setups.append(Setup(name, run, tiers, tuple(p.name for p in policies)))
    except ConfigError as error:
        return fail(f"cannot load a config file: {error}")
    except ValueError as error:  # a tier the profile layer refuses, as at the hub's start
        return fail(str(error))
    try:
        samples = _trace(args.trace)
        outcomes = compare(samples, setups)
    except (TraceError, OSError) as error:
        return fail(str(error))
    recorded = outcomes[0]
    trace = {
        "path": args.trace,
        "rows": recorded.rows,
        "servers": recorded.total.servers,
        "first_t": recorded.first_t,
        "last_t": recorded.last_t,
        "current": args.current,
        "candidate": args.policy,
        "tiers": args.tiers,
    }
    if args.json:
        print(json.dumps(report(outcomes, trace)))
        return 0
    span = (recorded.last_t or 0) - (recorded.first_t or 0)
    title = (
        f"what-if: {args.trace}: {recorded.total.servers:,} server runs, {recorded.rows:,} rows "
        f"over {format_duration(span)}; current: {args.current or 'the default policy'}, "
        f"candidate: {args.policy}"
    )
    print(shown(table(outcomes, title)))  # a trace's team names are anyone's words
    return 0


def _idle_culler_of(current: str | None):
    """``--current idle-culler[:TIMEOUT]``: jupyterhub-idle-culler's run; an error message for
    a bad timeout; None for a config file (or none)."""
    if current is None or not current.startswith("idle-culler"):
        return None
    from .core.durations import parse_duration
    from .replay.baselines import IDLE_CULLER_TIMEOUT_S, idle_culler

    name, _, timeout = current.partition(":")
    if name != "idle-culler":
        return None  # a file whose name starts so
    try:
        seconds = parse_duration(timeout).total_seconds() if timeout else IDLE_CULLER_TIMEOUT_S
    except ValueError as error:
        return f"--current idle-culler:{timeout}: {error}"
    return partial(idle_culler, timeout=seconds)


def _what_if_tiers(config, fallback):
    """The tiers of ``config`` (``c.GpuProfiles.tiers``), else of ``fallback``, validated as
    the hub validates them at start (``ValueError`` with its message); empty without any."""
    from .replay.whatif import Tiers

    source = config if config is not None and "tiers" in config.GpuProfiles else fallback
    if source is None or "tiers" not in source.GpuProfiles:
        return Tiers()
    from datetime import timedelta

    from traitlets import TraitError

    from .core.rightsize import TierSize
    from .profiles.config import GpuProfiles
    from .profiles.estimate import tier_memory_gb

    try:  # tiers not a list of dicts: traitlets refuses them as the profiles are made
        profiles = GpuProfiles(config=source)
        profiles.check()  # what add_gpu_profiles runs when the hub loads its config
    except TraitError as error:
        raise ValueError(str(error)) from None
    tiers = profiles.tier_map
    after = config.GpuGovernor.get("right_size_after") if config is not None else None
    return Tiers(
        sizes={
            t.name: TierSize(t.name, t.display_name, tier_memory_gb(t), t.weight)
            for t in tiers.values()
        },
        slots={name: devices // tiers[name].count for name, devices in profiles.capacity.items()},
        max_age={t.name: t.max_age.total_seconds() if t.max_age else None for t in tiers.values()},
        right_size_after=timedelta(seconds=after) if after else Tiers().right_size_after,
    )


# -- export-trace ------------------------------------------------------------------------------


def _add_export_trace(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export-trace",
        help="write the governor's own history as a trace that replay and what-if read",
        description=(
            "Write the history the governor records as it runs (its store, --db-url) as a\n"
            "replay trace (JSON Lines, a sample per server every --step), ready for\n"
            "'jupyter-gpu-gov what-if'. The format is in docs/api.md (History and what-if)."
        ),
        epilog=(
            "examples:\n"
            "  jupyter-gpu-gov export-trace --since 14d -o last-fortnight.jsonl\n"
            "  jupyter-gpu-gov export-trace --since 1h --pseudonymise | \\\n"
            "      jupyter-gpu-gov what-if - --policy candidate.py\n"
            "  jupyter-gpu-gov export-trace --since 2026-01-05T00:00Z --until 2026-01-06T00:00Z \\\n"
            "      --db-url postgresql+psycopg://gov@db/gpu_gov"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--since",
        required=True,
        help="a duration back from now (14d, 1h) or a UTC time (2026-01-05T09:00:00Z)",
    )
    parser.add_argument("--until", help="as --since (default: now)")
    parser.add_argument(
        "--db-url",
        default="sqlite:///jupyter_gpu_gov.sqlite",
        help="the governor's store, as c.GpuGovernor.db_url (default: %(default)s)",
    )
    parser.add_argument("--step", default="5m", help="one sample every (default: %(default)s)")
    parser.add_argument(
        "--pseudonymise",
        action="store_true",
        help="replace user and server names by pseudonyms (HMAC under a fresh random key)",
    )
    parser.add_argument("-o", "--output", metavar="FILE", help="where to write (default: stdout)")
    parser.set_defaults(run=_export_trace)


def _export_trace(args: argparse.Namespace) -> int:
    import time

    from .replay.history import Pseudonyms, export_span, export_trace

    fail = partial(_fail, command="export-trace")
    try:
        since, until, step = export_span(args.since, args.until, args.step, time.time())
    except ValueError as error:
        return fail(str(error))
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError

    try:
        url = make_url(args.db_url)
    except ArgumentError as error:
        return fail(f"--db-url: {error}")
    try:
        engine = create_engine(url)
    except (ArgumentError, ImportError) as error:  # a scheme unknown, its driver not installed
        return fail(f"--db-url: cannot use {url.render_as_string()}: {error}")  # no password
    database = url.database if url.drivername.startswith("sqlite") else None
    if database is not None and not os.path.exists(database):
        return fail(f"--db-url: no such database {database} (the governor's c.GpuGovernor.db_url)")
    from .hub.history import HISTORY, read_history

    # Read only: another database (the Hub's own, say) once got the history's tables made in
    # it, and the export wrote nothing and said nothing.
    try:
        recorded = inspect(engine).has_table(HISTORY.name)
    except DBAPIError as error:
        return fail(str(getattr(error, "orig", None) or error))
    if not recorded:
        return fail(
            f"--db-url: {url.render_as_string()} has no history of the governor's (is it "
            "c.GpuGovernor.db_url? It records one while it runs, unless history_retention is 0)"
        )
    pseudonyms = Pseudonyms(os.urandom(32)) if args.pseudonymise else None
    rows = read_history(engine, since, until)
    out = contextlib.ExitStack()
    try:
        stream = out.enter_context(written(args.output)) if args.output else sys.stdout
    except OSError as error:
        return fail(f"-o {args.output}: cannot write: {error.strerror or error}")
    try:
        with out:  # (the file is renamed into place once whole, or not at all)
            for line in export_trace(
                rows, step=step, since=since, until=until, pseudonyms=pseudonyms
            ):
                stream.write(line + "\n")
    except BrokenPipeError:
        raise  # stdout's reader is gone: main ends quietly
    except (DBAPIError, OSError) as error:
        return fail(str(getattr(error, "orig", None) or error))
    return 0


# -- estimate ----------------------------------------------------------------------------------


def _add_estimate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "estimate",
        help="estimate the GPU memory a model needs and suggest the smallest tier that holds it",
        description=(
            "Estimate the GPU memory a model needs:\n"
            "  parameters x bytes per parameter x redundancy x (1 + reserve)\n"
            "bytes per parameter: fp32 4, bf16 and fp16 2, int8 1, int4 0.5; redundancy:\n"
            "training 4-6 (weights, gradients, Adam moments; default 5), inference 1.2-1.5\n"
            "(weights, KV cache, activations; default 1.3); reserve 10-15 % (default 12 %).\n"
            "1 GB is 10^9 bytes. Then suggest the tier of least weight (GPU-equivalents) whose\n"
            "GPU memory holds it, from --tiers or a built-in catalogue of H200 MIG slices and\n"
            "whole H100 and H200 cards. Bad input exits with status 2."
        ),
        epilog=(
            "examples:\n"
            "  jupyter-gpu-gov estimate 7B\n"
            "  jupyter-gpu-gov estimate 7B --precision bf16 --mode training\n"
            "  jupyter-gpu-gov estimate 350M --precision fp32 --mode training --redundancy 6\n"
            "  jupyter-gpu-gov estimate 70e9 --precision int4 --tiers jupyterhub_config.py\n"
            "  jupyter-gpu-gov estimate 1.3b --reserve 15% --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "params", metavar="PARAMS", help="number of parameters: 7B, 350M, 1.3b, 70e9, 7000000000"
    )
    parser.add_argument(
        "--precision",
        default="bf16",
        metavar="P",
        help="fp32, bf16, fp16, int8 or int4 (default: bf16)",
    )
    parser.add_argument(
        "--mode", default="inference", metavar="MODE", help="training or inference (default)"
    )
    parser.add_argument(
        "--redundancy",
        metavar="X",
        help="multiple of the weights' memory the job holds: 4-6 for training, 1.2-1.5 for "
        "inference (default: 5 or 1.3)",
    )
    parser.add_argument(
        "--reserve",
        metavar="R",
        help="reserve on top, a fraction 0.10-0.15 or a percentage 10%%-15%% (default: 0.12)",
    )
    parser.add_argument(
        "--tiers",
        metavar="FILE.py",
        help="traitlets config file with c.GpuProfiles.tiers (a list of tier dicts), as the hub "
        "reads it (default: a built-in catalogue of H200 MIG slices and H100/H200 cards)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=_estimate, parser=parser)


def _estimate(args: argparse.Namespace) -> int:
    from .profiles.estimate import DEFAULT_TIERS, RESERVE, estimate_memory, smallest_tier
    from .profiles.tiers import TierError, load_tiers

    fail = partial(_fail, command="estimate")
    try:
        redundancy = None if args.redundancy is None else _float(args.redundancy, "--redundancy")
        reserve = RESERVE if args.reserve is None else _fraction(args.reserve, "--reserve")
        estimate = estimate_memory(
            args.params, args.precision, args.mode, redundancy=redundancy, reserve=reserve
        )
    except ValueError as error:
        return fail(str(error))
    if missing := _no_file(args.tiers):
        return fail(f"cannot load --tiers: {missing}")
    try:
        tiers = load_tiers(DEFAULT_TIERS if args.tiers is None else _tier_entries(args.tiers))
    except TierError as error:
        return fail(f"bad tier in --tiers: {error}")
    except ValueError as error:  # the file cannot be loaded, or sets no tiers
        return fail(f"cannot load --tiers: {error}")

    tier = smallest_tier(estimate, tiers)
    if args.json:
        print(
            json.dumps(
                {
                    **estimate.as_dict(),
                    "tier": tier.name if tier else None,
                    "tier_summary": tier.summary if tier else None,
                }
            )
        )
    else:
        print(_estimate_text(estimate, tier, tiers))
    return 0


def _float(text: str, option: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{option}: {text!r} is not a number") from None


def _fraction(text: str, option: str) -> float:
    """0.12 or 12%."""
    stripped = text.strip()
    if stripped.endswith("%"):
        return _float(stripped[:-1], option) / 100
    return _float(stripped, option)


def _tier_entries(path: str) -> list:
    """``c.GpuProfiles.tiers`` of a traitlets config file (``ValueError`` when it cannot be
    loaded or does not set a list of tiers)."""
    from traitlets.config.loader import LazyConfigValue, PyFileConfigLoader

    try:
        config = PyFileConfigLoader(
            os.path.basename(path), path=os.path.dirname(path) or "."
        ).load_config()
    except Exception as error:  # the file is Python: it may raise anything
        raise ValueError(f"{path}: {type(error).__name__}: {error}") from None
    value = config.GpuProfiles.get("tiers", [])
    if isinstance(value, LazyConfigValue):  # c.GpuProfiles.tiers.append(...)
        value = value.get_value([])
    if not isinstance(value, list | tuple):
        raise ValueError(f"{path}: c.GpuProfiles.tiers must be a list of dicts, got {value!r}")
    if not value:
        raise ValueError(f"{path} sets no tiers (c.GpuProfiles.tiers = [...])")
    return list(value)


def _estimate_text(estimate, tier, tiers) -> str:
    from .profiles.estimate import MODE_WHY, format_params, tier_memory_gb

    lines = [
        f"{format_params(estimate.params)} parameters x {estimate.bytes_per_param:g} bytes "
        f"({estimate.precision}) = {_gb(estimate.weights_gb)} of weights",
        f"x {estimate.redundancy:g} for {estimate.mode} ({MODE_WHY[estimate.mode]}) "
        f"= {_gb(estimate.working_gb)}",
        f"+ {estimate.reserve * 100:g} % reserve = {_gb(estimate.gb)} of GPU memory",
    ]
    if tier is not None:
        lines.append(f"Suggested: {tier.name} ({tier.summary})")
        if tier.count > 1:
            lines.append(
                f"The model is split across {tier.count} GPUs: this needs sharding (FSDP, "
                "DeepSpeed ZeRO or tensor parallelism)."
            )
    elif tiers:
        largest = max(tiers.values(), key=lambda t: (tier_memory_gb(t), t.name))
        lines.append(
            f"No tier holds {_gb(estimate.gb)}: the largest, {largest.name}, has "
            f"{_gb(tier_memory_gb(largest))}. Try a lower precision, a smaller model, or ask "
            "your hub admin for a larger tier."
        )
    return "\n".join(lines)


def _gb(value: float) -> str:
    return f"{value:,.1f} GB" if value >= 1 else f"{value:.3g} GB"


# -- diagnose ----------------------------------------------------------------------------------


def _add_diagnose(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "diagnose",
        help="say why each window's GPU is underused (root cause, confidence, a hint), "
        "or what each cause costs the cluster (--cluster)",
        description=(
            "Diagnose diagnosis windows (docs/api.md: CSV with a header, or JSON Lines; columns\n"
            "node, server, t, sm_active, dram_active, tensor_active, pcie_mb_s, gpu_mem_frac,\n"
            "cpu_cores, cpu_iowait, read_mb_s, kernel_busy, user_idle_s, and optionally\n"
            "gr_active (DCGM GR_ENGINE_ACTIVE); missing values allowed, unknown columns\n"
            'ignored). Prints one JSON line per row, in input order: {"server", "t",\n'
            '"label", "cause", "confidence", "confident", "candidates", "contributions",\n'
            '"gain", "hint", "source"}. Labels: healthy, zombie, data_io, cpu_serial,\n'
            "memory_bandwidth, small_work, unknown (no sm_active), uncertain (the most likely\n"
            "cause's confidence is below 0.55: 'candidates' names the two it is between).\n"
            "cpu_serial is said at most 0.65 sure: the likeliest reading, never a sure one.\n"
            "Without --model the model learns each node from the file itself (unlabelled,\n"
            "rows in time order); it reads each running window with the earlier rows of the\n"
            "same node and server (the median of the last 4 within 10 minutes), as the hub\n"
            "service does. A summary goes to stderr. A bad file prints nothing, status 2.\n"
            "\n"
            "--cluster reads the governor's GET api/diagnosis instead (an admin's JupyterHub\n"
            "API token): GPU-hours per cause, per team and per node, what fixing each would\n"
            "give back, the servers with a cause now, and fragmentation."
        ),
        epilog=(
            "examples:\n"
            "  jupyter-gpu-gov diagnose windows.csv\n"
            "  jupyter-gpu-gov diagnose windows.jsonl --save-model model.pkl\n"
            "  jupyter-gpu-gov diagnose today.jsonl --model model.pkl\n"
            "  jupyter-gpu-gov diagnose windows.csv --baseline\n"
            "  python -m jupyter_gpu_gov.diagnose.faults --servers 60 | jupyter-gpu-gov diagnose -\n"
            "  JUPYTERHUB_API_TOKEN=... jupyter-gpu-gov diagnose --cluster --days 30"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "file", metavar="FILE", nargs="?", help="windows, CSV or JSON Lines ('-': stdin)"
    )
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="a model saved with --save-model (a pickle: load only files you trust)",
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="the threshold rules (profiler guides' thresholds) instead of the model",
    )
    parser.add_argument(
        "--save-model", metavar="PATH", help="save the model trained on FILE to PATH"
    )
    parser.add_argument(
        "--cluster", action="store_true", help="the cluster report from the governor service"
    )
    parser.add_argument(
        "--days", type=int, default=7, help="with --cluster: the last N days (1-366, default 7)"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text", help="with --cluster")
    _add_service(parser)
    parser.set_defaults(run=_diagnose, parser=parser)


def _diagnose(args: argparse.Namespace) -> int:
    if args.cluster:
        if args.file or args.model or args.save_model or args.baseline:
            args.parser.error("--cluster reads the governor: not with FILE or a model")
        return _cluster(args)
    if not args.file:
        args.parser.error("FILE is needed (or --cluster)")
    if args.baseline and (args.model or args.save_model):
        args.parser.error("--baseline uses no model: not with --model or --save-model")
    if args.model and args.save_model:
        args.parser.error("--save-model saves the model trained on FILE: not with --model")
    if args.file != "-":
        return _diagnose_file(args, args.file, args.file)
    import tempfile

    from .diagnose.features import STDIN, copy_stdin

    # Standard input is copied to a file, a piece at a time, and read as a file is (twice, a
    # window at a time): the same answers in memory bounded whatever its size, and a bad row
    # still named before anything is printed.
    with tempfile.TemporaryDirectory(prefix="jupyter-gpu-gov-") as directory:
        copy = os.path.join(directory, "stdin")
        try:
            copy_stdin(copy)
        except ValueError as error:
            return _fail(str(error), "diagnose")
        except OSError as error:
            return _fail(f"cannot read -: {error.strerror or error}", "diagnose")
        return _diagnose_file(args, copy, STDIN, directory)


def _diagnose_file(
    args: argparse.Namespace, path: str, name: str, directory: str | None = None
) -> int:
    """``diagnose FILE`` of the file at ``path``, called ``name`` (``<stdin>``: standard input's
    copy), spilling into ``directory`` (a temporary one if None) where it sorts."""
    from .diagnose.counterfactual import Diagnoser
    from .diagnose.features import iter_windows, unmeasured

    fail = partial(_fail, command="diagnose")
    shown_as = "-" if path != name else path  # as the command line named it
    if args.baseline:
        return _diagnose_streamed(path, name, shown_as, fail)
    done = _diagnose_model_streamed(args, path, name, shown_as, directory, fail)
    if done is not None:
        return done
    try:
        windows = list(iter_windows(path, name=name))
    except ValueError as error:
        return fail(str(error))
    except OSError as error:
        return fail(f"cannot read {shown_as}: {error.strerror or error}")

    summary: dict = {"windows": len(windows)}
    if missing := unmeasured(windows):
        summary["not_measured"] = missing
    if args.model:
        try:
            model = Diagnoser.load(args.model)
        except (OSError, ValueError, EOFError) as error:
            return fail(f"cannot load --model: {error}")
        summary["by"] = f"model {args.model}"
    else:
        model = Diagnoser().fit(sorted(windows, key=lambda w: w.t or 0.0))
        summary["by"] = "model learnt from FILE"
        summary["trained_on"] = model.trained_on
    results = model.diagnose_many(windows)
    if args.save_model:
        try:
            with written(args.save_model, "wb") as file:
                model.dump(file)
        except OSError as error:
            return fail(f"cannot write --save-model: {error.strerror or error}")

    return _print_diagnoses(zip(windows, results, strict=True), summary, shown_as, fail)


def _print_diagnoses(diagnosed, summary: dict, path: str, fail) -> int:
    """Each ``(window, result)`` of ``diagnosed`` as a JSON line on stdout, then ``summary``
    with the labels' counts on stderr. A streamed file is read while this writes: its errors
    (a file changed between two readings) end the command here."""
    from collections import Counter

    labels: Counter = Counter()
    out = sys.stdout
    try:
        for window, result in diagnosed:
            labels[result.label] += 1
            out.write(json.dumps({"server": window.server, "t": window.t, **result.as_dict()}))
            out.write("\n")
    except BrokenPipeError:
        raise  # the reader left (``| head``): ended quietly as every command is, not a read
    except ValueError as error:
        return fail(str(error))
    except OSError as error:
        return fail(f"cannot read {path}: {error.strerror or error}")
    summary["labels"] = dict(sorted(labels.items()))
    print(json.dumps(summary), file=sys.stderr)
    return 0


def _summary(seen, by: str) -> dict:
    """The summary's head for a file whose every window ``seen`` (``ColumnsSeen``) read."""
    summary: dict = {"windows": seen.windows}
    if missing := seen.unmeasured():
        summary["not_measured"] = missing
    summary["by"] = by
    return summary


def _diagnose_streamed(path: str, name: str, shown_as: str, fail) -> int:
    """``diagnose --baseline FILE``, a window at a time: the rules read each window alone, so
    the file is read twice (checked whole first, so that a bad one prints nothing), holding a
    line and the counts, not every window."""
    from .diagnose import rules
    from .diagnose.features import ColumnsSeen, iter_windows

    seen = ColumnsSeen()
    try:
        for window in iter_windows(path, name=name):
            seen.see(window)
    except ValueError as error:
        return fail(str(error))
    except OSError as error:
        return fail(f"cannot read {shown_as}: {error.strerror or error}")
    diagnosed = ((w, rules.baseline(w)) for w in iter_windows(path, name=name))
    return _print_diagnoses(diagnosed, _summary(seen, "rules"), shown_as, fail)


class _InOrder:
    """Passes a file's windows on while each ``(node, server)``'s come in time order, seeing
    their columns (``ColumnsSeen``); at the first that does not, stops, ``in_order`` false:
    the file is then held whole (``_diagnose_file``).

    Why: a window's context is its server's running windows before it in time. In a file
    whose every server's rows are in time order those are the ones before it in the file,
    whatever the servers' rows between them (a file by server, then time, as the simulator
    writes; or in time order, as the hub's windows and exports are)."""

    def __init__(self) -> None:
        from .diagnose.features import ColumnsSeen

        self.seen, self.in_order = ColumnsSeen(), True
        self.last: dict = {}  # (node, server) -> its last window's time
        self.unknown_time = self.not_after_1970 = False

    def __call__(self, windows):
        from .diagnose.features import context_key, time_key

        for window in windows:
            key, t = context_key(window), time_key(window)
            if t < self.last.get(key, -math.inf):
                self.in_order = False
                return
            self.last[key] = t
            self.unknown_time |= window.t is None
            self.not_after_1970 |= window.t is not None and window.t <= 0
            self.seen.see(window)
            yield window


def _diagnose_model_streamed(args, path: str, name: str, shown_as: str, directory, fail):
    """``diagnose FILE`` (the model learnt from the file) and ``diagnose --model PATH FILE``,
    a window at a time, when each server's rows are in time order (``_InOrder``). The model
    learns in time order, from every window (``fit``) or for its young nodes
    (``Diagnoser.learnt``, as ``diagnose_many``), before the first window is diagnosed: the
    file is read once, checked whole (a bad file prints nothing, and is named before a bad
    model), each window, in its server's context, going into a sort on disk
    (``sorted_on_disk``; a file in time order is written as it comes); the model learns from
    the sorted windows; then the file is read again and diagnosed. Held: each server's last
    few running windows and its best (``TaskReference``), and where the file is not in time
    order a run of the sort. A file in another order returns None: it is read whole, as
    before; so does a file with windows without a time beside times before 1970 (``fit`` puts
    those at 0, ``learnt`` first), learning from it."""
    import tempfile

    from .diagnose.counterfactual import Diagnoser
    from .diagnose.features import iter_in_context, iter_windows, sorted_on_disk, time_key

    if args.model:
        try:
            model, unloaded = Diagnoser.load(args.model), None
        except (OSError, ValueError, EOFError) as error:
            model, unloaded = Diagnoser(), error  # said once the file is found readable
    else:
        model, unloaded = Diagnoser(), None
    checked = _InOrder()
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="jupyter-gpu-gov-"))
        try:
            read = iter_in_context(
                checked(iter_windows(path, name=name)), model.context, model.context_horizon_s
            )
            in_time = sorted_on_disk(read, time_key, directory)
        except ValueError as error:
            return fail(str(error))
        except OSError as error:
            return fail(f"cannot read {shown_as}: {error.strerror or error}")
        if not checked.in_order:
            return None  # (read whole, a bad row after this one is named before a bad model)
        if unloaded is not None:
            return fail(f"cannot load --model: {unloaded}")
        if args.model:
            summary = _summary(checked.seen, f"model {args.model}")
        elif checked.unknown_time and checked.not_after_1970:
            return None
        else:
            model.fit(in_time(), context=False)  # (in context already)
            summary = _summary(checked.seen, "model learnt from FILE")
            summary["trained_on"] = model.trained_on
            if args.save_model:
                try:
                    with written(args.save_model, "wb") as file:
                        model.dump(file)
                except OSError as error:
                    return fail(f"cannot write --save-model: {error.strerror or error}")
        learnt = model.learnt(in_time())
    return _print_scored(learnt, path, name, shown_as, summary, fail)


def _print_scored(model, path: str, name: str, shown_as: str, summary: dict, fail) -> int:
    """The file's windows, read again, each in its server's context, scored by ``model``."""
    from .diagnose.features import iter_in_context, iter_windows

    read = iter_in_context(iter_windows(path, name=name), model.context, model.context_horizon_s)
    diagnosed = ((window, model.score(window)) for window in read)
    return _print_diagnoses(diagnosed, summary, shown_as, fail)


def _cluster(args: argparse.Namespace) -> int:
    if not 1 <= args.days <= 366:
        return _fail("--days must be between 1 and 366", "diagnose")
    body = _service_get(args, "diagnosis", {"days": args.days}, "diagnose")
    if isinstance(body, int):
        return body
    if args.format == "json":
        sys.stdout.write(body if body.endswith("\n") else body + "\n")
        return 0
    try:
        report = json.loads(body)
    except ValueError:
        return _fail("the service did not answer with JSON", "diagnose")
    try:
        text = cluster_text(report)
    except (AttributeError, KeyError, TypeError, ValueError):  # another service's JSON
        return _fail(
            "the service's answer is not a cluster report (is --url the governor's, and of "
            "this version? --format json prints the answer as it is)",
            "diagnose",
        )
    sys.stdout.write(shown(text))
    return 0


def cluster_text(report: dict) -> str:
    """``GET api/diagnosis`` as a plain-text report."""
    from .diagnose.cluster import UNPLACED

    cost = report.get("cost") or {}
    lines = [
        f"GPU-hours diagnosed, last {cost.get('days', '?')} days: {cost.get('gpu_hours', 0):.1f}",
        "",
        f"{'cause':<18}{'GPU-h':>10}{'share':>8}{'SM':>7}{'fixing gives':>14}",
    ]

    def rows(causes: dict, indent: str = "") -> None:
        ordered = sorted(causes.items(), key=lambda kv: -kv[1]["gpu_hours"])
        for label, f in ordered:
            lines.append(
                f"{indent + label:<18}{f['gpu_hours']:>10.1f}{f['share'] * 100:>7.1f}%"
                f"{f['utilisation'] * 100:>6.0f}%{f['recoverable_gpu_hours']:>11.1f} GPU-h"
            )

    rows(cost.get("causes") or {})
    for title, key in (("team", "teams"), ("node", "nodes")):
        groups = cost.get(key) or {}
        if not groups:
            continue
        lines += ["", f"by {title}:"]
        for name, causes in groups.items():
            if key == "nodes" and name == UNPLACED:  # the ledger's own word, not a node's name
                name = f"{UNPLACED}: servers no Hub record or DCGM reading places on a node"
            lines.append(f"  {name or '(none)'}")
            rows(causes, "    ")
    servers = report.get("servers") or []
    lines += ["", f"servers with a cause now: {len(servers)}"]
    for s in servers:
        sure = "" if s.get("confident") else f" (not sure: {' or '.join(s.get('candidates', []))})"
        lines.append(
            f"  {s['server']:<28}{s.get('cause', s['label']):<18}"
            f"{s.get('confidence', 1.0) * 100:>4.0f}%{sure}"
        )
    frag = report.get("fragmentation") or {}
    demand = frag.get("demand") or {}
    kinds = (
        ("pending", "starting"),
        ("queued", "in line"),
        ("refused", "refused in the last hour"),
    )
    detail = ", ".join(
        f"{words} {'unknown' if demand.get(key) is None else demand[key]}" for key, words in kinds
    )
    waiting = f"spawns waiting: {frag.get('spawns_waiting')} ({detail})"
    nodes = frag.get("nodes")  # on a cluster: what blocks each waiting spawn
    if nodes and not nodes.get("unknown"):
        lines += [
            "",
            f"fragmentation: {'YES' if frag.get('flag') else 'no'} — on the cluster's nodes"
            + ("" if (age := nodes.get("read_age_s")) is None else f" (read {age:.0f} s ago)")
            + f": {nodes.get('fragmentation')} "
            f"blocked by fragmentation, {nodes.get('shortage')} by a shortage, "
            f"{nodes.get('fits')} with room now"
            + (f", {grown} waiting for a node" if (grown := nodes.get("new_node")) else "")
            + f"; {waiting}",
        ]
        lines += [f"  {r['says']}" for r in nodes.get("requests") or []]
    elif frag.get("devices") is None:  # no card counted: unknown, not "0 of 0"
        why = frag.get("unknown") or "no card's allocation is known"
        if nodes:
            why = f"the cluster's nodes: {nodes['unknown']}; {why}"
        lines += ["", f"fragmentation: unknown — {why}; {waiting}"]
    else:
        lines += [
            "",
            f"fragmentation: {'YES' if frag.get('flag') else 'no'} — "
            # The cards counted are those known, not the cluster's: "0 of 1 cards" read as one.
            f"{_cards_known(frag.get('devices', 0))}: "
            f"{frag.get('devices_partly_used', 0)} partly allocated, "
            f"{frag.get('free_scattered', 0)} cards' worth free on them, "
            f"{frag.get('devices_free', 0)} free; {waiting}",
        ]
        if nodes:
            lines.append(f"  on the cluster's nodes: unknown — {nodes['unknown']}")
    if frag.get("hint"):
        lines.append(f"  {frag['hint']}")
    return "\n".join(lines) + "\n"


def _cards_known(n: int) -> str:
    return (
        f"{n} card{'' if n == 1 else 's'} known (seen by DCGM, held by a running server or read "
        "by the workstation's hub; others are not counted)"
    )


# -- usage -------------------------------------------------------------------------------------


def _add_usage(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "usage",
        help="showback from the governor's usage ledger, as CSV or JSON",
        description=(
            "GPU-hours allocated, active, idle and unknown, idle cost, culls and extensions,\n"
            "per team, user, project or tier and day or week, read from the governor service's\n"
            "API (GET <url>api/usage) with a JupyterHub API token: an admin's or finance's\n"
            "sees everyone, a team lead's their teams (custom:gpu-gov:showback), anyone\n"
            "else's only their own (--team, --project or --tier then with --user NAME)."
        ),
        epilog=(
            "examples:\n"
            "  jupyter-gpu-gov usage --group-by team,week --since 30d\n"
            "  jupyter-gpu-gov usage --group-by user,tier,day --since 2025-03-01 --format json\n"
            "  JUPYTERHUB_API_TOKEN=... jupyter-gpu-gov usage --url https://hub/services/gpu-gov/"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_service(parser)
    parser.add_argument(
        "--group-by", default="team,day", help="user, team, project, tier; day or week"
    )
    parser.add_argument("--since", help="a date (2025-03-01), an ISO time or a duration (7d)")
    parser.add_argument("--until", help="as --since")
    for key in ("user", "team", "project", "tier"):
        parser.add_argument(f"--{key}", help=f"only this {key}")
    parser.add_argument("--format", choices=("csv", "json"), default="csv")
    parser.set_defaults(run=_usage)


def _usage(args: argparse.Namespace) -> int:
    query = {"group_by": args.group_by, "format": args.format}
    for key in ("since", "until", "user", "team", "project", "tier"):
        if getattr(args, key):
            query[key] = getattr(args, key)
    # Written as it arrives: a year by user and day is millions of rows, and was held whole,
    # then copied twice, before a line was printed. CSV has names users chose as they are
    # (JSON has them escaped): shown.
    out = _Shown(sys.stdout)
    failed = _service_get(args, "usage", query, "usage", into=out.write)
    if isinstance(failed, int):
        return failed
    out.end()
    return 0


class _Shown:
    """Text written to ``out`` as ``shown`` writes it, a piece at a time as it comes (a CRLF
    split between two pieces included), ended by a newline."""

    def __init__(self, out):
        self.out, self.held, self.last = out, "", ""

    def write(self, text: str) -> None:
        text = self.held + text
        self.held = "\r" if text.endswith("\r") else ""  # its \n may come next
        text = text[: len(text) - len(self.held)]
        if text:
            self.out.write(shown(text))
            self.last = text[-1]

    def end(self) -> None:
        if self.held:
            self.out.write(shown(self.held))
            self.last = self.held
        if self.last != "\n":
            self.out.write("\n")


# -- the governor service's API ----------------------------------------------------------------


def _url_problem(url: str) -> str | None:
    """Why ``--url`` is not a URL to ask (None: it is one), said before urllib says it with a
    traceback."""
    from urllib.parse import urlsplit

    if not url.isprintable() or " " in url:
        return "a space or a control character"
    try:
        where = urlsplit(url)
        if where.scheme not in ("http", "https") or not where.hostname or where.port == 0:
            return "not an http(s) URL"
    except ValueError as error:  # a bracket left open, a port out of range
        return str(error)
    return None


def _add_service(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get("JUPYTER_GPU_GOV_URL", "http://127.0.0.1:8000/services/gpu-gov/"),
        help="the governor service's URL (default $JUPYTER_GPU_GOV_URL, else the demo hub's)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("JUPYTERHUB_API_TOKEN", ""),
        help="a JupyterHub API token (default $JUPYTERHUB_API_TOKEN)",
    )


# The most of an answer read whole (``diagnose --cluster``'s report: a few KiB a server with a
# root cause) and of an error's text: a wrong --url answering without end took memory without
# end. ``usage`` streams its answer, read without a limit.
MAX_ANSWER = 64 << 20
MAX_ERROR = 64 << 10


def _service_get(
    args: argparse.Namespace, path: str, query: dict, command: str, into=None
) -> str | int:
    """``GET <url>api/<path>?<query>`` with the token: the body (at most ``MAX_ANSWER``
    bytes), or the exit status of a failure (said on stderr). ``into``: the body is given to
    it as it arrives instead, a piece of text at a time (``""`` returned once it is all
    there)."""
    import codecs
    from http.client import HTTPException, IncompleteRead, RemoteDisconnected
    from urllib.error import HTTPError, URLError
    from urllib.parse import urlencode
    from urllib.request import HTTPRedirectHandler, Request, build_opener

    class NotFollowed(HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None  # urllib would send the token on, to wherever the answer points

    if not args.token:
        return _fail("a token is needed: --token or $JUPYTERHUB_API_TOKEN", command)
    if not args.token.isprintable() or not args.token.isascii():  # never echoed: a secret
        return _fail("--token: not a token (a control character or a non-ASCII one)", command)
    if problem := _url_problem(args.url):
        return _fail(f"--url {args.url!r}: {problem}; e.g. https://HUB/services/gpu-gov/", command)
    url = f"{args.url.rstrip('/')}/api/{path}?{urlencode(query)}"
    request = Request(url, headers={"Authorization": f"token {args.token}"})
    try:
        with build_opener(NotFollowed).open(request, timeout=60) as response:
            if into is None:
                blocks, size = [], 0
                while block := response.read(1 << 16):
                    size += len(block)
                    if size > MAX_ANSWER:
                        return _fail(
                            f"{url}: the answer is longer than {MAX_ANSWER:,} bytes (64 MiB), "
                            "read no further: is --url the governor's?",
                            command,
                        )
                    blocks.append(block)
                return b"".join(blocks).decode()
            decoder = codecs.getincrementaldecoder("utf-8")()
            while block := response.read(1 << 16):
                into(decoder.decode(block))
            into(decoder.decode(b"", final=True))
            return ""
    except UnicodeDecodeError:
        return _fail(f"{url}: the answer is not UTF-8 text: is --url the governor's?", command)
    except HTTPError as error:
        if 300 <= error.code < 400:
            where = str(error.headers.get("Location", "?"))[:200]
            return _fail(
                f"{url}: HTTP {error.code}: redirected to {where}, not followed (the token goes "
                "only to --url): give the governor's own URL, e.g. "
                "https://HUB/services/gpu-gov/",
                command,
            )
        detail = error.read(MAX_ERROR).decode(errors="replace")  # (_fail cuts it shorter)
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(detail).get("message", detail)
        if error.code in (401, 403) and "authenticate" in str(detail):
            # The service asks for a token: one was given, and it was refused.
            detail = (
                "the governor refused this token (unknown, expired or revoked, or not allowed to "
                "use the gpu-gov service); make one on the Hub's token page (/hub/token)"
            )
        return _fail(f"{url}: HTTP {error.code}: {detail}", command)
    except URLError as error:
        return _fail(f"{url}: {error.reason}", command)
    # Raised by http.client past urllib's URLError: something that is not the governor
    # (or no HTTP server) listens there, or the answer stopped half-way.
    except RemoteDisconnected:
        return _fail(f"{url}: the connection closed without an answer", command)
    except IncompleteRead:  # the service cuts a streamed answer off where it failed
        written = " (what was written is incomplete)" if into is not None else ""
        return _fail(f"{url}: the answer stopped part-way{written}", command)
    except HTTPException as error:
        return _fail(f"{url}: not an HTTP answer ({type(error).__name__})", command)
    except OSError as error:  # a timeout or a reset while reading the answer
        return _fail(f"{url}: {error.strerror or error}", command)


if __name__ == "__main__":
    sys.exit(main())
