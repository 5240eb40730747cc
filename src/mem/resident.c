/*
 * resident — see resident.h for the contract.
 *
 * Each entry sits in two hash tables (by mm_hash for lookups, by offset so a
 * pool can refuse to free memory an item owns) and in one doubly linked LRU
 * list whose head is the least recently used entry. Every use (put, get,
 * release) moves an entry to the tail; reclaim walks from the head and skips
 * leased entries, so a leased entry keeps its place and is considered again
 * once released (released entries move to the tail: the consumer just used
 * them).
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

/* A failed hash-table allocation must be an ECT_ENOMEM, never exit(): uthash
 * then rolls the add back and raises this flag. */
static _Thread_local int hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (hash_oom = 1)
#include <uthash.h>
#include <utlist.h>

#include "mem/resident.h"
#include "util/spares.h"
#include "util/util.h"
#include "wire/dtype.h"

typedef struct rentry {
    char mm_hash[ECT_MM_HASH_MAX + 1];
    uint64_t offset;
    uint64_t nbytes;     /* the item's bytes */
    uint64_t alloc_size; /* the allocation's (rounded) bytes */
    uint32_t ndim;
    uint64_t shape[ECT_POOL_MAX_NDIM];
    char dtype[ECT_POOL_DTYPE_MAX];
    uint32_t leases;
    void *user;            /* resident_bind */
    UT_hash_handle hh;     /* by mm_hash */
    UT_hash_handle hh_off; /* by offset */
    struct rentry *prev, *next;
} rentry;

struct resident_cache {
    alloc *a; /* NULL: the owner keeps the memory */
    bool (*busy)(void *ctx, uint64_t offset, uint64_t nbytes);
    void *busy_ctx;
    rentry *by_hash;
    rentry *by_off;
    rentry *lru; /* head = least recently used */
    uint64_t bytes, leased, unleased_bytes, reclaimed;
    uint64_t allocated; /* entries calloc'd */
    ect_spares spare;   /* freed entries kept for the next puts (at most SPARE_ENTRIES) */
};

/* Freed entries kept for reuse: a put per item then costs no malloc. The
 * spares never outnumber the entries once held at once: a shard with k
 * steps of n items resident reuses k x n entries a round (64 was a step
 * and a half at 32 items a step). */
#define SPARE_ENTRIES 1024

/* A zeroed entry, from the spares when there is one. */
static rentry *entry_new(resident_cache *c) {
    rentry *e = ect_spares_get(&c->spare);
    if (!e) {
        if ((e = calloc(1, sizeof *e))) c->allocated++;
        return e;
    }
    memset(e, 0, sizeof *e);
    return e;
}

/* e (in no table, on no list) goes to the spares or is freed. */
static void entry_free(resident_cache *c, rentry *e) { ect_spares_put(&c->spare, e); }

int resident_create(alloc *a, resident_cache **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return ect_set_error(ECT_ENOMEM, "resident cache: out of memory");
    (*out)->a = a;
    (*out)->spare = ECT_SPARES_INIT(rentry, next, SPARE_ENTRIES);
    return 0;
}

void resident_set_veto(resident_cache *c, bool (*busy)(void *ctx, uint64_t offset, uint64_t nbytes),
                       void *ctx) {
    c->busy = busy;
    c->busy_ctx = ctx;
}

void resident_destroy(resident_cache *c) {
    if (!c) return;
    rentry *e, *tmp;
    HASH_ITER(hh, c->by_hash, e, tmp) {
        HASH_DELETE(hh, c->by_hash, e);
        HASH_DELETE(hh_off, c->by_off, e);
        free(e);
    }
    ect_spares_clear(&c->spare);
    free(c);
}

static rentry *find(const resident_cache *c, const char *mm_hash) {
    rentry *e = NULL;
    HASH_FIND_STR(c->by_hash, mm_hash, e);
    return e;
}

static void touch(resident_cache *c, rentry *e) {
    DL_DELETE(c->lru, e);
    DL_APPEND(c->lru, e);
}

static int check_hash(const char *mm_hash) {
    if (!mm_hash || !mm_hash[0]) return ect_set_error(ECT_EINVAL, "mm_hash must not be empty");
    if (strnlen(mm_hash, ECT_MM_HASH_MAX + 1) > ECT_MM_HASH_MAX)
        return ect_set_error(ECT_EINVAL, "mm_hash is longer than %d bytes", ECT_MM_HASH_MAX);
    return 0;
}

