/*
 * scheduler — the consumer scheduler's view of one producer: which hashes
 * are available, with shape, dtype and nbytes. Owns a SUB socket (producer
 * port + 1, RCVTIMEO 0) and a DEALER (producer port) used only to ask for the
 * inventory (ECTransferRequest) and read the ECTransferReady pages. Every
 * call drains both sockets without blocking, so the engine's scheduler never
 * waits on the network.
 *
 * The inventory is asked at open and again on every later (re)connection of
 * the DEALER (a socket monitor reports them), so a producer that restarts
 * while nothing is published is still asked what it holds. It is asked
 * again each time the SUB's handshake completes (a second monitor): a
 * notification published while the SUB was still connecting is lost
 * (PUB/SUB's slow joiner), and an answer to the first request may predate
 * that item, so the request after the SUB is in covers it. The handshake
 * is not yet the subscription: the PUB applies it a moment later, and the
 * request sent at the handshake may be answered before that, so an item
 * published in between would reach neither the SUB nor the answer. So it is
 * asked once more when the first notification after a handshake arrives
 * (the subscription is then applied: anything published before is in the
 * answer), or request_retry_ms after the handshake when none arrives.
 *
 * Producer restarts: each message carries producer_session_id. The first
 * one seen is adopted; a different one later means the producer at this
 * endpoint restarted: every hash learned so far is forgotten (the new start
 * has an empty pool) and the inventory is asked again. ECTransferReady pages
 * answering an older request id are dropped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include <zmq.h>

#include "pull/pull_internal.h"
#include "util/hostport.h"
#include "util/util.h"
#include "util/zauth.h"

#define MOD "pull"

typedef struct avail {
    char *mm_hash;
    ect_pull_meta meta;
    UT_hash_handle hh;
} avail;

struct ect_pull_scheduler {
    char producer[300];
    int retry_ms;
    void *zctx, *sub, *dealer;
    ect_keyset *keys;                    /* NULL: keys off */
    void *mon;                           /* PAIR reading the DEALER's connection events */
    void *sub_mon;                       /* PAIR reading the SUB's handshake events */
    uint64_t connects;                   /* DEALER connections made so far */
    char session[WIRE_PULL_MAX_STR + 1]; /* "" until the first message */
    char request_id[ECT_ID_LEN + 1];     /* the inventory request in flight */
    uint64_t request_ms;
    uint64_t sub_ms; /* when the SUB's latest handshake was seen */
    bool synced;
    bool sub_fresh; /* a handshake seen, its subscription not yet shown applied */
    avail *table;
    ect_pull_scheduler_stat st;
};

void ect_pull_scheduler_opts_init(ect_pull_scheduler_opts *o) {
    memset(o, 0, sizeof *o);
    o->request_retry_ms = 2000;
}

static void forget_all(ect_pull_scheduler *s) {
    avail *a, *t;
    HASH_ITER(hh, s->table, a, t) {
        HASH_DEL(s->table, a);
        free(a->mm_hash);
        free(a);
    }
}

static void ask_inventory(ect_pull_scheduler *s) {
    ect_random_id(s->request_id);
    char consumer[ECT_ID_LEN + 1];
    ect_random_id(consumer);
    wire_transfer_request q = {
        .request_id = s->request_id, .consumer_session_id = consumer, .n_mm_hashes = 0};
    void *buf;
    size_t len;
    s->request_ms = ect_now_ms();
    s->synced = false;
    if (wire_transfer_request_encode(&q, &buf, &len) != 0) return;
    if (zmq_send(s->dealer, buf, len, ZMQ_DONTWAIT) < 0)
        ECT_LOGD(MOD, "ECTransferRequest not queued: %s", zmq_strerror(zmq_errno()));
    free(buf);
}

/* Adopts session; a different one than before means the producer restarted:
 * forget everything learned from the old start and ask the new one. */
static void see_session(ect_pull_scheduler *s, const char *session) {
    if (strcmp(s->session, session) == 0) return;
    if (s->session[0]) {
        s->st.session_changes++;
        ECT_LOGI(MOD, "producer %s restarted (session %s -> %s): forgetting %u hashes", s->producer,
                 s->session, session, HASH_COUNT(s->table));
        forget_all(s);
        snprintf(s->session, sizeof s->session, "%s", session);
        ask_inventory(s);
        return;
    }
    snprintf(s->session, sizeof s->session, "%s", session);
}

