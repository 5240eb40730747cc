/*
 * control_listener — accept, poll, read, answer and write on one thread.
 *
 * A pass builds one pollfd per socket: the listener (unless accepting is
 * paused after EMFILE), and each connection with POLLIN while it may take a
 * new request (no reply unsent, no whole request left in its codec, no EOF
 * seen) and POLLOUT while a reply waits for room. Input is therefore bounded
 * per connection by one read budget plus the codec's max_msg, output by one
 * reply: a DEALER that pipelines requests and never reads stops being read.
 *
 * `pending` says the codec may hold another whole request (the last
 * zmtp_conn_next gave one, or bytes came since): such a connection is
 * answered next pass without waiting for its socket, and the pass does not
 * sleep while any is pending. That is what makes one request per connection
 * per pass fair between a busy DEALER and a quiet REQ.
 *
 * ROUTER mode differs only where a REP waits for its reply: a connection
 * is read while less than CTL_LISTENER_OUT_PAUSE bytes wait for it, and up
 * to CTL_LISTENER_BURST of its messages go to on_msg per pass; replies come
 * through ctl_listener_send, from the handler or later, by connection id.
 */
#include "push/control_listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "util/hostport.h"
#include "util/util.h"
#include "wire/zmtp.h"

#define MOD "ctlsrv"
#define LISTEN_BACKLOG 100       /* libzmq's ZMQ_BACKLOG default */
#define READ_CHUNK (64u << 10)   /* one recv */
#define READ_BUDGET (256u << 10) /* bytes read from one connection per pass */
#define ACCEPTS_PER_PASS 64      /* then the connections get their turn */
#define ACCEPT_PAUSE_MS 100      /* after EMFILE / ENFILE / ENOMEM */
#define WARN_EVERY_MS 1000

typedef struct lconn {
    int fd;      /* -1: closed, removed at the end of the pass */
    uint64_t id; /* ROUTER mode's address for ctl_listener_send */
    zmtp_conn *z;
    uint64_t deadline; /* handshake deadline (ms); 0 once ready */
    bool pending;      /* the codec may hold a whole request */
    bool eof;          /* the peer closed its side */
    char peer[64];     /* getpeername's address, no port */
} lconn;

struct ctl_listener {
    ctl_listener_opts o;
    int fd, port;
    lconn **conns;
    size_t n, cap;
    struct pollfd *pfds; /* cap + 2: [0] listener, [1] watched fd, [i + 2] conns[i] */
    int watch_fd;        /* -1: none */
    uint64_t next_id;
    uint8_t *rbuf; /* READ_CHUNK */
    uint64_t accept_paused_until;
    uint64_t refused, refused_logged_ms; /* connections over max_conns */
};

/* ------------------------------------------------------------- binding */

/* An interface name's IPv4 address ("lo", "eth0"), as libzmq's bind takes
 * one. -1 when there is none. */
static int nic_address(const char *name, struct sockaddr_storage *ss, socklen_t *len) {
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) != 0) return -1;
    int rc = -1;
    for (struct ifaddrs *i = ifs; i && rc; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || strcmp(i->ifa_name, name))
            continue;
        memcpy(ss, i->ifa_addr, sizeof(struct sockaddr_in));
        *len = sizeof(struct sockaddr_in);
        rc = 0;
    }
    freeifaddrs(ifs);
    return rc;
}

/* The address to bind: "*" -> in6addr_any (or INADDR_ANY, *v6 false when
 * the host has no IPv6 socket), else a numeric address, brackets stripped. */
static int resolve_bind(const char *what, const char *ip, int port, struct sockaddr_storage *ss,
                        socklen_t *len) {
    memset(ss, 0, sizeof *ss);
    if (strcmp(ip, "*") == 0) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons((uint16_t)port);
        *len = sizeof *a;
        return 0;
    }
    char host[256];
    size_t n = strlen(ip);
    if (n >= 2 && ip[0] == '[' && ip[n - 1] == ']')
        snprintf(host, sizeof host, "%.*s", (int)(n - 2), ip + 1);
    else
        snprintf(host, sizeof host, "%s", ip);
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_PASSIVE, .ai_socktype = SOCK_STREAM};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) == 0 && ai) {
        memcpy(ss, ai->ai_addr, ai->ai_addrlen);
        *len = ai->ai_addrlen;
        freeaddrinfo(ai);
    } else if (nic_address(host, ss, len) != 0) {
        return ect_set_error(ECT_EINVAL, "%s ip '%s': neither a numeric address nor an interface",
                             what, ip);
    }
    if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    return 0;
}

