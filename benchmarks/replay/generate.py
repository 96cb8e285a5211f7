"""Month-long notebook traces with ground truth, in the replay format of docs/architecture.md.

    python -m benchmarks.replay.generate --servers 40 --days 30 --seed 1 [--step 300] > trace.jsonl

``--servers`` is the number of users; each runs one server at a time and starts and stops it
over the month (gaps of 2 h - 3 days, starts snapped to working hours, 08:00-18:00 UTC). Every
session is its own server key ``user/sNNN``, a fresh record on every start. A hub reuses
``user/`` (JupyterHub's ``allow_named_servers`` is off by default), and the governor keeps what
it learned of a server from one start to the next (how its checkpoint hook fared:
``checkpoint_broken_after``): ``--default-servers`` writes every session as ``user/`` with its
``started`` time, the same rows otherwise. While a server runs it has
one sample per step (``--step`` seconds, default 300; the governor reconciles every 60 s, which
``--step 60`` gives at five times the size: 1 M rows, 285 MB for the default month); a stopped
server has none. Rows are ordered by ``t``. Each user's random stream is seeded from
``(seed, user)``, so a trace is reproducible and a larger ``--servers`` keeps the smaller
trace's users as they were.

Every sample carries two keys the format leaves to evaluators: ``scenario`` (below) and
``truth``, what the GPU is really doing in that step:

- ``active``: live GPU work, at any level (data-starved training included). A cull is false.
- ``present``: GPU held and idle while its owner works at the notebook (thinking, writing,
  short CPU cells). A cull is false: a person at the keyboard loses their kernel.
- ``cpu_phase``: GPU held and idle while an unattended cell runs on the CPU and its next stage
  uses the GPU again. A cull is false: the running cell's work is lost (its checkpoint hooks
  cannot run). These hours are not counted as reclaimable: the hold is part of live work.
- ``standby``: GPU held idle on purpose by an exempt batch-standby server. A cull is false.
- ``idle_held``: GPU held (context and memory) and idle with nobody and nothing that needs it:
  a zombie, an abandoned server, an owner away. The hours to reclaim. A cull is right even if
  the owner comes back later (they restore from the checkpoint); the scorer counts those
  separately as "culls before a return".
- ``idle_free``: the server runs with no GPU context or memory (before the first GPU cell).

Scenarios (the parameter ranges are assumptions from common notebook practice, not fitted to
measured data; U is uniform, logU log-uniform):

- ``interactive`` (weight 0.30): 1 day (60 %) or 2-3 days. Each day 2-4 work blocks of
  U(30 min, 3 h): think gaps of median 3 min (lognormal, 1-25 min) without interaction, each
  ended by an execution (``user_active``); half the executions are GPU cells of U(1, 15) min
  at SM U(0.3, 0.95), the rest CPU cells of 1-3 min. Between blocks the owner is away
  U(20 min, 2.5 h) (lunch, meetings) with the tab open; a multi-day session is left overnight
  (14-17 h, tab open or closed). Idle stretches people leave in the middle of a working day.
- ``zombie_open_tab`` (0.12): work U(20 min, 2 h), then the tab stays open (``connections``
  1, no ``user_active``) and the kernel keeps its memory for logU(1, 7) days: a forgotten tab
  keeps Hub activity fresh, the case the stock culler misses.
- ``abandoned_closed_tab`` (0.12): the same, with the tab closed, for logU(8 h, 5 days).
- ``silent_training`` (0.16): work U(10, 40) min, then training in a background thread
  (``kernel_busy`` false, SM U(0.6, 0.95), no user activity) for logU(2, 36) h, tab open or
  closed; then idle-held until the owner returns, logU(1, 16) h, and checks for 10-30 min.
- ``cpu_pipeline`` (0.14): work 10-30 min, then an unattended "run all" of 2-6 cycles: a CPU
  phase (tokenising, feature extraction, augmentation) of U(10, 90) min with the GPU held
  idle and the kernel busy, then a GPU phase of U(20 min, 3 h) at SM U(0.5, 0.9); then
  idle-held until the owner returns, logU(1, 14) h, and checks.
- ``data_starved`` (0.16): work 10-30 min, then a foreground training loop starved by its
  data loader for logU(3, 30) h: mean SM logU(0.03, 0.30) per session (a batch every few
  seconds on a GPU that needs a tenth of that), per-step jitter x lognormal(sigma 0.35). About a
  fifth of these sessions sit mostly under 5 % SM. Then idle-held, logU(1, 14) h, and checks.
- ``long_cpu_stage`` (0.10): the model is loaded first (it holds its memory), then an
  unattended "run all" whose CPU stage — tokenising a corpus, feature extraction, a dataframe
  join, a cross-validation on the CPU — runs U(1, 5) h with the GPU idle and the kernel busy
  (``cpu_phase``), then fine-tunes for U(1, 6) h at SM U(0.5, 0.9); then idle-held until the
  owner returns, logU(1, 14) h, and checks.
- ``sleep_loop`` (0.03): a cell that polls for something that does not come (``while not
  done(): time.sleep(60)`` on a cluster job, a file, an API) with the model held: the kernel
  busy and the GPU idle for logU(12 h, 3 days), until the owner comes back and stops it. The
  GPU does nothing for anyone: ``idle_held``, though a cell runs.
- ``batch_standby``: every 16th user (index 5 mod 16) runs an exempt (``gpu-gov/exempt``)
  standby server in sessions of U(3, 14) days: idle logU(30 min, 12 h), then a batch job of
  logU(10 min, 4 h) at SM U(0.5, 0.95) submitted without a kernel execution or a browser.
- Hard deadlines and failing hooks (scenario-independent, per user): the ``h100-80g`` tier has
  a maximum age of 24 h (label ``gpu-gov/max-age``, as the profile layer writes it). Every 6th
  user (index 4 mod 6) borrows beyond the team's guarantee (``gpu-gov/borrowed``), and in a
  third of those sessions a team within its guarantee asks the GPU back at a uniform time of
  the session (``gpu-gov/reclaim``, an ISO time on the replay engine's clock, and
  ``gpu-gov/reclaim-for`` from then on). Every 8th user (index 6 mod 8) registered a checkpoint
  hook that always raises (an upload to an unreachable bucket): ``checkpoint_fails`` on every
  row.
- No extension: every 10th user (index 3 mod 10) runs an image without the server extension:
  ``reports`` false, on the same scenario mix. The cluster runs dcgm-exporter (as NVIDIA's GPU
  Operator deploys it), so ``gpu_sm`` is DCGM's reading of the pod's GPU: the governor sees the
  card but not the kernels, the tab or the person. ``--no-dcgm``: a cluster without it, where
  those rows have no ``gpu_sm`` (unknown). Memory and truth are always given (the evaluator's
  view, not the governor's).

CPU and I/O (``cpu_cores``, ``iowait``, ``read_mb_s``: what the report's ``targets[].cpu``
says of the kernel over the sampler's window, for servers that send reports; for those that
do not, ``cpu_cores`` alone, where the cluster runs DCGM: the container's CPU as the kubelet
measures it and metrics-server serves it, the kernel's figure, which the server's own few
thousandths of a core do not change), drawn from a stream of their own so the scenarios above stay as they were: an idle kernel U(0.001, 0.006)
cores (heartbeats); GPU work U(0.5, 1.5) cores; a starved loader U(1, 6) cores, reading
U(10, 300) MB/s; a person's CPU cell U(0.8, 8) cores; a CPU stage computes (60 %: U(0.8, 8)
cores), reads from disk (25 %: U(0.05, 0.5) cores, I/O wait U(0.1, 0.6), U(5, 200) MB/s) or
downloads over the network (15 %: logU(0.03, 0.3) cores, no disk reads); a ``sleep_loop``
U(0.0005, 0.008) cores. Assumptions, like the rest: a CPU stage quieter than a download (a
cell waiting on a job elsewhere) is not modelled as live work here.

A session opens with 1-10 min without a GPU context (``idle_free``), then its first GPU cell
loads a model: memory U(25 %, 95 %) of the card, held until the server stops (frameworks keep
their caches). Idle steps report SM 0.

Limits: one server per user at a time; no weekends, holidays or time zones; nobody answers a
warning (no extensions are asked for, which a present owner would do); people who work for
hours at the notebook without touching the GPU are not modelled (GPU cells come every few
minutes); idle GPUs read exactly 0 SM; PCIe traffic, which the live service can also read
from DCGM, is not in the format, so data-starved training is judged on SM alone; a hook that
fails, fails every time.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
import sys
from collections.abc import Callable, Iterator

from jupyter_gpu_gov.core.clock import isoformat
from jupyter_gpu_gov.replay.engine import at

MINUTE, HOUR, DAY = 60, 3600, 86400
WORKDAY = (8 * HOUR, 18 * HOUR)
DEFAULT_STEP = 300

# The truths under which culling cuts live work (the GPU computing, a pipeline's CPU phase whose
# GPU phase comes next, an exempt standby server), the owner at the notebook with the GPU idle,
# and the one whose hours are to be reclaimed.
WORK_TRUTHS = frozenset({"active", "cpu_phase", "standby"})
PRESENT = "present"
LIVE_TRUTHS = WORK_TRUTHS | {PRESENT}
RECLAIMABLE = "idle_held"

PROFILES = (("a100-80g", 81920), ("h100-80g", 81559), ("mig-3g.40gb", 40192), ("mig-1g.10gb", 9856))
MAX_AGE = {
    "h100-80g": str(DAY)
}  # the tier's maximum age, in seconds, as the profile layer labels it
TEAMS = ("vision", "nlp", "speech", "rl", "bio")
EXEMPT = {"gpu-gov/exempt": "true"}

# One step: (gpu_sm, kernel_busy, user_active, connections, truth, usage); memory is per
# session; usage is (cpu_cores, iowait, read_mb_s) of the kernel, as its report's cpu says.
Usage = tuple[float, float, float]
Step = tuple[float, bool, bool, int, str, Usage]


def _usage(kind: str) -> Callable[[random.Random], Usage]:
    """What a kernel's process tree does, per step (the sampler's window), by what it runs."""
    return {
        # An idle kernel: heartbeats and ZMQ polling.
        "idle": lambda r: (r.uniform(0.001, 0.006), 0.0, 0.0),
        # Driving the GPU: a core's Python thread launching kernels, reading batches.
        "gpu": lambda r: (r.uniform(0.5, 1.5), r.uniform(0.0, 0.05), r.uniform(0.0, 20.0)),
        # A starved loader: its workers parse and read all the time.
        "loader": lambda r: (r.uniform(1.0, 6.0), r.uniform(0.0, 0.3), r.uniform(10.0, 300.0)),
        # A CPU stage: tokenising, features, a join (one to eight cores)...
        "cpu": lambda r: (r.uniform(0.8, 8.0), r.uniform(0.0, 0.05), r.uniform(0.0, 50.0)),
        # ... reading a dataset from disk (waits on I/O, little CPU) ...
        "disk": lambda r: (r.uniform(0.05, 0.5), r.uniform(0.1, 0.6), r.uniform(5.0, 200.0)),
        # ... or downloading one over the network (no disk reads, a few percent of a core).
        "network": lambda r: (
            math.exp(r.uniform(math.log(0.03), math.log(0.3))),
            0.0,
            0.0,
        ),
        # A time.sleep()/poll loop, an input(): nothing.
        "sleep": lambda r: (r.uniform(0.0005, 0.008), 0.0, 0.0),
    }[kind]


class Session:
    """One server's run, built phase by phase into steps."""

    def __init__(self, rng: random.Random, step: int, card_mb: int, usage_rng: random.Random):
        self.rng = rng
        # CPU and I/O draw from their own stream: the scenarios' draws stay as they were.
        self.usage_rng = usage_rng
        self.step = step
        self.card_mb = card_mb
        self.memory_mb = 0  # set by the first GPU cell
        self.steps: list[Step] = []

    def count(self, seconds: float) -> int:
        return max(1, round(seconds / self.step))

    def add(
        self,
        seconds: float,
        truth: str,
        sm: Callable[[], float] = lambda: 0.0,
        busy: bool = False,
        connections: int = 1,
        user_first: bool = False,
        usage: str | None = None,
    ) -> None:
        draw = _usage(usage or ("gpu" if truth == "active" else "cpu" if busy else "idle"))
        for i in range(self.count(seconds)):
            cores, iowait, read = draw(self.usage_rng)
            use = (round(cores, 4), round(iowait, 3), round(read, 2))
            self.steps.append(
                (round(sm(), 3), busy, user_first and i == 0, connections, truth, use)
            )

    def open(self) -> None:
        self.add(self.rng.uniform(1, 10) * MINUTE, "idle_free", user_first=True)
        self.memory_mb = round(self.card_mb * self.rng.uniform(0.25, 0.95))
        self.gpu_cell(self.rng.uniform(1, 3) * MINUTE)

    def gpu_cell(self, seconds: float) -> None:
        level = self.rng.uniform(0.3, 0.95)
        self.add(seconds, "active", self.jitter(level), busy=True, user_first=True)

    def work(self, seconds: float) -> None:
        """The owner at the notebook: think gaps, each ended by a GPU or a CPU cell."""
        end = len(self.steps) + self.count(seconds)
        while len(self.steps) < end:
            gap = min(max(math.exp(self.rng.gauss(math.log(3), 0.8)), 1), 25)
            self.add(gap * MINUTE, "present")
            if self.rng.random() < 0.5:
                self.gpu_cell(self.rng.uniform(1, 15) * MINUTE)
            else:
                self.add(self.rng.uniform(1, 3) * MINUTE, "present", busy=True, user_first=True)

    def away(self, seconds: float, connections: int) -> None:
        self.add(seconds, RECLAIMABLE, connections=connections)

    def train(self, seconds: float, level: float, busy: bool, connections: int) -> None:
        self.add(seconds, "active", self.jitter(level), busy=busy, connections=connections)

    def starved(self, seconds: float, level: float, connections: int) -> None:
        def sm() -> float:
            return min(max(level * math.exp(self.rng.gauss(0, 0.35)), 0.001), 1.0)

        self.add(seconds, "active", sm, busy=True, connections=connections, usage="loader")

    def jitter(self, level: float) -> Callable[[], float]:
        return lambda: min(level * self.rng.uniform(0.85, 1.15), 1.0)

    def log_uniform(self, low: float, high: float) -> float:
        return math.exp(self.rng.uniform(math.log(low), math.log(high)))

    def connections(self) -> int:
        return self.rng.choice((0, 1))


