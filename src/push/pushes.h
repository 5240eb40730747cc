/*
 * pushes — the producer's records of pushes (generation 2): the one owner of
 * everything the push producer knows about an item. For each transfer: what
 * to push (ids, tensor, the consumer's control address), its source (staged
 * or not, and how to give it back), the step it belongs to (held until
 * flush), per shard the control port, the reserve / write / complete /
 * abandon steps and the reserve reply's facts (reservation id, destination
 * session, pointer, region key, transport), the cause of a failure and the
 * status it reports; and per consumer its shards, learned once through
 * `peers` (discovery). The shell only carries out what push_next_actions
 * hands it (push/batch.c groups and builds the requests) and reports each
 * outcome back; every decision lives here.
 *
 * Pure: no sockets, no threads, no clock; calls that need time take `now_ms`.
 * Threading: not thread-safe; the producer holds its one mutex around every
 * call (the caller's threads reserve, stage and cancel; the dispatcher runs
 * the rest).
 *
 * Record states, as in SPEC.md "Producer side":
 *   WAITING_INPUTS -> WRITING -> NOTIFYING -> DONE
 *   any of the three -> CANCEL_PENDING -> CANCELLED   (push_cancel, or a shard
 *                                                     answered `cancelled`)
 *   any of the three -> FAILED                        (discovery, a reserve,
 *                     refresh, write or complete failed; the encoder output
 *                     never came)
 * A failing or cancelled record first waits until every action in flight
 * settled, then abandons the reservations it holds (cancel with abandon on
 * those shards), and only then ends.
 *
 * Steps: a record added with `held` waits (nothing goes out for it) until
 * push_flush, which releases every held record in the order they were added;
 * a source staged after that flush is likewise used from the next flush on.
 *
 * Discovery: a record added without its shards (n_shards 0) waits for its
 * consumer's: the first such record of a consumer makes one PUSH_ACT_PEERS,
 * push_peers_done answers it for every record waiting, and the consumer's
 * shards are kept (push_forget_consumer drops them after a failed exchange,
 * so a restarted consumer is discovered again).
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
 * not affected.
 *
 * Invariants: the staged source is released (PUSH_ACT_RELEASE_SOURCE)
 * exactly once, only after every reserve, write and complete settled; no
 * action is handed out twice while in flight; a transfer_id is pushed once
 * (the one dedup of the producer: finished records are remembered one TTL,
 * at most `max_tombstones`, in util/idtab).
 */
#ifndef ECT_PUSH_PUSHES_H
#define ECT_PUSH_PUSHES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/idtab.h"
#include "util/util.h"
#include "wire/dtype.h"

#define PUSH_KEY_MAX 255
#define PUSH_ADDR_MAX 255
#define PUSH_HOST_MAX 255
#define PUSH_DTYPE_MAX 31
#define PUSH_KIND_MAX 15
#define PUSH_ERROR_MAX 191
#define PUSH_MAX_SHARDS 64
#define PUSH_KEY_INLINE 31 /* a shard keeps a dst_key this long without a malloc */
#define PUSH_IDS_INLINE 160 /* a record keeps its three ids this long (NULs in) in itself */
#define PUSH_SPARES_MAX 1024 /* finished records kept for the next ones */
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
typedef struct push_action push_action;

int push_open(const push_opts *o, push_table **out); /* ECT_EINVAL naming the option */
void push_close(push_table *t); /* NULL is fine; sources still held are not released */

/* How an item's source is given back (the shell's business: the table only
 * keeps it and hands it out with PUSH_ACT_RELEASE_SOURCE). */
typedef struct push_source {
    const void *data;
    void (*release)(void *user, const void *data, uint64_t nbytes); /* NULL: in the pool */
    void *user;
    uint64_t pool_off; /* release NULL: the staging pool's offset */
} push_source;

/* ---- records (read-only outside pushes.c) */

typedef struct push_shard {
    int port;                          /* control port; 0 unknown */
    int rsv, write, complete, abandon; /* steps (pushes.c) */
    bool write_needed;                 /* the shard answered write: true */
    char rid[ECT_ID_LEN + 1];          /* reservation_id */
    char session[PUSH_ADDR_MAX + 1];   /* dst_session */
    uint64_t dst_ptr, reserved_at;
    char *dst_key;                /* the destination region's key (key_buf or malloc'd), or NULL */
    char kind[PUSH_KIND_MAX + 1]; /* the data plane the shard named ("tcp" if none) */
    char key_buf[PUSH_KEY_INLINE + 1]; /* dst_key when it fits (tcp/shm: 16 hex digits) */
} push_shard;

