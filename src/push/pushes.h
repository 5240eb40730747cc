/*
 * pushes — the producer's records of pushes in flight (generation 2): for
 * each transfer, the per-shard reserve, write, complete and abandon steps,
 * and the list of actions the producer shell must take next. The shell only
 * sends what push_next_actions hands it (batching RESERVE per shard, WRITE
 * per destination session, COMPLETE per shard) and reports each outcome
 * back; every decision lives here.
 *
 * Pure: no sockets, no threads, no clock; calls that need time take `now_ms`.
 * Threading: not thread-safe; the producer's dispatcher owns it (or one mutex
 * around every call).
 *
 * Record states, as in SPEC.md "Producer side":
 *   WAITING_INPUTS -> WRITING -> NOTIFYING -> DONE
 *   any of the three -> CANCEL_PENDING -> CANCELLED   (push_cancel, or a shard
 *                                                     answered `cancelled`)
 *   any of the three -> FAILED                        (a reserve, refresh, write
 *                     or complete failed; the encoder output never came)
 * A failing or cancelled record first waits until every action in flight
 * settled, then abandons the reservations it holds (cancel with abandon on
 * those shards), and only then ends.
 *
 * Back-pressure: a reserve a shard refuses because its pool is full
 * (push_reserve_full) does not fail the record. Once every reserve of the
 * round settled, the record gives back the reservations it got on the other
 * shards (PUSH_ACT_GIVE_BACK: cancel with abandon + refresh, which frees them
 * at once and tells the scheduler nothing), waits a backoff (retry_min_ms,
 * doubling to retry_max_ms) and reserves again on every shard, until
 * push_wait_ms after it was added; then it fails, saying the consumer stayed
 * full. Giving back rather than keeping: a record that held its reservations
 * on shard A while it waited for room on shard B could wait on a record that
 * holds B and waits for A — every pool full of half-reserved items, nobody
 * progressing until the deadlines. A record that holds nothing while it
 * waits cannot be part of such a cycle; every record that holds all its
 * shards goes on to write, complete and be consumed, which makes the room the
 * waiting ones need. The price is a cancel per shard per retry round.
 * Order: while a consumer has records waiting for room, records added after
 * them for the same consumer do not start reserving (FIFO), so a stream of
 * small items never starves a large one and items reach each consumer in the
 * order given, apart from what one retry round reorders; other consumers are
 * not affected. Invariants: the staged source is
 * released (PUSH_ACT_RELEASE_SOURCE) exactly once, only after every reserve,
 * write and complete settled; no action is handed out twice while in flight;
 * a transfer_id is pushed once (finished ones are remembered one TTL, at
 * most `max_tombstones`).
 */
#ifndef ECT_PUSH_PUSHES_H
#define ECT_PUSH_PUSHES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"
#include "wire/dtype.h"

#define PUSH_KEY_MAX 255
#define PUSH_ADDR_MAX 255
#define PUSH_DTYPE_MAX 31
#define PUSH_MAX_SHARDS 64
#define PUSH_DEFAULT_TTL_MS 300000u
#define PUSH_DEFAULT_REFRESH_MS 150000u
#define PUSH_DEFAULT_MAX_TOMBSTONES 65536u

#define PUSH_DEFAULT_PUSH_WAIT_MS 60000u
#define PUSH_DEFAULT_RETRY_MIN_MS 2u
#define PUSH_DEFAULT_RETRY_MAX_MS 200u

typedef struct push_opts {
    uint64_t refresh_after_ms; /* refresh a reservation older than this before writing (150 s) */
    uint64_t input_wait_ms;    /* fail when the encoder output is not staged by then (300 s) */
    uint64_t ttl_ms;           /* finished records are remembered this long (300 s) */
    size_t max_tombstones;     /* 65536 */
    uint64_t push_wait_ms;     /* how long a record may wait for room in a full pool (60 s) */
    uint64_t retry_min_ms;     /* first backoff after a full refusal (2 ms) */
    uint64_t retry_max_ms;     /* the doubling stops here (200 ms) */
} push_opts;

void push_opts_init(push_opts *o);

typedef enum push_state {
    PUSH_WAITING_INPUTS = 1,
    PUSH_WRITING,
    PUSH_NOTIFYING,
    PUSH_DONE,
    PUSH_CANCEL_PENDING,
    PUSH_CANCELLED,
    PUSH_FAILED,
} push_state;

const char *push_state_name(push_state s);

typedef struct push_table push_table;

int push_open(const push_opts *o, push_table **out); /* ECT_EINVAL naming the option */
void push_close(push_table *t);                      /* NULL is fine */

typedef struct push_item {
    const char *transfer_id;
    const char *consumer; /* base control address "host:port" */
    const char *mm_hash;
    uint64_t nbytes;
    const uint64_t *shape;
    size_t ndim;
    const char *dtype;
    size_t n_shards; /* shards discovered through `peers`, 1 .. PUSH_MAX_SHARDS */
} push_item;

/* Starts a record in WAITING_INPUTS; its reserves go out with the next
 * actions. Errors: ECT_EINVAL naming the field (ids, dtype, nbytes against
 * shape, n_shards); ECT_EEXIST "already pushed" for a transfer_id in flight
 * or finished within a TTL (dedup); ECT_ENOMEM. */
