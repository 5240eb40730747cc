/*
 * resident — the items a pool keeps after use: mm_hash -> (offset, nbytes,
 * shape, dtype), each with a lease count, in least-recently-used order.
 * Reclaim frees unleased items, oldest first, until a requested size fits.
 *
 * Pure bookkeeping over an alloc: a resident owns the allocation it names and
 * gives it back to the alloc when reclaimed or removed. Single-threaded (the
 * pool calls it under its mutex). Lookups are O(1) (hash tables by mm_hash and
 * by offset); reclaim walks the LRU list from its oldest end.
 */
#ifndef ECT_MEM_RESIDENT_H
#define ECT_MEM_RESIDENT_H

#include <stddef.h>
#include <stdint.h>

#include "ectransfer.h"
#include "mem/alloc.h"

typedef struct resident_cache resident_cache;

/* One reclaimed item, reported back to the pool's owner. */
typedef struct resident_victim {
    char mm_hash[ECT_MM_HASH_MAX + 1];
    uint64_t offset;
    uint64_t nbytes;
} resident_victim;

/* Creates an empty cache over `a` (not owned; must outlive the cache).
 * Errors: ECT_ENOMEM. Caller owns the result. */
int resident_create(alloc *a, resident_cache **out);

/* Frees every entry's bookkeeping. Allocations are NOT given back to the
 * alloc (the pool destroys the alloc right after). NULL is fine. */
void resident_destroy(resident_cache *c);

/* Makes the allocation starting at `offset` resident under mm_hash; it becomes
 * the most recently used item, with one lease if `lease` is true, else none.
 * Takes ownership of the allocation on success; on failure the caller still
 * owns it. Errors: ECT_EINVAL (hash empty or too long, nbytes 0 or larger than
 * the allocation, shape/dtype not matching nbytes); ECT_ENOTFOUND (no
 * allocation starts at offset); ECT_EEXIST (mm_hash already resident, or the
 * allocation already belongs to another item); ECT_ENOMEM. */
int resident_put(resident_cache *c, const char *mm_hash, uint64_t offset, uint64_t nbytes,
                 const uint64_t *shape, size_t ndim, const char *dtype, bool lease);

/* Fills *info (may be NULL) for mm_hash and marks it most recently used; adds
 * one lease when `lease` is true. Errors: ECT_ENOTFOUND; ECT_EOVERFLOW when
 * the lease count would overflow. */
int resident_get(resident_cache *c, const char *mm_hash, bool lease, ect_resident_info *info);

/* Drops one lease and marks the item most recently used. Errors:
 * ECT_ENOTFOUND; ECT_ESTATE when it holds no lease. */
int resident_release(resident_cache *c, const char *mm_hash);

/* Forgets mm_hash and frees its allocation. Errors: ECT_ENOTFOUND; ECT_EBUSY
 * while leased. */
int resident_remove(resident_cache *c, const char *mm_hash);

/* The mm_hash of the item owning the allocation at offset, or NULL. */
const char *resident_owner(const resident_cache *c, uint64_t offset);

/* Reclaims unleased items, least recently used first, until alloc_fits(a,
 * nbytes) or none is left; appends each victim to *victims (grown with
 * realloc; caller frees) and counts them in *nvictims. Reclaims nothing when
 * the free bytes plus the bytes of every unleased item are fewer than the
 * rounded nbytes (room is then impossible). Returns 0 when
 * nbytes fits afterwards, ECT_EFULL when it does not, ECT_ENOMEM (nothing
 * reclaimed beyond the victims already reported). */
int resident_reclaim(resident_cache *c, uint64_t nbytes, resident_victim **victims,
                     size_t *nvictims);

typedef struct resident_stats {
    uint64_t count;     /* items */
    uint64_t bytes;     /* allocated bytes they hold (rounded sizes) */
    uint64_t leased;    /* items with at least one lease */
    uint64_t reclaimed; /* items reclaimed since creation */
} resident_stats;

void resident_get_stats(const resident_cache *c, resident_stats *st);

#endif
