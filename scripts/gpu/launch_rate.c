/* The interposer's hot path on a real driver (gpu-smoke.sh check 8): the CPU time of
 * cuLaunchKernel (an empty kernel, JIT-compiled from PTX by the driver, so no nvcc is needed)
 * and of a cuMemAlloc_v2 + cuMemFree_v2 pair, found the way a CUDA program finds them
 * (dlopen libcuda.so.1, dlsym). Run it bare and under LD_PRELOAD=libarbiter_interpose.so; the
 * difference is the interposer's cost per call.
 *
 * Launches are timed in batches of 256 between synchronisations, so the driver's queue never
 * fills and the time is the submitting thread's, not the GPU's; the synchronisation is outside
 * the timed part. Prints the median over batches, in ns per call:
 *   launch_ns=N alloc_free_ns=N
 * Usage: launch_rate [BATCHES] (default 400 launch batches, 40 allocation batches). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_driver.h"

static const char PTX[] =
    PTX_HEADER
    ".visible .entry noop() { ret; }\n";

#define BATCH 256
#define ALLOC_BATCH 64

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

#define SYM(h, name, type) \
    type name = (type)dlsym(h, #name); \
    if (!name) { printf("FAIL dlsym %s\n", #name); return 1; }
#define CHECK(call) \
    do { CUresult rc_ = (call); if (rc_) { printf("FAIL %s = %d\n", #call, rc_); return 1; } } while (0)

int main(int argc, char **argv) {
    int batches = argc > 1 ? atoi(argv[1]) : 400;
    if (batches < 1) batches = 400;
    int alloc_batches = batches / 10 > 0 ? batches / 10 : 1;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("FAIL dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
    SYM(h, cuInit, init_t);
    SYM(h, cuDeviceGet, device_get_t);
    SYM(h, cuDevicePrimaryCtxRetain, ctx_retain_t);
    SYM(h, cuCtxSetCurrent, ctx_set_t);
    SYM(h, cuModuleLoadData, module_load_t);
    SYM(h, cuModuleGetFunction, get_function_t);
    SYM(h, cuLaunchKernel, launch_t);
    SYM(h, cuCtxSynchronize, sync_t);
    SYM(h, cuMemAlloc_v2, alloc_t);
    SYM(h, cuMemFree_v2, free_t);

    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction noop;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&noop, mod, "noop"));

    /* Warm-up: the first launches and allocations pay one-off costs. */
    for (int i = 0; i < 4 * BATCH; i++) CHECK(cuLaunchKernel(noop, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    CHECK(cuCtxSynchronize());

    double *per_launch = malloc(sizeof(double) * (size_t)batches);
    double *per_pair = malloc(sizeof(double) * (size_t)alloc_batches);
    CUdeviceptr *ptrs = malloc(sizeof(CUdeviceptr) * ALLOC_BATCH);
    if (!per_launch || !per_pair || !ptrs) { printf("FAIL malloc\n"); return 1; }
    for (int b = 0; b < batches; b++) {
        double t0 = now_ns();
        for (int i = 0; i < BATCH; i++) CHECK(cuLaunchKernel(noop, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        per_launch[b] = (now_ns() - t0) / BATCH;
        CHECK(cuCtxSynchronize());
    }
    for (int b = 0; b < alloc_batches + 1; b++) {
        double t0 = now_ns();
        for (int i = 0; i < ALLOC_BATCH; i++) CHECK(cuMemAlloc_v2(&ptrs[i], 1 << 20));
        for (int i = 0; i < ALLOC_BATCH; i++) CHECK(cuMemFree_v2(ptrs[i]));
        if (b > 0) per_pair[b - 1] = (now_ns() - t0) / ALLOC_BATCH; /* batch 0 warms up */
    }
    printf("launch_ns=%.1f alloc_free_ns=%.1f\n", median(per_launch, batches),
           median(per_pair, alloc_batches));
    return 0;
}
