/*
 * producer — internals shared by the push producer's two halves:
 * producer.c (the public calls, run on the caller's threads: queueing,
 * staging, dedup, results), producer_run.c (the dispatcher thread: the push_
 * table, batching, writes) and producer_lanes.c (one thread per control
 * address running its exchanges, discovery included).
 *
 * Locking: `mu` guards every field marked [mu]; fields marked [disp] belong
 * to the dispatcher thread alone; fields written before an item is handed
 * over (flush) and never after are read by the dispatcher without the lock
 * (the hand-over under `mu` orders them).
 */
#ifndef ECT_PUSH_PRODUCER_H
#define ECT_PUSH_PRODUCER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <uthash.h>

#include "ectransfer.h"
#include "push/control_client.h"
#include "push/downs.h"
#include "push/pushes.h"
#include "util/lanes.h"

/* Control lanes: at most this many addresses at once; an idle one ends. */
#define PP_MAX_LANES 4096
#define PP_LANE_IDLE_MS 60000

#define PP_HOST_MAX 255

typedef enum { PI_QUEUED = 1, PI_HANDED, PI_DONE } pitem_phase;

typedef struct pitem {
    /* set at reserve, read-only after */
    char transfer_id[PUSH_KEY_MAX + 1];
    char mm_hash[PUSH_KEY_MAX + 1];
    char consumer[PUSH_ADDR_MAX + 1];
    char host[PP_HOST_MAX + 1];
    int port;
    uint64_t shape[WIRE_MAX_NDIM];
    size_t ndim;
    char dtype[PUSH_DTYPE_MAX + 1];
    uint64_t nbytes;
    uint64_t t0_ns;
    /* the source [mu] */
    const void *src;
    bool src_held;     /* set, not yet released */
    bool stage_queued; /* a stage waits for the next flush or the dispatcher */
    ect_push_release_fn release;
    void *release_user;
    bool in_pool;
    uint64_t pool_off;
    pitem_phase phase; /* [mu] */
    uint64_t done_ms;  /* [mu] when it became PI_DONE */
    unsigned retries;  /* [disp] reserve rounds refused as full (for the result) */
    /* [disp] */
    size_t n_shards;
    int *ports;                            /* per shard: control port (host is the consumer's) */
    char **keys;                           /* per shard: dst_key from the reserve reply, or NULL */
    char (*kinds)[WIRE_TRANSPORT_MAX + 1]; /* per shard: transport kind */
    bool in_table;
    bool awaiting_peers;         /* waits in a pp_disc for its consumer's shards */
    bool cancel_early;           /* cancelled while awaiting_peers */
    char why[192];               /* a cause the push_ table's text would blur, or "" */
    char used_kind[16];          /* transport of the first write that landed */
    UT_hash_handle hh;           /* p->items [mu] */
    UT_hash_handle dh;           /* p->disp_items [disp] */
    struct pitem *next;          /* queued / handed list [mu] */
    struct pitem *snext;         /* stage list [mu] */
    struct pitem *tprev, *tnext; /* tombstones [mu] */
} pitem;

typedef struct pp_consumer {
    char consumer[PUSH_ADDR_MAX + 1];
    size_t n;
    int ports[PUSH_MAX_SHARDS];
    char transport[WIRE_TRANSPORT_MAX + 1]; /* from `peers`, "" when not said */
    UT_hash_handle hh;
} pp_consumer;

typedef struct pp_xport {
    char kind[16];
    ect_xport *x;
    struct pp_xport *next;
} pp_xport;

/* One control exchange for a lane (producer_lanes.c). */
typedef enum { PJ_PEERS = 1, PJ_RESERVE, PJ_COMPLETE, PJ_CANCEL } pp_job_kind;

typedef struct pp_job {
    lane_job lj; /* first: a lane_job * is a pp_job * */
    pp_job_kind kind;
    char host[PP_HOST_MAX + 1];
    int port;
    bool want_ok; /* ctl_call_ok: an {"ok": false} reply is a failure */
    wire_ctl_request req;
    wire_ctl_reply rep;
    int ports[PUSH_MAX_SHARDS]; /* PJ_PEERS: the answer */
    size_t nports;
    char transport[WIRE_TRANSPORT_MAX + 1]; /* PJ_PEERS: the shards' data plane, or "" */
    int rc;
    bool held;         /* never sent (err says why) */
    char err[320];     /* rc's text */
    push_action *acts; /* the table's actions it carries (copies), n of them */
    size_t n;
    struct pp_disc *disc; /* PJ_PEERS: who waits for it */
    struct pp_job *next;
} pp_job;

