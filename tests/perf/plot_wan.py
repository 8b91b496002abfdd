#!/usr/bin/env python3
"""plot_wan.py: plots of tests/perf/bench_wan.sh runs, from their raw outputs.

    python3 tests/perf/plot_wan.py [options] OUTDIR... -o DIR

OUTDIR is what bench_wan.sh -o wrote: one folder per configuration
(topology x rate, e.g. 3x2-100mbit/) holding `config` (R, P, rate, bps,
delay, sizes, cc, mtu, as the script writes it), `runs.txt` (one line per
run: name, start and end as Unix times, exit status) and, per algorithm and
size group, rank 0's table KIND.small.out / KIND.big.out (geoccl-perf,
mpi-allreduce-perf and gloo-allreduce-perf all print nccl-tests' layout:
size in bytes first, out-of-place time in us sixth, #wrong ninth; the
GeoCCL and MPI tools add the in-place columns and GeoCCL its WAN bytes per
rank; Gloo has one column, in place). Every number plotted is read from
those files; bench_wan.sh --report prints the same figures as tables.

A configuration run over several paths (bench_wan.sh -p: loss, jitter)
gets one figure across them instead, DIR/wan-RxP-RATE-paths.png: per path,
time / bound of every tool at the largest size all the runs share, as bars
with their values (the dotted line: 1.15).

Otherwise, for every configuration it writes DIR/wan-RxP-RATE.png (delay, congestion
control and MTU join the name when not 25ms, the host's and 1500): on the
left the all-reduce time per call against the size (log-log), on the right
time / bound, where bound = 2(R-1)/R x bytes / (rate / 8), the time every
region's shaped egress needs for its share whatever the algorithm; the
dashed line is the bound at TCP goodput (0.965 x rate), the dotted one
1.10. Lines: GeoCCL hierarchical (hier), flat ring (flat), compressed
(hierint8, hierlossless, or any other KIND.small/big.out the run holds:
their ratio can fall below 1, as the bound counts uncompressed bytes),
Open MPI default and ring, Gloo ring_chunked and ring. A cell with a wrong
element is drawn as a red cross; a run that failed has no point.

Several OUTDIRs may name the same configuration (e.g. a full run, then a
repeat of one algorithm): for each (configuration, algorithm) the last
OUTDIR on the command line that has it wins. Each figure's title says the
runs' dates (UTC, from runs.txt) and folders.

Options:
  -o, --outdir DIR   where the PNGs go (created; default .)
  --in-place         plot the in-place column (Gloo has only one: its own);
                     the PNGs are named ...-inplace.png
  --markdown PREFIX  also print a markdown image line per figure, the PNG's
                     path written as PREFIX/NAME (e.g. docs/plots)
  --dpi N            resolution (default 110)

Needs matplotlib (Debian: apt-get install python3-matplotlib). A python3
without it re-runs the script under /usr/bin/python3 when that one has it.
Exit status: 0 plots written; 1 no configuration with data found; 2 bad
arguments or no matplotlib.
"""
import argparse
import datetime
import os
import re
import shlex
import sys

# Known algorithms, in the order they are drawn: label, colour, line style.
KINDS = {
    "hier": ("GeoCCL hierarchical", "tab:blue", "-", "o"),
    "hierclear": ("GeoCCL hierarchical, not encrypted", "tab:olive", "-.", "o"),
    "hiereq": ("GeoCCL hierarchical, equal shares", "tab:pink", "-.", "o"),
    "hiercubic": ("GeoCCL hierarchical, GEOCCL_WAN_CC=cubic", "darkblue", "-.", "o"),
    "hiernopace": ("GeoCCL hierarchical, GEOCCL_WAN_PACE=0", "slateblue", ":", "v"),
    "hierint8": ("GeoCCL hierarchical, int8", "tab:cyan", "-", "^"),
    "hierlossless": ("GeoCCL hierarchical, lossless", "tab:purple", "-", "v"),
    "hierauto": ("GeoCCL hierarchical, GEOCCL_COMPRESS=auto", "darkgoldenrod", "-", "D"),
    "flat": ("GeoCCL flat ring", "tab:green", "-", "s"),
    "ompi": ("Open MPI default", "tab:red", "--", "D"),
    "ompiring": ("Open MPI ring", "tab:orange", "--", "P"),
    "gloochunked": ("Gloo ring_chunked", "tab:brown", ":", "X"),
    "gloo": ("Gloo ring", "tab:gray", ":", "*"),
}
OUT_RE = re.compile(r"^([A-Za-z0-9_+-]+)\.(small|big)\.out$")
GOODPUT = 0.965   # TCP payload through tbf at MTU 1500 (1448 of 1500 bytes)
TARGET = 1.10


