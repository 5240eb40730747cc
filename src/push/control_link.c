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
 *
 * Lending (control_link.h): a call given up at its yield_at keeps its state
 * on the link (susp: the replies handed over so far and the current reply's
 * deadline; the requests are on the codec or the wire), and a call with
 * `resume` picks it up on whichever thread holds the link next.
 */
#include "push/control_link.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zmq.h>

#include "util/util.h"
#include "wire/zmtp.h"

#define RECONNECT_IVL_MS 100 /* libzmq's ZMQ_RECONNECT_IVL default */
#define READ_CHUNK 65536

/* Internal outcome: the connection is gone (EOF, reset, handshake refused);
 * ect_last_error() says how. Never returned to the caller. */
#define LINK_LOST ZMTP_FD_LOST

struct ctl_link {
    int fd; /* -1: not connected */
    zmtp_conn *z;
    bool peer_ready; /* the peer's READY came: the request may be on the wire */
    /* a call given up at its yield_at with its requests queued (resume it) */
    bool susp;
    size_t susp_ndone;
    uint64_t susp_deadline;
    uint8_t buf[READ_CHUNK];
};

static void link_reset(ctl_link *l) {
    if (l->fd >= 0) close(l->fd);
    zmtp_conn_free(l->z);
    l->fd = -1;
    l->z = NULL;
    l->peer_ready = false;
    l->susp = false;
}

static int ms_left(uint64_t deadline) {
    uint64_t now = ect_now_ms();
    if (now >= deadline) return 0;
    return deadline - now > INT_MAX ? INT_MAX : (int)(deadline - now);
}

/* Whether the watch socket's context is shutting down (zmq_ctx_shutdown):
 * what ends a libzmq call at once with ETERM ends ours too. */
static int watch_check(const ctl_link_call_opts *o) {
    int ev = 0;
    size_t sz = sizeof ev;
    if (zmq_getsockopt(o->watch, ZMQ_EVENTS, &ev, &sz) != 0 && errno == ETERM)
        return ect_set_error(ECT_EIO, "control %s: the ZMQ context is shutting down (%s)", o->addr,
                             o->op_name);
    return 0;
}

/* poll() on fd (-1: none) for `events` and on the watch socket, up to ms.
 * *rev gets fd's revents (0: the time is up, or only the watch socket woke).
 * Errors: the context is shutting down, poll failed. */
static int wait_io(const ctl_link_call_opts *o, int fd, short events, int ms, short *rev) {
    struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = o->watch_fd, .events = POLLIN}};
    *rev = 0;
    int pr = poll(p, o->watch ? 2 : 1, ms);
    if (pr < 0) return errno == EINTR ? 0 : ect_set_errno(errno, "control %s: poll", o->addr);
    if (o->watch && p[1].revents) {
        int rc = watch_check(o);
        if (rc) return rc;
    }
    *rev = p[0].revents;
    return 0;
}

/* Sleeps until the deadline, or cap_ms when that is sooner (cap_ms < 0: no
 * cap). Returns 0 while time is left, 1 once the deadline passed, or
 * wait_io's error. */
static int nap_until(const ctl_link_call_opts *o, uint64_t deadline, int cap_ms) {
    int left;
    while ((left = ms_left(deadline)) > 0) {
        short rev;
        int rc = wait_io(o, -1, 0, cap_ms >= 0 && cap_ms < left ? cap_ms : left, &rev);
        if (rc) return rc;
        if (cap_ms >= 0) break;
    }
    return ms_left(deadline) > 0 ? 0 : 1;
}

/* A non-blocking connect to one address, waited for until the deadline
 * (the watch socket can end the wait: a blocking connect could not). */