def interactive(s: Session) -> None:
    s.open()
    days = 1 if s.rng.random() < 0.6 else s.rng.choice((2, 3))
    for day in range(days):
        blocks = s.rng.randint(2, 4)
        for block in range(blocks):
            s.work(s.rng.uniform(30, 180) * MINUTE)
            if block < blocks - 1:
                s.away(s.rng.uniform(20, 150) * MINUTE, connections=1)
        if day < days - 1:
            s.away(s.rng.uniform(14, 17) * HOUR, s.connections())


def zombie_open_tab(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(20, 120) * MINUTE)
    s.away(s.log_uniform(1, 7) * DAY, connections=1)


def abandoned_closed_tab(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(20, 120) * MINUTE)
    s.away(s.log_uniform(8 * HOUR, 5 * DAY), connections=0)


def silent_training(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(10, 40) * MINUTE)
    tab = s.connections()
    s.train(s.log_uniform(2, 36) * HOUR, s.rng.uniform(0.6, 0.95), busy=False, connections=tab)
    _come_back(s, s.log_uniform(1, 16) * HOUR, tab)


def cpu_pipeline(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(10, 30) * MINUTE)
    tab = s.connections()
    for _ in range(s.rng.randint(2, 6)):
        stage = _cpu_stage(s)
        s.add(s.rng.uniform(10, 90) * MINUTE, "cpu_phase", busy=True, connections=tab, usage=stage)
        level = s.rng.uniform(0.5, 0.9)
        s.train(s.rng.uniform(20, 180) * MINUTE, level, busy=True, connections=tab)
    _come_back(s, s.log_uniform(1, 14) * HOUR, tab)


