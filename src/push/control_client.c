/*
 * control_client — REQ sockets to consumer shards, one per address, owned by
 * one thread. The workload is a handful of addresses (the shards of the
 * consumers this thread talks to), so the table is a small hash keyed by
 * "host:port". A failed exchange leaves a REQ socket in a state where the
 * next send would fail (strict alternation), so every failure closes the
 * socket; the next call connects afresh.
 */
#include "push/control_client.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Out of memory inside uthash is reported, not fatal (conn_get checks). */
static _Thread_local int hash_oom; /* per thread: each client belongs to one */
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(obj) (hash_oom = 1)
#include <uthash.h>
#include <zmq.h>

#include "util/util.h"

#define MOD "ctl"
#define CTL_ADDR_MAX 300

typedef struct ctl_conn {
    char addr[CTL_ADDR_MAX]; /* "host:port" */
    void *sock;              /* REQ or NULL */
    int *peers;              /* cached peers result, or NULL */
    size_t npeers;
    UT_hash_handle hh;
} ctl_conn;

struct ctl_client {
    void *zctx;
    int timeout_ms;
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

static void conn_drop_socket(ctl_conn *k) {
    if (k->sock) zmq_close(k->sock);
    k->sock = NULL;
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
    char ep[CTL_ADDR_MAX + 16];
    bool v6 = strchr(host, ':') != NULL && host[0] != '[';
    snprintf(ep, sizeof ep, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", host, port);
    if (zmq_connect(s, ep) != 0) {
        int e = errno;
        zmq_close(s);
        return ect_set_error(ECT_EINVAL, "control client: connect %s: %s", ep, zmq_strerror(e));
    }
    k->sock = s;
    return 0;
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
    rc = conn_socket(c, k, host, port);
    if (rc) {
        free(frame);
        return rc;
    }
    size_t flen = strlen(frame);
    if (zmq_send(k->sock, frame, flen, 0) < 0) {
        int e = errno;
        free(frame);
        conn_drop_socket(k);
        if (e == EAGAIN)
            return ect_set_error(ECT_ETIMEDOUT, "control %s: %s send timed out after %d ms", addr,
                                 wire_ctl_op_name(req->op), c->timeout_ms);
        return ect_set_error(ECT_EIO, "control %s: send: %s", addr, zmq_strerror(e));
    }
    free(frame);
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, k->sock, 0) < 0) {
        int e = errno;
        zmq_msg_close(&msg);
        conn_drop_socket(k);
        if (e == EAGAIN)
            return ect_set_error(ECT_ETIMEDOUT, "control %s: no reply to %s within %d ms", addr,
                                 wire_ctl_op_name(req->op), c->timeout_ms);
        return ect_set_error(ECT_EIO, "control %s: receive: %s", addr, zmq_strerror(e));
    }
    size_t expect = SIZE_MAX;
    if (req->op == WIRE_OP_RESERVE_BATCH) expect = req->u.reserve_batch.n;
    if (req->op == WIRE_OP_COMPLETE_BATCH) expect = req->u.complete_batch.n;
    rc = wire_ctl_decode_reply(req->op, expect, zmq_msg_data(&msg), zmq_msg_size(&msg), out);
    zmq_msg_close(&msg);
    if (rc) {
        conn_drop_socket(k);
        char detail[512];
        snprintf(detail, sizeof detail, "%s", ect_last_error());
        return ect_set_error(rc, "control %s: bad reply to %s: %s", addr, wire_ctl_op_name(req->op),
                             detail);
    }
    return 0;
}

int ctl_call_ok(ctl_client *c, const char *host, int port, const wire_ctl_request *req,
                wire_ctl_reply *out) {
    int rc = ctl_call(c, host, port, req, out);
    if (rc) return rc;
    if (!out->ok) {
        rc = ect_set_error(ECT_EPROTO, "%s:%d refused %s: %s", host, port,
                           wire_ctl_op_name(req->op), out->error ? out->error : "(no text)");
        wire_ctl_reply_clear(out);
        return rc;
    }
    return 0;
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
    if (event_port) *event_port = 0;
    if (!event_port) return ect_set_error(ECT_EINVAL, "ctl_event_port: NULL argument");
    wire_ctl_request req = {.op = WIRE_OP_EVENT_PORT};
    wire_ctl_reply rep;
    int rc = ctl_call_ok(c, host, port, &req, &rep);
    if (rc) return rc;
    *event_port = rep.u.event_port;
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
    free(c);
}