static int connect_one(const ctl_link_call_opts *o, const struct addrinfo *ai, uint64_t deadline,
                       int *out) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return ect_set_errno(errno, "control %s: socket", o->addr);
    int one = 1; /* as libzmq sets it */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = 0, err = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) err = errno;
    while (!err) {
        int left = ms_left(deadline);
        short rev = 0;
        if (left == 0) {
            rc = ECT_ETIMEDOUT;
            break;
        }
        rc = wait_io(o, fd, POLLOUT, left, &rev);
        if (rc) break;
        if (rev) {
            socklen_t el = sizeof err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
            if (!err) {
                *out = fd;
                return 0;
            }
        }
    }
    close(fd);
    if (err)
        return ect_set_error(ECT_ECONNREFUSED, "control %s: connect: %s", o->addr, strerror(err));
    return rc;
}

/* Connects to the first address of the host that takes it (names and IPv6
 * literals resolve as libzmq resolves them: getaddrinfo, "[v6]" unwrapped). */
static int link_connect(ctl_link *l, const ctl_link_call_opts *o, uint64_t deadline) {
    struct addrinfo *res = NULL;
    if (zmtp_fd_resolve("control client", o->host, o->port, &res) != 0) return ECT_EINVAL;
    int rc = ect_set_error(ECT_ECONNREFUSED, "control %s: no address", o->addr);
    int fd = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        rc = connect_one(o, ai, deadline, &fd);
        if (rc != ECT_ECONNREFUSED) break; /* connected, out of time, or shutting down */
    }
    freeaddrinfo(res);
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
static int link_write(ctl_link *l) { return zmtp_fd_flush(l->z, l->fd); }

/* Reads what is there and feeds it to the codec. LINK_LOST on EOF or a
 * socket error, the codec's error for bytes it refuses. */
static int link_read(ctl_link *l) {
    int rc = zmtp_fd_fill(l->z, l->fd, l->buf, sizeof l->buf, NULL);
    if (zmtp_conn_ready(l->z)) l->peer_ready = true;
    return rc;
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
 * (ECT_ETIMEDOUT, no text), o->yield_at passes (CTL_LINK_YIELDED), the
 * connection is lost (LINK_LOST), the codec refuses what came (its error) or
 * wait_io fails. */
static int link_exchange(ctl_link *l, const ctl_link_call_opts *o, uint64_t deadline,
                         const uint8_t **reply, size_t *len) {
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
        if (o->yield_at) {
            int yl = ms_left(o->yield_at);
            if (yl == 0) return CTL_LINK_YIELDED;
            if (yl < left) left = yl;
        }
        size_t pending;
        zmtp_conn_out(l->z, &pending);
        short rev;
        rc = wait_io(o, l->fd, POLLIN | (pending ? POLLOUT : 0), left, &rev);
        if (rc) return rc;
        if (rev & (POLLIN | POLLHUP | POLLERR)) {
            rc = link_read(l);
            if (rc) return rc;
        }
    }
}

static int timed_out(const ctl_link_call_opts *o) {
    return ect_set_error(ECT_ETIMEDOUT, "control %s: no reply to %s within %d ms", o->addr,
                         o->op_name, o->timeout_ms);
}

/* The connection went away, or its peer refused our handshake: what
 * libzmq's REQ would have made of it (see the top of the file). Sets *retry
 * when a new connection may carry the request. */
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
    int rc = nap_until(o, deadline, sent ? -1 : RECONNECT_IVL_MS);
    if (rc < 0) return rc;
    if (rc == 0 && !sent) {
        *retry = true;
        return 0;
    }
    return timed_out(o); /* a lost request: libzmq waits for a reply that never comes */
}

/* Queues every request on the connection's codec (it holds them until the
 * peer's READY): a first try, or a retry after a connection lost before any
 * was written. */
static int queue_reqs(ctl_link *l, const ctl_link_req *reqs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int rc = zmtp_conn_send_req(l->z, reqs[i].frame, reqs[i].len);
        if (rc) return rc;
    }
    return 0;
}

