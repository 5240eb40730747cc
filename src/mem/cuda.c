/*
 * cuda — the CUDA driver API loaded with dlopen (see cuda.h). The library
 * is libcuda.so.1, or whatever ECT_CUDA_LIBRARY names (the tests point it
 * at a stand-in driver built on host memory). It is loaded once, on the
 * first explicit request; cuda_active() also picks it up when the process
 * already mapped it (an engine's torch did: found by walking the loaded
 * objects, no system call, since it runs per write), which is how a device pointer
 * handed in by a caller is recognised without ever loading a driver into a
 * process that has none.
 *
 * Primary contexts are retained once per device and never released (they
 * are the ones the CUDA runtime and torch use, so memory and handles are
 * shared with the engine). A call brackets its driver calls with
 * enter()/leave(), which make the device's primary context current and then
 * restore the thread's previous one.
 *
 * Per thread and device, one non-blocking stream serves the synchronous
 * copies (destroyed when the thread exits). IPC handles opened from peers
 * are counted, so two connections to the same peer region share one mapping
 * (the driver refuses, or at best counts, a second open of one handle).
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem/cuda.h"
#include "mem/cuda_api.h"
#include "util/util.h"

#define MOD "cuda"
#define MAX_DEV 64
#define DEFAULT_LIB "libcuda.so.1"

#define DECLARE(name, sym, params) CUresult(*name) params;
typedef struct cuda_fns {
    ECT_CUDA_FUNCS(DECLARE)
} cuda_fns;
#undef DECLARE

typedef struct ipc_open {
    uint8_t handle[CUDA_IPC_HANDLE_LEN];
    int dev;
    void *base;
    int refs;
    struct ipc_open *next;
} ipc_open;

static struct {
    pthread_once_t once;
    int state; /* 0 not tried, 1 loaded, -1 unavailable (atomic) */
    char lib[256];
    char why[320];
    void *dl;
    cuda_fns f;
    int ndev, version;
    char name0[128];
    pthread_mutex_t mu; /* guards ctx[] and ipc */
    CUcontext ctx[MAX_DEV];
    ipc_open *ipc;
    pthread_key_t tl_key;
} g = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

typedef struct tl_streams {
    CUstream s[MAX_DEV];
} tl_streams;

static const char *lib_name(void) {
    const char *e = getenv("ECT_CUDA_LIBRARY");
    return e && *e ? e : DEFAULT_LIB;
}

static const char *err_text(CUresult rc, char *buf, size_t cap) {
    const char *name = NULL, *str = NULL;
    if (g.f.GetErrorName) g.f.GetErrorName(rc, &name);
    if (g.f.GetErrorString) g.f.GetErrorString(rc, &str);
    snprintf(buf, cap, "%s (%d%s%s)", name ? name : "CUDA error", rc, str ? ": " : "",
             str ? str : "");
    return buf;
}

/* Maps a driver error to an ect code with "what: NAME (n: text)". */
static int cu_fail(CUresult rc, const char *what) {
    char b[200];
    int code = rc == CUDA_ERROR_OUT_OF_MEMORY    ? ECT_ENOMEM
               : rc == CUDA_ERROR_INVALID_DEVICE ? ECT_EINVAL
                                                 : ECT_EIO;
    return ect_set_error(code, "cuda: %s: %s", what, err_text(rc, b, sizeof b));
}

static void tl_free(void *p) {
    tl_streams *t = p;
    for (int d = 0; d < MAX_DEV; d++)
        if (t->s[d]) g.f.StreamDestroy(t->s[d]);
    free(t);
}

