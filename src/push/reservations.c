/*
 * reservations — the consumer shard's reservation table. See reservations.h
 * for the contract; this file explains the bookkeeping.
 *
 * Two kinds of object: entries (one per transfer_id, the state machine) and
 * buffers (one per allocation). A buffer counts its holders: `refs` is the
 * number of non-tombstone entries pointing at it (the writer, its followers,
 * READY and cached entries), `leases` the consumer's outstanding takes, and
 * `resident` keeps it after both drop to zero until least-recently-used
 * reclaim. A buffer is freed exactly when all three are gone. A writer holds
 * its ref through WRITING, CANCEL_PENDING and EXPIRE_PENDING, so memory a
 * remote writer may still be writing is never freed by construction.
 *
 * Residency is mem/resident's (the one residency module; this table keeps
 * its own cache of it, without an alloc: the memory stays this table's).
 * Every published buffer is an item of the cache, with one lease while
 * anything holds it (`held`: refs or leases); the cache orders the items by
 * use and picks the least recently used unheld one when room is needed
 * (evict_one). A published buffer nothing holds and that was never made
 * resident is freed at once.
 *
 * Entries live in the id table (util/idtab), each on exactly one of three
 * lists, each ordered by its deadline:
 *  - live (WRITING, READY): deadline = expiry. Every deadline is set to
 *    now + ttl with a clamped, non-decreasing now, so appending keeps the
 *    list sorted and the reaper only looks at its head;
 *  - pending (CANCEL_PENDING, EXPIRE_PENDING): deadline = end of grace;
 *  - tombstones (CANCELLED, EXPIRED): deadline = removal; capped, and the
 *    oldest goes first.
 *
 * Three indexes by mm_hash: `inflight` (the one WRITING writer of a hash,
 * which new reserves follow), the resident cache (the one completed buffer of
 * a hash, which new reserves are answered from, `cached`) and `orphans`
 * (buffers whose writer refreshed away while followers waited on them: the
 * next reserve of the hash adopts them as their writer). A hash is in at
 * most one of the three.
 *
 * Delivered items: once the engine took a READY item and released it,
 * rsv_finish ends the reservation on the spot. Before, a delivered READY
 * reservation kept its buffer referenced until the scheduler's remote cancel
 * arrived — one REQ round trip per item and shard, sent one at a time by the
 * scheduler's cancel thread, through the same REP loop the producer's
 * reserves wait in. Under a steady stream of small items that thread fell
 * behind by thousands of items (the 20,000 x 64 KiB soak held ~5,400
 * delivered reservations, 354 MB, per rank), the pool filled with memory
 * nobody needed and reserves were refused. A finished reservation's buffer
 * stays resident (dedup) but no longer pins anything.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* uthash reports running out of memory instead of exiting the process; every
 * insert checks the flag (per thread: tables in different threads are
 * independent). */
static _Thread_local int hash_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (hash_oom = 1)
#include "mem/pool.h"
#include "mem/resident.h"
#include "util/idtab.h"
#include "util/spares.h"

#include <utlist.h>

#include "push/reservations.h"

#define MOD "rsv"

typedef enum { ROLE_WRITER = 1, ROLE_FOLLOWER, ROLE_CACHED } rsv_role;

/* What a reservation describes; a follower or cached reply must match it. */
typedef struct tensor {
    uint64_t nbytes;
    uint64_t shape[WIRE_MAX_NDIM];
    size_t ndim;
    char dtype[RSV_DTYPE_MAX + 1]; /* canonical */
} tensor;

typedef struct rsv_buf rsv_buf;
typedef struct rsv_entry rsv_entry;

struct rsv_buf {
    uint64_t offset, size; /* the allocation (size >= 1) */
    char *mm_hash;         /* in the same allocation (buf_alloc) */
    size_t hash_cap;       /* bytes there for it (a spare is reused for a hash that fits) */
    tensor tn;
    unsigned refs, leases;
    bool published, resident;
    bool held;                   /* published: it holds its lease in the cache (refs or leases) */
    bool orphan;                 /* in the orphans index: its writer refreshed away */
    rsv_entry *orphan_followers; /* orphan: the followers waiting for a new writer */
    UT_hash_handle hh_orphan;    /* orphans index, by mm_hash */
    rsv_buf *all_prev, *all_next;
};

struct rsv_entry {
    char *transfer_id;
    char *mm_hash;
    char reservation_id[ECT_ID_LEN + 1];
    char owner[RSV_OWNER_MAX + 1]; /* the reserving peer ("" unknown) */
    tensor tn;
    rsv_state state;
    rsv_role role;
    bool cancel_requested; /* EXPIRE_PENDING that a plain cancel reached */
    rsv_end why;           /* tombstones: why it ended */
    uint64_t ended_at;     /* tombstones: when */
    rsv_buf *buf;          /* NULL in tombstones */
    rsv_entry *lead;       /* follower: its writer */
    rsv_entry *followers;  /* writer: its WRITING followers */
    rsv_entry *fol_prev, *fol_next;
    size_t str_cap; /* bytes after the entry for transfer_id and mm_hash */
    idt_node node;  /* by transfer_id, on live, pending or tombs */
    UT_hash_handle hh_inflight;
    uint64_t ready_seq; /* when it became READY (rsv_ready_list); 0 before */
    bool taken;         /* READY and taken by the consumer (rsv_take) */
};

#define ENTRY(n) IDT_ENTRY(n, rsv_entry, node)
#define LIST_PENDING (IDT_LIVE + 1)

/* Popped event nodes and freed buffer records kept for reuse: enough for a
 * few steps' items. A spare buffer record has room for a hash this long. */
/* Popped event nodes, freed buffer records and dropped entries kept for
 * reuse. Spares never outnumber what was held at once, so the caps only
 * bound a burst's leftovers: 8 steps of 32 items in flight queue up to 256
 * events and hold 256 buffers at once (256 spares missed at every step's
 * edge). An entry is dropped when its tombstone goes (cap or TTL), so a
 * busy shard's reserve reuses the entry of the tombstone it pushed out. A
 * spare buffer record has room for a hash this long, a spare entry for ids
 * this long together. */
#define SPARE_EVENTS 1024
#define SPARE_BUFS 1024
#define SPARE_ENTRIES 1024
#define RSV_BUF_HASH_MIN 64
#define RSV_ENTRY_STR_MIN 128

typedef struct ev_node {
    rsv_event ev;
    struct ev_node *prev, *next;
} ev_node;

/* A spare: a range granted ahead to one peer, no entry yet (rsv_spare_grant). */
typedef struct spare_rng {
    char id[ECT_ID_LEN + 1];
    char owner[RSV_OWNER_MAX + 1];
    uint64_t offset, size, expires;
    struct spare_rng *next;
} spare_rng;

struct rsv_table {
    rsv_opts o;
    spare_rng *spares; /* newest first; at most one per owner */
    uint64_t now;
    idtab ids;
    rsv_entry *inflight;
    resident_cache *cache; /* published buffers (mem/resident) */
    rsv_buf *orphans, *all;
    ev_node *events;
    ect_spares spare_events;  /* popped nodes kept for the next events */
    ect_spares spare_bufs;    /* freed buffer records kept for the next reserves */
    ect_spares spare_entries; /* dropped entries kept for the next reserves */
    rsv_stats st;
    /* The entry the latest lookup found, or NULL: an op and the guard's
     * lookup just before it name the same id, so the second costs one
     * compare. Cleared when that entry leaves the table. */
    rsv_entry *last;
    uint64_t ready_seq; /* the latest entry's readiness seq (rsv_ready_list) */
};

static const char *const state_names[] = {
    "?", "WRITING", "READY", "CANCEL_PENDING", "EXPIRE_PENDING", "CANCELLED", "EXPIRED"};

