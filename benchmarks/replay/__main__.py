"""``python -m benchmarks.replay``: see ``score.py``."""

from .score import main

if __name__ == "__main__":
    main()
