/*
 * producer_lanes — the push producer's control lanes (util/lanes): one lane
 * per control address ("host:port" of a consumer shard), each with its own
 * control client (a REQ socket belongs to one thread) made on its thread,
 * running that address's exchanges one at a time, in the order the
 * dispatcher queued them. A lane idle for PP_LANE_IDLE_MS ends (and its
 * socket with it); the next exchange for the address starts a new one.
 *
 * Why lanes and not calls on the dispatcher: an exchange may take the whole
 * control timeout (a consumer alive but hung). Run on the dispatcher, it would
 * hold up every other consumer's pushes; on its own lane it holds up only the
 * work queued for the same address. Nobody waits for a lane: a finished
 * exchange goes to p->done (under mu); when no thread runs rounds and no
 * exchange waits behind it, the lane settles it itself and runs what follows
 * (for a reserve: the write and the complete's queueing; for a complete: the
 * result), else the baton's holder or the dispatcher does (producer.h, "the
 * baton").
 *
 * Steps in flight: the exchanges queued on a lane while it waits for a
 * reply ride together next: the lane takes up to CTL_MANY_MAX of them and
 * pipelines them on its one connection (ctl_call_many: every request in one
 * write, the replies read in order; a REP answers a connection's requests
 * one after another). So the complete_batch of step n goes out with the
 * reserve_batch of step n+1 in one write, and several steps' exchanges cost
 * one round trip, without a second thread or socket per address. Order per
 * consumer holds trivially: one connection, requests in queue order, and a
 * record has one action in flight at a time (pushes.h), so nothing of one
 * item overtakes another of the same item. A lane back from such a batch
 * leaves the round's writes to the dispatcher (it is the one with steps in
 * flight: its next batch should not wait behind a write).
 *
 * With CurveZMQ keys the connection is a libzmq REQ, which cannot pipeline:
 * then complete_batch keeps a lane of its own per address,
 * "complete|host:port" (a second REQ connection: two peers to the shard's
 * REP socket, as two producers are), so the completes of step n travel
 * while the reserve of step n+1 does. A lone step's complete rides the
 * address's main lane when the lane that got its reserve reply runs the
 * round and has nothing queued (it sends the complete itself next, one
 * thread hand-off fewer); otherwise the completes lane. Order per address
 * still holds because the completes of an address in flight are all on one
 * lane: a complete goes to the main lane while others are in flight there,
 * to the completes lane while others are there, and switches only when
 * none is in flight (pp_route, counted under mu from routing to settling).
 *
 * Lending (pp_lend): flush_poll's wait runs an idle lane's jobs on its
 * own thread with the lane's own control client (util/lanes lanes_lend: the
 * lane's thread takes no job meanwhile, so the client is used by one thread
 * at a time), so a lone step's reserve, write, complete and result cross no
 * thread: its flush left the reserve queued without waking the lane, the
 * wait takes it, and the complete the round queues on the lent lane is taken
 * next. The poll's timeout is the exchange's yield_at (control_link.h): a
 * reply still awaited then stays on the link and the chain goes back to the
 * lane's thread (lanes_lend_end with it as `resume`; lc->susp), which
 * resumes the same call: the request is not sent again, its control timeout
 * runs on, order per address holds (the resumed chain runs before the
 * queue). A call that would have to connect first is not lent at all (it
 * goes back unsent). With CurveZMQ keys nothing is lent: a libzmq REQ and
 * its monitor belong to the thread that made them.
 *
 * An exchange that failed for want of the peer (timeout, refused, connection
 * closed) also fails the ones queued behind it on that lane at once, with the
 * same cause: they were queued before anyone knew, and each would otherwise
 * wait out its own timeout. From then on the batcher's down table keeps new
 * work away from the address until its backoff runs out.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "push/producer.h"
#include "util/util.h"

#define MOD "producer"

/* Appends the chain x (linked by lj.next) to p->done. Caller holds mu. */
static void append_done_locked(ect_push_producer *p, px *x) {
    while (x) {
        px *next = (px *)x->lj.next;
        x->lj.next = NULL;
        x->next = NULL;
        *p->done_tail = x;
        p->done_tail = &x->next;
        x = next;
    }
}