static void add_items(ect_pull_scheduler *s, const wire_pull_item *items, size_t n) {
    for (size_t i = 0; i < n; i++) {
        avail *a = NULL;
        HASH_FIND_STR(s->table, items[i].mm_hash, a);
        if (!a) {
            a = calloc(1, sizeof *a);
            if (!a || !(a->mm_hash = strdup(items[i].mm_hash))) {
                free(a);
                ECT_LOGE_ID(MOD, NULL, items[i].mm_hash, "out of memory: %s not recorded",
                            items[i].mm_hash);
                continue;
            }
            HASH_ADD_KEYPTR(hh, s->table, a->mm_hash, strlen(a->mm_hash), a);
        }
        pull_meta_from_item(&items[i], s->session, &a->meta);
    }
}

static void on_frame(ect_pull_scheduler *s, const void *buf, size_t len, bool from_dealer) {
    wire_pull_msg m;
    if (wire_pull_decode_any(buf, len, &m) != 0) {
        s->st.malformed++;
        ECT_LOGD(MOD, "malformed %s frame dropped: %s", from_dealer ? "DEALER" : "SUB",
                 ect_last_error());
        return;
    }
    if (m.type == WIRE_PULL_NOTIFICATION && !from_dealer) {
        s->st.notifications++;
        see_session(s, m.u.notification.producer_session_id);
        add_items(s, m.u.notification.items, m.u.notification.n_items);
        if (s->sub_fresh) { /* the subscription is applied: ask what came before it */
            s->sub_fresh = false;
            ask_inventory(s);
        }
    } else if (m.type == WIRE_PULL_READY && from_dealer) {
        if (strcmp(m.u.ready.request_id, s->request_id) != 0) {
            ECT_LOGD(MOD, "ECTransferReady for an older request dropped");
        } else {
            s->st.ready_pages++;
            see_session(s, m.u.ready.producer_session_id);
            /* see_session may have asked again (new request id): this page
             * still describes the new start, so it is kept, but only the
             * new request's last page marks the scheduler synced. */
            add_items(s, m.u.ready.items, m.u.ready.n_items);
            if (!m.u.ready.more && strcmp(m.u.ready.request_id, s->request_id) == 0)
                s->synced = true;
        }
    } else {
        s->st.malformed++;
        ECT_LOGD(MOD, "unexpected %s on %s dropped", wire_pull_type_name(m.type),
                 from_dealer ? "DEALER" : "SUB");
    }
    wire_pull_msg_free(&m);
}

static void drain(ect_pull_scheduler *s, void *sock, bool from_dealer) {
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        bool more = zmq_msg_more(&m);
        if (more) {
            /* A message of several frames is not ours: drop all of it. */
            s->st.malformed++;
            while (more) {
                zmq_msg_close(&m);
                zmq_msg_init(&m);
                if (zmq_msg_recv(&m, sock, ZMQ_DONTWAIT) < 0) break;
                more = zmq_msg_more(&m);
            }
        } else {
            on_frame(s, zmq_msg_data(&m), zmq_msg_size(&m), from_dealer);
        }
        zmq_msg_close(&m);
    }
}

/* Drains the SUB's monitor: a SUB now connected may have missed what was
 * published while it connected; the inventory covers it. */
static void drain_sub_monitor(ect_pull_scheduler *s) {
    for (int id; (id = pull_monitor_next(s->sub_mon)) >= 0;) {
        if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
            ECT_LOGD(MOD, "SUB connected to %s: asking its inventory", s->producer);
            ask_inventory(s);
            s->sub_fresh = true;
            s->sub_ms = ect_now_ms();
        }
    }
}

/* Drains the DEALER's monitor: a reconnection means perhaps a new producer. */
static void drain_monitor(ect_pull_scheduler *s) {
    for (int id; (id = pull_monitor_next(s->mon)) >= 0;) {
        if (id == ZMQ_EVENT_CONNECTED && s->connects++ > 0) {
            ECT_LOGD(MOD, "reconnected to %s: asking its inventory", s->producer);
            ask_inventory(s);
        }
    }
}

