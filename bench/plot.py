"""Figures for docs/performance.md from the benchmarks' JSON output.

    python bench/plot.py RESULTS_DIR [--img docs/img]

RESULTS_DIR is what scripts/plots.sh fills (bench/results/<date>/):

* ``allreduce.jsonl``, ``rounds.jsonl``, ``meta.json``: scripts/bench-side-by-side.sh
  ``--sweep ... --json DIR`` (kolo-bench, gloo_bench and mpi_bench rows, each tagged with its
  round and implementation; the load and tcp_pump result of every round; the machine and the
  peers' versions, or why a peer was left out);
* ``hvd_step_comm.json``, ``hvd_step_compute.json``: ``bench/torch/hvd_bench.py step --json``;
* ``ddp.json``: ``bench/torch/ddp_bench.py --json``;
* ``torch-meta.json``: the load before the PyTorch runs, or why they were left out.

Draws, with matplotlib's Agg backend, into --img:

busbw is computed from each size's median iteration (``--stat mean``: from the mean time, the
tools' own busbw_gbps), the median over the rounds, with a band from the lowest to the highest.

* ``allreduce-busbw-shm.png``: busbw against message size, as shipped on one host (kolo and
  Open MPI over shared memory; Gloo over TCP, its only transport);
* ``allreduce-busbw-tcp.png``: the same over loopback TCP (kolo KOLO_SHM=0, Gloo, Open MPI btl
  tcp), with the loopback TCP ceiling that tcp_pump measured;
* ``torch-step.png``: step times of kolo.torch DistributedOptimizer and DDP on kolo against
  DDP on gloo.

A figure whose data is missing is not drawn; a peer missing from the data is named in a note on
the figure. Prints the figures' key numbers.
"""

import argparse
import collections
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

DPI = 100
# (impl in allreduce.jsonl, legend label, colour, marker)
STYLE = {
    "kolo": ("kolo (shared memory)", "#1f4e9c", "o"),
    "kolo_tcp": ("kolo, TCP (KOLO_SHM=0)", "#1f4e9c", "o"),
    "gloo": ("Gloo ring_chunked (TCP)", "#e07b00", "s"),
    "mpi": ("Open MPI 4.1 (shared memory, vader)", "#2a9d3a", "^"),
    "mpi_tcp": ("Open MPI 4.1, TCP (btl tcp,self)", "#2a9d3a", "^"),
}
FIGS = {
    "shm": ("allreduce-busbw-shm.png", ["kolo", "mpi", "gloo"],
            "as shipped on one host: kolo and Open MPI over shared memory, Gloo over TCP "
            "(its only transport)"),
    "tcp": ("allreduce-busbw-tcp.png", ["kolo_tcp", "gloo", "mpi_tcp"],
            "over loopback TCP"),
}
PEER_OF = {"gloo": "gloo", "mpi": "openmpi", "mpi_tcp": "openmpi"}


def save(fig, path):
    """PNG at DPI, reduced to a 256-colour palette when Pillow is there (a third the bytes)."""
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    try:
        from PIL import Image
    except ImportError:
        return
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def size_label(b):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d%s" % (b // m, unit)
    return "%d" % b


