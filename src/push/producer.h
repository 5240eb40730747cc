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
 * release callback. Fields marked [run] belong to the thread that holds the
 * baton (`running`, below).
 *
 * The baton: one thread at a time runs rounds (settles what came back, asks
 * the table for the actions due, carries them out), so rounds never overlap
 * and every order the dispatcher kept holds. Which thread does not matter to
 * the table, so the thread that finds new work runs the rounds itself when
 * nobody does (pp_run_locked): the lane whose exchange just came back (it
 * writes and queues the complete directly), the caller's flush (it queues
 * the reserve; anything that could block it, a write or a release callback,
 * is handed to the dispatcher, `ho`). This takes the dispatcher out of a
 * lone step's path: each hand-off between threads costs a wake-up. A lane
 * with exchanges queued behind leaves the work to the dispatcher instead, so
 * its next exchange is not held up by writes (steps in flight). A lane whose
 * reply comes back while a caller's flush holds the baton waits for that
 * short round (pp_wait_caller_locked) and takes the baton after it, so a lone
 * step's reserve, write, complete and result all stay on its lane. A
 * flush_poll's poll runs a lone step instead, its flush having left it
 * quietly queued (pp_lend, below): then it all stays on the caller's thread.
 */
#ifndef ECT_PUSH_PRODUCER_H
#define ECT_PUSH_PRODUCER_H

#include <pthread.h>
#include <stdatomic.h>
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

/* The rest of a round that a thread which must not block (or whose own lane
 * waits) hands to the dispatcher with the baton: the round's local actions
 * (p->acts[0..nlocal)), its write batches and the exchanges that never went
 * out, to settle. */
typedef struct pp_handoff {
    bool set;
    size_t nacts;
    px *writes, *failed;
    bool async; /* the writes go out on the write lanes, unwaited (producer_run.c) */
} pp_handoff;

/* The completes of one control address queued or in flight on each of its
 * two lanes, with CurveZMQ keys only (producer_lanes.c, "Steps in flight";
 * without keys every complete rides the main lane, pipelined). */
typedef struct pp_route {
    char key[PX_KEY_MAX];
    size_t main_n, side_n;
    struct pp_route *next;
} pp_route;

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
    bool kick;            /* the table has new work (a flush, a cancel) */
    bool running;         /* a thread holds the baton: runs rounds (see the top) */
    pp_handoff ho;        /* the dispatcher takes the baton and finishes this round */
    uint64_t handoffs;    /* how often the dispatcher took the baton so (pp_handoffs) */
    uint64_t pipelined;   /* exchanges that rode behind another in one write (pp_pipelined) */
    _Atomic uint64_t lent;   /* lane jobs run on a poll's thread (pp_lent) */
    _Atomic uint64_t yields; /* ... handed back mid-exchange (pp_lend_yields) */
    atomic_bool closing;     /* no lane starts an exchange (ect_push_producer_close) */
    atomic_bool quiet;         /* a flush_poll's round left a lane asleep (pp_lane_submit) */
    atomic_int lenders;        /* ect_push_producer_flush_poll calls in progress */
    bool kick_lender;          /* [mu] the kick is a flush_poll's flush: quiet submits */
    size_t pollers;            /* [mu] polls waiting on `results` */
    _Atomic uint64_t clock_ms; /* a test's clock (pp_set_clock); 0: ect_now_ms */
    uint64_t lend_seq;         /* [mu] bumped when a lane's work was left to a poll */
    bool caller_runs;     /* the baton is a public call's (a flush: it never waits) */
    size_t baton_waiters; /* lanes waiting on `baton` for that call's round to end */
    pthread_cond_t baton; /* broadcast when a caller lets go of the baton */
    pp_route *routes;     /* addresses with completes in flight */
    push_table *table;    /* the records: the producer's whole state */
    pbatch batch;         /* over the table: exchanges and their outcomes */
    px *done;             /* exchanges the lanes finished, to settle */
    px **done_tail;
    size_t unreported; /* finished records whose result is not queued yet */
    ect_push_result *res;
    size_t res_head, res_n, res_cap;
    ect_push_producer_stat st;
    char *curve_keys;
    ect_keyset *keys; /* NULL: keys off; read-only after open */
    /* [run] (zctx and the pools: set at open) */
    void *zctx;
    pp_xport *xports;
    push_action *acts;
    size_t acts_cap;
    lane_pool *lanes;    /* control exchanges, one lane per shard address */
    lane_pool *wlanes;   /* write batches, one lane per (transport, session) */
    pthread_mutex_t wmu; /* write groups of the round in flight on wlanes */
    pthread_cond_t wcv;
    size_t wpending; /* [wmu] */
    size_t wflight;  /* [wmu] writes out on the lanes that no round waits for */
    uint64_t wasync; /* [mu] writes that went out so (pp_async_writes) */
    /* metrics */
    struct met_source *met;
    uint64_t moved_bytes[PP_MET_KINDS], moved_items[PP_MET_KINDS]; /* [mu] by pp_met_kinds */
    met_hist latency;                                              /* reserve -> done */
};

