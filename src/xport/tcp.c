/*
 * tcp — the built-in network transport (wire format: docs/PROTOCOL.md "tcp").
 *
 * Target: one thread per accepted connection runs tcp_rx; payload is
 * received with recv() straight into the registered destination, and acks
 * are sent whenever the socket has nothing more to read, so a pipelined
 * batch gets its acks coalesced. Payload bound for a CUDA region is
 * received into the connection's bounce ring (mem/bounce.c, opened on the
 * first such write: BOUNCE_SLOTS pinned slots of BOUNCE_SLOT bytes) and
 * copied to the device slot by slot while the next slot fills.
 *
 * Initiator: a batch is cut into pieces (a large write is striped over up to
 * conns_per_peer connections), each connection a lane. One poll loop per
 * batch sends every lane's headers and payloads with sendmsg() straight from
 * the caller's memory and reads acks as they come, never waiting for one ack
 * before sending the next write. Connections are cached per session
 * (conncache.c: idle lists, checked for EOF before reuse) and a failed one is
 * closed, so the next batch reconnects. Any number of threads may run
 * batches at once; each takes its own connections from the cache.
 */
#include <pthread.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "mem/memkind.h"
#include "util/util.h"
#include "xport/auth.h"
#include "xport/conncache.h"
#include "xport/tcp_frame.h"
#include "xport/xport.h"

typedef struct tcp_impl {
    xp_server *srv;
    xp_conncache cache; /* idle connections per peer session */
} tcp_impl;

/* ------------------------------------------------------------ target side */

static int flush_out(tcp_rx *rx, int fd, int timeout_ms) {
    if (rx->out_len == 0) return 0;
    int rc = xp_send_all(fd, rx->out, rx->out_len, timeout_ms);
    rx->out_len = 0;
    return rc;
}

#define BOUNCE_SLOT (2u << 20)
#define BOUNCE_SLOTS 4

/* The connection's device sink: a bounce ring on the device being written. */
typedef struct dev_sink {
    mem_bounce *b;
} dev_sink;

static int sink_slot(void *ctx, int device, uint8_t **ptr, size_t *cap) {
    dev_sink *d = ctx;
    if (d->b && bounce_device(d->b) != device) { /* drained: called between writes */
        bounce_close(d->b);
        d->b = NULL;
    }
    if (!d->b) {
        int rc = bounce_open(device, BOUNCE_SLOT, BOUNCE_SLOTS, &d->b);
        if (rc) return rc;
    }
    return bounce_slot(d->b, ptr, cap);
}

static int sink_submit(void *ctx, uint8_t *dst, size_t n) {
    dev_sink *d = ctx;
    return bounce_submit(d->b, dst, n);
}

static int sink_drain(void *ctx) {
    dev_sink *d = ctx;
    return d->b ? bounce_drain(d->b) : 0;
}

static const tcp_rx_dev_ops sink_ops = {sink_slot, sink_submit, sink_drain};

/* The handshake's I/O over a connected stream socket. */
typedef struct tcp_io {
    int fd;
    int timeout_ms;
} tcp_io;

static int io_send(void *ctx, const uint8_t *b, size_t n) {
    tcp_io *t = ctx;
    return xp_send_all(t->fd, b, n, t->timeout_ms);
}

static int io_recv(void *ctx, uint8_t *b, size_t n) {
    tcp_io *t = ctx;
    return xp_recv_all(t->fd, b, n, t->timeout_ms);
}

/* A keyed target's start of a connection: the hellos (ours with the auth
 * flag, sent even to a bad or plain one so the initiator can say why), then
 * the handshake. 0 when the peer proved an accepted key; otherwise the
 * refusal is counted and logged and the caller closes the connection. */
