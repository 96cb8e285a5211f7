"""Run the quick benchmarks and print their figures: ``python -m benchmarks``."""

from . import admission, diagnose, reconcile, sampler_tick
from .replay import score as reclamation_replay

if __name__ == "__main__":
    sampler_tick.main([])
    reconcile.main([])  # 2,000 servers; ``python -m benchmarks.reconcile --servers 10000``
    admission.main([])  # 10,000 started servers
    diagnose.main([])  # 360 servers' windows to train, 210 to test
    reclamation_replay.main([])  # 40 users, 30 days, a sample every 5 minutes