/* Items waiting for the discovery (peers) of their consumer. [disp] */
typedef struct pp_disc {
    char consumer[PUSH_ADDR_MAX + 1];
    pitem *waiting, *waiting_tail;
    UT_hash_handle hh;
} pp_disc;

struct ect_push_producer {
    ect_push_producer_opts o;
    char listen_host[PP_HOST_MAX + 1];
    char transport[16]; /* required data plane, "" for any */
    ect_pool *pool;     /* staging; NULL when staging_size == 0 */
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* the dispatcher waits on it */
    pthread_cond_t results; /* poll waits on it */
    pthread_cond_t room;    /* a staging wait waits on it: staging memory was freed */
    pthread_t thread;
    bool thread_started;
    /* [mu] */
    bool stop;
    pitem *items;                /* every known item, tombstones included */
    pitem *queued, *queued_tail; /* reserved since the last flush */
    pitem *handed, *handed_tail; /* flushed, not yet taken by the dispatcher */
    pitem *stage_q, *stage_h;    /* stages since the last flush / flushed */
    char **cancels;              /* ids to cancel, for the dispatcher */
    size_t n_cancels, cap_cancels;
    pitem *tombs, *tombs_tail;
    size_t n_tombs;
    ect_push_result *res;
    size_t res_head, res_n, res_cap;
    size_t n_live;            /* not yet reported */
    pp_job *done, *done_tail; /* exchanges the lanes finished, to apply */
    ect_push_producer_stat st;
    /* [disp] */
    void *zctx;
    down_table *downs; /* consumers held down after a failed exchange (backoff) */
    push_table *table;
    pitem *disp_items;
    pp_consumer *consumers;
    pp_xport *xports;
    lane_pool *lanes;    /* control exchanges, one lane per shard address */
    lane_pool *wlanes;   /* write batches, one lane per (transport, session) */
    pthread_mutex_t wmu; /* write groups of the round in flight on wlanes */
    pthread_cond_t wcv;
    size_t wpending; /* [wmu] */
    pp_disc *discs;  /* consumers whose discovery is in flight */
    push_action *acts;
    size_t acts_cap;
};

/* Dispatcher thread body (producer_run.c). */
void *pp_dispatch_main(void *arg);

/* Starts the control lanes (p->lanes); the write lanes (p->wlanes,
 * producer_run.c). */
int pp_lanes_open(ect_push_producer *p);
int pp_write_lanes_open(ect_push_producer *p);

/* Queues job j on the lane of j->host:j->port (a thread started on first
 * use, ended after PP_LANE_IDLE_MS without work). The lane runs its jobs one at a time, in order,
 * and appends each finished one to p->done (under mu), signalling p->wake; a job failed for want of
 * the peer also fails the jobs queued behind it (held, same cause). Takes ownership of j on
 * success; ECT_ENOMEM leaves it with the caller. Dispatcher thread. (producer_lanes.c) */
int pp_lane_submit(ect_push_producer *p, pp_job *j);

/* Stops and joins the lanes; each first ends the exchange it is in (up to
 * the control timeout); jobs never run arrive on p->done with ECT_ECLOSED.
 * Dispatcher thread. */
void pp_lanes_close(ect_push_producer *p);

/* Frees a job, its request items, reply and actions. NULL is fine. */
void pp_job_free(pp_job *j);

/* A timeout or a transport failure: the consumer may be gone (an answer, even
 * {"ok": false}, says it is alive). */
bool pp_unreachable_rc(int rc);

/* The key of a control address: "host:port", "[v6]:port". */
void pp_addr_key(const char *host, int port, char *buf, size_t cap);

/* Releases the item's source if still held (pool free or callback). Takes mu
 * itself; call without it. */
void pp_release_src(ect_push_producer *p, pitem *it);

/* Records the outcome (status 0 / ECT_ECANCELED / error), queues the result
 * and makes the item a tombstone. Caller holds mu. */
void pp_finish_locked(ect_push_producer *p, pitem *it, int status, const char *error);

/* Drops tombstones past their TTL or over the cap. Caller holds mu. */
void pp_expire_locked(ect_push_producer *p, uint64_t now_ms);

#endif
