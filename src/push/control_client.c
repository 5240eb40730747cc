/*
 * control_client — REQ connections to consumer shards, one per address,
 * owned by one thread. The workload is a handful of addresses (the shards of
 * the consumers this thread talks to), so the table is a small hash keyed by
 * "host:port". A failed exchange leaves a REQ socket in a state where the
 * next send would fail (strict alternation), so every failure closes the
 * connection; the next call connects afresh.
 *
 * Two ways to speak to an address: without CURVE keys, a control_link (ZMTP
 * spoken by this thread on its own TCP socket: no libzmq I/O thread between
 * the caller and the kernel, which is most of a round trip's cost, issue 13);
 * with keys, a libzmq REQ socket (CurveZMQ and ZAP stay libzmq's).
 */
#include "push/control_client.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Out of memory inside uthash is reported, not fatal (conn_get checks). */
static _Thread_local int hash_oom; /* per thread: each client belongs to one */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (hash_oom = 1)
#include <uthash.h>
#include <zmq.h>

#include "push/control_link.h"
#include "util/util.h"
#include "util/zauth.h"

#define MOD "ctl"
#define CTL_ADDR_MAX 300
/* The largest reply: ZMQ_MAXMSGSIZE of the REQ, twice the largest control frame. */
#define CTL_MAX_MSG (2 * (int64_t)WIRE_CTL_MAX_FRAME)

typedef struct ctl_conn {
    char addr[CTL_ADDR_MAX]; /* "host:port" */
    ctl_link *link;          /* without keys: our own ZMTP REQ, or NULL */
    void *sock;              /* with keys: a libzmq REQ, or NULL */
    void *mon;               /* PAIR reading sock's monitor events, or NULL */
    bool up;                 /* TCP connected, no disconnect seen since */
    bool lost;               /* was up, then disconnected */
    int *peers;              /* cached peers result, or NULL */
    size_t npeers;
    UT_hash_handle hh;
} ctl_conn;

struct ctl_client {
    void *zctx;
    int timeout_ms;
    bool fail_fast;         /* watch each socket's monitor (ctl_client_fail_fast) */
    const ect_keyset *keys; /* CurveZMQ client keys, or NULL */
    void *watch;            /* without keys: a bare PAIR of zctx that ends our waits when
                               zctx shuts down, as it ends a libzmq socket's; or NULL */
    int watch_fd;           /* its ZMQ_FD */
    ctl_conn *conns;
};

int ctl_timeout_ms(double seconds) {
    if (!(seconds > 0)) return 1;
    double ms = ceil(seconds * 1000.0);
    if (ms > 2147483647.0) return 2147483647;
    return ms < 1 ? 1 : (int)ms;
}

int ctl_client_open(void *zctx, int timeout_ms, ctl_client **out) {
    if (out) *out = NULL;
    if (!out || !zctx) return ect_set_error(ECT_EINVAL, "ctl_client_open: zctx and out required");
    if (timeout_ms < 1)
        return ect_set_error(ECT_EINVAL, "control timeout: %d ms, must be at least 1", timeout_ms);
    ctl_client *c = calloc(1, sizeof *c);
    if (!c) return ect_set_error(ECT_ENOMEM, "control client: out of memory");
    c->zctx = zctx;
    c->timeout_ms = timeout_ms;
    *out = c;
    return 0;
}

void ctl_client_set_timeout(ctl_client *c, int timeout_ms) {
    if (c) c->timeout_ms = timeout_ms < 1 ? 1 : timeout_ms;
}

static int fmt_addr(const char *host, int port, char *buf) {
    if (!host || !*host || port < 1 || port > 65535)
        return ect_set_error(ECT_EINVAL, "control address: bad host or port %d", port);
    int n = snprintf(buf, CTL_ADDR_MAX, "%s:%d", host, port);
    if (n < 0 || n >= CTL_ADDR_MAX)
        return ect_set_error(ECT_EINVAL, "control address: host too long");
    return 0;
}

static ctl_conn *conn_get(ctl_client *c, const char *addr, bool create) {
    ctl_conn *k = NULL;
    HASH_FIND_STR(c->conns, addr, k);
    if (k || !create) return k;
    k = calloc(1, sizeof *k);
    if (!k) return NULL;
    snprintf(k->addr, sizeof k->addr, "%s", addr);
    hash_oom = 0;
    HASH_ADD_STR(c->conns, addr, k);
    if (hash_oom) {
        free(k);
        return NULL;
    }
    return k;
}

