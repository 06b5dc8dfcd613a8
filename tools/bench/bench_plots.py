"""Plots drawn from results.json with matplotlib, as PNG files beside results.md:

- headline.png: the README's plot. Left, the alloc+free pair latency per size of cudaMalloc +
  cudaFree, a warm cudaMallocAsync pool and the shim's default policy (vmm, free_sync=device);
  right, the read bandwidth of an allocation spilled past its budget against the model bound.
- latency.png, churn.png: every backend per size / thread count, one panel per free_sync mode,
  the native baselines in every panel.
- bandwidth.png: the spill section alone, with managed memory beside it.

matplotlib is imported when a plot is drawn, not before: without it, the plots are skipped with
one line on stderr and the results (results.json, results.md) are written as ever.
"""

import os
import sys

from bench_results import (BACKENDS, FREE_SYNC, NATIVE_ASYNC, NATIVE_MALLOC, config_label, human_size,
                           shim_config)

COLORS = ("#000000", "#7f7f7f", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
DEFAULT_POLICY = shim_config("vmm", "device")  # what the shim does without a policy file
MISSING = "plots skipped: matplotlib is not installed (Debian/Ubuntu: python3-matplotlib; pip: matplotlib)"
_warned = []


def pyplot():
    """matplotlib.pyplot on the Agg backend, or None (said once on stderr) where it does not import."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # ImportError, or a broken installation: the results stand without plots
        if not _warned:
            print(MISSING, file=sys.stderr)
            _warned.append(True)
        return None
    return plt


def latency_panels(results):
    lat = {}
    for p in results.get("latency", []):
        lat.setdefault(p["config"], []).append((p["size"], p["pair_median_ns"] / 1000.0))
    panels = []
    for s in FREE_SYNC:
        series = [(config_label(n), sorted(lat[n])) for n in (NATIVE_MALLOC, NATIVE_ASYNC) if n in lat]
        series += [(f"shim {b}", sorted(lat[shim_config(b, s)])) for b in BACKENDS
                   if shim_config(b, s) in lat]
        panels.append((f"free_sync={s}", series))
    return panels if any(series for _, series in panels) else []


def churn_panels(results):
    ch = {}
    for c in results.get("churn", []):
        if c.get("pairs_per_s"):
            ch.setdefault(c["config"], []).append((c["threads"], c["pairs_per_s"]))
    panels = []
    for s in FREE_SYNC:
        series = [("cudaMalloc+cudaFree (native)", sorted(ch["native"]))] if "native" in ch else []
        series += [(f"shim {b}", sorted(ch[shim_config(b, s)])) for b in BACKENDS if shim_config(b, s) in ch]
        panels.append((f"free_sync={s}", series))
    return panels if any(series for _, series in panels) else []


def headline_latency_series(results):
    """The three lines of the headline's left panel: the two native paths and the default policy."""
    lat = {}
    for p in results.get("latency", []):
        lat.setdefault(p["config"], []).append((p["size"], p["pair_median_ns"] / 1000.0))
    names = ((NATIVE_MALLOC, config_label(NATIVE_MALLOC)),
             (NATIVE_ASYNC, "cudaMallocAsync+cudaFreeAsync, warm pool (native)"),
             (DEFAULT_POLICY, "shim, default policy (vmm, free_sync=device)"))
    return [(label, sorted(lat[n])) for n, label in names if lat.get(n)]


def bandwidth_series(spill):
    """spill: all_results.parse_spill's dict. The shim's spilled allocation (solid), the model bound
    and managed memory (dashed: what the shim is measured against)."""
    rows = sorted((spill or {}).get("rows", []), key=lambda r: r["factor"])
    series = [(label, [(r["factor"], r[key]) for r in rows if r.get(key)])
              for label, key in (("shim, spilled to host", "spilled_gbps"),
                                 ("model bound 1/(f_dev/B_dev + f_host/B_host)", "bound_gbps"),
                                 ("managed, host placement", "managed_host_gbps"),
                                 ("managed, striped placement", "managed_stripe_gbps"))]
    return [(label, pts) for label, pts in series if pts]


def _draw(ax, series, title, xlabel, xfmt, xbase, ylog=True):
    for k, (label, pts) in enumerate(series):
        pts = [(x, y) for x, y in pts if y > 0]
        if not pts:
            continue
        style = "-" if label.startswith("shim") else "--"  # natives and bounds dashed
        ax.plot([x for x, _ in pts], [y for _, y in pts], style, marker="o", markersize=3,
                color=COLORS[k % len(COLORS)], label=label)
    ticks = sorted({x for _, pts in series for x, _ in pts})
    if xbase:
        ax.set_xscale("log", base=xbase)
    if ylog:
        ax.set_yscale("log")
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xticklabels([xfmt(t) for t in ticks], rotation=45, fontsize=8)
        ax.minorticks_off()
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)


def _save(plt, fig, path, title):
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_panels(path, title, panels, xlabel, ylabel, xfmt, xbase=2):
    """One PNG with a panel per (name, series); False where matplotlib is missing or nothing to draw."""
    plt = pyplot()
    if plt is None or not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.6), sharey=True, squeeze=False)
    for ax, (name, series) in zip(axes[0], panels):
        _draw(ax, series, name, xlabel, xfmt, xbase)
    axes[0][0].set_ylabel(ylabel)
    _save(plt, fig, path, title)
    return True


def plot_headline(alloc, spill, outdir, meta=None):
    """headline.png from the alloc and spill sections' data (either may be None); the path or None."""
    lat = headline_latency_series(alloc or {})
    bw = bandwidth_series(spill)[:2]  # the shim against its bound
    if not lat and not bw:
        return None
    plt = pyplot()
    if plt is None:
        return None
    panels = [p for p in (lat and "lat", bw and "bw") if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.4 * len(panels), 4.4), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "lat":
            _draw(ax, lat, "alloc+free pair, median", "size", human_size, 2)
            ax.set_ylabel("µs per pair (log)")
        else:
            _draw(ax, bw, "one allocation read past its device budget", "size / budget", lambda f: f"{f:g}x",
                  None, ylog=False)
            ax.set_ylabel("read GB/s")
            ax.set_ylim(bottom=0)
    meta = meta or {}
    where = ", ".join(str(meta[k]) for k in ("gpu", "commit") if meta.get(k))
    path = os.path.join(outdir, "headline.png")
    _save(plt, fig, path, "allocshim" + (f" ({where})" if where else ""))
    return path


def plot_bandwidth(spill, outdir):
    """bandwidth.png: spilled read bandwidth against the oversubscription factor; the paths written."""
    series = bandwidth_series(spill)
    if not series:
        return []
    path = os.path.join(outdir, "bandwidth.png")
    ok = write_panels(path, "spill read bandwidth against oversubscription",
                      [("read bandwidth of one allocation of factor x the budget", series)],
                      "oversubscription factor (size / budget)", "GB/s", lambda f: f"{f:g}x", xbase=None)
    return [path] if ok else []


def plot_all(results, outdir):
    """latency.png and churn.png from the alloc section's data; the paths written."""
    written = []
    charts = [("latency", "alloc+free pair latency (median)", latency_panels(results), "size",
               "us per pair", human_size),
              ("churn", "multi-threaded churn throughput", churn_panels(results), "host threads",
               "pairs/s (all threads)", str)]
    for stem, title, panels, xlabel, ylabel, xfmt in charts:
        path = os.path.join(outdir, stem + ".png")
        if panels and write_panels(path, title, panels, xlabel, ylabel, xfmt):
            written.append(path)
    return written
