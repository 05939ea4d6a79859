# Dumps the Triton code torch.compile generates for two suite shapes, and the config its
# launcher picked.
import os, sys, torch, torch.nn.functional as F
torch._logging.set_logs(output_code=True)
import torch._inductor.config as cfg
cases = {
    "softmax_32768x1024": (lambda x: torch.softmax(x, -1), [torch.randn(32768, 1024, device="cuda")]),
    "rmsnorm_1x4096": (lambda x, w: F.rms_norm(x, (4096,), w, 1e-5),
                       [torch.randn(1, 4096, device="cuda", dtype=torch.half), torch.randn(4096, device="cuda", dtype=torch.half)]),
}
for name, (fn, args) in cases.items():
    print("=" * 20, name, flush=True)
    torch._dynamo.reset()
    c = torch.compile(fn, dynamic=False)
    for _ in range(3):
        c(*args)
    torch.cuda.synchronize()
    # The compiled kernels and the configs their launchers hold.
    from torch._inductor.runtime import triton_heuristics as th
    import gc
    for o in gc.get_objects():
        try:
            if isinstance(o, th.CachingAutotuner):
                print("kernel", o.fn.__name__, "configs", [str(l.config) for l in o.launchers], flush=True)
        except Exception as e:
            pass