/* The monitor is stopped before its reader closes: an event libzmq's I/O
 * thread sends to a monitor whose reader is gone blocks it for good (a
 * PAIR with no peer) while it holds the monitor's lock, which stopping the
 * monitor then waits for (a hang seen in test_zauth under load). */
static void conn_drop_socket(ctl_conn *k) {
    ctl_link_close(k->link);
    k->link = NULL;
    if (k->sock) zmq_socket_monitor(k->sock, NULL, 0);
    if (k->mon) zmq_close(k->mon);
    if (k->sock) zmq_close(k->sock);
    k->sock = k->mon = NULL;
    k->up = k->lost = false;
}

/* Why the monitor: ZMQ REQ never reports a refused connect or a peer that went
 * away; it queues the request and waits for a reconnect that may never come,
 * so a dead consumer would cost one full control timeout per exchange. The
 * socket's monitor tells us: CONNECT_RETRIED while not connected means the
 * connect failed (refused, unreachable), DISCONNECTED means the peer closed
 * the connection, and with it any request in flight is lost. A peer that is
 * connected but slow produces no event and is waited for up to the timeout.
 *
 * Reads every pending monitor event; returns the "gone" event seen
 * (ZMQ_EVENT_DISCONNECTED, which a reconnect attempt
 * may follow, else ZMQ_EVENT_CONNECT_RETRIED while not up), or 0. */
static int conn_read_events(ctl_conn *k) {
    int gone = 0;
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, k->mon, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return gone;
        }
        uint16_t ev = 0;
        bool first = zmq_msg_size(&m) >= 6;
        if (first) memcpy(&ev, zmq_msg_data(&m), sizeof ev);
        bool more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) { /* the endpoint frame */
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, k->mon, ZMQ_DONTWAIT) < 0)
                more = false;
            else
                more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (!first) continue;
        if (ev == ZMQ_EVENT_CONNECTED) {
            k->up = true;
        } else if (ev == ZMQ_EVENT_DISCONNECTED) {
            k->lost = k->lost || k->up;
            k->up = false;
            /* a refused key is the cause of the disconnect that follows it */
            if (gone != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) gone = ZMQ_EVENT_DISCONNECTED;
        } else if (ev == ZMQ_EVENT_CONNECT_RETRIED && !k->up) {
            if (!gone) gone = ZMQ_EVENT_CONNECT_RETRIED;
        } else if (ev == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
            gone = ZMQ_EVENT_HANDSHAKE_FAILED_AUTH; /* the server refused our key */
        }
    }
}

/* Attaches a monitor to the fresh socket s (before it connects, so no event is
 * missed). Without one the socket still works, with plain timeouts. */
static void conn_monitor(ctl_client *c, ctl_conn *k, void *s, const char *host, int port) {
    int zero = 0;
    /* An idle socket to a dead peer keeps reconnecting; back off so its
     * unread monitor events stay few (a call drops such a socket anyway). */
    int ivl_max = 10000;
    zmq_setsockopt(s, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max);
    static _Atomic unsigned mon_seq;
    char mep[96];
    snprintf(mep, sizeof mep, "inproc://ect-ctl-mon-%p-%u", (void *)s, mon_seq++);
    void *m = NULL;
    if (zmq_socket_monitor(s, mep,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) == 0 &&
        (m = zmq_socket(c->zctx, ZMQ_PAIR)) != NULL) {
        /* unbounded: the library's monitor must never block on a full pipe */
        zmq_setsockopt(m, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(m, ZMQ_RCVHWM, &zero, sizeof zero);
        if (zmq_connect(m, mep) != 0) {
            zmq_close(m);
            m = NULL;
        }
    }
    if (!m) { /* degrade to plain timeouts rather than fail the call */
        ECT_LOGW(MOD, "no socket monitor for %s:%d: %s; a dead peer costs the full timeout", host,
                 port, zmq_strerror(errno));
        zmq_socket_monitor(s, NULL, 0);
    }
    k->mon = m;
}

static int conn_socket(ctl_client *c, ctl_conn *k, const char *host, int port) {
    if (k->sock) return 0;
    void *s = zmq_socket(c->zctx, ZMQ_REQ);
    if (!s) return ect_set_error(ECT_EIO, "control client: zmq_socket: %s", zmq_strerror(errno));
    int zero = 0, one = 1;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &c->timeout_ms, sizeof c->timeout_ms);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &c->timeout_ms, sizeof c->timeout_ms);
    /* A reply is at most one control frame; more is not a consumer of ours. */
    int64_t maxmsg = CTL_MAX_MSG;
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    k->mon = NULL;
    k->up = k->lost = false;
    if (c->fail_fast) conn_monitor(c, k, s, host, port);
    char ep[CTL_ADDR_MAX + 16];
    bool v6 = strchr(host, ':') != NULL && host[0] != '[';
    snprintf(ep, sizeof ep, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
    int rc = zauth_client(c->zctx, s, c->keys, ZMQ_REQ, ep, c->timeout_ms);
    if (rc) {
        k->sock = s;
        conn_drop_socket(k);
        return rc;
    }
    if (zmq_connect(s, ep) != 0) {
        int e = errno;
        k->sock = s;
        conn_drop_socket(k);
        return ect_set_error(ECT_EINVAL, "control client: connect %s: %s", ep, zmq_strerror(e));
    }
    k->sock = s;
    return 0;
}