int push_add(push_table *t, const push_item *it, uint64_t now_ms);

/* The encoder output is staged. Errors: ECT_ENOTFOUND; ECT_ESTATE when the
 * record no longer waits for it (finished, cancelled, failed, or staged
 * already): the caller still owns the source then and releases it itself. */
int push_source_ready(push_table *t, const char *transfer_id, uint64_t now_ms);

/* The engine cancels: CANCEL_PENDING, then abandon, then CANCELLED.
 * Idempotent while cancelling; ECT_ENOTFOUND; ECT_ESTATE once DONE / FAILED. */
int push_cancel(push_table *t, const char *transfer_id, uint64_t now_ms);

typedef enum push_action_kind {
    PUSH_ACT_RESERVE = 1,    /* reserve {transfer_id, mm_hash, nbytes, shape, dtype} on shard */
    PUSH_ACT_REFRESH,        /* cancel {transfer_id, reservation_id, abandon, refresh} on shard;
                                the table re-reserves once it succeeded */
    PUSH_ACT_WRITE,          /* write the source's nbytes to dst_session at dst_ptr (dst_key) */
    PUSH_ACT_COMPLETE,       /* complete {transfer_id, reservation_id} on shard */
    PUSH_ACT_ABANDON,        /* cancel {transfer_id, reservation_id, abandon: true} on shard */
    PUSH_ACT_GIVE_BACK,      /* cancel {..., abandon: true, refresh: true} on shard: another
                                shard is full; report with push_refresh_done */
    PUSH_ACT_RELEASE_SOURCE, /* the staged source may be freed now */
    PUSH_ACT_FINISHED,       /* report: `state` is DONE, CANCELLED or FAILED (`error`) */
} push_action_kind;

typedef struct push_action {
    push_action_kind kind;
    char transfer_id[PUSH_KEY_MAX + 1];
    size_t shard;
    char consumer[PUSH_ADDR_MAX + 1];
    char mm_hash[PUSH_KEY_MAX + 1];
    uint64_t nbytes;
    uint64_t shape[WIRE_MAX_NDIM];
    size_t ndim;
    char dtype[PUSH_DTYPE_MAX + 1];
    char reservation_id[ECT_ID_LEN + 1];
    char dst_session[PUSH_ADDR_MAX + 1];
    uint64_t dst_ptr, dst_key;
    push_state state;
    char error[160];
    unsigned retries; /* FINISHED: reserve rounds refused as full before the outcome */
} push_action;

/* Fills up to `max` actions to take now, records each as in flight, and
 * applies the input-wait timeout and tombstone expiry. Returns how many. An
 * action is never handed out again until its outcome is reported. */
size_t push_next_actions(push_table *t, uint64_t now_ms, push_action *out, size_t max);

/* When push_next_actions should run again at the latest for a record
 * waiting out a backoff (0: none waits). Set by push_next_actions. */
uint64_t push_next_wake(const push_table *t);

/* A shard's reserve reply (the `result` of an ok reply). */
typedef struct push_reservation {
    const char *reservation_id;
    const char *dst_session;
    uint64_t dst_ptr, dst_key;
    bool write, ready, cached, cancelled;
} push_reservation;

/* Outcomes of the actions handed out. Each returns ECT_ENOTFOUND for an
 * unknown transfer_id and ECT_ESTATE when no such action is in flight on that
 * shard (a stray or repeated report changes nothing). */
/* res NULL: the reserve failed (`error` says why; the push fails). */
int push_reserve_done(push_table *t, const char *transfer_id, size_t shard,
                      const push_reservation *res, const char *error, uint64_t now_ms);
/* The shard refused the reserve because its pool is full (`error`, the
 * shard's text): back-pressure, see above. */
int push_reserve_full(push_table *t, const char *transfer_id, size_t shard, const char *error,
                      uint64_t now_ms);
/* The outcome of a REFRESH or a GIVE_BACK. */
int push_refresh_done(push_table *t, const char *transfer_id, size_t shard, bool ok);
int push_write_done(push_table *t, const char *transfer_id, size_t shard, bool ok);
/* ok: the exchange succeeded; completed: the shard's `completed` answer. */
int push_complete_done(push_table *t, const char *transfer_id, size_t shard, bool ok,
                       bool completed);
/* Whatever the outcome, the shard's own TTL ends a reservation not abandoned. */
int push_abandon_done(push_table *t, const char *transfer_id, size_t shard, bool ok);

typedef struct push_info {
    push_state state;
    bool source_staged;
    size_t n_shards, reserved, written, completed;
    unsigned retries;  /* reserve rounds refused as full so far */
    bool waiting_room; /* backing off after a full refusal */
    char error[160];
} push_info;

int push_get(const push_table *t, const char *transfer_id, push_info *info); /* ECT_ENOTFOUND */

typedef struct push_stats {
    size_t live, tombstones;
    uint64_t done, failed, cancelled, refreshes, tombstones_dropped;
    uint64_t full_refusals; /* reserves a shard refused as full */
    uint64_t retries;       /* reserve rounds started again after one */
    uint64_t give_backs;    /* reservations given back meanwhile */
} push_stats;

void push_get_stats(const push_table *t, push_stats *st);

/* Verifies the invariants; ECT_ESTATE naming the broken one. For tests. */
int push_check(const push_table *t);

#endif
