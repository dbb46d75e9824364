"""python -m benchmarks: run the suite (see benchmarks/runner.py)."""
import sys

from benchmarks.runner import main

sys.exit(main())