const char *rsv_state_name(rsv_state s) {
    return (s >= RSV_WRITING && s <= RSV_EXPIRED) ? state_names[s] : "?";
}

const char *rsv_end_text(rsv_end why) {
    switch (why) {
    case RSV_END_PRECANCEL: return "cancelled by the consumer's scheduler before it was reserved";
    case RSV_END_CANCELLED: return "cancelled by the consumer's scheduler";
    case RSV_END_ABANDONED: return "abandoned by a producer";
    case RSV_END_FINISHED: return "already delivered (the engine took and released it)";
    case RSV_END_EXPIRED: return "expired (its TTL ran out)";
    case RSV_END_NONE: break;
    }
    return "ended";
}

static int pool_alloc(void *ctx, uint64_t nbytes, uint64_t *offset) {
    return pool_try_alloc(ctx, nbytes, offset);
}

static void pool_free(void *ctx, uint64_t offset, uint64_t nbytes) {
    int rc = ect_pool_free(ctx, offset);
    if (rc)
        ECT_LOGE(MOD, "freeing %" PRIu64 " bytes at %" PRIu64 ": %s", nbytes, offset,
                 ect_last_error());
}

const rsv_mem_ops rsv_pool_ops = {pool_alloc, pool_free, NULL};

void rsv_opts_init(rsv_opts *o) {
    memset(o, 0, sizeof *o);
    o->ttl_ms = RSV_DEFAULT_TTL_MS;
    o->pending_grace_ms = RSV_DEFAULT_TTL_MS;
    o->max_tombstones = RSV_DEFAULT_MAX_TOMBSTONES;
    o->max_events = RSV_DEFAULT_MAX_EVENTS;
}

static void on_drop(void *ctx, idt_node *n);

int rsv_open(const rsv_opts *o, rsv_table **out) {
    *out = NULL;
    if (!o || !o->mem || !o->mem->alloc || !o->mem->free)
        return ect_set_error(ECT_EINVAL, "rsv_opts.mem: alloc and free callbacks are required");
    if (o->ttl_ms == 0) return ect_set_error(ECT_EINVAL, "rsv_opts.ttl_ms must be > 0");
    if (o->max_tombstones == 0)
        return ect_set_error(ECT_EINVAL, "rsv_opts.max_tombstones must be > 0");
    if (o->max_events == 0) return ect_set_error(ECT_EINVAL, "rsv_opts.max_events must be > 0");
    rsv_table *t = calloc(1, sizeof *t);
    if (!t) return ect_set_error(ECT_ENOMEM, "reservation table: out of memory");
    t->o = *o;
    t->spare_events = ECT_SPARES_INIT(ev_node, next, SPARE_EVENTS);
    t->spare_bufs = ECT_SPARES_INIT(rsv_buf, all_next, SPARE_BUFS);
    t->spare_entries = ECT_SPARES_INIT(rsv_entry, fol_next, SPARE_ENTRIES);
    if (resident_create(NULL, &t->cache)) {
        free(t);
        return ECT_ENOMEM;
    }
    idt_init(&t->ids, o->ttl_ms, o->max_tombstones, &(idt_ops){.drop = on_drop, .ctx = t});
    *out = t;
    return 0;
}

static uint64_t clamp_now(rsv_table *t, uint64_t now) {
    if (now > t->now) t->now = now;
    return t->now;
}

static bool is_tomb(rsv_state s) { return s == RSV_CANCELLED || s == RSV_EXPIRED; }
static bool is_pending(rsv_state s) { return s == RSV_CANCEL_PENDING || s == RSV_EXPIRE_PENDING; }
static bool in_live(rsv_state s) { return s == RSV_WRITING || s == RSV_READY; }

static int list_of(rsv_state s) {
    return in_live(s) ? IDT_LIVE : is_pending(s) ? LIST_PENDING : IDT_TOMBS;
}

/* ---- buffers */

/* A zeroed buffer record with its mm_hash in the same allocation, from the
 * spares when the first one fits, or NULL. The spares matter beyond the
 * malloc: a record is freed on the thread that releases the item (the
 * engine's) and allocated on the shard's, so malloc never found it in its
 * per-thread cache and took the arena's slow path every time. */
static rsv_buf *buf_alloc(rsv_table *t, const char *mm_hash) {
    size_t lm = strlen(mm_hash);
    rsv_buf *b = ect_spares_peek(&t->spare_bufs);
    if (b && b->hash_cap > lm) {
        ect_spares_get(&t->spare_bufs);
        size_t cap = b->hash_cap;
        memset(b, 0, sizeof *b);
        b->hash_cap = cap;
    } else {
        size_t cap = lm + 1 > RSV_BUF_HASH_MIN ? lm + 1 : RSV_BUF_HASH_MIN;
        if (!(b = calloc(1, sizeof *b + cap))) return NULL;
        b->hash_cap = cap;
        t->st.allocs++;
    }
    b->mm_hash = (char *)(b + 1);
    memcpy(b->mm_hash, mm_hash, lm + 1);
    return b;
}

/* A buffer record (on no list, in no index) to the spares, or freed. */
static void buf_release(rsv_table *t, rsv_buf *b) { ect_spares_put(&t->spare_bufs, b); }

/* Frees b and its memory; a published one leaves the cache (unheld, or
 * reclaimed from it already). */
static void buf_free(rsv_table *t, rsv_buf *b) {
    if (b->published) (void)resident_remove(t->cache, b->mm_hash);
    if (b->orphan) HASH_DELETE(hh_orphan, t->orphans, b);
    if (b->resident) t->st.resident--;
    DL_DELETE2(t->all, b, all_prev, all_next);
    t->o.mem->free(t->o.mem_ctx, b->offset, b->size);
    t->st.buffers--;
    t->st.bytes_held -= b->size;
    buf_release(t, b);
}

/* After b's refs or leases changed: a published buffer takes or gives back
 * its lease in the cache (giving it back counts as a use); one nothing holds
 * any more is freed unless it is kept resident. */
static void buf_settle(rsv_table *t, rsv_buf *b) {
    bool held = b->refs || b->leases;
    if (b->published && held != b->held) {
        int rc = held ? resident_get(t->cache, b->mm_hash, true, NULL)
                      : resident_release(t->cache, b->mm_hash);
        assert(rc == 0);
        (void)rc;
        b->held = held;
    }
    if (!held && !b->resident) buf_free(t, b);
}

static void buf_unref(rsv_table *t, rsv_buf *b) {
    assert(b->refs > 0);
    b->refs--;
    buf_settle(t, b);
}

static rsv_buf *find_published(const rsv_table *t, const char *h) {
    return resident_user(t->cache, h);
}

static rsv_entry *find_inflight(rsv_table *t, const char *h) {
    rsv_entry *e = NULL;
    HASH_FIND(hh_inflight, t->inflight, h, strlen(h), e);
    return e;
}

static rsv_buf *find_orphan(rsv_table *t, const char *h) {
    rsv_buf *b = NULL;
    HASH_FIND(hh_orphan, t->orphans, h, strlen(h), b);
    return b;
}

/* Frees the least recently used resident buffer nothing holds. */
static bool evict_one(rsv_table *t) {
    resident_victim v;
    void *user = NULL;
    if (resident_reclaim_one(t->cache, &v, &user)) return false;
    rsv_buf *b = user;
    b->published = false; /* the cache forgot it already */
    t->st.evictions++;
    buf_free(t, b);
    return true;
}

size_t rsv_evict_resident(rsv_table *t, size_t max) {
    size_t n = 0;
    while (n < max && evict_one(t)) n++;
    return n;
}

/* ---- spares (docs/PROTOCOL.md "a spare range granted ahead") */