int ctl_link_call_many(ctl_link **lp, const ctl_link_call_opts *o, const ctl_link_req *reqs,
                       size_t n, ctl_link_reply_fn on_reply, void *ctx, size_t *ndone) {
    *ndone = 0;
    if (!*lp) {
        ctl_link *nl = calloc(1, sizeof *nl);
        if (!nl) return ect_set_error(ECT_ENOMEM, "control client: out of memory");
        nl->fd = -1;
        *lp = nl;
    }
    ctl_link *l = *lp;
    ctl_link_call_opts oi = *o; /* op_name: the request waited for */
    oi.op_name = reqs[0].op_name ? reqs[0].op_name : o->op_name;
    uint64_t deadline = ect_now_ms() + (uint64_t)o->timeout_ms;
    bool queued = o->resume && l->susp; /* the requests are on the codec already */
    if (queued) {
        *ndone = l->susp_ndone;
        deadline = l->susp_deadline;
        if (reqs[*ndone].op_name) oi.op_name = reqs[*ndone].op_name;
        l->susp = false;
    } else {
        if (l->fd >= 0 && !link_idle_ok(l)) link_reset(l);
        if (o->yield_at && l->fd < 0) return CTL_LINK_YIELDED_UNSENT;
    }
    for (;;) {
        if (l->fd < 0) {
            int rc = link_connect(l, &oi, deadline);
            if (rc == ECT_ECONNREFUSED && o->fail_fast)
                return ect_set_error(ECT_ECONNREFUSED,
                                     "control %s: connection refused (no one listens there) "
                                     "sending %s",
                                     o->addr, oi.op_name);
            if (rc == ECT_ECONNREFUSED || rc == ECT_ETIMEDOUT) {
                rc = nap_until(&oi, deadline, RECONNECT_IVL_MS);
                if (rc < 0) return rc;
                if (rc == 0) continue;
                return timed_out(&oi);
            }
            if (rc) return rc;
        }
        /* all at once: one write when the peer is ready */
        int rc = queued ? 0 : queue_reqs(l, reqs, n);
        queued = false; /* a retry below queues them again */
        while (!rc && *ndone < n) {
            const uint8_t *body = NULL;
            size_t blen = 0;
            if ((rc = link_exchange(l, &oi, deadline, &body, &blen))) break;
            /* (a yield below leaves the link as it is: resumed, it goes on) */
            if ((rc = on_reply(ctx, *ndone, body, blen))) return rc;
            if (++*ndone < n) { /* each reply gets the whole timeout */
                deadline = ect_now_ms() + (uint64_t)o->timeout_ms;
                oi.op_name = reqs[*ndone].op_name ? reqs[*ndone].op_name : o->op_name;
            }
        }
        if (rc == 0) return 0;
        if (rc == CTL_LINK_YIELDED) {
            l->susp = true;
            l->susp_ndone = *ndone;
            l->susp_deadline = deadline;
            return rc;
        }
        if (rc == ECT_ETIMEDOUT) return timed_out(&oi);
        if (rc == LINK_LOST || ((rc == ECT_EPROTO || rc == ECT_ERANGE) && !l->peer_ready)) {
            bool retry; /* only while nothing was written: *ndone is 0 then */
            rc = on_lost(l, &oi, deadline, &retry);
            if (retry) continue;
            return rc;
        }
        if (rc == ECT_EPROTO || rc == ECT_ERANGE) {
            char why[256];
            snprintf(why, sizeof why, "%s", ect_last_error());
            return ect_set_error(ECT_EPROTO, "control %s: bad reply to %s: %s", o->addr,
                                 oi.op_name, why);
        }
        return rc;
    }
}

typedef struct one_reply {
    const uint8_t **body;
    size_t *len;
} one_reply;

static int keep_reply(void *ctx, size_t i, const uint8_t *body, size_t len) {
    one_reply *r = ctx;
    (void)i;
    *r->body = body;
    *r->len = len;
    return 0;
}

int ctl_link_call(ctl_link **lp, const ctl_link_call_opts *o, const void *req, size_t len,
                  const uint8_t **reply, size_t *reply_len) {
    ctl_link_req one = {.frame = req, .len = len, .op_name = o->op_name};
    one_reply r = {reply, reply_len};
    size_t ndone;
    return ctl_link_call_many(lp, o, &one, 1, keep_reply, &r, &ndone);
}

void ctl_link_close(ctl_link *l) {
    if (!l) return;
    link_reset(l);
    free(l);
}
