/*
 * idtab — records keyed by a string id (a transfer_id), each on one of a few
 * ordered lists: the owner's live lists and the tombstones. Every table of
 * transfers in the tree is one of these (the push producer's records, the
 * consumer shard's reservations, the consumer scheduler's transfers): a
 * finished id stays a tombstone for one TTL, so a late or repeated message for
 * it is recognised, and at most `max_tombstones` are kept (the oldest goes
 * first).
 *
 * Intrusive: a record embeds an idt_node and owns the id's bytes; the table
 * never allocates records, it links them. Lists keep the order of arrival
 * (idt_add / idt_move append at the tail), so a list whose deadlines are
 * appended in non-decreasing order can be expired from its head alone.
 *
 * Pure: no clock (calls that need time take it; a time earlier than one seen
 * before counts as the latest, so tombstone deadlines never go backwards),
 * no lock, no I/O.
 * Threading: not thread-safe; the owner serialises every call.
 *
 * The index is an open-addressing hash table of (hash, node) slots, grown at
 * 3/4 load; it is the table's only allocation.
 *
 * Include this header before any other include of uthash.h in a file that
 * wants uthash's non-fatal out-of-memory mode (it includes uthash.h, which
 * its owners use for their other tables).
 */
#ifndef ECT_UTIL_IDTAB_H
#define ECT_UTIL_IDTAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uthash.h>

/* List 0 holds the tombstones; 1 .. IDT_LISTS-1 are the owner's live lists. */
#define IDT_TOMBS 0
#define IDT_LIVE 1
#define IDT_LISTS 3

typedef struct idt_node {
    const char *id;    /* the key: the record's bytes, set before idt_add, constant after */
    uint64_t deadline; /* tombstones: when it goes; live lists: whatever the owner put */
    int list;          /* the list it is on */
    struct idt_node *prev, *next;
} idt_node;

/* One slot of the index: the id's hash (0: empty) and its node. A lookup
 * compares hashes in the slot array and touches a node only on a hash match,
 * so a miss (every new id) costs a probe or two in one cache line, not a walk
 * through cold records (uthash's chains did that: issue 13's profile). */
typedef struct idt_slot {
    uint64_t h;
    idt_node *n;
} idt_slot;

/* The record that embeds node `n` as `member`. */
#define IDT_ENTRY(n, type, member) ((type *)(void *)((char *)(n)-offsetof(type, member)))

typedef struct idt_ops {
    /* Required. The table dropped a tombstone (expired, or over the cap): it
     * is unlinked; the owner frees the record. Must not call into the table. */
    void (*drop)(void *ctx, idt_node *n);
    /* Optional. True while a tombstone must not be dropped yet (the owner
     * still refers to it); expiry and the cap stop at it until it is not. */
    bool (*pinned)(void *ctx, const idt_node *n);
    void *ctx;
} idt_ops;

typedef struct idtab {
    idt_ops ops;
    uint64_t ttl_ms;
    size_t max_tombs;
    uint64_t now;    /* the latest time seen (an earlier one counts as this) */
    idt_slot *slots; /* open addressing, linear probing; cap a power of two or 0 */
    size_t cap, used;
    idt_node *head[IDT_LISTS];
    size_t count[IDT_LISTS];
    uint64_t dropped; /* tombstones dropped by the cap since init */
} idtab;

/* An empty table; ttl_ms and max_tombstones are > 0 (the owner validated them). */
void idt_init(idtab *t, uint64_t ttl_ms, size_t max_tombstones, const idt_ops *ops);

/* Drops every record (ops.drop, pins ignored) and frees the index. The table
 * is empty after (and may be used again). */
void idt_clear(idtab *t);

idt_node *idt_find(const idtab *t, const char *id);

/* Indexes n (n->id set) and appends it to `list`. `when`: on a live list the
 * deadline to keep; on IDT_TOMBS the current time (it goes ttl_ms later, and
 * the cap applies). Errors: ECT_EEXIST the id is known (dedup); ECT_ENOMEM
 * the index cannot grow. Nothing changes on error. */
int idt_add(idtab *t, idt_node *n, int list, uint64_t when);

/* Moves n to the tail of `list` (its own list too), `when` as for idt_add. */
void idt_move(idtab *t, idt_node *n, int list, uint64_t when);

/* Puts n where old is, in the index and on old's list (same place, same
 * deadline); n->id is set to the same id. old is unlinked without ops.drop:
 * the owner frees it. For moving a record to a smaller allocation. */
void idt_replace(idtab *t, idt_node *old, idt_node *n);

/* Unlinks n without ops.drop; the owner frees the record. */
void idt_remove(idtab *t, idt_node *n);

/* Drops the tombstones due at now (and any over the cap), oldest first,
 * stopping at a pinned one. Returns how many went. */
size_t idt_expire(idtab *t, uint64_t now);

/* The oldest record of `list`, or NULL; walk on with ->next. */
static inline idt_node *idt_first(const idtab *t, int list) { return t->head[list]; }
static inline size_t idt_count(const idtab *t, int list) { return t->count[list]; }
/* Records on the live lists. */
size_t idt_live(const idtab *t);

/* Verifies the index, the lists and the counters; ECT_ESTATE naming the
 * broken one. O(n); for tests and the owners' own checks. */
int idt_check(const idtab *t);

#endif