int resident_put(resident_cache *c, const char *mm_hash, uint64_t offset, uint64_t nbytes,
                 const uint64_t *shape, size_t ndim, const char *dtype, bool lease) {
    int rc = check_hash(mm_hash);
    if (rc) return rc;
    if (!dtype) return ect_set_error(ECT_EINVAL, "dtype must not be NULL");
    if (strlen(dtype) >= ECT_POOL_DTYPE_MAX)
        return ect_set_error(ECT_EINVAL, "dtype '%.40s' is too long", dtype);
    if (ndim > 0 && !shape) return ect_set_error(ECT_EINVAL, "shape must not be NULL");
    if (nbytes == 0) return ect_set_error(ECT_EINVAL, "nbytes must be greater than 0");
    if (ndim > ECT_POOL_MAX_NDIM)
        return ect_set_error(ECT_EINVAL, "shape has %zu dimensions, at most %d", ndim,
                             ECT_POOL_MAX_NDIM);
    rc = c->a ? wire_check_nbytes(dtype, shape, ndim, nbytes, "nbytes") : 0;
    if (rc) return rc;
    uint64_t asize = c->a ? alloc_size_of(c->a, offset) : nbytes;
    if (asize == 0)
        return ect_set_error(ECT_ENOTFOUND, "offset %llu is not the start of an allocation",
                             (unsigned long long)offset);
    if (nbytes > asize)
        return ect_set_error(ECT_EINVAL, "nbytes %llu exceeds the allocation of %llu bytes",
                             (unsigned long long)nbytes, (unsigned long long)asize);
    if (find(c, mm_hash))
        return ect_set_error(ECT_EEXIST, "mm_hash '%s' is already resident", mm_hash);
    const char *owner = resident_owner(c, offset);
    if (owner)
        return ect_set_error(ECT_EEXIST, "the allocation at %llu already belongs to '%s'",
                             (unsigned long long)offset, owner);
    rentry *e = entry_new(c);
    if (!e) return ect_set_error(ECT_ENOMEM, "resident cache: out of memory");
    strcpy(e->mm_hash, mm_hash);
    e->offset = offset;
    e->nbytes = nbytes;
    e->alloc_size = asize;
    e->ndim = (uint32_t)ndim;
    if (ndim) memcpy(e->shape, shape, ndim * sizeof *shape);
    strcpy(e->dtype, dtype);
    e->leases = lease ? 1 : 0;
    size_t hlen = strlen(e->mm_hash);
    hash_oom = 0;
    HASH_ADD_KEYPTR(hh, c->by_hash, e->mm_hash, hlen, e);
    if (!hash_oom) {
        HASH_ADD(hh_off, c->by_off, offset, sizeof e->offset, e);
        if (hash_oom) HASH_DELETE(hh, c->by_hash, e);
    }
    if (hash_oom) {
        free(e); /* not kept: a failed put leaves no more memory held than before it */
        return ect_set_error(ECT_ENOMEM, "resident cache: out of memory");
    }
    DL_APPEND(c->lru, e);
    c->bytes += asize;
    if (lease)
        c->leased++;
    else
        c->unleased_bytes += asize;
    return 0;
}

static void fill_info(const rentry *e, ect_resident_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->offset = e->offset;
    info->nbytes = e->nbytes;
    info->ndim = e->ndim;
    memcpy(info->shape, e->shape, sizeof e->shape);
    memcpy(info->dtype, e->dtype, sizeof e->dtype);
    info->leases = e->leases;
}

int resident_try_get(resident_cache *c, const char *mm_hash, bool lease, ect_resident_info *info) {
    int rc = check_hash(mm_hash);
    if (rc) return rc;
    rentry *e = find(c, mm_hash);
    if (!e) return ECT_ENOTFOUND;
    if (lease) {
        if (e->leases == UINT32_MAX)
            return ect_set_error(ECT_EOVERFLOW, "mm_hash '%s' has too many leases", mm_hash);
        if (e->leases++ == 0) {
            c->leased++;
            c->unleased_bytes -= e->alloc_size;
        }
    }
    touch(c, e);
    fill_info(e, info);
    return 0;
}

int resident_get(resident_cache *c, const char *mm_hash, bool lease, ect_resident_info *info) {
    int rc = resident_try_get(c, mm_hash, lease, info);
    if (rc == ECT_ENOTFOUND) return ect_set_error(rc, "mm_hash '%s' is not resident", mm_hash);
    return rc;
}

int resident_release(resident_cache *c, const char *mm_hash) {
    int rc = check_hash(mm_hash);
    if (rc) return rc;
    rentry *e = find(c, mm_hash);
    if (!e) return ect_set_error(ECT_ENOTFOUND, "mm_hash '%s' is not resident", mm_hash);
    if (e->leases == 0)
        return ect_set_error(ECT_ESTATE, "mm_hash '%s' holds no lease to release", mm_hash);
    if (--e->leases == 0) {
        c->leased--;
        c->unleased_bytes += e->alloc_size;
    }
    touch(c, e);
    return 0;
}

/* Unlinks an unleased entry and frees its allocation; the caller frees e. */
static void drop(resident_cache *c, rentry *e) {
    HASH_DELETE(hh, c->by_hash, e);
    HASH_DELETE(hh_off, c->by_off, e);
    DL_DELETE(c->lru, e);
    c->bytes -= e->alloc_size;
    c->unleased_bytes -= e->alloc_size;
    if (!c->a) return; /* the owner frees it */
    /* The entry owned this allocation and nobody else could free it. */
    int rc = alloc_free(c->a, e->offset);
    assert(rc == 0);
    (void)rc;
}

