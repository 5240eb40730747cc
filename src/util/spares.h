/*
 * spares — a bounded stack of freed blocks of one kind, kept so that the next
 * block of that kind costs no malloc (issue 13: a per-item block allocated on
 * one thread and freed on another takes malloc's slow path every time).
 *
 * Intrusive: a spare's link is stored in the block at link_off (a pointer
 * member the owner does not use while the block is a spare); the rest of the
 * block is left as it was, so an owner may keep a field (a capacity) across
 * reuse. A block given back when max spares are kept is freed. Blocks come
 * from malloc/calloc and go back to free.
 *
 * No locking: a spares belongs to its owner's thread or lock.
 */
#ifndef ECT_UTIL_SPARES_H
#define ECT_UTIL_SPARES_H

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct ect_spares {
    void *head;
    size_t n, max, link_off;
} ect_spares;

/* The spares of blocks of `type` linked through its pointer member `member`,
 * at most `maxn` kept. */
#define ECT_SPARES_INIT(type, member, maxn) ((ect_spares){NULL, 0, (maxn), offsetof(type, member)})

/* The block the next get returns (NULL: none), left in place. */
static inline void *ect_spares_peek(const ect_spares *s) { return s->head; }

/* Takes a spare (NULL: none). Its contents are as given back but for the
 * link member. */
static inline void *ect_spares_get(ect_spares *s) {
    void *p = s->head;
    if (p) {
        memcpy(&s->head, (char *)p + s->link_off, sizeof s->head);
        s->n--;
    }
    return p;
}

/* Keeps p as a spare, or frees it when max are kept. */
static inline void ect_spares_put(ect_spares *s, void *p) {
    if (s->n >= s->max) {
        free(p);
        return;
    }
    memcpy((char *)p + s->link_off, &s->head, sizeof s->head);
    s->head = p;
    s->n++;
}

/* Frees every spare. */
static inline void ect_spares_clear(ect_spares *s) {
    void *p;
    while ((p = ect_spares_get(s))) free(p);
}

#endif
