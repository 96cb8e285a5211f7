"""``python -m jupyter_gpu_gov.hub``: run the governor service."""

from .app import main

if __name__ == "__main__":
    main()
