/*
 * batch — the push producer's batcher: turns the actions of the records
 * table (pushes.h) into exchanges, and the exchanges' outcomes back into the
 * table. One round per call:
 *
 *   PEERS                                 -> one `peers` per consumer address
 *   RESERVE   grouped by shard address    -> one reserve_batch per shard
 *   REFRESH / ABANDON / GIVE_BACK         -> one cancel each (rare: GIVE_BACK only
 *                                            while a shard refuses as full)
 *   WRITE     grouped by (kind, session)  -> one write batch per destination session
 *   COMPLETE  grouped by shard address    -> one complete_batch per shard
 *
 * A step (a flush) of k items therefore costs one reserve_batch and one
 * complete_batch per shard whatever k is. The exchange carries the requests
 * built from the records (the wire structs, the ect_write list), and the
 * executor (producer_run.c) only carries them out and fills in the outcome.
 *
 * Policy lives here too: an address held down after a failed exchange
 * (downs.h) gets no exchange, its work fails at once naming it; discovery
 * checks the shard count (expect_shards) and the consumer's transport
 * before anything is reserved; a write to a shard offering another data
 * plane than the producer requires is refused; a failed exchange fails the
 * items it carried on that shard (the table then abandons their other
 * shards) and forgets the consumer's shards, so a restarted consumer is
 * rediscovered; a shard refusing as full is back-pressure (pushes.h). Each
 * failure's cause is handed to the table (push_note_cause), which reports it.
 *
 * Pure: no sockets, no threads, no clock (calls take now_ms); testable with
 * made-up replies. Threading: the producer's mutex around every call.
 */
#ifndef ECT_PUSH_BATCH_H
#define ECT_PUSH_BATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ectransfer.h"
#include "push/downs.h"
#include "push/pushes.h"
#include "util/lanes.h"
#include "wire/control_msg.h"

#define PX_KEY_MAX (PUSH_KIND_MAX + PUSH_ADDR_MAX + 24)

/* PX_PUT: a lone item's reserve carried out as a write into the spare range
 * its shard granted ahead, then one ect_put (docs/PROTOCOL.md "Extension: a
 * spare range granted ahead"): the control lane writes first (w, xport,
 * session of the spare), then sends the put. Refused (or its write failed),
 * the item is reserved again the normal way. */
typedef enum { PX_PEERS = 1, PX_RESERVE, PX_COMPLETE, PX_CANCEL, PX_WRITE, PX_PUT } px_kind;

/* A spare range a shard granted this producer (one per shard address). */
typedef struct pb_spare {
    char key[PX_KEY_MAX];            /* the shard's "host:port" */
    char rid[ECT_ID_LEN + 1];        /* the spare's id */
    char session[PUSH_ADDR_MAX + 1]; /* dst_session */
    char kind[PUSH_KIND_MAX + 1];    /* data plane ("tcp" if none named) */
    uint64_t dst_ptr, nbytes;
    char *dst_key; /* malloc'd, or NULL */
    struct pb_spare *next;
} pb_spare;

/* One action an exchange carries (its record stays valid until settled). */
typedef struct px_member {
    push_action_kind kind;
    push_rec *rec;
    size_t shard;
} px_member;

#define PX_ERR_MAX 320

/* One exchange: built here, carried out by the executor, settled here. */
typedef struct px {
    lane_job lj; /* first: the executor queues it on the lane of `key` */
    px_kind kind;
    char key[PX_KEY_MAX]; /* control: "host:port"; write: "kind|session" */
    size_t n;
    px_member *m;
    /* control exchanges */
    char host[PUSH_HOST_MAX + 1];
    int port;
    bool want_ok; /* an {"ok": false} reply is a failure (ctl_call_ok) */
    wire_ctl_request req;
    char consumer[PUSH_ADDR_MAX + 1]; /* PEERS */
    /* writes */
    char xkind[PUSH_KIND_MAX + 1];
    const char *session;
    ect_write *w;
    /* the outcome (the executor's) */
    ect_xport *xport; /* writes: the initiator the executor picked */
    wire_ctl_reply rep;
    int *status; /* writes: per member */
    int rc;
    bool held;            /* never went out (err says why) */
    bool on_main, routed; /* complete_batch: the lane it took (the executor's) */
    char err[PX_ERR_MAX]; /* rc's text */
    /* PX_PUT: the spare written into (owned), and the lane's progress */
    pb_spare *spare;
    bool put_written; /* the write into the spare ran (not again on a resume) */
    bool put_unsent;  /* ... and failed (or no transport): the put is not sent */
    struct px *next;
} px;

typedef struct pb_counts {
    uint64_t control_requests, peers_requests, reserve_batches, complete_batches, cancels,
        write_batches, refreshes;
    uint64_t puts, put_refusals; /* ect_put sent; refused (or unsent), reserved again */
} pb_counts;

typedef struct pbatch {
    push_table *t;
    down_table *downs;
    char transport[PUSH_KIND_MAX + 1]; /* required data plane, "" any */
    unsigned expect_shards;            /* 0 any */
    uint64_t shm_id; /* "ect_shm_id" every reserve names (our shm connections' id), 0 none */
    pb_counts n;     /* what went out */
    pb_spare *spares;        /* granted ranges, one per shard address (docs/PROTOCOL.md) */
    uint64_t spare_id;       /* "ect_shm_id" of requests that ask for or use a spare when shm_id
                                is 0: this producer's id, so a shard keeps one spare per producer */
    bool no_spares;          /* never ask for one (tests) */
    atomic_size_t held_down; /* down_count after the latest change (metrics) */
} pbatch;

/* A timeout or a transport failure: the consumer may be gone (an answer, even
 * {"ok": false}, says it is alive). */
bool pb_unreachable_rc(int rc);

/* Turns the round's actions (a[0..n), local kinds skipped) into exchanges,
 * appended to *out in the order reserves, cancels, writes, completes (peers
 * first); what cannot go out (address held down or unknown, no memory) is
 * settled at once. */
void pb_build(pbatch *b, const push_action *a, size_t n, uint64_t now_ms, px **out);

/* Applies x's outcome (rc, err, held, rep or status) to the table and frees x. */
void pb_settle(pbatch *b, px *x, uint64_t now_ms);

/* Frees an exchange not to be settled (closing). NULL is fine. */
void px_free(px *x);

/* Forgets every spare (closing; the shards' TTL frees them). */
void pb_spares_free(pbatch *b);

#endif