static int target_auth(ect_xport *x, int fd) {
    int to = x->opts.io_timeout_ms;
    uint8_t h[TCP_HELLO_LEN];
    char peer[80];
    xp_peer_name(fd, peer, sizeof peer);
    int rc = xp_recv_all(fd, h, sizeof h, to);
    if (rc) {
        static _Atomic uint64_t silent_log;
        xp_log_limited(&silent_log, "tcp target: %s sent no hello within %d ms; dropping it", peer,
                       to);
        return rc;
    }
    uint8_t mine[TCP_HELLO_LEN];
    tcp_encode_hello(mine, TCP_ROLE_TARGET);
    xp_put_u32(mine + 8, TCP_HELLO_AUTH);
    if ((rc = xp_send_all(fd, mine, sizeof mine, to)) != 0) return rc;
    if ((rc = tcp_decode_hello(h, TCP_ROLE_INITIATOR)) != 0) {
        xp_auth_refused_log(x, peer, ect_last_error());
        return rc;
    }
    if (!(tcp_hello_flags(h) & TCP_HELLO_AUTH)) {
        xp_auth_refused_log(x, peer,
                            "it has no data-plane keys and this target requires them "
                            "(curve_keys)");
        return ECT_EACCES;
    }
    tcp_io io = {fd, to};
    xp_auth_io aio = {io_send, io_recv, &io};
    int who;
    if ((rc = xp_auth_target(x->keys, &aio, &who)) != 0) {
        xp_auth_refused_log(x, peer, ect_last_error());
        return rc;
    }
    ECT_LOGD("xport", "tcp target: %s authenticated as \"%s\"", peer, x->keys->accept_names[who]);
    return 0;
}

