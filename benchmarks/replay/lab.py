"""A research lab's month on a shared hub: a second world of replay traces, written apart from
the policy, in the replay format of docs/architecture.md.

    python -m benchmarks.replay.lab --servers 40 --days 30 --seed 1 [--step 300] > trace.jsonl
    python -m benchmarks.replay --world lab --seed 1        # scored, every policy side by side

The story, from how a lab's people and workloads behave (the numbers are assumptions about that
behaviour, not fitted to measured data and not taken from any policy's settings; U is uniform,
logU log-uniform):

- **Days and weeks.** The clock starts on Thursday 1 January (the replay engine's epoch, UTC,
  one time zone). Each person arrives at a time of their own, U(08:00, 10:30) on workdays (a
  fifth are late risers, U(12:00, 14:00)), and leaves 8-10 h later. Nobody starts a server on a
  Saturday or a Sunday; whatever is left running on Friday evening is found on Monday. The
  hub's default server ``user/`` is reused, each start with its ``started`` time.
- **Between sessions** the server stays stopped until a later arrival: the next workday (60 %)
  or one to four workdays later (a conference, writing, a CPU-only week).
- **Coming back.** Whenever a session waits on its owner (a finished run, a crashed run, a
  notebook left at the end of the day), the owner looks again at their next arrival if the
  wait began after they left, else U(30 min, 3 h) later (a meeting, a seminar, lunch); then
  they look at the notebook for U(10, 40) min and stop the server.

Sessions, one kind at a time (weights in brackets):

- ``analysis`` (0.32): a day at the notebook. Work blocks of U(40 min, 2.5 h): a step or two of
  thinking between cells (median 4 min, up to 40), GPU cells of U(2, 20) min at SM U(0.2, 0.9)
  (a third of the cells) or CPU cells of U(1, 5) min; and, once a day in half the sessions, an
  hour or two of plotting and writing with the model loaded — CPU cells every few minutes, no
  GPU cell at all. Between blocks, meetings and lunch of U(30, 90) min with the tab open. At the
  day's end the owner stops the server (45 %), or leaves it overnight (tab open or closed) and
  goes on the next workday (40 %, at most three days), or walks away and forgets it until their
  next arrival (15 %).
- ``finetune`` (0.22): a fine-tuning run in a notebook cell. Set up U(20, 60) min at the
  notebook, then the cell runs, unattended, for logU(8 h, 4 days) of epochs: training of U(40
  min, 3 h) at SM U(0.75, 0.98), then a checkpoint save (U(2, 12) min, the GPU idle, the kernel
  writing to disk) and, every 2-4 epochs (per run), an evaluation on the CPU (a BLEU/ROUGE or a scikit-
  learn probe over generations, U(20 min, 2.5 h), the GPU idle and held, several cores busy).
  A fifth of the runs crash at a uniform time (out of memory, a NaN, a full disk): the cell ends
  with its traceback and the kernel keeps the model. The owner comes back as above.
- ``inference`` (0.14): a model loaded and served to colleagues from the notebook, by a cell
  that blocks on the server (60 %, ``demo.launch()``: the kernel busy) or from a thread (40 %).
  Requests come in bursts of 5-15 min at SM logU(0.05, 0.6) during working hours, with
  quiet of logU(15 min, 5 h) between (SM 0, the serving loop waiting on its socket); the server
  runs for logU(1, 5) days and its owner stops it during a working day.
- ``data_prep`` (0.18): a "run all" of a preprocessing notebook: 2-5 cycles of a CPU stage of
  U(40 min, 4 h) and a GPU stage of U(5, 40) min (embeddings at SM U(0.3, 0.8), DataLoader
  workers reading). A CPU stage computes (50 %: U(1, 12) cores), reads a dataset from disk (25
  %), downloads one (10 %), or waits on a query or a job elsewhere — a warehouse export, a CPU
  cluster job — with its kernel all but asleep (15 %: U(0.001, 0.015) cores, no reads). The
  owner comes back as above.
- ``forgotten`` (0.14): a quick look, U(10, 45) min at the notebook, then the tab is closed
  (half the time) or left open and the model kept until the owner's next arrival or later:
  logU(1, 5) workdays.

Hard deadlines, failing hooks, no extension (per person):

- The admin restarts every server at most 5 days after it started (``gpu-gov/max-age`` 432000,
  as the profile layer labels it), to roll out images.
- The lab runs over its guarantee on the ``a100-80g`` tier: two people in seven (index 1 or 4
  mod 7) borrow (``gpu-gov/borrowed``), and in half those sessions the partner team within its
  guarantee asks the GPU back at a uniform time of the session (``gpu-gov/reclaim`` and
  ``gpu-gov/reclaim-for``).
- Home volumes have quotas: a fine-tuning run's own checkpoints fill a quarter of the people's
  volumes (index 1 mod 4) after U(4, 20) saves, and from then on in that session the
  governor's checkpoint hook fails (``checkpoint_fails``) too.
- Every fifth person (index 2 mod 5) runs an image of their own without the server extension:
  ``reports`` false, ``gpu_sm`` from DCGM (``--no-dcgm``: none), no CPU figures.

Truth, as ``score.py`` defines it: ``active`` GPU work at any SM (an inference burst, a GPU
cell, training); ``cpu_phase`` a running cell whose next stage uses the GPU (a checkpoint save
or a CPU evaluation inside a training run, a CPU stage of a data-prep run — the remote wait
included: the job comes back and the GPU stage follows); ``present`` the owner at the notebook
(thinking, CPU cells, plotting); ``idle_held`` the GPU held with nobody and nothing needing it
at that time: meetings with the tab open, nights and weekends, a finished or crashed run before
its owner looks, and an inference server's quiet between bursts (nothing is being served; the
model is kept for a request that may come); ``idle_free`` before the first GPU cell.

CPU and I/O figures per kernel (servers that send reports): an idle kernel U(0.001, 0.006)
cores; GPU work U(0.4, 1.2); a checkpoint save U(0.2, 1) with I/O wait U(0.2, 0.7) and U(50,
400) MB/s written (not read: reads U(0, 5)); the rest as above. Memory: the first GPU cell loads
U(20 %, 90 %) of the card; held until the server stops.

Limits: one time zone, no holidays; nobody answers a warning; a crashed run's kernel is idle (no
cell); the quiet of a blocking inference cell is labelled like a sleep loop's, though its owner
may want it kept; the trace does not change after a cull (what would have followed is
scored as the score's "culls before a return").
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
DEFAULT_STEP = 300
EPOCH_WEEKDAY = 3  # 2026-01-01, the replay engine's t = 0, is a Thursday (Monday = 0)

PROFILES = (("a100-80g", 81920), ("a100-40g", 40960), ("l40s-48g", 46068))
MAX_AGE = str(5 * DAY)
BORROWED_TIER = "a100-80g"

Usage = tuple[float, float, float]


def _usage(kind: str, r: random.Random) -> Usage:
    """What a kernel's process tree does over a step, by what it runs."""
    if kind == "idle":
        return r.uniform(0.001, 0.006), 0.0, 0.0
    if kind == "gpu":
        return r.uniform(0.4, 1.2), r.uniform(0.0, 0.05), r.uniform(0.0, 30.0)
    if kind == "loader":
        return r.uniform(2.0, 8.0), r.uniform(0.0, 0.3), r.uniform(20.0, 400.0)
    if kind == "save":
        return r.uniform(0.2, 1.0), r.uniform(0.2, 0.7), r.uniform(0.0, 5.0)
    if kind == "compute":
        return r.uniform(1.0, 12.0), r.uniform(0.0, 0.05), r.uniform(0.0, 40.0)
    if kind == "disk":
        return r.uniform(0.05, 0.6), r.uniform(0.1, 0.6), r.uniform(5.0, 250.0)
    if kind == "download":
        return math.exp(r.uniform(math.log(0.03), math.log(0.4))), 0.0, 0.0
    if kind == "remote":
        return r.uniform(0.001, 0.015), 0.0, 0.0
    if kind == "person":
        return r.uniform(0.5, 6.0), r.uniform(0.0, 0.05), r.uniform(0.0, 20.0)
    raise ValueError(kind)


