/*
 * alloc — see alloc.h for the contract.
 *
 * Every block of [0, capacity), free or allocated, is one node of a treap
 * keyed by offset, so the in-order walk is the block list in offset order and
 * a block's neighbours are its in-order predecessor and successor. Each node
 * also carries the largest free size in its subtree; "first fit" (the leftmost
 * free block of at least n bytes) is then one descent from the root: go left
 * while the left subtree holds a fit, else take this node if it fits, else go
 * right. Lookups, inserts and erases are O(log n) expected; a linear free-list
 * scan would be O(n), which is what this structure exists to avoid.
 *
 * Treap priorities come from a private xorshift generator with a fixed seed,
 * so a sequence of calls always produces the same tree (and tests reproduce).
 * Tree depth is O(log n) with overwhelming probability; the recursive helpers
 * rely on that.
 */
#include <stdlib.h>

#include "mem/alloc.h"
#include "util/util.h"

typedef struct anode {
    uint64_t off;
    uint64_t size;
    uint64_t maxfree; /* largest free block size in this subtree (0 if none) */
    uint32_t prio;
    bool free;
    struct anode *l, *r;
} anode;

struct alloc {
    anode *root;
    anode *spare; /* recycled nodes, linked through ->r */
    uint64_t capacity, alignment;
    uint64_t used, fragments, allocations;
    uint64_t rng;
};

static uint32_t next_prio(alloc *a) {
    uint64_t x = a->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    a->rng = x;
    return (uint32_t)(x >> 32);
}

static anode *node_new(alloc *a) {
    anode *n = a->spare;
    if (n) {
        a->spare = n->r;
    } else {
        n = malloc(sizeof *n);
        if (!n) return NULL;
    }
    n->l = n->r = NULL;
    n->prio = next_prio(a);
    return n;
}

static void node_put(alloc *a, anode *n) {
    n->r = a->spare;
    a->spare = n;
}

static inline uint64_t max3(uint64_t x, uint64_t y, uint64_t z) {
    uint64_t m = x > y ? x : y;
    return m > z ? m : z;
}

static inline void pull(anode *t) {
    t->maxfree = max3(t->free ? t->size : 0, t->l ? t->l->maxfree : 0, t->r ? t->r->maxfree : 0);
}

/* Splits t into keys < off (*lo) and keys >= off (*hi). */
static void split(anode *t, uint64_t off, anode **lo, anode **hi) {
    if (!t) {
        *lo = *hi = NULL;
    } else if (t->off < off) {
        split(t->r, off, &t->r, hi);
        pull(t);
        *lo = t;
    } else {
        split(t->l, off, lo, &t->l);
        pull(t);
        *hi = t;
    }
}

/* Joins two treaps where every key of x is below every key of y. */
static anode *merge(anode *x, anode *y) {
    if (!x) return y;
    if (!y) return x;
    if (x->prio > y->prio) {
        x->r = merge(x->r, y);
        pull(x);
        return x;
    }
    y->l = merge(x, y->l);
    pull(y);
    return y;
}

static anode *insert(anode *t, anode *n) {
    if (!t) {
        pull(n);
        return n;
    }
    if (n->prio > t->prio) {
        split(t, n->off, &n->l, &n->r);
        pull(n);
        return n;
    }
    if (n->off < t->off)
        t->l = insert(t->l, n);
    else
        t->r = insert(t->r, n);
    pull(t);
    return t;
}

/* Unlinks the node with key off (which must exist) and returns the new root. */
static anode *erase(anode *t, uint64_t off) {
    if (t->off == off) return merge(t->l, t->r);
    if (off < t->off)
        t->l = erase(t->l, off);
    else
        t->r = erase(t->r, off);
    pull(t);
    return t;
}

/* Recomputes the aggregates on the path to key off after that node changed. */
static void repair(anode *t, uint64_t off) {
    if (!t) return;
    if (off < t->off)
        repair(t->l, off);
    else if (off > t->off)
        repair(t->r, off);
    pull(t);
}

