/*
 * pool — internal side of the public ect_pool (include/ectransfer.h has the
 * contract): constants and accessors that other modules and the tests use.
 */
#ifndef ECT_MEM_POOL_H
#define ECT_MEM_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ectransfer.h"

/* The region's base is aligned to this, and its mapping length is a multiple of it. */
#define POOL_BASE_ALIGN (UINT64_C(2) << 20)

/* Bytes mapped (and the memfd's size): the capacity rounded up to POOL_BASE_ALIGN.
 * A peer maps this many bytes of ect_pool_fd(). No lock. */
uint64_t pool_map_length(const ect_pool *pool);

/* Registers a host pool's region with CUDA (pinned) if it is not yet, so
 * device copies into it run at full speed; the registration is undone at
 * close. 0 when pinned (or a CUDA pool), else the driver's error. Takes the
 * pool's mutex. */
int pool_pin(ect_pool *pool);

/* The resident cache's writer veto (mem/resident.h): reclaim passes over an
 * item whose range busy() says a remote write may still be landing in.
 * busy runs under the pool's mutex and must not call the pool. */
void pool_set_veto(ect_pool *pool, bool (*busy)(void *ctx, uint64_t offset, uint64_t nbytes),
                   void *ctx);

/* As ect_pool_alloc, except that a full pool is a bare ECT_EFULL with no
 * error text: for a caller that then makes room its own way and words its own
 * error (the consumer's reservations evict and retry while the pool is full of
 * resident items; three formatted texts per try cost more than the rest of
 * the reserve). The pool's own resident items are reclaimed as by
 * ect_pool_alloc. Other errors are set as ect_pool_alloc sets them. */
int pool_try_alloc(ect_pool *pool, uint64_t nbytes, uint64_t *offset);

/* As ect_pool_acquire, except that an item that is not resident is a bare
 * ECT_ENOTFOUND with no error text: for a caller to whom a miss is the
 * usual answer (the pull consumer's resident check before each remote
 * pull, where formatting the text cost more than the lookup). Other errors
 * are set as ect_pool_acquire sets them. */
int pool_try_acquire(ect_pool *pool, const char *mm_hash, ect_resident_info *info);

/* Reads the resident items without counting as a use: fn(ctx, mm_hash,
 * info) for each of `filter` that is resident (in the filter's order), or for
 * every item (n_filter 0, oldest put first). fn runs under the pool's mutex
 * and must not call the pool. */
void pool_each_resident(ect_pool *pool, char *const *filter, size_t n_filter,
                        void (*fn)(void *ctx, const char *mm_hash, const ect_resident_info *info),
                        void *ctx);

#endif
