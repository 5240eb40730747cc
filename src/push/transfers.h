/*
 * transfers — the consumer scheduler's table of pushed items (generation 2):
 * which transfers it waits for, which shards reported them, and what the
 * scheduler shell must tell the shards (remote cancels).
 *
 * Pure: no sockets, no threads, no clock; every call takes `now_ms` where
 * time matters (a value smaller than one seen before counts as the largest).
 *
 * Threading: not thread-safe; the scheduler owns it (one thread, or one mutex
 * around every call).
 *
 * States (keyed by transfer_id), as in SPEC.md "Consumer scheduler":
 *   WAITING_EVENT -> AVAILABLE -> LOADING -> READY -> RESIDENT
 *   WAITING_EVENT -> UNAVAILABLE   no event from every shard within the push
 *                                  wait (60 s): a retryable error
 *   AVAILABLE -> EXPIRED           not loaded within the TTL (300 s)
 *   any live state -> CANCELLED    free / finish (xfer_cancel)
 *   any live state -> FAILED       an abandoned event, shards that disagree,
 *                                  or a failed load (xfer_fail)
 * UNAVAILABLE, EXPIRED, CANCELLED and FAILED are tombstones kept one TTL and
 * capped at `max_tombstones` (oldest first); events that arrive for them are
 * late and ignored. Entering a tombstone from a live state queues a remote
 * cancel to every shard (xfer_take_cancels); a cancel that fails is retried,
 * only to that shard, until `cancel_attempts` sends were made.
 *
 * Invariants (xfer_check verifies them): an item is AVAILABLE or later only
 * when every one of the tp_size shards reported it ready; every shard's
 * report names the same mm_hash, nbytes, shape and dtype; tombstones <= cap.
 */
#ifndef ECT_PUSH_TRANSFERS_H
#define ECT_PUSH_TRANSFERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/util.h"
#include "wire/dtype.h"

#define XFER_KEY_MAX 255
#define XFER_DTYPE_MAX 31
#define XFER_MAX_SHARDS 64
#define XFER_DEFAULT_PUSH_WAIT_MS 60000u
#define XFER_DEFAULT_TTL_MS 300000u
#define XFER_DEFAULT_MAX_TOMBSTONES 65536u
#define XFER_DEFAULT_MAX_ORPHANS 4096u
#define XFER_DEFAULT_CANCEL_ATTEMPTS 2u
#define XFER_MAX_FAILURES 4096u
#define XFER_DEFAULT_RECHECK_MS 1000u

typedef struct xfer_opts {
    size_t tp_size;           /* shards of the consumer, 1 .. XFER_MAX_SHARDS (1) */
    uint64_t push_wait_ms;    /* WAITING_EVENT -> UNAVAILABLE (60 s) */
    uint64_t ttl_ms;          /* AVAILABLE -> EXPIRED; tombstone and orphan lifetime (300 s) */
    size_t max_tombstones;    /* 65536 */
    size_t max_orphans;       /* items reported before they were expected (4096) */
    unsigned cancel_attempts; /* sends per shard for one remote cancel (2) */
    uint64_t recheck_ms;      /* a waiting item's missing shards are asked with `status`
                                 this long after it is known, then at doubling intervals
                                 (at most 8x); 0: never (xfer_take_rechecks returns 0) */
} xfer_opts;

void xfer_opts_init(xfer_opts *o);

typedef enum xfer_state {
    XFER_WAITING_EVENT = 1,
    XFER_AVAILABLE,
    XFER_LOADING,
    XFER_READY,
    XFER_RESIDENT,
    XFER_UNAVAILABLE,
    XFER_EXPIRED,
    XFER_CANCELLED,
    XFER_FAILED,
} xfer_state;

const char *xfer_state_name(xfer_state s);

typedef struct xfer_table xfer_table;

/* Errors: ECT_EINVAL naming the option; ECT_ENOMEM. Caller owns *out
 * (xfer_close); *out is NULL on failure. */
int xfer_open(const xfer_opts *o, xfer_table **out);
void xfer_close(xfer_table *t); /* NULL is fine */

/* The scheduler waits for transfer_id (mm_hash may be NULL when not known):
 * a new WAITING_EVENT entry whose push wait starts now, or the adoption of
 * what the shards already reported for it. Errors: ECT_EINVAL bad key;
 * ECT_EEXIST already expected or finished (a tombstone); ECT_ENOMEM. */
int xfer_expect(xfer_table *t, const char *transfer_id, const char *mm_hash, uint64_t now_ms);

/* One decoded event of one shard (index 0 .. tp_size-1). The strings are
 * borrowed for the call. */
typedef struct xfer_event {
    const char *transfer_id;
    size_t shard;
    bool ready; /* false: abandoned */
    const char *reservation_id;
    const char *mm_hash;
    uint64_t nbytes;
    const uint64_t *shape;
    size_t ndim;
    const char *dtype;
    const char *error; /* abandoned: reason, may be NULL */
} xfer_event;

typedef enum xfer_ev_result {
    XFER_EV_APPLIED = 1, /* changed the entry */
    XFER_EV_DUPLICATE,   /* this shard already reported, or the item is loaded */
    XFER_EV_LATE,        /* the transfer is a tombstone: ignored */
    XFER_EV_ORPHAN,      /* not expected (yet): kept for a later xfer_expect */
} xfer_ev_result;