/* Dispatcher thread body (producer_run.c). */
void *pp_dispatch_main(void *arg);

typedef enum {
    PP_RUN_DISPATCHER,
    PP_RUN_LANE,   /* a control lane: hands writes off once its own lane has work */
    PP_RUN_CALLER, /* a public call: hands off every write and local action */
    PP_RUN_WRITER, /* a write lane whose unwaited write just came back */
} pp_run_mode;

/* Takes the baton when no thread holds it (and the producer is not
 * stopping) and runs rounds until nothing is left: settles p->done, then
 * the table's actions. When another thread holds it, returns at once: that
 * one loops while p->done or p->kick is set. lane_key: the running lane's
 * key (PP_RUN_LANE), else NULL. Caller holds mu; it is dropped meanwhile. */
void pp_run_locked(ect_push_producer *p, pp_run_mode mode, const char *lane_key);

/* Waits (mu held) while a public call holds the baton: its round never
 * waits on the network, so a lane with a reply to settle waits for it and
 * takes the baton after it (producer_lanes.c, deliver_and_run). */
void pp_wait_caller_locked(ect_push_producer *p);

/* Starts the control lanes (p->lanes, producer_lanes.c) and the write lanes
 * (p->wlanes, producer_run.c). */
int pp_lanes_open(ect_push_producer *p);
int pp_write_lanes_open(ect_push_producer *p);

/* The lane a control exchange runs on: x->key, or for a complete_batch not
 * routed onto it (pp_route_complete_locked) the address's completes lane
 * "complete|" x->key. */
#define PP_LANE_KEY_MAX (PX_KEY_MAX + 16)
void pp_lane_key(const px *x, char key[PP_LANE_KEY_MAX]);

/* Queues the control exchange x on its lane (pp_lane_key; a thread started
 * on first use, ended after PP_LANE_IDLE_MS without work). The lane runs its
 * exchanges one at a time, in order, and appends each finished one to
 * p->done (under mu), then settles it itself when nobody runs rounds and no
 * exchange waits behind it on the lane, else leaves it to the baton's holder
 * or wakes the dispatcher; one failed for want of the peer also fails those
 * queued behind it (held, same cause). Takes x on success; on failure
 * (ECT_ENOMEM) the caller keeps it. The baton's holder. */
int pp_lane_submit(ect_push_producer *p, px *x, bool quiet_ok);

/* The round the flush of ect_push_producer_flush_poll kicked (a lone step;
 * the same call's poll lends its thread, pp_lend) queues its exchanges with
 * quiet_ok: an idle lane's thread is not woken (lanes_submit_quiet, p->quiet
 * set), nor does a lane that queues it on itself take it, since the poll
 * runs the exchange itself; a poll already waiting is told (lend_seq).
 * flush_poll wakes such lanes when it returns (pp_wake_quiet), and a quiet
 * submit made while no flush_poll is in progress
 * (p->lenders 0: its round ran late, on another thread) wakes its lane at
 * once, so no step waits for a poll that is not coming. */