int ect_pull_scheduler_poll(ect_pull_scheduler *s) {
    if (!s) return ect_set_error(ECT_EINVAL, "pull scheduler: NULL handle");
    if (s->mon) drain_monitor(s);
    if (s->sub_mon) drain_sub_monitor(s);
    drain(s, s->sub, false);
    drain(s, s->dealer, true);
    uint64_t now = ect_now_ms();
    if (s->sub_fresh && now - s->sub_ms >= (uint64_t)s->retry_ms) {
        s->sub_fresh = false; /* nothing published since: the subscription is in by now */
        ask_inventory(s);
    } else if (!s->synced && now - s->request_ms >= (uint64_t)s->retry_ms) {
        ask_inventory(s);
    }
    return 0;
}

int ect_pull_scheduler_has(ect_pull_scheduler *s, const char *mm_hash, ect_pull_meta *meta) {
    if (!s) return ect_set_error(ECT_EINVAL, "pull scheduler: NULL handle");
    if (!mm_hash || !mm_hash[0] || strlen(mm_hash) > WIRE_PULL_MAX_STR)
        return ect_set_error(ECT_EINVAL, "pull scheduler: mm_hash must be 1..%d bytes",
                             WIRE_PULL_MAX_STR);
    ect_pull_scheduler_poll(s);
    avail *a = NULL;
    HASH_FIND_STR(s->table, mm_hash, a);
    if (!a) return 0;
    if (meta) *meta = a->meta;
    return 1;
}

size_t ect_pull_scheduler_foreach(ect_pull_scheduler *s,
                                  void (*fn)(void *, const char *, const ect_pull_meta *),
                                  void *user) {
    if (!s || !fn) return 0;
    size_t n = 0;
    avail *a, *t;
    HASH_ITER(hh, s->table, a, t) {
        fn(user, a->mm_hash, &a->meta);
        n++;
    }
    return n;
}

void ect_pull_scheduler_forget(ect_pull_scheduler *s, const char *mm_hash) {
    if (!s || !mm_hash) return;
    avail *a = NULL;
    HASH_FIND_STR(s->table, mm_hash, a);
    if (!a) return;
    HASH_DEL(s->table, a);
    free(a->mm_hash);
    free(a);
}

void ect_pull_scheduler_stats(ect_pull_scheduler *s, ect_pull_scheduler_stat *st) {
    memset(st, 0, sizeof *st);
    if (!s) return;
    *st = s->st;
    st->available = HASH_COUNT(s->table);
    st->synced = s->synced;
}

/* A PAIR reading sock's monitor events (NULL when none can be made). */
static void *watch(ect_pull_scheduler *s, void *sock, const char *name, int events) {
    char ep[80];
    snprintf(ep, sizeof ep, "inproc://pull-sched-%s-%p", name, (void *)s);
    if (zmq_socket_monitor(sock, ep, events) != 0) return NULL;
    void *mon = zmq_socket(s->zctx, ZMQ_PAIR);
    if (!mon) return NULL;
    int zero = 0;
    zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(mon, ep) == 0) return mon;
    zmq_close(mon);
    zmq_socket_monitor(sock, NULL, 0);
    return NULL;
}

