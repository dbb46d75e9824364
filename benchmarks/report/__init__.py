"""The report of a run: results.json (everything), results.md (tables), results.png."""
import json
import os

from benchmarks.report.chart import chart
from benchmarks.report.markdown import markdown


def write(report, out):
    """Write the three files into out; returns the names written."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(report))
    written = ["results.json", "results.md"]
    if chart(report, os.path.join(out, "results.png")):
        written.append("results.png")
    return written
