/*
 * shm — the same-host transport (wire format: docs/PROTOCOL.md "shm").
 *
 * The target listens on an abstract unix SOCK_SEQPACKET socket (the session
 * is "shm:@NAME"; abstract names vanish with the process, so a crash leaves
 * nothing to unlink) and accepts only peers of its own uid, which is what
 * mode 0600 on a file would give. Regions must be backed by an fd (memfd or
 * /dev/shm): the target passes it with SCM_RIGHTS the first time a
 * connection writes into that region, and the initiator maps it once per
 * connection and keeps the mapping until the target reports the region gone.
 *
 * The target still decides: for each chunk of a batch the initiator asks
 * (BEGIN) and the target checks key and range, takes a reference on the
 * region for each accepted write and answers (GRANT); the initiator copies
 * with memcpy and says DONE (one way); the target drops the references.
 * Unregister therefore waits for copies in progress, exactly as for tcp
 * receives. One round trip per chunk of up to 250 writes.
 *
 * CUDA device regions (same host, GPU to GPU): there is no fd to pass.
 * The target grants such a region with its CUDA IPC handle instead (an
 * entry of the GRANT's IPC trailer, docs/PROTOCOL.md), the initiator opens
 * the handle once per connection (mem/cuda.c counts opens of one handle),
 * and its copies go through the driver: device-to-device from a device
 * source, host-to-device from a host one, waited for before the write
 * counts as landed. The slot and reference protocol is the same. A target
 * in the initiator's own process (the handle carries a per-process token)
 * is written through its device address directly, since the driver refuses
 * to open a handle in the process that exported it.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "mem/cuda.h"
#include "mem/memkind.h"
#include "util/util.h"
#include "xport/shm_wire.h"
#include "xport/xport.h"

#define SHM_SLOTS 1024 /* live regions per target */
#define SHM_SEG_LEN (SHM_SLOTS * 16)

/* One control segment per connection (a memfd the target passes in its
 * hello): per region slot, the region's state ((id << 1) | 1 while
 * registered, 0 after) and the number of copies the initiator has in
 * progress. Both sides use sequentially consistent atomics: the initiator
 * increments `users` then reads `state`; unregister clears `state` then
 * waits for `users` to reach 0, so one of them always sees the other. */
typedef struct shm_slot {
    uint64_t state;
    uint64_t users;
} shm_slot;

/* Target side: a live connection's segment. */
typedef struct shm_seg {
    shm_slot *slots;
    struct shm_seg *next;
} shm_seg;

typedef struct shm_map {
    uint64_t rid;   /* target's region id */
    uint64_t token; /* its key */
    uint32_t slot;  /* its slot in the control segment */
    uint8_t *base;  /* mapping of the region (starts page-aligned before it); NULL for CUDA */
    size_t maplen;
    int kind;       /* ECT_MEM_CUDA: start is a device address (copies through the driver) */
    int dev;        /* device the copies run on */
    void *ipc_base; /* the opened IPC allocation (cuda_ipc_close), or NULL */
    uint8_t *start; /* the region's first byte */
    uint64_t raddr, rlen;
    UT_hash_handle hh;     /* by rid */
    UT_hash_handle hh_tok; /* by token */
} shm_map;

typedef struct shm_conn {
    int fd;
    shm_slot *seg; /* the target's control segment for this connection */
    shm_map *maps; /* this connection's mappings, by region id */
    shm_map *by_tok;
    struct shm_conn *next;
} shm_conn;

typedef struct shm_peer {
    char session[300];
    struct sockaddr_un sa;
    socklen_t salen;
    shm_conn *idle; /* guarded by shm_impl.mu */
    int nidle;
    UT_hash_handle hh;
} shm_peer;

typedef struct shm_impl {
    xp_server *srv;
    pthread_mutex_t mu; /* guards peers and idle lists; never held across I/O */
    shm_peer *peers;
    pthread_mutex_t smu; /* guards segs and slot_state (target side) */
    shm_seg *segs;
    uint64_t slot_state[SHM_SLOTS]; /* master copy of every segment's states */
} shm_impl;

static int make_addr(const char *name, struct sockaddr_un *sa, socklen_t *len) {
    size_t nl = strlen(name);
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if (nl == 0 || nl + 1 > sizeof sa->sun_path)
        return ect_set_error(ECT_EINVAL, "shm session name '%.60s' is empty or too long", name);
    memcpy(sa->sun_path + 1, name, nl); /* sun_path[0] = 0: abstract namespace */
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + nl);
    return 0;
}