/* Waits up to the timeout for the reply to the request just sent, watching
 * the monitor: a refused connect or a closed connection ends the wait at once.
 * On success the reply is in *msg. */
static int wait_reply(ctl_client *c, ctl_conn *k, const char *addr, wire_ctl_op op,
                      zmq_msg_t *msg) {
    uint64_t deadline = ect_now_ms() + (uint64_t)c->timeout_ms;
    for (;;) {
        uint64_t now = ect_now_ms();
        long left = now >= deadline ? 0 : (long)(deadline - now);
        zmq_pollitem_t items[2] = {{.socket = k->sock, .events = ZMQ_POLLIN},
                                   {.socket = k->mon, .events = ZMQ_POLLIN}};
        int pr = zmq_poll(items, k->mon ? 2 : 1, left);
        if (pr < 0 && errno != EINTR)
            return ect_set_error(ECT_EIO, "control %s: poll: %s", addr, zmq_strerror(errno));
        if (pr > 0 && (items[0].revents & ZMQ_POLLIN)) {
            if (zmq_msg_recv(msg, k->sock, ZMQ_DONTWAIT) >= 0) return 0;
            if (errno != EAGAIN)
                return ect_set_error(ECT_EIO, "control %s: receive: %s", addr, zmq_strerror(errno));
        }
        if (pr > 0 && k->mon && (items[1].revents & ZMQ_POLLIN)) {
            int gone = conn_read_events(k);
            if (gone == ZMQ_EVENT_CONNECT_RETRIED)
                return ect_set_error(ECT_ECONNREFUSED,
                                     "control %s: connection refused (no one listens there) "
                                     "sending %s",
                                     addr, wire_ctl_op_name(op));
            if (gone == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
                return ect_set_error(ECT_EACCES,
                                     "control %s: the server refused our CurveZMQ key "
                                     "(is our self.public in its accept/?) sending %s",
                                     addr, wire_ctl_op_name(op));
            if (gone == ZMQ_EVENT_DISCONNECTED)
                return ect_set_error(ECT_ECONNREFUSED,
                                     "control %s: the peer closed the connection before "
                                     "replying to %s",
                                     addr, wire_ctl_op_name(op));
        }
        if (ect_now_ms() >= deadline)
            return ect_set_error(ECT_ETIMEDOUT, "control %s: no reply to %s within %d ms", addr,
                                 wire_ctl_op_name(op), c->timeout_ms);
    }
}

/* The exchange on a libzmq REQ socket (keys set): the reply into *msg. */
static int zmq_exchange(ctl_client *c, ctl_conn *k, const char *host, int port, const char *addr,
                        wire_ctl_op op, const char *frame, size_t flen, zmq_msg_t *msg) {
    /* A socket whose peer went away while idle would queue the request for a
     * reconnect: start afresh instead, so a refused connect shows at once. */
    if (k->sock && k->mon) {
        conn_read_events(k);
        if (k->lost && !k->up) conn_drop_socket(k);
    }
    int rc = conn_socket(c, k, host, port);
    if (rc) return rc;
    if (zmq_send(k->sock, frame, flen, 0) < 0) {
        int e = errno;
        if (e == EAGAIN)
            return ect_set_error(ECT_ETIMEDOUT, "control %s: %s send timed out after %d ms", addr,
                                 wire_ctl_op_name(op), c->timeout_ms);
        return ect_set_error(ECT_EIO, "control %s: send: %s", addr, zmq_strerror(e));
    }
    return wait_reply(c, k, addr, op, msg);
}

/* The socket whose context's shutdown ends our own connections' waits (the
 * callers stop their threads with zmq_ctx_shutdown). It never connects, so
 * its ZMQ_FD only wakes for the context's stop command. */
static int watch_socket(ctl_client *c) {
    if (c->watch) return 0;
    void *w = zmq_socket(c->zctx, ZMQ_PAIR);
    if (!w) return ect_set_error(ECT_EIO, "control client: zmq_socket: %s", zmq_strerror(errno));
    int zero = 0, fd = -1;
    size_t sz = sizeof fd;
    zmq_setsockopt(w, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_getsockopt(w, ZMQ_FD, &fd, &sz) != 0) {
        int e = errno;
        zmq_close(w);
        return ect_set_error(ECT_EIO, "control client: ZMQ_FD: %s", zmq_strerror(e));
    }
    c->watch = w;
    c->watch_fd = fd;
    return 0;
}

/* The exchange on our own ZMTP connection (no keys): the reply at *body. */
static int link_call(ctl_client *c, ctl_conn *k, const char *host, int port, const char *addr,
                     wire_ctl_op op, const char *frame, size_t flen, const uint8_t **body,
                     size_t *blen) {
    int rc = watch_socket(c);
    if (rc) return rc;
    ctl_link_call_opts o = {.watch = c->watch,
                            .watch_fd = c->watch_fd,
                            .host = host,
                            .port = port,
                            .addr = addr,
                            .op_name = wire_ctl_op_name(op),
                            .timeout_ms = c->timeout_ms,
                            .fail_fast = c->fail_fast,
                            .max_msg = CTL_MAX_MSG};
    return ctl_link_call(&k->link, &o, frame, flen, body, blen);
}

/* Decodes the reply to req (body, blen from host's addr) into *out. */
static int decode_reply(const char *addr, const wire_ctl_request *req, const uint8_t *body,
                        size_t blen, wire_ctl_reply *out) {
    size_t expect = SIZE_MAX;
    if (req->op == WIRE_OP_RESERVE_BATCH) expect = req->u.reserve_batch.n;
    if (req->op == WIRE_OP_COMPLETE_BATCH) expect = req->u.complete_batch.n;
    if (req->op == WIRE_OP_ECT_READY) expect = req->u.ready.max ? req->u.ready.max : SIZE_MAX;
    int rc = wire_ctl_decode_reply(req->op, expect, body, blen, out);
    if (!rc) return 0;
    char detail[512];
    snprintf(detail, sizeof detail, "%s", ect_last_error());
    return ect_set_error(rc, "control %s: bad reply to %s: %s", addr, wire_ctl_op_name(req->op),
                         detail);
}

/* ctl_call_ok's check of a decoded reply: {"ok": false} is ECT_EPROTO. */
static int check_ok(const char *host, int port, const wire_ctl_request *req, wire_ctl_reply *out) {
    if (out->ok) return 0;
    int rc = ect_set_error(ECT_EPROTO, "%s:%d refused %s: %s", host, port,
                           wire_ctl_op_name(req->op), out->error ? out->error : "(no text)");
    wire_ctl_reply_clear(out);
    return rc;
}

int ctl_call(ctl_client *c, const char *host, int port, const wire_ctl_request *req,
             wire_ctl_reply *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!c || !req || !out) return ect_set_error(ECT_EINVAL, "ctl_call: NULL argument");
    char addr[CTL_ADDR_MAX];
    int rc = fmt_addr(host, port, addr);
    if (rc) return rc;
    char *frame = NULL;
    rc = wire_ctl_encode_request(req, &frame);
    if (rc) return rc;
    ctl_conn *k = conn_get(c, addr, true);
    if (!k) {
        free(frame);
        return ect_set_error(ECT_ENOMEM, "control client: out of memory");
    }
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    const uint8_t *body = NULL;
    size_t blen = 0;
    if (c->keys) {
        rc = zmq_exchange(c, k, host, port, addr, req->op, frame, strlen(frame), &msg);
        body = zmq_msg_data(&msg);
        blen = zmq_msg_size(&msg);
    } else {
        rc = link_call(c, k, host, port, addr, req->op, frame, strlen(frame), &body, &blen);
    }
    free(frame);
    if (rc) {
        zmq_msg_close(&msg);
        conn_drop_socket(k);
        return rc;
    }
    rc = decode_reply(addr, req, body, blen, out);
    zmq_msg_close(&msg);
    if (rc) conn_drop_socket(k);
    return rc;
}

