/*
 * reservations — the consumer shard's reservation table (push protocol,
 * generation 2): the state machine behind the control ops `reserve`,
 * `status`, `complete` and `cancel`, the periodic reaper, residency of
 * published tensors (take / release, least-recently-used reclaim) and the
 * readiness / abandoned events the shard publishes.
 *
 * Pure: no sockets, no threads, no clock. Every call takes `now_ms` (any
 * monotonic millisecond clock; a value smaller than one seen before is
 * treated as the largest seen). Memory is reached only through rsv_mem_ops,
 * so tests plug in a fake pool and the shell wires the real one.
 *
 * Threading: not thread-safe; the control server holds one mutex around
 * every call (the consumer's take/release come from another thread).
 *
 * States (keyed by transfer_id), as in SPEC.md "Generation 2":
 *   WRITING -> READY | CANCEL_PENDING | EXPIRE_PENDING | CANCELLED
 *   READY -> CANCELLED | EXPIRED;  CANCEL_PENDING -> CANCELLED;
 *   EXPIRE_PENDING -> CANCELLED | EXPIRED.
 * CANCELLED and EXPIRED are tombstones kept for one TTL, at most
 * `max_tombstones` of them (the oldest dropped first).
 *
 * Invariants the implementation keeps (rsv_check verifies them):
 *  - a buffer is freed exactly once, and only when no reservation, lease or
 *    residency holds it; a buffer whose writer is WRITING, CANCEL_PENDING or
 *    EXPIRE_PENDING is never freed (a remote write may still be landing),
 *    except by the optional `write_active` escape described at rsv_mem_ops;
 *  - at most one in-flight writer and one published buffer per mm_hash;
 *  - bytes held == sum of the sizes of live buffers.
 */
#ifndef ECT_PUSH_RESERVATIONS_H
#define ECT_PUSH_RESERVATIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"
#include "wire/dtype.h"

/* Longest transfer_id / mm_hash accepted (bytes, without the NUL). */
#define RSV_KEY_MAX 255
/* Longest peer address kept as a reservation's owner (IPv6 text fits). */
#define RSV_OWNER_MAX 63
/* Longest canonical dtype name kept. */
#define RSV_DTYPE_MAX 31

#define RSV_DEFAULT_TTL_MS 300000u
#define RSV_DEFAULT_MAX_TOMBSTONES 65536u
#define RSV_DEFAULT_MAX_EVENTS 4096u

/* How the table reaches the buffer pool. The shell wires the real pool; tests
 * wire a fake. All callbacks are called with the table's lock held and must
 * not block or call back into the table. */
typedef struct rsv_mem_ops {
    /* Reserves nbytes (> 0) and stores the start offset in *offset. Returns 0,
     * ECT_EFULL when no free range fits (the table then reclaims and retries,
     * and words its own error: an ECT_EFULL needs no text), or another ECT_E*
     * code, which the table passes on. Required. */
    int (*alloc)(void *ctx, uint64_t nbytes, uint64_t *offset);
    /* Returns a range alloc handed out (same offset and nbytes). Required. */
    void (*free)(void *ctx, uint64_t offset, uint64_t nbytes);
    /* Optional. True while a remote write into [offset, offset + nbytes) may
     * still be landing (the transport target knows). When given, a
     * CANCEL_PENDING or EXPIRE_PENDING reservation older than
     * `pending_grace_ms` whose range is quiet is made terminal and its memory
     * freed, so a producer killed after reserve cannot leak the pool. When
     * NULL, such memory is kept until the writer completes or abandons. */
    bool (*write_active)(void *ctx, uint64_t offset, uint64_t nbytes);
} rsv_mem_ops;

/* rsv_mem_ops over the buffer pool (ect_pool_alloc / ect_pool_free); pass
 * the ect_pool * as mem_ctx. The pool's own resident cache is not used: the
 * table keeps residency itself. write_active is NULL (see above). */
extern const rsv_mem_ops rsv_pool_ops;

typedef struct rsv_opts {
    const rsv_mem_ops *mem; /* required; not copied, must outlive the table */
    void *mem_ctx;
    uint64_t ttl_ms;           /* reservation and tombstone lifetime (300 s) */
    uint64_t pending_grace_ms; /* see rsv_mem_ops.write_active (300 s) */
    size_t max_tombstones;     /* 65536 */
    size_t max_events;         /* event backlog (4096); the oldest is dropped */
    uint64_t capacity;         /* the pool's usable bytes, 0 unknown: a reserve larger than
                                  the whole pool is refused as such, so a producer does not
                                  wait for room that can never come */
} rsv_opts;

void rsv_opts_init(rsv_opts *o);