static int same_uid(int fd) {
    struct ucred cr;
    socklen_t l = sizeof cr;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0) return 0;
    return cr.uid == getuid();
}

/* Sends one message, waiting for room at most timeout_ms. */
static int msg_send(int fd, const void *buf, size_t len, const int *fds, int nfds, int timeout_ms) {
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

/* Receives one message (and up to maxfds fds); *len gets its size. The
 * socket has SO_RCVTIMEO = timeout_ms (set_timeouts): with wait_forever the
 * call keeps waiting (the server's stop shuts the socket down, which ends
 * it), else it fails with ECT_ETIMEDOUT. Blocking recvmsg, no poll: one
 * system call per message on the latency path. */
static int msg_recv(int fd, void *buf, size_t cap, size_t *len, int *fds, int maxfds, int *nfds,
                    bool wait_forever, int timeout_ms) {
    union {
        char b[CMSG_SPACE(sizeof(int) * SHM_CHUNK)];
        struct cmsghdr align;
    } cb;
    if (nfds) *nfds = 0;
    for (;;) {
        struct iovec iov = {.iov_base = buf, .iov_len = cap};
        struct msghdr m = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof cb.b};
        ssize_t k = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
        if (k < 0 && errno == EINTR) continue;
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

static void set_timeouts(int fd, int timeout_ms) {
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* ------------------------------------------------------------ target side */

typedef struct sent_ids {
    uint64_t *v;
    size_t n, cap;
} sent_ids;

static bool sent_has(const sent_ids *s, uint64_t id) {
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == id) return true;
    return false;
}

static bool region_alive(xp_regions *t, uint64_t id) {
    xp_region *r, *tmp;
    bool alive = false;
    pthread_mutex_lock(&t->mu);
    HASH_ITER(hh, t->by_token, r, tmp) {
        if (r->id == id) alive = true;
    }
    pthread_mutex_unlock(&t->mu);
    return alive;
}

/* Creates this connection's control segment and publishes it to reg/unreg. */
static int seg_open(shm_impl *s, shm_seg *g, int *fd_out) {
    int fd = memfd_create("ect-shm-ctl", MFD_CLOEXEC);
    if (fd < 0) return ect_set_errno(errno, "shm: memfd for the control segment");
    if (ftruncate(fd, SHM_SEG_LEN) != 0) {
        close(fd);
        return ect_set_errno(errno, "shm: control segment size");
    }
    g->slots = mmap(NULL, SHM_SEG_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (g->slots == MAP_FAILED) {
        close(fd);
        return ect_set_errno(errno, "shm: control segment map");
    }
    pthread_mutex_lock(&s->smu);
    for (int i = 0; i < SHM_SLOTS; i++)
        __atomic_store_n(&g->slots[i].state, s->slot_state[i], __ATOMIC_SEQ_CST);
    g->next = s->segs;
    s->segs = g;
    pthread_mutex_unlock(&s->smu);
    *fd_out = fd;
    return 0;
}

static void seg_close(shm_impl *s, shm_seg *g) {
    pthread_mutex_lock(&s->smu);
    for (shm_seg **pp = &s->segs; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    pthread_mutex_unlock(&s->smu);
    munmap(g->slots, SHM_SEG_LEN);
}

/* A random 64-bit token of this process (drawn again after a fork): tells
 * an initiator whether a CUDA region's target runs in its own process. */
static uint64_t process_token(void) {
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

static void serve_conn(void *ctx, int fd, int stopfd) {
    ect_xport *x = ctx;
    shm_impl *si = x->impl;
    shm_seg seg = {0};
    int segfd = -1;
    int to = x->opts.io_timeout_ms;
    uint8_t *in = malloc(SHM_BEGIN_MAX), *out = malloc(SHM_GRANT_MAX);
    uint8_t *ipc = malloc(SHM_IPC_LEN * SHM_CHUNK);
    xp_region **held = calloc(SHM_CHUNK, sizeof *held);
    sent_ids sent = {0};
    size_t len;
    (void)stopfd; /* the server's stop shuts the socket down, which ends recvmsg */
    if (!in || !out || !ipc || !held || !same_uid(fd)) goto done;
    set_timeouts(fd, to);
    if (msg_recv(fd, in, SHM_BEGIN_MAX, &len, NULL, 0, NULL, true, to) != 0 || len != 8 ||
        xp_get_u32(in) != SHM_MAGIC_HELLO || xp_get_u16(in + 4) != SHM_VERSION) {
        ECT_LOGW("xport", "shm target: bad hello; closing");
        goto done;
    }
    /* Hello reply: magic, version, 0, slot count; the segment's fd attached. */
    if (seg_open(si, &seg, &segfd) != 0) goto done;
    xp_put_u16(in + 6, 0);
    xp_put_u32(in + 8, SHM_SLOTS);
    int hrc = msg_send(fd, in, 12, &segfd, 1, to);
    close(segfd);
    if (hrc != 0) goto done;
    for (;;) {
        if (msg_recv(fd, in, SHM_BEGIN_MAX, &len, NULL, 0, NULL, true, to) != 0) break;
        uint32_t n = len >= 8 ? xp_get_u32(in + 4) : 0;
        if (len < 8 || xp_get_u32(in) != SHM_MAGIC_BEGIN || n == 0 || n > SHM_CHUNK ||
            len != 8 + 24 * (size_t)n) {
            ECT_LOGW("xport", "shm target: malformed BEGIN (%zu bytes); closing", len);
            break;
        }
        int fds[SHM_CHUNK], nfds = 0;
        uint32_t ndrop = 0, nipc = 0;
        for (uint32_t i = 0; i < n; i++) {
            const uint8_t *e = in + 8 + 24 * (size_t)i;
            uint8_t *o = out + 16 + SHM_GENT * (size_t)i;
            xp_region *r = NULL;
            int st = xp_region_acquire(&x->regs, xp_get_u64(e + 16), xp_get_u64(e),
                                       xp_get_u64(e + 8), &r);
            held[i] = r;
            memset(o, 0, SHM_GENT);
            xp_put_u32(o, (uint32_t)st);
            if (st) continue;
            if (!sent_has(&sent, r->id)) {
                if (sent.n == sent.cap) {
                    size_t nc = sent.cap ? 2 * sent.cap : 16;
                    uint64_t *nv = realloc(sent.v, nc * sizeof *nv);
                    if (!nv) goto fail;
                    sent.v = nv;
                    sent.cap = nc;
                }
                sent.v[sent.n++] = r->id;
                if (r->kind == ECT_MEM_CUDA) {
                    shm_grant_put_ipc(ipc + SHM_IPC_LEN * (size_t)nipc++, r->ipc, r->ipc_off,
                                      process_token(), (uint32_t)r->device);
                    xp_put_u32(o + 4, SHM_GF_IPC);
                } else {
                    fds[nfds++] = r->fd;
                    xp_put_u32(o + 4, SHM_GF_FD);
                }
            }
            xp_put_u64(o + 8, r->id);
            xp_put_u64(o + 16, (uint64_t)(uintptr_t)r->addr);
            xp_put_u64(o + 24, r->len);
            xp_put_u64(o + 32, r->fd_off);
            xp_put_u32(o + 40, (uint32_t)((uintptr_t)r->be - 1));
        }
        /* Regions this connection was given that are gone: tell it to unmap. */
        for (size_t i = 0; i < sent.n && ndrop < SHM_MAX_DROP;) {
            if (region_alive(&x->regs, sent.v[i])) {
                i++;
                continue;
            }
            xp_put_u64(out + 16 + SHM_GENT * (size_t)n + 8 * (size_t)ndrop++, sent.v[i]);
            sent.v[i] = sent.v[--sent.n];
        }
        xp_put_u32(out, SHM_MAGIC_GRANT);
        xp_put_u32(out + 4, n);
        xp_put_u32(out + 8, ndrop);
        xp_put_u32(out + 12, (uint32_t)nfds);
        size_t glen = 16 + SHM_GENT * (size_t)n + 8 * (size_t)ndrop;
        memcpy(out + glen, ipc, SHM_IPC_LEN * (size_t)nipc);
        glen += SHM_IPC_LEN * (size_t)nipc;
        int rc = msg_send(fd, out, glen, fds, nfds, to);
        /* The initiator copies now; wait for DONE within the io timeout.
         * DONE is not answered: the bytes landed when the initiator's memcpy
         * returned, and DONE only ends the references. */
        if (!rc) rc = msg_recv(fd, in, SHM_BEGIN_MAX, &len, NULL, 0, NULL, false, to);
        if (!rc && (len != 8 || xp_get_u32(in) != SHM_MAGIC_DONE || xp_get_u32(in + 4) != n))
            rc = ECT_EPROTO;
        for (uint32_t i = 0; i < n; i++)
            if (held[i]) xp_region_release(&x->regs, held[i]);
        memset(held, 0, sizeof *held * SHM_CHUNK);
        if (rc) break;
        continue;
    fail:
        for (uint32_t i = 0; i < n; i++)
            if (held[i]) xp_region_release(&x->regs, held[i]);
        break;
    }
done:
    if (seg.slots) seg_close(si, &seg);
    free(in);
    free(out);
    free(ipc);
    free(held);
    free(sent.v);
}

/* A region gets a slot; every connection's segment shows it registered. A
 * CUDA region also gets its IPC handle, handed to peers in the GRANT. */
static int shm_reg(ect_xport *x, xp_region *r) {
    shm_impl *s = x->impl;
    if (r->kind == ECT_MEM_CUDA) {
        int rc = cuda_ipc_export(r->addr, r->ipc, &r->ipc_off);
        if (rc) return ect_set_error(rc, "shm: %s", ect_last_error());
    }
    int slot = -1;
    pthread_mutex_lock(&s->smu);
    for (int i = 0; i < SHM_SLOTS && slot < 0; i++)
        if (s->slot_state[i] == 0) slot = i;
    if (slot >= 0) {
        s->slot_state[slot] = (r->id << 1) | 1;
        for (shm_seg *g = s->segs; g; g = g->next)
            __atomic_store_n(&g->slots[slot].state, s->slot_state[slot], __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&s->smu);
    if (slot < 0) return ect_set_error(ECT_EFULL, "shm: at most %d regions per target", SHM_SLOTS);
    r->be = (void *)(uintptr_t)(slot + 1);
    return 0;
}

/* Clears the slot in every segment, then waits for copies in progress. */
static void shm_unreg(ect_xport *x, xp_region *r) {
    shm_impl *s = x->impl;
    int slot = (int)((uintptr_t)r->be - 1);
    pthread_mutex_lock(&s->smu);
    s->slot_state[slot] = 0;
    for (shm_seg *g = s->segs; g; g = g->next)
        __atomic_store_n(&g->slots[slot].state, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&s->smu);
    uint64_t t0 = ect_now_ms();
    bool warned = false;
    for (;;) {
        bool busy = false;
        pthread_mutex_lock(&s->smu);
        for (shm_seg *g = s->segs; g && !busy; g = g->next)
            busy = __atomic_load_n(&g->slots[slot].users, __ATOMIC_SEQ_CST) != 0;
        pthread_mutex_unlock(&s->smu);
        if (!busy) break;
        if (!warned && ect_now_ms() - t0 > (uint64_t)x->opts.io_timeout_ms) {
            ECT_LOGW("xport", "shm unregister: a peer has been copying for %d ms; waiting",
                     x->opts.io_timeout_ms);
            warned = true;
        }
        usleep(20);
    }
}

static int shm_open_be(ect_xport *x) {
    char name[80];
    snprintf(name, sizeof name, "ect-%d-%016" PRIx64, (int)getpid(), ect_random_u64());
    struct sockaddr_un sa;
    socklen_t sl;
    int rc = make_addr(name, &sa, &sl);
    if (rc) return rc;
    int lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (lfd < 0) return ect_set_errno(errno, "shm: socket");
    if (bind(lfd, (struct sockaddr *)&sa, sl) != 0 || listen(lfd, 64) != 0) {
        rc = ect_set_errno(errno, "shm: listen on @%s", name);
        close(lfd);
        return rc;
    }
    shm_impl *s = calloc(1, sizeof *s);
    if (!s) {
        close(lfd);
        return ect_set_error(ECT_ENOMEM, "shm transport");
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->smu, NULL);
    x->impl = s;
    rc = xp_server_start(lfd, serve_conn, x, &s->srv);
    if (rc) {
        pthread_mutex_destroy(&s->mu);
        pthread_mutex_destroy(&s->smu);
        free(s);
        x->impl = NULL;
        return rc;
    }
    snprintf(x->session, sizeof x->session, "shm:@%s", name);
    return 0;
}

/* --------------------------------------------------------- initiator side */

static void map_drop(shm_conn *c, shm_map *m) {
    HASH_DEL(c->maps, m);
    HASH_DELETE(hh_tok, c->by_tok, m);
    if (m->base) munmap(m->base, m->maplen);
    cuda_ipc_close(m->ipc_base);
    free(m);
}

/* Adds a mapping to the connection's tables (by region id and by key). */
static void map_add(shm_conn *c, shm_map *m) {
    HASH_ADD(hh, c->maps, rid, sizeof m->rid, m);
    shm_map *old;
    HASH_FIND(hh_tok, c->by_tok, &m->token, sizeof m->token, old);
    if (old) HASH_DELETE(hh_tok, c->by_tok, old);
    HASH_ADD(hh_tok, c->by_tok, token, sizeof m->token, m);
}

/* Opens a granted CUDA region: its IPC handle, or, when the target is this
 * very process, its device address as is. */
static int map_ipc(shm_conn *c, const shm_grant_entry *e, uint64_t token) {
    shm_map *m;
    HASH_FIND(hh, c->maps, &e->rid, sizeof e->rid, m);
    if (m) return 0;
    uint64_t end;
    if (e->rlen == 0 || !ect_add_u64(e->raddr, e->rlen, &end) || e->slot >= SHM_SLOTS)
        return ect_set_error(ECT_EPROTO, "shm: CUDA region %" PRIu64 " is malformed", e->rid);
    ect_cuda_info ci;
    if (ect_cuda_get_info(&ci) != 0)
        return ect_set_error(ECT_ENOTSUP,
                             "shm: the target's region is CUDA memory and this "
                             "process has no CUDA: %s",
                             ci.why);
    int dev = (int)e->device < ci.devices ? (int)e->device : 0;
    void *base = NULL;
    uint8_t *start;
    if (e->proc_token == process_token()) {
        start = (uint8_t *)(uintptr_t)e->raddr;
    } else {
        int rc = cuda_ipc_open(e->ipc_handle, dev, &base);
        if (rc) return ect_set_error(rc, "shm: %s", ect_last_error());
        start = (uint8_t *)base + e->ipc_off;
    }
    if (!(m = calloc(1, sizeof *m))) {
        cuda_ipc_close(base);
        return ect_set_error(ECT_ENOMEM, "shm mapping");
    }
    m->rid = e->rid;
    m->kind = ECT_MEM_CUDA;
    m->dev = dev;
    m->ipc_base = base;
    m->start = start;
    m->raddr = e->raddr;
    m->rlen = e->rlen;
    m->token = token;
    m->slot = e->slot;
    map_add(c, m);
    return 0;
}

/* Puts len bytes from src (kind skind on device sdev) at dst inside map m:
 * memcpy between host memory, else one driver copy, waited for. */
static int put_bytes(const shm_map *m, uint8_t *dst, const void *src, uint64_t len, int skind,
                     int sdev) {
    if (!len) return 0;
    if (m->kind != ECT_MEM_CUDA && skind != ECT_MEM_CUDA) {
        memcpy(dst, src, (size_t)len);
        return 0;
    }
    return cuda_copy(dst, src, len, m->kind == ECT_MEM_CUDA ? m->dev : sdev);
}

static void conn_free(shm_conn *c) {
    shm_map *m, *tmp;
    HASH_ITER(hh, c->maps, m, tmp) map_drop(c, m);
    if (c->seg) munmap(c->seg, SHM_SEG_LEN);
    if (c->fd >= 0) close(c->fd);
    free(c);
}

static void shm_close(ect_xport *x) {
    shm_impl *s = x->impl;
    xp_server_stop(s->srv);
    shm_peer *p, *tmp;
    HASH_ITER(hh, s->peers, p, tmp) {
        HASH_DEL(s->peers, p);
        while (p->idle) {
            shm_conn *c = p->idle;
            p->idle = c->next;
            conn_free(c);
        }
        free(p);
    }
}

/* After close and the last unreg. */
static void shm_destroy(ect_xport *x) {
    shm_impl *s = x->impl;
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->smu);
    free(s);
}

static int get_peer(shm_impl *s, const char *session, shm_peer **out) {
    shm_peer *p = NULL;
    pthread_mutex_lock(&s->mu);
    HASH_FIND_STR(s->peers, session, p);
    pthread_mutex_unlock(&s->mu);
    if (p) {
        *out = p;
        return 0;
    }
    if (strncmp(session, "shm:@", 5) != 0 || strlen(session) >= sizeof p->session)
        return ect_set_error(ECT_EINVAL, "peer_session '%.100s' is not shm:@NAME", session);
    p = calloc(1, sizeof *p);
    if (!p) return ect_set_error(ECT_ENOMEM, "peer");
    int rc = make_addr(session + 5, &p->sa, &p->salen);
    if (rc) {
        free(p);
        return rc;
    }
    snprintf(p->session, sizeof p->session, "%s", session);
    shm_peer *q;
    pthread_mutex_lock(&s->mu);
    HASH_FIND_STR(s->peers, session, q);
    if (q)
        free(p);
    else
        HASH_ADD_STR(s->peers, session, p);
    pthread_mutex_unlock(&s->mu);
    *out = q ? q : p;
    return 0;
}

static int take_conn(ect_xport *x, shm_peer *p, shm_conn **out) {
    shm_impl *s = x->impl;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        shm_conn *c = p->idle;
        if (c) {
            p->idle = c->next;
            p->nidle--;
        }
        pthread_mutex_unlock(&s->mu);
        if (!c) break;
        uint8_t b;
        ssize_t k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            *out = c;
            return 0;
        }
        conn_free(c);
    }
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) return ect_set_errno(errno, "shm: socket");
    if (connect(fd, (struct sockaddr *)&p->sa, p->salen) != 0) {
        int rc =
            ect_set_error(ECT_ECONNREFUSED, "shm: connect to %s: %s", p->session, strerror(errno));
        close(fd);
        return rc;
    }
    if (!same_uid(fd)) {
        close(fd);
        return ect_set_error(ECT_EACCES, "shm: %s belongs to another user", p->session);
    }
    uint8_t h[16] = {0};
    size_t len;
    int segfd = -1, nf = 0;
    void *seg = MAP_FAILED;
    struct stat st;
    xp_put_u32(h, SHM_MAGIC_HELLO);
    xp_put_u16(h + 4, SHM_VERSION);
    int rc = msg_send(fd, h, 8, NULL, 0, x->opts.io_timeout_ms);
    set_timeouts(fd, x->opts.io_timeout_ms);
    if (!rc) rc = msg_recv(fd, h, sizeof h, &len, &segfd, 1, &nf, false, x->opts.io_timeout_ms);
    if (rc == ECT_ECLOSED)
        rc = ect_set_error(ECT_ECONNREFUSED, "shm: %s refused the hello", p->session);
    if (!rc && (len != 12 || xp_get_u32(h) != SHM_MAGIC_HELLO || xp_get_u16(h + 4) != SHM_VERSION ||
                xp_get_u32(h + 8) != SHM_SLOTS || nf != 1 || fstat(segfd, &st) != 0 ||
                st.st_size < SHM_SEG_LEN))
        rc = ect_set_error(ECT_EPROTO, "shm: bad hello from %s", p->session);
    if (!rc) {
        seg = mmap(NULL, SHM_SEG_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, segfd, 0);
        if (seg == MAP_FAILED) rc = ect_set_errno(errno, "shm: map of the control segment");
    }
    if (nf == 1) close(segfd);
    shm_conn *c = rc ? NULL : calloc(1, sizeof *c);
    if (!c) {
        if (seg != MAP_FAILED) munmap(seg, SHM_SEG_LEN);
        close(fd);
        return rc ? rc : ect_set_error(ECT_ENOMEM, "shm connection");
    }
    c->fd = fd;
    c->seg = seg;
    *out = c;
    return 0;
}

static void give_conn(ect_xport *x, shm_peer *p, shm_conn *c) {
    shm_impl *s = x->impl;
    pthread_mutex_lock(&s->mu);
    if (p->nidle < 2 * x->opts.conns_per_peer + 8) {
        c->next = p->idle;
        p->idle = c;
        p->nidle++;
        c = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    if (c) conn_free(c);
}

static int map_region(shm_conn *c, const shm_grant_entry *e, int fd, uint64_t token) {
    uint64_t rid = e->rid, raddr = e->raddr, rlen = e->rlen, foff = e->fd_off;
    uint32_t slot = e->slot;
    shm_map *m;
    HASH_FIND(hh, c->maps, &rid, sizeof rid, m);
    if (m) { /* already mapped: the target sent it twice; keep ours */
        close(fd);
        return 0;
    }
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), aoff = foff & ~(pg - 1), end;
    struct stat st;
    if (!ect_add_u64(foff, rlen, &end) || rlen == 0 || rlen > SIZE_MAX / 2 || fstat(fd, &st) != 0 ||
        (uint64_t)st.st_size < end || slot >= SHM_SLOTS) {
        close(fd);
        return ect_set_error(ECT_EPROTO, "shm: region %" PRIu64 " does not fit its fd", rid);
    }
    size_t ml = (size_t)(rlen + (foff - aoff));
    void *b = mmap(NULL, ml, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)aoff);
    close(fd);
    if (b == MAP_FAILED) return ect_set_errno(errno, "shm: mmap of region %" PRIu64, rid);
    m = calloc(1, sizeof *m);
    if (!m) {
        munmap(b, ml);
        return ect_set_error(ECT_ENOMEM, "shm mapping");
    }
    m->rid = rid;
    m->base = b;
    m->maplen = ml;
    m->kind = ECT_MEM_HOST;
    m->start = (uint8_t *)b + (foff - aoff);
    m->raddr = raddr;
    m->rlen = rlen;
    m->token = token;
    m->slot = slot;
    map_add(c, m);
    return 0;
}

/* A write's source: its kind (ECT_MEM_CUDA or host) and device. */
typedef struct src_kind {
    int kind, dev;
} src_kind;

/* One BEGIN/GRANT/copy/DONE/ACK round for idx[0..n). Fails only for
 * connection-level errors; per-write refusals go to st. */
static int chunk(ect_xport *x, shm_conn *c, const ect_write *w, const size_t *idx, uint32_t n,
                 const uint64_t *tok, const src_kind *sk, int *st, uint8_t *buf) {
    int to = x->opts.io_timeout_ms;
    xp_put_u32(buf, SHM_MAGIC_BEGIN);
    xp_put_u32(buf + 4, n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *e = buf + 8 + 24 * (size_t)i;
        xp_put_u64(e, w[idx[i]].dst_addr);
        xp_put_u64(e + 8, w[idx[i]].len);
        xp_put_u64(e + 16, tok[idx[i]]);
    }
    int rc = msg_send(c->fd, buf, 8 + 24 * (size_t)n, NULL, 0, to);
    int fds[SHM_CHUNK], nfds = 0;
    size_t len;
    if (!rc) rc = msg_recv(c->fd, buf, SHM_GRANT_MAX, &len, fds, SHM_CHUNK, &nfds, false, to);
    if (rc) return rc;
    shm_grant g;
    if ((rc = shm_grant_decode(buf, len, n, nfds, &g)) != 0) {
        for (int i = 0; i < nfds; i++) close(fds[i]);
        return rc;
    }
    for (uint32_t i = 0; i < g.ndrop; i++) {
        uint64_t rid = xp_get_u64(g.drops + 8 * (size_t)i);
        shm_map *m;
        HASH_FIND(hh, c->maps, &rid, sizeof rid, m);
        if (m) map_drop(c, m);
    }
    int fi = 0;
    uint32_t ipc_seen = 0;
    for (uint32_t i = 0; i < n; i++) {
        shm_grant_entry e;
        shm_grant_entry_get(buf, &g, i, &ipc_seen, &e);
        int32_t s = e.status;
        size_t wi = idx[i];
        if (e.flags & SHM_GF_FD) {
            int err = map_region(c, &e, fds[fi++], tok[wi]);
            if (err && s == 0) s = err;
        } else if (e.flags & SHM_GF_IPC) {
            int err = map_ipc(c, &e, tok[wi]);
            if (err && s == 0) s = err;
        }
        if (s > 0 || s < ECT_EOVERFLOW) s = ECT_EPROTO;
        if (s) {
            st[wi] = s;
            continue;
        }
        shm_map *m;
        HASH_FIND(hh, c->maps, &e.rid, sizeof e.rid, m);
        uint64_t a = w[wi].dst_addr, end;
        /* Never trust the grant blindly: the copy must stay inside our map. */
        if (!m || a < m->raddr || !ect_add_u64(a, w[wi].len, &end) || end > m->raddr + m->rlen) {
            st[wi] = ect_set_error(ECT_EPROTO, "shm: GRANT for a region not mapped here");
            continue;
        }
        st[wi] =
            put_bytes(m, m->start + (a - m->raddr), w[wi].src, w[wi].len, sk[wi].kind, sk[wi].dev);
    }
    while (fi < nfds) close(fds[fi++]);
    xp_put_u32(buf, SHM_MAGIC_DONE);
    xp_put_u32(buf + 4, n);
    return msg_send(c->fd, buf, 8, NULL, 0, to);
}

/* False once the target closed its end (process gone or handle closed). */
static bool conn_alive(shm_conn *c) {
    uint8_t b;
    ssize_t k = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

/* The fast path: a write into a region this connection already mapped is
 * checked here against the range and the region's live state in the
 * control segment, and copied without a message. Returns 1 when it must
 * ask the target instead, 0 once copied, or a copy's error. */
static int fast_copy(shm_conn *c, const ect_write *w, uint64_t token, const src_kind *sk) {
    shm_map *m;
    HASH_FIND(hh_tok, c->by_tok, &token, sizeof token, m);
    uint64_t a = w->dst_addr, end;
    if (!m || a < m->raddr || !ect_add_u64(a, w->len, &end) || end > m->raddr + m->rlen) return 1;
    shm_slot *sl = &c->seg[m->slot];
    int rc = 1;
    __atomic_fetch_add(&sl->users, 1, __ATOMIC_SEQ_CST);
    bool live = __atomic_load_n(&sl->state, __ATOMIC_SEQ_CST) == ((m->rid << 1) | 1);
    if (live) rc = put_bytes(m, m->start + (a - m->raddr), w->src, w->len, sk->kind, sk->dev);
    __atomic_fetch_sub(&sl->users, 1, __ATOMIC_SEQ_CST);
    return rc;
}

static int shm_write_batch(ect_xport *x, const char *session, const ect_write *w, size_t n,
                           int *st) {
    shm_impl *s = x->impl;
    shm_peer *p = NULL;
    shm_conn *c = NULL;
    int rc = get_peer(s, session, &p);
    if (!rc) rc = take_conn(x, p, &c);
    if (rc) {
        for (size_t i = 0; i < n; i++) st[i] = rc;
        return rc;
    }
    uint64_t *tok = malloc(n * sizeof *tok);
    size_t *idx = malloc(n * sizeof *idx);
    src_kind *sk = calloc(n, sizeof *sk);
    uint8_t *buf = malloc(SHM_GRANT_MAX);
    if (!tok || !idx || !sk || !buf) {
        free(tok);
        free(idx);
        free(sk);
        free(buf);
        give_conn(x, p, c);
        return ect_set_error(ECT_ENOMEM, "batch");
    }
    size_t m = 0, fast = 0;
    for (size_t i = 0; i < n; i++) {
        if (w[i].len && mem_is_device(w[i].src, &sk[i].dev)) sk[i].kind = ECT_MEM_CUDA;
        int f;
        if (xp_key_parse(w[i].dst_key, &tok[i]) != 0)
            st[i] = ECT_EINVAL;
        else if ((f = fast_copy(c, &w[i], tok[i], &sk[i])) == 0)
            fast++;
        else if (f < 0)
            st[i] = f;
        else
            idx[m++] = i;
    }
    rc = 0;
    for (size_t done = 0; done < m && !rc;) {
        uint32_t k = (uint32_t)(m - done < SHM_CHUNK ? m - done : SHM_CHUNK);
        rc = chunk(x, c, w, idx + done, k, tok, sk, st, buf);
        if (rc) {
            /* The target did not acknowledge: nothing from here on counts. */
            for (size_t i = done; i < m; i++)
                if (st[idx[i]] == 0) st[idx[i]] = rc;
        }
        done += k;
    }
    /* Copies need no answer, but a target that died meanwhile must not
     * count as having received them. */
    if (!rc && fast && !conn_alive(c)) {
        rc = ect_set_error(ECT_ECLOSED, "shm: %s went away during the batch", session);
        for (size_t i = 0; i < n; i++)
            if (st[i] == 0) st[i] = rc;
    }
    if (rc)
        conn_free(c);
    else
        give_conn(x, p, c);
    free(tok);
    free(idx);
    free(sk);
    free(buf);
    return rc;
}

const xp_backend xp_shm_backend = {
    .name = "shm",
    .session_prefix = "shm:",
    .device_regions = true,
    .device_sources = true,
    .open = shm_open_be,
    .close = shm_close,
    .reg = shm_reg,
    .unreg = shm_unreg,
    .destroy = shm_destroy,
    .write_batch = shm_write_batch,
};
