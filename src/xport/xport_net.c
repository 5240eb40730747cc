/*
 * xport_net — socket plumbing shared by the back ends: HOST:PORT parsing,
 * connect with a timeout, listen, exact send/receive with a progress timeout,
 * and a small connection server (one accept thread, one thread per
 * connection). Connection threads are expected to be few (one per peer
 * connection), so a thread each keeps the receive path a plain blocking loop
 * that reads straight into its destination; the server caps them (in total
 * and per peer address) so a flood of connections costs a bounded number of
 * threads and descriptors.
 */
#include <pthread.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>
#include <fcntl.h>

#include "util/hostport.h"
#include "util/util.h"
#include "xport/xport.h"

int xp_parse_hostport(const char *what, const char *s, char *host, size_t cap, int *port) {
    return ect_hostport_parse(what, s, 0, 65535, host, cap, port);
}

static int resolve(const char *host, int port, bool passive, struct addrinfo **res) {
    struct addrinfo hints = {0};
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    int g = getaddrinfo(host, ps, &hints, res);
    if (g != 0)
        return ect_set_error(ECT_EINVAL, "cannot resolve host '%.100s': %s", host, gai_strerror(g));
    return 0;
}

int xp_tcp_connect(const char *host, int port, int timeout_ms, int *out) {
    struct addrinfo *res, *ai;
    int rc = resolve(host, port, false, &res);
    if (rc) return rc;
    rc = ect_set_error(ECT_ECONNREFUSED, "no address for %s:%d", host, port);
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            rc = ect_set_errno(errno, "socket");
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
            rc = ect_set_error(ECT_ECONNREFUSED, "connect to %s:%d: %s", host, port,
                               strerror(errno));
            close(fd);
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int pr;
        do pr = poll(&p, 1, timeout_ms);
        while (pr < 0 && errno == EINTR);
        if (pr == 0) {
            rc = ect_set_error(ECT_ETIMEDOUT, "connect to %s:%d timed out after %d ms", host, port,
                               timeout_ms);
            close(fd);
            continue;
        }
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (pr < 0 || err) {
            rc = ect_set_error(ECT_ECONNREFUSED, "connect to %s:%d: %s", host, port,
                               strerror(pr < 0 ? errno : err));
            close(fd);
            continue;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        *out = fd;
        rc = 0;
        break;
    }
    freeaddrinfo(res);
    return rc;
}

int xp_tcp_listen(const char *host, int port, int *out, int *port_out) {
    struct addrinfo *res, *ai;
    int rc = resolve(host, port, true, &res);
    if (rc) return rc;
    rc = ect_set_error(ECT_EINVAL, "no address for %s:%d", host, port);
    for (ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            rc = ect_set_errno(errno, "socket");
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
            rc = ect_set_errno(errno, "listen on %s:%d", host, port);
            close(fd);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                   : ((struct sockaddr_in *)&ss)->sin_port);
        *out = fd;
        rc = 0;
        break;
    }
    freeaddrinfo(res);
    return rc;
}

static int wait_fd(int fd, short ev, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = ev};
    int pr;
    do pr = poll(&p, 1, timeout_ms);
    while (pr < 0 && errno == EINTR);
    if (pr == 0) return ect_set_error(ECT_ETIMEDOUT, "no progress for %d ms", timeout_ms);
    if (pr < 0) return ect_set_errno(errno, "poll");
    return 0;
}

int xp_send_all(int fd, const void *buf, size_t len, int timeout_ms) {
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
        } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int rc = wait_fd(fd, POLLOUT, timeout_ms);
            if (rc) return rc;
        } else if (k < 0 && errno == EINTR) {
            continue;
        } else {
            return ect_set_error(ECT_ECLOSED, "send: %s", strerror(errno));
        }
    }
    return 0;
}

int xp_recv_all(int fd, void *buf, size_t len, int timeout_ms) {
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t k = recv(fd, p, len, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            len -= (size_t)k;
        } else if (k == 0) {
            return ect_set_error(ECT_ECLOSED, "peer closed the connection");
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int rc = wait_fd(fd, POLLIN, timeout_ms);
            if (rc) return rc;
        } else if (errno != EINTR) {
            return ect_set_error(ECT_ECLOSED, "recv: %s", strerror(errno));
        }
    }
    return 0;
}

/* ---- connection server */

typedef struct xp_conn {
    struct xp_server *srv;
    pthread_t th;
    int fd;
    bool done;        /* guarded by srv->mu */
    uint8_t peer[16]; /* the peer's IP address (v4 mapped into 16 bytes); */
    bool has_peer;    /* false for a unix-socket peer */
    struct xp_conn *next;
} xp_conn;

struct xp_server {
    int lfd;
    int stopfd; /* eventfd, readable once stopping */
    xp_conn_fn fn;
    void *ctx;
    pthread_t th;
    pthread_mutex_t mu;
    xp_conn *conns;
    bool stopping;
    int max_conns, max_per_peer;
    atomic_uint_fast64_t refused;
};

void xp_log_limited(_Atomic uint64_t *last_ms, const char *fmt, ...) {
    uint64_t now = ect_now_ms(), last = atomic_load(last_ms);
    if (last && now - last < 1000) return;
    if (!atomic_compare_exchange_strong(last_ms, &last, now)) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ECT_LOGW("xport", "%s", buf);
}

uint64_t xp_server_refused(xp_server *s) { return s ? atomic_load(&s->refused) : 0; }

/* The peer's IP address as 16 bytes (IPv4 as ::ffff:a.b.c.d); false for a
 * unix socket or an unknown family. */
