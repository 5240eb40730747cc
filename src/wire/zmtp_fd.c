/*
 * zmtp_fd — see zmtp.h: moving a zmtp_conn's bytes through a connected
 * non-blocking stream socket. The codec itself (zmtp.c) stays sans-I/O;
 * these two loops are what every client that owns a socket wrote the same.
 */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "util/util.h"
#include "wire/zmtp.h"

int zmtp_fd_flush(zmtp_conn *c, int fd) {
    size_t n;
    const uint8_t *p;
    while ((p = zmtp_conn_out(c, &n)) != NULL && n > 0) {
        ssize_t w = send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            zmtp_conn_sent(c, (size_t)w);
        } else if (w < 0 && errno == EINTR) {
            continue;
        } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else {
            ect_set_errno(w < 0 ? errno : EPIPE, "send");
            return ZMTP_FD_LOST;
        }
    }
    return 0;
}

int zmtp_fd_fill(zmtp_conn *c, int fd, uint8_t *buf, size_t cap, bool *heard) {
    for (;;) {
        ssize_t r = recv(fd, buf, cap, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        if (r <= 0) {
            if (r == 0)
                ect_set_error(ECT_ECLOSED, "the peer closed the connection");
            else
                ect_set_errno(errno, "receive");
            return ZMTP_FD_LOST;
        }
        if (heard) *heard = true;
        int rc = zmtp_conn_feed(c, buf, (size_t)r);
        if (rc) return rc;
        if ((size_t)r < cap) return 0; /* drained: spare the EAGAIN */
    }
}

int zmtp_fd_resolve(const char *who, const char *host, int port, struct addrinfo **out) {
    char unwrapped[256], ps[16];
    const char *h = host;
    size_t hl = strlen(h);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']' && hl - 2 < sizeof unwrapped) {
        memcpy(unwrapped, h + 1, hl - 2);
        unwrapped[hl - 2] = '\0';
        h = unwrapped;
    }
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    *out = NULL;
    int g = getaddrinfo(h, ps, &hints, out);
    if (g == 0 && *out) return 0;
    if (*out) freeaddrinfo(*out);
    *out = NULL;
    return ect_set_error(ECT_EINVAL, "%s: cannot resolve host '%.100s': %s", who, h,
                         g ? gai_strerror(g) : "no address");
}
