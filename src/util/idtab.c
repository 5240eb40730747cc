/*
 * idtab — see idtab.h. One open-addressing index by id (linear probing,
 * backward-shift deletion, so no deleted markers) and IDT_LISTS doubly linked
 * lists (utlist: head->prev is the tail, so appending is O(1)). A node is on
 * exactly one list and in the index from idt_add until idt_remove or a drop.
 */
#include <stdlib.h>
#include <string.h>

#include "util/idtab.h"

#include <utlist.h>

#include "util/util.h"

#define IDT_MIN_CAP 64

/* FNV-1a, then a 64-bit finaliser so the low bits (the slot) mix every byte;
 * never 0 (the empty slot). */
static uint64_t id_hash(const char *id) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)id; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

/* The slot holding id (hash h), or the empty slot where it would go. */
static size_t probe(const idtab *t, const char *id, uint64_t h) {
    size_t mask = t->cap - 1, i = (size_t)h & mask;
    while (t->slots[i].h && (t->slots[i].h != h || strcmp(t->slots[i].n->id, id) != 0))
        i = (i + 1) & mask;
    return i;
}

static int grow(idtab *t) {
    size_t cap = t->cap ? t->cap * 2 : IDT_MIN_CAP;
    idt_slot *ns = calloc(cap, sizeof *ns);
    if (!ns) return ect_set_error(ECT_ENOMEM, "id table: out of memory");
    idt_slot *old = t->slots;
    size_t ocap = t->cap;
    t->slots = ns;
    t->cap = cap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].h) {
            size_t mask = cap - 1, j = (size_t)old[i].h & mask;
            while (ns[j].h) j = (j + 1) & mask;
            ns[j] = old[i];
        }
    free(old);
    return 0;
}

/* Removes n from the index (it is there). */
static void index_del(idtab *t, const idt_node *n) {
    size_t mask = t->cap - 1, i = (size_t)id_hash(n->id) & mask;
    while (t->slots[i].n != n) i = (i + 1) & mask; /* by node: no id compare */
    t->slots[i].h = 0;
    t->slots[i].n = NULL;
    t->used--;
    /* backward shift: pull later entries of the run into the hole when their
     * home slot does not lie cyclically in (hole, j] */
    for (size_t j = (i + 1) & mask; t->slots[j].h; j = (j + 1) & mask) {
        size_t home = (size_t)t->slots[j].h & mask;
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays) continue;
        t->slots[i] = t->slots[j];
        t->slots[j].h = 0;
        t->slots[j].n = NULL;
        i = j;
    }
}

void idt_init(idtab *t, uint64_t ttl_ms, size_t max_tombstones, const idt_ops *ops) {
    memset(t, 0, sizeof *t);
    t->ops = *ops;
    t->ttl_ms = ttl_ms;
    t->max_tombs = max_tombstones;
}

static void unlink_node(idtab *t, idt_node *n) {
    DL_DELETE(t->head[n->list], n);
    t->count[n->list]--;
}

static void link_node(idtab *t, idt_node *n, int list, uint64_t when) {
    n->list = list;
    if (list == IDT_TOMBS) {
        if (when > t->now) t->now = when;
        when = t->now + t->ttl_ms < t->now ? UINT64_MAX : t->now + t->ttl_ms;
    }
    n->deadline = when;
    DL_APPEND(t->head[list], n);
    t->count[list]++;
}

static void drop(idtab *t, idt_node *n) {
    index_del(t, n);
    unlink_node(t, n);
    t->ops.drop(t->ops.ctx, n);
}

static bool pinned(const idtab *t, const idt_node *n) {
    return t->ops.pinned && t->ops.pinned(t->ops.ctx, n);
}

static void cap(idtab *t) {
    while (t->count[IDT_TOMBS] > t->max_tombs && !pinned(t, t->head[IDT_TOMBS])) {
        t->dropped++;
        drop(t, t->head[IDT_TOMBS]);
    }
}

