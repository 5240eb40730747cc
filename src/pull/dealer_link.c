/*
 * dealer_link — see dealer_link.h. One state per link: no socket (a connect
 * is due at retry_ms), a non-blocking connect in flight, or a connection.
 * The codec (zmtp_conn) lives across connect attempts that exchanged no
 * byte, so a message queued while connecting goes out on the connection
 * that is finally made; an established connection that ends takes its codec
 * (and what it held) with it, as libzmq loses what it wrote to a dead TCP
 * connection.
 */
#include "pull/dealer_link.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/util.h"

#define RECONNECT_IVL_MS 100 /* libzmq's ZMQ_RECONNECT_IVL default */
#define READ_CHUNK 65536

struct dealer_link {
    dealer_link_opts o;
    struct addrinfo *ai; /* the host's addresses; next_ai is tried next */
    const struct addrinfo *next_ai;
    int fd;          /* -1: none */
    bool connecting; /* fd's connect is in flight */
    uint64_t retry_ms;
    zmtp_conn *z;
    uint64_t last_ping_ms, ping_wait_since_ms; /* 0: no PING unanswered */
    char lost[256];
    uint8_t buf[READ_CHUNK];
};

static int new_codec(dealer_link *l) {
    zmtp_conn_free(l->z);
    l->z = NULL;
    return zmtp_conn_new(ZMTP_DEALER, l->o.max_msg, &l->z);
}

static void drop_socket(dealer_link *l) {
    if (l->fd >= 0) close(l->fd);
    l->fd = -1;
    l->connecting = false;
    l->retry_ms = ect_now_ms() + RECONNECT_IVL_MS;
}

/* An established connection ended: why goes to lost[]; a fresh codec. */
static int lose(dealer_link *l, const char *why) {
    snprintf(l->lost, sizeof l->lost, "%s", why);
    drop_socket(l);
    (void)new_codec(l); /* out of memory: NULL, made again before the next connect */
    return DL_DISCONNECTED;
}

/* Starts a non-blocking connect to the next address (round robin). */
static void start_connect(dealer_link *l) {
    if (!l->z && new_codec(l) != 0) { /* out of memory: try again later */
        l->retry_ms = ect_now_ms() + RECONNECT_IVL_MS;
        return;
    }
    const struct addrinfo *ai = l->next_ai ? l->next_ai : l->ai;
    l->next_ai = ai->ai_next;
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        l->retry_ms = ect_now_ms() + RECONNECT_IVL_MS;
        return;
    }
    int one = 1; /* as libzmq sets it */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    l->fd = fd;
    l->connecting = true;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) drop_socket(l);
}

