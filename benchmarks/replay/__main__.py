"""``python -m benchmarks.replay``: see ``score.py``."""

import sys

from .score import main

if __name__ == "__main__":
    sys.argv[0] = "python -m benchmarks.replay"  # argparse names the program after argv[0]
    main()
