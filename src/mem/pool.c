/*
 * pool — one memory region, its allocator and its resident cache, behind one
 * mutex (see the public header for the contract).
 *
 * The region is mapped in two steps so its base lands on a 2 MiB boundary
 * whatever backs it: first an inaccessible reservation 2 MiB longer than
 * needed, then the real mapping (anonymous, anonymous huge pages, or the
 * memfd) fixed at the first aligned address inside it, then the unused head
 * and tail of the reservation are unmapped. The aligned base lets huge pages
 * back the region and lets transports and peers compute addresses without
 * surprises.
 *
 * A memfd region is sealed against shrinking and growing once sized, so a
 * peer that holds the fd can never truncate it under us (which would turn our
 * own accesses into SIGBUS).
 *
 * Other kinds (see the public header): a CUDA pool is one cuMemAlloc of the
 * same rounded length, whose base the host never dereferences (the allocator
 * and resident cache only do arithmetic on offsets); a pinned pool is an
 * ordinary region registered with the driver; an external pool carves
 * caller-owned memory and never frees it.
 *
 * Reclaim callbacks are collected under the mutex and delivered after it is
 * released, so an owner may take its own locks or call back into the pool
 * from the callback without deadlocking against another thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mem/alloc.h"
#include "mem/cuda.h"
#include "mem/pool.h"
#include "mem/resident.h"
#include "util/util.h"

#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << 26)
#endif
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21 << 26)
#endif

#define DEFAULT_CAPACITY UINT64_C(1000000000)

struct ect_pool {
    pthread_mutex_t mu;
    alloc *a;
    resident_cache *res;
    void *base;
    uint64_t capacity; /* usable bytes */
    uint64_t map_len;
    int fd;
    int huge, locked;
    int kind, device;
    bool external;   /* base belongs to the caller */
    bool registered; /* we registered it with CUDA (pinned) */
    ect_pool_reclaim_fn on_reclaim;
    void *reclaim_user;
};

void ect_pool_opts_init(ect_pool_opts *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->capacity = DEFAULT_CAPACITY;
    o->alignment = ALLOC_DEFAULT_ALIGNMENT;
}