def weekday(t: float) -> int:
    return (EPOCH_WEEKDAY + int(t // DAY)) % 7


class Person:
    """A lab member's habits: when they arrive and leave."""

    def __init__(self, rng: random.Random):
        late = rng.random() < 0.2
        self.arrive = (rng.uniform(12, 14) if late else rng.uniform(8, 10.5)) * HOUR
        self.hours = rng.uniform(8, 10) * HOUR

    def next_arrival(self, t: float, rng: random.Random, skip: int = 0) -> float:
        """Their first arrival after ``t`` on a workday, ``skip`` workdays further on; each
        day's arrival within half an hour of their habit."""
        day = int(t // DAY)
        while True:
            if weekday(day * DAY) < 5:
                arrival = day * DAY + self.arrive + rng.uniform(-0.5, 0.5) * HOUR
                if arrival > t:
                    if skip == 0:
                        return arrival
                    skip -= 1
            day += 1

    def at_work(self, t: float) -> bool:
        clock = t % DAY
        return weekday(t) < 5 and self.arrive <= clock < self.arrive + self.hours

    def leaves(self, t: float) -> float:
        """When they leave on the day of ``t`` (which is at work)."""
        return t // DAY * DAY + self.arrive + self.hours


class Session:
    """One server's run, built step by step from its start time."""

    def __init__(self, rng, usage_rng, person: Person, start: float, step: int, card_mb: int):
        self.rng, self.usage_rng, self.person = rng, usage_rng, person
        self.start, self.step, self.card_mb = start, step, card_mb
        self.memory_mb = 0
        # (gpu_sm, kernel_busy, user_active, connections, truth, usage, checkpoint_fails)
        self.steps: list[tuple] = []
        self.saves_left: int | None = None  # checkpoint saves before the home volume is full

    @property
    def now(self) -> float:
        return self.start + len(self.steps) * self.step

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
        usage: str = "idle",
    ) -> None:
        fails = self.saves_left is not None and self.saves_left <= 0
        for i in range(self.count(seconds)):
            use = _usage(usage, self.usage_rng)
            rounded = (round(use[0], 4), round(use[1], 3), round(use[2], 2))
            step = (round(sm(), 3), busy, user_first and i == 0, connections, truth, rounded, fails)
            self.steps.append(step)

    def level(self, low: float, high: float) -> Callable[[], float]:
        mean = self.rng.uniform(low, high)
        return lambda: min(mean * self.rng.uniform(0.85, 1.15), 1.0)

    def log_uniform(self, low: float, high: float) -> float:
        return math.exp(self.rng.uniform(math.log(low), math.log(high)))

    def open(self) -> None:
        self.add(self.rng.uniform(2, 12) * MINUTE, "idle_free", user_first=True)
        self.memory_mb = round(self.card_mb * self.rng.uniform(0.2, 0.9))
        self.gpu_cell(self.rng.uniform(2, 6) * MINUTE)

    def gpu_cell(self, seconds: float) -> None:
        self.add(seconds, "active", self.level(0.2, 0.9), busy=True, user_first=True, usage="gpu")

    def cpu_cell(self, seconds: float) -> None:
        self.add(seconds, "present", busy=True, user_first=True, usage="person")

    def think(self) -> None:
        gap = min(max(math.exp(self.rng.gauss(math.log(4), 0.9)), 1), 40)
        self.add(gap * MINUTE, "present")

    def work(self, seconds: float) -> None:
        """At the notebook: thinking, then a cell (a third on the GPU)."""
        end = self.now + seconds
        while self.now < end:
            self.think()
            if self.rng.random() < 1 / 3:
                self.gpu_cell(self.rng.uniform(2, 20) * MINUTE)
            else:
                self.cpu_cell(self.rng.uniform(1, 5) * MINUTE)

    def plotting(self, seconds: float) -> None:
        """Plotting and writing with the model loaded: CPU cells only."""
        end = self.now + seconds
        while self.now < end:
            self.think()
            self.cpu_cell(self.rng.uniform(1, 4) * MINUTE)

    def away_until(self, until: float, connections: int, busy: bool = False, usage="idle") -> None:
        if until > self.now:
            self.add(until - self.now, "idle_held", busy=busy, connections=connections, usage=usage)

    def wait_for_owner(self, connections: int) -> None:
        """A run is over (or crashed): idle-held until the owner looks, then they look."""
        if self.person.at_work(self.now):
            back = self.now + self.rng.uniform(0.5, 3) * HOUR
            if back > self.person.leaves(self.now):
                back = self.person.next_arrival(self.now, self.rng)
        else:
            back = self.person.next_arrival(self.now, self.rng)
        self.away_until(back, connections)
        self.work(self.rng.uniform(10, 40) * MINUTE)

    def tab(self) -> int:
        return self.rng.choice((0, 1))


def analysis(s: Session) -> None:
    s.open()
    for day in range(3):
        leaves = s.person.leaves(s.now) if s.person.at_work(s.now) else s.now + 4 * HOUR
        plotted = s.rng.random() < 0.5
        while s.now < leaves - 40 * MINUTE:
            s.work(s.rng.uniform(40, 150) * MINUTE)
            if plotted:
                s.plotting(s.rng.uniform(1, 2) * HOUR)
                plotted = False
            if s.now < leaves - 90 * MINUTE:
                s.away_until(s.now + s.rng.uniform(30, 90) * MINUTE, connections=1)
        choice = s.rng.random()
        if choice < 0.45 or day == 2:
            return
        tab = s.tab()
        if choice < 0.85:  # overnight, then on with it next workday
            s.away_until(s.person.next_arrival(s.now, s.rng), tab)
            continue
        s.away_until(s.person.next_arrival(s.now, s.rng), tab)  # forgotten until they come in
        s.work(s.rng.uniform(10, 40) * MINUTE)
        return


def finetune(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(20, 60) * MINUTE)
    tab = s.tab()
    end = s.now + s.log_uniform(8 * HOUR, 4 * DAY)
    crash = s.now + s.rng.uniform(0, end - s.now) if s.rng.random() < 0.2 else None
    stop = min(end, crash) if crash is not None else end
    evaluate_every = s.rng.randint(2, 4)
    for epoch in itertools.count(1):
        s.add(s.rng.uniform(40, 180) * MINUTE, "active", s.level(0.75, 0.98), busy=True,
              connections=tab, usage="gpu")  # fmt: skip
        if s.now >= stop:  # the run ends (or crashes) in a training stage
            break
        # Between epochs the next training stage always follows: the cell is running.
        s.add(s.rng.uniform(2, 12) * MINUTE, "cpu_phase", busy=True, connections=tab, usage="save")
        if s.saves_left is not None:
            s.saves_left -= 1
        if epoch % evaluate_every == 0:
            s.add(s.rng.uniform(20, 150) * MINUTE, "cpu_phase", busy=True, connections=tab,
                  usage="compute")  # fmt: skip
    s.wait_for_owner(tab)


def inference(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(15, 45) * MINUTE)
    blocking = s.rng.random() < 0.6
    tab = s.tab()
    end = s.now + s.log_uniform(1, 5) * DAY
    while s.now < end or not s.person.at_work(s.now):
        s.add(s.rng.uniform(5, 15) * MINUTE, "active", s.level(0.05, 0.6), busy=blocking,
              connections=tab, usage="gpu")  # fmt: skip
        quiet = s.now + s.log_uniform(15 * MINUTE, 5 * HOUR)
        if not s.person.at_work(quiet):  # requests come in working hours
            quiet = max(quiet, s.person.next_arrival(s.now, s.rng) + s.rng.uniform(0, 2) * HOUR)
        s.away_until(quiet, tab, busy=blocking, usage="remote" if blocking else "idle")
    s.work(s.rng.uniform(5, 20) * MINUTE)


def data_prep(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(15, 45) * MINUTE)
    tab = s.tab()
    for _ in range(s.rng.randint(2, 5)):
        kind = s.usage_rng.choices(("compute", "disk", "download", "remote"), (50, 25, 10, 15))[0]
        s.add(s.rng.uniform(40, 240) * MINUTE, "cpu_phase", busy=True, connections=tab, usage=kind)
        s.add(s.rng.uniform(5, 40) * MINUTE, "active", s.level(0.3, 0.8), busy=True,
              connections=tab, usage="loader")  # fmt: skip
    s.wait_for_owner(tab)


def forgotten(s: Session) -> None:
    s.open()
    s.work(s.rng.uniform(10, 45) * MINUTE)
    skip = int(s.log_uniform(1, 5)) - 1
    s.away_until(s.person.next_arrival(s.now, s.rng, skip), s.tab())
    s.work(s.rng.uniform(5, 20) * MINUTE)


SCENARIOS: dict[str, tuple[Callable[[Session], None], float]] = {
    "analysis": (analysis, 0.32),
    "finetune": (finetune, 0.22),
    "inference": (inference, 0.14),
    "data_prep": (data_prep, 0.18),
    "forgotten": (forgotten, 0.14),
}


def user_rows(index: int, days: int, seed: int, step: int, dcgm: bool = True) -> Iterator[dict]:
    """One person's server over the trace, in time order."""
    rng = random.Random(f"lab:{seed}:{index}")
    usage_rng = random.Random(f"lab:{seed}:{index}:usage")
    person = Person(rng)
    user = f"r{index:03d}"
    profile, card_mb = rng.choice(PROFILES)
    reports = index % 5 != 2
    borrows = index % 7 in (1, 4) and profile == BORROWED_TIER
    quota = index % 4 == 1
    labels = {"gpu-gov/project": f"lab-{index % 4}", "gpu-gov/max-age": MAX_AGE}
    if borrows:
        labels["gpu-gov/borrowed"] = "true"
    names, weights = zip(*((n, w) for n, (_, w) in SCENARIOS.items()), strict=True)
    end = days * DAY
    t = person.next_arrival(rng.uniform(0, 2 * DAY), rng)
    while True:
        start = int(t // step * step)
        if start >= end:
            return
        scenario = rng.choices(names, weights)[0]
        session = Session(rng, usage_rng, person, start, step, card_mb)
        if quota and scenario == "finetune":
            session.saves_left = rng.randint(4, 20)
        SCENARIOS[scenario][0](session)
        reclaim_at = None
        if borrows and rng.random() < 0.5:
            reclaim_at = start + rng.randrange(len(session.steps)) * step
            asked = {"gpu-gov/reclaim": isoformat(at(reclaim_at)), "gpu-gov/reclaim-for": "bio"}
        for i, (sm, busy, active, conns, truth, use, fails) in enumerate(session.steps):
            now = start + i * step
            if now >= end:
                return
            memory = 0 if truth == "idle_free" else session.memory_mb
            row = {"t": now, "server": f"{user}/", "started": start, "profile": profile}
            row["team"] = "lab"
            if reports or dcgm:
                row["gpu_sm"] = sm
            if reports:
                row["cpu_cores"], row["iowait"], row["read_mb_s"] = use
            row |= {
                "gpu_mem_mb": memory,
                "holds_context": memory > 0,
                "kernel_busy": busy,
                "user_active": active,
                "connections": conns,
                "reports": reports,
                "labels": labels if reclaim_at is None or now < reclaim_at else labels | asked,
                "truth": truth,
                "scenario": scenario,
            }
            if fails:
                row["checkpoint_fails"] = True
            yield row
        stopped = session.now
        t = person.next_arrival(stopped, rng, skip=0 if rng.random() < 0.6 else rng.randint(1, 4))


def generate(
    servers: int,
    days: int,
    seed: int,
    step: int = DEFAULT_STEP,
    dcgm: bool = True,
    default_servers: bool = True,
) -> Iterator[dict]:
    """Every person's rows, merged in time order (ties in person order). The lab's servers are
    always each user's default server (``default_servers`` is accepted for the same call as
    ``generate.generate``)."""
    people = [user_rows(i, days, seed, step, dcgm) for i in range(servers)]
    return heapq.merge(*people, key=lambda row: row["t"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # a whole sentence
    parser.add_argument("--servers", type=int, default=40, help="people (default 40)")
    parser.add_argument("--days", type=int, default=30, help="trace length (default 30)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--step", type=int, default=DEFAULT_STEP, help="seconds per sample")
    parser.add_argument("--no-dcgm", action="store_true", help="no gpu_sm without the extension")
    args = parser.parse_args(argv)
    for row in generate(args.servers, args.days, args.seed, args.step, not args.no_dcgm):
        sys.stdout.write(json.dumps(row, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