/* A record. A finished one stays a tombstone for one TTL (dedup, push_get):
 * entombing copies the head, the fields before `host` with `error` cut to
 * its string, into an allocation of its own with the ids after it (an eighth
 * of the record) and recycles the full record: nothing from `host` on, nor
 * past error's NUL, may be read from a record that is_final. */
typedef struct push_rec {
    /* ---- head: valid in live records and tombstones */
    idt_node node;                          /* by transfer_id; live records, then tombstones */
    char *transfer_id, *consumer, *mm_hash; /* in the record's own allocation */
    push_state state, ending; /* ending: 0, PUSH_FAILED or PUSH_CANCELLED */
    int status;               /* FAILED: the code reported (ECT_EIO unless a cause said) */
    size_t n;                 /* shards; 0 while its consumer is being discovered */
    bool held;                /* added since the last flush: nothing goes out */
    bool staged, stage_held;  /* source given; given since the last flush */
    bool staging;             /* a stage is copying its source (the record stays) */
    bool released, finishing;
    bool tomb;                /* only the head is allocated (a compact tombstone) */
    bool waiting_room;        /* a shard refused as full; not yet every shard reserved */
    unsigned retries;         /* rounds refused as full */
    uint16_t reserved, written, completed; /* a compact tombstone's shard counts */
    char error[PUSH_ERROR_MAX + 1];        /* the table's account of a failure (last) */
    /* ---- live only (absent from a compact tombstone) */
    char host[PUSH_HOST_MAX + 1]; /* the consumer's control address */
    int port;
    uint64_t nbytes;
    uint64_t shape[WIRE_MAX_NDIM];
    size_t ndim;
    char dtype[PUSH_DTYPE_MAX + 1];
    uint64_t t0_ns; /* the caller's, reported back */
    push_shard *sh; /* &sh_one for one shard, else malloc'd */
    push_shard sh_one;
    push_source src;
    uint64_t created;
    char cause[PUSH_ERROR_MAX + 1];    /* a sharper cause the shell named, reported first */
    char used_kind[PUSH_KIND_MAX + 1]; /* the data plane of the first write that landed */
    /* back-pressure */
    uint64_t retry_at;          /* reserve again at this time (0: not backing off) */
    uint64_t backoff;           /* the last backoff (ms) */
    char full_error[120];       /* the latest refusal, for the failure text */
    struct push_rec *disc_next; /* waiting for its consumer's discovery; a spare's next */
    char ids[PUSH_IDS_INLINE];  /* the ids when they fit (then the record is recycled) */
} push_rec;

/* The bytes of a record a compact tombstone keeps, then its error's string. */
#define PUSH_REC_HEAD offsetof(push_rec, error)

typedef struct push_item {
    const char *transfer_id;
    const char *consumer; /* base control address "host:port", as given */
    const char *host;     /* its host ("" or NULL: only for tables that get shards) */
    int port;             /* and port */
    const char *mm_hash;
    uint64_t nbytes;
    const uint64_t *shape;
    size_t ndim;
    const char *dtype;
    size_t n_shards;        /* 0: discover them; else 1 .. PUSH_MAX_SHARDS */
    const int *ports;       /* n_shards control ports, or NULL (unknown) */
    bool held;              /* wait for push_flush */
    const push_source *src; /* staged with the item, or NULL */
    uint64_t t0_ns;
} push_item;

/* Starts a record in WAITING_INPUTS. Errors: ECT_EINVAL naming the field
 * (ids, dtype, nbytes against shape, n_shards); ECT_EEXIST "already pushed"
 * for a transfer_id in flight or finished within a TTL (dedup); ECT_ENOMEM.
 * *out (may be NULL) is the record. */
int push_add(push_table *t, const push_item *it, uint64_t now_ms, push_rec **out);

/* The record of transfer_id (live or a tombstone), or NULL. */
push_rec *push_find(const push_table *t, const char *transfer_id);