static void serve_conn(void *ctx, int fd, int stopfd) {
    ect_xport *x = ctx;
    pthread_setname_np(pthread_self(), "ect-tcp-target");
    tcp_rx rx;
    dev_sink sink = {0};
    (void)stopfd; /* the server's stop shuts the socket down, which ends recv() */
    if (tcp_rx_init(&rx, &x->regs) != 0) return;
    if (x->keys) {
        if (target_auth(x, fd) != 0) {
            tcp_rx_fini(&rx);
            return;
        }
        rx.state = TCP_RX_HEADER; /* hellos exchanged, peer authenticated */
    }
    rx.dev = &sink_ops;
    rx.dev_ctx = &sink;
    int to = x->opts.io_timeout_ms;
    struct timeval tv = {.tv_sec = to / 1000, .tv_usec = (to % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (;;) {
        void *p;
        size_t want = tcp_rx_want(&rx, &p);
        if (want == 0) {
            if (flush_out(&rx, fd, to) != 0 || rx.state == TCP_RX_DEAD) break;
            continue;
        }
        /* Send pending acks before blocking; a pipelined batch keeps the
         * socket readable, so its acks go out together. */
        ssize_t k = recv(fd, p, want, rx.out_len ? MSG_DONTWAIT : 0);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && rx.out_len) {
            if (flush_out(&rx, fd, to) != 0) break;
            continue;
        }
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* Between frames a connection may idle forever (initiators cache
             * them); one that never sent its hello is dropped. */
            if (tcp_rx_idle(&rx) && rx.state != TCP_RX_HELLO) continue;
            if (rx.state == TCP_RX_HELLO && rx.have == 0) {
                static _Atomic uint64_t silent_log;
                xp_log_limited(&silent_log,
                               "tcp target: a peer sent nothing for %d ms after connecting; "
                               "dropping it",
                               to);
                break;
            }
            ECT_LOGW("xport", "tcp target: peer stalled mid-frame for %d ms; closing", to);
            break;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break; /* EOF, reset or shutdown by close */
        if (tcp_rx_advance(&rx, (size_t)k) != 0) {
            ECT_LOGW("xport", "tcp target: %s; closing the connection", rx.why);
            flush_out(&rx, fd, to);
            break;
        }
    }
    flush_out(&rx, fd, to);
    ECT_LOGD("xport", "tcp target: connection done, %" PRIu64 " writes landed, %" PRIu64 " refused",
             rx.accepted, rx.refused);
    tcp_rx_fini(&rx);
    bounce_close(sink.b);
}

/* A peer's address: what the session "HOST:PORT" names. */
typedef struct tcp_addr {
    char host[256];
    int port;
} tcp_addr;

static int parse_session(const char *session, void **addr) {
    tcp_addr *a = malloc(sizeof *a);
    if (!a) return ect_set_error(ECT_ENOMEM, "peer");
    int rc = xp_parse_hostport("peer_session", session, a->host, sizeof a->host, &a->port);
    if (rc) {
        free(a);
        return rc;
    }
    *addr = a;
    return 0;
}

static void close_conn(xp_conn c) { close(c.fd); }

static const xp_conn_ops conn_ops = {parse_session, close_conn, NULL};

static int tcp_open(ect_xport *x) {
    char host[256];
    int port, lfd, bound;
    int rc = xp_parse_hostport("opts.listen", x->listen, host, sizeof host, &port);
    if (rc) return rc;
    tcp_impl *t = calloc(1, sizeof *t);
    if (!t) return ect_set_error(ECT_ENOMEM, "tcp transport");
    rc = xp_tcp_listen(host, port, &lfd, &bound);
    if (!rc)
        rc = xp_server_start(lfd, serve_conn, x, x->opts.max_conns, x->opts.max_conns_per_peer,
                             &t->srv);
    if (rc) {
        free(t);
        return rc;
    }
    xp_cache_init(&t->cache, &conn_ops, 2 * x->opts.conns_per_peer + 8);
    if (strchr(host, ':'))
        snprintf(x->session, sizeof x->session, "[%s]:%d", host, bound);
    else
        snprintf(x->session, sizeof x->session, "%s:%d", host, bound);
    x->impl = t;
    return 0;
}

static void tcp_close(ect_xport *x) {
    tcp_impl *t = x->impl;
    xp_server_stop(t->srv);
    xp_cache_fini(&t->cache);
    free(t);
}

/* --------------------------------------------------------- initiator side */

/* A cached connection, or a new one after the hello exchange. */
static int take_conn(ect_xport *x, xp_peer *p, int *fd) {
    tcp_impl *t = x->impl;
    xp_conn cached;
    if (xp_cache_take(&t->cache, p, &cached)) {
        *fd = cached.fd;
        return 0;
    }
    const tcp_addr *a = p->addr;
    int c, rc = xp_tcp_connect(a->host, a->port, x->opts.connect_timeout_ms, &c);
    if (rc) return rc;
    uint8_t h[TCP_HELLO_LEN];
    tcp_encode_hello(h, TCP_ROLE_INITIATOR);
    if (x->keys) xp_put_u32(h + 8, TCP_HELLO_AUTH);
    rc = xp_send_all(c, h, sizeof h, x->opts.io_timeout_ms);
    if (!rc) rc = xp_recv_all(c, h, sizeof h, x->opts.io_timeout_ms);
    if (rc == ECT_ECLOSED)
        rc = ect_set_error(ECT_ECONNREFUSED, "%s closed the connection during the hello",
                           p->session);
    if (!rc) rc = tcp_decode_hello(h, TCP_ROLE_TARGET);
    /* Keys on one side only: refused, never a silent plain session. */
    if (!rc && x->keys && !(tcp_hello_flags(h) & TCP_HELLO_AUTH))
        rc = ect_set_error(ECT_EACCES,
                           "the target %s has no data-plane keys; refusing to write to it "
                           "unauthenticated (this side has curve_keys)",
                           p->session);
    if (!rc && !x->keys && (tcp_hello_flags(h) & TCP_HELLO_AUTH))
        rc = ect_set_error(ECT_EACCES,
                           "the target %s requires data-plane keys; set curve_keys to a key "
                           "directory it accepts",
                           p->session);
    if (!rc && x->keys) {
        tcp_io io = {c, x->opts.io_timeout_ms};
        xp_auth_io aio = {io_send, io_recv, &io};
        rc = xp_auth_initiator(x->keys, &aio, p->session);
    }
    if (rc) {
        close(c);
        return rc;
    }
    *fd = c;
    return 0;
}

static void give_conn(ect_xport *x, xp_peer *p, int fd) {
    tcp_impl *t = x->impl;
    xp_cache_give(&t->cache, p, (xp_conn){fd, NULL});
}

typedef struct piece {
    size_t w;           /* index of its write */
    const uint8_t *src; /* payload */
    uint64_t len;
    uint8_t hdr[TCP_HDR_LEN];
} piece;

typedef struct lane {
    int fd;
    size_t *q; /* pieces in send order */
    size_t nq;
    size_t sent;     /* pieces fully sent */
    uint64_t off;    /* bytes of q[sent] (header + payload) already sent */
    size_t acked;    /* pieces acknowledged */
    uint64_t queued; /* payload bytes assigned (for balancing) */
    uint8_t ab[TCP_ACK_LEN * 64];
    size_t ahave;
    int err;
} lane;

#define TCP_IOV 64

static int lane_send(lane *l, piece *pc) {
    struct iovec iov[TCP_IOV];
    int n = 0;
    uint64_t off = l->off;
    for (size_t i = l->sent; i < l->nq && n + 2 <= TCP_IOV; i++) {
        piece *p = &pc[l->q[i]];
        if (off < TCP_HDR_LEN) {
            iov[n].iov_base = p->hdr + off;
            iov[n++].iov_len = TCP_HDR_LEN - off;
            off = 0;
        } else {
            off -= TCP_HDR_LEN;
        }
        if (p->len > off) {
            iov[n].iov_base = (void *)(p->src + off);
            iov[n++].iov_len = (size_t)(p->len - off);
        }
        off = 0;
    }
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    ssize_t k = sendmsg(l->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        return ect_set_error(ECT_ECLOSED, "send to the target: %s", strerror(errno));
    }
    uint64_t left = (uint64_t)k;
    while (left > 0) {
        piece *p = &pc[l->q[l->sent]];
        uint64_t rest = TCP_HDR_LEN + p->len - l->off;
        if (left >= rest) {
            left -= rest;
            l->sent++;
            l->off = 0;
        } else {
            l->off += left;
            left = 0;
        }
    }
    /* Pieces with nothing left to send (a zero-length tail) count as sent. */
    return 0;
}

static int lane_recv(lane *l, piece *pc, int *st) {
    ssize_t k = recv(l->fd, l->ab + l->ahave, sizeof l->ab - l->ahave, MSG_DONTWAIT);
    if (k == 0) return ect_set_error(ECT_ECLOSED, "the target closed the connection mid-batch");
    if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        return ect_set_error(ECT_ECLOSED, "receive from the target: %s", strerror(errno));
    }
    l->ahave += (size_t)k;
    size_t used = 0;
    while (l->ahave - used >= TCP_ACK_LEN) {
        uint64_t id;
        int32_t s;
        if (tcp_decode_ack(l->ab + used, &id, &s) != 0) return ECT_EPROTO;
        if (l->acked >= l->sent || id != l->q[l->acked])
            return ect_set_error(ECT_EPROTO, "tcp ack for write %" PRIu64 " out of order", id);
        if (s > 0 || s < ECT_EOVERFLOW) s = ECT_EPROTO;
        size_t w = pc[id].w;
        if (s != 0 && st[w] == 0) st[w] = s;
        l->acked++;
        used += TCP_ACK_LEN;
    }
    memmove(l->ab, l->ab + used, l->ahave - used);
    l->ahave -= used;
    return 0;
}

