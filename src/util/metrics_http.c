/*
 * metrics_http — ect_metrics_serve: a tiny HTTP/1.0-1.1 server on its own
 * thread answering GET /metrics with ect_metrics_text(). It is the one piece
 * of util that does I/O; it lives here because it serves the registry and
 * nothing else.
 *
 * One connection at a time, each closed after its answer (Connection:
 * close), which is all a scraper needs. A request head is read for at most
 * 2 s and HTTP_MAX_REQUEST bytes; what does not parse gets 400, another
 * path 404, another method 405. A self-pipe wakes the thread for close, so
 * closing never waits for a poll timeout.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <netinet/in.h>

#include "util/httpreq.h"
#include "util/util.h"

#define MOD "metrics"
#define READ_DEADLINE_MS 2000

struct ect_metrics_server {
    int fd, wake[2], port;
    pthread_t thr;
    bool started;
};

static void send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return;
        p += w;
        n -= (size_t)w;
    }
}

static void answer(int fd, int code, const char *reason, const char *ctype, const char *body,
                   bool head_only) {
    char hdr[256];
    size_t blen = body ? strlen(body) : 0;
    int n = snprintf(hdr, sizeof hdr,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     code, reason, ctype, blen);
    send_all(fd, hdr, (size_t)n);
    if (!head_only && blen) send_all(fd, body, blen);
}

static void serve_conn(int fd) {
    char buf[HTTP_MAX_REQUEST];
    size_t len = 0;
    uint64_t deadline = ect_now_ms() + READ_DEADLINE_MS;
    http_request req;
    http_parse_rc rc = HTTP_INCOMPLETE;
    while (rc == HTTP_INCOMPLETE) {
        uint64_t now = ect_now_ms();
        if (now >= deadline) return; /* a silent client: drop it */
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, (int)(deadline - now));
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) return;
        ssize_t r = recv(fd, buf + len, sizeof buf - len, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return;
        len += (size_t)r;
        rc = http_parse_request(buf, len, &req);
    }
    const char *tp = "text/plain; charset=utf-8";
    if (rc != HTTP_DONE) {
        char body[160];
        snprintf(body, sizeof body, "bad request: %s\n", req.why);
        answer(fd, 400, "Bad Request", tp, body, false);
        return;
    }
    if (strcmp(req.path, "/metrics") != 0) {
        answer(fd, 404, "Not Found", tp, "not found: the metrics are at /metrics\n", false);
        return;
    }
    bool head = strcmp(req.method, "HEAD") == 0;
    if (!head && strcmp(req.method, "GET") != 0) {
        answer(fd, 405, "Method Not Allowed", tp, "only GET and HEAD\n", false);
        return;
    }
    char *text = ect_metrics_text();
    if (!text) {
        answer(fd, 500, "Internal Server Error", tp, "out of memory\n", false);
        return;
    }
    answer(fd, 200, "OK", "text/plain; version=0.0.4; charset=utf-8", text, head);
    free(text);
}

static void *server_main(void *arg) {
    ect_metrics_server *m = arg;
    pthread_setname_np(pthread_self(), "ect-metrics");
    for (;;) {
        struct pollfd pf[2] = {{.fd = m->fd, .events = POLLIN},
                               {.fd = m->wake[0], .events = POLLIN}};
        int pr = poll(pf, 2, -1);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0 || (pf[1].revents & (POLLIN | POLLHUP))) break;
        if (!(pf[0].revents & POLLIN)) continue;
        int c = accept4(m->fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) continue;
        serve_conn(c);
        shutdown(c, SHUT_WR);
        close(c);
    }
    return NULL;
}

int ect_metrics_serve(const char *host, int port, ect_metrics_server **out) {
    if (out) *out = NULL;
    if (!host || !*host || !out)
        return ect_set_error(ECT_EINVAL, "metrics server: host and out required");
    if (port < 0 || port > 65535)
        return ect_set_error(ECT_EINVAL, "metrics server: port %d: must be 0..65535", port);
    const char *h = strcmp(host, "*") == 0 ? NULL : host;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *ai = NULL;
    int g = getaddrinfo(h, ps, &hints, &ai);
    if (g) return ect_set_error(ECT_EINVAL, "metrics server: host '%s': %s", host, gai_strerror(g));
    ect_metrics_server *m = calloc(1, sizeof *m);
    if (!m) {
        freeaddrinfo(ai);
        return ect_set_error(ECT_ENOMEM, "metrics server: out of memory");
    }
    m->fd = m->wake[0] = m->wake[1] = -1;
    int rc = 0, e = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            e = errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 16) == 0) {
            m->fd = fd;
            break;
        }
        e = errno;
        close(fd);
    }
    freeaddrinfo(ai);
    if (m->fd < 0) {
        if (e == EADDRINUSE)
            rc = ect_set_error(ECT_EEXIST, "metrics server: %s:%d: address in use", host, port);
        else
            rc = ect_set_errno(e, "metrics server: bind %s:%d", host, port);
        goto fail;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(m->fd, (struct sockaddr *)&ss, &sl) != 0) {
        rc = ect_set_errno(errno, "metrics server: getsockname");
        goto fail;
    }
    m->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (pipe2(m->wake, O_CLOEXEC) != 0) {
        rc = ect_set_errno(errno, "metrics server: pipe");
        goto fail;
    }
    if (pthread_create(&m->thr, NULL, server_main, m) != 0) {
        rc = ect_set_error(ECT_EIO, "metrics server: cannot start its thread");
        goto fail;
    }
    m->started = true;
    *out = m;
    return 0;
fail:
    ECT_RETURN_AFTER(rc, ect_metrics_server_close(m));
}

int ect_metrics_server_port(const ect_metrics_server *m) { return m ? m->port : 0; }

void ect_metrics_server_close(ect_metrics_server *m) {
    if (!m) return;
    if (m->started) {
        if (m->wake[1] >= 0) {
            ssize_t w = write(m->wake[1], "x", 1);
            (void)w;
        }
        pthread_join(m->thr, NULL);
    }
    if (m->fd >= 0) close(m->fd);
    if (m->wake[0] >= 0) close(m->wake[0]);
    if (m->wake[1] >= 0) close(m->wake[1]);
    free(m);
}