/* Unlinks *pp and gives its range back to the pool. */
static void spare_drop(rsv_table *t, spare_rng **pp) {
    spare_rng *sp = *pp;
    *pp = sp->next;
    t->o.mem->free(t->o.mem_ctx, sp->offset, sp->size);
    t->st.spares--;
    t->st.spare_bytes -= sp->size;
    t->st.spares_dropped++;
    free(sp);
}

static spare_rng **spare_find(rsv_table *t, const char *id) {
    spare_rng **pp = &t->spares;
    while (*pp && strcmp((*pp)->id, id)) pp = &(*pp)->next;
    return pp;
}

/* Frees the spares whose time is up. */
static size_t spares_expire(rsv_table *t) {
    size_t n = 0;
    for (spare_rng **pp = &t->spares; *pp;) {
        if ((*pp)->expires > t->now) {
            pp = &(*pp)->next;
            continue;
        }
        spare_drop(t, pp);
        n++;
    }
    return n;
}

size_t rsv_spare_free_all(rsv_table *t) {
    size_t n = 0;
    while (t->spares) {
        spare_drop(t, &t->spares);
        n++;
    }
    return n;
}

bool rsv_spare_free(rsv_table *t, const char *id) {
    spare_rng **pp = spare_find(t, id);
    if (!*pp) return false;
    spare_drop(t, pp);
    return true;
}

bool rsv_spare_held(const rsv_table *t, const char *id) {
    for (const spare_rng *sp = t->spares; sp; sp = sp->next)
        if (!strcmp(sp->id, id)) return true;
    return false;
}

int rsv_spare_grant(rsv_table *t, const char *owner, uint64_t nbytes, uint64_t now_ms,
                    rsv_reply *reply) {
    memset(reply, 0, sizeof *reply);
    if (!nbytes) return ect_set_error(ECT_EINVAL, "ect_spare: 0 bytes");
    if (t->o.capacity && nbytes > t->o.capacity)
        return ect_set_error(ECT_EFULL, "ect_spare: more than the whole pool");
    clamp_now(t, now_ms);
    for (spare_rng **pp = &t->spares; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->owner, owner ? owner : "")) { /* at most one per peer */
            spare_drop(t, pp);
            break;
        }
    spare_rng *sp = calloc(1, sizeof *sp);
    if (!sp) return ect_set_error(ECT_ENOMEM, "ect_spare: out of memory");
    int rc = t->o.mem->alloc(t->o.mem_ctx, nbytes, &sp->offset); /* never reclaims */
    if (rc) {
        free(sp);
        return rc == ECT_EFULL ? ect_set_error(ECT_EFULL, "ect_spare: no free range") : rc;
    }
    ect_random_id(sp->id);
    ect_strcpy_cut(sp->owner, sizeof sp->owner, owner);
    sp->size = nbytes;
    sp->expires = t->now + t->o.ttl_ms;
    sp->next = t->spares;
    t->spares = sp;
    t->st.spares++;
    t->st.spare_bytes += nbytes;
    t->st.spares_granted++;
    memcpy(reply->reservation_id, sp->id, sizeof reply->reservation_id);
    reply->offset = sp->offset;
    reply->nbytes = nbytes;
    reply->write = true;
    return 0;
}

/* ---- events */

static void fill_status(const rsv_entry *e, rsv_status *st) {
    memset(st, 0, sizeof *st);
    ect_strcpy_cut(st->mm_hash, sizeof st->mm_hash, e->mm_hash);
    memcpy(st->reservation_id, e->reservation_id, sizeof st->reservation_id);
    memcpy(st->dtype, e->tn.dtype, sizeof st->dtype);
    memcpy(st->shape, e->tn.shape, sizeof st->shape);
    st->ndim = e->tn.ndim;
    st->nbytes = e->tn.nbytes;
    st->offset = e->buf ? e->buf->offset : 0;
    st->state = e->state;
    st->ready = e->state == RSV_READY;
    st->writer = e->role == ROLE_WRITER;
    memcpy(st->owner, e->owner, sizeof st->owner);
}

static void fill_event(rsv_event *ev, const rsv_entry *e, rsv_event_kind kind) {
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ect_strcpy_cut(ev->transfer_id, sizeof ev->transfer_id, e->transfer_id);
    fill_status(e, &ev->st);
}

static void queue_event(rsv_table *t, rsv_entry *e, rsv_event_kind kind) {
    ev_node *n;
    if (kind == RSV_EV_READY) e->ready_seq = ++t->ready_seq; /* the event may be lost */
    if (t->st.events >= t->o.max_events) {
        n = t->events; /* reuse the oldest node: no allocation can fail here */
        ECT_LOGW_ID(MOD, n->ev.transfer_id, NULL,
                    "EC event backlog full (%zu); dropping %s event for transfer_id=%s",
                    t->o.max_events, n->ev.kind == RSV_EV_READY ? "readiness" : "abandoned",
                    n->ev.transfer_id);
        DL_DELETE(t->events, n);
        t->st.events--;
        t->st.events_dropped++;
    } else if (!(n = ect_spares_get(&t->spare_events))) {
        if (!(n = malloc(sizeof *n))) {
            ECT_LOGE_ID(MOD, e->transfer_id, NULL,
                        "out of memory queueing an event for transfer_id=%s", e->transfer_id);
            t->st.events_dropped++;
            return;
        }
        t->st.allocs++;
    }
    fill_event(&n->ev, e, kind);
    DL_APPEND(t->events, n);
    t->st.events++;
}

const rsv_event *rsv_event_peek(const rsv_table *t) { return t->events ? &t->events->ev : NULL; }

void rsv_event_pop(rsv_table *t) {
    ev_node *n = t->events;
    if (!n) return;
    DL_DELETE(t->events, n);
    t->st.events--;
    ect_spares_put(&t->spare_events, n); /* the next queue_event takes it: no malloc per event */
}

/* ---- entries */

/* A zeroed entry with its transfer_id and mm_hash in the same allocation
 * (one malloc per reserve, not three), from the spares when the first one
 * has room, or NULL. */
static rsv_entry *alloc_entry(rsv_table *t, const char *transfer_id, const char *mm_hash) {
    size_t lt = strlen(transfer_id), lm = strlen(mm_hash), need = lt + lm + 2;
    rsv_entry *e = ect_spares_peek(&t->spare_entries);
    if (e && e->str_cap >= need) {
        ect_spares_get(&t->spare_entries);
        size_t cap = e->str_cap;
        memset(e, 0, sizeof *e);
        e->str_cap = cap;
    } else {
        size_t cap = need > RSV_ENTRY_STR_MIN ? need : RSV_ENTRY_STR_MIN;
        if (!(e = calloc(1, sizeof *e + cap))) return NULL;
        e->str_cap = cap;
        t->st.allocs++;
    }
    e->transfer_id = (char *)(e + 1);
    memcpy(e->transfer_id, transfer_id, lt + 1);
    e->mm_hash = e->transfer_id + lt + 1;
    memcpy(e->mm_hash, mm_hash, lm + 1);
    return e;
}

/* An entry (in no index, on no list) to the spares, or freed. */
static void free_entry_mem(rsv_table *t, rsv_entry *e) { ect_spares_put(&t->spare_entries, e); }

/* idt_ops.drop: a tombstone expired or went over the cap (or close). */
static void on_drop(void *ctx, idt_node *n) {
    rsv_table *t = ctx;
    if (t->last == ENTRY(n)) t->last = NULL;
    free_entry_mem(t, ENTRY(n));
}

static void entry_free(rsv_table *t, rsv_entry *e) {
    if (t->last == e) t->last = NULL;
    idt_remove(&t->ids, &e->node);
    free_entry_mem(t, e);
}