/* "*" on a host without IPv6: INADDR_ANY instead. */
static void any_v4(int port, struct sockaddr_storage *ss, socklen_t *len) {
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    memset(ss, 0, sizeof *ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons((uint16_t)port);
    *len = sizeof *a;
}

static int listen_socket(int family) {
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (family == AF_INET6) /* libzmq's ZMQ_IPV6: v4 peers reach a v6 wildcard */
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    return fd;
}

static int bind_error(const ctl_listener_opts *o, int e) {
    char ep[300];
    ect_tcp_endpoint(o->ip, o->port, ep, sizeof ep);
    if (e == EADDRINUSE) return ect_set_error(ECT_EEXIST, "%s: address in use", ep);
    return ect_set_error(ECT_EIO, "bind %s: %s", ep, strerror(e));
}

static int bind_listen(ctl_listener *l) {
    struct sockaddr_storage ss;
    socklen_t len;
    int rc = resolve_bind(l->o.what, l->o.ip, l->o.port, &ss, &len);
    if (rc) return rc;
    if (l->o.v4_wildcard && strcmp(l->o.ip, "*") == 0) any_v4(l->o.port, &ss, &len);
    l->fd = listen_socket(ss.ss_family);
    if (l->fd < 0 && errno == EAFNOSUPPORT && strcmp(l->o.ip, "*") == 0) {
        any_v4(l->o.port, &ss, &len);
        l->fd = listen_socket(AF_INET);
    }
    if (l->fd < 0) return bind_error(&l->o, errno);
    if (bind(l->fd, (struct sockaddr *)&ss, len) != 0 || listen(l->fd, LISTEN_BACKLOG) != 0)
        return bind_error(&l->o, errno);
    len = sizeof ss;
    if (getsockname(l->fd, (struct sockaddr *)&ss, &len) != 0) return bind_error(&l->o, errno);
    l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                             : ((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

int ctl_listener_open(const ctl_listener_opts *o, ctl_listener **out) {
    *out = NULL;
    if (!o || !o->ip || (!o->fn && !o->on_msg) || o->max_msg < 1 || o->port < 0 ||
        o->port > 65535 || o->handshake_ms < 0 || o->max_conns < 0)
        return ect_set_error(ECT_EINVAL, "control listener: bad options");
    ctl_listener *l = calloc(1, sizeof *l);
    if (!l || !(l->rbuf = malloc(READ_CHUNK)) || !(l->pfds = calloc(2, sizeof *l->pfds))) {
        ctl_listener_close(l);
        return ect_set_error(ECT_ENOMEM, "control listener: out of memory");
    }
    l->o = *o;
    l->fd = -1;
    l->watch_fd = -1;
    if (!l->o.handshake_ms) l->o.handshake_ms = CTL_LISTENER_HANDSHAKE_MS;
    if (!l->o.max_conns) l->o.max_conns = CTL_LISTENER_MAX_CONNS;
    if (!l->o.what) l->o.what = "control server";
    int rc = bind_listen(l);
    if (rc) ECT_RETURN_AFTER(rc, ctl_listener_close(l));
    l->o.ip = NULL; /* borrowed: not needed past the bind */
    *out = l;
    return 0;
}

static void conn_free(lconn *c) {
    if (c->fd >= 0) close(c->fd);
    zmtp_conn_free(c->z);
    free(c);
}

void ctl_listener_close(ctl_listener *l) {
    if (!l) return;
    for (size_t i = 0; i < l->n; i++) conn_free(l->conns[i]);
    if (l->fd >= 0) close(l->fd);
    free(l->conns);
    free(l->pfds);
    free(l->rbuf);
    free(l);
}

int ctl_listener_port(const ctl_listener *l) { return l->port; }
size_t ctl_listener_conns(const ctl_listener *l) { return l->n; }
void ctl_listener_watch(ctl_listener *l, int fd) { l->watch_fd = fd; }

/* ---------------------------------------------------------- connections */

static void conn_drop(lconn *c, const char *why) {
    ECT_LOGD(MOD, "connection from %s closed: %s", c->peer[0] ? c->peer : "?", why);
    close(c->fd);
    c->fd = -1;
}

/* Writes what the codec has queued until the socket is full. -1: a socket
 * error (the connection is to be closed). */
static int flush_out(lconn *c) {
    size_t len;
    const uint8_t *p;
    while ((p = zmtp_conn_out(c->z, &len)) != NULL && len > 0) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            zmtp_conn_sent(c->z, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : -1;
    }
    return 0;
}

static size_t out_bytes(const lconn *c) {
    size_t len = 0;
    return zmtp_conn_out(c->z, &len) != NULL ? len : 0;
}

static bool out_waiting(const lconn *c) { return out_bytes(c) > 0; }

/* Reads up to READ_BUDGET bytes into the codec. -1: close (a socket error,
 * or bytes the codec refused). EOF sets c->eof. */
static int read_in(ctl_listener *l, lconn *c) {
    size_t total = 0;
    while (total < READ_BUDGET) {
        ssize_t n = recv(c->fd, l->rbuf, READ_CHUNK, 0);
        if (n == 0) {
            c->eof = true;
            break;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            c->eof = true; /* a reset: the peer is gone, what came whole still counts */
            break;
        }
        if (zmtp_conn_feed(c->z, l->rbuf, (size_t)n) != 0) {
            conn_drop(c, ect_last_error());
            return -1;
        }
        c->pending = true;
        total += (size_t)n;
        if ((size_t)n < READ_CHUNK) break; /* the socket is most likely drained */
    }
    return 0;
}

/* The codec's next whole message into *m: 1, 0 when none is whole yet
 * (c->pending says whether one was), -1 when the codec refused what came
 * (the connection is dropped). */
static int next_msg(lconn *c, zmtp_msg *m) {
    int rc = zmtp_conn_next(c->z, m);
    if (rc < 0) {
        conn_drop(c, ect_last_error());
        return -1;
    }
    c->pending = rc == 1;
    return rc;
}

/* Answers the codec's next whole request, if any. -1: close. */
static int answer_one(ctl_listener *l, lconn *c) {
    zmtp_msg m;
    int rc = next_msg(c, &m);
    if (rc <= 0) return rc;
    char *owned = NULL;
    const char *reply = l->o.fn(l->o.ctx, c->peer, m.body, m.body_len, m.multi, &owned);
    rc = zmtp_conn_send_rep(c->z, m.envelope, m.envelope_len, reply, strlen(reply));
    free(owned);
    if (rc) {
        ECT_LOGW(MOD, "control reply to %s: %s", c->peer, ect_last_error());
        conn_drop(c, "reply not queued");
        return -1;
    }
    return 0;
}

/* ROUTER mode: more replies wait for c than CTL_LISTENER_OUT_PAUSE. */
static bool out_full(const lconn *c) { return out_bytes(c) > CTL_LISTENER_OUT_PAUSE; }

/* ROUTER mode: hands up to CTL_LISTENER_BURST whole messages to on_msg,
 * fewer when replies pile up past CTL_LISTENER_OUT_PAUSE. -1: close. */
static int deliver_some(ctl_listener *l, lconn *c) {
    for (int i = 0; i < CTL_LISTENER_BURST && c->fd >= 0 && !out_full(c); i++) {
        zmtp_msg m;
        int rc = next_msg(c, &m);
        if (rc < 0) return -1;
        if (rc == 0) break;
        l->o.on_msg(l->o.ctx, c->id, c->peer, m.body, m.body_len, m.multi, m.envelope_len > 0);
    }
    return c->fd >= 0 ? 0 : -1;
}

static bool router_mode(const ctl_listener *l) { return l->o.on_msg != NULL; }

/* May c take a request now: REP only when its last reply is out, ROUTER
 * while its replies are under CTL_LISTENER_OUT_PAUSE. */
static bool has_room(const ctl_listener *l, const lconn *c) {
    return router_mode(l) ? !out_full(c) : !out_waiting(c);
}

/* A whole request waiting, and room to take it: REP answers one, ROUTER
 * hands on a burst. -1: closed. */
static int take_requests(ctl_listener *l, lconn *c) {
    if (!c->pending || !has_room(l, c)) return 0;
    return router_mode(l) ? deliver_some(l, c) : answer_one(l, c);
}

/* One connection's turn in a pass. */
static void serve_conn(ctl_listener *l, lconn *c, short revents, uint64_t now) {
    if (c->fd < 0) return; /* closed by ctl_listener_send since the poll */
    if (revents & POLLNVAL) {
        conn_drop(c, "not a socket");
        return;
    }
    if ((revents & POLLOUT) && flush_out(c) < 0) c->eof = true;
    bool full = out_waiting(c); /* the socket took not all: no second write this pass */
    if ((revents & (POLLIN | POLLHUP | POLLERR)) && read_in(l, c) < 0) return;
    if (c->eof) { /* the peer is gone: whole requests still count, replies go nowhere */
        size_t len;
        if (zmtp_conn_out(c->z, &len) && len) zmtp_conn_sent(c->z, len);
    }
    if (take_requests(l, c) < 0) return;
    if (!c->eof && !full && flush_out(c) < 0) c->eof = true; /* the peer is gone: as a reset */
    if (c->eof && !c->pending) {
        conn_drop(c, "peer closed");
        return;
    }
    if (c->deadline && zmtp_conn_ready(c->z)) c->deadline = 0;
    if (c->deadline && now >= c->deadline) conn_drop(c, "no ZMTP handshake in time");
}

/* ------------------------------------------------------------ accepting */

static int grow(ctl_listener *l) {
    if (l->n < l->cap) return 0;
    size_t cap = l->cap ? l->cap * 2 : 16;
    lconn **c = realloc(l->conns, cap * sizeof *c);
    if (!c) return -1;
    l->conns = c;
    struct pollfd *p = realloc(l->pfds, (cap + 2) * sizeof *p);
    if (!p) return -1;
    l->pfds = p;
    l->cap = cap;
    return 0;
}

/* The peer's address as libzmq's "Peer-Address" gives it. */
static void peer_text(int fd, char *out, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    out[0] = 0;
    if (getpeername(fd, (struct sockaddr *)&ss, &len) != 0) return;
    if (getnameinfo((struct sockaddr *)&ss, len, out, (socklen_t)cap, NULL, 0, NI_NUMERICHOST))
        out[0] = 0;
}

static void refuse_over_bound(ctl_listener *l, int fd, uint64_t now) {
    close(fd);
    l->refused++;
    if (now - l->refused_logged_ms < WARN_EVERY_MS) return;
    ECT_LOGW(MOD, "%s port %d: %d connections open, %" PRIu64 " more refused", l->o.what, l->port,
             l->o.max_conns, l->refused);
    l->refused = 0;
    l->refused_logged_ms = now;
}

static void adopt(ctl_listener *l, int fd, uint64_t now) {
    lconn *c = calloc(1, sizeof *c);
    zmtp_role role = router_mode(l) ? ZMTP_ROUTER : ZMTP_REP;
    if (!c || grow(l) != 0 || zmtp_conn_new(role, l->o.max_msg, &c->z) != 0) {
        ECT_LOGW(MOD, "%s port %d: connection refused: out of memory", l->o.what, l->port);
        free(c);
        close(fd);
        return;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->id = ++l->next_id;
    c->deadline = now + (uint64_t)l->o.handshake_ms;
    peer_text(fd, c->peer, sizeof c->peer);
    l->conns[l->n++] = c;
    if (flush_out(c) < 0) conn_drop(c, "write failed"); /* our greeting, at once */
}

static void accept_new(ctl_listener *l, uint64_t now) {
    for (int i = 0; i < ACCEPTS_PER_PASS; i++) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                ECT_LOGW(MOD, "%s port %d: accept: %s", l->o.what, l->port, strerror(errno));
                l->accept_paused_until = now + ACCEPT_PAUSE_MS;
            }
            return; /* EAGAIN, or a connection that died in the backlog */
        }
        if (l->n >= (size_t)l->o.max_conns)
            refuse_over_bound(l, fd, now);
        else
            adopt(l, fd, now);
    }
}

/* ----------------------------------------------------------------- pass */

static short wanted(const ctl_listener *l, const lconn *c) {
    short ev = 0;
    if (!c->eof && !c->pending && has_room(l, c)) ev |= POLLIN;
    if (!c->eof && out_waiting(c)) ev |= POLLOUT;
    return ev;
}

/* Fills l->pfds ([0] the listener, [1] the watched fd, [i + 2] connection
 * i) and returns how
 * long poll may sleep: 0 when a request is waiting, else up to the nearest
 * handshake deadline, else timeout_ms. */
static int build_poll(ctl_listener *l, int timeout_ms, uint64_t now) {
    l->pfds[0] =
        (struct pollfd){.fd = now >= l->accept_paused_until ? l->fd : -1, .events = POLLIN};
    l->pfds[1] = (struct pollfd){.fd = l->watch_fd, .events = POLLIN};
    int wait = timeout_ms;
    for (size_t i = 0; i < l->n; i++) {
        const lconn *c = l->conns[i];
        l->pfds[i + 2] = (struct pollfd){.fd = c->fd, .events = wanted(l, c)};
        if ((c->pending && has_room(l, c)) || c->eof) wait = 0; /* else: POLLOUT first */
        if (c->deadline) {
            uint64_t left = c->deadline > now ? c->deadline - now : 0;
            if (left < (uint64_t)wait) wait = (int)left;
        }
    }
    if (l->accept_paused_until > now && l->accept_paused_until - now < (uint64_t)wait)
        wait = (int)(l->accept_paused_until - now);
    return wait;
}

static void remove_closed(ctl_listener *l) {
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (l->conns[i]->fd < 0)
            conn_free(l->conns[i]);
        else
            l->conns[k++] = l->conns[i];
    }
    l->n = k;
}

bool ctl_listener_pass(ctl_listener *l, int timeout_ms) {
    uint64_t now = ect_now_ms();
    int wait = build_poll(l, timeout_ms, now);
    size_t n = l->n;
    if (l->o.lock) pthread_mutex_unlock(l->o.lock); /* others may send while we sleep */
    int rc = poll(l->pfds, n + 2, wait);
    if (l->o.lock) pthread_mutex_lock(l->o.lock);
    if (rc < 0 && errno != EINTR) ECT_LOGW(MOD, "%s poll: %s", l->o.what, strerror(errno));
    if (rc < 0) return false;
    now = ect_now_ms();
    for (size_t i = 0; i < n; i++) serve_conn(l, l->conns[i], l->pfds[i + 2].revents, now);
    remove_closed(l); /* before accepting: closed ones leave room under the bound */
    if (l->pfds[0].revents & POLLIN) accept_new(l, now);
    return l->watch_fd >= 0 && (l->pfds[1].revents & POLLIN);
}

/* ------------------------------------------------------- ROUTER replies */

static lconn *find_conn(ctl_listener *l, uint64_t id) {
    for (size_t i = 0; i < l->n; i++)
        if (l->conns[i]->id == id && l->conns[i]->fd >= 0) return l->conns[i];
    return NULL;
}

int ctl_listener_send(ctl_listener *l, uint64_t conn, bool delim, const void *body, size_t len) {
    if (!router_mode(l)) return ect_set_error(ECT_EINVAL, "ctl_listener_send: not a ROUTER");
    lconn *c = find_conn(l, conn);
    if (!c || c->eof) return ect_set_error(ECT_ENOTFOUND, "the peer's connection is gone");
    static const uint8_t delim_frame[2] = {1, 0}; /* MORE, empty: a REQ peer's delimiter */
    int rc = zmtp_conn_send_rep(c->z, delim_frame, delim ? sizeof delim_frame : 0, body, len);
    if (rc) {
        conn_drop(c, "reply not queued");
        return rc;
    }
    return 0;
}

bool ctl_listener_flush(ctl_listener *l) {
    bool left = false;
    for (size_t i = 0; i < l->n; i++) {
        lconn *c = l->conns[i];
        if (c->fd < 0 || c->eof || !out_waiting(c)) continue;
        if (flush_out(c) < 0)
            c->eof = true; /* the peer is gone: the next pass closes it */
        else
            left = left || out_waiting(c);
    }
    return left;
}
