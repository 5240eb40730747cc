/*
 * alloc — the pure offset allocator behind every buffer pool: first fit over
 * the blocks of [0, capacity) in offset order, coalescing a freed block with
 * both neighbours. It works on offsets only and touches no memory.
 *
 * Single-threaded: an alloc is used by one thread at a time (the pool wraps it
 * in its mutex). Every operation is O(log n) in the number of blocks, so a
 * heavily fragmented pool (100,000 fragments and more) stays fast.
 *
 * Sizes are rounded up to the alignment and every block starts at a multiple
 * of it. The usable capacity is the given capacity rounded down to the
 * alignment; the remainder (less than one alignment unit) is never handed out.
 */
#ifndef ECT_MEM_ALLOC_H
#define ECT_MEM_ALLOC_H

#include <stdbool.h>
#include <stdint.h>

/* Largest capacity accepted (2^62 bytes): sizes and offsets then never overflow. */
#define ALLOC_MAX_CAPACITY (UINT64_C(1) << 62)
/* Largest alignment accepted (1 GiB); alignments are powers of two >= 1. */
#define ALLOC_MAX_ALIGNMENT (UINT64_C(1) << 30)
#define ALLOC_DEFAULT_ALIGNMENT 256

typedef struct alloc alloc;

typedef struct alloc_stats {
    uint64_t capacity;     /* usable bytes: the capacity rounded down to the alignment */
    uint64_t alignment;    /* bytes */
    uint64_t used;         /* bytes in allocated blocks (rounded sizes) */
    uint64_t free;         /* capacity - used */
    uint64_t largest_free; /* size of the largest free block; the largest request that fits */
    uint64_t fragments;    /* number of free blocks (1 when empty, 0 when completely full) */
    uint64_t allocations;  /* number of allocated blocks */
} alloc_stats;

/* Creates an allocator over [0, capacity). alignment must be a power of two
 * in [1, ALLOC_MAX_ALIGNMENT]; capacity in [alignment, ALLOC_MAX_CAPACITY].
 * Errors: ECT_EINVAL naming "capacity" or "alignment"; ECT_ENOMEM.
 * Caller owns the result (alloc_destroy); *out is NULL on failure. */
int alloc_create(uint64_t capacity, uint64_t alignment, alloc **out);

/* Releases the allocator; NULL is fine. Outstanding allocations vanish with it. */
void alloc_destroy(alloc *a);

/* Allocates nbytes (rounded up to the alignment) at the lowest offset where
 * they fit (first fit) and stores the offset in *offset.
 * Errors: ECT_EINVAL "nbytes must be greater than 0"; ECT_EFULL when no free
 * block is large enough (nothing changes); ECT_ENOMEM (nothing changes). */
int alloc_alloc(alloc *a, uint64_t nbytes, uint64_t *offset);

/* Frees the allocation that starts at offset and coalesces it with free
 * neighbours. Errors, each leaving the allocator unchanged: ECT_ERANGE when
 * offset >= capacity; ECT_ESTATE "not allocated" when offset lies in free
 * space (a double free, or a range never allocated); ECT_ENOTFOUND when
 * offset lies inside an allocation but is not its start. */
int alloc_free(alloc *a, uint64_t offset);

/* Size (rounded) of the allocation starting at offset, or 0 if no allocation
 * starts there. */
uint64_t alloc_size_of(const alloc *a, uint64_t offset);

/* nbytes rounded up to the alignment; 0 if nbytes is 0 or the rounding overflows. */
uint64_t alloc_round(const alloc *a, uint64_t nbytes);

/* True if alloc_alloc(a, nbytes) would succeed now. */
bool alloc_fits(const alloc *a, uint64_t nbytes);

void alloc_get_stats(const alloc *a, alloc_stats *st);

/* Verifies every invariant (blocks tile [0, capacity) in order, no two free
 * blocks adjacent, counters and the search index consistent). O(n); for tests.
 * Returns 0, or ECT_ESTATE with the broken invariant in ect_last_error(). */
int alloc_check(const alloc *a);

#endif
