"""Which stored searches the split-only gap rule changes: every decision a search took (each
probe's status at each trace length, and its verdict there), re-read under the old and the new
rule from the stored windows. A search whose decisions all agree is the same computation under
either rule (the search depends on nothing else), so its stored row stands; the others must be
recomputed. Usage: python .resume/replay_rule.py CACHE_DIR [--split-designs] [--delete]"""
import json, sys
from pathlib import Path

from inferlab.sim import steady_state as ss
from inferlab.sim.records import state_from_dict


class Old(ss.Criterion):
    def queue_growing(self, a, b):   # the rule before: the gap read in every engine
        first = (b.ttft.p50 > (1 + self.wait_p50_rtol) * a.ttft.p50
                 or b.ttft.p99 > (1 + self.wait_p99_rtol) * a.ttft.p99)
        excess = lambda w: max(0.0, w.gap.p50 - w.tpot.p50)
        return first or excess(b) - excess(a) > self.gap_excess_rtol * a.gap.p50


def capacities(x):
    if isinstance(x, dict):
        if "probes" in x and "criterion" in x:
            yield x
        for v in x.values():
            yield from capacities(v)
    elif isinstance(x, list):
        for v in x:
            yield from capacities(v)


def differs(cap, split):
    crit = cap["criterion"]
    new, old = ss.Criterion(**crit), Old(**crit)
    for p in cap["probes"]:
        st = state_from_dict(p)
        h = [ss.Window(**{**w.__dict__, "split": split}) for w in st.history]
        for j in range(2, len(h) + 1):
            s_new, s_old = ss._settled(h[:j], new), ss._settled(h[:j], old)
            if s_new != s_old:
                return f"rate {st.rate:.3f} at {h[j-1].n_requests}: {s_old} -> {s_new}"
            part = ss.SteadyState(st.rate, s_new, tuple(h[:j]))
            v_new, v_old = ss.verdict(part, cap["target"], new), ss.verdict(part, cap["target"], old)
            if v_new != v_old:
                return f"rate {st.rate:.3f} at {h[j-1].n_requests}: verdict {v_old} -> {v_new}"
    return None


CRITERION = {}
if __name__ == "__main__" and "--mark-split" not in sys.argv:
    if "--criterion" in sys.argv:   # the study's search criterion, for a bare steady state
        CRITERION = json.loads(sys.argv[sys.argv.index("--criterion") + 1])
    folder, delete = Path(sys.argv[1]), "--delete" in sys.argv
    for f in sorted(folder.glob("*.json")):
        row = json.loads(f.read_text())
        design = row.get("design") or ""
        split = "P" in design and "D" in design
        what = row.get("case") or {k: row.get(k) for k in ("kind", "design", "link", "name")}
        found = [d for d in (differs(c, split) for c in capacities(row)) if d]
        if "state" in row and "capacity" not in row:   # a steady state alone (a low rate)
            split = row["name"] != "1 colocated"
            bare = {"probes": [row["state"]], "criterion": CRITERION, "target": 0.9}
            found += [d for d in [differs(bare, split)] if d]
        print(("CHANGED " if found else "same    ") + f.name, json.dumps(what)[:150],
              found[:1])
        if found and delete:
            f.unlink()


def mark_split(folder):
    """Windows stored before ``Window.split`` existed, marked with what their run was: a split
    for every row of a disaggregated design (the low-rate 1P1D, the failure study's split), not
    for colocated and chunked rows. Usage: python .resume/replay_rule.py DIR --mark-split"""
    def walk(x, split):
        if isinstance(x, dict):
            if "n_requests" in x and "gap" in x:
                x["split"] = split
                return
            for v in x.values():
                walk(v, split)
        elif isinstance(x, list):
            for v in x:
                walk(v, split)
    for f in sorted(Path(folder).glob("*.json")):
        row = json.loads(f.read_text())
        design = row.get("design") or row.get("name") or row.get("split") or ""
        if isinstance(row.get("case"), dict):
            design = ""   # Chapter 8: one engine
        split = design != "1 colocated" and "P" in design and "D" in design
        walk(row, split)
        f.write_text(json.dumps(row))
        print(f.name, design, split)


if __name__ == "__main__" and "--mark-split" in sys.argv:
    mark_split(sys.argv[1])