static rsv_entry *lookup(const rsv_table *t, const char *id) {
    idt_node *n = idt_find(&t->ids, id);
    return n ? ENTRY(n) : NULL;
}

/* The entry of id (NULL: none), remembered for the next lookup. */
static rsv_entry *find_entry(rsv_table *t, const char *id) {
    if (t->last && id && strcmp(t->last->transfer_id, id) == 0) return t->last;
    rsv_entry *e = lookup(t, id);
    if (e) t->last = e;
    return e;
}

/* Moves e to `s`, relinking it on the right list with `deadline` (a
 * tombstone: one TTL from now; the cap may drop the oldest one). */
static void set_state(rsv_table *t, rsv_entry *e, rsv_state s, uint64_t deadline) {
    e->state = s;
    if (is_tomb(s)) e->ended_at = t->now;
    idt_move(&t->ids, &e->node, list_of(s), is_tomb(s) ? t->now : deadline);
}

/* Makes e a tombstone (ended for `why`): drops its hold on the buffer and
 * its follower link. */
static void entomb(rsv_table *t, rsv_entry *e, rsv_state s, rsv_end why) {
    if (e->role == ROLE_WRITER && e->state == RSV_WRITING) HASH_DELETE(hh_inflight, t->inflight, e);
    if (e->lead) {
        DL_DELETE2(e->lead->followers, e, fol_prev, fol_next);
        e->lead = NULL;
    } else if (e->role == ROLE_FOLLOWER && e->state == RSV_WRITING && e->buf && e->buf->orphan) {
        DL_DELETE2(e->buf->orphan_followers, e, fol_prev, fol_next);
    }
    e->why = why;
    rsv_buf *b = e->buf;
    e->buf = NULL;
    set_state(t, e, s, t->now + t->o.ttl_ms);
    if (b) buf_unref(t, b);
}

/* The writer leaves WRITING without publishing: its followers can never
 * become ready, so they end now and the scheduler hears it at once. */
static void abandon_followers(rsv_table *t, rsv_entry *w) {
    rsv_entry *f, *tmp;
    DL_FOREACH_SAFE2(w->followers, f, tmp, fol_next) {
        queue_event(t, f, RSV_EV_ABANDONED);
        entomb(t, f, RSV_CANCELLED, RSV_END_ABANDONED);
    }
}

/* A refreshing writer leaves its followers waiting on the buffer: it becomes
 * an orphan, adopted by the next reserve of the hash (reserve_new). */
static void orphan_followers(rsv_table *t, rsv_entry *w) {
    rsv_buf *b = w->buf;
    rsv_entry *f, *tmp;
    DL_FOREACH_SAFE2(w->followers, f, tmp, fol_next) {
        DL_DELETE2(w->followers, f, fol_prev, fol_next);
        f->lead = NULL;
        DL_APPEND2(b->orphan_followers, f, fol_prev, fol_next);
    }
    hash_oom = 0;
    HASH_ADD_KEYPTR(hh_orphan, t->orphans, b->mm_hash, strlen(b->mm_hash), b);
    if (hash_oom) { /* cannot index it: end the followers as a plain abandon would */
        DL_FOREACH_SAFE2(b->orphan_followers, f, tmp, fol_next) {
            DL_DELETE2(b->orphan_followers, f, fol_prev, fol_next);
            queue_event(t, f, RSV_EV_ABANDONED);
            entomb(t, f, RSV_CANCELLED, RSV_END_ABANDONED); /* b->orphan is false: unlinked */
        }
        return;
    }
    b->orphan = true;
}

static size_t reap(rsv_table *t) {
    size_t n = 0;
    uint64_t now = t->now;
    idt_node *head;
    while ((head = idt_first(&t->ids, IDT_LIVE)) && head->deadline <= now) {
        rsv_entry *e = ENTRY(head);
        n++;
        if (e->state == RSV_READY) {
            t->st.expired_ready++;
            entomb(t, e, RSV_EXPIRED, RSV_END_EXPIRED);
        } else if (e->role == ROLE_FOLLOWER) {
            queue_event(t, e, RSV_EV_ABANDONED);
            entomb(t, e, RSV_CANCELLED, RSV_END_EXPIRED);
        } else {
            t->st.expired_writing++;
            /* The writer may still be writing: keep its memory. No event for
             * it: a producer that is still alive refreshes and reserves anew. */
            HASH_DELETE(hh_inflight, t->inflight, e);
            abandon_followers(t, e);
            set_state(t, e, RSV_EXPIRE_PENDING, now + t->o.pending_grace_ms);
        }
    }
    if (t->o.mem->write_active) {
        for (idt_node *nd = idt_first(&t->ids, LIST_PENDING), *next; nd; nd = next) {
            next = nd->next;
            rsv_entry *e = ENTRY(nd);
            if (nd->deadline > now ||
                t->o.mem->write_active(t->o.mem_ctx, e->buf->offset, e->buf->size))
                continue;
            ECT_LOGW_ID(MOD, e->transfer_id, e->mm_hash,
                        "transfer_id=%s: writer silent past its grace; freeing its memory",
                        e->transfer_id);
            bool cancelled = e->state == RSV_CANCEL_PENDING || e->cancel_requested;
            entomb(t, e, cancelled ? RSV_CANCELLED : RSV_EXPIRED,
                   cancelled ? RSV_END_CANCELLED : RSV_END_EXPIRED);
            n++;
        }
    }
    n += spares_expire(t);
    return n + idt_expire(&t->ids, now);
}

size_t rsv_reap(rsv_table *t, uint64_t now_ms) {
    clamp_now(t, now_ms);
    return reap(t);
}

/* ---- reserve */

static int check_key(const char *s, const char *field) {
    if (!s || !*s) return ect_set_error(ECT_EINVAL, "%s must be a non-empty string", field);
    if (strlen(s) > RSV_KEY_MAX)
        return ect_set_error(ECT_EINVAL, "%s is longer than %d bytes", field, RSV_KEY_MAX);
    return 0;
}

static bool same_tensor(const tensor *a, const tensor *b) {
    return a->nbytes == b->nbytes && a->ndim == b->ndim && strcmp(a->dtype, b->dtype) == 0 &&
           memcmp(a->shape, b->shape, a->ndim * sizeof *a->shape) == 0;
}

/* A use of a published buffer: the most recently used in the cache. */
static void touch(rsv_table *t, rsv_buf *b) {
    (void)resident_get(t->cache, b->mm_hash, false, NULL);
}

static void reply_for(const rsv_entry *e, rsv_reply *r) {
    memset(r, 0, sizeof *r);
    memcpy(r->reservation_id, e->reservation_id, sizeof r->reservation_id);
    r->offset = e->buf ? e->buf->offset : 0;
    r->nbytes = e->tn.nbytes;
    r->ready = e->state == RSV_READY;
    r->cached = e->role == ROLE_CACHED;
}

/* Allocation with the reclaim ladder of SPEC.md: expire, retry, evict
 * least-recently-used residents one at a time, and only then give up. */
static int alloc_reclaiming(rsv_table *t, uint64_t size, uint64_t *off) {
    int rc = t->o.mem->alloc(t->o.mem_ctx, size, off);
    if (rc != ECT_EFULL) return rc;
    if (reap(t) > 0) rc = t->o.mem->alloc(t->o.mem_ctx, size, off);
    while (rc == ECT_EFULL && evict_one(t)) rc = t->o.mem->alloc(t->o.mem_ctx, size, off);
    while (rc == ECT_EFULL && t->spares) { /* a spare never costs a reserve its room */
        spare_drop(t, &t->spares);
        rc = t->o.mem->alloc(t->o.mem_ctx, size, off);
    }
    return rc;
}

