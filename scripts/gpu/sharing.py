"""One side of a GPU sharing measurement (scripts/gpu/sharing.sh): how an online service's
request latency and an offline training job's throughput change when the two share a GPU by
time slicing (two CUDA contexts, no MPS) or by MPS with an SM limit on the offline job.

  sharing.py service START END THINK_MS   requests of 32 x N^2 fp32 matmuls (N: $SERVICE_N,
                                          default 1024), each followed by THINK_MS of idle
                                          (the service's duty cycle); prints lat_ms (mean),
                                          p99_ms, duty
  sharing.py offline START END            4096^2 fp32 matmuls back to back; prints its_per_s

START and END are CLOCK_REALTIME seconds: both sides measure only inside that window, so a
pair's numbers cover the same interval. Each side warms up before START.
"""
import os, sys, time, torch

role, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
if role == "service":
    think = float(sys.argv[4]) / 1000.0
    n = int(os.environ.get("SERVICE_N", "1024"))
    a = torch.randn(n, n, device="cuda"); b = torch.randn(n, n, device="cuda")
    def request():
        for _ in range(32):
            a @ b
        torch.cuda.synchronize()
    for _ in range(20):
        request()
    while time.time() < start:
        time.sleep(0.001)
    lat, busy = [], 0.0
    t_begin = time.time()
    while time.time() < end:
        t0 = time.perf_counter(); request(); t1 = time.perf_counter()
        lat.append(t1 - t0); busy += t1 - t0
        time.sleep(think)
    wall = time.time() - t_begin
    lat.sort()
    print(f"lat_ms={1000 * sum(lat) / len(lat):.3f} p99_ms={1000 * lat[int(0.99 * (len(lat) - 1))]:.3f} "
          f"duty={busy / wall:.3f} requests={len(lat)}")
elif role == "offline":
    a = torch.randn(4096, 4096, device="cuda"); b = torch.randn(4096, 4096, device="cuda")
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    while time.time() < start:
        a @ b; torch.cuda.synchronize()
    n = 0
    t0 = time.time()
    while time.time() < end:
        for _ in range(5):
            a @ b
        torch.cuda.synchronize(); n += 5
    print(f"its_per_s={n / (time.time() - t0):.2f}")
else:
    sys.exit(f"unknown role {role}")
