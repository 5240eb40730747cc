/*
 * resident — the items a pool keeps after use: mm_hash -> (offset, nbytes,
 * shape, dtype), each with a lease count, in least-recently-used order.
 * Reclaim frees unleased items, oldest first, until a requested size fits.
 *
 * The one residency module of both protocols: the pool's cache (generation
 * 1: what a pull producer serves, what a pull consumer loaded; the pull
 * inventory is read from it) and the push consumer shard's published tensors
 * (the reservation table keeps its own cache, one lease while reservations or
 * takes hold a tensor, least-recently-used reclaim of the rest).
 *
 * Two modes. Over an alloc (the pool's): a resident owns the allocation it
 * names and gives it back to the alloc when reclaimed or removed. Without one
 * (alloc NULL): the owner keeps the memory; the cache only orders, leases and
 * picks victims (resident_reclaim_one), and the owner frees them. An entry
 * may carry the owner's pointer (resident_bind).
 *
 * A "writer still active" veto (resident_set_veto), when set, is asked before
 * an unleased entry is reclaimed: memory a remote write may still be landing
 * in is never handed out again; the entry stays (and counts as reclaimable)
 * until the veto lets it go.
 *
 * Pure bookkeeping: single-threaded (the pool calls it under its mutex, the
 * reservation table under the control server's). Lookups are O(1) (hash
 * tables by mm_hash and by offset); reclaim walks the LRU list from its
 * oldest end.
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

/* Creates an empty cache over `a` (not owned; must outlive the cache), or
 * with a NULL: the owner keeps the memory (see the top). Errors: ECT_ENOMEM.
 * Caller owns the result. */
int resident_create(alloc *a, resident_cache **out);

/* The veto (NULL: none): busy(ctx, offset, nbytes) true while a writer may
 * still be writing into the range; reclaim passes over such an entry. */
void resident_set_veto(resident_cache *c, bool (*busy)(void *ctx, uint64_t offset, uint64_t nbytes),
                       void *ctx);

/* Frees every entry's bookkeeping. Allocations are NOT given back to the
 * alloc (the pool destroys the alloc right after). NULL is fine. */
void resident_destroy(resident_cache *c);

/* Makes the allocation starting at `offset` resident under mm_hash; it becomes
 * the most recently used item, with one lease if `lease` is true, else none.
 * Takes ownership of the allocation on success; on failure the caller still
 * owns it. Errors: ECT_EINVAL (hash empty or too long, nbytes 0 or larger than
 * the allocation, shape/dtype not matching nbytes); ECT_ENOTFOUND (no
 * allocation starts at offset); ECT_EEXIST (mm_hash already resident, or the
 * allocation already belongs to another item); ECT_ENOMEM. Without an alloc
 * the allocation is not checked (nor shape and dtype against nbytes). */
int resident_put(resident_cache *c, const char *mm_hash, uint64_t offset, uint64_t nbytes,
                 const uint64_t *shape, size_t ndim, const char *dtype, bool lease);

/* Fills *info (may be NULL) for mm_hash and marks it most recently used; adds
 * one lease when `lease` is true. Errors: ECT_ENOTFOUND; ECT_EOVERFLOW when
 * the lease count would overflow. */
int resident_get(resident_cache *c, const char *mm_hash, bool lease, ect_resident_info *info);
/* The same, except that a miss is a bare ECT_ENOTFOUND (no error text). */
int resident_try_get(resident_cache *c, const char *mm_hash, bool lease, ect_resident_info *info);

/* Drops one lease and marks the item most recently used. Errors:
 * ECT_ENOTFOUND; ECT_ESTATE when it holds no lease. */
int resident_release(resident_cache *c, const char *mm_hash);

/* Forgets mm_hash and frees its allocation. Errors: ECT_ENOTFOUND; ECT_EBUSY
 * while leased. */
int resident_remove(resident_cache *c, const char *mm_hash);

/* The mm_hash of the item owning the allocation at offset, or NULL. */
const char *resident_owner(const resident_cache *c, uint64_t offset);

/* Attaches the owner's pointer to mm_hash (ECT_ENOTFOUND); resident_user
 * returns it (NULL when absent or none). */
int resident_bind(resident_cache *c, const char *mm_hash, void *user);
void *resident_user(const resident_cache *c, const char *mm_hash);

/* Like resident_get without a lease and without counting as a use. */
int resident_peek(const resident_cache *c, const char *mm_hash, ect_resident_info *info);

/* Calls fn for every item, oldest put first; fn must not change the cache. */
void resident_each(const resident_cache *c,
                   void (*fn)(void *ctx, const char *mm_hash, const ect_resident_info *info),
                   void *ctx);

/* Reclaims the least recently used unleased item the veto lets go: fills *v
 * and *user (may be NULL), forgets it, and frees its allocation when the
 * cache has an alloc. ECT_ENOTFOUND when none can go. */
int resident_reclaim_one(resident_cache *c, resident_victim *v, void **user);

/* Reclaims unleased items the veto lets go, least recently used first,
 * until alloc_fits(a, nbytes) or none is left (needs the alloc); appends each victim to *victims
 * (grown with realloc; caller frees) and counts them in *nvictims. Reclaims nothing when the free
 * bytes plus the bytes of every unleased item are fewer than the rounded nbytes (room is then
 * impossible). Returns 0 when nbytes fits afterwards, ECT_EFULL when it does not, ECT_ENOMEM
 * (nothing reclaimed beyond the victims already reported). */
int resident_reclaim(resident_cache *c, uint64_t nbytes, resident_victim **victims,
                     size_t *nvictims);

typedef struct resident_stats {
    uint64_t count;     /* items */
    uint64_t bytes;     /* allocated bytes they hold (rounded sizes) */
    uint64_t leased;    /* items with at least one lease */
    uint64_t reclaimed; /* items reclaimed since creation */
    uint64_t allocated; /* entries calloc'd since creation (the rest were reused) */
} resident_stats;

void resident_get_stats(const resident_cache *c, resident_stats *st);

#endif