static void load_once(void) {
    snprintf(g.lib, sizeof g.lib, "%s", lib_name());
    g.dl = dlopen(g.lib, RTLD_NOW | RTLD_LOCAL);
    if (!g.dl) {
        const char *e = dlerror();
        snprintf(g.why, sizeof g.why, "cannot load the CUDA driver %s: %s", g.lib,
                 e ? e : "dlopen failed");
        goto fail;
    }
#define RESOLVE(name, sym, params)                                                                 \
    *(void **)&g.f.name = dlsym(g.dl, #sym);                                                       \
    if (!g.f.name) {                                                                               \
        snprintf(g.why, sizeof g.why, "%s has no %s (driver too old?)", g.lib, #sym);              \
        goto fail;                                                                                 \
    }
    ECT_CUDA_FUNCS(RESOLVE)
#undef RESOLVE
    char b[200];
    CUresult rc = g.f.Init(0);
    if (rc != CUDA_SUCCESS) {
        snprintf(g.why, sizeof g.why, "cuInit failed: %s",
                 rc == CUDA_ERROR_NO_DEVICE ? "no CUDA device" : err_text(rc, b, sizeof b));
        goto fail;
    }
    g.f.DriverGetVersion(&g.version);
    rc = g.f.DeviceGetCount(&g.ndev);
    if (rc != CUDA_SUCCESS || g.ndev < 1) {
        snprintf(g.why, sizeof g.why, "no CUDA device (%s)",
                 rc ? err_text(rc, b, sizeof b) : "cuDeviceGetCount says 0");
        goto fail;
    }
    if (g.ndev > MAX_DEV) g.ndev = MAX_DEV;
    CUdevice d0;
    if (g.f.DeviceGet(&d0, 0) == CUDA_SUCCESS) g.f.DeviceGetName(g.name0, sizeof g.name0, d0);
    if (pthread_key_create(&g.tl_key, tl_free) != 0) {
        snprintf(g.why, sizeof g.why, "out of thread-local keys");
        goto fail;
    }
    ECT_LOGI(MOD, "loaded %s: driver %d, %d device(s), device 0 %s", g.lib, g.version, g.ndev,
             g.name0);
    __atomic_store_n(&g.state, 1, __ATOMIC_RELEASE);
    return;
fail:
    ECT_LOGD(MOD, "unavailable: %s", g.why);
    if (g.dl) dlclose(g.dl);
    g.dl = NULL;
    memset(&g.f, 0, sizeof g.f);
    __atomic_store_n(&g.state, -1, __ATOMIC_RELEASE);
}

int cuda_load(void) {
    pthread_once(&g.once, load_once);
    if (__atomic_load_n(&g.state, __ATOMIC_ACQUIRE) == 1) return 0;
    return ect_set_error(ECT_ENOTSUP, "CUDA is unavailable: %s", g.why);
}

typedef struct find_lib {
    const char *base; /* basename to find */
    bool prefix;      /* match it as a prefix (libcuda.so, libcuda.so.1, libcuda.so.580...) */
    bool found;
    bool first; /* the walk's first object: its load counters are read */
    bool same;  /* nothing was loaded or unloaded since the last full walk */
    unsigned long long gen, last_gen;
} find_lib;

/* The last full walk: the loader's counters then (dlpi_adds + dlpi_subs +
 * 1) shifted left by one, its answer in bit 0; one word, so racing walkers
 * never pair one walk's counters with another's answer. While the counters
 * stay the same so does the answer, and the walk stops at its first object.
 * 0: no walk yet. */
static unsigned long long g_walk;

static int find_cb(struct dl_phdr_info *info, size_t size, void *arg) {
    find_lib *f = arg;
    if (f->first) {
        f->first = false;
        if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs) {
            f->gen = info->dlpi_adds + info->dlpi_subs + 1;
            if (f->gen == f->last_gen) {
                f->same = true;
                return 1;
            }
        }
    }
    const char *n = info->dlpi_name ? info->dlpi_name : "", *b = strrchr(n, '/');
    b = b ? b + 1 : n;
    f->found = f->prefix ? strncmp(b, f->base, strlen(f->base)) == 0 : strcmp(b, f->base) == 0;
    return f->found;
}

/* Whether the process already mapped the driver library. A walk of the
 * loaded objects (no system call), because this runs per write;
 * dlopen(RTLD_NOLOAD) costs ~30 us of path searching. The walk stops at the
 * first object while the loader's counters say nothing changed since the
 * last full walk (a full walk compared every object's name: ~2% of the CPU
 * of a 64 KiB push, see docs/BENCHMARKS.md "Small items"). */
static bool driver_mapped(void) {
    const char *e = getenv("ECT_CUDA_LIBRARY");
    unsigned long long last = __atomic_load_n(&g_walk, __ATOMIC_RELAXED);
    find_lib f = {.base = "libcuda.so", .prefix = true, .first = true, .last_gen = last >> 1};
    if (e && *e) { /* a chosen library (tests, odd installs): always the full walk */
        const char *b = strrchr(e, '/');
        f.base = b ? b + 1 : e;
        f.prefix = false;
        f.first = false;
    }
    dl_iterate_phdr(find_cb, &f);
    if (f.same) return last & 1;
    if (f.gen) __atomic_store_n(&g_walk, f.gen << 1 | (f.found ? 1 : 0), __ATOMIC_RELAXED);
    return f.found;
}

bool cuda_active(void) {
    int st = __atomic_load_n(&g.state, __ATOMIC_ACQUIRE);
    if (st) return st == 1;
    return driver_mapped() && cuda_load() == 0;
}

int cuda_get_info(ect_cuda_info *info) {
    int rc = cuda_load();
    if (!info) return rc;
    memset(info, 0, sizeof *info);
    snprintf(info->library, sizeof info->library, "%s", g.lib);
    if (rc) {
        snprintf(info->why, sizeof info->why, "%s", g.why);
        return rc;
    }
    info->available = 1;
    info->driver_version = g.version;
    info->devices = g.ndev;
    snprintf(info->device0, sizeof info->device0, "%s", g.name0);
    return 0;
}

int cuda_check_device(int dev) {
    int rc = cuda_load();
    if (rc) return rc;
    if (dev < 0 || dev >= g.ndev)
        return ect_set_error(ECT_EINVAL, "cuda: device %d does not exist (this machine has %d)",
                             dev, g.ndev);
    return 0;
}

/* Makes dev's primary context current; *saved gets the thread's previous
 * one for leave(). Requires the driver loaded. */
static int enter(int dev, CUcontext *saved) {
    if (dev < 0 || dev >= g.ndev)
        return ect_set_error(ECT_EINVAL, "cuda: device %d does not exist (this machine has %d)",
                             dev, g.ndev);
    CUcontext c = __atomic_load_n(&g.ctx[dev], __ATOMIC_ACQUIRE);
    if (c) goto have;
    pthread_mutex_lock(&g.mu);
    c = g.ctx[dev];
    if (!c) {
        CUdevice d;
        CUresult rc = g.f.DeviceGet(&d, dev);
        if (rc == CUDA_SUCCESS) rc = g.f.DevicePrimaryCtxRetain(&c, d);
        if (rc != CUDA_SUCCESS) {
            pthread_mutex_unlock(&g.mu);
            return cu_fail(rc, "retaining the primary context");
        }
        __atomic_store_n(&g.ctx[dev], c, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g.mu);
have:
    *saved = NULL;
    g.f.CtxGetCurrent(saved);
    if (*saved == c) return 0;
    CUresult rc = g.f.CtxSetCurrent(c);
    return rc ? cu_fail(rc, "making the context current") : 0;
}

static void leave(int dev, CUcontext saved) {
    if (saved != __atomic_load_n(&g.ctx[dev], __ATOMIC_ACQUIRE)) g.f.CtxSetCurrent(saved);
}

/* This thread's stream for dev (context entered). */
static int tl_stream(int dev, CUstream *out) {
    tl_streams *t = pthread_getspecific(g.tl_key);
    if (!t) {
        if (!(t = calloc(1, sizeof *t))) return ect_set_error(ECT_ENOMEM, "cuda: stream table");
        pthread_setspecific(g.tl_key, t);
    }
    if (!t->s[dev]) {
        CUresult rc = g.f.StreamCreate(&t->s[dev], CU_STREAM_NON_BLOCKING);
        if (rc) return cu_fail(rc, "creating a stream");
    }
    *out = t->s[dev];
    return 0;
}

void cuda_ptr_kind(const void *p, int *kind, int *dev) {
    *kind = ECT_MEM_HOST;
    if (dev) *dev = 0;
    if (!p || !cuda_active()) return;
    CUcontext saved;
    if (enter(0, &saved)) return;
    unsigned type = 0;
    int ord = 0;
    CUresult rc =
        g.f.PointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p);
    /* Only DEVICE counts as device memory (managed memory reports DEVICE too);
     * whatever else a driver may say of host memory (HMM), it stays host. */
    if (rc == CUDA_SUCCESS && type == CU_MEMORYTYPE_DEVICE) {
        *kind = ECT_MEM_CUDA;
        if (g.f.PointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                    (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS &&
            dev)
            *dev = ord;
    } else if (rc == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST) {
        *kind = ECT_MEM_PINNED;
    }
    leave(0, saved);
}

int cuda_dev_alloc(int dev, uint64_t n, void **out) {
    *out = NULL;
    int rc = cuda_load();
    CUcontext saved;
    if (rc || (rc = enter(dev, &saved))) return rc;
    CUdeviceptr p = 0;
    CUresult r = g.f.MemAlloc(&p, (size_t)n);
    leave(dev, saved);
    if (r) {
        char what[96];
        snprintf(what, sizeof what, "cuMemAlloc of %" PRIu64 " bytes on device %d", n, dev);
        return cu_fail(r, what);
    }
    *out = (void *)(uintptr_t)p;
    return 0;
}

void cuda_dev_free(void *p) {
    int kind, dev;
    if (!p) return;
    cuda_ptr_kind(p, &kind, &dev);
    CUcontext saved;
    if (enter(dev, &saved)) return;
    CUresult r = g.f.MemFree((CUdeviceptr)(uintptr_t)p);
    if (r) {
        char b[200];
        ECT_LOGW(MOD, "cuMemFree(%p): %s", p, err_text(r, b, sizeof b));
    }
    leave(dev, saved);
}

int cuda_host_alloc(uint64_t n, void **out) {
    *out = NULL;
    int rc = cuda_load();
    CUcontext saved;
    if (rc || (rc = enter(0, &saved))) return rc;
    CUresult r = g.f.MemHostAlloc(out, (size_t)n, CU_MEMHOSTALLOC_PORTABLE);
    leave(0, saved);
    if (r) {
        *out = NULL;
        char what[96];
        snprintf(what, sizeof what, "cuMemHostAlloc of %" PRIu64 " bytes", n);
        return cu_fail(r, what);
    }
    return 0;
}

void cuda_host_free(void *p) {
    CUcontext saved;
    if (!p || cuda_load() || enter(0, &saved)) return;
    g.f.MemFreeHost(p);
    leave(0, saved);
}

int cuda_host_register(void *p, uint64_t n, bool *already) {
    *already = false;
    int rc = cuda_load();
    CUcontext saved;
    if (rc || (rc = enter(0, &saved))) return rc;
    CUresult r = g.f.MemHostRegister(p, (size_t)n, CU_MEMHOSTREGISTER_PORTABLE);
    leave(0, saved);
    if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
        *already = true;
        return 0;
    }
    if (r) {
        char what[96];
        snprintf(what, sizeof what, "cuMemHostRegister of %" PRIu64 " bytes", n);
        return cu_fail(r, what);
    }
    return 0;
}

void cuda_host_unregister(void *p) {
    CUcontext saved;
    if (!p || cuda_load() || enter(0, &saved)) return;
    CUresult r = g.f.MemHostUnregister(p);
    if (r) {
        char b[200];
        ECT_LOGW(MOD, "cuMemHostUnregister(%p): %s", p, err_text(r, b, sizeof b));
    }
    leave(0, saved);
}

int cuda_copy(void *dst, const void *src, uint64_t n, int dev) {
    if (n == 0) return 0;
    int rc = cuda_load();
    CUcontext saved;
    if (rc || (rc = enter(dev, &saved))) return rc;
    CUstream s = NULL;
    CUresult r = 0;
    if (!(rc = tl_stream(dev, &s))) {
        r = g.f.MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, (size_t)n, s);
        if (!r) r = g.f.StreamSynchronize(s);
    }
    leave(dev, saved);
    if (r) {
        char what[96];
        snprintf(what, sizeof what, "copy of %" PRIu64 " bytes %p -> %p", n, src, dst);
        return cu_fail(r, what);
    }
    return rc;
}

