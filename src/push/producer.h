/*
 * producer — internals shared by the push producer's parts:
 *   producer.c        the public calls, on the caller's threads: validation,
 *                     staging copies, the table calls, results;
 *   producer_run.c    the dispatcher thread, a thin executor: it takes the
 *                     table's actions, has the batcher (batch.c) build the
 *                     exchanges, runs them and hands their outcomes back;
 *   producer_lanes.c  the control lanes (one per shard address, util/lanes)
 *                     that run the control exchanges.
 * Everything the producer knows about an item lives in one place, the records
 * table (pushes.h), which is also the one dedup.
 *
 * Locking: `mu` guards every field marked [mu], the table and the batcher
 * (every call on them); it is never held across I/O, a wait for room, or a
 * release callback. Fields marked [disp] belong to the dispatcher thread.
 */
#ifndef ECT_PUSH_PRODUCER_H
#define ECT_PUSH_PRODUCER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "ectransfer.h"
#include "push/batch.h"
#include "push/control_client.h"
#include "push/downs.h"
#include "push/pushes.h"
#include "util/keys.h"
#include "util/lanes.h"
#include "util/metrics.h"

/* Lanes: at most this many addresses / sessions at once; an idle one ends. */
#define PP_MAX_LANES 4096
#define PP_LANE_IDLE_MS 60000

typedef struct pp_xport {
    char kind[PUSH_KIND_MAX + 1];
    ect_xport *x;
    struct pp_xport *next;
} pp_xport;

/* Transports the metrics count bytes for (the last: any other name). */
#define PP_MET_KINDS 4

struct ect_push_producer {
    ect_push_producer_opts o;
    char listen_host[PUSH_HOST_MAX + 1];
    char transport[PUSH_KIND_MAX + 1]; /* required data plane, "" for any */
    ect_pool *pool;                    /* staging; NULL when staging_size == 0 */
    pthread_mutex_t mu;
    pthread_cond_t wake;    /* the dispatcher waits on it */
    pthread_cond_t results; /* poll waits on it */
    pthread_cond_t room;    /* a staging wait waits on it: staging memory was freed */
    pthread_t thread;
    bool thread_started;
    /* [mu] */
    bool stop;
    bool kick;         /* the table has new work (a flush, a cancel) */
    push_table *table; /* the records: the producer's whole state */
    pbatch batch;      /* over the table: exchanges and their outcomes */
    px *done;          /* exchanges the lanes finished, to settle */
    px **done_tail;
    size_t unreported; /* finished records whose result is not queued yet */
    ect_push_result *res;
    size_t res_head, res_n, res_cap;
    ect_push_producer_stat st;
    char *curve_keys;
    ect_keyset *keys; /* NULL: keys off; read-only after open */
    /* [disp] */
    void *zctx;
    pp_xport *xports;
    push_action *acts;
    size_t acts_cap;
    lane_pool *lanes;    /* control exchanges, one lane per shard address */
    lane_pool *wlanes;   /* write batches, one lane per (transport, session) */
    pthread_mutex_t wmu; /* write groups of the round in flight on wlanes */
    pthread_cond_t wcv;
    size_t wpending; /* [wmu] */
    /* metrics */
    struct met_source *met;
    uint64_t moved_bytes[PP_MET_KINDS], moved_items[PP_MET_KINDS]; /* [mu] by pp_met_kinds */
    met_hist latency;                                              /* reserve -> done */
};

/* Dispatcher thread body (producer_run.c). */
void *pp_dispatch_main(void *arg);

/* Starts the control lanes (p->lanes, producer_lanes.c) and the write lanes
 * (p->wlanes, producer_run.c). */
int pp_lanes_open(ect_push_producer *p);
int pp_write_lanes_open(ect_push_producer *p);

/* Queues the control exchange x on the lane of x->key, or for a
 * complete_batch on the address's completes lane "complete|" x->key (a
 * thread started on first use, ended after PP_LANE_IDLE_MS without work). The lane runs its
 * exchanges one at a time, in order, and appends each finished one to
 * p->done (under mu), waking the dispatcher; one failed for want of the peer
 * also fails those queued behind it (held, same cause). Takes x on success;
 * on failure (ECT_ENOMEM) the caller keeps it. Dispatcher thread. */
int pp_lane_submit(ect_push_producer *p, px *x);

/* Stops and joins the control lanes; each first ends the exchange it is in
 * (up to the control timeout); exchanges never run arrive on p->done with
 * ECT_ECLOSED. */
void pp_lanes_close(ect_push_producer *p);

/* Appends x to p->done and wakes the dispatcher. Takes mu. */
void pp_deliver(ect_push_producer *p, px *x);

/* Carries out the local actions a[0..n) (RELEASE_SOURCE: gives the source
 * back; FINISHED: queues the result), in order. Call without mu; the
 * records were already counted in p->unreported. */
void pp_local(ect_push_producer *p, const push_action *a, size_t n);

/* Counts the FINISHED among a[0..n) into p->unreported. Caller holds mu. */
void pp_count_finished_locked(ect_push_producer *p, const push_action *a, size_t n);

#endif
