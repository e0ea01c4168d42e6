/* A client that dies of a GPU MMU fault: a kernel stores to an unmapped device address
 * (CUDA_ERROR_ILLEGAL_ADDRESS, 700, sticky for the context). Unlike a device-side assert,
 * this is the kind of fatal exception MPS documents as reaching every client of the server.
 * For the MPS fault check of node-gpu-check.sh (`gpu_check --mps-fault`). Prints the error
 * code of the synchronisation; exits 3 after the fault, 0 if none came. Kernel from PTX. */
#include <dlfcn.h>
#include <stdio.h>

#include "cuda_driver.h"

static const char PTX[] =
    PTX_HEADER
    ".visible .entry poke(.param .u64 p) {\n"
    "  .reg .u64 %a;\n"
    "  .reg .u32 %v;\n"
    "  ld.param.u64 %a, [p];\n"
    "  mov.u32 %v, 1;\n"
    "  st.global.u32 [%a], %v;\n"
    "  ret;\n"
    "}\n";

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("dlopen libcuda.so.1: %s\n", dlerror()); return 1; }
    init_t init = (init_t)dlsym(h, "cuInit");
    device_get_t device_get = (device_get_t)dlsym(h, "cuDeviceGet");
    ctx_retain_t retain = (ctx_retain_t)dlsym(h, "cuDevicePrimaryCtxRetain");
    ctx_set_t set = (ctx_set_t)dlsym(h, "cuCtxSetCurrent");
    module_load_t load = (module_load_t)dlsym(h, "cuModuleLoadData");
    get_function_t get_function = (get_function_t)dlsym(h, "cuModuleGetFunction");
    launch_t launch = (launch_t)dlsym(h, "cuLaunchKernel");
    sync_t sync = (sync_t)dlsym(h, "cuCtxSynchronize");
    if (!init || !device_get || !retain || !set || !load || !get_function || !launch || !sync) {
        printf("missing driver symbols\n");
        return 1;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction poke;
    int rc;
    if ((rc = init(0)) || (rc = device_get(&dev, 0)) || (rc = retain(&ctx, dev)) ||
        (rc = set(ctx)) || (rc = load(&mod, PTX)) || (rc = get_function(&poke, mod, "poke"))) {
        printf("setup failed: %d\n", rc);
        return 1;
    }
    unsigned long long bad = 0x10;
    void *params[] = {&bad};
    rc = launch(poke, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
    int sync_rc = sync();
    printf("launch %d, synchronize %d%s\n", rc, sync_rc,
           sync_rc == 700 ? " (CUDA_ERROR_ILLEGAL_ADDRESS)" : "");
    return sync_rc ? 3 : 0;
}