typedef enum rsv_state {
    RSV_WRITING = 1,
    RSV_READY,
    RSV_CANCEL_PENDING,
    RSV_EXPIRE_PENDING,
    RSV_CANCELLED,
    RSV_EXPIRED,
} rsv_state;

const char *rsv_state_name(rsv_state s);

typedef struct rsv_table rsv_table;

/* Errors: ECT_EINVAL naming the option; ECT_ENOMEM. Caller owns the result
 * (rsv_close); *out is NULL on failure. */
int rsv_open(const rsv_opts *o, rsv_table **out);
/* Frees every buffer still held and the table. Call only once no remote
 * writer can still write (the transport is stopped). NULL is fine. */
void rsv_close(rsv_table *t);

/* ---- reserve */

typedef struct rsv_request {
    const char *transfer_id;
    const char *mm_hash;
    uint64_t nbytes;
    const uint64_t *shape;
    size_t ndim;
    const char *dtype; /* "bfloat16" or "torch.bfloat16" */
    const char *owner; /* the reserving peer's address (kept, cut to RSV_OWNER_MAX bytes;
                          rsv_status.owner); NULL or "": unknown. Only a new reservation
                          takes it: a reserve that finds the transfer_id live keeps the
                          first owner (the control server refuses another peer's) */
} rsv_request;

/* Why a transfer_id is a tombstone (CANCELLED or EXPIRED): a reserve that
 * finds one answers `cancelled` and says why (rsv_reply.why). */
typedef enum rsv_end {
    RSV_END_NONE = 0,
    RSV_END_PRECANCEL, /* cancelled by the scheduler before any reserve */
    RSV_END_CANCELLED, /* cancelled by the scheduler (request freed or failed) */
    RSV_END_ABANDONED, /* a producer gave it up (cancel with abandon) */
    RSV_END_FINISHED,  /* delivered: the engine took it and released it */
    RSV_END_EXPIRED,   /* the reaper ended it (TTL) */
} rsv_end;

/* A sentence for the reply's `reason` ("delivered and released by the
 * consumer's engine"); never NULL. */
const char *rsv_end_text(rsv_end why);

typedef struct rsv_reply {
    char reservation_id[ECT_ID_LEN + 1]; /* "" when cancelled */
    uint64_t offset;                     /* dst_ptr = pool base + offset */
    uint64_t nbytes;
    bool write;            /* the producer must write and complete */
    bool ready;            /* already readable (cached) */
    bool cached;           /* answered from a resident copy, no bytes move */
    bool cancelled;        /* the transfer was cancelled (pre-cancel) */
    rsv_end why;           /* cancelled: why the transfer_id is refused */
    uint64_t ended_ms_ago; /* cancelled: how long ago it ended */
} rsv_reply;

/* Runs the reaper, then reserves per SPEC.md. On success fills *reply and may
 * queue a readiness event (cached). Errors (ect_last_error has the text):
 * ECT_EINVAL bad field ("Unsupported torch dtype string", "shape and dtype do
 * not match nbytes", empty or too long ids); ECT_EEXIST "conflicting
 * reservation for transfer_id", "conflicting in-flight tensor for mm_hash",
 * "conflicting cached tensor for mm_hash"; ECT_EBUSY "... still has an active
 * writer" (EXPIRE_PENDING); ECT_EFULL "EC consumer buffer pool is full"
 * (with "more than the whole pool" when it could never fit);
 * ECT_ENOMEM. Nothing changes on error. */
int rsv_reserve(rsv_table *t, const rsv_request *req, uint64_t now_ms, rsv_reply *reply);

/* ---- complete / cancel / finish */

/* complete(transfer_id, reservation_id) -> (*completed, *became_ready), as
 * SPEC.md gives it: unknown or mismatched ids (false, false); READY or a
 * follower (true, false); WRITING writer (true, true), publishing the writer
 * and its followers; a CANCEL_PENDING / EXPIRE_PENDING writer becomes
 * CANCELLED / EXPIRED, its memory freed, (false, false). Never fails. */
void rsv_complete(rsv_table *t, const char *transfer_id, const char *reservation_id,
                  uint64_t now_ms, bool *completed, bool *became_ready);

/* cancel(transfer_id, reservation_id ("" or NULL: any), abandon, refresh).
 * A refresh (abandon + refresh) of a WRITING writer that has followers keeps
 * their buffer and the followers waiting: the next reserve of the same
 * mm_hash (the refreshing producer's, or anyone's) becomes their writer and
 * is told to write into it. Without such a reserve they end at their TTL as
 * before. A plain abandon still ends the followers at once (events).
 * Stores the result in *cancelled. Returns ECT_EINVAL when refresh is asked
 * without abandon (nothing changes), else 0. */
int rsv_cancel(rsv_table *t, const char *transfer_id, const char *reservation_id, bool abandon,
               bool refresh, uint64_t now_ms, bool *cancelled);