def data_starved(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(10, 30) * MINUTE)
    tab = s.connections()
    s.starved(s.log_uniform(3, 30) * HOUR, s.log_uniform(0.03, 0.30), connections=tab)
    _come_back(s, s.log_uniform(1, 14) * HOUR, tab)


def long_cpu_stage(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(10, 30) * MINUTE)
    tab = s.connections()
    stage = _cpu_stage(s)
    s.add(s.rng.uniform(1, 5) * HOUR, "cpu_phase", busy=True, connections=tab, usage=stage)
    s.train(s.rng.uniform(1, 6) * HOUR, s.rng.uniform(0.5, 0.9), busy=True, connections=tab)
    _come_back(s, s.log_uniform(1, 14) * HOUR, tab)


def sleep_loop(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(10, 30) * MINUTE)
    tab = s.connections()
    s.add(s.log_uniform(12 * HOUR, 3 * DAY), RECLAIMABLE, busy=True, connections=tab, usage="sleep")
    s.work(s.rng.uniform(10, 30) * MINUTE)


def _cpu_stage(s: Session) -> str:
    """What a CPU stage spends its time on: computing (60 %), reading from disk (25 %) or
    downloading (15 %)."""
    return s.usage_rng.choices(("cpu", "disk", "network"), (0.6, 0.25, 0.15))[0]


