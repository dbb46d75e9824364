"""results.png: one log-scale bar chart per scenario (matplotlib, imported when drawing)."""
from benchmarks.common import REFERENCE, fmt

TABLE_PANELS = (("a", "cycle_rate", "items/s"), ("b", "cycle_rate", "cycles/s"),
                ("c", "throughput", "items/s"), ("d", "cycle_rate", "items/s"),
                ("e", "p50_ms", "p50 ms (lower is better)"),
                ("e_xproc", "p50_ms", "p50 ms (lower is better)"))
COLORS = {"queue.Queue": "#999999", REFERENCE: "#d62728", "litequeue": "#ff7f0e"}


def _g_panel(sc):
    names, vals = [], []
    for var in sc["variants"].values():
        for label, e in var["results"].items():
            if e.get("median"):
                names.append(f"{label}\n{var['producers']}p + {var['consumers']}c")
                vals.append(e["median"]["throughput"])
    return (sc["title"], names, vals, "items/s end to end") if names else None


def _f_panel(sc):
    names, vals = [], []
    for label, r in sc["results"].items():
        for what, k in (("after kill", "after_kill"), ("after close", "after_clean_close")):
            if k in r:
                names.append(f"{label}\nopen {what}")
                vals.append(r[k]["open_s"])
    if not names:
        return None
    return (sc["title"] + ": open time", names, vals, "seconds (lower is better)")


def panels(report):
    """(title, bar names, values, unit) for every scenario in the report."""
    out = []
    for key, metric, label in TABLE_PANELS:
        sc = report["scenarios"].get(key)
        if sc:
            names = [l for l, e in sc["results"].items() if e.get("median")]
            vals = [sc["results"][l]["median"][metric] for l in names]
            out.append((sc["title"], names, vals, label))
    for key, make in (("g", _g_panel), ("f", _f_panel)):
        sc = report["scenarios"].get(key)
        panel = make(sc) if sc else None
        if panel:
            out.append(panel)
    return out


def _bars(ax, title, names, vals, unit):
    import matplotlib.ticker
    cs = [next((v for k, v in COLORS.items() if n.startswith(k)), "#1f77b4")
          for n in names]
    y = range(len(names))
    ax.barh(list(y), vals, color=cs)
    ax.set_yticks(list(y))
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(unit, fontsize=8)
    for i, v in enumerate(vals):
        ax.text(v, i, " " + fmt(v), va="center", fontsize=7)
    ax.margins(x=0.25)


def chart(report, path):
    """Draw the panels into path; False when there is nothing to draw."""
    found = panels(report)
    if not found:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ncols = 2
    nrows = (len(found) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(13, 3.6 * nrows), squeeze=False)
    for ax, panel in zip(axes.flat, found):
        _bars(ax, *panel)
    for ax in list(axes.flat)[len(found):]:
        ax.axis("off")
    info = report["machine"]
    fig.suptitle(f"ackqueue vs peers — {info['date'][:10]}, {info['cpu_count']} CPUs, "
                 f"Python {info['python']} (log scale)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