/* The consumer's engine is done with transfer_id on this shard (it took the
 * item and released it): a READY reservation ends at once (CANCELLED, why
 * FINISHED, no event) and drops its hold on the buffer, which stays resident
 * (reclaimable least recently used) for dedup. This is what keeps a busy
 * shard's pool from filling with delivered items while the scheduler's
 * remote cancels are still on their way. ECT_ENOTFOUND unknown; ECT_ESTATE
 * not READY (a tombstone already: nothing changes). */
int rsv_finish(rsv_table *t, const char *transfer_id, uint64_t now_ms);

/* Expires what is due (see SPEC.md "Reaper"); the shell calls it every 1 s,
 * and reserve calls it too. Returns the number of transitions made. */
size_t rsv_reap(rsv_table *t, uint64_t now_ms);

/* ---- spares (docs/PROTOCOL.md "Extension: a spare range granted ahead")
 *
 * A spare is a pool range granted ahead to one peer (owner), with an id of
 * its own and no entry: the peer writes its next item into it and binds it
 * (ect_put). It expires one TTL after the grant (the reaper), a reserve
 * that finds the pool full frees spares before it gives up (after reaping
 * and evicting), a new grant to the same owner frees the owner's old one,
 * and rsv_close frees them all. Its bytes are counted in spare_bytes, not
 * in bytes_held. */

/* Allocates nbytes for owner without reclaiming anything (no reap, no
 * eviction, no other spare freed). 0 and *reply (reservation_id = the
 * spare's id, offset, nbytes, write); ECT_EFULL (no free range: nothing
 * granted), ECT_EINVAL (0 bytes), ECT_ENOMEM. */
int rsv_spare_grant(rsv_table *t, const char *owner, uint64_t nbytes, uint64_t now_ms,
                    rsv_reply *reply);

/* Binds the spare spare_id to the item req (spare_owner must be the owner
 * it was granted to; req->owner becomes the item's owner) as the WRITING
 * writer over the spare's range, with the spare's id as its reservation id;
 * rsv_complete then publishes it. Only the plain case: transfer_id unknown
 * to the table (no entry, no tombstone), mm_hash neither published, in
 * flight nor orphaned, and nbytes within the spare. Errors (nothing
 * changes): ECT_ENOTFOUND no such spare; ECT_EACCES another owner's;
 * ECT_EEXIST not the plain case; ECT_EINVAL a bad field or too large;
 * ECT_ENOMEM. */
int rsv_spare_bind(rsv_table *t, const char *spare_id, const char *spare_owner,
                   const rsv_request *req, uint64_t now_ms, rsv_reply *reply);

/* Whether spare id is held (not bound, expired nor freed). */
bool rsv_spare_held(const rsv_table *t, const char *id);

/* Frees the spare id (false: no such spare). */
bool rsv_spare_free(rsv_table *t, const char *id);

/* Frees every spare; returns how many. */
size_t rsv_spare_free_all(rsv_table *t);

/* ---- status and residency */

typedef struct rsv_status {
    char mm_hash[RSV_KEY_MAX + 1];
    char reservation_id[ECT_ID_LEN + 1];
    char dtype[RSV_DTYPE_MAX + 1];
    uint64_t shape[WIRE_MAX_NDIM];
    size_t ndim;
    uint64_t nbytes;
    uint64_t offset;
    rsv_state state;
    bool ready;
    bool writer;                   /* owns the write (false: follower or cached) */
    char owner[RSV_OWNER_MAX + 1]; /* rsv_request.owner of the reserve that made it */
} rsv_status;

/* What the table knows of transfer_id, tombstones included (st->state says
 * which; the `status` op answers null for CANCELLED and EXPIRED).
 * ECT_ENOTFOUND when unknown. */
int rsv_status_get(const rsv_table *t, const char *transfer_id, rsv_status *st);

/* The few fields the control server checks on every op (owner on a reserve,
 * state and reservation id on a window sweep, nbytes when counting), without
 * rsv_status's copies: the strings point into the table and stay valid until
 * the next call that changes it (the caller holds the table's lock). */
typedef struct rsv_brief {
    rsv_state state;
    bool writer;
    uint64_t nbytes;
    const char *reservation_id;
    const char *owner;
} rsv_brief;

/* rsv_status_get's brief form: 0 and *b filled, or ECT_ENOTFOUND (no error
 * text set: callers use it as a cheap lookup). */
int rsv_brief_get(rsv_table *t, const char *transfer_id, rsv_brief *b);

/* The consumer takes a READY item for zero-copy reading: a lease on its
 * buffer, which no reaper, cancel or reclaim frees until released. Fills *st
 * (offset, nbytes, ...). Errors: ECT_ENOTFOUND; ECT_ESTATE when not READY. */