def batch_standby(s: Session) -> None:
    s.memory_mb = round(s.card_mb * s.rng.uniform(0.25, 0.95))
    end = s.count(s.rng.uniform(3, 14) * DAY)
    while len(s.steps) < end:
        s.add(s.log_uniform(30 * MINUTE, 12 * HOUR), "standby", connections=0)
        level = s.rng.uniform(0.5, 0.95)
        s.train(s.log_uniform(10 * MINUTE, 4 * HOUR), level, busy=False, connections=0)


def _come_back(s: Session, after: float, tab: int) -> None:
    """The owner returns to a finished run: idle-held meanwhile, then checks for a while."""
    s.away(after, tab)
    s.work(s.rng.uniform(10, 30) * MINUTE)


SCENARIOS: dict[str, tuple[Callable[[Session], None], float]] = {
    "interactive": (interactive, 0.30),
    "zombie_open_tab": (zombie_open_tab, 0.12),
    "abandoned_closed_tab": (abandoned_closed_tab, 0.12),
    "silent_training": (silent_training, 0.16),
    "cpu_pipeline": (cpu_pipeline, 0.14),
    "data_starved": (data_starved, 0.16),
    "long_cpu_stage": (long_cpu_stage, 0.10),
    "sleep_loop": (sleep_loop, 0.03),
}