/* Records exchange e's failure: rc and the last error's text. */
static int fail_exchange(ctl_exchange *e, int rc) {
    e->rc = rc;
    if (e->err && e->err_cap) snprintf(e->err, e->err_cap, "%s", ect_last_error());
    return rc;
}

typedef struct many_ctx {
    const char *host, *addr;
    int port;
    ctl_exchange *x;
    bool bad; /* the reply on_reply refused is x[ndone]'s, already failed */
} many_ctx;

static int many_reply(void *ctx, size_t i, const uint8_t *body, size_t len) {
    many_ctx *m = ctx;
    ctl_exchange *e = &m->x[i];
    int rc = decode_reply(m->addr, e->req, body, len, e->rep);
    if (rc) {
        m->bad = true;
        return fail_exchange(e, rc);
    }
    if (e->want_ok && (rc = check_ok(m->host, m->port, e->req, e->rep))) fail_exchange(e, rc);
    return 0;
}

/* The exchanges x[0..n) pipelined on our own connection (see the header). */
static int link_call_many(ctl_client *c, ctl_conn *k, const char *host, int port,
                          const char *addr, ctl_exchange *x, size_t n, uint64_t yield_at,
                          bool resume) {
    ctl_link_req reqs[CTL_MANY_MAX] = {{0}};
    char *frames[CTL_MANY_MAX] = {0};
    size_t ndone = 0, nf = 0;
    int rc = watch_socket(c);
    for (; !rc && nf < n; nf++) {
        rc = wire_ctl_encode_request(x[nf].req, &frames[nf]);
        reqs[nf] = (ctl_link_req){frames[nf], rc ? 0 : strlen(frames[nf]),
                                  wire_ctl_op_name(x[nf].req->op)};
    }
    many_ctx m = {host, addr, port, x, false};
    if (!rc) {
        ctl_link_call_opts o = {.watch = c->watch,
                                .watch_fd = c->watch_fd,
                                .host = host,
                                .port = port,
                                .addr = addr,
                                .op_name = reqs[0].op_name,
                                .timeout_ms = c->timeout_ms,
                                .fail_fast = c->fail_fast,
                                .max_msg = CTL_MAX_MSG,
                                .yield_at = yield_at,
                                .resume = resume};
        rc = ctl_link_call_many(&k->link, &o, reqs, n, many_reply, &m, &ndone);
    }
    for (size_t i = 0; i < nf; i++) free(frames[i]);
    if (!rc) return 0;
    if (rc == CTL_LINK_YIELDED) return CTL_YIELDED; /* the link keeps the call */
    if (rc == CTL_LINK_YIELDED_UNSENT) return CTL_YIELDED_UNSENT;
    conn_drop_socket(k);
    for (size_t i = ndone + (m.bad ? 1 : 0); i < n; i++) fail_exchange(&x[i], rc);
    return rc;
}

