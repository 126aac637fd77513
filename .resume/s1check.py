import sys, time
from inferlab.sim import cluster_study as cs
from inferlab.sim.disaggregation import clustered
from inferlab.sim.steady_state import steady_state, longer, verdict
kind, design, rate = sys.argv[1], sys.argv[2], float(sys.argv[3])
kw = cs.steady_kw(kind)
cl = cs.setup()[design]
serve = clustered(cl)
t=time.time()
st = steady_state(cs.workload(kind), rate, serve, cs.SLOS[kind], **kw)
while st.window.n_requests < int(sys.argv[4]):
    st = longer(st, cs.workload(kind), serve, cs.SLOS[kind], criterion=kw["criterion"])
for w in st.history:
    print(w.n_requests, f"att {w.slo_attainment:.3f} ttft {w.ttft.p50*1e3:.1f}/{w.ttft.p99*1e3:.1f} gap {w.gap.p50*1e3:.1f}/{w.gap.p99*1e3:.1f} kept {w.achieved_out_tok_s/w.offered_out_tok_s:.3f}")
print(st.status, verdict(st, 0.9, kw["criterion"]), time.time()-t)