static bool vetoed(const resident_cache *c, const rentry *e) {
    return c->busy && c->busy(c->busy_ctx, e->offset, e->alloc_size);
}

int resident_remove(resident_cache *c, const char *mm_hash) {
    int rc = check_hash(mm_hash);
    if (rc) return rc;
    rentry *e = find(c, mm_hash);
    if (!e) return ect_set_error(ECT_ENOTFOUND, "mm_hash '%s' is not resident", mm_hash);
    if (e->leases)
        return ect_set_error(ECT_EBUSY, "mm_hash '%s' is leased (%u leases)", mm_hash,
                             (unsigned)e->leases);
    drop(c, e);
    entry_free(c, e);
    return 0;
}

const char *resident_owner(const resident_cache *c, uint64_t offset) {
    rentry *e = NULL;
    HASH_FIND(hh_off, c->by_off, &offset, sizeof offset, e);
    return e ? e->mm_hash : NULL;
}

int resident_bind(resident_cache *c, const char *mm_hash, void *user) {
    rentry *e = find(c, mm_hash);
    if (!e) return ect_set_error(ECT_ENOTFOUND, "mm_hash '%s' is not resident", mm_hash);
    e->user = user;
    return 0;
}

void *resident_user(const resident_cache *c, const char *mm_hash) {
    rentry *e = find(c, mm_hash);
    return e ? e->user : NULL;
}

int resident_peek(const resident_cache *c, const char *mm_hash, ect_resident_info *info) {
    int rc = check_hash(mm_hash);
    if (rc) return rc;
    rentry *e = find(c, mm_hash);
    if (!e) return ect_set_error(ECT_ENOTFOUND, "mm_hash '%s' is not resident", mm_hash);
    fill_info(e, info);
    return 0;
}

void resident_each(const resident_cache *c,
                   void (*fn)(void *ctx, const char *mm_hash, const ect_resident_info *info),
                   void *ctx) {
    for (const rentry *e = c->by_hash; e; e = e->hh.next) {
        ect_resident_info info;
        fill_info(e, &info);
        fn(ctx, e->mm_hash, &info);
    }
}

int resident_reclaim_one(resident_cache *c, resident_victim *v, void **user) {
    for (rentry *e = c->lru; e; e = e->next) {
        if (e->leases || vetoed(c, e)) continue;
        memcpy(v->mm_hash, e->mm_hash, sizeof v->mm_hash);
        v->offset = e->offset;
        v->nbytes = e->nbytes;
        if (user) *user = e->user;
        drop(c, e);
        entry_free(c, e);
        c->reclaimed++;
        return 0;
    }
    return ect_set_error(ECT_ENOTFOUND, "no resident item can be reclaimed");
}

int resident_reclaim(resident_cache *c, uint64_t nbytes, resident_victim **victims,
                     size_t *nvictims) {
    if (!c->a) return ect_set_error(ECT_EINVAL, "resident cache: reclaim by size needs an alloc");
    if (nbytes == 0) return ect_set_error(ECT_EINVAL, "nbytes must be greater than 0");
    if (alloc_fits(c->a, nbytes)) return 0;
    uint64_t need = alloc_round(c->a, nbytes);
    alloc_stats st;
    alloc_get_stats(c->a, &st);
    if (need == 0 || need > st.capacity || st.free + c->unleased_bytes < need)
        return ect_set_error(ECT_EFULL,
                             "pool is full: %llu bytes requested, %llu free, %llu in unleased "
                             "resident items",
                             (unsigned long long)nbytes, (unsigned long long)st.free,
                             (unsigned long long)c->unleased_bytes);
    rentry *e = c->lru, *next;
    size_t cap = 0;
    while (e && !alloc_fits(c->a, nbytes)) {
        next = e->next;
        if (e->leases == 0 && !vetoed(c, e)) {
            if (*nvictims == cap || cap == 0) {
                size_t ncap = *nvictims ? *nvictims * 2 : 8;
                resident_victim *v = realloc(*victims, ncap * sizeof *v);
                if (!v) return ect_set_error(ECT_ENOMEM, "resident cache: out of memory");
                *victims = v;
                cap = ncap;
            }
            resident_victim *v = &(*victims)[(*nvictims)++];
            memcpy(v->mm_hash, e->mm_hash, sizeof v->mm_hash);
            v->offset = e->offset;
            v->nbytes = e->nbytes;
            drop(c, e);
            entry_free(c, e);
            c->reclaimed++;
        }
        e = next;
    }
    if (alloc_fits(c->a, nbytes)) return 0;
    return ect_set_error(ECT_EFULL,
                         "pool is full: %llu bytes requested, no free block large enough even "
                         "after reclaiming every unleased resident item",
                         (unsigned long long)nbytes);
}

void resident_get_stats(const resident_cache *c, resident_stats *st) {
    st->count = HASH_CNT(hh, c->by_hash);
    st->bytes = c->bytes;
    st->leased = c->leased;
    st->reclaimed = c->reclaimed;
    st->allocated = c->allocated;
}