def need_matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        deb = "/usr/bin/python3"
        if (os.path.realpath(sys.executable) != os.path.realpath(deb)
                and os.access(deb, os.X_OK)
                and not os.environ.get("PLOT_WAN_REEXEC")):
            os.environ["PLOT_WAN_REEXEC"] = "1"
            os.execv(deb, [deb] + sys.argv)
        print("plot_wan.py: matplotlib not found for %s (Debian: apt-get install "
              "python3-matplotlib, then run it with /usr/bin/python3)" % sys.executable,
              file=sys.stderr)
        sys.exit(2)


def read_config(path):
    """The config line bench_wan.sh writes: shell assignments."""
    cfg = {}
    with open(path) as f:
        for word in shlex.split(f.read()):
            if "=" in word:
                k, v = word.split("=", 1)
                cfg[k] = v
    for k in ("R", "P", "bps"):
        if not cfg.get(k, "").isdigit():
            raise ValueError("%s: no %s" % (path, k))
        cfg[k] = int(cfg[k])
    cfg.setdefault("rate", "%dbit" % cfg["bps"])
    cfg.setdefault("delay", "")
    cfg.setdefault("cc", "")
    cfg["mtu"] = cfg.get("mtu") or "1500"
    cfg.setdefault("path", "")
    return cfg


def read_table(path, in_place):
    """{bytes: (seconds, wrong)} from one tool's table; wrong is None when
    the tool did not check (N/A)."""
    rows = {}
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("#"):
                continue
            a = line.split()
            if len(a) < 9 or not a[0].isdigit():
                continue
            ti, wi = (9, 12) if in_place and len(a) >= 13 else (5, 8)
            try:
                sec = float(a[ti]) / 1e6
            except ValueError:
                continue
            try:
                wrong = float(a[wi])
            except ValueError:
                wrong = None
            rows[int(a[0])] = (sec, wrong)
    return rows


def read_runs(path):
    """Start and end (Unix time) of the runs in runs.txt."""
    times = []
    try:
        with open(path) as f:
            for line in f:
                a = line.split()
                if len(a) >= 3:
                    try:
                        times += [float(a[1]), float(a[2])]
                    except ValueError:
                        pass
    except OSError:
        pass
    return times


def config_key(cfg):
    return (cfg["R"], cfg["P"], cfg["bps"], cfg["delay"], cfg["cc"], cfg["mtu"], cfg["path"])


def path_label(path):
    """A short name for geoccl-wan's path options ('' is the clean path)."""
    if not path:
        return "clean"
    words, out, i = path.split(), [], 0
    while i < len(words):
        w = words[i]
        v = words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else None
        if w == "--loss" and v:
            out.append("%s%% loss" % v)
        elif w == "--jitter" and v:
            out.append("%s ms jitter" % v)
        elif w == "--reorder":
            out.append("reordering")
        elif w == "--seed":
            pass
        else:
            out.append(w.lstrip("-") + (" " + v if v else ""))
        i += 2 if v else 1
    return ", ".join(out) or "clean"