static void lane_fail(lane *l, piece *pc, int *st, int err) {
    l->err = err;
    for (size_t i = l->acked; i < l->nq; i++)
        if (st[pc[l->q[i]].w] == 0) st[pc[l->q[i]].w] = err;
    close(l->fd);
    l->fd = -1;
}

static int run_lanes(ect_xport *x, lane *ln, int nl, piece *pc, int *st) {
    struct pollfd pf[64];
    int map[64];
    for (;;) {
        int np = 0;
        for (int i = 0; i < nl; i++) {
            lane *l = &ln[i];
            if (l->fd < 0 || l->acked == l->nq) continue;
            pf[np].fd = l->fd;
            pf[np].events = POLLIN | (l->sent < l->nq ? POLLOUT : 0);
            pf[np].revents = 0;
            map[np++] = i;
        }
        if (np == 0) return 0;
        int pr = poll(pf, (nfds_t)np, x->opts.io_timeout_ms);
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
            int e = pr == 0 ? ect_set_error(ECT_ETIMEDOUT, "tcp target sent nothing for %d ms",
                                            x->opts.io_timeout_ms)
                            : ect_set_errno(errno, "poll");
            for (int j = 0; j < np; j++) lane_fail(&ln[map[j]], pc, st, e);
            return e;
        }
        for (int j = 0; j < np; j++) {
            lane *l = &ln[map[j]];
            int rc = 0;
            if (pf[j].revents & (POLLIN | POLLHUP | POLLERR)) rc = lane_recv(l, pc, st);
            if (!rc && (pf[j].revents & POLLOUT)) rc = lane_send(l, pc);
            if (rc) {
                ECT_LOGD("xport", "tcp lane failed: %s", ect_last_error());
                lane_fail(l, pc, st, rc);
            }
        }
    }
}

