/* The few CUDA driver API types and entry-point signatures the GPU check programs use
 * (launch_rate.c, mmu_fault.c), so that they build without the CUDA toolkit: each program
 * dlopens libcuda.so.1 and finds the functions with dlsym, as a CUDA program does, which is
 * also what the interposer intercepts. Kernels come as PTX the driver JIT-compiles. */
#ifndef ARBITER_CUDA_DRIVER_H
#define ARBITER_CUDA_DRIVER_H
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;
typedef CUresult (*init_t)(unsigned);
typedef CUresult (*device_get_t)(CUdevice *, int);
typedef CUresult (*ctx_retain_t)(CUcontext *, CUdevice);
typedef CUresult (*ctx_set_t)(CUcontext);
typedef CUresult (*module_load_t)(CUmodule *, const void *);
typedef CUresult (*get_function_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, void *, void **, void **);
typedef CUresult (*sync_t)(void);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);

/* The PTX header of the programs' kernels: JIT-compiled for whatever GPU runs them. */
#define PTX_HEADER ".version 7.0\n.target sm_75\n.address_size 64\n"

#endif