static rsv_entry *new_entry(rsv_table *t, const rsv_request *r, const tensor *tn) {
    rsv_entry *e = alloc_entry(t, r->transfer_id, r->mm_hash ? r->mm_hash : "");
    if (!e) return NULL;
    e->tn = *tn;
    ect_strcpy_cut(e->owner, sizeof e->owner, r->owner);
    ect_random_id(e->reservation_id);
    return e;
}

/* Indexes e by transfer_id and files it in state s. ECT_ENOMEM (nothing
 * changed) when the index cannot grow. */
static int add_entry(rsv_table *t, rsv_entry *e, rsv_state s, uint64_t deadline) {
    e->node.id = e->transfer_id;
    e->state = s;
    if (idt_add(&t->ids, &e->node, list_of(s), is_tomb(s) ? t->now : deadline))
        return ect_set_error(ECT_ENOMEM, "reservation index: out of memory");
    size_t live = idt_live(&t->ids);
    if (live > t->st.peak_live) t->st.peak_live = live;
    return 0;
}

/* Makes e a WRITING writer, indexed in flight by mm_hash and by
 * transfer_id. ECT_ENOMEM with nothing indexed. */
static int index_writer(rsv_table *t, rsv_entry *e, uint64_t expiry) {
    e->role = ROLE_WRITER;
    hash_oom = 0;
    HASH_ADD_KEYPTR(hh_inflight, t->inflight, e->mm_hash, strlen(e->mm_hash), e);
    bool indexed = !hash_oom;
    if (!indexed || add_entry(t, e, RSV_WRITING, expiry)) {
        if (indexed) HASH_DELETE(hh_inflight, t->inflight, e);
        return ECT_ENOMEM;
    }
    return 0;
}

/* Makes e the WRITING writer of a new buffer b over [off, off + size):
 * indexed in flight and by transfer_id. ECT_ENOMEM with nothing changed
 * (the caller still owns e, b and the range). */
static int install_writer(rsv_table *t, rsv_entry *e, rsv_buf *b, uint64_t off, uint64_t size,
                          const tensor *tn, uint64_t expiry) {
    if (index_writer(t, e, expiry)) return ECT_ENOMEM;
    b->offset = off;
    b->size = size;
    b->tn = *tn;
    b->refs = 1;
    DL_APPEND2(t->all, b, all_prev, all_next);
    t->st.buffers++;
    t->st.bytes_held += size;
    if (t->st.bytes_held > t->st.peak_bytes) t->st.peak_bytes = t->st.bytes_held;
    e->buf = b;
    return 0;
}

static int reserve_new(rsv_table *t, const rsv_request *r, const tensor *tn, rsv_reply *reply) {
    uint64_t expiry = t->now + t->o.ttl_ms;
    rsv_buf *pub = find_published(t, r->mm_hash);
    rsv_entry *w = pub ? NULL : find_inflight(t, r->mm_hash);
    rsv_buf *orph = pub || w ? NULL : find_orphan(t, r->mm_hash);
    if (pub && !same_tensor(&pub->tn, tn))
        return ect_set_error(ECT_EEXIST, "conflicting cached tensor for mm_hash '%s'", r->mm_hash);
    if ((w && !same_tensor(&w->tn, tn)) || (orph && !same_tensor(&orph->tn, tn)))
        return ect_set_error(ECT_EEXIST, "conflicting in-flight tensor for mm_hash '%s'",
                             r->mm_hash);
    rsv_entry *e = new_entry(t, r, tn);
    if (!e) return ect_set_error(ECT_ENOMEM, "reserve: out of memory");
    if (pub) { /* (1) dedup against the published copy: no bytes move */
        e->role = ROLE_CACHED;
        e->buf = pub;
        if (add_entry(t, e, RSV_READY, expiry)) {
            free_entry_mem(t, e);
            return ECT_ENOMEM;
        }
        pub->refs++;
        touch(t, pub);
        buf_settle(t, pub); /* held again */
        queue_event(t, e, RSV_EV_READY);
    } else if (w) { /* (2) follow the writer already writing this hash */
        e->role = ROLE_FOLLOWER;
        e->buf = w->buf;
        e->lead = w;
        if (add_entry(t, e, RSV_WRITING, expiry)) {
            free_entry_mem(t, e);
            return ECT_ENOMEM;
        }
        w->buf->refs++;
        DL_APPEND2(w->followers, e, fol_prev, fol_next);
    } else if (orph) { /* (2b) adopt the followers a refreshed writer left waiting */
        e->buf = orph;
        if (index_writer(t, e, expiry)) {
            free_entry_mem(t, e);
            return ect_set_error(ECT_ENOMEM, "reserve: out of memory");
        }
        HASH_DELETE(hh_orphan, t->orphans, orph);
        orph->orphan = false;
        orph->refs++;
        rsv_entry *f, *tmp;
        DL_FOREACH_SAFE2(orph->orphan_followers, f, tmp, fol_next) {
            DL_DELETE2(orph->orphan_followers, f, fol_prev, fol_next);
            f->lead = e;
            DL_APPEND2(e->followers, f, fol_prev, fol_next);
        }
        t->st.adopted++;
    } else { /* (3) allocate */
        rsv_buf *b = buf_alloc(t, r->mm_hash);
        uint64_t size = tn->nbytes ? tn->nbytes : 1, off = 0;
        if (t->o.capacity && size > t->o.capacity) {
            free(b); /* not kept: a failed reserve holds no more memory than before */
            free_entry_mem(t, e);
            return ect_set_error(ECT_EFULL,
                                 "EC consumer buffer pool is full: more than the whole pool "
                                 "(%" PRIu64 " bytes wanted, %" PRIu64
                                 " in the pool) for transfer_id '%s'",
                                 tn->nbytes, t->o.capacity, r->transfer_id);
        }
        int rc = b ? alloc_reclaiming(t, size, &off) : ECT_ENOMEM;
        if (rc) {
            free(b);
            free_entry_mem(t, e);
            if (rc == ECT_EFULL)
                return ect_set_error(ECT_EFULL,
                                     "EC consumer buffer pool is full (%" PRIu64
                                     " bytes wanted for transfer_id '%s'; %zu reservations "
                                     "hold %" PRIu64 " bytes, nothing left to reclaim)",
                                     tn->nbytes, r->transfer_id, idt_live(&t->ids),
                                     t->st.bytes_held);
            if (rc == ECT_ENOMEM) return ect_set_error(rc, "reserve: out of memory");
            return rc;
        }
        if (install_writer(t, e, b, off, size, tn, expiry)) {
            t->o.mem->free(t->o.mem_ctx, off, size); /* nobody was told about it */
            free(b);
            free_entry_mem(t, e);
            return ect_set_error(ECT_ENOMEM, "reserve: out of memory");
        }
    }
    reply_for(e, reply);
    reply->write = e->role == ROLE_WRITER;
    return 0;
}

/* The fields of a reserve (or a spare's bind) and the tensor they describe. */
static int check_request(const rsv_request *req, tensor *tn) {
    int rc;
    if ((rc = check_key(req->transfer_id, "transfer_id")) ||
        (rc = check_key(req->mm_hash, "mm_hash")))
        return rc;
    if (req->ndim && !req->shape)
        return ect_set_error(ECT_EINVAL, "reserve: shape is missing (%zu dimensions)", req->ndim);
    if ((rc = wire_check_nbytes(req->dtype, req->shape, req->ndim, req->nbytes, "reserve")))
        return rc;
    memset(tn, 0, sizeof *tn);
    tn->nbytes = req->nbytes;
    tn->ndim = req->ndim;
    ect_strcpy_cut(tn->dtype, sizeof tn->dtype, wire_dtype_canonical(req->dtype));
    if (req->ndim) memcpy(tn->shape, req->shape, req->ndim * sizeof *req->shape);
    return 0;
}

