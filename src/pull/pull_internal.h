/*
 * pull_internal — pieces shared by the generation-1 role objects (producer,
 * scheduler, consumer) and the fuzz target of the producer's request handler.
 *
 *  - inventory: the producer's published items (mm_hash -> shape, dtype,
 *    nbytes), read from its pool's resident items (inventory.c).
 *  - router: the ROUTER request handler, free of sockets: it decodes one
 *    request frame, answers through ops.reply and hands accepted pulls (with a
 *    lease on the item) to ops.dispatch. Runs on the ROUTER thread only.
 */
#ifndef ECT_PULL_INTERNAL_H
#define ECT_PULL_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ectransfer.h"
#include "wire/pull_msg.h"

/* Peer-facing bounds of the pull sockets (docs/PROTOCOL.md "Sockets"): a
 * frame over ECT_PULL_MAX_MSG_BYTES makes ZMQ drop the sender's connection
 * before the bytes are buffered (no message of ours is near it); the pull
 * consumer's DEALER heartbeats so a producer host that went silent is noticed
 * after the timeout (a closed connection is noticed at once). */
#define ECT_PULL_MAX_MSG_BYTES (2 * (int64_t)WIRE_PULL_MAX_MSG)
#define ECT_PULL_HEARTBEAT_IVL_MS 1000
#define ECT_PULL_HEARTBEAT_TIMEOUT_MS 5000

/* -------------------------------------------------------------- monitor */

/* The id of the next event waiting on a ZMQ socket monitor (a PAIR socket
 * connected to zmq_socket_monitor's endpoint), its endpoint frame read and
 * dropped; -1 when none is waiting. Never blocks. */
int pull_monitor_next(void *mon);

/* ------------------------------------------------------------ inventory */

/* Copies the resident items matching the filter (all when n_filter is 0;
 * unknown hashes are left out) into a malloc'd array the caller frees with
 * pull_inv_items_free. Reading does not count as a use of the items.
 * ECT_ENOMEM. */
int pull_inv_snapshot(ect_pool *pool, char *const *filter, size_t n_filter, wire_pull_item **items,
                      size_t *n);
void pull_inv_items_free(wire_pull_item *items, size_t n);

/* --------------------------------------------------------------- router */

/* Who sent a request: the ROUTER identity frame (libzmq's ROUTER, with
 * CURVE keys) or our own listener's connection id (without), and whether
 * the request came with an empty delimiter frame (a REQ peer) to be echoed
 * back. */
typedef struct pull_peer {
    unsigned char id[256];
    size_t id_len;
    uint64_t conn; /* ctl_listener connection id; 0 with libzmq's ROUTER */
    bool delim;
    char addr[64]; /* the IP address the request came from (ZMQ "Peer-Address"); "" unknown */
} pull_peer;

/* One accepted pull: the item is leased in the pool (the job's owner
 * releases it after the write). */
typedef struct pull_job {
    pull_peer peer;
    char *mm_hash;
    char *session; /* consumer_session_id */
    char *dst_key;
    uint64_t dst_addr; /* dst_ptr + dst_offset */
    bool has_token;
    uint64_t token;
    bool batched;        /* came in an ECTransferPullBatch: success is told in an ECTransferDone */
    uint64_t src_offset; /* in the producer pool */
    uint64_t nbytes;
    struct pull_job *next;
} pull_job;

void pull_job_free(pull_job *j);

typedef struct pull_router_ops {
    void *user;
    /* Sends one message to peer (no blocking). Returns 0 or an ECT_E* code. */
    int (*reply)(void *user, const pull_peer *peer, const void *msg, size_t len);
    /* Takes ownership of job on success (0); on failure the caller still
     * owns it (and its lease). A dispatcher may hold accepted jobs and hand
     * them on later (the producer: at the end of a burst of frames); one it
     * cannot hand on then is answered with pull_router_refuse_job. */
    int (*dispatch)(void *user, pull_job *job);
} pull_router_ops;

typedef struct pull_router_stat {
    uint64_t frames, malformed, pulls, pulls_refused, requests, ready_pages;
    uint64_t batches, done_msgs; /* ECTransferPullBatch taken, ECTransferDone sent */
} pull_router_stat;

/* The tokens of one peer's batched pulls written since the last
 * pull_router_flush_done. */
typedef struct pull_done_acc {
    pull_peer peer;
    uint64_t *tokens;
    size_t n, cap;
} pull_done_acc;

typedef struct pull_router {
    ect_pool *pool;         /* its resident items are the inventory */
    const char *session_id; /* producer_session_id */
    size_t page_items;      /* items per ECTransferReady, 1..WIRE_PULL_MAX_ITEMS */
    const char *allow;      /* connect policy (ect_pull_producer_opts.connect_allow) */
    uint64_t shm_id;        /* our shm offer id, sent in every ECTransferComplete; 0: none */
    uint32_t batch_max;     /* ECTransferPullBatch size we take, told in completions that echo a
                               token ("ect_batch"); 0: batches not offered */
    pull_router_ops ops;
    pull_router_stat st;
    pull_done_acc *acc; /* batched pulls written, per peer, not yet told */
    size_t n_acc, cap_acc;
} pull_router;

/* The producer's data-plane transport (tests: shm_counts). */
ect_xport *pull_producer_xport(ect_pull_producer *p);
/* Hand-offs so far (tests): jobs the ROUTER thread gave to write lanes, and
 * pulls it wrote and answered itself (shm copies into offered windows). */
void pull_producer_handoffs(ect_pull_producer *p, uint64_t *lane_jobs, uint64_t *ready_pulls);
/* ECTransferPullBatch messages taken and ECTransferDone messages sent so
 * far (tests). */
void pull_producer_batches(ect_pull_producer *p, uint64_t *batches, uint64_t *done_msgs);

/* Checks a connect_allow value: "*", or IP addresses (IPv4 or IPv6)
 * separated by commas, none empty. 0, or ECT_EINVAL with a sentence naming
 * the first bad entry. */
int pull_allow_check(const char *allow);

/* Handles one request frame from peer. Never fails on bad input: malformed
 * frames are counted and dropped; refused pulls are answered with a non-zero
 * status and a logged reason. */
void pull_router_handle(pull_router *r, const pull_peer *peer, const void *buf, size_t len);

/* Refuses an accepted pull its dispatcher could not run after all: counts
 * and logs it, releases its lease, answers it with status and reason, frees
 * j. ROUTER thread only. */
void pull_router_refuse_job(pull_router *r, pull_job *j, int status, const char *reason);

/* Answers a pull that ended with status: a batched one written (status 0)
 * joins its peer's next ECTransferDone (pull_router_flush_done), anything
 * else gets its ECTransferComplete now. */
void pull_router_answer(pull_router *r, const pull_peer *peer, const char *mm_hash, int status,
                        bool has_token, uint64_t token, bool batched, const char *reason);
/* Sends each peer's ECTransferDone of the batched pulls answered since the
 * last call (the end of a pass of the ROUTER thread). */
void pull_router_flush_done(pull_router *r);
/* Frees what pull_router_answer holds (the producer's close). */
void pull_router_fini(pull_router *r);

/* Encodes and sends an ECTransferComplete through r->ops.reply. */
void pull_router_complete(pull_router *r, const pull_peer *peer, const char *mm_hash, int status,
                          bool has_token, uint64_t token, const char *reason);

/* Copies a resident-info / item description into an ect_pull_meta. */
void pull_meta_from_item(const wire_pull_item *it, const char *session, ect_pull_meta *meta);

#endif