int rsv_take(rsv_table *t, const char *transfer_id, uint64_t now_ms, rsv_status *st);

/* Ends one lease on the published buffer of mm_hash and keeps the buffer
 * resident (least-recently-used reclaim) so a later reserve of the hash is
 * answered `cached`. Errors: ECT_ENOTFOUND; ECT_ESTATE when not leased. */
int rsv_release(rsv_table *t, const char *mm_hash, uint64_t now_ms);

/* Frees up to `max` unleased resident buffers no reservation uses, least
 * recently used first. Returns how many were freed. */
size_t rsv_evict_resident(rsv_table *t, size_t max);

/* ---- events */

typedef enum rsv_event_kind {
    RSV_EV_READY = 1, /* {transfer_id, mm_hash, ready: true, reservation_id, ...} */
    RSV_EV_ABANDONED, /* the transfer will never become ready on this shard */
} rsv_event_kind;

typedef struct rsv_event {
    rsv_event_kind kind;
    char transfer_id[RSV_KEY_MAX + 1];
    rsv_status st; /* the reservation as it was when the event was queued */
} rsv_event;

/* The oldest queued event, or NULL. Valid until the next call on the table.
 * The shell sends it without blocking and pops it only once sent, so an
 * unsent event stays queued. */
const rsv_event *rsv_event_peek(const rsv_table *t);
void rsv_event_pop(rsv_table *t);

typedef struct rsv_stats {
    size_t live;         /* reservations not in a tombstone state */
    size_t tombstones;   /* CANCELLED + EXPIRED entries */
    size_t buffers;      /* live buffers (allocations held) */
    size_t resident;     /* buffers kept resident */
    size_t events;       /* queued events */
    uint64_t bytes_held; /* sum of live buffer sizes */
    uint64_t events_dropped;
    uint64_t tombstones_dropped; /* removed early by the cap */
    uint64_t evictions;          /* resident buffers reclaimed */
    size_t peak_live;            /* most reservations live at once since open */
    uint64_t peak_bytes;         /* most bytes held at once since open */
    uint64_t finished;           /* READY reservations ended by rsv_finish */
    uint64_t abandoned;          /* reservations a producer abandoned (not refreshes) */
    uint64_t expired_ready;      /* READY reservations the reaper ended (never finished) */
    uint64_t expired_writing;    /* writers past their TTL (EXPIRE_PENDING) */
    uint64_t adopted;            /* refreshed writers' followers taken over by a new writer */
    uint64_t published_bytes;    /* bytes of published buffers (the resident cache: READY,
                                    leased and released items; allocation sizes) */
    uint64_t allocs; /* entries, buffer records and event nodes malloc'd (the rest reused) */
    /* spares (rsv_spare_grant): held now, their bytes (not in bytes_held),
     * granted, bound to an item, dropped unused (expired, pressure, replaced) */
    size_t spares;
    uint64_t spare_bytes, spares_granted, spares_bound, spares_dropped;
} rsv_stats;

void rsv_get_stats(const rsv_table *t, rsv_stats *st);

/* Entries by state, tombstones included: counts[RSV_WRITING .. RSV_EXPIRED]
 * (counts[0] is 0). O(n); for metrics and the status op. */
void rsv_count_states(const rsv_table *t, uint64_t counts[RSV_EXPIRED + 1]);

/* Verifies the invariants above; ECT_ESTATE with the broken one in
 * ect_last_error(). O(n); for tests and the fuzzer. */
int rsv_check(const rsv_table *t);

/* ---- readiness listing (docs/PROTOCOL.md "Lost events: the scheduler
 * lists what is ready", op ect_ready)
 *
 * Each entry that becomes READY gets the next readiness seq (1, 2, ...; the
 * table's own counter, restarting with the table). rsv_ready_list calls fn
 * for the entries READY now, not taken (rsv_take), with seq > after and
 * READY for at least min_age_ms, oldest first, at most max of them; st is
 * what its readiness event carried. An
 * `after` above every seq given so far (a cursor kept across a restart of
 * the shard) is read as 0. *more: others remain (max reached); *next: the
 * cursor to ask with next: the newest seq given when the walk reached the
 * end, else (max reached, or an entry younger than min_age_ms stopped it)
 * the last seq it passed, so nothing listed is listed again and nothing
 * younger is skipped. O(live entries). Returns the count. */
typedef void (*rsv_ready_fn)(void *ctx, const char *transfer_id, uint64_t seq,
                             const rsv_status *st);
size_t rsv_ready_list(rsv_table *t, uint64_t after, uint64_t min_age_ms, size_t max,
                      uint64_t now_ms, rsv_ready_fn fn, void *ctx, uint64_t *next, bool *more);

#endif
