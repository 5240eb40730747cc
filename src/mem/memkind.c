/*
 * memkind — the public memory-kind calls (ect_mem_*, ect_cuda_get_info)
 * over mem/cuda.c, and the pinned staging buffers transports borrow to send
 * a device source (mem/memkind.h).
 *
 * Staging buffers are pinned (cuMemHostAlloc) because a device-to-host copy
 * into pageable memory runs at a fraction of the bus speed. Pinning costs
 * milliseconds per allocation, so buffers are kept for reuse: a request
 * takes the smallest cached buffer that fits, or allocates one rounded up to
 * 2 MiB; up to STAGE_CACHE_MAX bytes of returned buffers stay cached.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "mem/cuda.h"
#include "mem/memkind.h"
#include "util/util.h"

#define STAGE_CACHE_MAX (UINT64_C(512) << 20)
#define STAGE_ROUND (UINT64_C(2) << 20)

const char *ect_mem_kind_name(int kind) {
    switch (kind) {
    case ECT_MEM_AUTO: return "auto";
    case ECT_MEM_HOST: return "host";
    case ECT_MEM_PINNED: return "pinned";
    case ECT_MEM_CUDA: return "cuda";
    default: return "?";
    }
}

int ect_mem_parse_device(const char *spec, int *kind, int *device) {
    int k = ECT_MEM_HOST, d = 0;
    if (!spec || !*spec || strcmp(spec, "cpu") == 0 || strcmp(spec, "host") == 0) {
        k = ECT_MEM_HOST;
    } else if (strcmp(spec, "pinned") == 0) {
        k = ECT_MEM_PINNED;
    } else if (strcmp(spec, "cuda") == 0) {
        k = ECT_MEM_CUDA;
    } else if (strncmp(spec, "cuda:", 5) == 0 && spec[5] >= '0' && spec[5] <= '9') {
        char *end = NULL;
        long v = strtol(spec + 5, &end, 10);
        if (*end || v < 0 || v > 1023)
            return ect_set_error(ECT_EINVAL, "device '%.40s': the ordinal must be 0..1023", spec);
        k = ECT_MEM_CUDA;
        d = (int)v;
    } else {
        return ect_set_error(ECT_EINVAL,
                             "device '%.40s' is not one of cpu, host, pinned, cuda, cuda:N", spec);
    }
    if (kind) *kind = k;
    if (device) *device = d;
    return 0;
}

int ect_cuda_get_info(ect_cuda_info *info) { return cuda_get_info(info); }

void ect_mem_kind_of(const void *ptr, int *kind, int *device) {
    int k, d;
    cuda_ptr_kind(ptr, &k, &d);
    if (kind) *kind = k;
    if (device) *device = d;
}

int ect_mem_alloc(int kind, int device, uint64_t nbytes, void **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "ect_mem_alloc: out is NULL");
    *out = NULL;
    if (nbytes == 0) return ect_set_error(ECT_EINVAL, "ect_mem_alloc: nbytes is 0");
    if (nbytes > SIZE_MAX / 2)
        return ect_set_error(ECT_EINVAL, "ect_mem_alloc: nbytes is too large");
    switch (kind) {
    case ECT_MEM_HOST:
        if (!(*out = malloc((size_t)nbytes)))
            return ect_set_error(ECT_ENOMEM, "ect_mem_alloc: %llu host bytes",
                                 (unsigned long long)nbytes);
        return 0;
    case ECT_MEM_PINNED: return cuda_host_alloc(nbytes, out);
    case ECT_MEM_CUDA: {
        int rc = cuda_check_device(device);
        return rc ? rc : cuda_dev_alloc(device, nbytes, out);
    }
    default: return ect_set_error(ECT_EINVAL, "ect_mem_alloc: kind %d is not a memory kind", kind);
    }
}

void ect_mem_free(int kind, void *ptr) {
    if (!ptr) return;
    if (kind == ECT_MEM_PINNED)
        cuda_host_free(ptr);
    else if (kind == ECT_MEM_CUDA)
        cuda_dev_free(ptr);
    else
        free(ptr);
}

int ect_mem_copy(void *dst, const void *src, uint64_t nbytes) {
    if (nbytes == 0) return 0;
    if (!dst || !src) return ect_set_error(ECT_EINVAL, "ect_mem_copy: NULL pointer");
    int dk, dd, sk, sd;
    cuda_ptr_kind(dst, &dk, &dd);
    cuda_ptr_kind(src, &sk, &sd);
    if (dk != ECT_MEM_CUDA && sk != ECT_MEM_CUDA) {
        memcpy(dst, src, (size_t)nbytes);
        return 0;
    }
    return cuda_copy(dst, src, nbytes, dk == ECT_MEM_CUDA ? dd : sd);
}

bool mem_is_device(const void *ptr, int *device) {
    if (!cuda_active()) return false;
    int k, d;
    cuda_ptr_kind(ptr, &k, &d);
    if (device) *device = d;
    return k == ECT_MEM_CUDA;
}

/* ------------------------------------------------------- staging buffers */

typedef struct stage_buf {
    void *p;
    uint64_t cap;
    struct stage_buf *next;
} stage_buf;

static struct {
    pthread_mutex_t mu;
    stage_buf *free;
    uint64_t cached;
} st = {.mu = PTHREAD_MUTEX_INITIALIZER};

int mem_stage_get(uint64_t n, void **buf, uint64_t *cap) {
    *buf = NULL;
    *cap = 0;
    stage_buf *best = NULL, **bestp = NULL;
    pthread_mutex_lock(&st.mu);
    for (stage_buf **pp = &st.free; *pp; pp = &(*pp)->next)
        if ((*pp)->cap >= n && (!best || (*pp)->cap < best->cap)) {
            best = *pp;
            bestp = pp;
        }
    if (best) {
        *bestp = best->next;
        st.cached -= best->cap;
    }
    pthread_mutex_unlock(&st.mu);
    if (best) {
        *buf = best->p;
        *cap = best->cap;
        free(best);
        return 0;
    }
    uint64_t c = (n + STAGE_ROUND - 1) / STAGE_ROUND * STAGE_ROUND;
    int rc = cuda_host_alloc(c, buf);
    if (rc) return rc;
    *cap = c;
    return 0;
}

void mem_stage_put(void *buf, uint64_t cap) {
    if (!buf) return;
    stage_buf *b = malloc(sizeof *b);
    pthread_mutex_lock(&st.mu);
    if (b && st.cached + cap <= STAGE_CACHE_MAX) {
        b->p = buf;
        b->cap = cap;
        b->next = st.free;
        st.free = b;
        st.cached += cap;
        buf = NULL;
        b = NULL;
    }
    pthread_mutex_unlock(&st.mu);
    free(b);
    if (buf) cuda_host_free(buf);
}
