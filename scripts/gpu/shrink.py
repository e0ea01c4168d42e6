"""Check 6: the node asks a PyTorch job for memory back and gets it at an iteration boundary.

The job trains the check-5 model with `arbiter_hooks` installed, runs a few steps so that
what every step needs is allocated (cuBLAS creates a handle and workspace on the autograd
thread at the first backward), caches 3 GiB (a tensor allocated and dropped: PyTorch's caching
allocator keeps the segment), prints `ready` and trains on; the driving script then lowers the quota below what the job holds, as a node's
`set-memory-limit` does. At the next optimizer step the hook sees arbiter_release_requested()
> 0 and empties the cache; it passes once the request is met (the charge is within the new
quota) and 50 more steps ran. It gives up after 200 unanswered requests.
Usage: shrink.py SECONDS — prints releases, each empty_cache's duration, steps after it, what
the caching allocator reserves at the end and the block's charge then.
"""
import os, sys, time, torch
from arbiter_hooks import install
from block import get

seconds = float(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
hooks = install(opt)
x = torch.randn(512, 2048, device="cuda")
for _ in range(3):  # a running job, not one still setting up (see the docstring)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
cache = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
del cache
print(f"ready reserved={torch.cuda.memory_reserved()}", flush=True)
deadline, after = time.time() + seconds, 0
while time.time() < deadline and after < 50 and (hooks.releases < 200 or after):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    if hooks.releases and hooks.requested() == 0:
        after += 1
ms = ",".join(f"{m:.1f}" for m in hooks.release_ms[:5])
charged = get(os.environ["ARBITER_CONTROL_BLOCK"], "used")  # before exit returns it all
print(f"releases={hooks.releases} empty_cache_ms={ms} steps_after={after} "
      f"reserved_after={torch.cuda.memory_reserved()} charged_after={charged}")
sys.exit(0 if after >= 50 else 1)
