"""Two training-like jobs packed on one GPU by time slicing (two CUDA contexts, no MPS, no
pacing): how fast each runs beside the other, against alone — issue 17's question of what
Gandiva-style packing costs when the two jobs' GPU demands do *not* add up to more than the
GPU (the simulator's `truth::colocate` says: nothing).

Each job is a loop of iterations: a GPU burst (k fp32 N x N matmuls, then a synchronize)
followed by a CPU gap (a sleep: data loading, the host side of a step). Its duty cycle alone,
burst / iteration, is the model's `demand`. The two jobs iterate with different periods
(100 and 130 ms) so that their phases do not lock. A real model joins the grid: torchvision's
ResNet-50 (batch 64, synthetic data, SGD) with a gap that sets its duty.

  colocation.py [OUT.json]
  colocation.py --fit OUT.json   each paired job's speed (solo iteration time / paired) against
                                 the law 1 / speed = 1 + k * d_i * d_j (d: duty cycles alone),
                                 with k fitted by least squares over every paired job
Env: COLOC_COMBOS (instead of the grid: jobs run together, e.g. "0.3,0.3,0.3 0.1s,0.9" — a
     duty per job, up to four jobs; a duty ending in "s" synchronises after every kernel, as
     a job that reads results back within its step does; first size of COLOC_SIZES),
     COLOC_SECONDS (measured window of a pair, default 4; a solo run gets half),
     COLOC_SIZES (default "1024 4096"), COLOC_DUTIES (default "0.1 0.3 0.5 0.7 0.9"),
     COLOC_RESNET=0 (skip ResNet-50), COLOC_DRY=1 (no GPU: sleeps stand in for kernels, to
     check the orchestration).
Prints one RESULT line per run; OUT.json (rewritten after every run) holds them all.
"""
import json, multiprocessing as mp, os, signal, statistics, subprocess, sys, time

PERIODS_MS = (100.0, 130.0, 170.0, 210.0)
LEAD_S = 1.0  # both workers warm up (and meet) before the window opens


class Torch:
    def __init__(self):
        import torch
        self.t = torch
        self.mats = {}
        self.model = None

    def _ab(self, n):
        if n not in self.mats:
            self.mats[n] = (self.t.randn(n, n, device="cuda"), self.t.randn(n, n, device="cuda"))
        return self.mats[n]

    def burst(self, kind, k):
        if kind == "resnet50":
            self._step()
        else:
            a, b = self._ab(int(kind.rstrip("s")))
            for _ in range(k):
                a @ b
                if kind.endswith("s"):
                    self.t.cuda.synchronize()
        self.t.cuda.synchronize()

    def _step(self):
        if self.model is None:
            import torchvision
            t = self.t
            t.backends.cudnn.benchmark = True
            self.model = torchvision.models.resnet50().cuda()
            self.opt = t.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
            self.x = t.randn(64, 3, 224, 224, device="cuda")
            self.y = t.randint(0, 1000, (64,), device="cuda")
            self.loss = t.nn.CrossEntropyLoss()
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.model(self.x), self.y).backward()
        self.opt.step()


class Dry:
    """No GPU: a kernel is a 50 us sleep, a ResNet-50 step 60 ms."""

    def burst(self, kind, k):
        time.sleep(0.06 if kind == "resnet50" else k * (60e-6 if kind.endswith("s") else 50e-6))


def calibrate(backend, kind):
    """Milliseconds of one unit of work alone (a matmul, or a ResNet-50 step)."""
    for _ in range(3 if kind == "resnet50" else 1):
        backend.burst(kind, 20)
    units = 10
    if kind != "resnet50":  # about 0.3 s of matmuls, from a first estimate
        t0 = time.perf_counter()
        backend.burst(kind, 50)
        units = max(50, int(0.3 / max((time.perf_counter() - t0) / 50, 1e-6)))
    t0 = time.perf_counter()
    if kind == "resnet50":
        for _ in range(units):
            backend.burst(kind, 1)
    else:
        backend.burst(kind, units)
    return 1000 * (time.perf_counter() - t0) / units


