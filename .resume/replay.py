"""Replay every stored probe's decisions under the committed rule (raw gap, a4540f6) and the
refined one (the gap's excess over the TPOT median): where they agree at every prefix of every
probe's history, the search would have taken the same path."""
import glob, json, sys
from inferlab.sim import steady_state as ss
from inferlab.sim.records import capacity_from_dict


class RawGap(ss.Criterion):
    def queue_growing(self, a, b):
        grew = lambda x, y: (y.p50 > (1 + self.wait_p50_rtol) * x.p50
                             or y.p99 > (1 + self.wait_p99_rtol) * x.p99)
        return grew(a.ttft, b.ttft) or grew(a.gap, b.gap)


def differ(name, probes, crit, target):
    old = RawGap(**{k: getattr(crit, k) for k in crit.__dataclass_fields__})
    out = []
    for p in probes:
        h = list(p.history)
        for i in range(2, len(h) + 1):
            so, sn = ss._settled(h[:i], old), ss._settled(h[:i], crit)
            vo = ss.verdict(ss.SteadyState(p.rate, so, tuple(h[:i])), target, old)
            vn = ss.verdict(ss.SteadyState(p.rate, sn, tuple(h[:i])), target, crit)
            if (so, vo) != (sn, vn):
                out.append(f"{name} rate {p.rate:.2f} at {h[i-1].n_requests}: {so}/{vo} -> {sn}/{vn}")
                break
    return out


found = []
from inferlab.sim import cluster_study as cs, sweeps
r = cs.load()
for g in r["goodput"]:
    c = g["capacity"]
    found += differ(f"ch07 {g['kind']} {g['design']}", c.probes, c.criterion, c.target)
sw = sweeps.load()
for pol, states in sw.states.items():
    found += differ(f"ch04 {pol} sweep", states, sw.setup.criterion, sw.setup.target)
for pol, c in sw.capacities.items():
    found += differ(f"ch04 {pol} capacity", c.probes, c.criterion, c.target)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    c = json.load(open(f)); cap = capacity_from_dict(c["capacity"])
    d = differ(f"ch08 {f.split('/')[-1]} {c['case']['model']} {c['case']['device']} "
               f"{c['case']['precision']} {c['case']['tpot_s']}", cap.probes, cap.criterion,
               cap.target)
    found += d
print("\n".join(found) or "no decision differs")