/* The block containing off: the node with the greatest key <= off. */
static anode *find_le(anode *t, uint64_t off) {
    anode *best = NULL;
    while (t) {
        if (t->off <= off) {
            best = t;
            t = t->r;
        } else {
            t = t->l;
        }
    }
    return best;
}

static anode *find_eq(anode *t, uint64_t off) {
    while (t && t->off != off) t = off < t->off ? t->l : t->r;
    return t;
}

/* Leftmost free node with size >= n; the caller checked root->maxfree >= n. */
static anode *first_fit(anode *t, uint64_t n) {
    while (t) {
        if (t->l && t->l->maxfree >= n)
            t = t->l;
        else if (t->free && t->size >= n)
            return t;
        else
            t = t->r;
    }
    return NULL;
}

int alloc_create(uint64_t capacity, uint64_t alignment, alloc **out) {
    *out = NULL;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > ALLOC_MAX_ALIGNMENT)
        return ect_set_error(ECT_EINVAL, "alignment %llu must be a power of two between 1 and %llu",
                             (unsigned long long)alignment,
                             (unsigned long long)ALLOC_MAX_ALIGNMENT);
    if (capacity < alignment || capacity > ALLOC_MAX_CAPACITY)
        return ect_set_error(ECT_EINVAL,
                             "capacity %llu must be between the alignment (%llu) and %llu bytes",
                             (unsigned long long)capacity, (unsigned long long)alignment,
                             (unsigned long long)ALLOC_MAX_CAPACITY);
    alloc *a = calloc(1, sizeof *a);
    if (!a) return ect_set_error(ECT_ENOMEM, "allocator: out of memory");
    a->capacity = capacity & ~(alignment - 1);
    a->alignment = alignment;
    a->rng = 0x2545F4914F6CDD1Dull;
    anode *n = node_new(a);
    if (!n) {
        free(a);
        return ect_set_error(ECT_ENOMEM, "allocator: out of memory");
    }
    n->off = 0;
    n->size = a->capacity;
    n->free = true;
    pull(n);
    a->root = n;
    a->fragments = 1;
    *out = a;
    return 0;
}

static void free_tree(anode *t) {
    while (t) {
        free_tree(t->l);
        anode *r = t->r;
        free(t);
        t = r;
    }
}

void alloc_destroy(alloc *a) {
    if (!a) return;
    free_tree(a->root);
    anode *s = a->spare;
    while (s) {
        anode *nx = s->r;
        free(s);
        s = nx;
    }
    free(a);
}

uint64_t alloc_round(const alloc *a, uint64_t nbytes) {
    uint64_t r;
    if (nbytes == 0 || !ect_add_u64(nbytes, a->alignment - 1, &r)) return 0;
    return r & ~(a->alignment - 1);
}

bool alloc_fits(const alloc *a, uint64_t nbytes) {
    uint64_t r = alloc_round(a, nbytes);
    return r != 0 && a->root->maxfree >= r;
}

int alloc_alloc(alloc *a, uint64_t nbytes, uint64_t *offset) {
    if (nbytes == 0) return ect_set_error(ECT_EINVAL, "nbytes must be greater than 0");
    uint64_t r = alloc_round(a, nbytes);
    if (r == 0 || r > a->root->maxfree)
        return ect_set_error(ECT_EFULL,
                             "pool is full: no free block of %llu bytes (largest free %llu)",
                             (unsigned long long)nbytes, (unsigned long long)a->root->maxfree);
    anode *t = first_fit(a->root, r);
    if (t->size > r) {
        /* Split: t keeps the front as the allocation, the tail stays free. */
        anode *tail = node_new(a);
        if (!tail) return ect_set_error(ECT_ENOMEM, "allocator: out of memory");
        tail->off = t->off + r;
        tail->size = t->size - r;
        tail->free = true;
        t->size = r;
        t->free = false;
        repair(a->root, t->off);
        a->root = insert(a->root, tail);
    } else {
        t->free = false;
        repair(a->root, t->off);
        a->fragments--;
    }
    a->used += r;
    a->allocations++;
    *offset = t->off;
    return 0;
}