/* What a reserve and a put do first: reply cleared, req checked (its
 * tensor in *tn), the clock advanced and what is due reaped. */
static int begin_request(rsv_table *t, const rsv_request *req, uint64_t now_ms, rsv_reply *reply,
                         tensor *tn) {
    memset(reply, 0, sizeof *reply);
    int rc = check_request(req, tn);
    if (rc) return rc;
    clamp_now(t, now_ms);
    reap(t);
    return 0;
}

int rsv_spare_bind(rsv_table *t, const char *spare_id, const char *spare_owner,
                   const rsv_request *req, uint64_t now_ms, rsv_reply *reply) {
    tensor tn;
    int rc = begin_request(t, req, now_ms, reply, &tn);
    if (rc) return rc;
    spare_rng **pp = spare_find(t, spare_id ? spare_id : ""), *sp = *pp;
    if (!sp)
        return ect_set_error(ECT_ENOTFOUND,
                             "ect_put: no spare '%.64s' (expired, freed or never granted)",
                             spare_id ? spare_id : "");
    if (strcmp(sp->owner, spare_owner ? spare_owner : ""))
        return ect_set_error(ECT_EACCES, "ect_put: spare '%.64s' belongs to another peer",
                             spare_id);
    if (tn.nbytes > sp->size)
        return ect_set_error(ECT_EINVAL,
                             "ect_put: %" PRIu64 " bytes do not fit the spare's %" PRIu64,
                             tn.nbytes, sp->size);
    if (find_entry(t, req->transfer_id))
        return ect_set_error(ECT_EEXIST, "ect_put: transfer_id '%.64s' is known: reserve it",
                             req->transfer_id);
    if (find_published(t, req->mm_hash) || find_inflight(t, req->mm_hash) ||
        find_orphan(t, req->mm_hash))
        return ect_set_error(ECT_EEXIST,
                             "ect_put: mm_hash '%.64s' is cached or in flight: reserve it",
                             req->mm_hash);
    rsv_entry *e = new_entry(t, req, &tn);
    rsv_buf *b = e ? buf_alloc(t, req->mm_hash) : NULL;
    if (!b || install_writer(t, e, b, sp->offset, sp->size, &tn, t->now + t->o.ttl_ms)) {
        free(b);
        if (e) free_entry_mem(t, e);
        return ect_set_error(ECT_ENOMEM, "ect_put: out of memory");
    }
    /* the spare's id is the window's and the complete's; its range the writer's now */
    memcpy(e->reservation_id, sp->id, sizeof e->reservation_id);
    *pp = sp->next;
    t->st.spares--;
    t->st.spare_bytes -= sp->size;
    t->st.spares_bound++;
    free(sp);
    reply_for(e, reply);
    reply->write = true;
    return 0;
}

int rsv_reserve(rsv_table *t, const rsv_request *req, uint64_t now_ms, rsv_reply *reply) {
    tensor tn;
    int rc = begin_request(t, req, now_ms, reply, &tn);
    if (rc) return rc;
    rsv_entry *e = find_entry(t, req->transfer_id);
    if (e) {
        switch (e->state) {
        case RSV_CANCELLED:
        case RSV_CANCEL_PENDING:
            reply->cancelled = true;
            reply->why = e->state == RSV_CANCEL_PENDING ? RSV_END_CANCELLED : e->why;
            reply->ended_ms_ago = e->state == RSV_CANCELLED ? t->now - e->ended_at : 0;
            return 0;
        case RSV_EXPIRED: entry_free(t, e); break;
        case RSV_EXPIRE_PENDING:
            return ect_set_error(ECT_EBUSY,
                                 "reservation for transfer_id '%s' still has an active writer",
                                 req->transfer_id);
        case RSV_WRITING:
        case RSV_READY:
            if (strcmp(e->mm_hash, req->mm_hash) != 0 || !same_tensor(&e->tn, &tn))
                return ect_set_error(ECT_EEXIST, "conflicting reservation for transfer_id '%s'",
                                     req->transfer_id);
            if (e->state == RSV_WRITING) {
                idt_move(&t->ids, &e->node, IDT_LIVE, t->now + t->o.ttl_ms);
            }
            reply_for(e, reply);
            return 0;
        }
    }
    return reserve_new(t, req, &tn, reply);
}

/* ---- complete / cancel */

/* False (nothing changed) when the cache cannot take the buffer: the writer
 * stays WRITING and may complete again or abandon. */
static bool publish(rsv_table *t, rsv_entry *w) {
    uint64_t expiry = t->now + t->o.ttl_ms;
    rsv_buf *b = w->buf;
    assert(!find_published(t, b->mm_hash));
    if (resident_put(t->cache, b->mm_hash, b->offset, b->size, b->tn.shape, b->tn.ndim, b->tn.dtype,
                     true)) {
        ECT_LOGE_ID(MOD, w->transfer_id, w->mm_hash, "publishing transfer_id=%s: %s; not completed",
                    w->transfer_id, ect_last_error());
        return false;
    }
    resident_bind(t->cache, b->mm_hash, b);
    HASH_DELETE(hh_inflight, t->inflight, w);
    b->published = true;
    b->held = true; /* its writer and followers */
    set_state(t, w, RSV_READY, expiry);
    queue_event(t, w, RSV_EV_READY);
    rsv_entry *f, *tmp;
    DL_FOREACH_SAFE2(w->followers, f, tmp, fol_next) {
        DL_DELETE2(w->followers, f, fol_prev, fol_next);
        f->lead = NULL;
        set_state(t, f, RSV_READY, expiry);
        queue_event(t, f, RSV_EV_READY);
    }
    return true;
}

void rsv_complete(rsv_table *t, const char *transfer_id, const char *reservation_id,
                  uint64_t now_ms, bool *completed, bool *became_ready) {
    *completed = *became_ready = false;
    clamp_now(t, now_ms);
    rsv_entry *e = find_entry(t, transfer_id);
    /* A late completion of an old reservation carries another id and must
     * not complete the reservation that replaced it. */
    if (!e || !reservation_id || !*reservation_id || strcmp(e->reservation_id, reservation_id))
        return;
    switch (e->state) {
    case RSV_READY: *completed = true; return;
    case RSV_WRITING:
        *completed = true;
        if (e->role == ROLE_WRITER) {
            *completed = publish(t, e);
            *became_ready = *completed;
        }
        return;
    case RSV_CANCEL_PENDING: entomb(t, e, RSV_CANCELLED, RSV_END_CANCELLED); return;
    case RSV_EXPIRE_PENDING:
        entomb(t, e, e->cancel_requested ? RSV_CANCELLED : RSV_EXPIRED,
               e->cancel_requested ? RSV_END_CANCELLED : RSV_END_EXPIRED);
        return;
    case RSV_CANCELLED:
    case RSV_EXPIRED: return;
    }
}

static int add_tombstone(rsv_table *t, const char *transfer_id) {
    rsv_entry *e = alloc_entry(t, transfer_id, "");
    if (!e) return ect_set_error(ECT_ENOMEM, "cancel: out of memory");
    e->why = RSV_END_PRECANCEL;
    e->ended_at = t->now;
    if (add_entry(t, e, RSV_CANCELLED, t->now + t->o.ttl_ms)) {
        free_entry_mem(t, e);
        return ECT_ENOMEM;
    }
    return 0;
}

