/*
 * control_link — see control_link.h. One call is: check the idle connection,
 * connect when there is none (retrying every 100 ms unless fail-fast), queue
 * the request (the codec holds it until the peer's READY), then poll() the
 * socket, writing what the codec queued and feeding it what arrives, until
 * the reply is whole or the deadline passes. The socket is non-blocking
 * throughout (MSG_DONTWAIT), so no step can outlast the deadline.
 *
 * Whether a lost connection may be retried follows from where libzmq's REQ
 * keeps the request: in the socket's pipe until its connection's handshake is
 * through (a reconnect sends it then), on the wire after that (lost with the
 * connection). Here: before the peer's READY the request was never written,
 * so a new connection may carry it; after, it may have reached the server
 * and is never sent twice.
 */
#include "push/control_link.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/util.h"
#include "wire/zmtp.h"
#include "xport/xport.h"

#define RECONNECT_IVL_MS 100 /* libzmq's ZMQ_RECONNECT_IVL default */
#define READ_CHUNK 65536

/* Internal outcome: the connection is gone (EOF, reset, handshake refused);
 * ect_last_error() says how. Never returned to the caller. */
#define LINK_LOST 1

struct ctl_link {
    int fd; /* -1: not connected */
    zmtp_conn *z;
    bool peer_ready; /* the peer's READY came: the request may be on the wire */
    uint8_t buf[READ_CHUNK];
};

static void link_reset(ctl_link *l) {
    if (l->fd >= 0) close(l->fd);
    zmtp_conn_free(l->z);
    l->fd = -1;
    l->z = NULL;
    l->peer_ready = false;
}

static int ms_left(uint64_t deadline) {
    uint64_t now = ect_now_ms();
    if (now >= deadline) return 0;
    return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* Sleeps until the deadline, or `cap_ms` when sooner (cap_ms < 0: no cap).
 * Returns whether time is left. */
static bool nap_until(uint64_t deadline, int cap_ms) {
    int left;
    while ((left = ms_left(deadline)) > 0) {
        int ms = cap_ms >= 0 && cap_ms < left ? cap_ms : left;
        poll(NULL, 0, ms);
        if (cap_ms >= 0) break;
    }
    return ms_left(deadline) > 0;
}

static int link_connect(ctl_link *l, const ctl_link_call_opts *o, uint64_t deadline) {
    char host[256];
    const char *h = o->host;
    size_t hl = strlen(h);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']' && hl - 2 < sizeof host) {
        memcpy(host, h + 1, hl - 2); /* "[v6]": getaddrinfo wants it bare */
        host[hl - 2] = '\0';
        h = host;
    }
    int left = ms_left(deadline);
    int fd = -1;
    int rc = xp_tcp_connect(h, o->port, left > 0 ? left : 1, &fd);
    if (rc) return rc;
    rc = zmtp_conn_new(ZMTP_REQ, o->max_msg, &l->z);
    if (rc) {
        close(fd);
        return rc;
    }
    l->fd = fd;
    return 0;
}

/* Writes what the codec queued, as far as the socket takes it now. */
static int link_write(ctl_link *l) {
    size_t n;
    const uint8_t *p;
    while ((p = zmtp_conn_out(l->z, &n)) != NULL) {
        ssize_t w = send(l->fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            zmtp_conn_sent(l->z, (size_t)w);
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            ect_set_errno(errno, "send");
            return LINK_LOST;
        }
    }
    return 0;
}

/* Reads what is there and feeds it to the codec. LINK_LOST on EOF or a
 * socket error, the codec's error for bytes it refuses. */