int alloc_free(alloc *a, uint64_t offset) {
    if (offset >= a->capacity)
        return ect_set_error(ECT_ERANGE, "offset %llu is beyond the capacity %llu",
                             (unsigned long long)offset, (unsigned long long)a->capacity);
    anode *t = find_le(a->root, offset);
    if (t->free)
        return ect_set_error(ECT_ESTATE,
                             "offset %llu is not allocated (double free, or never allocated)",
                             (unsigned long long)offset);
    if (t->off != offset)
        return ect_set_error(ECT_ENOTFOUND,
                             "offset %llu is inside the allocation at %llu, not its start",
                             (unsigned long long)offset, (unsigned long long)t->off);
    a->used -= t->size;
    a->allocations--;
    a->fragments++;
    t->free = true;
    uint64_t end = t->off + t->size;
    anode *succ = end < a->capacity ? find_eq(a->root, end) : NULL;
    if (succ && succ->free) {
        t->size += succ->size;
        a->root = erase(a->root, succ->off);
        node_put(a, succ);
        a->fragments--;
    }
    anode *pred = t->off > 0 ? find_le(a->root, t->off - 1) : NULL;
    if (pred && pred->free) {
        pred->size += t->size;
        a->root = erase(a->root, t->off);
        node_put(a, t);
        a->fragments--;
        repair(a->root, pred->off);
    } else {
        repair(a->root, t->off);
    }
    return 0;
}

uint64_t alloc_size_of(const alloc *a, uint64_t offset) {
    const anode *t = find_eq(a->root, offset);
    return t && !t->free ? t->size : 0;
}

void alloc_get_stats(const alloc *a, alloc_stats *st) {
    st->capacity = a->capacity;
    st->alignment = a->alignment;
    st->used = a->used;
    st->free = a->capacity - a->used;
    st->largest_free = a->root->maxfree;
    st->fragments = a->fragments;
    st->allocations = a->allocations;
}

typedef struct check_state {
    uint64_t next_off, used, fragments, allocations;
    bool prev_free;
    int rc;
} check_state;

static void check_walk(const alloc *a, const anode *t, check_state *cs) {
    if (!t || cs->rc) return;
    check_walk(a, t->l, cs);
    if (cs->rc) return;
    uint64_t expect =
        max3(t->free ? t->size : 0, t->l ? t->l->maxfree : 0, t->r ? t->r->maxfree : 0);
    if ((t->l && t->l->prio > t->prio) || (t->r && t->r->prio > t->prio))
        cs->rc = ect_set_error(ECT_ESTATE, "heap order broken at %llu", (unsigned long long)t->off);
    else if (t->maxfree != expect)
        cs->rc = ect_set_error(ECT_ESTATE, "maxfree wrong at %llu", (unsigned long long)t->off);
    else if (t->off != cs->next_off)
        cs->rc = ect_set_error(ECT_ESTATE, "block at %llu, expected %llu",
                               (unsigned long long)t->off, (unsigned long long)cs->next_off);
    else if (t->size == 0 || (t->off % a->alignment) || (t->size % a->alignment))
        cs->rc = ect_set_error(ECT_ESTATE, "bad block size %llu at %llu",
                               (unsigned long long)t->size, (unsigned long long)t->off);
    else if (t->free && cs->prev_free)
        cs->rc =
            ect_set_error(ECT_ESTATE, "adjacent free blocks at %llu", (unsigned long long)t->off);
    if (cs->rc) return;
    cs->next_off = t->off + t->size;
    cs->prev_free = t->free;
    if (t->free)
        cs->fragments++;
    else {
        cs->used += t->size;
        cs->allocations++;
    }
    check_walk(a, t->r, cs);
}

int alloc_check(const alloc *a) {
    check_state cs = {0};
    check_walk(a, a->root, &cs);
    if (cs.rc) return cs.rc;
    if (cs.next_off != a->capacity)
        return ect_set_error(ECT_ESTATE, "blocks end at %llu, capacity %llu",
                             (unsigned long long)cs.next_off, (unsigned long long)a->capacity);
    if (cs.used != a->used || cs.fragments != a->fragments || cs.allocations != a->allocations)
        return ect_set_error(ECT_ESTATE, "counters disagree with the blocks");
    return 0;
}
