/*
 * cuda_api — the small part of the CUDA driver API (cuda.h) this library
 * calls, declared here because no CUDA header or toolkit is needed to build
 * it: the driver is loaded at run time (mem/cuda.c). Types, constants and
 * signatures follow NVIDIA's cuda.h for the versioned symbols named below
 * (the `_v2` ones are what cuda.h's macros resolve to since CUDA 4/11); the
 * stand-in driver for tests (tests/fakecuda/) includes this file too, so the
 * two cannot drift apart.
 */
#ifndef ECT_MEM_CUDA_API_H
#define ECT_MEM_CUDA_API_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

#define CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

/* CUresult values this library tells apart. */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_ALREADY_MAPPED 208
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

/* CUpointer_attribute */
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
/* CUmemorytype */
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2
#define CU_MEMORYTYPE_ARRAY 3
#define CU_MEMORYTYPE_UNIFIED 4
/* flags */
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEMHOSTALLOC_PORTABLE 0x1
#define CU_MEMHOSTREGISTER_PORTABLE 0x1
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1

/* One entry per symbol: X(short name, symbol, parameter list); every one
 * returns CUresult. The loader declares a pointer per entry and resolves
 * the symbol with dlsym; the stand-in driver declares its definitions from
 * the same list, so their signatures cannot differ. */
#define ECT_CUDA_FUNCS(X)                                                                          \
    X(Init, cuInit, (unsigned flags))                                                              \
    X(DriverGetVersion, cuDriverGetVersion, (int *version))                                        \
    X(GetErrorName, cuGetErrorName, (CUresult err, const char **s))                                \
    X(GetErrorString, cuGetErrorString, (CUresult err, const char **s))                            \
    X(DeviceGetCount, cuDeviceGetCount, (int *count))                                              \
    X(DeviceGet, cuDeviceGet, (CUdevice * dev, int ordinal))                                       \
    X(DeviceGetName, cuDeviceGetName, (char *name, int len, CUdevice dev))                         \
    X(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, (CUcontext * ctx, CUdevice dev))           \
    X(CtxSetCurrent, cuCtxSetCurrent, (CUcontext ctx))                                             \
    X(CtxGetCurrent, cuCtxGetCurrent, (CUcontext * ctx))                                           \
    X(MemAlloc, cuMemAlloc_v2, (CUdeviceptr * p, size_t bytes))                                    \
    X(MemFree, cuMemFree_v2, (CUdeviceptr p))                                                      \
    X(MemGetAddressRange, cuMemGetAddressRange_v2,                                                 \
      (CUdeviceptr * base, size_t * size, CUdeviceptr p))                                          \
    X(MemHostAlloc, cuMemHostAlloc, (void **p, size_t bytes, unsigned flags))                      \
    X(MemFreeHost, cuMemFreeHost, (void *p))                                                       \
    X(MemHostRegister, cuMemHostRegister_v2, (void *p, size_t bytes, unsigned flags))              \
    X(MemHostUnregister, cuMemHostUnregister, (void *p))                                           \
    X(PointerGetAttribute, cuPointerGetAttribute, (void *data, int attr, CUdeviceptr p))           \
    X(MemcpyAsync, cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s))        \
    X(StreamCreate, cuStreamCreate, (CUstream * s, unsigned flags))                                \
    X(StreamDestroy, cuStreamDestroy_v2, (CUstream s))                                             \
    X(StreamSynchronize, cuStreamSynchronize, (CUstream s))                                        \
    X(EventCreate, cuEventCreate, (CUevent * e, unsigned flags))                                   \
    X(EventDestroy, cuEventDestroy_v2, (CUevent e))                                                \
    X(EventRecord, cuEventRecord, (CUevent e, CUstream s))                                         \
    X(EventSynchronize, cuEventSynchronize, (CUevent e))                                           \
    X(IpcGetMemHandle, cuIpcGetMemHandle, (CUipcMemHandle * h, CUdeviceptr p))                     \
    X(IpcOpenMemHandle, cuIpcOpenMemHandle_v2,                                                     \
      (CUdeviceptr * p, CUipcMemHandle h, unsigned flags))                                         \
    X(IpcCloseMemHandle, cuIpcCloseMemHandle, (CUdeviceptr p))

#endif