def run(backend, kind, k, gap_s, start, end):
    while time.time() < start:
        backend.burst(kind, k)
        time.sleep(gap_s)
    iters, busy = [], 0.0
    begin = time.time()
    while time.time() < end:
        t0 = time.perf_counter()
        backend.burst(kind, k)
        t1 = time.perf_counter()
        time.sleep(gap_s)
        iters.append(time.perf_counter() - t0)
        busy += t1 - t0
    wall = time.time() - begin
    return {"iter_ms": 1000 * statistics.mean(iters), "burst_ms": 1000 * busy / len(iters),
            "duty": busy / wall, "iters": len(iters)}


def worker(conn, dry):
    backend = Dry() if dry else Torch()
    while True:
        cmd = conn.recv()
        if cmd[0] == "quit":
            return
        try:
            fn = {"calibrate": calibrate, "run": run}[cmd[0]]
            conn.send(("ok", fn(backend, *cmd[1:])))
        except Exception as e:  # reported to the orchestrator, which stops
            conn.send(("err", repr(e)))


def fit(path):
    doc = json.load(open(path))
    solo = {}
    for r in doc["runs"]:
        if r["label"].startswith("solo"):
            for w, j in r["jobs"].items():
                solo[(w, j["kind"], j["duty_target"])] = j
    rows = []
    for r in doc["runs"]:
        if not r["label"].startswith(("pair", "combo")):
            continue
        for w, j in r["jobs"].items():
            others = [solo[(k, v["kind"], v["duty_target"])] | {"kind": v["kind"]}
                      for k, v in r["jobs"].items() if k != w]
            me = solo[(w, j["kind"], j["duty_target"])]
            rows.append((j["kind"], me["duty"], "+".join(o["kind"] for o in others),
                         sum(o["duty"] for o in others), me["iter_ms"] / j["iter_ms"]))
    # 1 / speed = 1 + k * d_i * (the others' duties summed): one job beside one is the pair law
    x = [di * dj for _, di, _, dj, _ in rows]
    k = sum((1 / sp - 1) * xi for (*_, sp), xi in zip(rows, x)) / sum(xi * xi for xi in x)
    err = []
    print("| job (duty alone) | beside (duties alone, summed) | speed | law |")
    print("|---|---|---|---|")
    for (ki, di, ko, dj, sp), xi in zip(rows, x):
        law = 1 / (1 + k * xi)
        err.append(abs(law - sp) / sp)
        print(f"| {ki} ({di:.2f}) | {ko} ({dj:.2f}) | {sp:.3f} | {law:.3f} |")
    print(f"k = {k:.3f} over {len(rows)} paired jobs; |law - speed| / speed: "
          f"mean {sum(err) / len(err):.3%}, max {max(err):.3%}")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--fit":
        return fit(sys.argv[2])
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    secs = float(os.environ.get("COLOC_SECONDS", "4"))
    sizes = os.environ.get("COLOC_SIZES", "1024 4096").split()
    duties = [float(d) for d in os.environ.get("COLOC_DUTIES", "0.1 0.3 0.5 0.7 0.9").split()]
    dry = os.environ.get("COLOC_DRY") == "1"
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    # Stopped from outside (timeout(1)): take the workers down too, or they hold the GPU.
    def stop(*_):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # timeout(1) signals the whole group
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    try:
        measure_all(ctx, pipes, procs, out_path, secs, sizes, duties, dry)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()


