/*
 * fakecuda — a STAND-IN for the CUDA driver (libcuda.so.1), for tests on
 * machines without a GPU. It is NOT a GPU and proves nothing about real
 * CUDA: it lets the suite drive the library's GPU code paths (memory kinds,
 * the bounce ring, CUDA IPC over shm, device sources) on every CI run. Real
 * verification is `make test-gpu` on a GPU machine (scripts/gpu-check.sh).
 * Selected with ECT_CUDA_LIBRARY=<path of this library>.
 *
 * It exports the subset of the driver API src/mem/cuda_api.h lists, with
 * the semantics a caller can get wrong, kept strict on purpose:
 *  - "Device memory" is host memory the caller cannot touch: each
 *    allocation lives in a memfd mapped at a hidden address, and the device
 *    address handed out lies in a PROT_NONE reservation, so host code that
 *    dereferences a device pointer crashes as it would on a GPU.
 *  - Copies on a stream run later, on the stream's own thread, in order;
 *    only cuStreamSynchronize / cuEventSynchronize say they are done. Code
 *    that forgets to wait reads stale bytes. The legacy stream (NULL) copies
 *    at once.
 *  - Memory calls need cuInit and a current context (CUDA_ERROR_NOT_
 *    INITIALIZED / CUDA_ERROR_INVALID_CONTEXT otherwise); a copy must lie
 *    wholly inside one allocation; cuIpcGetMemHandle takes only an
 *    allocation's base; an IPC handle opened in the process that exported
 *    it, or opened twice, is refused (as the driver may).
 *  - IPC across processes: the exporter serves each allocation's memfd over
 *    an abstract unix socket (SCM_RIGHTS); the handle names the socket.
 *
 * Environment: FAKECUDA_DEVICES=N (default 1; 0 behaves as a machine with a
 * driver and no device); FAKECUDA_FAIL_COPY_BYTES=N makes every copy of
 * exactly N bytes fail (CUDA_ERROR_LAUNCH_FAILED, 719) to test error paths.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "mem/cuda_api.h"

#define EXPORT __attribute__((visibility("default")))
/* Every definition below has the signature cuda_api.h declares. */
#define PROTO(name, sym, params) EXPORT CUresult sym params;
ECT_CUDA_FUNCS(PROTO)
#undef PROTO
#define VA_SIZE (UINT64_C(64) << 30)
#define VA_ALIGN (UINT64_C(2) << 20)
#define MAX_DEV 8
#define CUDA_ERROR_LAUNCH_FAILED 719
#define HANDLE_MAGIC 0x4144554345414b46ull /* "FAKECUDA" */

typedef struct alloc_rec {
    uint64_t dptr, len; /* device address range */
    uint8_t *host;      /* the backing mapping */
    int fd;             /* memfd (owner) or -1 (imported) */
    int dev;
    uint64_t id;
    int imported;
    struct alloc_rec *next;
} alloc_rec;

typedef struct pinned_rec {
    uint8_t *p;
    uint64_t len;
    int allocated; /* cuMemHostAlloc'd (else registered) */
    struct pinned_rec *next;
} pinned_rec;

typedef struct op {
    int kind; /* 0 copy, 1 event */
    uint8_t *dst;
    const uint8_t *src;
    size_t n;
    struct CUevent_st *ev;
    uint64_t seq;
    struct op *next;
} op;

struct CUstream_st {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    op *head, *tail;
    int busy, stop;
    pthread_t th;
};

struct CUevent_st {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded, done; /* sequence numbers */
};

struct CUctx_st {
    int dev;
};

static struct {
    pthread_mutex_t mu;
    int inited, ndev;
    uint8_t *va;
    uint64_t va_next;
    alloc_rec *allocs;
    pinned_rec *pinned;
    uint64_t next_id;
    long fail_bytes;
    struct CUctx_st ctx[MAX_DEV];
    int server_started;
    char server_name[32];
} F = {.mu = PTHREAD_MUTEX_INITIALIZER, .fail_bytes = -1};

static __thread struct CUctx_st *tl_ctx;

/* ----------------------------------------------------------------- basics */

