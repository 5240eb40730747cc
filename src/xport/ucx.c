/*
 * ucx — the UCX transport (compiled only when libucx is found; wire format
 * of the side channel and the key: docs/PROTOCOL.md "ucx").
 *
 * Target: ucp_mem_map of each region and ucp_rkey_pack; the key string is
 * hex of (region address, region length, packed rkey). A progress thread
 * drives the target's worker (UCX's tcp transport, and its software put for
 * memory that a shared-memory transport cannot map, need the target to make
 * progress). Peers learn the worker address from a tiny tcp side channel at
 * the session "ucx:HOST:PORT"; the initiator keeps that connection open, and
 * its EOF is how a dead target is noticed, whatever transport UCX picked.
 *
 * Initiator: one worker, driven by the calling thread under a mutex (UCX
 * workers are single-threaded here, so concurrent batches serialize). Per
 * session one endpoint and the unpacked rkeys it has used; every write is a
 * ucp_put_nbx, then one flush for the batch. A failure closes the endpoint
 * so the next batch reconnects.
 *
 * Windows (xp_window_open) go through the same reg: each gets its own
 * ucp_mem_map of exactly its sub-range of the pool (memory already
 * allocated, so UCX only registers it) and its own packed rkey, and close
 * unmaps it. The initiator keeps at most UCX_RKEY_CACHE unpacked rkeys per
 * peer (least recently used go first), since every reservation brings a
 * new one.
 *
 * Limits: the initiator checks each write against the range inside the key
 * (a write outside gets ECT_EACCES / ECT_ERANGE), but with UCX's one-sided
 * puts the target cannot refuse a write that uses a stale key of an
 * unregistered region or window, nor one outside a window's registration;
 * RDMA hardware does, tcp and cma do not.
 */
#include <pthread.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#include "util/util.h"
#include "xport/xport.h"

#define UCX_MAGIC_ADDR 0x58554345u /* "ECUX" */
#define UCX_ADDR_MAX (64 * 1024)
#define UCX_RKEY_CACHE 256 /* unpacked rkeys kept per peer */

typedef struct ucx_rkey {
    char *keystr;
    ucp_rkey_h rkey;
    uint64_t raddr, rlen;
    UT_hash_handle hh;
} ucx_rkey;

typedef struct ucx_peer {
    char session[300];
    ucp_ep_h ep; /* NULL once failed */
    int side_fd; /* side channel, open as long as ep: EOF means the target is gone */
    int failed;  /* the side channel reported the target gone mid-batch */
    ucx_rkey *rkeys;
    UT_hash_handle hh;
} ucx_peer;

typedef struct ucx_impl {
    ucp_context_h ctx;
    ucp_worker_h tw; /* target worker; driven by the progress thread only */
    ucp_worker_h iw; /* initiator worker; driven under imu */
    void *taddr;     /* target worker address */
    size_t taddr_len;
    int stopfd;
    pthread_t prog;
    bool prog_started;
    pthread_mutex_t tmu; /* serializes calls into tw (progress vs. mem_map/pack) */
    pthread_mutex_t imu; /* guards iw and peers */
    ucx_peer *peers;
    xp_server *srv;
} ucx_impl;

static int ucs_err(ucs_status_t s, const char *what) {
    int code =
        s == UCS_ERR_UNREACHABLE || s == UCS_ERR_REJECTED ? ECT_ECONNREFUSED
        : s == UCS_ERR_TIMED_OUT                          ? ECT_ETIMEDOUT
        : s == UCS_ERR_CONNECTION_RESET || s == UCS_ERR_ENDPOINT_TIMEOUT || s == UCS_ERR_CANCELED
            ? ECT_ECLOSED
        : s == UCS_ERR_NO_MEMORY ? ECT_ENOMEM
                                 : ECT_EIO;
    return ect_set_error(code, "ucx: %s: %s", what, ucs_status_string(s));
}

/* ------------------------------------------------------------ target side */

/* The context has no UCP_FEATURE_WAKEUP: asking for it makes UCX drop the
 * transports without events (cma), which leaves puts to active-message
 * copies through the target. So the target polls: flat out while there is
 * work, then sleeping 10 us .. 200 us, doubling, while idle. (Spinning or
 * yielding instead was measured worse on 2 cores: it starves the
 * initiator.) */