/* Releases every held record (in the order added) and every held stage.
 * Returns how many records. */
size_t push_flush(push_table *t);

/* The encoder output is staged (src, may be NULL in tests). Errors:
 * ECT_ENOTFOUND; ECT_ESTATE when the record no longer waits for it
 * (finished, cancelled, failed, or staged already): the caller still owns the
 * source then and releases it itself. */
int push_source_ready(push_table *t, const char *transfer_id, const push_source *src,
                      uint64_t now_ms);

/* A stage copies its source outside the producer's lock: push_stage_begin
 * checks that transfer_id waits for a source of nbytes and keeps the record
 * (also if it ends meanwhile) until push_stage_end, which hands the source
 * over (src) or gives up (NULL). Errors of begin: ECT_ENOTFOUND; ECT_ESTATE
 * ("finished", "already staged"); ECT_EINVAL nbytes differs. push_stage_end
 * returns ECT_ESTATE when the record finished meanwhile (the caller keeps
 * the source). */
int push_stage_begin(push_table *t, const char *transfer_id, uint64_t nbytes);
int push_stage_end(push_table *t, const char *transfer_id, const push_source *src, uint64_t now_ms);

/* The engine cancels: CANCEL_PENDING, then abandon, then CANCELLED.
 * Idempotent while cancelling; ECT_ENOTFOUND; ECT_ESTATE once DONE / FAILED.
 * A held record (nothing went out) ends at once: its actions (release,
 * report) go to out (room for 2) and *n says how many; with out NULL it is
 * reported by the next push_next_actions instead. */
int push_cancel(push_table *t, const char *transfer_id, uint64_t now_ms, push_action *out,
                size_t *n);

/* Closing: every live record fails at once with `why` (status ECT_ECLOSED),
 * without abandoning anything (the shards' TTL ends their reservations), and
 * whatever was in flight counts as settled. The next push_next_actions hands
 * out their releases and reports. */
void push_abort_all(push_table *t, const char *why);

typedef enum push_action_kind {
    PUSH_ACT_PEERS = 1,      /* peers on rec->host:rec->port (discovery of rec->consumer) */
    PUSH_ACT_RESERVE,        /* reserve {transfer_id, mm_hash, nbytes, shape, dtype} on shard */
    PUSH_ACT_REFRESH,        /* cancel {transfer_id, reservation_id, abandon, refresh} on shard;
                                the table re-reserves once it succeeded */
    PUSH_ACT_WRITE,          /* write the source's nbytes to the shard's session */
    PUSH_ACT_COMPLETE,       /* complete {transfer_id, reservation_id} on shard */
    PUSH_ACT_ABANDON,        /* cancel {transfer_id, reservation_id, abandon: true} on shard */
    PUSH_ACT_GIVE_BACK,      /* cancel {..., abandon: true, refresh: true} on shard: another
                                shard is full; report with push_refresh_done */
    PUSH_ACT_RELEASE_SOURCE, /* the staged source (fin.src) may be freed now */
    PUSH_ACT_FINISHED,       /* report: fin says how it ended */
} push_action_kind;

/* How a record ended (RELEASE_SOURCE: transfer_id and src only). */
typedef struct push_final {
    char transfer_id[PUSH_KEY_MAX + 1];
    push_source src;
    push_state state; /* DONE, CANCELLED or FAILED */
    int status;       /* 0, ECT_ECANCELED, or the failure's code */
    char error[PUSH_ERROR_MAX + 1];
    unsigned retries; /* reserve rounds refused as full before the outcome */
    size_t n_shards;
    char transport[PUSH_KIND_MAX + 1]; /* the data plane a write used, "" none */
    uint64_t t0_ns;
    uint64_t nbytes;
} push_final;

/* An action. rec stays valid until the action's outcome is reported (an
 * action in flight keeps its record alive); PEERS names its consumer (valid
 * until push_peers_done) and has no rec; the two local kinds carry what they
 * need in fin (rec is NULL: the record may be gone). */
struct push_action {
    push_action_kind kind;
    push_rec *rec;
    size_t shard;
    const char *consumer, *host; /* PEERS */
    int port;                    /* PEERS */
    push_final fin;              /* RELEASE_SOURCE, FINISHED */
};