int ctl_call_many(ctl_client *c, const char *host, int port, ctl_exchange *x, size_t n) {
    return ctl_call_many_lent(c, host, port, x, n, 0, false);
}

int ctl_call_many_lent(ctl_client *c, const char *host, int port, ctl_exchange *x, size_t n,
                       uint64_t yield_at, bool resume) {
    if (!c || !x || !n || n > CTL_MANY_MAX)
        return ect_set_error(ECT_EINVAL, "ctl_call_many: NULL argument or n not 1..%d",
                             CTL_MANY_MAX);
    for (size_t i = 0; i < n && !resume; i++) { /* a resumed call keeps the replies in */
        x[i].rc = 0;
        memset(x[i].rep, 0, sizeof *x[i].rep);
    }
    char addr[CTL_ADDR_MAX];
    int rc = fmt_addr(host, port, addr);
    ctl_conn *k = rc ? NULL : conn_get(c, addr, true);
    if (!rc && !k) rc = ect_set_error(ECT_ENOMEM, "control client: out of memory");
    for (size_t i = 0; rc && i < n; i++) fail_exchange(&x[i], rc); /* none went out */
    if (!rc && !c->keys) {
        int lr = link_call_many(c, k, host, port, addr, x, n, yield_at, resume);
        if (lr == CTL_YIELDED || lr == CTL_YIELDED_UNSENT) return lr;
    }
    for (size_t i = 0; !rc && c->keys && i < n; i++) { /* a libzmq REQ: one at a time */
        int r = x[i].want_ok ? ctl_call_ok(c, host, port, x[i].req, x[i].rep)
                             : ctl_call(c, host, port, x[i].req, x[i].rep);
        if (r) fail_exchange(&x[i], r);
    }
    for (size_t i = 0; i < n; i++)
        if (x[i].rc) return x[i].rc;
    return 0;
}