static void *progress_main(void *arg) {
    ucx_impl *u = arg;
    pthread_setname_np(pthread_self(), "ect-ucx-prog");
    unsigned nap_us = 0;
    prctl(PR_SET_TIMERSLACK, 1000UL); /* 1 us: short naps stay short */
    for (;;) {
        pthread_mutex_lock(&u->tmu);
        unsigned did = 0;
        while (ucp_worker_progress(u->tw)) did++;
        pthread_mutex_unlock(&u->tmu);
        if (did) {
            nap_us = 0;
            continue;
        }
        struct pollfd p = {.fd = u->stopfd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0) break;
        nap_us = nap_us ? (nap_us * 2 > 200 ? 200 : nap_us * 2) : 10;
        usleep(nap_us);
    }
    return NULL;
}

/* The side channel: send the worker address, then hold the connection open
 * until the initiator hangs up or this target closes. Its EOF is how an
 * initiator learns that the target went away, whatever UCX transport runs. */
static void serve_addr(void *ctx, int fd, int stopfd) {
    ucx_impl *u = ctx;
    pthread_setname_np(pthread_self(), "ect-ucx-addr");
    uint8_t h[8];
    xp_put_u32(h, UCX_MAGIC_ADDR);
    xp_put_u32(h + 4, (uint32_t)u->taddr_len);
    if (xp_send_all(fd, h, 8, 5000) != 0 || xp_send_all(fd, u->taddr, u->taddr_len, 5000) != 0)
        return;
    for (;;) {
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = stopfd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0 && errno != EINTR) return;
        if (p[1].revents) return;
        if (p[0].revents && recv(fd, h, sizeof h, 0) <= 0) return;
    }
}

static void ucx_destroy(ect_xport *x);

static int ucx_open(ect_xport *x) {
    char host[256];
    int port, lfd, bound, rc;
    rc = xp_parse_hostport("opts.listen", x->listen, host, sizeof host, &port);
    if (rc) return rc;
    ucx_impl *u = calloc(1, sizeof *u);
    if (!u) return ect_set_error(ECT_ENOMEM, "ucx transport");
    u->stopfd = -1;
    pthread_mutex_init(&u->tmu, NULL);
    pthread_mutex_init(&u->imu, NULL);
    x->impl = u;
    ucp_config_t *cfg;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) {
        rc = ucs_err(s, "config");
        goto fail;
    }
    ucp_params_t pp = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    s = ucp_init(&pp, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (s != UCS_OK) {
        rc = ucs_err(s, "init");
        goto fail;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED};
    s = ucp_worker_create(u->ctx, &wp, &u->tw);
    if (s == UCS_OK) s = ucp_worker_create(u->ctx, &wp, &u->iw);
    if (s != UCS_OK) {
        rc = ucs_err(s, "worker");
        goto fail;
    }
    ucp_address_t *a;
    s = ucp_worker_get_address(u->tw, &a, &u->taddr_len);
    if (s != UCS_OK) {
        rc = ucs_err(s, "worker address");
        goto fail;
    }
    u->taddr = malloc(u->taddr_len);
    if (u->taddr) memcpy(u->taddr, a, u->taddr_len);
    ucp_worker_release_address(u->tw, a);
    if (!u->taddr || u->taddr_len > UCX_ADDR_MAX) {
        rc = ect_set_error(ECT_ENOMEM, "ucx worker address");
        goto fail;
    }
    u->stopfd = eventfd(0, EFD_CLOEXEC);
    if (u->stopfd < 0 || pthread_create(&u->prog, NULL, progress_main, u) != 0) {
        rc = ect_set_error(ECT_ENOMEM, "ucx progress thread");
        goto fail;
    }
    u->prog_started = true;
    rc = xp_tcp_listen(host, port, &lfd, &bound);
    if (!rc)
        rc = xp_server_start(lfd, serve_addr, u, x->opts.max_conns, x->opts.max_conns_per_peer,
                             &u->srv);
    if (rc) goto fail;
    if (strchr(host, ':'))
        snprintf(x->session, sizeof x->session, "ucx:[%s]:%d", host, bound);
    else
        snprintf(x->session, sizeof x->session, "ucx:%s:%d", host, bound);
    return 0;
fail:
    ucx_destroy(x);
    x->impl = NULL;
    return rc;
}

static void hex_encode(const uint8_t *b, size_t n, char *out) {
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[b[i] >> 4];
        out[2 * i + 1] = hx[b[i] & 15];
    }
    out[2 * n] = '\0';
}