EXPORT CUresult cuInit(unsigned flags) {
    (void)flags;
    pthread_mutex_lock(&F.mu);
    if (!F.inited) {
        const char *d = getenv("FAKECUDA_DEVICES");
        F.ndev = d ? atoi(d) : 1;
        if (F.ndev < 0) F.ndev = 0;
        if (F.ndev > MAX_DEV) F.ndev = MAX_DEV;
        const char *fb = getenv("FAKECUDA_FAIL_COPY_BYTES");
        if (fb && *fb) F.fail_bytes = atol(fb);
        for (int i = 0; i < MAX_DEV; i++) F.ctx[i].dev = i;
        void *va =
            mmap(NULL, VA_SIZE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (va == MAP_FAILED) {
            pthread_mutex_unlock(&F.mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        F.va = va;
        F.va_next = ((uintptr_t)va + VA_ALIGN - 1) & ~(VA_ALIGN - 1);
        F.inited = 1;
    }
    int nd = F.ndev;
    pthread_mutex_unlock(&F.mu);
    return nd ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static int inited(void) {
    pthread_mutex_lock(&F.mu);
    int i = F.inited;
    pthread_mutex_unlock(&F.mu);
    return i;
}

#define NEED_INIT                                                                                  \
    if (!inited()) return CUDA_ERROR_NOT_INITIALIZED
#define NEED_CTX                                                                                   \
    NEED_INIT;                                                                                     \
    if (!tl_ctx) return CUDA_ERROR_INVALID_CONTEXT

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

static const char *names(CUresult e, int full) {
    switch (e) {
    case CUDA_SUCCESS: return full ? "no error" : "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return full ? "invalid argument" : "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return full ? "out of memory" : "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED:
        return full ? "initialization error" : "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return full ? "no CUDA-capable device" : "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE:
        return full ? "invalid device ordinal" : "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT:
        return full ? "invalid device context" : "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_ALREADY_MAPPED: return full ? "already mapped" : "CUDA_ERROR_ALREADY_MAPPED";
    case CUDA_ERROR_INVALID_HANDLE:
        return full ? "invalid resource handle" : "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        return full ? "part or all of the range is already registered"
                    : "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED:
        return full ? "pointer does not correspond to a registered memory region"
                    : "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
    case CUDA_ERROR_LAUNCH_FAILED:
        return full ? "unspecified launch failure (fakecuda FAKECUDA_FAIL_COPY_BYTES)"
                    : "CUDA_ERROR_LAUNCH_FAILED";
    default: return NULL;
    }
}

EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = names(e, 0);
    return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = names(e, 1);
    return *s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDeviceGetCount(int *n) {
    NEED_INIT;
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = F.ndev;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    NEED_INIT;
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= F.ndev) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    NEED_INIT;
    if (!name || len < 1) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= F.ndev) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "fakecuda %d (host-memory stand-in, not a GPU)", d);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    NEED_INIT;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= F.ndev) return CUDA_ERROR_INVALID_DEVICE;
    *c = &F.ctx[d];
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    NEED_INIT;
    if (c && (c < &F.ctx[0] || c >= &F.ctx[MAX_DEV])) return CUDA_ERROR_INVALID_CONTEXT;
    tl_ctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *c) {
    NEED_INIT;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = tl_ctx;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------- device memory */

static uint64_t va_take(uint64_t len) {
    uint64_t l = (len + VA_ALIGN - 1) & ~(VA_ALIGN - 1), at;
    if (F.va_next + l > (uintptr_t)F.va + VA_SIZE) return 0;
    at = F.va_next;
    F.va_next += l;
    return at;
}

/* The allocation holding [p, p+n), or NULL. Caller holds F.mu. */
static alloc_rec *find_alloc(uint64_t p, uint64_t n) {
    for (alloc_rec *a = F.allocs; a; a = a->next)
        if (p >= a->dptr && p < a->dptr + a->len) return p + n <= a->dptr + a->len ? a : NULL;
    return NULL;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    NEED_CTX;
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("fakecuda-device", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)bytes) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint8_t *h = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    alloc_rec *a = calloc(1, sizeof *a);
    if (h == MAP_FAILED || !a) {
        if (h != MAP_FAILED) munmap(h, bytes);
        free(a);
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&F.mu);
    a->dptr = va_take(bytes);
    a->len = bytes;
    a->host = h;
    a->fd = fd;
    a->dev = tl_ctx->dev;
    a->id = ++F.next_id;
    if (a->dptr) {
        a->next = F.allocs;
        F.allocs = a;
    }
    pthread_mutex_unlock(&F.mu);
    if (!a->dptr) {
        munmap(h, bytes);
        close(fd);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = a->dptr;
    return CUDA_SUCCESS;
}

static void alloc_drop(alloc_rec *a) {
    munmap(a->host, a->len);
    if (a->fd >= 0) close(a->fd);
    free(a);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    NEED_CTX;
    pthread_mutex_lock(&F.mu);
    alloc_rec *hit = NULL;
    for (alloc_rec **pp = &F.allocs; *pp; pp = &(*pp)->next)
        if ((*pp)->dptr == p && !(*pp)->imported) {
            hit = *pp;
            *pp = hit->next;
            break;
        }
    pthread_mutex_unlock(&F.mu);
    if (!hit) return CUDA_ERROR_INVALID_VALUE;
    alloc_drop(hit);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    NEED_CTX;
    pthread_mutex_lock(&F.mu);
    alloc_rec *a = find_alloc(p, 1);
    if (a) {
        if (base) *base = a->dptr;
        if (size) *size = a->len;
    }
    pthread_mutex_unlock(&F.mu);
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* --------------------------------------------------------- pinned memory */

static pinned_rec *find_pinned(const void *p) {
    for (pinned_rec *r = F.pinned; r; r = r->next)
        if ((const uint8_t *)p >= r->p && (const uint8_t *)p < r->p + r->len) return r;
    return NULL;
}

EXPORT CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned flags) {
    (void)flags;
    NEED_CTX;
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pinned_rec *r = calloc(1, sizeof *r);
    if (m == MAP_FAILED || !r) {
        if (m != MAP_FAILED) munmap(m, bytes);
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->p = m;
    r->len = bytes;
    r->allocated = 1;
    pthread_mutex_lock(&F.mu);
    r->next = F.pinned;
    F.pinned = r;
    pthread_mutex_unlock(&F.mu);
    *p = m;
    return CUDA_SUCCESS;
}

static pinned_rec *unlink_pinned(void *p, int allocated) {
    pinned_rec *hit = NULL;
    pthread_mutex_lock(&F.mu);
    for (pinned_rec **pp = &F.pinned; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p && (*pp)->allocated == allocated) {
            hit = *pp;
            *pp = hit->next;
            break;
        }
    pthread_mutex_unlock(&F.mu);
    return hit;
}

EXPORT CUresult cuMemFreeHost(void *p) {
    NEED_CTX;
    pinned_rec *r = unlink_pinned(p, 1);
    if (!r) return CUDA_ERROR_INVALID_VALUE;
    munmap(r->p, r->len);
    free(r);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytes, unsigned flags) {
    (void)flags;
    NEED_CTX;
    if (!p || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    pinned_rec *r = calloc(1, sizeof *r);
    if (!r) return CUDA_ERROR_OUT_OF_MEMORY;
    r->p = p;
    r->len = bytes;
    pthread_mutex_lock(&F.mu);
    for (pinned_rec *o = F.pinned; o; o = o->next)
        if (o->p < (uint8_t *)p + bytes && (uint8_t *)p < o->p + o->len) {
            pthread_mutex_unlock(&F.mu);
            free(r);
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
    r->next = F.pinned;
    F.pinned = r;
    pthread_mutex_unlock(&F.mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemHostUnregister(void *p) {
    NEED_CTX;
    pinned_rec *r = unlink_pinned(p, 0);
    if (!r) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    free(r);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    NEED_INIT;
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&F.mu);
    alloc_rec *a = find_alloc(p, 1);
    pinned_rec *r = a ? NULL : find_pinned((void *)(uintptr_t)p);
    int dev = a ? a->dev : 0;
    pthread_mutex_unlock(&F.mu);
    if (!a && !r) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
        *(unsigned *)data = a ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        return CUDA_SUCCESS;
    }
    if (attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
        *(int *)data = dev;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------ streams, copies */

static void *stream_main(void *arg) {
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (!s->head) break;
        op *o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        if (o->kind == 0) {
            sched_yield(); /* let a caller that forgot to wait run ahead */
            memmove(o->dst, o->src, o->n);
        } else {
            pthread_mutex_lock(&o->ev->mu);
            if (o->seq > o->ev->done) o->ev->done = o->seq;
            pthread_cond_broadcast(&o->ev->cv);
            pthread_mutex_unlock(&o->ev->mu);
        }
        free(o);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

EXPORT CUresult cuStreamCreate(CUstream *out, unsigned flags) {
    (void)flags;
    NEED_CTX;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, stream_main, s) != 0) {
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = s;
    return CUDA_SUCCESS;
}

static void stream_drain(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    while (s->head || s->busy) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

EXPORT CUresult cuStreamSynchronize(CUstream s) {
    NEED_CTX;
    if (s) stream_drain(s);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    NEED_INIT;
    if (!s) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL); /* runs what is queued first */
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return CUDA_SUCCESS;
}

static void enqueue(struct CUstream_st *s, op *o) {
    pthread_mutex_lock(&s->mu);
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Host address of [p, p+n): the backing of a device range, or p itself. */
static uint8_t *translate(CUdeviceptr p, size_t n, int *bad) {
    pthread_mutex_lock(&F.mu);
    uint8_t *h = (uint8_t *)(uintptr_t)p;
    if (p >= (uintptr_t)F.va && p < (uintptr_t)F.va + VA_SIZE) {
        alloc_rec *a = find_alloc(p, n);
        if (a)
            h = a->host + (p - a->dptr);
        else
            *bad = 1;
    }
    pthread_mutex_unlock(&F.mu);
    return h;
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
    NEED_CTX;
    if (n == 0) return CUDA_SUCCESS;
    int bad = 0;
    uint8_t *d = translate(dst, n, &bad);
    const uint8_t *sp = translate(src, n, &bad);
    if (bad || !d || !sp) return CUDA_ERROR_INVALID_VALUE;
    if (F.fail_bytes >= 0 && (long)n == F.fail_bytes) return CUDA_ERROR_LAUNCH_FAILED;
    if (!s) {
        memmove(d, sp, n);
        return CUDA_SUCCESS;
    }
    op *o = calloc(1, sizeof *o);
    if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
    o->dst = d;
    o->src = sp;
    o->n = n;
    enqueue(s, o);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(CUevent *out, unsigned flags) {
    (void)flags;
    NEED_CTX;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    *out = e;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent e) {
    NEED_INIT;
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    NEED_CTX;
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->mu);
    uint64_t seq = ++e->recorded;
    if (!s) e->done = seq;
    pthread_mutex_unlock(&e->mu);
    if (!s) return CUDA_SUCCESS;
    op *o = calloc(1, sizeof *o);
    if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
    o->kind = 1;
    o->ev = e;
    o->seq = seq;
    enqueue(s, o);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent e) {
    NEED_CTX;
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&e->mu);
    while (e->done < e->recorded) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ IPC */

typedef struct fake_handle {
    uint64_t magic, id, len;
    int32_t pid, dev;
    char sock[32];
} fake_handle;
_Static_assert(sizeof(fake_handle) <= CU_IPC_HANDLE_SIZE, "a fake handle fits CUipcMemHandle");

/* Serves memfds of this process's allocations: a peer sends an id (u64),
 * gets back one byte and the fd, or nothing (closed) if unknown. */
static void *server_main(void *arg) {
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            break;
        }
        uint64_t id = 0;
        if (recv(c, &id, sizeof id, MSG_WAITALL) == (ssize_t)sizeof id) {
            int fd = -1;
            pthread_mutex_lock(&F.mu);
            for (alloc_rec *a = F.allocs; a; a = a->next)
                if (a->id == id && !a->imported) fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
            pthread_mutex_unlock(&F.mu);
            if (fd >= 0) {
                char b = 1;
                struct iovec iov = {.iov_base = &b, .iov_len = 1};
                union {
                    char buf[CMSG_SPACE(sizeof(int))];
                    struct cmsghdr align;
                } cb;
                memset(&cb, 0, sizeof cb);
                struct msghdr m = {.msg_iov = &iov,
                                   .msg_iovlen = 1,
                                   .msg_control = cb.buf,
                                   .msg_controllen = sizeof cb.buf};
                struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
                cm->cmsg_level = SOL_SOCKET;
                cm->cmsg_type = SCM_RIGHTS;
                cm->cmsg_len = CMSG_LEN(sizeof(int));
                memcpy(CMSG_DATA(cm), &fd, sizeof fd);
                sendmsg(c, &m, MSG_NOSIGNAL);
                close(fd);
            }
        }
        close(c);
    }
    close(lfd);
    return NULL;
}

static void abstract_addr(const char *name, struct sockaddr_un *sa, socklen_t *len) {
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    size_t n = strlen(name);
    memcpy(sa->sun_path + 1, name, n);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

/* Starts the fd server once. Caller holds F.mu. */
static int server_start(void) {
    if (F.server_started) return 0;
    snprintf(F.server_name, sizeof F.server_name, "fcu-%d-%08x", (int)getpid(),
             (unsigned)(((uintptr_t)&F >> 12) ^ (uintptr_t)F.va));
    struct sockaddr_un sa;
    socklen_t sl;
    abstract_addr(F.server_name, &sa, &sl);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0) return -1;
    if (bind(lfd, (struct sockaddr *)&sa, sl) != 0 || listen(lfd, 64) != 0) {
        close(lfd);
        return -1;
    }
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &at, server_main, (void *)(intptr_t)lfd);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        close(lfd);
        return -1;
    }
    F.server_started = 1;
    return 0;
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    NEED_CTX;
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&F.mu);
    alloc_rec *a = find_alloc(p, 1);
    if (!a || a->dptr != p || a->imported || server_start() != 0) {
        pthread_mutex_unlock(&F.mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fake_handle fh = {
        .magic = HANDLE_MAGIC, .id = a->id, .len = a->len, .pid = getpid(), .dev = a->dev};
    snprintf(fh.sock, sizeof fh.sock, "%s", F.server_name);
    pthread_mutex_unlock(&F.mu);
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &fh, sizeof fh);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned flags) {
    (void)flags;
    NEED_CTX;
    fake_handle fh;
    memcpy(&fh, h.reserved, sizeof fh);
    if (!p || fh.magic != HANDLE_MAGIC || fh.len == 0) return CUDA_ERROR_INVALID_VALUE;
    if (fh.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* as the driver does */
    pthread_mutex_lock(&F.mu);
    for (alloc_rec *a = F.allocs; a; a = a->next)
        if (a->imported && a->id == fh.id && a->fd == -1 - fh.pid) {
            pthread_mutex_unlock(&F.mu);
            return CUDA_ERROR_ALREADY_MAPPED;
        }
    pthread_mutex_unlock(&F.mu);
    fh.sock[sizeof fh.sock - 1] = '\0';
    struct sockaddr_un sa;
    socklen_t sl;
    abstract_addr(fh.sock, &sa, &sl);
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = -1;
    if (connect(c, (struct sockaddr *)&sa, sl) == 0 &&
        send(c, &fh.id, sizeof fh.id, MSG_NOSIGNAL) == (ssize_t)sizeof fh.id) {
        char b;
        struct iovec iov = {.iov_base = &b, .iov_len = 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } cb;
        struct msghdr m = {.msg_iov = &iov,
                           .msg_iovlen = 1,
                           .msg_control = cb.buf,
                           .msg_controllen = sizeof cb.buf};
        if (recvmsg(c, &m, MSG_CMSG_CLOEXEC) == 1) {
            struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
            if (cm && cm->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(cm), sizeof fd);
        }
    }
    close(c);
    if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
    uint8_t *host = mmap(NULL, fh.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    alloc_rec *a = calloc(1, sizeof *a);
    if (host == MAP_FAILED || !a) {
        if (host != MAP_FAILED) munmap(host, fh.len);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&F.mu);
    a->dptr = va_take(fh.len);
    a->len = fh.len;
    a->host = host;
    a->fd = -1 - fh.pid; /* imported: no fd of ours; remembers the exporter */
    a->dev = tl_ctx->dev;
    a->id = fh.id;
    a->imported = 1;
    if (a->dptr) {
        a->next = F.allocs;
        F.allocs = a;
    }
    pthread_mutex_unlock(&F.mu);
    if (!a->dptr) {
        munmap(host, fh.len);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = a->dptr;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    NEED_CTX;
    pthread_mutex_lock(&F.mu);
    alloc_rec *hit = NULL;
    for (alloc_rec **pp = &F.allocs; *pp; pp = &(*pp)->next)
        if ((*pp)->dptr == p && (*pp)->imported) {
            hit = *pp;
            *pp = hit->next;
            break;
        }
    pthread_mutex_unlock(&F.mu);
    if (!hit) return CUDA_ERROR_INVALID_VALUE;
    hit->fd = -1;
    alloc_drop(hit);
    return CUDA_SUCCESS;
}
