#!/usr/bin/env python
"""Kept so that `python benchmarks/run.py ...` still works: it runs `python -m benchmarks`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
