/*
 * idtab — see idtab.h. One uthash index by id and IDT_LISTS doubly linked
 * lists (utlist: head->prev is the tail, so appending is O(1)). A node is on
 * exactly one list and in the index from idt_add until idt_remove or a drop.
 */
#include <string.h>

/* A failed index allocation is an ECT_ENOMEM, never exit(): uthash then rolls
 * the add back and raises this flag. */
static _Thread_local int hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (hash_oom = 1)
#include "util/idtab.h"

#include <utlist.h>

#include "util/util.h"

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
    HASH_DELETE(hh, t->by_id, n);
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
    for (int l = 0; l < IDT_LISTS; l++)
        while (t->head[l]) drop(t, t->head[l]);
}

idt_node *idt_find(const idtab *t, const char *id) {
    idt_node *n = NULL;
    if (id) HASH_FIND(hh, t->by_id, id, strlen(id), n);
    return n;
}

int idt_add(idtab *t, idt_node *n, int list, uint64_t when) {
    if (idt_find(t, n->id)) return ect_set_error(ECT_EEXIST, "id '%.200s' is known", n->id);
    hash_oom = 0;
    HASH_ADD_KEYPTR(hh, t->by_id, n->id, strlen(n->id), n);
    if (hash_oom) return ect_set_error(ECT_ENOMEM, "id table: out of memory");
    link_node(t, n, list, when);
    if (list == IDT_TOMBS) cap(t);
    return 0;
}

void idt_move(idtab *t, idt_node *n, int list, uint64_t when) {
    unlink_node(t, n);
    link_node(t, n, list, when);
    if (list == IDT_TOMBS) cap(t);
}

void idt_remove(idtab *t, idt_node *n) {
    HASH_DELETE(hh, t->by_id, n);
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
    if (HASH_CNT(hh, t->by_id) != total)
        return ect_set_error(ECT_ESTATE, "id table: index and lists disagree");
    return 0;
}