def user_rows(
    index: int, days: int, seed: int, step: int, dcgm: bool = True, default_servers: bool = False
) -> Iterator[dict]:
    """One user's servers over the trace, in time order."""
    rng = random.Random(f"{seed}:{index}")
    usage_rng = random.Random(f"{seed}:{index}:usage")
    user = f"u{index:03d}"
    team = TEAMS[index % len(TEAMS)]
    profile, card_mb = rng.choice(PROFILES)
    standby = index % 16 == 5
    reports = index % 10 != 3
    borrows = index % 6 == 4
    hook_fails = index % 8 == 6
    labels = {"gpu-gov/project": f"{team}-{index % 3}", **(EXEMPT if standby else {})}
    if profile in MAX_AGE:
        labels["gpu-gov/max-age"] = MAX_AGE[profile]
    if borrows:
        labels["gpu-gov/borrowed"] = "true"
    names, weights = zip(*((name, w) for name, (_, w) in SCENARIOS.items()), strict=True)
    end = days * DAY
    t = rng.uniform(0, DAY)
    for number in itertools.count(1):
        t = _working_hours(t + (0 if number == 1 else _stopped_for(rng)), rng, step)
        if t >= end:
            return
        scenario = "batch_standby" if standby else rng.choices(names, weights)[0]
        session = Session(rng, step, card_mb, usage_rng)
        (batch_standby if standby else SCENARIOS[scenario][0])(session)
        server = f"{user}/" if default_servers else f"{user}/s{number:03d}"
        started = {"started": t} if default_servers else {}
        reclaim_at = None  # a team within its guarantee asks this borrowed GPU back
        if borrows and rng.random() < 1 / 3:
            reclaim_at = t + rng.randrange(len(session.steps)) * step
            asked = {"gpu-gov/reclaim": isoformat(at(reclaim_at)), "gpu-gov/reclaim-for": "vision"}
        for i, (sm, busy, active, connections, truth, use) in enumerate(session.steps):
            now = t + i * step
            if now >= end:
                return
            memory = 0 if truth == "idle_free" else session.memory_mb
            row = {"t": now, "server": server, **started, "profile": profile, "team": team}
            row_labels = labels if reclaim_at is None or now < reclaim_at else labels | asked
            if reports or dcgm:
                row["gpu_sm"] = sm  # the report's, or DCGM's for a server without the extension
            if reports:  # the report's targets[].cpu of the kernel
                row["cpu_cores"], row["iowait"], row["read_mb_s"] = use
            elif dcgm:  # no report: the kubelet's reading of the container's CPU
                row["cpu_cores"] = use[0]
            row |= {
                "gpu_mem_mb": memory,
                "holds_context": memory > 0,
                "kernel_busy": busy,
                "user_active": active,
                "connections": connections,
                "reports": reports,
                "labels": row_labels,
                "truth": truth,
                "scenario": scenario,
            }
            if hook_fails:
                row["checkpoint_fails"] = True
            yield row
        t += len(session.steps) * step