/* Creates the memfd (mode 0600, sized map_len); *huge is cleared on fallback. */
static int open_memfd(uint64_t map_len, int *huge) {
    int fd = -1;
    if (*huge) {
        fd = memfd_create("ectransfer-pool",
                          MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB | MFD_HUGE_2MB);
        if (fd < 0) {
            ECT_LOGW("pool", "huge pages refused for the memfd (%s): using normal pages",
                     strerror(errno));
            *huge = 0;
        }
    }
    if (fd < 0) fd = memfd_create("ectransfer-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return ect_set_errno(errno, "memfd_create for the pool");
    if (fchmod(fd, 0600) != 0) {
        int e = errno;
        close(fd);
        return ect_set_errno(e, "chmod 0600 of the pool's memfd");
    }
    if (ftruncate(fd, (off_t)map_len) != 0) {
        int e = errno;
        close(fd);
        return ect_set_errno(e, "sizing the pool's memfd to %llu bytes",
                             (unsigned long long)map_len);
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        ECT_LOGD("pool", "could not seal the pool's memfd: %s", strerror(errno));
    return fd;
}

/* Maps map_len bytes at a 2 MiB aligned address into p->base. */
static int map_region(ect_pool *p, int want_huge) {
    uint64_t reserve_len = p->map_len + POOL_BASE_ALIGN;
    void *raw =
        mmap(NULL, reserve_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return ect_set_errno(errno, "reserving %llu bytes of address space for the pool",
                             (unsigned long long)reserve_len);
    uintptr_t aligned = ((uintptr_t)raw + POOL_BASE_ALIGN - 1) & ~(uintptr_t)(POOL_BASE_ALIGN - 1);
    void *at = (void *)aligned, *m = MAP_FAILED;
    int prot = PROT_READ | PROT_WRITE;
    if (p->fd >= 0) {
        m = mmap(at, p->map_len, prot, MAP_SHARED | MAP_FIXED, p->fd, 0);
    } else {
        if (want_huge) {
            m = mmap(at, p->map_len, prot,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_HUGETLB | MAP_HUGE_2MB, -1, 0);
            if (m == MAP_FAILED) {
                ECT_LOGW("pool", "huge pages refused (%s): using normal pages", strerror(errno));
                p->huge = 0;
            }
        }
        if (m == MAP_FAILED)
            m = mmap(at, p->map_len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    }
    if (m == MAP_FAILED) {
        int e = errno;
        munmap(raw, reserve_len);
        return ect_set_errno(e, "mapping the pool's %llu bytes", (unsigned long long)p->map_len);
    }
    size_t head = (size_t)(aligned - (uintptr_t)raw);
    size_t tail = (size_t)(reserve_len - head - p->map_len);
    if (head) munmap(raw, head);
    if (tail) munmap((char *)m + p->map_len, tail);
    p->base = m;
    return 0;
}

/* An external region (any kind) or a CUDA one. */
static int open_other(ect_pool *p, const ect_pool_opts *opts) {
    if (opts->external) {
        p->base = opts->external;
        p->external = true;
        p->map_len = p->capacity;
        int k, d;
        cuda_ptr_kind(p->base, &k, &d);
        if ((p->kind == ECT_MEM_CUDA) != (k == ECT_MEM_CUDA))
            return ect_set_error(ECT_EINVAL, "opts.external %p is %s memory, not %s", p->base,
                                 k == ECT_MEM_CUDA ? "CUDA device" : "host",
                                 ect_mem_kind_name(p->kind));
        if (p->kind == ECT_MEM_CUDA) p->device = d;
        if (p->kind == ECT_MEM_PINNED) {
            bool already;
            int rc = cuda_host_register(p->base, p->map_len, &already);
            if (rc) return rc;
            p->registered = !already;
        }
        return 0;
    }
    return cuda_dev_alloc(p->device, p->map_len, &p->base);
}

/* Gives the region back however it was obtained. */
static void release_region(ect_pool *p) {
    if (!p->base) return;
    if (p->registered) cuda_host_unregister(p->base);
    p->registered = false;
    if (p->external) return;
    if (p->kind == ECT_MEM_CUDA) {
        cuda_dev_free(p->base);
        return;
    }
    if (p->locked) munlock(p->base, p->map_len);
    munmap(p->base, p->map_len);
}

int ect_pool_open(const ect_pool_opts *opts, ect_pool **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "out must not be NULL");
    *out = NULL;
    ect_pool_opts def;
    if (!opts) {
        ect_pool_opts_init(&def);
        opts = &def;
    }
    int kind = opts->mem_kind;
    if (kind != ECT_MEM_HOST && kind != ECT_MEM_PINNED && kind != ECT_MEM_CUDA)
        return ect_set_error(ECT_EINVAL, "opts.mem_kind %d: must be ECT_MEM_HOST, _PINNED or _CUDA",
                             kind);
    if ((kind == ECT_MEM_CUDA || opts->external) &&
        (opts->use_memfd || opts->huge_pages || opts->mlock))
        return ect_set_error(ECT_EINVAL, "opts.use_memfd, huge_pages and mlock must be 0 for %s",
                             opts->external ? "external memory" : "a CUDA pool");
    if (opts->external && opts->alignment && ((uintptr_t)opts->external % opts->alignment))
        return ect_set_error(ECT_EINVAL, "opts.external %p is not aligned to %llu bytes",
                             opts->external, (unsigned long long)opts->alignment);
    if (kind != ECT_MEM_HOST) {
        int rc = kind == ECT_MEM_CUDA ? cuda_check_device(opts->device) : cuda_load();
        if (rc) return ect_set_error(rc, "%s pool: %s", ect_mem_kind_name(kind), ect_last_error());
    }
    ect_pool *p = calloc(1, sizeof *p);
    if (!p) return ect_set_error(ECT_ENOMEM, "pool: out of memory");
    p->fd = -1;
    p->kind = kind;
    p->device = kind == ECT_MEM_CUDA ? opts->device : 0;
    int rc = alloc_create(opts->capacity, opts->alignment, &p->a);
    if (rc) goto fail;
    rc = resident_create(p->a, &p->res);
    if (rc) goto fail;
    alloc_stats st;
    alloc_get_stats(p->a, &st);
    p->capacity = st.capacity;
    p->map_len = (st.capacity + POOL_BASE_ALIGN - 1) & ~(POOL_BASE_ALIGN - 1);
    if (opts->external || kind == ECT_MEM_CUDA) {
        rc = open_other(p, opts);
        if (rc) goto fail;
        goto opened;
    }
    p->huge = opts->huge_pages ? 1 : 0;
    if (opts->use_memfd) {
        int fd = open_memfd(p->map_len, &p->huge);
        if (fd < 0) {
            rc = fd;
            goto fail;
        }
        p->fd = fd;
    }
    rc = map_region(p, p->huge);
    if (rc && p->fd >= 0 && p->huge) {
        /* A hugetlb memfd is only refused when it is mapped (no huge pages free). */
        ECT_LOGW("pool", "huge pages refused (%s): using normal pages", ect_last_error());
        close(p->fd);
        p->fd = -1;
        p->huge = 0;
        int fd = open_memfd(p->map_len, &p->huge);
        if (fd < 0) {
            rc = fd;
            goto fail;
        }
        p->fd = fd;
        rc = map_region(p, 0);
    }
    if (rc) goto fail;
    if (opts->huge_pages && !p->huge) madvise(p->base, p->map_len, MADV_HUGEPAGE);
    if (opts->mlock) {
        if (mlock(p->base, p->map_len) == 0)
            p->locked = 1;
        else
            ECT_LOGW("pool", "mlock of %llu bytes refused (%s): the pool is not pinned",
                     (unsigned long long)p->map_len, strerror(errno));
    }
    if (kind == ECT_MEM_PINNED) {
        bool already;
        if ((rc = cuda_host_register(p->base, p->map_len, &already))) goto fail;
        p->registered = !already;
    }
opened:
    rc = pthread_mutex_init(&p->mu, NULL);
    if (rc) {
        rc = ect_set_errno(rc, "pool mutex");
        goto fail;
    }
    p->on_reclaim = opts->on_reclaim;
    p->reclaim_user = opts->reclaim_user;
    ECT_LOGD("pool", "opened %llu %s bytes at %p (fd %d, huge %d, locked %d%s)",
             (unsigned long long)p->capacity, ect_mem_kind_name(p->kind), p->base, p->fd, p->huge,
             p->locked, p->external ? ", external" : "");
    *out = p;
    return 0;
fail:
    release_region(p);
    if (p->fd >= 0) close(p->fd);
    resident_destroy(p->res);
    alloc_destroy(p->a);
    free(p);
    return rc;
}

void ect_pool_close(ect_pool *p) {
    if (!p) return;
    release_region(p);
    if (p->fd >= 0) close(p->fd);
    resident_destroy(p->res);
    alloc_destroy(p->a);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

void *ect_pool_base(const ect_pool *p) { return p ? p->base : NULL; }
uint64_t ect_pool_capacity(const ect_pool *p) { return p ? p->capacity : 0; }
int ect_pool_fd(const ect_pool *p) { return p ? p->fd : -1; }
int pool_pin(ect_pool *p) {
    pthread_mutex_lock(&p->mu);
    int rc = 0;
    if (p->kind == ECT_MEM_HOST && !p->external) {
        bool already;
        rc = cuda_host_register(p->base, p->map_len, &already);
        if (!rc) {
            __atomic_store_n(&p->kind, ECT_MEM_PINNED, __ATOMIC_RELAXED);
            p->registered = !already;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int ect_pool_mem_kind(const ect_pool *p) {
    if (!p) return ECT_MEM_HOST;
    return __atomic_load_n(&p->kind, __ATOMIC_RELAXED);
}
int ect_pool_device(const ect_pool *p) { return p ? p->device : 0; }
uint64_t pool_map_length(const ect_pool *p) { return p ? p->map_len : 0; }

/* Hands the victims to the owner's callback (mutex not held), keeping the
 * caller's error detail intact across the callbacks. */
static void deliver(ect_pool *p, resident_victim *v, size_t n, int rc) {
    if (n && p->on_reclaim) {
        char saved[512];
        snprintf(saved, sizeof saved, "%s", ect_last_error());
        for (size_t i = 0; i < n; i++)
            p->on_reclaim(p->reclaim_user, v[i].mm_hash, v[i].offset, v[i].nbytes);
        if (rc) ect_set_error(rc, "%s", saved);
    }
    free(v);
}

static int full_error(ect_pool *p, uint64_t nbytes) {
    alloc_stats as;
    resident_stats rs;
    alloc_get_stats(p->a, &as);
    resident_get_stats(p->res, &rs);
    return ect_set_error(ECT_EFULL,
                         "pool is full: %llu bytes requested; %llu of %llu bytes free (largest "
                         "block %llu) after reclaim; %llu resident items hold %llu bytes, %llu "
                         "of them leased",
                         (unsigned long long)nbytes, (unsigned long long)as.free,
                         (unsigned long long)as.capacity, (unsigned long long)as.largest_free,
                         (unsigned long long)rs.count, (unsigned long long)rs.bytes,
                         (unsigned long long)rs.leased);
}

/* The unleased resident items could make room for nbytes (reclaim would try). */
static bool reclaim_could_help(const ect_pool *p) {
    resident_stats rs;
    resident_get_stats(p->res, &rs);
    return rs.count > rs.leased;
}

/* ect_pool_alloc and pool_try_alloc (quiet: a full pool sets no text). */
static int pool_alloc_any(ect_pool *p, uint64_t nbytes, uint64_t *offset, bool quiet) {
    if (!p || !offset) return ect_set_error(ECT_EINVAL, "pool and offset must not be NULL");
    if (nbytes == 0) return ect_set_error(ECT_EINVAL, "nbytes must be greater than 0");
    resident_victim *v = NULL;
    size_t nv = 0;
    pthread_mutex_lock(&p->mu);
    bool fits = !quiet || alloc_fits(p->a, nbytes);
    int rc = fits ? alloc_alloc(p->a, nbytes, offset) : ECT_EFULL;
    if (rc == ECT_EFULL && (!quiet || reclaim_could_help(p))) {
        rc = resident_reclaim(p->res, nbytes, &v, &nv);
        if (rc == 0) rc = alloc_alloc(p->a, nbytes, offset);
    }
    if (rc == ECT_EFULL && !quiet) full_error(p, nbytes);
    pthread_mutex_unlock(&p->mu);
    deliver(p, v, nv, rc);
    return rc;
}

int ect_pool_alloc(ect_pool *p, uint64_t nbytes, uint64_t *offset) {
    return pool_alloc_any(p, nbytes, offset, false);
}

int pool_try_alloc(ect_pool *p, uint64_t nbytes, uint64_t *offset) {
    return pool_alloc_any(p, nbytes, offset, true);
}

int ect_pool_reclaim(ect_pool *p, uint64_t nbytes) {
    if (!p) return ect_set_error(ECT_EINVAL, "pool must not be NULL");
    if (nbytes == 0) return ect_set_error(ECT_EINVAL, "nbytes must be greater than 0");
    resident_victim *v = NULL;
    size_t nv = 0;
    pthread_mutex_lock(&p->mu);
    int rc = resident_reclaim(p->res, nbytes, &v, &nv);
    if (rc == ECT_EFULL) full_error(p, nbytes);
    pthread_mutex_unlock(&p->mu);
    deliver(p, v, nv, rc);
    return rc;
}

int ect_pool_free(ect_pool *p, uint64_t offset) {
    if (!p) return ect_set_error(ECT_EINVAL, "pool must not be NULL");
    pthread_mutex_lock(&p->mu);
    int rc;
    const char *owner = resident_owner(p->res, offset);
    if (owner)
        rc = ect_set_error(ECT_EBUSY,
                           "offset %llu belongs to resident item '%s' (use ect_pool_remove)",
                           (unsigned long long)offset, owner);
    else
        rc = alloc_free(p->a, offset);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void ect_pool_stats(ect_pool *p, ect_pool_stat *st) {
    if (!p || !st) return;
    memset(st, 0, sizeof *st);
    alloc_stats as;
    resident_stats rs;
    pthread_mutex_lock(&p->mu);
    alloc_get_stats(p->a, &as);
    resident_get_stats(p->res, &rs);
    pthread_mutex_unlock(&p->mu);
    st->capacity = as.capacity;
    st->alignment = as.alignment;
    st->used = as.used;
    st->free = as.free;
    st->largest_free = as.largest_free;
    st->fragments = as.fragments;
    st->allocations = as.allocations;
    st->residents = rs.count;
    st->resident_bytes = rs.bytes;
    st->leased = rs.leased;
    st->reclaimed = rs.reclaimed;
    st->memfd = p->fd >= 0;
    st->huge_pages = p->huge;
    st->locked = p->locked;
    st->mem_kind = ect_pool_mem_kind(p);
    st->device = p->device;
}

int ect_pool_put(ect_pool *p, const char *mm_hash, uint64_t offset, uint64_t nbytes,
                 const uint64_t *shape, size_t ndim, const char *dtype, int lease) {
    if (!p) return ect_set_error(ECT_EINVAL, "pool must not be NULL");
    pthread_mutex_lock(&p->mu);
    int rc = resident_put(p->res, mm_hash, offset, nbytes, shape, ndim, dtype, lease != 0);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

static int get(ect_pool *p, const char *mm_hash, bool lease, bool quiet_miss,
               ect_resident_info *info) {
    if (!p) return ect_set_error(ECT_EINVAL, "pool must not be NULL");
    pthread_mutex_lock(&p->mu);
    int rc = quiet_miss ? resident_try_get(p->res, mm_hash, lease, info)
                        : resident_get(p->res, mm_hash, lease, info);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int ect_pool_acquire(ect_pool *p, const char *mm_hash, ect_resident_info *info) {
    return get(p, mm_hash, true, false, info);
}

int pool_try_acquire(ect_pool *p, const char *mm_hash, ect_resident_info *info) {
    return get(p, mm_hash, true, true, info);
}

int ect_pool_lookup(ect_pool *p, const char *mm_hash, ect_resident_info *info) {
    return get(p, mm_hash, false, false, info);
}

int ect_pool_release(ect_pool *p, const char *mm_hash) {
    if (!p) return ect_set_error(ECT_EINVAL, "pool must not be NULL");
    pthread_mutex_lock(&p->mu);
    int rc = resident_release(p->res, mm_hash);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void pool_set_veto(ect_pool *p, bool (*busy)(void *ctx, uint64_t offset, uint64_t nbytes),
                   void *ctx) {
    pthread_mutex_lock(&p->mu);
    resident_set_veto(p->res, busy, ctx);
    pthread_mutex_unlock(&p->mu);
}

void pool_each_resident(ect_pool *p, char *const *filter, size_t n_filter,
                        void (*fn)(void *ctx, const char *mm_hash, const ect_resident_info *info),
                        void *ctx) {
    pthread_mutex_lock(&p->mu);
    if (!n_filter) resident_each(p->res, fn, ctx);
    for (size_t i = 0; i < n_filter; i++) {
        ect_resident_info info;
        if (filter[i] && resident_peek(p->res, filter[i], &info) == 0) fn(ctx, filter[i], &info);
    }
    pthread_mutex_unlock(&p->mu);
}

int ect_pool_remove(ect_pool *p, const char *mm_hash) {
    if (!p) return ect_set_error(ECT_EINVAL, "pool must not be NULL");
    pthread_mutex_lock(&p->mu);
    int rc = resident_remove(p->res, mm_hash);
    pthread_mutex_unlock(&p->mu);
    return rc;
}
