import cProfile, os, pstats, sys, time
sys.path.insert(0, os.path.dirname(__file__))
import trace_store as ts
from specscope.tracer.store import TraceWriter
gen = ts.Workload(0).steps()
for _ in range(20000): next(gen)  # steady state: fragmented pages
steps = [next(gen) for _ in range(4000)]
p = "/tmp/prof.db"
w = TraceWriter(p, ts.run_info(None), overwrite=True)
c0 = time.process_time()
for s in steps:
    w._commit_step(*w._encode_step(s))
print("single-thread cpu us/step", (time.process_time() - c0) / len(steps) * 1e6)
pr = cProfile.Profile(); pr.enable()
for i, s in enumerate(steps):
    w._commit_step(*w._encode_step(ts.Step(**{**s.__dict__, "index": s.index + 10**6})))
pr.disable()
w.close()
pstats.Stats(pr).sort_stats("tottime").print_stats(30)