int rsv_cancel(rsv_table *t, const char *transfer_id, const char *reservation_id, bool abandon,
               bool refresh, uint64_t now_ms, bool *cancelled) {
    int rc;
    *cancelled = false;
    if ((rc = check_key(transfer_id, "transfer_id"))) return rc;
    if (refresh && !abandon)
        return ect_set_error(ECT_EINVAL, "cancel: refresh needs abandon (transfer_id '%s')",
                             transfer_id);
    clamp_now(t, now_ms);
    rsv_entry *e = find_entry(t, transfer_id);
    if (!e) { /* pre-cancel: a later reserve gets the cancelled reply */
        if ((rc = add_tombstone(t, transfer_id))) return rc;
        *cancelled = true;
        return 0;
    }
    if (reservation_id && *reservation_id && strcmp(e->reservation_id, reservation_id)) return 0;
    rsv_state end = refresh ? RSV_EXPIRED : RSV_CANCELLED;
    rsv_end why = refresh ? RSV_END_EXPIRED : abandon ? RSV_END_ABANDONED : RSV_END_CANCELLED;
    bool live = !is_tomb(e->state);
    *cancelled = true;
    if (live && abandon && !refresh) t->st.abandoned++;
    switch (e->state) {
    case RSV_CANCELLED: break;
    case RSV_EXPIRED:
        if (!refresh) { /* remember the cancel for a later reserve */
            e->why = why;
            set_state(t, e, RSV_CANCELLED, t->now + t->o.ttl_ms);
        }
        break;
    case RSV_READY:
        if (abandon && !refresh) queue_event(t, e, RSV_EV_ABANDONED);
        entomb(t, e, end, why);
        break;
    case RSV_WRITING:
        if (e->role == ROLE_WRITER && refresh && e->followers) {
            /* The producer comes back for it (a refresh): whoever reserves
             * the hash next writes for the followers. */
            orphan_followers(t, e);
            entomb(t, e, end, why); /* drops it from the in-flight index */
            break;
        }
        if (e->role == ROLE_WRITER) {
            abandon_followers(t, e);
            if (!abandon) {
                /* The producer may be writing right now: keep the memory
                 * until it completes or abandons. */
                HASH_DELETE(hh_inflight, t->inflight, e);
                set_state(t, e, RSV_CANCEL_PENDING, t->now + t->o.pending_grace_ms);
                break;
            }
        }
        if (abandon && !refresh) queue_event(t, e, RSV_EV_ABANDONED);
        entomb(t, e, end, why);
        break;
    case RSV_CANCEL_PENDING:
        if (abandon) entomb(t, e, RSV_CANCELLED, RSV_END_CANCELLED);
        break;
    case RSV_EXPIRE_PENDING:
        if (abandon && !refresh) queue_event(t, e, RSV_EV_ABANDONED);
        if (abandon)
            entomb(t, e, refresh ? RSV_EXPIRED : RSV_CANCELLED, why);
        else
            e->cancel_requested = true;
        break;
    }
    return 0;
}

/* ---- status and residency */

int rsv_status_get(const rsv_table *t, const char *transfer_id, rsv_status *st) {
    const rsv_entry *e = lookup(t, transfer_id);
    if (!e)
        return ect_set_error(ECT_ENOTFOUND, "no reservation for transfer_id '%s'",
                             transfer_id ? transfer_id : "(null)");
    fill_status(e, st);
    return 0;
}

int rsv_brief_get(rsv_table *t, const char *transfer_id, rsv_brief *b) {
    const rsv_entry *e = transfer_id ? find_entry(t, transfer_id) : NULL;
    if (!e) return ECT_ENOTFOUND;
    b->state = e->state;
    b->writer = e->role == ROLE_WRITER;
    b->nbytes = e->tn.nbytes;
    b->reservation_id = e->reservation_id;
    b->owner = e->owner;
    return 0;
}

int rsv_take(rsv_table *t, const char *transfer_id, uint64_t now_ms, rsv_status *st) {
    clamp_now(t, now_ms);
    rsv_entry *e = find_entry(t, transfer_id);
    if (!e || is_tomb(e->state))
        return ect_set_error(ECT_ENOTFOUND, "take: no reservation for transfer_id '%s'",
                             transfer_id ? transfer_id : "(null)");
    if (e->state != RSV_READY)
        return ect_set_error(ECT_ESTATE, "take: transfer_id '%s' is %s, not READY", transfer_id,
                             rsv_state_name(e->state));
    e->buf->leases++; /* READY: held already */
    e->taken = true;
    touch(t, e->buf);
    fill_status(e, st);
    return 0;
}

int rsv_release(rsv_table *t, const char *mm_hash, uint64_t now_ms) {
    clamp_now(t, now_ms);
    rsv_buf *b = mm_hash ? find_published(t, mm_hash) : NULL;
    if (!b)
        return ect_set_error(ECT_ENOTFOUND, "release: no tensor for mm_hash '%s'",
                             mm_hash ? mm_hash : "(null)");
    if (b->leases == 0)
        return ect_set_error(ECT_ESTATE, "release: mm_hash '%s' is not taken", mm_hash);
    b->leases--;
    if (!b->resident) {
        b->resident = true;
        t->st.resident++;
    }
    touch(t, b);
    buf_settle(t, b);
    return 0;
}

int rsv_finish(rsv_table *t, const char *transfer_id, uint64_t now_ms) {
    clamp_now(t, now_ms);
    rsv_entry *e = find_entry(t, transfer_id);
    if (!e)
        return ect_set_error(ECT_ENOTFOUND, "finish: no reservation for transfer_id '%s'",
                             transfer_id ? transfer_id : "(null)");
    if (e->state != RSV_READY)
        return ect_set_error(ECT_ESTATE, "finish: transfer_id '%s' is %s, not READY", transfer_id,
                             rsv_state_name(e->state));
    t->st.finished++;
    rsv_buf *b = e->buf;
    if (!b->resident) { /* keep the bytes for dedup: resident, reclaimable */
        b->resident = true;
        t->st.resident++;
    }
    touch(t, b);
    entomb(t, e, RSV_CANCELLED, RSV_END_FINISHED);
    return 0;
}

void rsv_get_stats(const rsv_table *t, rsv_stats *st) {
    *st = t->st;
    st->live = idt_live(&t->ids);
    st->tombstones = idt_count(&t->ids, IDT_TOMBS);
    st->tombstones_dropped = t->ids.dropped;
    resident_stats r;
    resident_get_stats(t->cache, &r);
    st->published_bytes = r.bytes;
}

void rsv_close(rsv_table *t) {
    if (!t) return;
    /* The index tables live inside their first element: clear them while the
     * entries and buffers still exist. */
    HASH_CLEAR(hh_inflight, t->inflight);
    resident_destroy(t->cache);
    HASH_CLEAR(hh_orphan, t->orphans);
    idt_clear(&t->ids);
    rsv_buf *b, *btmp;
    DL_FOREACH_SAFE2(t->all, b, btmp, all_next) {
        t->o.mem->free(t->o.mem_ctx, b->offset, b->size);
        free(b);
    }
    rsv_spare_free_all(t);
    ev_node *n, *ntmp;
    DL_FOREACH_SAFE(t->events, n, ntmp) free(n);
    ect_spares_clear(&t->spare_events);
    ect_spares_clear(&t->spare_bufs);
    ect_spares_clear(&t->spare_entries);
    free(t);
}

/* ---- invariants */

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) return ect_set_error(ECT_ESTATE, __VA_ARGS__);                                \
    } while (0)

/* Every entry e of table t, list by list. */
#define FOR_EACH_ENTRY(t, e)                                                                       \
    for (int l_ = 0; l_ < IDT_LISTS; l_++)                                                         \
        for (const idt_node *n_ = idt_first(&(t)->ids, l_); n_ && ((e) = ENTRY(n_), 1);            \
             n_ = n_->next)