def _stopped_for(rng: random.Random) -> float:
    """Time a user's server stays stopped between two sessions: logU(2 h, 3 days)."""
    return math.exp(rng.uniform(math.log(2 * HOUR), math.log(3 * DAY)))


def _working_hours(t: float, rng: random.Random, step: int) -> int:
    """Move a start into 08:00-18:00 (the next morning, if it is later), on the step grid."""
    start, stop = WORKDAY
    day, clock = divmod(t, DAY)
    if not start <= clock < stop:
        day += clock >= stop
        clock = start + rng.uniform(0, 2 * HOUR)
    return int((day * DAY + clock) // step * step)


def generate(
    servers: int,
    days: int,
    seed: int,
    step: int = DEFAULT_STEP,
    dcgm: bool = True,
    default_servers: bool = False,
) -> Iterator[dict]:
    """Every user's rows, merged in time order (ties in user order)."""
    users = [user_rows(i, days, seed, step, dcgm, default_servers) for i in range(servers)]
    return heapq.merge(*users, key=lambda row: row["t"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=40, help="users (default 40)")
    parser.add_argument("--days", type=int, default=30, help="trace length (default 30)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--step", type=int, default=DEFAULT_STEP, help="seconds per sample (default 300)"
    )
    parser.add_argument(
        "--no-dcgm",
        action="store_true",
        help="a cluster without dcgm-exporter: servers without the extension have no gpu_sm",
    )
    parser.add_argument(
        "--default-servers",
        action="store_true",
        help="every session on the user's default server user/ (with its started time)",
    )
    args = parser.parse_args(argv)
    write = sys.stdout.write
    rows = generate(
        args.servers, args.days, args.seed, args.step, not args.no_dcgm, args.default_servers
    )
    for row in rows:
        write(json.dumps(row, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