def measure_all(ctx, pipes, procs, out_path, secs, sizes, duties, dry):
    combos = [[c for c in combo.split(",")] for combo in os.environ.get("COLOC_COMBOS", "").split()]
    for _ in range(max([2] + [len(c) for c in combos])):
        here, there = ctx.Pipe()
        p = ctx.Process(target=worker, args=(there, dry), daemon=True)
        p.start()
        pipes.append(here)
        procs.append(p)

    def ask(i, *cmd):
        pipes[i].send(cmd)

    def answer(i):
        status, value = pipes[i].recv()
        if status != "ok":
            raise SystemExit(f"worker {i}: {value}")
        return value

    gpu = "dry run" if dry else subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,compute_mode", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip()
    doc = {"gpu": gpu, "periods_ms": PERIODS_MS, "seconds": secs, "unit_ms": {}, "runs": []}

    def save():
        if out_path:
            with open(out_path + ".tmp", "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(out_path + ".tmp", out_path)

    def window(s):
        start = time.time() + LEAD_S
        return start, start + s

    def measure(label, jobs):
        """jobs: {worker: (kind, duty, k, gap_s)}; runs them together, records the result."""
        start, end = window(secs if len(jobs) > 1 else secs / 2)
        for i, (kind, _d, k, gap) in jobs.items():
            ask(i, "run", kind, k, gap, start, end)
        got = {i: answer(i) for i in jobs}
        row = {"label": label, "jobs": {str(i): {"kind": jobs[i][0], "duty_target": jobs[i][1],
                                                 **got[i]} for i in jobs}}
        doc["runs"].append(row)
        save()
        print("RESULT", label, " ".join(
            f"w{i}[{jobs[i][0]}@{jobs[i][1]}] iter_ms={got[i]['iter_ms']:.2f} "
            f"burst_ms={got[i]['burst_ms']:.2f} duty={got[i]['duty']:.3f}" for i in jobs), flush=True)
        return got

    print("gpu:", gpu, flush=True)
    if combos:
        size = sizes[0]
        units = []
        for i in range(len(procs)):  # each worker warms the size up (its cuBLAS handle)
            ask(i, "calibrate", size)
            units.append(answer(i))
        unit = units[0]
        doc["unit_ms"][size] = unit
        print(f"matmul {size}^2: {unit:.4f} ms alone", flush=True)

        def job(i, d):
            p = PERIODS_MS[i] / 1000
            duty = float(d.rstrip("s"))
            kind = size + ("s" if d.endswith("s") else "")
            return (kind, duty, max(1, round(duty * p * 1000 / unit)), (1 - duty) * p)

        done = set()
        for combo in combos:
            for i, d in enumerate(combo):
                if (i, d) not in done:
                    done.add((i, d))
                    measure(f"solo size={size}", {i: job(i, d)})
        for combo in combos:
            measure(f"combo size={size}", {i: job(i, d) for i, d in enumerate(combo)})
        sizes = []
    for size in sizes:
        ask(0, "calibrate", size)
        unit = answer(0)
        ask(1, "calibrate", size)  # worker 1 warms the size up too (its cuBLAS handle)
        answer(1)
        doc["unit_ms"][size] = unit
        print(f"matmul {size}^2: {unit:.4f} ms alone", flush=True)

        def spec(i, d):
            p = PERIODS_MS[i] / 1000
            return (size, d, max(1, round(d * p * 1000 / unit)), (1 - d) * p)

        for d in duties:
            for i in (0, 1):
                measure(f"solo size={size}", {i: spec(i, d)})
        for a_i, a in enumerate(duties):
            for b in duties[a_i:]:
                measure(f"pair size={size}", {0: spec(0, a), 1: spec(1, b)})

    if os.environ.get("COLOC_RESNET", "1") != "0" and not combos:
        steps = []
        for i in (0, 1):
            ask(i, "calibrate", "resnet50")
            steps.append(answer(i))
        doc["unit_ms"]["resnet50"] = steps
        print(f"resnet50 step alone: {steps[0]:.2f} / {steps[1]:.2f} ms", flush=True)
        mm = sizes[0]
        unit = doc["unit_ms"][mm]

        def rn(i, d):
            return ("resnet50", d, 1, steps[i] / 1000 * (1 - d) / d)

        def small(d):
            p = PERIODS_MS[1] / 1000
            return (mm, d, max(1, round(d * p * 1000 / unit)), (1 - d) * p)

        measure("solo resnet50", {0: rn(0, 0.9)})
        measure("solo resnet50", {1: rn(1, 0.9)})
        measure("solo resnet50", {0: rn(0, 0.5)})
        for d in (0.1, 0.3, 0.5):
            measure(f"pair resnet50+size={mm}", {0: rn(0, 0.9), 1: small(d)})
        measure("pair resnet50+resnet50", {0: rn(0, 0.9), 1: rn(1, 0.9)})
        measure("pair resnet50+resnet50", {0: rn(0, 0.5), 1: rn(1, 0.9)})

    for i in (0, 1):
        ask(i, "quit")
    for p in procs:
        p.join(timeout=10)
    print("done", flush=True)


if __name__ == "__main__":
    main()
