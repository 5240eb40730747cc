/*
 * producer — internals shared by the push producer's two halves:
 * producer.c (the public calls, run on the caller's threads: queueing,
 * staging, dedup, results) and producer_run.c (the dispatcher thread: shard
 * discovery, the push_ table, batched control exchanges and writes).
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
    /* [disp] */
    size_t n_shards;
    int *ports;                            /* per shard: control port (host is the consumer's) */
    char **keys;                           /* per shard: dst_key from the reserve reply, or NULL */
    char (*kinds)[WIRE_TRANSPORT_MAX + 1]; /* per shard: transport kind */
    bool in_table;
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
    UT_hash_handle hh;
} pp_consumer;

typedef struct pp_xport {
    char kind[16];
    ect_xport *x;
    struct pp_xport *next;
} pp_xport;

struct ect_push_producer {
    ect_push_producer_opts o;
    char listen_host[PP_HOST_MAX + 1];
    char transport[16]; /* required data plane, "" for any */
    ect_pool *pool;     /* staging; NULL when staging_size == 0 */
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* the dispatcher waits on it */
    pthread_cond_t results; /* poll waits on it */
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
    size_t n_live; /* not yet reported */
    ect_push_producer_stat st;
    /* [disp] */
    void *zctx;
    ctl_client *ctl;
    down_table *downs; /* consumers held down after a failed exchange (backoff) */
    push_table *table;
    pitem *disp_items;
    pp_consumer *consumers;
    pp_xport *xports;
    struct pp_lane *lanes; /* control exchanges in parallel, one thread per shard address */
    push_action *acts;
    size_t acts_cap;
};

/* Dispatcher thread body (producer_run.c). */
void *pp_dispatch_main(void *arg);

/* Stops and joins the control lanes (producer_run.c). Dispatcher thread. */
void pp_lanes_close(ect_push_producer *p);

/* Releases the item's source if still held (pool free or callback). Takes mu
 * itself; call without it. */
void pp_release_src(ect_push_producer *p, pitem *it);

/* Records the outcome (status 0 / ECT_ECANCELED / error), queues the result
 * and makes the item a tombstone. Caller holds mu. */
void pp_finish_locked(ect_push_producer *p, pitem *it, int status, const char *error);

/* Drops tombstones past their TTL or over the cap. Caller holds mu. */
void pp_expire_locked(ect_push_producer *p, uint64_t now_ms);

#endif