/* The connect in flight finished (poll said so): made, or retried later. */
static int connect_done(dealer_link *l) {
    int err = 0;
    socklen_t el = sizeof err;
    if (getsockopt(l->fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
    if (err) {
        drop_socket(l);
        return 0;
    }
    l->connecting = false;
    l->next_ai = NULL; /* the next connection starts from the first address again */
    l->last_ping_ms = ect_now_ms();
    l->ping_wait_since_ms = 0;
    return DL_CONNECTED;
}

/* Writes what the codec queued, as far as the socket takes it. */
static int link_write(dealer_link *l) {
    return zmtp_fd_flush(l->z, l->fd) ? lose(l, ect_last_error()) : 0;
}

/* Reads what is there into the codec; the connection ends on EOF, an error
 * or bytes the codec refuses. Anything heard answers the heartbeat. */
static int link_read(dealer_link *l) {
    bool heard = false;
    int rc = zmtp_fd_fill(l->z, l->fd, l->buf, sizeof l->buf, &heard);
    if (heard) l->ping_wait_since_ms = 0;
    return rc ? lose(l, ect_last_error()) : 0;
}

/* Heartbeats of an established connection (see dealer_link.h). */
static int heartbeat(dealer_link *l, uint64_t now) {
    if (!l->o.heartbeat_ivl_ms || !zmtp_conn_ready(l->z)) return 0;
    if (l->ping_wait_since_ms && l->o.heartbeat_timeout_ms &&
        now - l->ping_wait_since_ms >= (uint64_t)l->o.heartbeat_timeout_ms)
        return lose(l, "heartbeat timeout: nothing heard from the producer");
    if (now - l->last_ping_ms >= (uint64_t)l->o.heartbeat_ivl_ms) {
        if (zmtp_conn_ping(l->z) != 0) return lose(l, ect_last_error());
        l->last_ping_ms = now;
        if (!l->ping_wait_since_ms) l->ping_wait_since_ms = now;
    }
    return 0;
}

/* How long poll may wait before a timer (reconnect, heartbeat) is due. */
static int next_timer_ms(const dealer_link *l, uint64_t now, int wait_ms) {
    uint64_t due = UINT64_MAX;
    if (l->fd < 0) due = l->retry_ms;
    if (l->fd >= 0 && !l->connecting && l->o.heartbeat_ivl_ms) {
        due = l->last_ping_ms + (uint64_t)l->o.heartbeat_ivl_ms;
        if (l->ping_wait_since_ms && l->o.heartbeat_timeout_ms) {
            uint64_t t = l->ping_wait_since_ms + (uint64_t)l->o.heartbeat_timeout_ms;
            if (t < due) due = t;
        }
    }
    if (due == UINT64_MAX) return wait_ms;
    uint64_t in = due > now ? due - now : 0;
    return in < (uint64_t)wait_ms ? (int)in : wait_ms;
}

int dl_pump(dealer_link *l, int wait_ms) {
    int ev = 0;
    uint64_t now = ect_now_ms();
    if (l->fd < 0 && now >= l->retry_ms) start_connect(l);
    if (l->fd >= 0 && !l->connecting) ev |= link_write(l);
    size_t pending = 0;
    if (l->fd >= 0 && !l->connecting) zmtp_conn_out(l->z, &pending);
    struct pollfd p = {
        .fd = l->fd, .events = l->connecting ? POLLOUT : (short)(POLLIN | (pending ? POLLOUT : 0))};
    int ms = ev ? 0 : next_timer_ms(l, now, wait_ms);
    int pr = poll(&p, l->fd >= 0 ? 1 : 0, ms);
    if (pr < 0 && errno != EINTR) return ect_set_errno(errno, "pull consumer: poll");
    if (pr > 0 && l->fd >= 0 && l->connecting) ev |= connect_done(l);
    if (l->fd >= 0 && !l->connecting) {
        if (pr > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) ev |= link_read(l);
        if (l->fd >= 0) ev |= heartbeat(l, ect_now_ms());
        if (l->fd >= 0) ev |= link_write(l);
    }
    if (l->fd < 0 && ect_now_ms() >= l->retry_ms) start_connect(l);
    return ev;
}

int dl_send(dealer_link *l, const void *msg, size_t len) {
    int rc = l->z ? 0 : new_codec(l);
    return rc ? rc : zmtp_conn_send(l->z, msg, len);
}

int dl_next(dealer_link *l, zmtp_msg *m) {
    if (!l->z) return 0;
    int rc = zmtp_conn_next(l->z, m);
    return rc == 1 ? 1 : 0; /* an error already closed the connection (lose) */
}

const char *dl_lost_reason(const dealer_link *l) { return l->lost; }

int dl_open(const dealer_link_opts *o, dealer_link **out) {
    *out = NULL;
    dealer_link *l = calloc(1, sizeof *l);
    if (!l) return ect_set_error(ECT_ENOMEM, "pull consumer: out of memory");
    l->o = *o;
    l->o.host = NULL;
    l->fd = -1;
    if (zmtp_fd_resolve("pull consumer", o->host, o->port, &l->ai) != 0) {
        free(l);
        return ECT_EINVAL;
    }
    int rc = new_codec(l);
    if (rc) {
        dl_close(l);
        return rc;
    }
    start_connect(l);
    *out = l;
    return 0;
}

void dl_close(dealer_link *l) {
    if (!l) return;
    if (l->fd >= 0) close(l->fd);
    zmtp_conn_free(l->z);
    if (l->ai) freeaddrinfo(l->ai);
    free(l);
}