static bool peer_ip(const struct sockaddr_storage *ss, uint8_t ip[16]) {
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        memset(ip, 0, 10);
        ip[10] = ip[11] = 0xff;
        memcpy(ip + 12, &a->sin_addr, 4);
        return true;
    }
    if (ss->ss_family == AF_INET6) {
        memcpy(ip, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
        return true;
    }
    return false;
}

static void *conn_main(void *arg) {
    xp_conn *c = arg;
    c->srv->fn(c->srv->ctx, c->fd, c->srv->stopfd);
    pthread_mutex_lock(&c->srv->mu);
    c->done = true;
    pthread_mutex_unlock(&c->srv->mu);
    return NULL;
}

/* Joins and frees connection threads that have finished. */
static void reap(xp_server *s, bool all) {
    for (;;) {
        xp_conn *hit = NULL, **pp;
        pthread_mutex_lock(&s->mu);
        for (pp = &s->conns; *pp; pp = &(*pp)->next) {
            if ((*pp)->done || all) {
                hit = *pp;
                *pp = hit->next;
                break;
            }
        }
        pthread_mutex_unlock(&s->mu);
        if (!hit) return;
        pthread_join(hit->th, NULL);
        close(hit->fd);
        free(hit);
    }
}

static void *accept_main(void *arg) {
    xp_server *s = arg;
    pthread_setname_np(pthread_self(), "ect-xp-accept");
    struct pollfd p[2] = {{.fd = s->lfd, .events = POLLIN}, {.fd = s->stopfd, .events = POLLIN}};
    for (;;) {
        int pr = poll(p, 2, 1000);
        if (pr < 0 && errno != EINTR) break;
        if (p[1].revents) break;
        reap(s, false);
        if (pr <= 0 || !(p[0].revents & POLLIN)) continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                static _Atomic uint64_t emfile_log;
                xp_log_limited(&emfile_log,
                               "transport target: out of file descriptors on accept (%s); "
                               "backing off, existing connections keep being served",
                               strerror(errno));
                usleep(10000);
            }
            continue;
        }
        /* Acks and small frames go out at once: with Nagle on, an ack can sit
         * behind a delayed ACK of the peer (40 ms class stalls). Harmless on
         * a unix-domain socket, where the call fails. */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        xp_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->srv = s;
        c->fd = fd;
        c->has_peer = peer_ip(&ss, c->peer);
        pthread_mutex_lock(&s->mu);
        bool stop = s->stopping;
        int total = 0, same = 0;
        for (xp_conn *o = s->conns; o; o = o->next) {
            if (o->done) continue;
            total++;
            if (c->has_peer && o->has_peer && memcmp(o->peer, c->peer, 16) == 0) same++;
        }
        bool over = total >= s->max_conns || (c->has_peer && same >= s->max_per_peer);
        if (over && !stop) {
            pthread_mutex_unlock(&s->mu);
            atomic_fetch_add(&s->refused, 1);
            static _Atomic uint64_t cap_log;
            xp_log_limited(&cap_log,
                           "transport target: connection refused: %d connections open (cap %d), "
                           "%d from this peer (cap %d); %" PRIu64 " refused so far",
                           total, s->max_conns, same, s->max_per_peer,
                           (uint64_t)atomic_load(&s->refused));
            close(fd);
            free(c);
            continue;
        }
        if (!stop && pthread_create(&c->th, NULL, conn_main, c) == 0) {
            c->next = s->conns;
            s->conns = c;
            c = NULL;
        }
        pthread_mutex_unlock(&s->mu);
        if (c) {
            ECT_LOGW("xport", "cannot start a connection thread; dropping the connection");
            close(fd);
            free(c);
        }
    }
    return NULL;
}

int xp_server_start(int lfd, xp_conn_fn fn, void *ctx, int max_conns, int max_per_peer,
                    xp_server **out) {
    *out = NULL;
    xp_server *s = calloc(1, sizeof *s);
    if (!s) {
        close(lfd);
        return ect_set_error(ECT_ENOMEM, "server");
    }
    s->lfd = lfd;
    s->fn = fn;
    s->ctx = ctx;
    s->max_conns = max_conns > 0 ? max_conns : 512;
    s->max_per_peer = max_per_peer > 0 ? max_per_peer : s->max_conns;
    s->stopfd = eventfd(0, EFD_CLOEXEC);
    pthread_mutex_init(&s->mu, NULL);
    if (s->stopfd < 0 || pthread_create(&s->th, NULL, accept_main, s) != 0) {
        int rc = ect_set_error(ECT_ENOMEM, "cannot start the transport's accept thread");
        if (s->stopfd >= 0) close(s->stopfd);
        close(lfd);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void xp_server_stop(xp_server *s) {
    if (!s) return;
    uint64_t one = 1;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    for (xp_conn *c = s->conns; c; c = c->next) shutdown(c->fd, SHUT_RDWR);
    pthread_mutex_unlock(&s->mu);
    if (write(s->stopfd, &one, sizeof one) < 0) ECT_LOGW("xport", "eventfd write failed");
    pthread_join(s->th, NULL);
    reap(s, true);
    close(s->lfd);
    close(s->stopfd);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

void xp_peer_name(int fd, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0) {
        snprintf(buf, cap, "a peer");
    } else if (ss.ss_family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
        snprintf(buf, cap, "%s:%u", host, ntohs(a->sin_port));
    } else if (ss.ss_family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
        snprintf(buf, cap, "[%s]:%u", host, ntohs(a->sin6_port));
    } else {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0)
            snprintf(buf, cap, "the unix-socket peer pid %d", (int)cr.pid);
        else
            snprintf(buf, cap, "a unix-socket peer");
    }
}