static int ucx_reg(ect_xport *x, xp_region *r) {
    ucx_impl *u = x->impl;
    ucp_mem_map_params_t mp = {.field_mask =
                                   UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = r->addr,
                               .length = r->len};
    ucp_mem_h mh;
    void *rk;
    size_t rklen;
    pthread_mutex_lock(&u->tmu);
    ucs_status_t s = ucp_mem_map(u->ctx, &mp, &mh);
    if (s == UCS_OK) {
        s = ucp_rkey_pack(u->ctx, mh, &rk, &rklen);
        if (s != UCS_OK) ucp_mem_unmap(u->ctx, mh);
    }
    pthread_mutex_unlock(&u->tmu);
    if (s != UCS_OK) return ucs_err(s, "mem_map / rkey_pack");
    if (16 + rklen > (ECT_XPORT_KEY_MAX - 1) / 2) {
        ucp_rkey_buffer_release(rk);
        ucp_mem_unmap(u->ctx, mh);
        return ect_set_error(ECT_ENOTSUP, "ucx: packed rkey of %zu bytes does not fit a key",
                             rklen);
    }
    uint8_t *blob = malloc(16 + rklen);
    char *ks = malloc(2 * (16 + rklen) + 1);
    if (!blob || !ks) {
        free(blob);
        free(ks);
        ucp_rkey_buffer_release(rk);
        ucp_mem_unmap(u->ctx, mh);
        return ect_set_error(ECT_ENOMEM, "ucx key");
    }
    xp_put_u64(blob, (uint64_t)(uintptr_t)r->addr);
    xp_put_u64(blob + 8, r->len);
    memcpy(blob + 16, rk, rklen);
    ucp_rkey_buffer_release(rk);
    hex_encode(blob, 16 + rklen, ks);
    free(blob);
    xp_region_key_replace(r, ks);
    r->be = mh;
    return 0;
}

static void ucx_unreg(ect_xport *x, xp_region *r) {
    ucx_impl *u = x->impl;
    if (!r->be) return;
    pthread_mutex_lock(&u->tmu);
    ucp_mem_unmap(u->ctx, r->be);
    pthread_mutex_unlock(&u->tmu);
    r->be = NULL;
}

/* --------------------------------------------------------- initiator side */

static void drop_peer_ep(ucx_impl *u, ucx_peer *p) {
    ucx_rkey *k, *tmp;
    HASH_ITER(hh, p->rkeys, k, tmp) {
        HASH_DEL(p->rkeys, k);
        ucp_rkey_destroy(k->rkey);
        free(k->keystr);
        free(k);
    }
    if (p->ep) {
        ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                  .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t req = ucp_ep_close_nbx(p->ep, &cp);
        if (UCS_PTR_IS_PTR(req)) {
            uint64_t t0 = ect_now_ms();
            while (ucp_request_check_status(req) == UCS_INPROGRESS && ect_now_ms() - t0 < 2000)
                ucp_worker_progress(u->iw);
            ucp_request_free(req);
        }
        p->ep = NULL;
    }
    if (p->side_fd >= 0) close(p->side_fd);
    p->side_fd = -1;
}

