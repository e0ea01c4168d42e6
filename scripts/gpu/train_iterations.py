"""Check 5: a PyTorch training loop reports its iterations to the node.

The interposer exports `arbiter_iteration()`; the hook of `arbiter_hooks.py` calls it once per
optimizer step through ctypes (public APIs only: `torch.optim.Optimizer.register_step_post_hook`).
Without the interposer the symbol is absent and training runs unreported.
Usage: train_iterations.py STEPS   — prints reported=N and its own mean step time.
"""
import sys, time, torch
from arbiter_hooks import install

steps = int(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
hooks = install(opt)
x = torch.randn(512, 2048, device="cuda")
t0 = time.time()
for _ in range(steps):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
elapsed = time.time() - t0
print(f"hook={hooks.active} reported={hooks.reported} mean_step_ms={1000 * elapsed / steps:.2f}")