def config_name(cfg):
    name = "wan-%dx%d-%s" % (cfg["R"], cfg["P"], cfg["rate"])
    if cfg["delay"] and cfg["delay"] != "25ms":
        name += "-" + cfg["delay"]
    if cfg["cc"]:
        name += "-" + cfg["cc"]
    if cfg["mtu"] != "1500":
        name += "-mtu" + cfg["mtu"]
    if cfg["path"]:
        name += "-" + "_".join(w.lstrip("-") for w in cfg["path"].split())
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def collect(outdirs, in_place):
    """{key: {"cfg", "kinds": {kind: {bytes: (s, wrong)}}, "runs": {dir: [t]}}}"""
    configs = {}
    for top in outdirs:
        if not os.path.isdir(top):
            print("plot_wan.py: %s: no such directory" % top, file=sys.stderr)
            sys.exit(2)
        for sub in sorted(os.listdir(top)):
            cdir = os.path.join(top, sub)
            if not os.path.isfile(os.path.join(cdir, "config")):
                continue
            try:
                cfg = read_config(os.path.join(cdir, "config"))
            except (OSError, ValueError) as e:
                print("plot_wan.py: skipped: %s" % e, file=sys.stderr)
                continue
            kinds = {}
            for fn in sorted(os.listdir(cdir)):
                m = OUT_RE.match(fn)
                if not m:
                    continue
                rows = read_table(os.path.join(cdir, fn), in_place)
                if rows:
                    kinds.setdefault(m.group(1), {}).update(rows)
            if not kinds:
                continue
            ent = configs.setdefault(config_key(cfg), {"cfg": cfg, "kinds": {}, "runs": {}})
            ent["kinds"].update(kinds)   # a later OUTDIR wins per algorithm
            ent["runs"][os.path.abspath(cdir)] = read_runs(os.path.join(cdir, "runs.txt"))
    return configs


def utc(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc)


def run_dates(runs):
    parts = []
    for d, t in runs.items():
        if t:
            a, b = utc(min(t)), utc(max(t))
            span = "%s %s-%s UTC" % (a.strftime("%Y-%m-%d"), a.strftime("%H:%M"),
                                     b.strftime("%H:%M") if b.date() == a.date()
                                     else b.strftime("%Y-%m-%d %H:%M"))
        else:
            span = "date unknown"
        parts.append("%s (%s)" % (span, os.path.basename(os.path.dirname(d)) or d))
    return "; ".join(parts)