void pp_deliver(ect_push_producer *p, px *x) {
    pthread_mutex_lock(&p->mu);
    append_done_locked(p, x);
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

/* Hands the finished chain x back and settles it on this thread when
 * nobody runs rounds and nothing waits behind on the lane (producer.h, "the
 * baton"); a lane with work queued wakes the dispatcher instead, and a
 * running holder of the baton picks it up itself (no wake-up). When the
 * holder is a caller's flush (the lane's wake-up preempted it right after it
 * queued the reserve, so the reply came back first), the lane waits for that
 * short round to end and settles the reply itself: otherwise the caller
 * would hand the baton to the dispatcher, which would take the write and
 * send the complete on the completes lane (two hand-offs more per step). */
static void deliver_and_run(ect_push_producer *p, px *x, lane *l) {
    /* Several exchanges that rode together: steps in flight, so this lane
     * goes back to its exchanges and the writes are the dispatcher's. */
    bool queued = x->lj.next || lane_has_queued(l), wake = false;
    pthread_mutex_lock(&p->mu);
    for (px *e = (px *)x->lj.next; e; e = (px *)e->lj.next) p->pipelined += !e->held;
    append_done_locked(p, x);
    if (!queued) pp_wait_caller_locked(p);
    if (!p->running) {
        if (queued || p->stop)
            wake = true;
        else
            pp_run_locked(p, PP_RUN_LANE, lane_key(l));
    }
    pthread_mutex_unlock(&p->mu);
    /* after the unlock: the dispatcher looks at p->done under mu before it waits */
    if (wake) pthread_cond_signal(&p->wake);
}

/* A lane's own control client. */
typedef struct lane_ctl {
    ctl_client *c;
    int orc;        /* opening it failed: every exchange fails with this */
    char oerr[160]; /* and this text */
    /* Lending (pp_lend): set by the thread running the lane's job */
    uint64_t yield_at; /* a borrower's time runs out then (ms; 0: the lane's own thread) */
    px *susp;          /* the chain a borrower gave up mid-exchange: resumed next */
    bool fresh;        /* ... before anything was sent (no live connection) */
} lane_ctl;

static void *lane_start(void *ctx, const char *key) {
    ect_push_producer *p = ctx;
    (void)key;
    lane_ctl *lc = calloc(1, sizeof *lc);
    if (!lc) return NULL;
    lc->orc = ctl_client_open(p->zctx, p->o.control_timeout_ms, &lc->c);
    if (!lc->orc) ctl_client_fail_fast(lc->c, true);
    if (!lc->orc) ctl_client_set_keys(lc->c, p->keys);
    snprintf(lc->oerr, sizeof lc->oerr, "%s", lc->orc ? ect_last_error() : "");
    return lc;
}

static void lane_stop(void *ctx, void *state) {
    (void)ctx;
    lane_ctl *lc = state;
    if (lc) ctl_client_close(lc->c);
    free(lc);
}

/* Runs the chain x (linked by lj.next, one address) on the lane's client:
 * pipelined on its one connection (ctl_call_many), so the exchanges queued
 * together cost one round trip; each gets its own rc and text. Returns true
 * when a borrower's time ran out first (lc->yield_at): the chain is then
 * lc->susp, to be resumed (pp_lend). */
static bool run_chain(lane_ctl *lc, px *x) {
    bool resume = lc->susp == x;
    ctl_exchange ex[CTL_MANY_MAX];
    size_t n = 0;
    for (px *e = x; e; e = (px *)e->lj.next) {
        if (e->put_unsent) continue;
        ex[n++] = (ctl_exchange){.req = &e->req,
                                 .rep = &e->rep,
                                 .want_ok = e->want_ok,
                                 .err = e->err,
                                 .err_cap = sizeof e->err};
    }
    lc->susp = NULL;
    if (!n) return false; /* only puts whose write failed: nothing to send */
    int rc = ctl_call_many_lent(lc->c, x->host, x->port, ex, n, lc->yield_at, resume);
    if (rc == CTL_YIELDED || rc == CTL_YIELDED_UNSENT) {
        lc->susp = x;
        lc->fresh = rc == CTL_YIELDED_UNSENT;
        return true;
    }
    n = 0;
    for (px *e = x; e; e = (px *)e->lj.next)
        if (!e->put_unsent) e->rc = ex[n++].rc;
    return false;
}

/* The writes of the chain's puts (PX_PUT) into their spares, before any of
 * the chain's requests goes out (a put names bytes already there). A write
 * that fails, or has no transport, leaves its put unsent (the item is then
 * reserved the normal way). Once per put: a resumed chain does not write
 * again. */
static void write_puts(px *x) {
    for (px *e = x; e; e = (px *)e->lj.next) {
        if (e->kind != PX_PUT || e->put_written) continue;
        e->put_written = true;
        e->put_unsent = !e->xport ||
                        ect_xport_write_batch(e->xport, e->session, e->w, 1, e->status) != 0 ||
                        e->status[0] != 0;
    }
}

/* Fails every exchange of the chain x with rc and the text (why). */
static void fail_chain(px *x, int rc, const char *why) {
    for (; x; x = (px *)x->lj.next) {
        x->rc = rc;
        snprintf(x->err, sizeof x->err, "%s", why);
    }
}

static void lane_run(void *ctx, lane *l, void *state, lane_job *lj) {
    ect_push_producer *p = ctx;
    lane_ctl *lc = state;
    px *x = (px *)lj, *last = x;
    bool resumed = lc && lc->susp == x; /* a chain a borrower gave up: it is whole */
    if (!resumed) x->lj.next = NULL;
    /* What was queued behind rides with it (see the top); with keys a
     * libzmq REQ cannot pipeline, so one at a time. */
    if (!resumed && lc && !lc->orc && !p->keys)
        x->lj.next = lane_take_queued_max(l, CTL_MANY_MAX - 1);
    char why[PX_ERR_MAX];
    if (!lc) {
        fail_chain(x, ECT_ENOMEM, "control client: out of memory");
    } else if (lc->orc) {
        snprintf(why, sizeof why, "control client: %.200s", lc->oerr);
        fail_chain(x, lc->orc, why);
    } else if (atomic_load(&p->closing)) { /* its wait might not end (ect_push_producer_close) */
        lc->susp = NULL;
        fail_chain(x, ECT_ECLOSED, "push producer closed");
    } else {
        write_puts(x);
        if (run_chain(lc, x)) return; /* a borrower's time ran out: its thread goes on */
    }
    while (last->lj.next) last = (px *)last->lj.next;
    lane_job *behind = NULL;
    if (last->rc && pb_unreachable_rc(last->rc)) behind = lane_take_queued(l); /* see the top */
    for (px *b = (px *)behind; b; b = (px *)b->lj.next) {
        b->rc = last->rc;
        b->held = true;
        snprintf(b->err, sizeof b->err, "consumer %.100s unreachable: %.190s", b->key, last->err);
    }
    last->lj.next = behind;
    deliver_and_run(p, x, l);
}

/* Closing: what never ran (or a chain a borrower gave up, lanes_lend_end)
 * goes back to the dispatcher, which frees it. */
static void lane_cancel(void *ctx, lane_job *lj) {
    ect_push_producer *p = ctx;
    px *x = (px *)lj;
    for (px *b = x; b; b = (px *)b->lj.next) {
        b->rc = ECT_ECLOSED;
        b->held = true;
        snprintf(b->err, sizeof b->err, "push producer closed");
    }
    pp_deliver(p, x);
}

/* Work was left to a poll (a quiet submit, or a lane gone idle with its
 * queue left so): a poll waiting for results looks again (lane_ops.lendable). */
static void lendable(void *ctx) {
    ect_push_producer *p = ctx;
    pthread_mutex_lock(&p->mu);
    p->lend_seq++;
    bool wake = p->pollers > 0;
    pthread_mutex_unlock(&p->mu);
    if (wake) pthread_cond_broadcast(&p->results);
}

/* Whether a poll lending its thread may stop: a result is queued, its time
 * is up, or the producer closes. */
static bool lend_over(ect_push_producer *p, uint64_t until_ms) {
    if (until_ms && ect_now_ms() >= until_ms) return true;
    pthread_mutex_lock(&p->mu);
    bool over = p->res_n || p->stop;
    pthread_mutex_unlock(&p->mu);
    return over;
}

static _Thread_local bool tl_lending; /* this thread runs a lent lane (no nesting) */

bool pp_lend(ect_push_producer *p, uint64_t until_ms) {
    if (p->keys || tl_lending) return false; /* a libzmq REQ is not lent (control_client.h) */
    lane_job *j = NULL;
    void *state = NULL;
    lane *l = lanes_lend(p->lanes, &j, &state);
    if (!l) return false;
    lane_ctl *lc = state;
    lane_job *resume = NULL;
    tl_lending = true;
    while (j) {
        if (lc) lc->yield_at = until_ms;
        lane_run(p, l, lc, j);
        if (lc) lc->yield_at = 0;
        bool gave_up = lc && lc->susp, unsent = gave_up && lc->fresh;
        atomic_fetch_add(&p->lent, !unsent);
        if (gave_up) { /* time ran out mid-exchange (or no connection): its thread goes on */
            resume = &lc->susp->lj;
            atomic_fetch_add(&p->yields, !unsent);
            break;
        }
        j = lend_over(p, until_ms) ? NULL : lane_lend_next(l);
    }
    tl_lending = false;
    lanes_lend_end(l, resume);
    return true;
}

uint64_t pp_lent(ect_push_producer *p) { return atomic_load(&p->lent); }

uint64_t pp_lend_yields(ect_push_producer *p) { return atomic_load(&p->yields); }

int pp_lanes_open(ect_push_producer *p) {
    lane_ops o = {lane_start, lane_run, lane_stop, lane_cancel, p, lendable, "ect-push-ctl"};
    return lanes_open(&o, PP_MAX_LANES, PP_LANE_IDLE_MS, &p->lanes);
}

void pp_lane_key(const px *x, char key[PP_LANE_KEY_MAX]) {
    /* complete_batch has a lane of its own per address, so the completes of
     * step n and the reserves of step n+1 are in flight together (see the
     * top); every other op keeps the address's lane. */
    bool side = x->kind == PX_COMPLETE && !x->on_main;
    ect_strcpy_cut(key, PP_LANE_KEY_MAX, side ? "complete|" : "");
    ect_strcat_cut(key, PP_LANE_KEY_MAX, x->key);
}

static pp_route **route_find(ect_push_producer *p, const char *key) {
    pp_route **rr = &p->routes;
    while (*rr && strcmp((*rr)->key, key)) rr = &(*rr)->next;
    return rr;
}

void pp_route_complete_locked(ect_push_producer *p, px *x, const char *runner_lane) {
    if (!p->keys) { /* pipelined with the address's other exchanges (see the top) */
        x->on_main = true;
        return;
    }
    pp_route **rr = route_find(p, x->key), *r = *rr;
    if (!r && (r = calloc(1, sizeof *r))) {
        ect_strcpy_cut(r->key, sizeof r->key, x->key);
        *rr = r;
    }
    if (!r) return; /* no memory: the completes lane, uncounted (no route means none on main) */
    x->on_main = r->main_n > 0 || (!r->side_n && runner_lane && !strcmp(runner_lane, x->key));
    x->routed = true;
    if (x->on_main)
        r->main_n++;
    else
        r->side_n++;
}

void pp_route_settled_locked(ect_push_producer *p, const px *x) {
    if (x->kind != PX_COMPLETE || !x->routed) return;
    pp_route **rr = route_find(p, x->key), *r = *rr;
    if (!r) return;
    if (x->on_main)
        r->main_n--;
    else
        r->side_n--;
    if (r->main_n || r->side_n) return;
    *rr = r->next;
    free(r);
}

void pp_routes_free(ect_push_producer *p) {
    while (p->routes) {
        pp_route *r = p->routes;
        p->routes = r->next;
        free(r);
    }
}

int pp_lane_submit(ect_push_producer *p, px *x, bool quiet_ok) {
    char key[PP_LANE_KEY_MAX];
    pp_lane_key(x, key);
    bool quiet = false;
    int rc = quiet_ok ? lanes_submit_quiet(p->lanes, key, &x->lj, &quiet)
                      : lanes_submit(p->lanes, key, &x->lj);
    if (rc) return ect_set_error(rc, "no control lane for %s: %s", x->key, ect_last_error());
    if (quiet) {
        atomic_store(&p->quiet, true);
        /* the flush_poll that asked for it may be gone already (a round run
         * late by another thread): then nobody would lend, wake it here */
        if (!atomic_load(&p->lenders))
            pp_wake_quiet(p);
        else
            lendable(p);
    }
    return 0;
}

void pp_wake_quiet(ect_push_producer *p) {
    if (atomic_load(&p->quiet) && atomic_exchange(&p->quiet, false)) lanes_wake_quiet(p->lanes);
}

void pp_lanes_close(ect_push_producer *p) {
    lanes_close(p->lanes, false);
    p->lanes = NULL;
}