static int link_read(ctl_link *l) {
    for (;;) {
        ssize_t r = recv(l->fd, l->buf, sizeof l->buf, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (r <= 0) {
            if (r == 0)
                ect_set_error(ECT_ECLOSED, "the peer closed the connection");
            else
                ect_set_errno(errno, "receive");
            return LINK_LOST;
        }
        int rc = zmtp_conn_feed(l->z, l->buf, (size_t)r);
        if (rc) return rc;
        if (zmtp_conn_ready(l->z)) l->peer_ready = true;
        if ((size_t)r < sizeof l->buf) return 0; /* drained: spare the EAGAIN */
    }
}

/* An idle connection is usable when nothing came on it since the last reply
 * but what the codec answers itself (PING): EOF, an error, a refused byte or
 * an unasked-for message all mean a new connection. */
static bool link_idle_ok(ctl_link *l) {
    struct pollfd p = {.fd = l->fd, .events = POLLIN};
    if (poll(&p, 1, 0) > 0 && link_read(l) != 0) return false;
    zmtp_msg m;
    return zmtp_conn_next(l->z, &m) == 0;
}

/* Runs the connection until a reply is whole (0), the deadline passes
 * (ECT_ETIMEDOUT, no text), the connection is lost (LINK_LOST) or the codec
 * refuses what came (its error). */
static int link_exchange(ctl_link *l, uint64_t deadline, const uint8_t **reply, size_t *len) {
    for (;;) {
        int rc = link_write(l);
        if (rc) return rc;
        zmtp_msg m;
        int got = zmtp_conn_next(l->z, &m);
        if (got < 0) return got;
        if (got == 1) {
            if (m.multi) return ect_set_error(ECT_EPROTO, "a reply of several frames");
            *reply = m.body;
            *len = m.body_len;
            return 0;
        }
        int left = ms_left(deadline);
        if (left == 0) return ECT_ETIMEDOUT;
        size_t pending;
        zmtp_conn_out(l->z, &pending);
        struct pollfd p = {.fd = l->fd, .events = POLLIN | (pending ? POLLOUT : 0)};
        int pr = poll(&p, 1, left);
        if (pr < 0 && errno != EINTR) return ect_set_errno(errno, "poll");
        if (pr > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
            rc = link_read(l);
            if (rc) return rc;
        }
    }
}

static int timed_out(const ctl_link_call_opts *o) {
    return ect_set_error(ECT_ETIMEDOUT, "control %s: no reply to %s within %d ms", o->addr,
                         o->op_name, o->timeout_ms);
}

/* The connection went away, or its peer refused our handshake (`refused`):
 * what libzmq's REQ would have made of it (see the top of the file). */
static int on_lost(ctl_link *l, const ctl_link_call_opts *o, uint64_t deadline, bool *retry) {
    char why[256];
    snprintf(why, sizeof why, "%s", ect_last_error());
    bool sent = l->peer_ready;
    link_reset(l);
    *retry = false;
    if (o->fail_fast)
        return ect_set_error(ECT_ECONNREFUSED,
                             "control %s: the peer closed the connection before replying to %s "
                             "(%s)",
                             o->addr, o->op_name, why);
    if (!sent && nap_until(deadline, RECONNECT_IVL_MS)) {
        *retry = true;
        return 0;
    }
    nap_until(deadline, -1); /* the request is lost: libzmq waits for a reply that never comes */
    return timed_out(o);
}

int ctl_link_call(ctl_link **lp, const ctl_link_call_opts *o, const void *req, size_t len,
                  const uint8_t **reply, size_t *reply_len) {
    if (!*lp) {
        ctl_link *n = calloc(1, sizeof *n);
        if (!n) return ect_set_error(ECT_ENOMEM, "control client: out of memory");
        n->fd = -1;
        *lp = n;
    }
    ctl_link *l = *lp;
    uint64_t deadline = ect_now_ms() + (uint64_t)o->timeout_ms;
    if (l->fd >= 0 && !link_idle_ok(l)) link_reset(l);
    for (;;) {
        if (l->fd < 0) {
            int rc = link_connect(l, o, deadline);
            if (rc == ECT_ECONNREFUSED && o->fail_fast)
                return ect_set_error(ECT_ECONNREFUSED,
                                     "control %s: connection refused (no one listens there) "
                                     "sending %s",
                                     o->addr, o->op_name);
            if (rc == ECT_ECONNREFUSED || rc == ECT_ETIMEDOUT) {
                if (nap_until(deadline, RECONNECT_IVL_MS)) continue;
                return timed_out(o);
            }
            if (rc) return rc;
        }
        int rc = zmtp_conn_send_req(l->z, req, len);
        if (rc) return rc;
        rc = link_exchange(l, deadline, reply, reply_len);
        if (rc == 0) return 0;
        if (rc == ECT_ETIMEDOUT) return timed_out(o);
        if (rc == LINK_LOST || ((rc == ECT_EPROTO || rc == ECT_ERANGE) && !l->peer_ready)) {
            bool retry;
            rc = on_lost(l, o, deadline, &retry);
            if (retry) continue;
            return rc;
        }
        if (rc == ECT_EPROTO || rc == ECT_ERANGE) {
            char why[256];
            snprintf(why, sizeof why, "%s", ect_last_error());
            return ect_set_error(ECT_EPROTO, "control %s: bad reply to %s: %s", o->addr, o->op_name,
                                 why);
        }
        return rc;
    }
}

void ctl_link_close(ctl_link *l) {
    if (!l) return;
    link_reset(l);
    free(l);
}