/* Fills up to `max` actions to take now, records each as in flight, and
 * applies the input-wait timeout and tombstone expiry. Returns how many. An
 * action is never handed out again until its outcome is reported. */
size_t push_next_actions(push_table *t, uint64_t now_ms, push_action *out, size_t max);

/* When push_next_actions should run again at the latest for a record
 * waiting out a backoff (0: none waits). Set by push_next_actions. */
uint64_t push_next_wake(const push_table *t);

/* ---- outcomes. Each returns ECT_ESTATE when no such action is in flight on
 * that shard (a stray or repeated report changes nothing). */

/* Discovery of rec->consumer answered: rc 0 with the shards' control ports
 * (n >= 1) and the transport they named ("" none); otherwise rc and `why`
 * fail every record waiting for it (status rc). */
int push_peers_done(push_table *t, const char *consumer, int rc, const char *why, const int *ports,
                    size_t n, const char *transport);

/* Forgets what discovery learned of consumer (after a failed exchange). */
void push_forget_consumer(push_table *t, const char *consumer);

/* A shard's reserve reply (the `result` of an ok reply). */
typedef struct push_reservation {
    const char *reservation_id;
    const char *dst_session;
    uint64_t dst_ptr;
    const char *dst_key;   /* NULL: absent */
    const char *transport; /* NULL or "": tcp */
    bool write, ready, cached, cancelled;
} push_reservation;

/* res NULL: the reserve failed (`error` says why; the push fails). */
int push_reserve_done(push_table *t, push_rec *r, size_t shard, const push_reservation *res,
                      const char *error, uint64_t now_ms);
/* A reserve carried out as an ect_put into a spare range (docs/PROTOCOL.md
 * "a spare range granted ahead"): the shard bound the spare (res, the
 * spare's facts) to the item, the bytes were written and the shard
 * completed it (`completed`). Reserve, write and complete of that shard
 * are settled at once. */
int push_put_done(push_table *t, push_rec *r, size_t shard, const push_reservation *res,
                  bool completed, uint64_t now_ms);
/* The reserve in flight never happened (an ect_put refused, or its write
 * into the spare failed): the shard is reserved again by the next round. */
int push_reserve_undo(push_table *t, push_rec *r, size_t shard);
/* The shard refused the reserve because its pool is full (`error`, the
 * shard's text): back-pressure, see above. */
int push_reserve_full(push_table *t, push_rec *r, size_t shard, const char *error, uint64_t now_ms);
/* The outcome of a REFRESH or a GIVE_BACK. */
int push_refresh_done(push_table *t, push_rec *r, size_t shard, bool ok);
int push_write_done(push_table *t, push_rec *r, size_t shard, bool ok);
/* ok: the exchange succeeded; completed: the shard's `completed` answer. */
int push_complete_done(push_table *t, push_rec *r, size_t shard, bool ok, bool completed);
/* Whatever the outcome, the shard's own TTL ends a reservation not abandoned. */
int push_abandon_done(push_table *t, push_rec *r, size_t shard, bool ok);

/* Names the cause of a failure the table's own text would blur ("shard 1:
 * consumer H:P unreachable: ..."); the first one named is reported. */
void push_note_cause(push_rec *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct push_info {
    push_state state;
    bool source_staged;
    size_t n_shards, reserved, written, completed;
    unsigned retries;  /* reserve rounds refused as full so far */
    bool waiting_room; /* backing off after a full refusal */
    char error[PUSH_ERROR_MAX + 1];
} push_info;

int push_get(const push_table *t, const char *transfer_id, push_info *info); /* ECT_ENOTFOUND */

typedef struct push_stats {
    size_t live, tombstones;
    uint64_t done, failed, cancelled, refreshes, tombstones_dropped;
    uint64_t full_refusals; /* reserves a shard refused as full */
    uint64_t retries;       /* reserve rounds started again after one */
    uint64_t give_backs;    /* reservations given back meanwhile */
    uint64_t records;       /* full records allocated (the rest were spares) */
    size_t spares;          /* finished records kept for the next ones */
    size_t compact;         /* tombstones in an allocation of their own */
} push_stats;

void push_get_stats(const push_table *t, push_stats *st);

/* Verifies the invariants; ECT_ESTATE naming the broken one. For tests. */
int push_check(const push_table *t);

#endif