def size_words(b):
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= m and b % m == 0:
            return "%d %s" % (b // m, unit)
    return "%d B" % b


def load_jsonl(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_json(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def machine_words(meta, rounds, loopback):
    cpus = meta.get("cpus", "?")
    words = "1 host: %s-core VM (shared)" % cpus + (", loopback" if loopback else "")
    date = (meta.get("date") or "")[:10]
    loads = [r["load"][0] for r in rounds if r.get("load")]
    if loads:
        lo, hi = min(loads), max(loads)
        words += ", load %.1f" % lo if lo == hi else ", load %.1f-%.1f" % (lo, hi)
    if date:
        words += ", " + date
    return words


def busbw(r, stat):
    """busbw from the mean time (the tools' busbw_gbps) or from the median iteration."""
    if stat == "mean":
        return r["busbw_gbps"]
    n = r["ranks"]
    return r["bytes"] / (r["median_us"] * 1e-6) * 2 * (n - 1) / n / 1e9


def busbw_figure(kind, rows, rounds, meta, img, notes_out, stat):
    fname, impls, what = FIGS[kind]
    by = collections.defaultdict(list)  # (impl, n, bytes) -> [busbw per round]
    for r in rows:
        if r.get("impl") in impls:
            by[(r["impl"], r["launched"], r["bytes"])].append(busbw(r, stat))
    ranks = sorted({k[1] for k in by}, reverse=True)  # 4 first
    if not ranks:
        return None
    nrounds = max(len(v) for v in by.values())
    fig, axes = plt.subplots(1, len(ranks), figsize=(5.2 * len(ranks), 4.6), dpi=DPI,
                             squeeze=False)
    sizes_all = sorted({k[2] for k in by})
    iters = sorted({r["iters"] for r in rows if r.get("impl") in impls})
    key = {}
    handles = {}
    for ax, n in zip(axes[0], ranks):
        for impl in impls:
            pts = sorted((b, v) for (i, m, b), v in by.items() if i == impl and m == n)
            if not pts:
                continue
            label, colour, marker = STYLE[impl]
            xs = [b for b, _ in pts]
            med = [statistics.median(v) for _, v in pts]
            ls = "--" if impl == "gloo" and kind == "shm" else "-"
            handles[label], = ax.plot(xs, med, ls, color=colour, marker=marker, ms=4.5, lw=1.6)
            if nrounds > 1:
                ax.fill_between(xs, [min(v) for _, v in pts], [max(v) for _, v in pts],
                                color=colour, alpha=0.15, lw=0)
            for b, m in zip(xs, med):
                key[(impl, n, b)] = m
        if kind == "tcp" and rounds:
            bounds = [meta.get("cpus", 2) / (n * r["tcp_pump"]["cpu_s_per_gb"])
                      for r in rounds if r.get("tcp_pump")]
            big = [b for b in sizes_all if b >= 4 << 20]
            if bounds and big:
                # what streaming through loopback TCP costs the CPUs, for messages that do not
                # stay in the caches
                c = statistics.median(bounds)
                x0, x1 = big[0] / 1.3, sizes_all[-1] * 1.3
                if max(bounds) > min(bounds):
                    ax.fill_between([x0, x1], min(bounds), max(bounds), color="0.5", alpha=0.2,
                                    lw=0)
                label = "loopback TCP ceiling for large messages (tcp_pump)"
                handles[label], = ax.plot([x0, x1], [c, c], color="0.35", lw=1.2, ls=":")
                key[("ceiling", n, 0)] = c
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(sizes_all))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda b, _: size_label(int(round(b)))))
        ax.tick_params(axis="x", labelsize=8.5)
        ax.set_xlim(sizes_all[0] / 1.3, sizes_all[-1] * 1.3)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="major", color="0.88", lw=0.8)
        ax.set_axisbelow(True)
        ax.set_xlabel("message size (bytes, float32 sum, in place)")
        ax.set_ylabel("busbw (GB/s), from the %s time" % (
            "median iteration's" if stat == "median" else "mean"))
        ax.set_title("%d ranks" % n, fontsize=11)
    fig.legend(list(handles.values()), list(handles), loc="lower center", fontsize=8.5,
               ncol=min(len(handles), 2 if len(handles) > 3 else 3), frameon=False)
    how = "median of %d rounds (band: min-max)" % nrounds if nrounds > 1 else "one run"
    how += ", %s iterations a size" % ("%d" % iters[0] if len(iters) == 1 else
                                        "%d-%d" % (iters[0], iters[-1]))
    fig.suptitle("allreduce busbw, %s\n%s; %s" % (what, machine_words(meta, rounds, kind == "tcp"), how),
                 fontsize=10.5)
    missing = [p for p in ("gloo", "openmpi") if p in (meta.get("left_out") or {})]
    notes = ["%s left out: %s" % ("Gloo" if p == "gloo" else "Open MPI", meta["left_out"][p])
             for p in missing]
    if notes:
        fig.text(0.01, 0.005, "; ".join(notes), fontsize=7.5, color="0.3")
        notes_out.extend(notes)
    legend_h = (0.12 if len(handles) > 3 else 0.08) + (0.03 if notes else 0)
    fig.tight_layout(rect=(0, legend_h, 1, 1))
    path = os.path.join(img, fname)
    save(fig, path)
    return path, key