void pp_wake_quiet(ect_push_producer *p);

/* Picks the lane of the complete_batch x (x->on_main: always without keys,
 * where exchanges pipeline) and with keys counts it in
 * flight there. runner_lane: the key of the lane running the round when
 * nothing else is queued on it, else NULL. Caller holds mu. */
void pp_route_complete_locked(ect_push_producer *p, px *x, const char *runner_lane);

/* x is settled: a complete_batch no longer counts in flight. Caller holds mu. */
void pp_route_settled_locked(ect_push_producer *p, const px *x);

/* Frees the routes (closing). */
void pp_routes_free(ect_push_producer *p);

/* Stops and joins the control lanes; each first ends the exchange it is in
 * (at once when closing, ect_push_producer_close; else up to the control
 * timeout); exchanges never run arrive on p->done with ECT_ECLOSED. */
void pp_lanes_close(ect_push_producer *p);

/* Appends the chain x (linked by lj.next; one exchange: next NULL) to
 * p->done and wakes the dispatcher. Takes mu. */
void pp_deliver(ect_push_producer *p, px *x);

/* Carries out the local actions a[0..n): every RELEASE_SOURCE (gives the
 * source back) in order, then every FINISHED (queues the result) under one
 * lock, waking poll once. Call without mu; the records were already counted
 * in p->unreported. */
void pp_local(ect_push_producer *p, const push_action *a, size_t n);

/* The time (ms) the records table and the batcher are told: ect_now_ms(),
 * unless a test set its own clock (pp_set_clock). Any thread. */
uint64_t pp_now(ect_push_producer *p);

/* Tests: the table and the batcher are told `ms` from now on, whatever the
 * real time (0: ect_now_ms() again), so that a test gives a reservation the
 * age it needs by setting the clock after it saw the reply applied, rather
 * than by sleeping while a thread off its CPU may apply the reply late or
 * age the next one too. Set it before the items it concerns are added; it
 * never goes back (the table keeps the latest time it was told). Waits and
 * timeouts (control, I/O, staging, polls) stay on the real clock. Any
 * thread. */
void pp_set_clock(ect_push_producer *p, uint64_t ms);

/* How many times the dispatcher took the baton handed to it (p->ho): each
 * is a thread hand-off inside a step (for tests and profiles). Any thread. */
uint64_t pp_handoffs(ect_push_producer *p);

/* How many write batches went out on a write lane with no round waiting
 * for them (steps in flight, producer_run.c "Writes in flight"). Any
 * thread. */
uint64_t pp_async_writes(ect_push_producer *p);

/* How many control exchanges went out pipelined behind another on one
 * connection (producer_lanes.c): completes riding with the next step's
 * reserve, steps flushed while the lane was busy (for tests). Any thread. */
uint64_t pp_pipelined(ect_push_producer *p);

/* Lends the calling thread (flush_poll's wait, no mu held) to the control
 * lanes: takes an idle lane with an exchange queued (util/lanes, lanes_lend)
 * and runs its jobs here as the lane's thread would (the exchange on the
 * lane's connection, then settle, write, complete, result), until a result
 * is queued, until_ms (ms, ect_now_ms; 0: none) passes or the lane has no
 * job left. An exchange still waiting for its reply at until_ms is handed
 * back to the lane's thread, which goes on reading it (control_link.h,
 * yield). Not with CurveZMQ keys (a libzmq REQ belongs to its thread), nor
 * nested. Returns whether it ran anything. */
bool pp_lend(ect_push_producer *p, uint64_t until_ms);

/* How many lane jobs ran on a poll's thread (pp_lend; tests), and how many
 * of them it handed back to the lane's thread mid-exchange, its time up
 * (one begun before a connection was up is not counted). Any thread. */
uint64_t pp_lent(ect_push_producer *p);
uint64_t pp_lend_yields(ect_push_producer *p);

/* Counts the FINISHED among a[0..n) into p->unreported. Caller holds mu. */
void pp_count_finished_locked(ect_push_producer *p, const push_action *a, size_t n);

#endif
