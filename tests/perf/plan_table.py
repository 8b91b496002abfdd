#!/usr/bin/env python3
"""plan_table.py OUTDIR CFG: the table of tests/perf/bench_plan.sh for one
configuration: predicted (geoccl-probe --simulate on the measured topology
file) against measured (geoccl-perf) all-reduce time, flat and hierarchical,
and the automatic plan against the better forced one."""
import json, sys
out, cfg = sys.argv[1], sys.argv[2]
def perf(kind):
    t = {}
    for line in open("%s/%s.%s" % (out, cfg, kind)):
        f = line.split()
        if len(f) >= 13 and f[0].isdigit():
            t[int(f[0])] = float(f[5]) / 1e6      # out-of-place time, s
    return t
flat, hier, auto = perf("flat"), perf("hier"), perf("auto")
probe = json.load(open("%s/%s.probe" % (out, cfg)))
sim = json.load(open("%s/%s.sim" % (out, cfg)))
pred = {}
for row in sim["allreduce"]:
    pred[int(row["bytes"])] = row
print("\n## %s: regions %s, egress Mbit/s %s, probe %.2f s" % (
    cfg, [r["ranks"] for r in probe["regions"]], probe["egress_mbit"], probe["probe_s"]))
print("| size | flat pred | flat meas | pred/meas | hier pred | hier meas | pred/meas | auto meas | best forced | auto/best |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for b in sorted(flat):
    p = pred.get(b, {})
    pf, ph = p.get("flat"), p.get("hier")
    f, h, a = flat.get(b), hier.get(b), auto.get(b)
    best = min(x for x in (f, h) if x)
    fmt = lambda x: "%.4f" % x if x else "-"
    rat = lambda x, y: "%.2f" % (x / y) if x and y else "-"
    print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        "%dK" % (b >> 10) if b < 1 << 20 else "%dM" % (b >> 20),
        fmt(pf), fmt(f), rat(pf, f), fmt(ph), fmt(h), rat(ph, h), fmt(a), fmt(best), rat(a, best)))
