import sys, torch
sys.path.insert(0, "tests/gpu")
import test_kernels as tk
from specscope.backend.attention_layer import AttentionLayer
from specscope.backend.graph_runner import GraphRunner, capture_ladder
from specscope.tracer.schema import ForwardMode
D, HKV = tk.D, tk.HKV
for pdl in (None, False):
    for mode, t in [(ForwardMode.TARGET_VERIFY, 4), (ForwardMode.DECODE, 1)]:
        world = tk.World(64, [37, 300, 129, 64, 511], 16, seed=5)
        layer = AttentionLayer(0, HKV * 4, HKV, D, D ** -0.5)
        be = world.backend(tk.kernels(), k=t, step=1)
        be.init_cuda_graph_state(8, 8 * t)
        q_static = torch.randn(8 * t, layer.num_q_heads, D, dtype=torch.bfloat16, device="cuda")
        dummy = torch.zeros(8 * t, HKV, D, dtype=torch.bfloat16, device="cuda")
        def fwd(ids, pos, fb):
            n = ids.shape[0]
            return be.forward(q_static[:n], dummy[:n], dummy[:n], layer, fb, save_kv_cache=False).float()
        runner = GraphRunner(name="g", mode=mode, forward=fwd, backend=be, template=world.batch(mode, be, [1], [t]), max_bs=8, tokens_per_req=t, device=torch.device("cuda"))
        for bs in capture_ladder(8):
            runner.capture_one(bs)
        for raw in (1, 2, 3, 4, 5):
            s = world.seq_lens[:raw] if mode != ForwardMode.DECODE else [x + 1 for x in world.seq_lens[:raw]]
            live = world.batch(mode, be, s, [t] * raw)
            fb = runner.replay_prepare(live)
            runner.copy_draft_dependent_inputs(live, fb.batch_size)
            got = runner.replay(fb, raw * t)[0].clone()
            torch.cuda.synchronize()
            eb = world.backend(tk.kernels(), k=t, step=1)
            live.attn_backend = eb
            eb.init_forward_metadata(live)
            want = eb.forward(q_static[: raw * t], dummy[: raw * t], dummy[: raw * t], layer, live, save_kv_cache=False).float()
            torch.cuda.synchronize()
            rows = [round(tk._rel(got[i], want[i]), 4) for i in range(raw * t)]
            print(mode.value, "raw", raw, "padded", fb.batch_size, "finite", bool(torch.isfinite(got).all()), "row errs", rows[:12], flush=True)
        break
    break