void idt_clear(idtab *t) {
    /* every record goes: drop each without the per-node index delete */
    for (int l = 0; l < IDT_LISTS; l++)
        while (t->head[l]) {
            idt_node *n = t->head[l];
            unlink_node(t, n);
            t->ops.drop(t->ops.ctx, n);
        }
    free(t->slots);
    t->slots = NULL;
    t->cap = t->used = 0;
}

idt_node *idt_find(const idtab *t, const char *id) {
    if (!id || !t->cap) return NULL;
    size_t i = probe(t, id, id_hash(id));
    return t->slots[i].n;
}

int idt_add(idtab *t, idt_node *n, int list, uint64_t when) {
    /* one hash and one probe: the slot found is either the id's (refused) or
     * the empty one it goes to; a grow (rare) probes again in the new index */
    uint64_t h = id_hash(n->id);
    size_t i = t->cap ? probe(t, n->id, h) : 0;
    if (t->cap && t->slots[i].n) return ect_set_error(ECT_EEXIST, "id '%.200s' is known", n->id);
    if ((t->used + 1) * 4 > t->cap * 3) {
        int rc = grow(t);
        if (rc) return rc;
        i = probe(t, n->id, h);
    }
    t->slots[i].h = h;
    t->slots[i].n = n;
    t->used++;
    link_node(t, n, list, when);
    if (list == IDT_TOMBS) cap(t);
    return 0;
}

void idt_move(idtab *t, idt_node *n, int list, uint64_t when) {
    unlink_node(t, n);
    link_node(t, n, list, when);
    if (list == IDT_TOMBS) cap(t);
}

void idt_replace(idtab *t, idt_node *old, idt_node *n) {
    size_t mask = t->cap - 1, i = (size_t)id_hash(old->id) & mask;
    while (t->slots[i].n != old) i = (i + 1) & mask; /* by node, as index_del */
    t->slots[i].n = n;
    n->list = old->list;
    n->deadline = old->deadline;
    DL_REPLACE_ELEM(t->head[old->list], old, n);
}

void idt_remove(idtab *t, idt_node *n) {
    index_del(t, n);
    unlink_node(t, n);
}

size_t idt_expire(idtab *t, uint64_t now) {
    size_t n = 0;
    uint64_t before = t->dropped;
    if (now > t->now) t->now = now;
    now = t->now;
    cap(t);
    n += (size_t)(t->dropped - before);
    idt_node *h;
    while ((h = t->head[IDT_TOMBS]) && h->deadline <= now && !pinned(t, h)) {
        drop(t, h);
        n++;
    }
    return n;
}

size_t idt_live(const idtab *t) {
    size_t n = 0;
    for (int l = IDT_LIVE; l < IDT_LISTS; l++) n += t->count[l];
    return n;
}

int idt_check(const idtab *t) {
    size_t total = 0;
    for (int l = 0; l < IDT_LISTS; l++) {
        size_t c = 0;
        for (const idt_node *n = t->head[l]; n; n = n->next) {
            if (n->list != l)
                return ect_set_error(ECT_ESTATE, "id table: '%s' on the wrong list", n->id);
            if (idt_find(t, n->id) != n)
                return ect_set_error(ECT_ESTATE, "id table: '%s' missing from the index", n->id);
            if (l == IDT_TOMBS && n->next && n->deadline > n->next->deadline)
                return ect_set_error(ECT_ESTATE, "id table: tombstones out of order at '%s'",
                                     n->id);
            c++;
        }
        if (c != t->count[l])
            return ect_set_error(ECT_ESTATE, "id table: list %d counter drifted", l);
        total += c;
    }
    size_t filled = 0;
    for (size_t i = 0; i < t->cap; i++) filled += t->slots[i].h != 0;
    if (filled != total || t->used != total)
        return ect_set_error(ECT_ESTATE, "id table: index and lists disagree");
    return 0;
}
