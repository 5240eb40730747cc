/*
 * producer_lanes — the push producer's control lanes: one thread per control
 * address ("host:port" of a consumer shard), each with its own control client
 * (a REQ socket belongs to one thread), running that address's exchanges one
 * at a time, in the order the dispatcher queued them.
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
#include "util/util.h"

#define MOD "producer"

typedef struct pp_lane {
    char addr[PUSH_ADDR_MAX + 16];
    ect_push_producer *p;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pp_job *q, *q_tail; /* [mu] queued, not yet started */
    bool stop;          /* [mu] */
    UT_hash_handle hh;
} pp_lane;

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

static void *lane_main(void *arg) {
    pp_lane *l = arg;
    ctl_client *c = NULL;
    int orc = ctl_client_open(l->p->zctx, l->p->o.control_timeout_ms, &c);
    if (!orc) ctl_client_fail_fast(c, true);
    char oerr[160];
    snprintf(oerr, sizeof oerr, "%s", orc ? ect_last_error() : "");
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->stop && !l->q) pthread_cond_wait(&l->cv, &l->mu);
        if (l->stop) break;
        pp_job *j = l->q;
        l->q = j->next;
        if (!l->q) l->q_tail = NULL;
        pthread_mutex_unlock(&l->mu);
        if (orc) {
            j->rc = orc;
            snprintf(j->err, sizeof j->err, "control client: %s", oerr);
        } else {
            run_job(c, j);
        }
        pp_job *behind = NULL;
        pthread_mutex_lock(&l->mu);
        if (j->rc && pp_unreachable_rc(j->rc)) { /* see the top of the file */
            behind = l->q;
            l->q = l->q_tail = NULL;
        }
        pthread_mutex_unlock(&l->mu);
        int rc = j->rc; /* j belongs to the dispatcher once delivered */
        char cause[sizeof j->err];
        memcpy(cause, j->err, sizeof cause);
        deliver(l->p, j);
        while (behind) {
            pp_job *b = behind;
            behind = b->next;
            b->rc = rc;
            b->held = true;
            snprintf(b->err, sizeof b->err, "consumer %.100s unreachable: %.190s", l->addr, cause);
            deliver(l->p, b);
        }
        pthread_mutex_lock(&l->mu);
    }
    /* closing: what never ran goes back to the dispatcher, which frees it */
    pp_job *rest = l->q;
    l->q = l->q_tail = NULL;
    pthread_mutex_unlock(&l->mu);
    while (rest) {
        pp_job *b = rest;
        rest = b->next;
        b->rc = ECT_ECLOSED;
        b->held = true;
        snprintf(b->err, sizeof b->err, "push producer closed");
        deliver(l->p, b);
    }
    ctl_client_close(c);
    return NULL;
}

static pp_lane *lane_for(ect_push_producer *p, const char *host, int port) {
    char addr[PUSH_ADDR_MAX + 16];
    pp_addr_key(host, port, addr, sizeof addr);
    pp_lane *l = NULL;
    HASH_FIND_STR(p->lanes, addr, l);
    if (l) return l;
    if (!(l = calloc(1, sizeof *l))) return NULL;
    snprintf(l->addr, sizeof l->addr, "%s", addr);
    l->p = p;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    if (pthread_create(&l->th, NULL, lane_main, l)) {
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
        return NULL;
    }
    HASH_ADD_STR(p->lanes, addr, l);
    return l;
}

int pp_lane_submit(ect_push_producer *p, pp_job *j) {
    pp_lane *l = lane_for(p, j->host, j->port);
    if (!l)
        return ect_set_error(ECT_ENOMEM, "cannot start a control lane for %s:%d", j->host, j->port);
    j->next = NULL;
    pthread_mutex_lock(&l->mu);
    if (l->q_tail)
        l->q_tail->next = j;
    else
        l->q = j;
    l->q_tail = j;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return 0;
}

void pp_lanes_close(ect_push_producer *p) {
    pp_lane *l, *tmp;
    HASH_ITER(hh, p->lanes, l, tmp) { /* tell them all first: they end in parallel */
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
    }
    HASH_ITER(hh, p->lanes, l, tmp) {
        pthread_join(l->th, NULL);
        HASH_DEL(p->lanes, l);
        pthread_cond_destroy(&l->cv);
        pthread_mutex_destroy(&l->mu);
        free(l);
    }
}