int cuda_ipc_export(const void *p, uint8_t handle[CUDA_IPC_HANDLE_LEN], uint64_t *offset) {
    int kind, dev, rc = cuda_load();
    if (rc) return rc;
    cuda_ptr_kind(p, &kind, &dev);
    if (kind != ECT_MEM_CUDA)
        return ect_set_error(ECT_EINVAL, "cuda: %p is not device memory (no IPC handle)", p);
    CUcontext saved;
    if ((rc = enter(dev, &saved))) return rc;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUipcMemHandle h;
    CUresult r = g.f.MemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p);
    if (!r) r = g.f.IpcGetMemHandle(&h, base);
    leave(dev, saved);
    if (r) return cu_fail(r, "cuIpcGetMemHandle");
    memcpy(handle, h.reserved, CUDA_IPC_HANDLE_LEN);
    *offset = (uint64_t)((CUdeviceptr)(uintptr_t)p - base);
    return 0;
}

int cuda_ipc_open(const uint8_t handle[CUDA_IPC_HANDLE_LEN], int dev, void **base) {
    *base = NULL;
    int rc = cuda_load();
    if (rc) return rc;
    pthread_mutex_lock(&g.mu);
    for (ipc_open *o = g.ipc; o; o = o->next)
        if (o->dev == dev && memcmp(o->handle, handle, CUDA_IPC_HANDLE_LEN) == 0) {
            o->refs++;
            *base = o->base;
            pthread_mutex_unlock(&g.mu);
            return 0;
        }
    pthread_mutex_unlock(&g.mu);
    ipc_open *o = calloc(1, sizeof *o);
    if (!o) return ect_set_error(ECT_ENOMEM, "cuda: IPC table");
    CUcontext saved;
    if ((rc = enter(dev, &saved))) {
        free(o);
        return rc;
    }
    CUipcMemHandle h;
    memcpy(h.reserved, handle, CUDA_IPC_HANDLE_LEN);
    CUdeviceptr p = 0;
    CUresult r = g.f.IpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    leave(dev, saved);
    if (r) {
        free(o);
        return cu_fail(r, "cuIpcOpenMemHandle of a peer's region");
    }
    memcpy(o->handle, handle, CUDA_IPC_HANDLE_LEN);
    o->dev = dev;
    o->base = (void *)(uintptr_t)p;
    o->refs = 1;
    pthread_mutex_lock(&g.mu);
    /* Another thread may have opened the same handle meanwhile: keep one. */
    ipc_open *dup = NULL;
    for (ipc_open *q = g.ipc; q; q = q->next)
        if (q->dev == dev && memcmp(q->handle, handle, CUDA_IPC_HANDLE_LEN) == 0) dup = q;
    if (dup) {
        dup->refs++;
        *base = dup->base;
    } else {
        o->next = g.ipc;
        g.ipc = o;
        *base = o->base;
    }
    pthread_mutex_unlock(&g.mu);
    if (dup) { /* ours is the extra open, whether the driver counted it or mapped twice */
        CUcontext s2;
        if (!enter(dev, &s2)) {
            g.f.IpcCloseMemHandle(p);
            leave(dev, s2);
        }
    }
    if (dup) free(o);
    return 0;
}

