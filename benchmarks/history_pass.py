"""What recording the history costs the governor's pass (docs/benchmarks-history.md, "History").

    python -m benchmarks.history_pass [--off] [benchmarks.reconcile's options]

Runs ``benchmarks.reconcile`` (its fake Hub, DCGM exporter and reports, unchanged) with
``Governor._record`` (each server's look) and ``_record_pass`` (the pass's actions joined, the
kept rows written) timed, and prints, for the first pass (which writes every run's id) and the
median of the later ones, the time in each and their share of the pass. ``--off`` runs the
same with the history disabled, for a side-by-side run: alternate the two.

After the passes, what only the history holds (``held_kb_a_server``): the objects reached from
the governor's history attributes (``HELD``) and from nothing else of the governor, by
``sys.getsizeof`` (as ``benchmarks.memory`` walks them), in kB a running server.
"""

from __future__ import annotations

import statistics
import sys
import time

from benchmarks.memory import Reach
from jupyter_gpu_gov.hub.history import HistoryOptions
from jupyter_gpu_gov.hub.reconcile import Governor

PARTS = ("_record", "_record_pass")
HELD = ("_history", "_history_last", "_history_pending", "_keyframes", "_history_retry")


def main(argv: list[str]) -> None:
    if "--off" in argv:
        argv = [a for a in argv if a != "--off"]
        HistoryOptions.enabled = property(lambda self: False)  # this process only
    passes: list[float] = []
    spent: dict[str, list[float]] = {name: [] for name in PARTS}
    looks = [0.0]

    reconcile = Governor.reconcile

    governors = []

    async def timed_reconcile(self, *args, **kwargs):
        governors[:] = [self]
        looks[0] = 0.0
        started = time.perf_counter()
        try:
            return await reconcile(self, *args, **kwargs)
        finally:
            passes.append(time.perf_counter() - started)
            spent["_record"].append(looks[0])

    record, record_pass = Governor._record, Governor._record_pass

    def timed_record(self, *args):
        started = time.perf_counter()
        try:
            return record(self, *args)
        finally:
            looks[0] += time.perf_counter() - started

    async def timed_record_pass(self, *args):
        # Awaited: a coroutine's own call only makes it (this read 0.0 until wave 15). Its
        # write runs in the store's thread, so this is wall time, the loop free meanwhile.
        started = time.perf_counter()
        try:
            return await record_pass(self, *args)
        finally:
            spent["_record_pass"].append(time.perf_counter() - started)

    Governor.reconcile = timed_reconcile
    Governor._record = timed_record
    Governor._record_pass = timed_record_pass
    from benchmarks import reconcile as bench

    bench.main(argv)

    def median(values: list[float]) -> float:
        return statistics.median(values[1:]) if len(values) > 1 else 0.0

    later = {name: median(spent[name]) for name in PARTS}
    share = sum(later.values()) / median(passes) if median(passes) else 0.0
    figures = {
        "history": "off" if "--off" in sys.argv else "on",
        "passes": len(passes),
        "first_pass_s": round(passes[0], 3) if passes else None,
        "first_record_s": round(spent["_record"][0], 4) if passes else None,
        "first_record_pass_s": round(spent["_record_pass"][0], 4) if passes else None,
        "pass_s": round(median(passes), 3),
        "record_s": round(later["_record"], 4),
        "record_pass_s": round(later["_record_pass"], 4),
        "share": f"{share:.1%}",
    }
    if governors and "--off" not in sys.argv:
        governor = governors[0]
        figures["held_kb_a_server"] = round(_held(governor) / len(governor._servers) / 1e3, 3)
    print("history pass:", " ".join(f"{k}={v}" for k, v in figures.items()))


def _held(governor) -> int:
    """Bytes of the objects that only the governor's ``HELD`` attributes reach."""
    reach = Reach(governor)
    reach.walk(*(value for name, value in vars(governor).items() if name not in HELD))
    by_type, _ = reach.walk(*(getattr(governor, name) for name in HELD if hasattr(governor, name)))
    return sum(by_type.values())


if __name__ == "__main__":
    main(sys.argv[1:])