/* True if the target's side channel says it is gone. */
static bool side_dead(ucx_peer *p) {
    uint8_t b;
    if (p->side_fd < 0) return true;
    ssize_t k = recv(p->side_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void ucx_close(ect_xport *x) {
    ucx_impl *u = x->impl;
    xp_server_stop(u->srv);
    u->srv = NULL;
    pthread_mutex_lock(&u->imu);
    ucx_peer *p, *tmp;
    HASH_ITER(hh, u->peers, p, tmp) {
        HASH_DEL(u->peers, p);
        drop_peer_ep(u, p);
        free(p);
    }
    pthread_mutex_unlock(&u->imu);
}

static void ucx_destroy(ect_xport *x) {
    ucx_impl *u = x->impl;
    if (!u) return;
    if (u->srv) xp_server_stop(u->srv);
    if (u->prog_started) {
        uint64_t one = 1;
        if (write(u->stopfd, &one, sizeof one) < 0) ECT_LOGW("xport", "eventfd write failed");
        pthread_join(u->prog, NULL);
    }
    if (u->stopfd >= 0) close(u->stopfd);
    if (u->iw) ucp_worker_destroy(u->iw);
    if (u->tw) ucp_worker_destroy(u->tw);
    if (u->ctx) ucp_cleanup(u->ctx);
    free(u->taddr);
    pthread_mutex_destroy(&u->tmu);
    pthread_mutex_destroy(&u->imu);
    free(u);
}

/* Called with imu held. */
static int connect_peer(ect_xport *x, ucx_peer *p) {
    ucx_impl *u = x->impl;
    char host[256];
    int port, fd;
    int rc = xp_parse_hostport("peer_session", p->session + 4, host, sizeof host, &port);
    if (rc) return rc;
    rc = xp_tcp_connect(host, port, x->opts.connect_timeout_ms, &fd);
    if (rc) return rc;
    uint8_t h[8];
    uint8_t *addr = NULL;
    rc = xp_recv_all(fd, h, 8, x->opts.io_timeout_ms);
    if (!rc && (xp_get_u32(h) != UCX_MAGIC_ADDR || xp_get_u32(h + 4) == 0 ||
                xp_get_u32(h + 4) > UCX_ADDR_MAX))
        rc = ect_set_error(ECT_EPROTO, "ucx: bad worker address header from %s", p->session);
    if (!rc && !(addr = malloc(xp_get_u32(h + 4)))) rc = ect_set_error(ECT_ENOMEM, "address");
    if (!rc) rc = xp_recv_all(fd, addr, xp_get_u32(h + 4), x->opts.io_timeout_ms);
    if (rc == ECT_ECLOSED) rc = ect_set_error(ECT_ECONNREFUSED, "ucx: %s hung up", p->session);
    if (rc) {
        close(fd);
        free(addr);
        return rc;
    }
    /* No UCP_ERR_HANDLING_MODE_PEER: the shared-memory transports cannot
     * report peer failure, and asking for it would leave only tcp. The
     * side channel's EOF tells us the target is gone instead. */
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                          .address = (ucp_address_t *)addr};
    p->failed = 0;
    ucs_status_t s = ucp_ep_create(u->iw, &ep, &p->ep);
    free(addr);
    if (s != UCS_OK) {
        close(fd);
        p->ep = NULL;
        return ucs_err(s, "endpoint");
    }
    p->side_fd = fd;
    return 0;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The unpacked rkey for a key string, cached on the peer. imu held. */
static int get_rkey(ucx_peer *p, const char *ks, ucx_rkey **out) {
    ucx_rkey *k;
    HASH_FIND_STR(p->rkeys, ks, k);
    if (k) { /* most recently used last: eviction takes the head */
        HASH_DEL(p->rkeys, k);
        HASH_ADD_KEYPTR(hh, p->rkeys, k->keystr, strlen(k->keystr), k);
        *out = k;
        return 0;
    }
    size_t hl = strnlen(ks, ECT_XPORT_KEY_MAX);
    if (hl < 2 * 17 || hl % 2 || hl >= ECT_XPORT_KEY_MAX)
        return ect_set_error(ECT_EINVAL, "dst_key is not a ucx key");
    uint8_t *b = malloc(hl / 2);
    if (!b) return ect_set_error(ECT_ENOMEM, "key");
    for (size_t i = 0; i < hl / 2; i++) {
        int hi = hexval(ks[2 * i]), lo = hexval(ks[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(b);
            return ect_set_error(ECT_EINVAL, "dst_key is not a ucx key (not hex)");
        }
        b[i] = (uint8_t)(hi << 4 | lo);
    }
    k = calloc(1, sizeof *k);
    if (!k || !(k->keystr = strdup(ks))) {
        free(k);
        free(b);
        return ect_set_error(ECT_ENOMEM, "key");
    }
    k->raddr = xp_get_u64(b);
    k->rlen = xp_get_u64(b + 8);
    ucs_status_t s = ucp_ep_rkey_unpack(p->ep, b + 16, &k->rkey);
    free(b);
    if (s != UCS_OK) {
        free(k->keystr);
        free(k);
        return ect_set_error(ECT_EINVAL, "dst_key is not a ucx key: %s", ucs_status_string(s));
    }
    HASH_ADD_KEYPTR(hh, p->rkeys, k->keystr, strlen(k->keystr), k);
    *out = k;
    return 0;
}

/* Drives iw until req completes, the endpoint fails or the timeout passes. */
static ucs_status_t wait_req(ucx_impl *u, ucx_peer *p, ucs_status_ptr_t req, int timeout_ms) {
    if (!UCS_PTR_IS_PTR(req)) return UCS_PTR_STATUS(req);
    uint64_t t0 = ect_now_ms();
    ucs_status_t s;
    unsigned idle = 0;
    while ((s = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        if (!ucp_worker_progress(u->iw)) {
            if (p->failed || (++idle % 256 == 0 && side_dead(p))) {
                p->failed = 1;
                break;
            }
            if (ect_now_ms() - t0 > (uint64_t)timeout_ms) {
                s = UCS_ERR_TIMED_OUT;
                break;
            }
        }
    }
    if (s == UCS_INPROGRESS || s == UCS_ERR_TIMED_OUT) {
        ucp_request_cancel(u->iw, req);
        if (s == UCS_INPROGRESS) s = UCS_ERR_CONNECTION_RESET;
    }
    ucp_request_free(req);
    return s;
}

static int ucx_write_batch(ect_xport *x, const char *session, const ect_write *w, size_t n,
                           int *st) {
    ucx_impl *u = x->impl;
    int rc = 0;
    pthread_mutex_lock(&u->imu);
    ucx_peer *p;
    HASH_FIND_STR(u->peers, session, p);
    if (!p) {
        if (strlen(session) >= sizeof p->session || !(p = calloc(1, sizeof *p))) {
            pthread_mutex_unlock(&u->imu);
            rc = ect_set_error(ECT_EINVAL, "peer_session too long or out of memory");
            for (size_t i = 0; i < n; i++) st[i] = rc;
            return rc;
        }
        snprintf(p->session, sizeof p->session, "%s", session);
        p->side_fd = -1;
        HASH_ADD_STR(u->peers, session, p);
    }
    if (p->ep && (p->failed || side_dead(p))) drop_peer_ep(u, p);
    /* Each window brings a new rkey: drop the least recently used beyond
     * the cap (no put is in flight here: the last batch was flushed). */
    while (HASH_COUNT(p->rkeys) > UCX_RKEY_CACHE) {
        ucx_rkey *old = p->rkeys;
        HASH_DEL(p->rkeys, old);
        ucp_rkey_destroy(old->rkey);
        free(old->keystr);
        free(old);
    }
    if (!p->ep) rc = connect_peer(x, p);
    if (rc) {
        pthread_mutex_unlock(&u->imu);
        for (size_t i = 0; i < n; i++) st[i] = rc;
        return rc;
    }
    ucp_request_param_t rp = {.op_attr_mask = 0};
    size_t issued = 0;
    for (size_t i = 0; i < n; i++) {
        ucx_rkey *k = NULL;
        if (get_rkey(p, w[i].dst_key, &k) != 0) {
            st[i] = ECT_EINVAL;
            continue;
        }
        uint64_t a = w[i].dst_addr, end;
        if (a < k->raddr || a >= k->raddr + k->rlen) {
            st[i] = ECT_EACCES; /* the key does not cover this address */
            continue;
        }
        if (!ect_add_u64(a, w[i].len, &end) || end > k->raddr + k->rlen) {
            st[i] = ECT_ERANGE;
            continue;
        }
        if (w[i].len == 0) continue;
        ucs_status_ptr_t req = ucp_put_nbx(p->ep, w[i].src, w[i].len, a, k->rkey, &rp);
        if (UCS_PTR_IS_ERR(req)) {
            st[i] = ucs_err(UCS_PTR_STATUS(req), "put");
            continue;
        }
        /* Freed now, released by UCX on completion; the flush below waits. */
        if (UCS_PTR_IS_PTR(req)) ucp_request_free(req);
        issued++;
    }
    if (issued) {
        /* One flush: when it completes, every put before it has landed. */
        ucs_status_t s = wait_req(u, p, ucp_ep_flush_nbx(p->ep, &rp), x->opts.io_timeout_ms);
        if (s == UCS_OK && p->failed) s = UCS_ERR_CONNECTION_RESET;
        if (s != UCS_OK) {
            rc = ucs_err(s, "flush");
            for (size_t i = 0; i < n; i++)
                if (st[i] == 0) st[i] = rc;
            drop_peer_ep(u, p);
        }
    }
    pthread_mutex_unlock(&u->imu);
    return rc;
}

const xp_backend xp_ucx_backend = {
    .name = "ucx",
    .session_prefix = "ucx:",
    .device_regions = false,
    .device_sources = false,
    .open = ucx_open,
    .close = ucx_close,
    .destroy = ucx_destroy,
    .reg = ucx_reg,
    .unreg = ucx_unreg,
    .write_batch = ucx_write_batch,
};