void cuda_ipc_close(void *base) {
    if (!base) return;
    ipc_open *hit = NULL;
    pthread_mutex_lock(&g.mu);
    for (ipc_open **pp = &g.ipc; *pp; pp = &(*pp)->next)
        if ((*pp)->base == base) {
            if (--(*pp)->refs == 0) {
                hit = *pp;
                *pp = hit->next;
            }
            break;
        }
    pthread_mutex_unlock(&g.mu);
    if (!hit) return;
    CUcontext saved;
    if (!enter(hit->dev, &saved)) {
        CUresult r = g.f.IpcCloseMemHandle((CUdeviceptr)(uintptr_t)base);
        if (r) {
            char b[200];
            ECT_LOGW(MOD, "cuIpcCloseMemHandle(%p): %s", base, err_text(r, b, sizeof b));
        }
        leave(hit->dev, saved);
    }
    free(hit);
}

int cuda_stream_open(int dev, void **s) {
    *s = NULL;
    int rc = cuda_load();
    CUcontext saved;
    if (rc || (rc = enter(dev, &saved))) return rc;
    CUstream st = NULL;
    CUresult r = g.f.StreamCreate(&st, CU_STREAM_NON_BLOCKING);
    leave(dev, saved);
    if (r) return cu_fail(r, "creating a stream");
    *s = st;
    return 0;
}

