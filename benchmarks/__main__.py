"""Run the quick benchmarks and print their figures: ``python -m benchmarks``."""

from . import sampler_tick

if __name__ == "__main__":
    sampler_tick.main([])
