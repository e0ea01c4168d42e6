"""A training loop that runs until killed; prints "ready" after 20 steps (SIGTERM check)."""
import torch
m = torch.nn.Linear(4096, 4096).cuda(); opt = torch.optim.SGD(m.parameters(), lr=1e-3)
x = torch.randn(256, 4096, device="cuda")
i = 0
while True:
    loss = m(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step(); i += 1
    if i == 20:
        torch.cuda.synchronize(); print("ready", flush=True)