/* Applies an event. Returns an xfer_ev_result (> 0), or ECT_EINVAL for a
 * shard index out of range or a bad key, ECT_ENOMEM. */
int xfer_on_event(xfer_table *t, const xfer_event *ev, uint64_t now_ms);

/* Scheduler-driven steps; ECT_ENOTFOUND for an unknown id, ECT_ESTATE (the
 * text names both states) when the entry is not in the state the step needs:
 * start_load AVAILABLE -> LOADING, loaded LOADING -> READY,
 * resident READY -> RESIDENT. */
int xfer_start_load(xfer_table *t, const char *transfer_id);
int xfer_loaded(xfer_table *t, const char *transfer_id);
int xfer_resident(xfer_table *t, const char *transfer_id);
/* Any live state -> FAILED with `reason`; ECT_ESTATE on a tombstone. */
int xfer_fail(xfer_table *t, const char *transfer_id, const char *reason, uint64_t now_ms);
/* Any state -> CANCELLED (free / finish); idempotent on tombstones, which
 * keep their remote cancels already queued. ECT_ENOTFOUND when unknown. */
int xfer_cancel(xfer_table *t, const char *transfer_id, uint64_t now_ms);
/* RESIDENT -> CANCELLED without remote cancels: the engine released the item
 * on every shard, which ended it there. ECT_ENOTFOUND; ECT_ESTATE when not
 * RESIDENT. */
int xfer_finished(xfer_table *t, const char *transfer_id, uint64_t now_ms);

/* Push-wait and TTL timeouts, orphan and tombstone expiry. Returns the number
 * of entries changed or removed. */
size_t xfer_reap(xfer_table *t, uint64_t now_ms);

typedef struct xfer_info {
    xfer_state state;
    bool expected;   /* false: reported by shards, not yet expected */
    bool retryable;  /* UNAVAILABLE and EXPIRED: the request may be retried */
    size_t reported; /* shards that reported ready */
    char mm_hash[XFER_KEY_MAX + 1];
    char dtype[XFER_DTYPE_MAX + 1];
    uint64_t shape[WIRE_MAX_NDIM];
    size_t ndim;
    uint64_t nbytes;
    char error[160]; /* why a tombstone other than CANCELLED ended */
} xfer_info;

/* ECT_ENOTFOUND when unknown. */
int xfer_get(const xfer_table *t, const char *transfer_id, xfer_info *info);

/* A remote cancel the shell must send: op cancel {transfer_id,
 * reservation_id} to shard `shard`; attempt counts from 1. */
typedef struct xfer_cancel_job {
    char transfer_id[XFER_KEY_MAX + 1];
    char reservation_id[ECT_ID_LEN + 1]; /* "" when the shard never reported */
    size_t shard;
    unsigned attempt;
} xfer_cancel_job;

/* Moves up to `max` queued cancels into out[]; returns how many. */
size_t xfer_take_cancels(xfer_table *t, xfer_cancel_job *out, size_t max);
/* The outcome of one taken job: a failure is queued again for that shard
 * while attempts remain, else given up (counted). */
void xfer_cancel_done(xfer_table *t, const xfer_cancel_job *job, bool ok);

/* A `status` question the shell must ask shard `shard` about transfer_id:
 * its readiness event has not arrived (lost: a stray PULL took it, the
 * shard's queue dropped it) though the item waits. A `status` answer that
 * says ready is fed back as an event of that shard (xfer_on_event). */
typedef struct xfer_recheck {
    char transfer_id[XFER_KEY_MAX + 1];
    size_t shard;
} xfer_recheck;

/* Moves into out[] (up to `max`) one question per shard that has not reported
 * a WAITING_EVENT entry (expected, or an orphan some shard reported) whose
 * recheck time has come: first `recheck_ms` after the entry was made, then
 * 2x, 4x and 8x that after each round. An entry is taken whole or not at all.
 * Returns how many. O(live entries); the shell calls it a few times a second
 * at most. */
size_t xfer_take_rechecks(xfer_table *t, uint64_t now_ms, xfer_recheck *out, size_t max);

/* A transfer that ended badly — FAILED (an abandoned event, shards that
 * disagree), UNAVAILABLE (not on every shard within the push wait; an
 * unexpected item some shards reported and the others never did within the
 * TTL) or EXPIRED (never loaded) — kept for the shell to report. Failures
 * the engine made itself (xfer_fail) are not listed. At most
 * XFER_MAX_FAILURES wait; beyond, the oldest is dropped (counted). */
typedef struct xfer_failure {
    char transfer_id[XFER_KEY_MAX + 1];
    char mm_hash[XFER_KEY_MAX + 1];
    xfer_state state;
    size_t reported; /* shards that had reported it ready */
    char error[160];
} xfer_failure;

/* Moves up to `max` failures into out[], oldest first; returns how many. */
size_t xfer_take_failures(xfer_table *t, xfer_failure *out, size_t max);

typedef struct xfer_stats {
    size_t live, tombstones, orphans, cancels_queued;
    uint64_t late_events, duplicate_events, tombstones_dropped, orphans_dropped;
    uint64_t cancels_given_up;
    uint64_t failures_dropped; /* failures no one took before the cap */
    uint64_t rechecks;         /* `status` questions handed out (xfer_take_rechecks) */
} xfer_stats;

void xfer_get_stats(const xfer_table *t, xfer_stats *st);

/* Verifies the invariants; ECT_ESTATE naming the broken one. For tests. */
int xfer_check(const xfer_table *t);

#endif