def size_label(b):
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return "%d %s" % (b // n, unit)
    return "%d B" % b


def rate_text(bps):
    for unit, n in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= n:
            return "%g %s" % (bps / n, unit)
    return "%d bit/s" % bps


def plot(plt, ent, path, in_place, dpi):
    from matplotlib import ticker
    cfg = ent["cfg"]
    R, P, bps = cfg["R"], cfg["P"], cfg["bps"]
    order = [k for k in KINDS if k in ent["kinds"]]
    order += sorted(k for k in ent["kinds"] if k not in KINDS)
    fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(13, 6))
    sizes = sorted({b for k in order for b in ent["kinds"][k]})
    bound = {b: 2.0 * (R - 1) / R * b / (bps / 8.0) for b in sizes}
    if R > 1 and sizes:
        ax_t.plot(sizes, [bound[b] for b in sizes], color="black", lw=1,
                  label="bound 2(R-1)/R x size / rate")
    spare = iter(["tab:olive", "tab:pink", "darkblue", "darkgreen", "darkred", "gold"] * 9)
    wrong_label = "wrong result(s)"
    for k in order:
        label, colour, style, marker = KINDS.get(k, ("GeoCCL " + k, None, "-", "."))
        colour = colour or next(spare)
        rows = ent["kinds"][k]
        xs = sorted(rows)
        ys = [rows[b][0] for b in xs]
        ax_t.plot(xs, ys, style, marker=marker, color=colour, label=label)
        if R > 1:
            ax_r.plot(xs, [rows[b][0] / bound[b] for b in xs], style, marker=marker,
                      color=colour, label=label)
        bad = [b for b in xs if rows[b][1]]
        if bad:
            ax_t.plot(bad, [rows[b][0] for b in bad], "x", color="red", ms=12, mew=2,
                      label=wrong_label)
            wrong_label = None
            if R > 1:
                ax_r.plot(bad, [rows[b][0] / bound[b] for b in bad], "x", color="red",
                          ms=12, mew=2)
    for ax in (ax_t, ax_r):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_label(b) for b in sizes], rotation=0)
        ax.minorticks_off()
        ax.set_xlabel("all-reduce size (float sum)")
        ax.grid(True, which="major", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1, 2, 5)))
    ax_t.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: "%g" % v))
    ax_t.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax_t.set_ylabel("time per call, %s, max over ranks (s)"
                    % ("in place" if in_place else "out of place"))
    if R > 1:
        ax_r.axhline(1.0, color="black", lw=1)
        ax_r.axhline(1.0 / GOODPUT, color="black", lw=1, ls="--",
                     label="bound at TCP goodput (0.965 x rate)")
        ax_r.axhline(TARGET, color="black", lw=1, ls=":", label="1.10 x bound")
        ax_r.set_yscale("log")
        ax_r.yaxis.set_major_locator(ticker.FixedLocator(
            [0.05, 0.1, 0.2, 0.5, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100]))
        ax_r.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: "%g" % v))
        ax_r.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax_r.set_ylabel("time / bound")
    extra = ", ".join(x for x in (
        "TCP %s" % cfg["cc"] if cfg["cc"] else "",
        "MTU %s" % cfg["mtu"] if cfg["mtu"] != "1500" else "") if x)
    fig.suptitle("%d regions x %d ranks, %s egress per region, %s one way%s\nrun %s"
                 % (R, P, rate_text(bps), cfg["delay"] or "?", ", " + extra if extra else "",
                    run_dates(ent["runs"])), fontsize=10)
    # One legend under both plots, so that it hides no point.
    handles, labels = ax_t.get_legend_handles_labels()
    for h, l in zip(*ax_r.get_legend_handles_labels()):
        if l not in labels:
            handles.append(h)
            labels.append(l)
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    rows = (len(labels) + 3) // 4
    fig.tight_layout(rect=(0, 0.035 * rows + 0.01, 1, 1))
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)


def path_order(key):
    """Clean first, then by loss rate, then the rest by name."""
    m = re.search(r"--loss\s+([0-9.]+)", key[-1])
    return (key[-1] != "", m is None, float(m.group(1)) if m else 0.0, key[-1])


def merged_runs(ents):
    """The runs of several configurations as one span per output folder."""
    runs = {}
    for e in ents:
        for d, t in e["runs"].items():
            runs.setdefault(os.path.dirname(d), []).extend(t)
    return {os.path.join(d, ""): t for d, t in runs.items()}