void ctl_client_fail_fast(ctl_client *c, bool on) {
    if (c) c->fail_fast = on;
}

void ctl_client_set_keys(ctl_client *c, const ect_keyset *ks) {
    if (c) c->keys = ks;
}

int ctl_call_ok(ctl_client *c, const char *host, int port, const wire_ctl_request *req,
                wire_ctl_reply *out) {
    int rc = ctl_call(c, host, port, req, out);
    return rc ? rc : check_ok(host, port, req, out);
}

int ctl_peers(ctl_client *c, const char *host, int port, int *ports, size_t cap, size_t *n) {
    if (n) *n = 0;
    if (!c || (!ports && cap) || !n) return ect_set_error(ECT_EINVAL, "ctl_peers: NULL argument");
    char addr[CTL_ADDR_MAX];
    int rc = fmt_addr(host, port, addr);
    if (rc) return rc;
    ctl_conn *k = conn_get(c, addr, false);
    if (!k || !k->peers) {
        wire_ctl_request req = {.op = WIRE_OP_PEERS};
        wire_ctl_reply rep;
        rc = ctl_call_ok(c, host, port, &req, &rep);
        if (rc) return rc;
        k = conn_get(c, addr, true);
        int *p = k ? malloc(rep.u.peers.n * sizeof *p) : NULL;
        if (!p) {
            wire_ctl_reply_clear(&rep);
            return ect_set_error(ECT_ENOMEM, "control client: out of memory");
        }
        for (size_t i = 0; i < rep.u.peers.n; i++) p[i] = rep.u.peers.ports[i];
        free(k->peers);
        k->peers = p;
        k->npeers = rep.u.peers.n;
        wire_ctl_reply_clear(&rep);
    }
    *n = k->npeers;
    if (k->npeers > cap)
        return ect_set_error(ECT_ERANGE, "%s has %zu shards, room for %zu", addr, k->npeers, cap);
    memcpy(ports, k->peers, k->npeers * sizeof *ports);
    return 0;
}

void ctl_forget_peers(ctl_client *c, const char *host, int port) {
    char addr[CTL_ADDR_MAX];
    if (!c || fmt_addr(host, port, addr)) return;
    ctl_conn *k = conn_get(c, addr, false);
    if (!k) return;
    free(k->peers);
    k->peers = NULL;
    k->npeers = 0;
}

int ctl_event_port(ctl_client *c, const char *host, int port, int *event_port) {
    char secret[WIRE_SECRET_MAX + 1];
    return ctl_event_port_secret(c, host, port, event_port, secret);
}

int ctl_event_port_secret(ctl_client *c, const char *host, int port, int *event_port,
                          char *secret) {
    if (event_port) *event_port = 0;
    if (secret) secret[0] = '\0';
    if (!event_port || !secret) return ect_set_error(ECT_EINVAL, "ctl_event_port: NULL argument");
    wire_ctl_request req = {.op = WIRE_OP_EVENT_PORT};
    wire_ctl_reply rep;
    int rc = ctl_call_ok(c, host, port, &req, &rep);
    if (rc) return rc;
    *event_port = rep.u.event_port;
    memcpy(secret, rep.event_secret, sizeof rep.event_secret);
    wire_ctl_reply_clear(&rep);
    return 0;
}

void ctl_client_close(ctl_client *c) {
    if (!c) return;
    ctl_conn *k, *tmp;
    HASH_ITER(hh, c->conns, k, tmp) {
        HASH_DEL(c->conns, k);
        conn_drop_socket(k);
        free(k->peers);
        free(k);
    }
    if (c->watch) zmq_close(c->watch);
    free(c);
}
