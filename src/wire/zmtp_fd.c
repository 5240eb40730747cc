/*
 * zmtp_fd — see zmtp.h: moving a zmtp_conn's bytes through a connected
 * non-blocking stream socket. The codec itself (zmtp.c) stays sans-I/O;
 * these two loops are what every client that owns a socket wrote the same.
 */
#include <errno.h>
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