def plot_paths(plt, ents, path, in_place, dpi):
    """One configuration run over several paths (bench_wan.sh -p): per
    path, time / bound of every tool at the largest size all runs share."""
    cfg = ents[0]["cfg"]
    R, P, bps = cfg["R"], cfg["P"], cfg["bps"]
    kinds = set(k for e in ents for k in e["kinds"])
    order = [k for k in KINDS if k in kinds] + sorted(k for k in kinds if k not in KINDS)
    common = None
    for e in ents:
        for k in e["kinds"]:
            sz = set(e["kinds"][k])
            common = sz if common is None else common & sz
    if not common:
        return False
    size = max(common)
    bound = 2.0 * (R - 1) / R * size / (bps / 8.0)
    fig, ax = plt.subplots(figsize=(13, 6))
    width = 0.8 / max(1, len(order))
    spare = iter(["tab:olive", "tab:pink", "darkblue", "darkgreen", "darkred", "gold"] * 9)
    for j, k in enumerate(order):
        label, colour, _, _ = KINDS.get(k, ("GeoCCL " + k, None, "-", "."))
        colour = colour or next(spare)
        xs, ys, bad = [], [], []
        for i, e in enumerate(ents):
            row = e["kinds"].get(k, {}).get(size)
            if row is None:
                continue
            xs.append(i + (j - (len(order) - 1) / 2.0) * width)
            ys.append(row[0] / bound)
            if row[1]:
                bad.append((xs[-1], ys[-1]))
        bars = ax.bar(xs, ys, width, color=colour, label=label)
        for b, y in zip(bars, ys):
            ax.annotate("%.2f" % y, (b.get_x() + b.get_width() / 2, y), ha="center",
                        va="bottom", fontsize=7, xytext=(0, 1), textcoords="offset points")
        for x, y in bad:
            ax.plot([x], [y], "x", color="red", ms=12, mew=2)
    ax.axhline(1.0, color="black", lw=1, label="bound 2(R-1)/R x size / rate")
    ax.axhline(1.0 / GOODPUT, color="black", lw=1, ls="--",
               label="bound at TCP goodput (0.965 x rate)")
    ax.axhline(1.15, color="black", lw=1, ls=":", label="1.15 x bound")
    ax.set_xticks(range(len(ents)))
    ax.set_xticklabels([path_label(e["cfg"]["path"]) for e in ents])
    ax.set_xlabel("path between regions (geoccl-wan up options)")
    ax.set_ylabel("time / bound, %s %s, max over ranks"
                  % (size_label(size), "in place" if in_place else "out of place"))
    ax.grid(True, axis="y", alpha=0.3)
    runs = merged_runs(ents)
    fig.suptitle("%d regions x %d ranks, %s egress per region, %s one way: lossy and "
                 "jittery paths\nrun %s" % (R, P, rate_text(bps), cfg["delay"] or "?",
                                             run_dates(runs)), fontsize=10)
    fig.legend(loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(
        prog="plot_wan.py", description=__doc__.split("\n")[0],
        epilog="See the top of tests/perf/plot_wan.py for the plots and the input format.")
    ap.add_argument("outdirs", nargs="+", metavar="OUTDIR")
    ap.add_argument("-o", "--outdir", default=".")
    ap.add_argument("--in-place", action="store_true")
    ap.add_argument("--markdown", metavar="PREFIX")
    ap.add_argument("--dpi", type=int, default=110)
    args = ap.parse_args()
    plt = need_matplotlib()
    configs = collect(args.outdirs, args.in_place)
    if not configs:
        print("plot_wan.py: no configuration with results in %s"
              % " ".join(args.outdirs), file=sys.stderr)
        return 1
    os.makedirs(args.outdir, exist_ok=True)
    # Configurations run over several paths: one figure across the paths.
    groups = {}
    for key in configs:
        groups.setdefault(key[:-1], []).append(key)
    done = set()
    for base in sorted(groups):
        keys = groups[base]
        if len(keys) < 2:
            continue
        keys.sort(key=path_order)
        ents = [configs[k] for k in keys]
        c = ents[0]["cfg"]
        name = (config_name(dict(c, path="")) + "-paths" +
                ("-inplace" if args.in_place else "") + ".png")
        path = os.path.join(args.outdir, name)
        if not plot_paths(plt, ents, path, args.in_place, args.dpi):
            continue
        done.update(keys)
        runs = merged_runs(ents)
        print("plot_wan.py: wrote %s (%d paths)" % (path, len(keys)), file=sys.stderr)
        if args.markdown is not None:
            print("![%dx%d at %s over %d paths: time / bound, run %s](%s/%s)"
                  % (c["R"], c["P"], c["rate"], len(keys), run_dates(runs),
                     args.markdown.rstrip("/"), name))
    for key in sorted(configs):
        if key in done:
            continue
        ent = configs[key]
        name = config_name(ent["cfg"]) + ("-inplace" if args.in_place else "") + ".png"
        path = os.path.join(args.outdir, name)
        plot(plt, ent, path, args.in_place, args.dpi)
        print("plot_wan.py: wrote %s (%s)" % (path, ", ".join(sorted(ent["kinds"]))),
              file=sys.stderr)
        if args.markdown is not None:
            c = ent["cfg"]
            print("![%dx%d at %s: time and time / bound against size, run %s](%s/%s)"
                  % (c["R"], c["P"], c["rate"], run_dates(ent["runs"]),
                     args.markdown.rstrip("/"), name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
