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
 * work queued for the same address. The dispatcher never waits for a lane: a
 * finished job goes to p->done (under mu) and wakes the dispatcher, which
 * applies the outcome to the push_ table.
 *
 * A job that failed for want of the peer (timeout, refused, connection
 * closed) also fails the jobs queued behind it on that lane at once, with the
 * same cause: they were queued before anyone knew, and each would otherwise
 * wait out its own timeout. From then on the dispatcher's down table keeps
 * new work away from the address until its backoff runs out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "push/producer.h"
#include "util/hostport.h"
#include "util/lanes.h"
#include "util/util.h"

#define MOD "producer"

bool pp_unreachable_rc(int rc) {
    return rc == ECT_ETIMEDOUT || rc == ECT_ECONNREFUSED || rc == ECT_EIO;
}

void pp_addr_key(const char *host, int port, char *buf, size_t cap) {
    ect_hostport_format(host, port, buf, cap);
}

void pp_job_free(pp_job *j) {
    if (!j) return;
    wire_ctl_reply_clear(&j->rep);
    if (j->req.op == WIRE_OP_RESERVE_BATCH) free(j->req.u.reserve_batch.items);
    if (j->req.op == WIRE_OP_COMPLETE_BATCH) free(j->req.u.complete_batch.items);
    free(j->acts);
    free(j);
}

static void run_job(ctl_client *c, pp_job *j) {
    if (j->port <= 0) {
        j->rc = ECT_ENOTFOUND;
        snprintf(j->err, sizeof j->err, "shard address unknown");
        return;
    }
    if (j->kind == PJ_PEERS) { /* a real exchange every time: it is the probe */
        wire_ctl_request req = {.op = WIRE_OP_PEERS};
        j->rc = ctl_call_ok(c, j->host, j->port, &req, &j->rep);
        if (!j->rc && j->rep.u.peers.n > PUSH_MAX_SHARDS)
            j->rc = ect_set_error(ECT_ERANGE, "%s:%d reports %zu shards, at most %d supported",
                                  j->host, j->port, j->rep.u.peers.n, PUSH_MAX_SHARDS);
        if (!j->rc) {
            j->nports = j->rep.u.peers.n;
            for (size_t i = 0; i < j->nports; i++) j->ports[i] = j->rep.u.peers.ports[i];
            snprintf(j->transport, sizeof j->transport, "%s", j->rep.u.peers.transport);
        }
    } else {
        j->rc = j->want_ok ? ctl_call_ok(c, j->host, j->port, &j->req, &j->rep)
                           : ctl_call(c, j->host, j->port, &j->req, &j->rep);
    }
    if (j->rc) snprintf(j->err, sizeof j->err, "%.300s", ect_last_error());
}

static void deliver(ect_push_producer *p, pp_job *j) {
    j->next = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->done_tail)
        p->done_tail->next = j;
    else
        p->done = j;
    p->done_tail = j;
    pthread_cond_signal(&p->wake);
    pthread_mutex_unlock(&p->mu);
}

/* A lane's own control client (a REQ socket belongs to one thread). */
typedef struct lane_ctl {
    ctl_client *c;
    int orc;        /* opening it failed: every job fails with this */
    char oerr[160]; /* and this text */
} lane_ctl;

static void *lane_start(void *ctx, const char *key) {
    ect_push_producer *p = ctx;
    (void)key;
    lane_ctl *lc = calloc(1, sizeof *lc);
    if (!lc) return NULL;
    lc->orc = ctl_client_open(p->zctx, p->o.control_timeout_ms, &lc->c);
    if (!lc->orc) ctl_client_fail_fast(lc->c, true);
    snprintf(lc->oerr, sizeof lc->oerr, "%s", lc->orc ? ect_last_error() : "");
    return lc;
}

static void lane_stop(void *ctx, void *state) {
    (void)ctx;
    lane_ctl *lc = state;
    if (lc) ctl_client_close(lc->c);
    free(lc);
}

static void lane_run(void *ctx, lane *l, void *state, lane_job *lj) {
    ect_push_producer *p = ctx;
    lane_ctl *lc = state;
    pp_job *j = (pp_job *)lj;
    if (!lc) {
        j->rc = ECT_ENOMEM;
        snprintf(j->err, sizeof j->err, "control client: out of memory");
    } else if (lc->orc) {
        j->rc = lc->orc;
        snprintf(j->err, sizeof j->err, "control client: %s", lc->oerr);
    } else {
        run_job(lc->c, j);
    }
    lane_job *behind = NULL;
    if (j->rc && pp_unreachable_rc(j->rc)) behind = lane_take_queued(l); /* see the top */
    int rc = j->rc; /* j belongs to the dispatcher once delivered */
    char cause[sizeof j->err];
    memcpy(cause, j->err, sizeof cause);
    deliver(p, j);
    while (behind) {
        pp_job *b = (pp_job *)behind;
        behind = behind->next;
        b->rc = rc;
        b->held = true;
        snprintf(b->err, sizeof b->err, "consumer %.100s unreachable: %.190s", lane_key(l), cause);
        deliver(p, b);
    }
}

/* Closing: what never ran goes back to the dispatcher, which frees it. */
static void lane_cancel(void *ctx, lane_job *lj) {
    pp_job *b = (pp_job *)lj;
    b->rc = ECT_ECLOSED;
    b->held = true;
    snprintf(b->err, sizeof b->err, "push producer closed");
    deliver(ctx, b);
}

int pp_lanes_open(ect_push_producer *p) {
    lane_ops o = {lane_start, lane_run, lane_stop, lane_cancel, p};
    return lanes_open(&o, PP_MAX_LANES, PP_LANE_IDLE_MS, &p->lanes);
}

int pp_lane_submit(ect_push_producer *p, pp_job *j) {
    char addr[PUSH_ADDR_MAX + 16];
    pp_addr_key(j->host, j->port, addr, sizeof addr);
    int rc = lanes_submit(p->lanes, addr, &j->lj);
    if (rc)
        return ect_set_error(rc, "cannot start a control lane for %s: %s", addr, ect_last_error());
    return 0;
}

void pp_lanes_close(ect_push_producer *p) {
    lanes_close(p->lanes, false);
    p->lanes = NULL;
}
