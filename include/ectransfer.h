/*
 * ectransfer — move multimodal encoder outputs (embedding tensors) from an
 * encoder instance to the prefill/decode instances that need them.
 *
 * This is the whole public API; every name starts with `ect_`. Everything is
 * thread-compatible but not thread-safe unless a function says otherwise.
 *
 * Conventions:
 *  - Functions return 0 on success or a negative ECT_E* code. The calling
 *    thread's ect_last_error() then holds a sentence saying what went wrong.
 *  - Constructors take an options struct filled by its _init function and
 *    return the handle through an out-parameter, set to NULL on failure.
 *  - Destructors accept NULL.
 */
#ifndef ECTRANSFER_H
#define ECTRANSFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ECT_BUILDING_LIBRARY)
#define ECT_API __attribute__((visibility("default")))
#else
#define ECT_API
#endif

/* ------------------------------------------------------------------ util */

/** Error codes. 0 is success; every error is negative. */
typedef enum ect_err {
    ECT_OK = 0,
    ECT_EINVAL = -1,       /* invalid argument or option */
    ECT_ENOMEM = -2,       /* out of memory (process heap) */
    ECT_EFULL = -3,        /* pool is full */
    ECT_ENOTFOUND = -4,    /* no such item, hash, region or peer */
    ECT_EPROTO = -5,       /* malformed message or protocol violation */
    ECT_ETIMEDOUT = -6,    /* timed out */
    ECT_EIO = -7,          /* I/O error from the OS */
    ECT_ECONNREFUSED = -8, /* peer refused or unreachable */
    ECT_ECLOSED = -9,      /* handle or connection closed */
    ECT_EBUSY = -10,       /* resource in use (leased, being written) */
    ECT_EEXIST = -11,      /* already exists / conflicting entry */
    ECT_ERANGE = -12,      /* value or address out of range */
    ECT_EACCES = -13,      /* permission denied or wrong key */
    ECT_ENOTSUP = -14,     /* not supported by this build or back end */
    ECT_ECANCELED = -15,   /* cancelled */
    ECT_ESTATE = -16,      /* operation illegal in the current state */
    ECT_EOVERFLOW = -17,   /* arithmetic overflow in sizes */
} ect_err;

/** A fixed English sentence for an error code; never NULL. */
ECT_API const char *ect_strerror(int err);

/** Detail text of the last error on the calling thread ("" if none). The
 *  string stays valid until the next failing ect_ call on this thread. */
ECT_API const char *ect_last_error(void);

/** Library version, e.g. "0.1.0". */
ECT_API const char *ect_version(void);

/* --------------------------------------------------------------- dtypes */

/** Element size in bytes of a torch dtype name ("bfloat16" or
 *  "torch.bfloat16", "float8_e4m3fn", ...); 0 if the name is unknown. */
ECT_API size_t ect_dtype_size(const char *name);

/* @@ECT_API_MEM@@ (buffer pool: alloc, pool, resident) */

/* @@ECT_API_XPORT@@ (data plane) */

/* @@ECT_API_PUSH@@ (generation 2) */

/* @@ECT_API_PULL@@ (generation 1) */

#ifdef __cplusplus
}
#endif
#endif /* ECTRANSFER_H */