int rsv_check(const rsv_table *t) {
    size_t live = 0, tombs = 0, bufs = 0, resident = 0, events = 0;
    uint64_t bytes = 0;
    const rsv_entry *e;
    const rsv_buf *b;
    int rc = idt_check(&t->ids);
    if (rc) return rc;
    DL_FOREACH2(t->all, b, all_next) {
        unsigned refs = 0;
        FOR_EACH_ENTRY(t, e) refs += e->buf == b;
        CHECK(refs == b->refs, "buffer @%" PRIu64 " counts %u refs, %u entries hold it", b->offset,
              b->refs, refs);
        CHECK(b->refs || b->leases || b->resident, "buffer @%" PRIu64 " is held by nobody",
              b->offset);
        CHECK(!b->published || find_published(t, b->mm_hash) == b,
              "published buffer @%" PRIu64 " missing from the cache", b->offset);
        if (b->published) {
            ect_resident_info info;
            CHECK(resident_peek(t->cache, b->mm_hash, &info) == 0 &&
                      (info.leases != 0) == (b->refs || b->leases) && b->held == (info.leases != 0),
                  "published buffer @%" PRIu64 " holds the wrong lease in the cache", b->offset);
        }
        if (b->orphan) {
            unsigned waiting = 0;
            for (const rsv_entry *f = b->orphan_followers; f; f = f->fol_next) {
                CHECK(f->buf == b && f->role == ROLE_FOLLOWER && f->state == RSV_WRITING &&
                          !f->lead,
                      "orphan buffer @%" PRIu64 " lists a follower that is not waiting on it",
                      b->offset);
                waiting++;
            }
            CHECK(!b->published && waiting == b->refs && !b->leases &&
                      find_orphan((rsv_table *)t, b->mm_hash) == b &&
                      !find_inflight((rsv_table *)t, b->mm_hash),
                  "orphan buffer @%" PRIu64 " is not just its waiting followers'", b->offset);
        } else {
            CHECK(!b->orphan_followers, "buffer @%" PRIu64 " lists followers", b->offset);
        }
        bufs++;
        resident += b->resident;
        bytes += b->size;
    }
    FOR_EACH_ENTRY(t, e) {
        CHECK(e->state >= RSV_WRITING && e->state <= RSV_EXPIRED, "entry %s: bad state",
              e->transfer_id);
        CHECK(e->node.list == list_of(e->state), "entry %s (%s) on the wrong list", e->transfer_id,
              rsv_state_name(e->state));
        if (is_tomb(e->state)) {
            tombs++;
            CHECK(!e->buf && !e->lead && !e->followers, "tombstone %s holds memory or links",
                  e->transfer_id);
            continue;
        }
        live++;
        CHECK(e->buf, "live entry %s (%s) has no buffer", e->transfer_id, rsv_state_name(e->state));
        if (e->state == RSV_WRITING && e->role == ROLE_WRITER)
            CHECK(find_inflight((rsv_table *)t, e->mm_hash) == e && !e->buf->published,
                  "writer %s not indexed in flight", e->transfer_id);
        if (e->state == RSV_WRITING && e->role == ROLE_FOLLOWER)
            CHECK((e->lead && e->lead->state == RSV_WRITING && e->lead->buf == e->buf) ||
                      (!e->lead && e->buf->orphan),
                  "follower %s has no WRITING writer on its buffer", e->transfer_id);
        else
            CHECK(!e->lead, "entry %s links a writer", e->transfer_id);
        if (e->state == RSV_READY)
            CHECK(e->buf->published, "READY entry %s on an unpublished buffer", e->transfer_id);
        if (is_pending(e->state))
            CHECK(e->role == ROLE_WRITER && !e->followers && !e->buf->published,
                  "pending entry %s is not a lone writer", e->transfer_id);
    }
    CHECK(HASH_CNT(hh_inflight, t->inflight) <= live, "in-flight index larger than live set");
    CHECK(HASH_CNT(hh_orphan, t->orphans) <= bufs, "orphan index larger than the buffers");
    for (const ev_node *n = t->events; n; n = n->next) events++;
    CHECK(live == idt_live(&t->ids) && tombs == idt_count(&t->ids, IDT_TOMBS),
          "entry counters drifted");
    CHECK(bufs == t->st.buffers && resident == t->st.resident && bytes == t->st.bytes_held,
          "buffer counters drifted (%zu/%zu buffers, %" PRIu64 "/%" PRIu64 " bytes)", bufs,
          t->st.buffers, bytes, t->st.bytes_held);
    CHECK(events == t->st.events && events <= t->o.max_events, "event queue counter drifted");
    size_t nsp = 0;
    uint64_t spb = 0;
    for (const spare_rng *sp = t->spares; sp; sp = sp->next, nsp++) {
        spb += sp->size;
        for (const spare_rng *o = sp->next; o; o = o->next)
            CHECK(strcmp(o->owner, sp->owner), "two spares of one owner '%s'", sp->owner);
    }
    CHECK(nsp == t->st.spares && spb == t->st.spare_bytes, "spare counters drifted");
    CHECK(tombs <= t->o.max_tombstones, "tombstone cap exceeded");
    for (const idt_node *n = idt_first(&t->ids, IDT_LIVE); n && n->next; n = n->next)
        CHECK(n->deadline <= n->next->deadline, "live list out of deadline order");
    uint64_t seq = 0; /* rsv_ready_list relies on it */
    for (const idt_node *n = idt_first(&t->ids, IDT_LIVE); n; n = n->next) {
        if (ENTRY(n)->state != RSV_READY) continue;
        CHECK(ENTRY(n)->ready_seq > seq && ENTRY(n)->ready_seq <= t->ready_seq,
              "READY entry %s out of readiness order", ENTRY(n)->transfer_id);
        seq = ENTRY(n)->ready_seq;
    }
    return 0;
}

void rsv_count_states(const rsv_table *t, uint64_t counts[RSV_EXPIRED + 1]) {
    memset(counts, 0, sizeof(uint64_t) * (RSV_EXPIRED + 1));
    for (int l = 0; l < IDT_LISTS; l++)
        for (idt_node *n = idt_first(&t->ids, l); n; n = n->next) {
            rsv_state s = ENTRY(n)->state;
            if (s >= RSV_WRITING && s <= RSV_EXPIRED) counts[s]++;
        }
}

/* The live list holds READY entries in the order they became READY (each
 * is appended when it does, deadline = then + ttl, and never moved after;
 * rsv_check verifies it), so one walk from its head lists them by seq and
 * meets the youngest last. */
size_t rsv_ready_list(rsv_table *t, uint64_t after, uint64_t min_age_ms, size_t max,
                      uint64_t now_ms, rsv_ready_fn fn, void *ctx, uint64_t *next, bool *more) {
    uint64_t now = clamp_now(t, now_ms);
    size_t n = 0;
    bool to_end = true;
    *more = false;
    if (after > t->ready_seq) after = 0; /* a cursor from before a restart */
    uint64_t passed = after;
    for (const idt_node *nd = idt_first(&t->ids, IDT_LIVE); nd; nd = nd->next) {
        const rsv_entry *e = ENTRY(nd);
        if (e->state != RSV_READY || e->ready_seq <= after) continue;
        if (nd->deadline - t->o.ttl_ms + min_age_ms > now) { /* this one and the rest: young */
            to_end = false;
            break;
        }
        if (!e->taken) {
            if (n == max) {
                *more = true;
                to_end = false;
                break;
            }
            rsv_status st;
            fill_status(e, &st);
            fn(ctx, e->transfer_id, e->ready_seq, &st);
            n++;
        }
        passed = e->ready_seq;
    }
    *next = to_end ? t->ready_seq : passed;
    return n;
}