static int tcp_write_batch(ect_xport *x, const char *session, const ect_write *w, size_t n,
                           int *st) {
    tcp_impl *t = x->impl;
    xp_peer *p = NULL;
    int rc = xp_cache_peer(&t->cache, session, &p);
    if (rc) {
        for (size_t i = 0; i < n; i++) st[i] = rc;
        return rc;
    }
    /* Keys first: a malformed key fails only its own write. */
    uint64_t *tok = malloc(n * sizeof *tok);
    if (!tok) return ect_set_error(ECT_ENOMEM, "batch");
    uint64_t smin = x->opts.stripe_min, biggest = 0;
    for (size_t i = 0; i < n; i++) {
        if (xp_key_parse(w[i].dst_key, &tok[i]) != 0)
            st[i] = ECT_EINVAL;
        else if (w[i].len > biggest)
            biggest = w[i].len;
    }
    /* Connections: as many as the largest write is cut into (a write of at
     * least 2 * stripe_min, in pieces of at least stripe_min, over at most
     * conns_per_peer). A batch of smaller writes keeps to one connection,
     * whatever its total: its writes are pipelined with their acks
     * coalesced already, and a second connection would only add a
     * receiving thread and its wake-ups (on two vCPUs, `ect bench pull`'s 32
     * x 64 KiB in flight ran at 0.57-0.84 of its raw batch over two, at
     * 0.82-1.08 over one; docs/BENCHMARKS.md, issue 13, fifteenth pass). */
    int want = 1;
    if (x->opts.conns_per_peer > 1 && biggest >= 2 * smin)
        want = (int)(biggest / smin < (uint64_t)x->opts.conns_per_peer
                         ? biggest / smin
                         : (uint64_t)x->opts.conns_per_peer);
    lane ln[64];
    int nl = 0;
    for (; nl < want; nl++) {
        memset(&ln[nl], 0, sizeof ln[nl]);
        rc = take_conn(x, p, &ln[nl].fd);
        if (rc) break;
    }
    if (nl == 0) {
        free(tok);
        for (size_t i = 0; i < n; i++)
            if (st[i] == 0) st[i] = rc;
        return rc;
    }
    /* Pieces: a write of at least 2 * stripe_min is cut into up to nl parts. */
    size_t npc = 0;
    for (size_t i = 0; i < n; i++) {
        if (st[i]) continue;
        uint64_t parts = nl > 1 && w[i].len >= 2 * smin ? w[i].len / smin : 1;
        npc += parts > (uint64_t)nl ? (size_t)nl : (size_t)parts;
    }
    piece *pc = malloc((npc ? npc : 1) * sizeof *pc);
    size_t *qs = malloc((npc ? npc : 1) * sizeof *qs);
    if (!pc || !qs) {
        free(pc);
        free(qs);
        free(tok);
        for (int i = 0; i < nl; i++) give_conn(x, p, ln[i].fd);
        return ect_set_error(ECT_ENOMEM, "batch pieces");
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (st[i]) continue;
        uint64_t parts = nl > 1 && w[i].len >= 2 * smin ? w[i].len / smin : 1;
        if (parts > (uint64_t)nl) parts = (uint64_t)nl;
        uint64_t step = (w[i].len / parts + 4095) & ~(uint64_t)4095, off = 0;
        for (uint64_t j = 0; j < parts; j++) {
            uint64_t len = j + 1 == parts ? w[i].len - off : step;
            pc[k].w = i;
            pc[k].src = (const uint8_t *)w[i].src + off;
            pc[k].len = len;
            tcp_encode_write(pc[k].hdr, k, w[i].dst_addr + off, len, tok[i]);
            off += len;
            k++;
        }
    }
    free(tok);
    /* Each piece goes to the lane with the fewest bytes queued; lanes take
     * contiguous slices of qs in two passes (count, then fill). */
    size_t *cnt = calloc((size_t)nl, sizeof *cnt);
    uint8_t *who = malloc(npc ? npc : 1);
    if (!cnt || !who) {
        free(cnt);
        free(who);
        free(pc);
        free(qs);
        for (int i = 0; i < nl; i++) give_conn(x, p, ln[i].fd);
        return ect_set_error(ECT_ENOMEM, "batch lanes");
    }
    for (size_t i = 0; i < npc; i++) {
        int best = 0;
        for (int j = 1; j < nl; j++)
            if (ln[j].queued < ln[best].queued) best = j;
        ln[best].queued += pc[i].len + TCP_HDR_LEN;
        who[i] = (uint8_t)best;
        cnt[best]++;
    }
    size_t pos = 0;
    for (int j = 0; j < nl; j++) {
        ln[j].q = qs + pos;
        pos += cnt[j];
    }
    for (size_t i = 0; i < npc; i++) ln[who[i]].q[ln[who[i]].nq++] = i;
    free(cnt);
    free(who);
    rc = run_lanes(x, ln, nl, pc, st);
    for (int i = 0; i < nl; i++)
        if (ln[i].fd >= 0) give_conn(x, p, ln[i].fd);
    free(pc);
    free(qs);
    return rc;
}

const xp_backend xp_tcp_backend = {
    .name = "tcp",
    .session_prefix = "",
    .device_regions = true,
    .device_sources = false,
    .open = tcp_open,
    .close = tcp_close,
    .reg = NULL,
    .unreg = NULL,
    .destroy = NULL,
    .write_batch = tcp_write_batch,
};