int ect_pull_scheduler_open(const ect_pull_scheduler_opts *o, ect_pull_scheduler **out) {
    if (!out) return ect_set_error(ECT_EINVAL, "pull scheduler: out is NULL");
    *out = NULL;
    if (!o || !o->producer)
        return ect_set_error(ECT_EINVAL, "pull scheduler: producer (HOST:PORT) is required");
    if (o->request_retry_ms < 1)
        return ect_set_error(ECT_EINVAL, "pull scheduler: request_retry_ms must be >= 1");
    /* the producer's PUB listens on port + 1, so its ROUTER port stops at 65534 */
    char host[256];
    int port;
    int rc = ect_hostport_parse("pull scheduler: producer", o->producer, 1, 65534, host,
                                sizeof host, &port);
    if (rc) return rc;
    ect_pull_scheduler *s = calloc(1, sizeof *s);
    if (!s) return ect_set_error(ECT_ENOMEM, "pull scheduler: out of memory");
    snprintf(s->producer, sizeof s->producer, "%s", o->producer);
    s->retry_ms = o->request_retry_ms;
    char ep[320];
    int zero = 0;
    if (o->curve_keys && (rc = ect_keys_load(o->curve_keys, &s->keys))) {
        free(s);
        return rc;
    }
    s->zctx = zmq_ctx_new();
    if (!s->zctx) {
        ect_keys_free(s->keys);
        free(s);
        return ect_set_error(ECT_ENOMEM, "pull scheduler: zmq_ctx_new failed");
    }
    /* One server key for both sockets: the producer's ROUTER and PUB hold the
     * same pair; a DEALER probes it (a SUB would do, but sends nothing either). */
    char srvkey[ECT_KEY_Z85_LEN + 1];
    if (s->keys) {
        ect_tcp_endpoint(host, port, ep, sizeof ep);
        zauth_server_key(s->zctx, s->keys, ZMQ_DEALER, ep, s->retry_ms, srvkey);
    }
    s->sub = zmq_socket(s->zctx, ZMQ_SUB);
    s->dealer = zmq_socket(s->zctx, ZMQ_DEALER);
    if (!s->sub || !s->dealer) {
        rc = ect_set_error(ECT_ENOMEM, "pull scheduler: zmq_socket failed");
        goto fail;
    }
    zmq_setsockopt(s->sub, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->dealer, ZMQ_LINGER, &zero, sizeof zero);
    if (strchr(host, ':')) { /* an IPv6 host: ZMQ needs to be told */
        int one = 1;
        zmq_setsockopt(s->sub, ZMQ_IPV6, &one, sizeof one);
        zmq_setsockopt(s->dealer, ZMQ_IPV6, &one, sizeof one);
    }
    zmq_setsockopt(s->sub, ZMQ_RCVTIMEO, &zero, sizeof zero);
    zmq_setsockopt(s->sub, ZMQ_SUBSCRIBE, "", 0);
    int64_t maxmsg = ECT_PULL_MAX_MSG_BYTES;
    zmq_setsockopt(s->sub, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(s->dealer, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (s->keys && ((rc = zauth_curve_client(s->sub, s->keys, srvkey)) ||
                    (rc = zauth_curve_client(s->dealer, s->keys, srvkey))))
        goto fail;
    s->sub_mon = watch(s, s->sub, "sub", ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    if (!s->sub_mon) ECT_LOGW(MOD, "no SUB monitor: what is published while it connects is lost");
    ect_tcp_endpoint(host, port + 1, ep, sizeof ep);
    if (zmq_connect(s->sub, ep) != 0) {
        rc = ect_set_error(ECT_EINVAL, "pull scheduler: cannot connect SUB to %s: %s", ep,
                           zmq_strerror(zmq_errno()));
        goto fail;
    }
    s->mon = watch(s, s->dealer, "dealer", ZMQ_EVENT_CONNECTED);
    if (!s->mon) ECT_LOGW(MOD, "no DEALER monitor: producer restarts are seen only on messages");
    ect_tcp_endpoint(host, port, ep, sizeof ep);
    if (zmq_connect(s->dealer, ep) != 0) {
        rc = ect_set_error(ECT_EINVAL, "pull scheduler: cannot connect DEALER to %s: %s", ep,
                           zmq_strerror(zmq_errno()));
        goto fail;
    }
    ask_inventory(s);
    *out = s;
    return 0;
fail:
    ect_pull_scheduler_close(s);
    return rc;
}

void ect_pull_scheduler_close(ect_pull_scheduler *s) {
    if (!s) return;
    forget_all(s);
    if (s->sub) {
        if (s->sub_mon) zmq_socket_monitor(s->sub, NULL, 0);
        zmq_close(s->sub);
    }
    if (s->sub_mon) zmq_close(s->sub_mon);
    if (s->dealer) {
        zmq_socket_monitor(s->dealer, NULL, 0);
        zmq_close(s->dealer);
    }
    if (s->mon) zmq_close(s->mon);
    if (s->zctx) zmq_ctx_term(s->zctx);
    ect_keys_free(s->keys);
    free(s);
}
