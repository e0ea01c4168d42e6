"""Check 7: host spill on a real GPU (AntMan's universal memory, done by the interposer).

Run under a block with a quota and a spill allowance. The job trains the check-5 model, fills
its quota with 256 MiB chunks until one is served from host memory (the block's `spilled`
counter moves), then:
1. allocates and writes a 1 GiB tensor beyond the quota: it must succeed and the GPU's used
   memory (nvidia-smi, outside the interposer) must not grow by it — spilled pages stay on the
   host;
2. measures in-place add bandwidth on a 1 GiB device tensor and on the spilled one;
3. trains a fresh copy of the model, whose parameters, gradients and new activations now come
   from host memory, and compares its step time with the first model's.
Usage: spill.py BLOCK — prints the figures; exits 1 if a requirement failed.
"""
import os, subprocess, sys, time, torch
sys.path.insert(0, os.path.dirname(__file__))
from block import get

blk = sys.argv[1]
MIB = 1 << 20


def gpu_used_mib():
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ARBITER_CONTROL_BLOCK")}
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True, env=env).stdout
    return int(out.split()[0])


def step_ms(model, opt, x, steps=30):
    for _ in range(3):
        loss = model(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = model(x).square().mean(); opt.zero_grad(); loss.backward(); opt.step()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / steps


def gbps(t, reps=10):
    t.add_(1); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        t.add_(1)
    torch.cuda.synchronize()
    return 2 * t.numel() * t.element_size() * reps / (time.perf_counter() - t0) / 1e9


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048)).cuda()


ok = True
model = mlp(); opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 2048, device="cuda")
device_ms = step_ms(model, opt, x)
dev = torch.ones(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.empty_cache()
ballast = []
while get(blk, "spilled") == 0 and len(ballast) < 4096:
    ballast.append(torch.empty(256 * MIB, dtype=torch.uint8, device="cuda"))
print(f"quota filled: {len(ballast)} chunks, GPU charge {get(blk, 'used') // MIB} MiB, spilled {get(blk, 'spilled') // MIB} MiB")
before, spilled_before = gpu_used_mib(), get(blk, "spilled")
sp = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
sp.fill_(1); torch.cuda.synchronize()
grew, spilled = gpu_used_mib() - before, get(blk, "spilled") - spilled_before
print(f"1 GiB beyond the quota: spilled +{spilled // MIB} MiB, GPU memory.used +{grew} MiB")
if spilled < 1 << 30 or grew > 256:
    print("FAIL: the 1 GiB tensor was not kept on the host"); ok = False
d_bw, s_bw = gbps(dev), gbps(sp)
print(f"in-place add bandwidth: device {d_bw:.0f} GB/s, spilled {s_bw:.1f} GB/s ({d_bw / s_bw:.0f}x)")
model2 = mlp(); opt2 = torch.optim.SGD(model2.parameters(), lr=1e-3)
spilled_ms = step_ms(model2, opt2, x)
print(f"step time: on the GPU {device_ms:.2f} ms, spilled copy {spilled_ms:.2f} ms "
      f"({spilled_ms / device_ms:.1f}x), spilled now {get(blk, 'spilled') // MIB} MiB")
sys.exit(0 if ok else 1)
