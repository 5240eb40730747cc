/*
 * shm — the same-host transport (wire format: docs/PROTOCOL.md "shm"). This
 * file: messaging on the sockets, the process token and the back end's
 * table. The target is shm_target.c, the initiator shm_initiator.c, the
 * messages shm_wire.c and the initiator's connection cache conncache.c.
 *
 * The target listens on an abstract unix SOCK_SEQPACKET socket (the session
 * is "shm:@NAME"; abstract names vanish with the process, so a crash leaves
 * nothing to unlink) and accepts only peers of its own uid, which is what
 * mode 0600 on a file would give. One message per send; a region's fd
 * travels with SCM_RIGHTS. Host regions must be backed by an fd (memfd or
 * /dev/shm); CUDA device regions travel as IPC handles instead.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/util.h"
#include "xport/shm.h"

int shm_make_addr(const char *name, struct sockaddr_un *sa, socklen_t *len) {
    size_t nl = strlen(name);
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if (nl == 0 || nl + 1 > sizeof sa->sun_path)
        return ect_set_error(ECT_EINVAL, "shm session name '%.60s' is empty or too long", name);
    memcpy(sa->sun_path + 1, name, nl); /* sun_path[0] = 0: abstract namespace */
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    return 0;
}

bool shm_same_uid(int fd) {
    struct ucred cr;
    socklen_t l = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0) return 0;
    return cr.uid == getuid();
}

int shm_msg_send(int fd, const void *buf, size_t len, const int *fds, int nfds, int timeout_ms) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    union {
        char b[CMSG_SPACE(sizeof(int) * SHM_CHUNK)];
        struct cmsghdr align;
    } cb;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        memset(&cb, 0, sizeof cb);
        m.msg_control = cb.b;
        m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    for (;;) {
        ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k == (ssize_t)len) return 0;
        if (k >= 0) return ect_set_error(ECT_EIO, "shm: short message send");
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return ect_set_error(ECT_ECLOSED, "shm: send: %s", strerror(errno));
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int pr = poll(&p, 1, timeout_ms);
        if (pr == 0)
            return ect_set_error(ECT_ETIMEDOUT, "shm: peer not reading for %d ms", timeout_ms);
    }
}

/* Blocking recvmsg, no poll: one system call per message on the latency
 * path. With MSG_DONTWAIT in flags, 1 when nothing is queued. */
static int msg_recv(int fd, void *buf, size_t cap, size_t *len, int *fds, int maxfds, int *nfds,
                    int flags, bool wait_forever, int timeout_ms) {
    union {
        char b[CMSG_SPACE(sizeof(int) * SHM_CHUNK)];
        struct cmsghdr align;
    } cb;
    if (nfds) *nfds = 0;
    for (;;) {
        struct iovec iov = {.iov_base = buf, .iov_len = cap};
        struct msghdr m = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
        ssize_t k = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | flags);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && (flags & MSG_DONTWAIT)) return 1;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_forever) continue;
            return ect_set_error(ECT_ETIMEDOUT, "shm: no answer for %d ms", timeout_ms);
        }
        if (k <= 0) return ect_set_error(ECT_ECLOSED, "shm: peer closed the connection");
        /* Collect passed fds; any beyond what the caller takes are closed. */
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int cnt = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < cnt; i++) {
                int f;
                memcpy(&f, CMSG_DATA(c) + sizeof(int) * (size_t)i, sizeof f);
                if (nfds && *nfds < maxfds)
                    fds[(*nfds)++] = f;
                else
                    close(f);
            }
        }
        if (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
            for (int i = 0; nfds && i < *nfds; i++) close(fds[i]);
            if (nfds) *nfds = 0;
            return ect_set_error(ECT_EPROTO, "shm: message too long");
        }
        *len = (size_t)k;
        return 0;
    }
}

int shm_msg_recv(int fd, void *buf, size_t cap, size_t *len, int *fds, int maxfds, int *nfds,
                 bool wait_forever, int timeout_ms) {
    return msg_recv(fd, buf, cap, len, fds, maxfds, nfds, 0, wait_forever, timeout_ms);
}

int shm_msg_recv_now(int fd, void *buf, size_t cap, size_t *len, int *fds, int maxfds, int *nfds) {
    return msg_recv(fd, buf, cap, len, fds, maxfds, nfds, MSG_DONTWAIT, false, 0);
}

void shm_set_timeouts(int fd, int timeout_ms) {
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

uint64_t shm_process_token(void) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static uint64_t tok;
    static pid_t at;
    pthread_mutex_lock(&mu);
    if (at != getpid() || !tok) {
        do tok = ect_random_u64();
        while (!tok);
        at = getpid();
    }
    uint64_t t = tok;
    pthread_mutex_unlock(&mu);
    return t;
}

static int shm_open_be(ect_xport *x) {
    char name[80];
    snprintf(name, sizeof name, "ect-%d-%016" PRIx64, (int)getpid(), ect_random_u64());
    shm_impl *s = calloc(1, sizeof *s);
    if (!s) return ect_set_error(ECT_ENOMEM, "shm transport");
    pthread_mutex_init(&s->smu, NULL);
    x->impl = s;
    int rc = shm_target_open(x, s, name);
    if (rc) {
        pthread_mutex_destroy(&s->smu);
        free(s);
        x->impl = NULL;
        return rc;
    }
    xp_cache_init(&s->cache, &shm_conn_ops, 2 * x->opts.conns_per_peer + 8);
    snprintf(x->session, sizeof x->session, "shm:@%s", name);
    return 0;
}

/* Stops the target's threads and drops every cached connection (and with
 * it the connection's mappings). */
static void shm_close(ect_xport *x) {
    shm_impl *s = x->impl;
    xp_server_stop(s->srv);
    xp_cache_fini(&s->cache);
}

/* After close and the last unreg. */
static void shm_destroy(ect_xport *x) {
    shm_impl *s = x->impl;
    pthread_mutex_destroy(&s->smu);
    free(s);
}

const xp_backend xp_shm_backend = {
    .name = "shm",
    .session_prefix = "shm:",
    .device_regions = true,
    .device_sources = true,
    .open = shm_open_be,
    .close = shm_close,
    .reg = shm_target_reg,
    .unreg = shm_target_unreg,
    .destroy = shm_destroy,
    .write_batch = shm_write_batch,
    .offer = shm_target_offer,
    .write_ready = shm_write_ready,
};

int shm_auth_send(void *ctx, const uint8_t *b, size_t n) {
    shm_auth_io *io = ctx;
    return shm_msg_send(io->fd, b, n, NULL, 0, io->timeout_ms);
}

int shm_auth_recv(void *ctx, uint8_t *b, size_t n) {
    shm_auth_io *io = ctx;
    size_t len;
    int rc = shm_msg_recv(io->fd, b, n, &len, NULL, 0, NULL, false, io->timeout_ms);
    if (rc) return rc;
    if (len != n)
        return ect_set_error(ECT_EPROTO,
                             "shm: a %zu-byte message where the handshake's %zu bytes were due "
                             "(a peer without data-plane keys?)",
                             len, n);
    return 0;
}
