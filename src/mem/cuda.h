/*
 * cuda — the CUDA driver API, loaded at run time (see the public header's
 * "memory kinds"). Everything GPU in the library goes through here: the
 * loader, contexts, device and pinned allocations, copies, streams, events
 * and IPC handles. Nothing here is called unless someone asked for a pinned
 * or device kind, or the process already has the driver loaded.
 *
 * Contexts: every call makes the device's primary context current for its
 * duration and puts back whatever the calling thread had (an engine's thread
 * keeps its own context). Synchronous copies run on a per-thread,
 * per-device non-blocking stream, so they never wait for an engine's work on
 * the legacy default stream, and return once the stream drained.
 *
 * Errors: ECT_ENOTSUP when the driver is unavailable ("CUDA is unavailable:
 * <why>"), ECT_ENOMEM for CUDA_ERROR_OUT_OF_MEMORY, ECT_EINVAL for a bad
 * device, ECT_EIO for any other driver error, always naming the driver's
 * error. All functions are safe from any thread.
 */
#ifndef ECT_MEM_CUDA_H
#define ECT_MEM_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "ectransfer.h"

#define CUDA_IPC_HANDLE_LEN 64

/* Loads the driver once (later calls return the first outcome). 0, or
 * ECT_ENOTSUP with the reason as detail. */
int cuda_load(void);

/* True when the driver is loaded, or is already mapped into the process (an
 * engine loaded it: then it is loaded here too). Never loads a library the
 * process did not have. Cheap enough to call per write. */
bool cuda_active(void);

/* Fills *info (loads the driver). Returns 0 or ECT_ENOTSUP. */
int cuda_get_info(ect_cuda_info *info);

/* ECT_EINVAL unless dev is a device of this machine (loads the driver). */
int cuda_check_device(int dev);

/* What p is: ECT_MEM_CUDA (and its device), ECT_MEM_PINNED, or ECT_MEM_HOST
 * (also when the driver is not active). */
void cuda_ptr_kind(const void *p, int *kind, int *dev);

int cuda_dev_alloc(int dev, uint64_t n, void **out);
void cuda_dev_free(void *p);
int cuda_host_alloc(uint64_t n, void **out);
void cuda_host_free(void *p);
/* Registers [p, p+n) as pinned; *already is set when it was registered
 * before (then do not unregister it). */
int cuda_host_register(void *p, uint64_t n, bool *already);
void cuda_host_unregister(void *p);

/* Copies n bytes (any kinds; UVA) on this thread's stream of device `dev`
 * and waits for it. */
int cuda_copy(void *dst, const void *src, uint64_t n, int dev);

/* The IPC handle of the allocation holding device pointer p, and p's offset
 * from the allocation's start. */
int cuda_ipc_export(const void *p, uint8_t handle[CUDA_IPC_HANDLE_LEN], uint64_t *offset);
/* Opens a peer's handle (counted: the same handle opened twice maps once);
 * *base is the allocation's start in this process. */
int cuda_ipc_open(const uint8_t handle[CUDA_IPC_HANDLE_LEN], int dev, void **base);
void cuda_ipc_close(void *base);

/* Streams and events (opaque), for pipelines such as the bounce ring. */
int cuda_stream_open(int dev, void **s);
void cuda_stream_close(int dev, void *s);
int cuda_copy_async(int dev, void *s, void *dst, const void *src, uint64_t n);
int cuda_stream_wait(int dev, void *s);
int cuda_event_open(int dev, void **e);
void cuda_event_close(int dev, void *e);
int cuda_event_record(int dev, void *e, void *s);
int cuda_event_wait(int dev, void *e);

#endif