void cuda_stream_close(int dev, void *s) {
    CUcontext saved;
    if (!s || enter(dev, &saved)) return;
    g.f.StreamSynchronize(s);
    g.f.StreamDestroy(s);
    leave(dev, saved);
}

int cuda_copy_async(int dev, void *s, void *dst, const void *src, uint64_t n) {
    CUcontext saved;
    int rc = enter(dev, &saved);
    if (rc) return rc;
    CUresult r =
        g.f.MemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, (size_t)n, s);
    leave(dev, saved);
    return r ? cu_fail(r, "queueing a copy") : 0;
}

int cuda_stream_wait(int dev, void *s) {
    CUcontext saved;
    int rc = enter(dev, &saved);
    if (rc) return rc;
    CUresult r = g.f.StreamSynchronize(s);
    leave(dev, saved);
    return r ? cu_fail(r, "waiting for a stream") : 0;
}

int cuda_event_open(int dev, void **e) {
    *e = NULL;
    CUcontext saved;
    int rc = enter(dev, &saved);
    if (rc) return rc;
    CUevent ev = NULL;
    CUresult r = g.f.EventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    leave(dev, saved);
    if (r) return cu_fail(r, "creating an event");
    *e = ev;
    return 0;
}

void cuda_event_close(int dev, void *e) {
    CUcontext saved;
    if (!e || enter(dev, &saved)) return;
    g.f.EventDestroy(e);
    leave(dev, saved);
}

int cuda_event_record(int dev, void *e, void *s) {
    CUcontext saved;
    int rc = enter(dev, &saved);
    if (rc) return rc;
    CUresult r = g.f.EventRecord(e, s);
    leave(dev, saved);
    return r ? cu_fail(r, "recording an event") : 0;
}

int cuda_event_wait(int dev, void *e) {
    CUcontext saved;
    int rc = enter(dev, &saved);
    if (rc) return rc;
    CUresult r = g.f.EventSynchronize(e);
    leave(dev, saved);
    return r ? cu_fail(r, "waiting for an event") : 0;
}