def torch_figure(res, img, notes_out):
    hvd = {m: load_json(os.path.join(res, "hvd_step_%s.json" % m)) for m in ("comm", "compute")}
    ddp = load_json(os.path.join(res, "ddp.json"))
    tmeta = load_json(os.path.join(res, "torch-meta.json")) or {}
    if not any(hvd.values()) and not ddp:
        if tmeta.get("left_out"):
            notes_out.append("PyTorch figures left out: " + tmeta["left_out"])
        return None
    # panels: comm-bound, compute-bound; groups per panel: hvd_bench, ddp_bench
    panels = []
    key = {}
    for m, title in (("comm", "communication-bound: MLP, batch 8"),
                     ("compute", "compute-bound: small CNN, batch 64")):
        groups = []
        h = hvd.get(m)
        if h:
            groups.append(("hvd_bench.py step --model %s\n%s %s params" % (
                m, h["model_desc"], params_words(h["params"])),
                [("kolo.torch DistributedOptimizer", "#1f4e9c", h["ms_per_step"]["kolo"]),
                 ("DDP on gloo", "#e07b00", h["ms_per_step"]["gloo"])]))
        if ddp:
            groups.append(("ddp_bench.py\n%s %s params" % (
                "MLP" if m == "comm" else "CNN", params_words(ddp["params"][m])),
                [("DDP on kolo (torch.distributed backend)", "#6f9be0",
                  [v * 1e3 for v in ddp["rounds"]["kolo"]["%s_s" % m]]),
                 ("DDP on gloo", "#e07b00", [v * 1e3 for v in ddp["rounds"]["gloo"]["%s_s" % m]])]))
        if groups:
            panels.append((m, title, groups))
    ranks = (hvd.get("comm") or hvd.get("compute") or ddp)["ranks"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.4), dpi=DPI,
                             squeeze=False)
    seen = {}
    nrounds = set()
    for ax, (m, title, groups) in zip(axes[0], panels):
        w = 0.36
        top = 0
        for gi, (gname, bars) in enumerate(groups):
            meds = []
            for bi, (label, colour, vals) in enumerate(bars):
                nrounds.add(len(vals))
                med = statistics.median(vals)
                meds.append(med)
                x = gi + (bi - 0.5) * w * 1.08
                err = [[med - min(vals)], [max(vals) - med]] if len(vals) > 1 else None
                b = ax.bar(x, med, w, color=colour, yerr=err, capsize=3,
                           error_kw={"elinewidth": 1, "ecolor": "0.25"},
                           label=label if label not in seen else None)
                seen[label] = b
                ax.text(x, med / 2, "%.0f ms" % med if med >= 100 else "%.1f ms" % med,
                        ha="center", va="center", fontsize=8, color="white", rotation=90)
                top = max(top, max(vals))
                key[(m, gname.split("\n")[0], label)] = med
            ratio = meds[1] / meds[0]
            ax.text(gi, max(max(v) for _, _, v in bars) * 1.04,
                    "DDP on gloo / kolo = %.2f" % ratio, ha="center", va="bottom", fontsize=8.5)
            key[(m, gname.split("\n")[0], "ratio")] = ratio
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([g for g, _ in groups], fontsize=8)
        ax.set_ylim(0, top * 1.18)
        ax.set_ylabel("ms per step (slowest rank)")
        ax.set_title(title, fontsize=10.5)
        ax.grid(True, axis="y", color="0.88", lw=0.8)
        ax.set_axisbelow(True)
    handles = [seen[k] for k in seen]
    fig.legend(handles, list(seen), loc="lower center", ncol=3, fontsize=8.5, frameon=False)
    load = tmeta.get("load")
    how = ("median of %d interleaved rounds (bars: min-max)" % max(nrounds)
           if max(nrounds) > 1 else "one round")
    fig.suptitle("PyTorch training step, %d ranks on 1 host (%s-core VM, shared), 1 torch "
                 "thread per rank\n%s%s%s" % (ranks, tmeta.get("cpus", "?"), how,
                                   ", load %.1f at the start" % load[0] if load else "",
                                   ", " + tmeta["date"][:10] if tmeta.get("date") else ""),
                 fontsize=10.5)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = os.path.join(img, "torch-step.png")
    save(fig, path)
    return path, key


def params_words(n):
    return "%.1fM" % (n / 1e6) if n >= 1e6 else "%.0fk" % (n / 1e3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a folder of scripts/plots.sh (bench/results/<date>)")
    ap.add_argument("--stat", choices=["median", "mean"], default="median",
                    help="busbw from each size's median iteration (default: steadier on a "
                         "shared machine) or from the mean time, as the tools print it")
    ap.add_argument("--img", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "..", "docs", "img"))
    args = ap.parse_args()
    os.makedirs(args.img, exist_ok=True)
    rows = load_jsonl(os.path.join(args.results, "allreduce.jsonl"))
    rounds = load_jsonl(os.path.join(args.results, "rounds.jsonl"))
    meta = load_json(os.path.join(args.results, "meta.json")) or {}
    bad = [r for r in rows if r.get("wrong") not in (0, None)]
    if bad:
        print("plot.py: %d rows report wrong elements; not drawing" % len(bad), file=sys.stderr)
        return 1
    notes = []
    drawn = []
    for kind in ("shm", "tcp"):
        out = busbw_figure(kind, rows, rounds, meta, args.img, notes, args.stat)
        if not out:
            notes.append("%s: no allreduce rows in %s" % (FIGS[kind][0], args.results))
            continue
        path, key = out
        drawn.append(path)
        print("%s:" % path)
        ranks = sorted({k[1] for k in key}, reverse=True)
        for n in ranks:
            for b in sorted({k[2] for k in key if k[1] == n and k[2] >= 1 << 20}):
                vals = ["%s %.3f" % (STYLE[i][0], key[(i, n, b)]) for i in FIGS[kind][1]
                        if (i, n, b) in key]
                print("  %d ranks, %s busbw GB/s (%s): %s" % (n, size_words(b), args.stat, "; ".join(vals)))
            if ("ceiling", n, 0) in key:
                print("  %d ranks, TCP ceiling (tcp_pump) %.3f GB/s" % (n, key[("ceiling", n, 0)]))
    out = torch_figure(args.results, args.img, notes)
    if out:
        path, key = out
        drawn.append(path)
        print("%s:" % path)
        for k, v in key.items():
            print("  %s, %s, %s: %.2f%s" % (k[0], k[1], k[2], v, "" if k[2] == "ratio" else " ms"))
    for n in notes:
        print("note: " + n)
    for p in drawn:
        print("wrote %s (%d KB)" % (p, os.path.getsize(p) // 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main())
